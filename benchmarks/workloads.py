"""Benchmark workloads as frame records (the body `Decoder.feed_frames` takes).

`pgoutput_inserts()` builds a pgoutput protocol-1 stream of INSERTs into one 7-column table
(bigint, int, numeric(12,2), timestamptz, text, jsonb, uuid) in transactions of `txn_rows` rows:
B, R (once, in the first transaction), I x n, C. The text form averages about 210 bytes per row message.
With `binary=True` the same rows travel as 'b' values in each type's send format: int8/int4 big-endian,
numeric as (ndigits, weight, sign, dscale, base-10000 digits), timestamptz as int64 µs since 2000-01-01,
text as its bytes, jsonb as version byte 1 + the JSON text, uuid as 16 bytes.
The values are random but deterministic (seeded).
"""
from __future__ import annotations

import random
import struct
import uuid
from datetime import datetime, timedelta, timezone
from typing import NamedTuple

__all__ = ["Workload", "pgoutput_inserts", "numeric_send", "TABLE_COLUMNS", "RELID"]

RELID = 16_400
# (name, type oid, typmod, key)
TABLE_COLUMNS = (
    ("id", 20, -1, True),                     # bigint
    ("quantity", 23, -1, False),              # int
    ("price", 1700, (12 << 16 | 2) + 4, False),  # numeric(12,2)
    ("created_at", 1184, -1, False),          # timestamptz
    ("note", 25, -1, False),                  # text
    ("attributes", 3802, -1, False),          # jsonb
    ("ref", 2950, -1, False),                 # uuid
)

_RECORD = struct.Struct(">IQ")
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)

_WORDS = ("order shipped customer invoice pending delivered warehouse express standard return refund priority "
          "gift wrap fragile handle with care backorder partial payment confirmed cancelled address updated "
          "north south east west depot courier signature required weekend delivery contact before arrival").split()
_CITIES = ("Lisbon", "Oslo", "Denver", "Osaka", "Nairobi", "Lima", "Perth", "Quebec", "Tallinn", "Porto")
_TAGS = ("new", "vip", "bulk", "promo", "eu", "us", "apac", "repeat", "b2b", "mobile")


class Workload(NamedTuple):
    body: bytes            # frame records
    rows: int              # INSERT rows in the stream
    payload_bytes: int     # bytes of all message payloads (frame headers not counted)
    row_payload_bytes: int  # bytes of the 'I' messages alone
    messages: int


def numeric_send(unscaled: int, dscale: int = 2) -> bytes:
    """numeric's binary send format for unscaled / 10**dscale: i16 ndigits, i16 weight, u16 sign, u16 dscale,
    then base-10000 digits (leading and trailing zero digits stripped, as PostgreSQL stores them)."""
    sign = 0x4000 if unscaled < 0 else 0
    unscaled = abs(unscaled)
    # align the fraction to whole base-10000 digits
    frac_groups = (dscale + 3) // 4
    scaled = unscaled * 10 ** (frac_groups * 4 - dscale)
    digits = []
    while scaled:
        scaled, d = divmod(scaled, 10000)
        digits.append(d)
    digits.extend([0] * max(0, frac_groups - len(digits)))
    digits.reverse()                            # most significant first
    weight = len(digits) - frac_groups - 1
    while digits and digits[0] == 0:
        digits.pop(0)
        weight -= 1
    while digits and digits[-1] == 0:
        digits.pop()
    if not digits:
        weight = 0
        sign = 0
    return struct.pack(f">hhHH{len(digits)}h", len(digits), weight, sign, dscale, *digits)


def _timestamptz_text(micros: int) -> str:
    """PostgreSQL's text output of a timestamptz in UTC: fraction without trailing zeros, '+00'."""
    when = _PG_EPOCH + timedelta(microseconds=micros)
    text = when.strftime("%Y-%m-%d %H:%M:%S")
    if when.microsecond:
        text += f".{when.microsecond:06d}".rstrip("0")
    return text + "+00"


def _value_pools(rng: random.Random, size: int = 4096):
    notes = []
    for _ in range(size):
        words = rng.sample(_WORDS, rng.randint(2, 6))
        notes.append(" ".join(words).capitalize() + rng.choice((".", "", " #" + str(rng.randint(1, 999)))))
    docs = []
    for _ in range(size):
        tags = ", ".join(f'"{t}"' for t in rng.sample(_TAGS, rng.randint(0, 3)))
        # jsonb's text output: keys sorted by length then bytes, ", " and ": " separators
        docs.append(f'{{"city": "{rng.choice(_CITIES)}", "rush": {rng.choice(("true", "false"))}, "tags": [{tags}]}}')
    return notes, docs


def _relation() -> bytes:
    out = [b"R", struct.pack(">I", RELID), b"public\0", b"bench_orders\0", b"d", struct.pack(">H", len(TABLE_COLUMNS))]
    for name, oid, typmod, key in TABLE_COLUMNS:
        out.append(struct.pack(">B", 1 if key else 0) + name.encode() + b"\0" + struct.pack(">Ii", oid, typmod))
    return b"".join(out)


def pgoutput_inserts(rows: int = 200_000, txn_rows: int = 1000, *, binary: bool = False,
                     seed: int = 20_240_601) -> Workload:
    """The INSERT workload as frame records (see the module text)."""
    rng = random.Random(seed)
    notes, docs = _value_pools(rng)
    pool = len(notes)
    head = b"I" + struct.pack(">I", RELID) + b"N" + struct.pack(">H", len(TABLE_COLUMNS))
    records: list[bytes] = []
    payload_bytes = row_bytes = 0
    lsn = 0x1_6B00_0000
    xid = 7_400
    ts = 770_000_000_000_000                    # µs since 2000 (2024-05)
    row_id = 1_000_000

    def record(payload: bytes) -> None:
        nonlocal lsn, payload_bytes
        records.append(_RECORD.pack(len(payload), lsn) + payload)
        payload_bytes += len(payload)
        lsn += len(payload) + 24

    done = 0
    first = True
    while done < rows:
        n = min(txn_rows, rows - done)
        xid += 1
        ts += rng.randint(1_000, 2_000_000)
        commit_lsn = lsn + n * 240 + 4096     # where the COMMIT record will be
        record(b"B" + struct.pack(">QqI", commit_lsn, ts, xid))
        if first:
            record(_relation())
            first = False
        for _ in range(n):
            row_id += rng.randint(1, 3)
            quantity = rng.randint(1, 500)
            cents = rng.randint(100, 99_999_999)
            created = ts - rng.randint(0, 86_400_000_000)
            note = notes[rng.randrange(pool)].encode()
            doc = docs[rng.randrange(pool)].encode()
            ref = uuid.UUID(int=rng.getrandbits(128), version=4)
            if binary:
                values = (struct.pack(">q", row_id), struct.pack(">i", quantity), numeric_send(cents),
                          struct.pack(">q", created), note, b"\x01" + doc, ref.bytes)
                kind = b"b"
            else:
                values = (str(row_id).encode(), str(quantity).encode(), f"{cents // 100}.{cents % 100:02d}".encode(),
                          _timestamptz_text(created).encode(), note, doc, str(ref).encode())
                kind = b"t"
            payload = head + b"".join(kind + struct.pack(">I", len(v)) + v for v in values)
            row_bytes += len(payload)
            record(payload)
        lsn = max(lsn, commit_lsn)
        end_lsn = commit_lsn + 0x30
        record(b"C\0" + struct.pack(">QQq", commit_lsn, end_lsn, ts))
        lsn = end_lsn
        done += n
    return Workload(b"".join(records), rows, payload_bytes, row_bytes, len(records))


if __name__ == "__main__":  # pragma: no cover - a quick look at the sizes
    for as_binary in (False, True):
        w = pgoutput_inserts(binary=as_binary)
        print(f"binary={as_binary}: {w.rows} rows, {w.messages} messages, {w.payload_bytes} payload bytes, "
              f"{w.row_payload_bytes / w.rows:.1f} bytes per row message")
