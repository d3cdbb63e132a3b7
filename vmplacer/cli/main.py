"""`vmplacer` console entry point: parse arguments, dispatch to a command module."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from vmplacer import __version__
from vmplacer.cli.common import (
    EXIT_OPERATIONAL,
    EXIT_USAGE,
    CliContext,
    OperationalError,
    UsageError,
)

# Command modules, each with `register(subparsers)`; order = order in --help.
COMMAND_MODULES = (
    "vmplacer.cli.version",
    "vmplacer.cli.db",
    "vmplacer.cli.hosts",
    "vmplacer.cli.topology",
    "vmplacer.cli.plan",
    "vmplacer.cli.place",
    "vmplacer.cli.profile",
    "vmplacer.cli.guard",
    "vmplacer.cli.rebalance",
    "vmplacer.cli.reconcile",
    "vmplacer.cli.protect",
    "vmplacer.cli.model",
    "vmplacer.cli.eval",
    "vmplacer.cli.serve",
    "vmplacer.cli.token",
)


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on bad usage already; keep its message but our wording."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"vmplacer: error: {message}\n")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="vmplacer",
        description="Interference-aware placement controller for libvirt/KVM hosts.",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="YAML config file (default: $VMPLACER_CONFIG, else built-in defaults)",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    parser.add_argument("--version", action="version", version=f"vmplacer {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    ctx = CliContext(config_path=args.config)
    try:
        return int(args.func(args, ctx) or 0)
    except UsageError as exc:
        sys.stderr.write(f"vmplacer: error: {exc}\n")
        return EXIT_USAGE
    except OperationalError as exc:
        sys.stderr.write(f"vmplacer: failed: {exc}\n")
        return EXIT_OPERATIONAL
    except BrokenPipeError:
        # Output piped into `head` and the like: not an error of ours.
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        sys.stderr.write("vmplacer: interrupted\n")
        return 130
    finally:
        if ctx._container is not None:
            ctx._container.close()


if __name__ == "__main__":
    sys.exit(main())
