"""Log lines a client cannot forge: control characters escaped (repr-style), length bounded."""

from __future__ import annotations

import logging

MAX_LINE = 2000  # characters of one log message
MAX_NAME = 40  # characters of one client-chosen name (an unknown field, a key)
MAX_NAMES = 8  # names listed in one line; the rest are counted


def escape(text: str) -> str:
    """Non-printable characters (newlines, ANSI escapes, bidi controls...) as \\xNN / \\uNNNN."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def clip(text: str, limit: int = MAX_LINE) -> str:
    text = escape(text)
    return text if len(text) <= limit else f"{text[:limit]}...(+{len(text) - limit} chars)"


def names(items, limit: int = MAX_NAMES) -> str:
    """Client-chosen names as one bounded, quoted list: 'a', 'b\\n' and 3 more."""
    items = list(items)
    shown = ", ".join(f"'{clip(str(x), MAX_NAME)}'" for x in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


class EscapingFilter(logging.Filter):
    """Formats each record once, escaped and bounded, so no argument can start a new line."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = clip(record.getMessage()), None
        return True


def guard_logger(logger: logging.Logger) -> None:
    if not any(isinstance(f, EscapingFilter) for f in logger.filters):
        logger.addFilter(EscapingFilter())
