"""The options every command takes, before or after its name, defined once.

`vmplacer --config F hosts` and `vmplacer hosts --config F` mean the same: the top parser and
every command's (and sub-command's) parser get these options from `GLOBAL_OPTIONS`. Below the top
their default is "unset", so a value given before the command survives, and one given after it
wins (argparse copies a sub-parser's values over the top parser's).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from vmplacer import __version__

GROUP_TITLE = "global options (before or after the command)"


@dataclass(frozen=True)
class GlobalOption:
    flags: tuple[str, ...]
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def takes_value(self) -> bool:
        return self.settings.get("action") in (None, "store", "append")


GLOBAL_OPTIONS: tuple[GlobalOption, ...] = (
    GlobalOption(("--config",), {"metavar": "FILE", "default": None,
                                 "help": "YAML config file (default: $VMPLACER_CONFIG, else built-in defaults)"}),
    GlobalOption(("-v", "--verbose"), {"action": "count", "default": 0,
                                       "help": "more logging (-v: info, -vv: debug)"}),
    GlobalOption(("--log-format",), {"choices": ("text", "json"), "default": None,
                                     "help": "log lines on stderr as text, or one JSON object per line with time, "
                                             "level, logger, message and fields, for journald and log shippers "
                                             "(default: $VMPLACER_LOG_FORMAT, else text)"}),
    GlobalOption(("--version",), {"action": "version", "version": f"vmplacer {__version__}",
                                  "help": "print the version and exit"}),
)


def value_taking_flags() -> dict[str, bool]:
    """Each long global flag (and --help), with whether it takes a value: how `command_in` skips
    the global options in front of the command without building the parser."""
    flags = {flag: option.takes_value for option in GLOBAL_OPTIONS for flag in option.flags
             if flag.startswith("--")}
    flags["--help"] = False
    return flags


# Below the top, -v counts into an attribute of its own per parser: argparse gives each sub-command
# a fresh namespace and copies it over its parent's, so one shared attribute would keep only the
# innermost count. The top parser adds them all up (`verbose_total`): `-v hosts -v` is -vv.
VERBOSE_BELOW = "verbose_below:"


def add_global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The global options on `parser`; below the top they leave the namespace alone unless given.
    A parser that already has one of the flags keeps its own (it never does in this tree)."""
    group = parser.add_argument_group(GROUP_TITLE)
    for option in GLOBAL_OPTIONS:
        if any(flag in parser._option_string_actions for flag in option.flags):
            continue
        settings = dict(option.settings)
        if not top and "default" in settings:
            settings["default"] = argparse.SUPPRESS
        if not top and settings.get("action") == "count":
            settings["dest"] = VERBOSE_BELOW + parser.prog
        group.add_argument(*option.flags, **settings)


def verbose_total(namespace: argparse.Namespace) -> None:
    """Fold the -v counts given after the command (at any depth) into `namespace.verbose`."""
    below = [key for key in vars(namespace) if key.startswith(VERBOSE_BELOW)]
    namespace.verbose = getattr(namespace, "verbose", 0) + sum(getattr(namespace, key) for key in below)
    for key in below:
        delattr(namespace, key)


def command_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser below `parser` (commands, their sub-commands, ...), each once, in help order."""
    found: list[argparse.ArgumentParser] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # an alias shares its parser
                found.append(child)
                found.extend(command_parsers(child))
    return found


def spread_global_options(parser: argparse.ArgumentParser) -> None:
    """Give every parser below the top one the global options (the top has them already)."""
    for child in command_parsers(parser):
        add_global_options(child, top=False)
