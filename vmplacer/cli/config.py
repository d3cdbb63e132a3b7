"""`vmplacer config check|show|schema`: is the config file right, and what does vmplacer run with.

    vmplacer config check [--config FILE]        # "ok", or every problem (exit 2)
    vmplacer config show [-o yaml|json]          # the effective config, defaults filled in
    vmplacer config schema request               # JSON Schema of a request file
    vmplacer config schema config                # JSON Schema of the config file

`check` reports every problem of the file in one go, each naming the key and the rule, so a
deploy pipeline can refuse a bad file before a service restarts on it. `show` prints what the
file, $VMPLACER_DATABASE_URL and $VMPLACER_DATA_DIR add up to, every key included; the
database password is hidden. Its YAML is itself a valid config file. `schema request` prints the
JSON Schema of a request file (`plan --request`, `place`), generated from the API's guest model;
`schema config` that of the config file, generated from the reader's table of keys. Both ship
with the package, for editors and pipelines; `check` still has the last word on a config.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from vmplacer.cli.common import EXIT_OK, EXIT_USAGE, CliContext, print_json
from vmplacer.cli.log_format import say


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "config", help="check the config file, show the effective config with every default filled in, "
                       "or print the JSON Schema of the config or a request file")
    actions = parser.add_subparsers(dest="config_action", metavar="ACTION", required=True,
                                    help="check, show or schema")
    check = actions.add_parser("check", help="validate the config file: 'ok' (exit 0) or every problem (exit 2)")
    check.set_defaults(func=run_check)
    show = actions.add_parser("show", help="print the effective config (file, environment and defaults)")
    show.add_argument("-o", "--output", "--format", dest="format", choices=("yaml", "json"), default="yaml",
                      help="output format (default: yaml)")
    show.set_defaults(func=run_show)
    schema = actions.add_parser("schema", help="print the JSON Schema of a request file (plan --request, place) "
                                               "or of the config file, for editors and CI")
    schema.add_argument("kind", choices=SCHEMAS, metavar="{" + ",".join(SCHEMAS) + "}",
                        help="request: the guests file `plan --request` and `place` read; config: the config file "
                             "(--config, $VMPLACER_CONFIG), every key `config check` accepts")
    schema.set_defaults(func=run_schema)


SCHEMAS = ("request", "config")  # vmplacer/data/schemas/KIND.schema.json


def _load(path: str | None) -> Any:
    from vmplacer.config import load_settings

    return load_settings(path)


def run_check(args: argparse.Namespace, ctx: CliContext) -> int:
    from vmplacer.config import ConfigError

    path = ctx.config_path  # --config, before or after `config check`
    try:
        settings = _load(path)
    except ConfigError as exc:
        for problem in exc.problems:
            say("error", problem)
        count = len(exc.problems)
        say("", f"{count} problem{'' if count == 1 else 's'} in the config")
        return EXIT_USAGE
    print("ok")
    if settings.source == "built-in defaults":
        sys.stderr.write(f"note: no config file (--config or ${'VMPLACER_CONFIG'}): the built-in defaults\n")
    return EXIT_OK


def run_show(args: argparse.Namespace, ctx: CliContext) -> int:
    from vmplacer.config import settings_to_mapping, without_password

    settings = ctx.settings  # a bad file exits 2 here, with its problems
    document = settings_to_mapping(settings)
    document["database_url"] = without_password(settings.database_url)
    if args.format == "json":
        print_json(document)
        return EXIT_OK
    import yaml

    source = settings.source if settings.source == "built-in defaults" else os.path.abspath(settings.source)
    print(f"# effective vmplacer config: {source}, environment overrides and defaults")
    sys.stdout.write(yaml.safe_dump(document, sort_keys=False, default_flow_style=False, allow_unicode=True))
    return EXIT_OK


def run_schema(args: argparse.Namespace, ctx: CliContext) -> int:
    """The shipped copy, as is: no model imported, and what an operator saves is what tests compare."""
    from importlib.resources import files

    sys.stdout.write((files("vmplacer") / "data" / "schemas" / f"{args.kind}.schema.json").read_text("utf-8"))
    return EXIT_OK
