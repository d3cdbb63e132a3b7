"""How vmplacer's log lines look on stderr: text for a person, or one JSON object per line.

`--log-format json` (or VMPLACER_LOG_FORMAT=json) is for the long-running commands under
systemd (`serve`, `rebalance`, `protect run`, `guard`): journald and log shippers read each line
as one record with `time` (ISO 8601 UTC, milliseconds), `level`, `logger`, `message` and any
structured `extra=` fields. Names, reasons and XML an operator or API caller supplied stay data
either way: JSON escapes them, and the text form escapes control characters, so a newline in a
VM name can never forge a second log line. Under JSON every line vmplacer writes to stderr is
JSON: the command's own `vmplacer: error|failed|warning: ...` lines (`say`), Python warnings and
an unexpected traceback included.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from types import TracebackType
from typing import Any

LOG_FORMATS = ("text", "json")
LOG_FORMAT_VARIABLE = "VMPLACER_LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Attributes every LogRecord has: anything else on a record came from `extra=` and is data to keep.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}
# `extra=` fields that are presentation, not data: uvicorn's `color_message` repeats the message
# with terminal escape sequences.
_DROPPED = frozenset({"color_message"})
CLI_LOGGER = "vmplacer.cli"
_state = {"format": "text"}  # the format configure_logging set, for `say`


def log_time(record: logging.LogRecord) -> str:
    """'2026-11-28T06:58:01.123Z'."""
    moment = datetime.fromtimestamp(record.created, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(record.msecs):03d}Z"


def escaped(text: str) -> str:
    """`text` with control characters (newlines included) written as escapes: one record, one line."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def extras(record: logging.LogRecord) -> dict[str, Any]:
    return {key: value for key, value in vars(record).items()
            if key not in _STANDARD and key not in _DROPPED and not key.startswith("_")}


class JsonLineFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {"time": log_time(record), "level": record.levelname.lower(),
                                 "logger": record.name, "message": record.getMessage()}
        for key, value in extras(record).items():
            entry.setdefault(key, value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """TEXT_FORMAT with the time in ISO 8601 UTC, the message's control characters escaped and the
    `extra=` fields appended as key=value."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        return log_time(record)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802
        fields = "".join(f" {key}={escaped(str(value))}" for key, value in extras(record).items())
        saved = record.message
        record.message = escaped(saved) + fields
        try:
            return super().formatMessage(record)
        finally:
            record.message = saved


def chosen_format(flag: str | None) -> str:
    """The flag, else $VMPLACER_LOG_FORMAT, else text; ValueError names a bad variable value."""
    if flag:
        return flag
    value = os.environ.get(LOG_FORMAT_VARIABLE, "").strip()
    if not value:
        return "text"
    if value not in LOG_FORMATS:
        raise ValueError(f"{LOG_FORMAT_VARIABLE}={value!r}: must be one of {', '.join(LOG_FORMATS)}")
    return value


def format_in(argv: Sequence[str]) -> str:
    """The log format `argv` asks for (`--log-format json`, `--log-format=json`, a prefix of the
    flag), else the variable's, else text: for a refusal written before the options are parsed."""
    words = list(argv)
    for index, word in enumerate(words):
        if word == "--":
            break
        flag, _sep, value = word.partition("=")
        if len(flag) > 6 and "--log-format".startswith(flag):
            value = value or (words[index + 1] if index + 1 < len(words) else "")
            if value in LOG_FORMATS:
                return value
    try:
        return chosen_format(None)
    except ValueError:
        return "text"


def say(kind: str, message: str, log_format: str | None = None) -> None:
    """One line of the command's own on stderr: `vmplacer: KIND: message` as text, or a JSON
    object (level `warning` for a warning, else `error`; another KIND than error or warning as
    `kind`) under --log-format json. Never filtered by -v: a refusal or a failure is always said."""
    chosen = log_format or _state["format"]
    text = " ".join(str(message).splitlines()) if chosen == "json" else str(message)
    if chosen == "json":
        level = logging.WARNING if kind == "warning" else logging.ERROR
        entry = logging.LogRecord(CLI_LOGGER, level, "", 0, text, (), None)
        if kind and kind not in ("error", "warning"):
            entry.kind = kind
        line = JsonLineFormatter().format(entry)
    else:
        line = f"vmplacer: {kind}: {escaped(text)}" if kind else f"vmplacer: {escaped(text)}"
    sys.stderr.write(line + "\n")


def _log_uncaught(kind: type[BaseException], value: BaseException, trace: TracebackType | None) -> None:
    """An unexpected exception, as one JSON object with its traceback inside."""
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, trace)
        return
    logging.getLogger(CLI_LOGGER).critical("unexpected error: %s: %s", kind.__name__, value,
                                           exc_info=(kind, value, trace))


def configure_logging(log_format: str, verbose: int) -> None:
    """The root handler on stderr, in `log_format`; -v info, -vv debug. Python warnings go
    through it; under JSON an unexpected traceback does too."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonLineFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING - 10 * min(verbose, 2))
    _state["format"] = log_format
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught if log_format == "json" else sys.__excepthook__
