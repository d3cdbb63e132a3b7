"""`vmplacer` console entry point: parse arguments, dispatch to a command module."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from collections.abc import Sequence

from vmplacer.cli.common import (
    EXIT_OPERATIONAL,
    EXIT_USAGE,
    WORDS_ANYWHERE,
    CliContext,
    DatabaseError,
    OperationalError,
    UsageError,
    database_problem,
)
from vmplacer.cli.global_options import (
    add_global_options,
    spread_global_options,
    value_taking_flags,
    verbose_total,
)
from vmplacer.cli.log_format import chosen_format, configure_logging, format_in, say

# Every command: (its module, which has `register(subparsers)`; its one-line help). Order = order
# in --help. Only the module of the command being run is imported: `vmplacer --help` and
# `vmplacer version` start without SQLAlchemy, numpy, libvirt or FastAPI. The help lines are
# the modules' own (tests/unit/test_cli_startup.py keeps the two in step).
COMMANDS: dict[str, tuple[str, str]] = {
    "version": ("vmplacer.cli.version", "print the version"),
    "config": ("vmplacer.cli.config",
               "check the config file, show the effective config with every default filled in, "
               "or print the JSON Schema of the config or a request file"),
    "db": ("vmplacer.cli.db", "database schema migrations and data retention"),
    "hosts": ("vmplacer.cli.hosts",
              "list configured hosts and check that each answers; maintenance mode (disable/enable)"),
    "topology": ("vmplacer.cli.topology", "show a host's NUMA nodes, cores, threads and caches"),
    "plan": ("vmplacer.cli.plan", "dry run: place the guests of a request file and show pinning (and domain XML)"),
    "place": ("vmplacer.cli.place", "place, define (and optionally start) a request file's guests on the best hosts"),
    "placements": ("vmplacer.cli.place", "list the placements vmplacer recorded"),
    "profile": ("vmplacer.cli.profile",
                "measure interference with Freeze'nSense (run), print stored results (show VM...)"),
    "guard": ("vmplacer.cli.guard", "resume guests left paused by a killed vmplacer process (once, or every second)"),
    "rebalance": ("vmplacer.cli.rebalance",
                  "profile, learn, plan and apply live repins/migrations (holds a lease per host)"),
    "apply": ("vmplacer.cli.rebalance", "apply a stored plan (proposed or approved)"),
    "plans": ("vmplacer.cli.rebalance", "stored rebalancing plans: list, show ID, cancel ID"),
    "reconcile": ("vmplacer.cli.reconcile",
                  "forget placements whose domains are gone, fix recorded states (holds a lease per host)"),
    "protect": ("vmplacer.cli.protect",
                "hold protected guests above their ζ/ζb floor by throttling the neighbours that hurt them"),
    "model": ("vmplacer.cli.model", "the interference model learned from profiles"),
    "eval": ("vmplacer.cli.eval", "evaluate the interference model on measured pair data"),
    "serve": ("vmplacer.cli.serve", "run the REST API (uvicorn)"),
    "token": ("vmplacer.cli.token", "create, revoke and list REST API bearer tokens"),
    "completion": ("vmplacer.cli.completion", "print a shell completion script (bash)"),
    "manpage": ("vmplacer.cli.manpage",
                "print the vmplacer(1) manual page (roff), generated from this version's commands"),
}
# How `vmplacer --help` lists the commands: each once, by what the operator is doing.
COMMAND_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("placing guests", ("plan", "place", "placements", "topology")),
    ("hosts and records", ("hosts", "reconcile")),
    ("measuring interference", ("profile", "model", "eval")),
    ("moving and protecting guests", ("rebalance", "plans", "apply", "protect", "guard")),
    ("running vmplacer", ("serve", "db", "config", "token", "version", "completion", "manpage")),
)
COMMAND_MODULES = tuple(dict.fromkeys(module for module, _help in COMMANDS.values()))
# Options that may come before the command, and whether each takes a value (argparse accepts prefixes).
_GLOBAL_OPTIONS = value_taking_flags()


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on bad usage already; keep its message but our wording: one line, the
    closest option or choice suggested, no usage block (`--help` has it)."""

    _words: list[str] = []
    # The chosen command's parser of the last parse: its options are the ones a typo was meant as.
    last_command_parser: argparse.ArgumentParser | None = None

    def error(self, message: str) -> None:  # type: ignore[override]
        known = {**self._option_string_actions}
        chosen = _Parser.last_command_parser
        prog = self.prog
        if "unrecognized arguments" in message and chosen is not None:  # the top parser refuses the command's extras
            known.update(chosen._option_string_actions)
            prog = chosen.prog
        unknown = self._unknown_option(known) if "invalid choice" in message or "unrecognized" in message else None
        if unknown:  # `hosts --typo x`: the typo is the problem, not the word argparse tried next
            message = f"unrecognized arguments: {unknown}"
        from vmplacer.cli.suggest import suggest  # only on a refusal: --help imports nothing more

        suggestion = suggest(message, unknown, known)
        said = f"{message}; did you mean {suggestion}?" if suggestion else message
        say("error", f"{said} (`{prog} --help` lists the options)", format_in(self._words))
        raise SystemExit(EXIT_USAGE)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        """Also records the innermost (chosen command's) parser as `command_parser`, whose defaults
        tell `common.option_given` which options the operator set."""
        self._words = list(sys.argv[1:] if args is None else args)
        namespace, extras = super().parse_known_args(args, namespace)
        dest = getattr(self, WORDS_ANYWHERE, None)
        if dest and extras and not any(word.startswith("-") for word in extras):
            # words after an option (`profile show --run 3 web db`): argparse's nargs="*" took those before it
            setattr(namespace, dest, [*(getattr(namespace, dest, None) or []), *extras])
            extras = []
        if not hasattr(namespace, "command_parser"):  # the sub-command's parser ran first, and set it
            namespace.command_parser = self
            _Parser.last_command_parser = self
        return namespace, extras

    def _unknown_option(self, known: dict[str, argparse.Action]) -> str | None:
        """The first word given to this parser that looks like an option not in `known`."""
        for word in self._words:
            if word == "--":
                return None
            if not word.startswith("-") or word == "-" or word[1:2].isdigit():
                continue
            flag = word.split("=", 1)[0]
            if word.startswith("--"):
                if flag not in known and not any(option.startswith(flag) for option in known):
                    return flag
            elif word[:2] not in known:
                return word[:2]
        return None


class _TopParser(_Parser):
    """`vmplacer --help` lists the commands in COMMAND_GROUPS' sections, then the options."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        namespace, extras = super().parse_known_args(args, namespace)
        verbose_total(namespace)
        return namespace, extras

    def format_help(self) -> str:
        formatter = self._get_formatter()
        formatter.add_usage(self.usage, self._actions, self._mutually_exclusive_groups)
        formatter.add_text(self.description)
        commands = next(a for a in self._actions if isinstance(a, argparse._SubParsersAction))
        listed = {choice.dest: choice for choice in commands._choices_actions}
        for title, names in COMMAND_GROUPS:
            formatter.start_section(title)
            formatter.add_arguments([listed[name] for name in names if name in listed])
            formatter.end_section()
        for group in self._action_groups:
            actions = [a for a in group._group_actions if a is not commands]
            if actions:
                formatter.start_section(group.title)
                formatter.add_arguments(actions)
                formatter.end_section()
        formatter.add_text(self.epilog)
        return formatter.format_help()


def command_in(argv: Sequence[str]) -> str | None:
    """The command `argv` names (the first word after the global options), or None."""
    words = iter(argv)
    for word in words:
        if word == "--":
            return next(words, None)
        if word.startswith("--"):
            option = word.split("=", 1)[0]
            matches = [name for name in _GLOBAL_OPTIONS if name.startswith(option)]
            if len(matches) == 1 and _GLOBAL_OPTIONS[matches[0]] and "=" not in word:
                next(words, None)  # the option's value, which may look like a command
            continue
        if word.startswith("-") and word != "-":
            continue
        return word
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with `argv`, only the named command's module is imported and registered
    (every other command is listed by name and help line). Without: every command in full."""
    parser = _TopParser(
        prog="vmplacer",
        description="Interference-aware placement controller for libvirt/KVM hosts.",
        epilog="`vmplacer COMMAND --help` shows a command's options; the global options may also follow "
               "the command. Exit codes: 0 ok, 1 a host, libvirt or the database failed, 2 bad usage, "
               "3 a guest fits on no host (plan, place).",
    )
    add_global_options(parser, top=True)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser,
                                       help="`vmplacer COMMAND --help` shows its options")
    chosen = command_in(argv) if argv is not None else None
    wanted = ({COMMANDS[chosen][0]} if chosen in COMMANDS else set()) if argv is not None else set(COMMAND_MODULES)
    registered: set[str] = set()
    for name, (module_name, help_line) in COMMANDS.items():
        if module_name in wanted:
            if module_name not in registered:
                importlib.import_module(module_name).register(subparsers)
                registered.add(module_name)
        else:
            subparsers.add_parser(name, help=help_line, add_help=False)
    spread_global_options(parser)
    return parser


# Signals the CLI must be able to receive whatever its parent blocked: stop requests (systemd,
# cron's kill, Ctrl-C) and the fatal ones faulthandler reports on. A signal mask survives exec, so
# a parent that started vmplacer from a thread blocking them would leave `serve`, `guard` and
# `protect` deaf to a stop and a hung command unable to print where it hangs.
DELIVERED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGABRT,
                     signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL)


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # the process's own entry point, not a caller's thread
        signal.pthread_sigmask(signal.SIG_UNBLOCK, DELIVERED_SIGNALS)
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        configure_logging(chosen_format(args.log_format), args.verbose)
    except ValueError as exc:  # $VMPLACER_LOG_FORMAT says something else
        say("error", str(exc), "text")
        return EXIT_USAGE
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    ctx = CliContext(config_path=args.config)
    try:
        return int(args.func(args, ctx) or 0)
    except UsageError as exc:  # one line per problem (a config or request file may have several)
        for line in str(exc).splitlines() or [""]:
            say("error", line)
        return EXIT_USAGE
    except DatabaseError as exc:  # before OperationalError: said once, here, for every command
        say("failed", str(database_problem(exc.cause, ctx, exc.doing) or exc))
        return EXIT_OPERATIONAL
    except OperationalError as exc:
        say("failed", str(exc))
        return EXIT_OPERATIONAL
    except BrokenPipeError:
        # Output piped into `head` and the like: not an error of ours.
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        say("", "interrupted")
        return 130
    except MemoryError:  # one line, never a traceback (planning names its hosts and the setting itself)
        say("failed", f"{getattr(args, 'command', None) or 'vmplacer'}: out of memory")
        return EXIT_OPERATIONAL
    except Exception as exc:
        problem = database_problem(exc, ctx)
        if problem is None:
            raise
        say("failed", problem)
        return EXIT_OPERATIONAL
    finally:
        _flush_output()
        if ctx._container is not None:
            ctx._container.close()


def _flush_output() -> None:
    """The command's result is out before its connections close, however long closing takes."""
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):  # a reader that left, or stdout closed already
        pass


if __name__ == "__main__":
    sys.exit(main())
