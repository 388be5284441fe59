"""Helpers shared by the `spockwire` commands: settings every command has, decoders, frame files, formatting."""
from __future__ import annotations

import datetime as _dt
import decimal as _decimal
import importlib
import uuid as _uuid
from types import ModuleType
from typing import Any

from pyarrow import MonthDayNano as _MonthDayNano

from ..frames import frame_proto_format, parse_file_header, read_frame_file
from ..wire.json_protocol import json_decoder_or_native
from ..ingest.staging import COMPRESSIONS, DEFAULT_MAX_BYTES, DEFAULT_MAX_ROWS
from ..values.catalog import TypeCatalogError, parse_column_types
from ..values.recorded import RecordedTypeCatalog
from .config import CONFIG, Setting, parse_size, positive_int

__all__ = ["IMPL", "TYPES", "COLUMN_TYPE", "ON_UNREPRESENTABLE", "parse_column_types", "STAGING_SETTINGS", "COMMON_SETTINGS", "decoder_module", "decoder_for", "load_frame_file", "parse_frame_bytes",
           "format_lsn", "format_value", "format_row", "json_value", "human_bytes", "CliError"]

IMPL = Setting("impl", "decoder implementation: c (compiled) or python (pure-Python twin); default: the one "
                       "`import spockwire` selected", choices=("c", "python"))
TYPES = Setting("types", "column values: typed (Arrow types from the column's PostgreSQL type) or raw (text/bytes "
                         "as sent); default: the decoder's default", choices=("typed", "raw"))
NUMERIC = Setting("numeric", "numeric columns: decimal (numeric(p,s) as decimal128; a NaN there is an error) or "
                             "text (every numeric as its exact text); default: decimal", choices=("decimal", "text"))
COMMON_SETTINGS = (CONFIG, IMPL, TYPES, NUMERIC)


COLUMN_TYPE = Setting("column_type", "decode one column as text (PostgreSQL's text of every value) or raw (as "
                      "sent), whatever its type: schema.table.column=TYPE; repeat the flag or separate with commas",
                      type=parse_column_types, metavar="SCHEMA.TABLE.COLUMN=TYPE", repeat=True)
ON_UNREPRESENTABLE = Setting("on_unrepresentable", "a valid value its column's Arrow type cannot hold (2-D array, "
                             "NaN in numeric(p,s), timestamp past 294247 AD, ...): text (the column continues as "
                             "PostgreSQL's text under a new schema version) or error", choices=("text", "error"),
                             default="text")

# where and how `ingest` and `decode` stage (the same layout either way)
OUT = Setting("out", "staging folder to write (created if missing; an existing one is resumed)", required=True,
              metavar="DIR", short="-o")
COMPRESSION = Setting("compression", "Parquet compression", choices=COMPRESSIONS, default="zstd")
FLUSH_ROWS = Setting("flush_rows", "commit to staging once this many rows are buffered", type=positive_int,
                     default=DEFAULT_MAX_ROWS, metavar="N")
FLUSH_BYTES = Setting("flush_bytes", "commit to staging once this much memory is buffered (e.g. 64MiB)",
                      type=parse_size, default=DEFAULT_MAX_BYTES, metavar="SIZE")
STAGING_SETTINGS = (OUT, COMPRESSION, FLUSH_ROWS, FLUSH_BYTES)


class CliError(Exception):
    """An expected failure of a command: printed as one line on stderr, exit status 1."""


def decoder_module(impl: str | None) -> ModuleType:
    """The decoder module for `impl` ("c" | "python"), or the one `import spockwire` selected for None."""
    if impl is None:
        import spockwire

        impl = spockwire.__impl__
    name = "spockwire.wire._decoder" if impl == "c" else "spockwire.wire._decoder_py"
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise CliError(f"the {impl!r} decoder cannot be loaded: {exc}") from None


def decoder_for(module: ModuleType, header: dict[str, Any], types: str | None = None,
                numeric: str | None = None, **options: Any) -> Any:
    """A decoder for a frame file, configured from its header (protocol, spock proto_version, the type catalog
    `spockwire capture` recorded), `types`, `numeric` and further decoder options (column_types,
    on_unrepresentable, type_catalog; None: the decoder's default)."""
    protocol = header["protocol"]
    kwargs: dict[str, Any] = {k: v for k, v in options.items() if v is not None}
    if types is not None:
        kwargs["types"] = types
    if numeric is not None:
        kwargs["numeric"] = numeric
    if "type_catalog" not in kwargs:
        try:
            recorded = RecordedTypeCatalog.from_frame_header(header)
        except TypeCatalogError as exc:
            raise CliError(f"cannot decode this frame file: {exc}") from None
        if recorded is not None:
            kwargs["type_catalog"] = recorded
    options = header.get("options") or {}
    if protocol == "spock" and isinstance(options, dict) and "proto_version" in options:
        try:
            kwargs["proto_version"] = int(options["proto_version"])
        except (TypeError, ValueError):
            pass
    try:
        return json_decoder_or_native(module, protocol, frame_proto_format(header), **kwargs)
    except ValueError as exc:
        raise CliError(f"cannot decode this frame file: {exc}") from None


def load_frame_file(path: str) -> tuple[dict[str, Any], memoryview]:
    """Read a frame file; a missing or unreadable file is a CliError (FrameError passes through)."""
    try:
        return read_frame_file(path)
    except IsADirectoryError:
        raise CliError(f"{path} is a folder, not a frame file") from None
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None


def parse_frame_bytes(data: bytes, source: str) -> tuple[dict[str, Any], memoryview]:
    header, start = parse_file_header(data, source=source)
    return header, memoryview(data)[start:]


def format_lsn(lsn: int | None) -> str:
    if lsn is None:
        return "-"
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def format_value(value: Any, width: int = 40) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, (bytes, bytearray, memoryview)):
        text = "\\x" + bytes(value).hex()
    elif isinstance(value, _dt.datetime):
        text = value.isoformat()
    elif isinstance(value, str):
        text = repr(value)
    else:
        text = str(value)
    if len(text) > width:
        text = text[:width - 1] + "…"
    return text


def format_row(row: dict[str, Any], names: list[str], width: int = 40) -> str:
    return " ".join(f"{n}={format_value(row[n], width)}" for n in names)


def json_value(value: Any) -> Any:
    """The JSON form of a decoded value, recursively; `json.dumps(json_value(v), allow_nan=False)` always works.

    | Python value | JSON |
    |---|---|
    | None, bool, int, str | as they are |
    | float | a number; NaN, Infinity, -Infinity as the strings `"NaN"`, `"Infinity"`, `"-Infinity"` |
    | Decimal | its exact text (a string: a JSON number would lose digits in most readers) |
    | bytes | PostgreSQL's bytea hex text, `"\\x0a0b"` |
    | datetime, date, time | ISO 8601 text |
    | timedelta | `{"days", "seconds", "microseconds"}` |
    | uuid.UUID | its canonical text |
    | interval (pyarrow MonthDayNano) | `{"months", "days", "nanoseconds"}` |
    | list, tuple | an array; dict: an object |
    Anything else becomes its `str()`: `spockwire.INFINITY` / `NEG_INFINITY` give `"infinity"` / `"-infinity"`.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "\\x" + bytes(value).hex()
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return {"days": value.days, "seconds": value.seconds, "microseconds": value.microseconds}
    if isinstance(value, (_decimal.Decimal, _uuid.UUID)):
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, _MonthDayNano):
        return {"months": value.months, "days": value.days, "nanoseconds": value.nanoseconds}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return str(value)
