"""Log formatting: logfmt (default) or JSON lines, one line per record.

The daemon's log calls are ``key=%s`` templates (``log.info("event=listening url=%s", url)``).
Both formatters read a template as its key/value pairs, so a value is never mistaken for
structure: logfmt quotes any value with a space, a quote, ``=`` or a control character (JSON
string escapes, which logfmt parsers read), and JSON keeps numbers as numbers. A message that is
not in that form (a third-party library's) becomes one ``msg`` value. Tracebacks go on one line
as ``exc``. The access log (``--access-log``) uses the same format.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Mapping
from typing import IO, Any, Final

__all__ = [
    "ACCESS_LOG_FORMAT",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "JsonFormatter",
    "LogfmtFormatter",
    "configure_logging",
    "logfmt_value",
    "record_fields",
]

LOG_FORMATS: Final = ("logfmt", "json")
LOG_LEVELS: Final = ("debug", "info", "warning", "error")
# Hypercorn access-log atoms, as key=value pairs (the formatters quote the values).
ACCESS_LOG_FORMAT: Final = (
    "event=access remote=%(h)s method=%(m)s path=%(Uq)s protocol=%(H)s status=%(s)s "
    "bytes=%(b)s duration_us=%(D)s"
)

_PAIR = re.compile(
    r"(?P<key>[A-Za-z_][\w.-]*)="
    r"(?:%(?:\((?P<name>\w+)\))?[-#0 +]*\d*(?:\.\d+)?(?P<conv>[sdirfgex])|(?P<literal>[^\s%]+))"
    r"(?:\s+|$)"
)
_NEEDS_QUOTES = re.compile(r'[\s"=\\]')


def logfmt_value(text: str) -> str:
    """``text`` as a logfmt value: bare when safe, else a double-quoted JSON string."""
    if text and text.isprintable() and not _NEEDS_QUOTES.search(text):
        return text
    return json.dumps(text, ensure_ascii=False)


def _pairs(template: str) -> list[tuple[str, str | None, str | None, str | None]] | None:
    """``(key, conversion, mapping name, literal)`` per pair, or None if not all pairs."""
    out: list[tuple[str, str | None, str | None, str | None]] = []
    pos = 0
    while pos < len(template):
        match = _PAIR.match(template, pos)
        if match is None:
            return None
        out.append((match["key"], match["conv"], match["name"], match["literal"]))
        pos = match.end()
    return out or None


def _convert(value: Any, conv: str) -> Any:
    if conv == "r":
        return repr(value)
    if conv in "di" and isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    if conv in "fgex" and isinstance(value, int | float) and not isinstance(value, bool):
        return value
    if value is None or isinstance(value, bool | int | float):
        return value
    return str(value)


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The record's message as key/value pairs (``{"msg": text}`` when it is not in that form).

    Values keep their type when they are a bool or a number; everything else is its ``str()``
    (``repr()`` for ``%r``). A field whose value is ``None`` is left out (``signal=None`` on an
    agent that exited by itself says nothing a reader needs).
    """
    template = record.msg if isinstance(record.msg, str) else None
    pairs = _pairs(template) if template is not None else None
    args = record.args
    if pairs is not None:
        fields: dict[str, Any] = {}
        positional = args if isinstance(args, tuple) else ()
        index = 0
        try:
            for key, conv, name, literal in pairs:
                if literal is not None:
                    fields[key] = literal
                elif name is not None:
                    if not isinstance(args, Mapping):
                        raise TypeError("named conversion without a mapping")
                    fields[key] = _convert(args[name], conv or "s")
                else:
                    fields[key] = _convert(positional[index], conv or "s")
                    index += 1
            if index == len(positional):
                return {key: value for key, value in fields.items() if value is not None}
        except (IndexError, KeyError, TypeError):
            pass
    return {"msg": record.getMessage()}


def _timestamp(record: logging.LogRecord) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


class LogfmtFormatter(logging.Formatter):
    """``time=… level=… logger=… key=value …``; values quoted when they need it."""

    def format(self, record: logging.LogRecord) -> str:
        head: dict[str, Any] = {"time": _timestamp(record), "level": record.levelname.lower(),
                                "logger": record.name}
        fields = {**head, **record_fields(record)}
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        return " ".join(f"{key}={_logfmt(value)}" for key, value in fields.items())


def _logfmt(value: Any) -> str:
    # Bools print as Python writes them (``True``), as ``%s`` always did.
    if isinstance(value, bool | int | float):
        return str(value)
    return logfmt_value(str(value))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time``, ``level``, ``logger``, then the record's fields."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {"time": _timestamp(record), "level": record.levelname.lower(),
                                  "logger": record.name}
        fields.update(record_fields(record))
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        return json.dumps(fields, ensure_ascii=False, default=str)


def configure_logging(level: str = "info", fmt: str = "logfmt",
                      stream: IO[str] | None = None) -> None:
    """Route every log record (the daemon's, Hypercorn's, the access log's) to ``stream``
    (stderr by default) in ``fmt``, at ``level`` and above."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    if level not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
