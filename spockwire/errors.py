"""The one exception family of spockwire.

Every protocol error names the message type, the byte offset inside the message, how many bytes were needed and
how many remained, and the column when there is one. The Cython hot path and the pure-Python twin raise the same
class with the same text at the same offset.
"""
from __future__ import annotations

__all__ = ["SpockwireError", "ProtocolError", "StaleChangesError", "TruncatedMessage", "FrameError",
           "protocol_error", "truncated", "copy_truncated", "copy_error", "SparkEnvironmentError",
           "HistoryTableError"]


class SpockwireError(Exception):
    """Base of every error spockwire raises on purpose."""


class StaleChangesError(SpockwireError, ValueError):
    """Changes older than a target's collected state: their tombstones and truncates were removed on the promise
    that no change before that position could arrive any more (`spockwire.spark.collect_state`)."""


class HistoryTableError(SpockwireError, ValueError):
    """SCD 2 changes (`apply_changes(..., stored_as_scd_type=2)`) pointed at a table without the validity columns
    of their `sequence_by` -- a plain table, an SCD 1 table, or a history kept with another `sequence_by`: refused
    before anything is read or written."""


class ProtocolError(SpockwireError, ValueError):
    """The bytes do not follow the protocol: what, where (byte offset), and which column."""

    def __init__(self, message: str, *, msg_type: str | None = None, offset: int | None = None,
                 needed: int | None = None, remaining: int | None = None, column: int | None = None,
                 column_name: str | None = None) -> None:
        super().__init__(message)
        self.msg_type = msg_type
        self.offset = offset
        self.needed = needed
        self.remaining = remaining
        self.column = column
        self.column_name = column_name


class TruncatedMessage(ProtocolError):
    """A message ended before a field it must contain."""


class FrameError(ProtocolError):
    """The frame-record framing around the messages is broken (length past the end of the buffer, bad header)."""


class SparkEnvironmentError(SpockwireError, RuntimeError):
    """Spark cannot run spockwire as set up: no Java runtime for the JVM, or Python workers whose interpreter
    cannot import this spockwire (the message names what to install or set)."""


def _where(msg_type: str | None, offset: int) -> str:
    return f"'{msg_type}' message at byte {offset}" if msg_type else f"message at byte {offset}"


def _column_text(column: int | None, column_name: str | None) -> str:
    if column is None:
        return ""
    if column_name is None:
        return f" of column {column}"
    return f' of column {column} ("{column_name}")'


def truncated(msg_type: str | None, offset: int, needed: int, remaining: int, what: str,
              column: int | None = None, column_name: str | None = None) -> TruncatedMessage:
    """Build the truncation error both implementations raise."""
    text = (f"truncated {_where(msg_type, offset)}: need {needed} bytes for {what}"
            f"{_column_text(column, column_name)}, {remaining} remaining")
    return TruncatedMessage(text, msg_type=msg_type, offset=offset, needed=needed, remaining=remaining,
                            column=column, column_name=column_name)


def protocol_error(msg_type: str | None, offset: int, problem: str, column: int | None = None,
                   column_name: str | None = None) -> ProtocolError:
    """Build a (non-truncation) protocol error both implementations raise."""
    text = f"bad {_where(msg_type, offset)}{_column_text(column, column_name)}: {problem}"
    return ProtocolError(text, msg_type=msg_type, offset=offset, column=column, column_name=column_name)


def copy_truncated(offset: int, needed: int, remaining: int, what: str, column: int | None = None,
                   column_name: str | None = None) -> TruncatedMessage:
    """A binary COPY stream (`COPY ... TO STDOUT (FORMAT binary)`) that ended inside a header or a row; `offset`
    counts from the first byte of the COPY data."""
    text = (f"truncated COPY data at byte {offset}: need {needed} bytes for {what}"
            f"{_column_text(column, column_name)}, {remaining} remaining")
    return TruncatedMessage(text, offset=offset, needed=needed, remaining=remaining, column=column,
                            column_name=column_name)


def copy_error(offset: int, problem: str, column: int | None = None,
               column_name: str | None = None) -> ProtocolError:
    """Bytes of a binary COPY stream that are not what the format allows there."""
    text = f"bad COPY data at byte {offset}{_column_text(column, column_name)}: {problem}"
    return ProtocolError(text, offset=offset, column=column, column_name=column_name)
