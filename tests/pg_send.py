"""PostgreSQL's binary send formats, written from the type definitions (for round-trip tests of the decoders).

Each function returns the bytes a PostgreSQL 15 `*_send` function produces for one value. Epochs and units are
PostgreSQL's own: dates are days since 2000-01-01, timestamps µs since 2000-01-01 00:00:00 (UTC for timestamptz).
"""
from __future__ import annotations

import json
import struct
from typing import Any, Sequence

__all__ = ["bool_send", "int2_send", "int4_send", "int8_send", "oid_send", "float4_send", "float8_send",
           "numeric_send", "numeric_typmod", "date_send", "timestamp_send", "time_send", "timetz_send",
           "interval_send", "uuid_send", "text_send", "bytea_send", "jsonb_send", "json_send", "array_send",
           "numeric_text", "timetz_text", "PG_EPOCH_DAYS", "PG_EPOCH_US", "DATE_MIN", "DATE_MAX", "TS_MIN",
           "TS_MAX", "INT32_MAX", "INT32_MIN", "INT64_MAX", "INT64_MIN"]

PG_EPOCH_DAYS = 10957                    # 2000-01-01 in days since 1970-01-01
PG_EPOCH_US = 946_684_800_000_000        # ... in µs
INT32_MAX, INT32_MIN = (1 << 31) - 1, -(1 << 31)
INT64_MAX, INT64_MIN = (1 << 63) - 1, -(1 << 63)
DATE_MIN = -2451545                      # 4714-11-24 BC, days since 2000 (date ±infinity are INT32_MIN/MAX)
DATE_MAX = 2145031948                    # 5874897-12-31
TS_MIN = -211813488000000000             # 4714-11-24 00:00:00 BC (timestamp ±infinity are INT64_MIN/MAX)
TS_MAX = 9223371331200000000 - 1         # 294276-12-31 23:59:59.999999


def bool_send(v: bool) -> bytes:
    return b"\x01" if v else b"\x00"


def int2_send(v: int) -> bytes:
    return struct.pack(">h", v)


def int4_send(v: int) -> bytes:
    return struct.pack(">i", v)


def int8_send(v: int) -> bytes:
    return struct.pack(">q", v)


def oid_send(v: int) -> bytes:
    return struct.pack(">I", v)


def float4_send(v: float) -> bytes:
    return struct.pack(">f", v)


def float8_send(v: float) -> bytes:
    return struct.pack(">d", v)


def numeric_typmod(precision: int, scale: int) -> int:
    return ((precision << 16) | (scale & 0x7FF)) + 4


def numeric_send(unscaled: int | str, dscale: int = 0) -> bytes:
    """The numeric with value `unscaled` × 10^-dscale (dscale >= 0), or 'NaN' / 'Infinity' / '-Infinity'.

    Layout: i16 ndigits, i16 weight (of the first base-10000 digit), u16 sign, u16 dscale, ndigits × i16 digit;
    leading and trailing zero digits are left out, as numeric_send does.
    """
    special = {"NaN": 0xC000, "Infinity": 0xD000, "-Infinity": 0xF000}
    if isinstance(unscaled, str):
        return struct.pack(">hhHH", 0, 0, special[unscaled], 0)
    sign = 0x4000 if unscaled < 0 else 0
    n = abs(unscaled)
    frac_groups = (dscale + 3) // 4
    n *= 10 ** (4 * frac_groups - dscale)
    groups: list[int] = []
    while n:
        n, d = divmod(n, 10000)
        groups.append(d)
    groups.reverse()
    if not groups:
        return struct.pack(">hhHH", 0, 0, 0, dscale)
    weight = len(groups) - frac_groups - 1
    while groups and groups[0] == 0:
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    return struct.pack(f">hhHH{len(groups)}h", len(groups), weight, sign, dscale, *groups)


def numeric_text(unscaled: int, dscale: int) -> str:
    """numeric_out of unscaled × 10^-dscale."""
    digits = str(abs(unscaled)).rjust(dscale + 1, "0")
    text = digits if dscale == 0 else f"{digits[:-dscale]}.{digits[-dscale:]}"
    return ("-" if unscaled < 0 else "") + text


def date_send(pg_days: int) -> bytes:
    return struct.pack(">i", pg_days)


def timestamp_send(pg_us: int) -> bytes:
    return struct.pack(">q", pg_us)


def time_send(us: int) -> bytes:
    return struct.pack(">q", us)


def timetz_send(us: int, zone_west: int) -> bytes:
    """time in µs, then the zone in seconds WEST of UTC (PostgreSQL's sign convention)."""
    return struct.pack(">qi", us, zone_west)


def timetz_text(us: int, zone_west: int) -> str:
    """timetz_out: HH:MM:SS[.ffffff without trailing zeros], then +HH[:MM[:SS]] east of UTC."""
    hours, rest = divmod(us, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    seconds, micros = divmod(rest, 1_000_000)
    text = f"{hours:02d}:{minutes:02d}:{seconds:02d}"
    if micros:
        text += f".{micros:06d}".rstrip("0")
    east = -zone_west
    sign = "-" if east < 0 else "+"
    zh, zrest = divmod(abs(east), 3600)
    zm, zs = divmod(zrest, 60)
    text += f"{sign}{zh:02d}"
    if zm or zs:
        text += f":{zm:02d}"
    if zs:
        text += f":{zs:02d}"
    return text


def interval_send(us: int, days: int, months: int) -> bytes:
    return struct.pack(">qii", us, days, months)


def uuid_send(v: bytes) -> bytes:
    assert len(v) == 16
    return bytes(v)


def text_send(v: str) -> bytes:
    return v.encode("utf-8")


def bytea_send(v: bytes) -> bytes:
    return bytes(v)


def json_send(v: Any) -> bytes:
    return json.dumps(v, ensure_ascii=False).encode("utf-8")


def jsonb_send(v: Any) -> bytes:
    """jsonb_send: version byte 1, then the text."""
    return b"\x01" + json_send(v)


def array_send(elem_oid: int, elements: Sequence[bytes | None], lower_bound: int = 1) -> bytes:
    """A 1-D array (0-D when empty): ndim, has-nulls flag, element type, [length, lower bound], elements."""
    if not elements:
        return struct.pack(">iiI", 0, 0, elem_oid)
    has_null = any(e is None for e in elements)
    out = [struct.pack(">iiIii", 1, 1 if has_null else 0, elem_oid, len(elements), lower_bound)]
    for e in elements:
        out.append(struct.pack(">i", -1) if e is None else struct.pack(">i", len(e)) + e)
    return b"".join(out)
