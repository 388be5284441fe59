"""Decode the real captures in tests/data/ with both implementations and compare with the independent oracles.

test_decoding gives every committed change with its values as text; wal2json gives each transaction's commit LSN,
commit timestamp and replication origin. Rolled-back subtransactions, rolled-back transactions and rolled-back
prepared transactions must contribute nothing.
"""
from __future__ import annotations

import datetime as dt
import struct
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from spockwire.errors import ProtocolError
from spockwire.frames import read_frame_file
from tests.oracles import (UNCHANGED_TOAST, changes_of, group_transactions, parse_lsn, read_test_decoding,
                           read_wal2json)

DATA = Path(__file__).parent / "data"

TEXT_CAPTURES = ["pgoutput_v1_text", "pgoutput_v3_twophase", "pglogical_text"]
BINARY_CAPTURES = ["pgoutput_v2_binary_stream", "pglogical_binary", "pglogical_internal"]
ALL_CAPTURES = TEXT_CAPTURES + BINARY_CAPTURES

SKIP = object()  # internal varlena datums other than text: only NULL-ness is compared here
PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)


def _decode(impl: Any, name: str, **kwargs: Any) -> tuple[dict[str, Any], list[Any], Any]:
    """Decode a capture; values stay as the server sent them (types="raw": text as str, binary as bytes), which
    is what the text oracle can be compared with exactly."""
    header, body = read_frame_file(DATA / f"{name}.spwf")
    dec = impl.Decoder(protocol=header["protocol"], **(kwargs or {"types": "raw"}))
    consumed = dec.feed_frames(body)
    assert consumed in (None, body.nbytes)
    return header, dec.drain(), dec


def _rows(events: list[Any]) -> list[dict[str, Any]]:
    """Every output row of every ChangeBatch, with its table, in (_commit_lsn, _seq) order."""
    rows: list[dict[str, Any]] = []
    for ev in events:
        if hasattr(ev, "to_arrow"):
            table = f"{ev.relation.namespace}.{ev.relation.name}"
            for row in ev.to_pylist():
                row["_table"] = table
                rows.append(row)
    rows.sort(key=lambda r: (r["_commit_lsn"], r["_seq"]))
    return rows


def _oracle(name: str) -> list[dict[str, Any]]:
    return changes_of(group_transactions(read_test_decoding(DATA / f"{name}.test_decoding.txt")))


def _expected_rows(changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """test_decoding changes -> the output rows the decoder must produce, in order."""
    out: list[dict[str, Any]] = []
    for c in changes:
        if c["action"] == "insert":
            out.append(dict(table=c["table"], change="insert", values=c["new"], full=True, xid=c["xid"],
                            types=c["types"]))
        elif c["action"] == "update":
            if c["old"] is not None:
                out.append(dict(table=c["table"], change="update_preimage", values=c["old"], full=False,
                                xid=c["xid"], types=c["types"]))
            out.append(dict(table=c["table"], change="update_postimage", values=c["new"], full=True, xid=c["xid"],
                            types=c["types"]))
        elif c["action"] == "delete":
            out.append(dict(table=c["table"], change="delete", values=c["old"], full=False, xid=c["xid"],
                            types=c["types"]))
    return out


def _text_of(value: Any, typ: str, header: dict[str, Any]) -> Any:
    """A decoded value as test_decoding would print it (None for NULL, SKIP when this test cannot tell)."""
    if value is None:
        return None
    if isinstance(value, str):
        if typ == "boolean":
            return {"t": "true", "f": "false"}.get(value, value)
        return value
    raw = bytes(value)
    opts = header.get("options", {})
    internal = opts.get("binary.want_internal_basetypes") == "1"
    base = typ.split("(")[0]
    is_array = typ.endswith("[]")
    if internal and not is_array and base in ("integer", "bigint", "smallint", "boolean", "text",
                                              "character varying", "double precision", "real"):
        return _internal_text(raw, base)
    if base in ("integer", "posint"):
        return str(struct.unpack(">i", raw)[0])
    if base == "bigint":
        return str(struct.unpack(">q", raw)[0])
    if base == "smallint":
        return str(struct.unpack(">h", raw)[0])
    if base in ("text", "character varying", "mood"):
        return raw.decode("utf-8")
    if base == "boolean":
        return "true" if raw == b"\x01" else "false"
    if base == "timestamp with time zone" and len(raw) == 8:
        return _timestamptz_text(struct.unpack("<q" if internal else ">q", raw)[0])
    if internal:
        return SKIP  # internal varlena datums of other types: covered by tests/test_typed_values.py
    render = _SEND_TEXT.get(base)
    if render is not None:
        return render(raw, typ)
    return SKIP


# The send formats of the captures' other types, rendered as the server's text output (written here from
# PostgreSQL's send functions, independently of spockwire's value decoders).
def _numeric_send_text(raw: bytes, _typ: str) -> str:
    ndigits, weight, sign, dscale = struct.unpack_from(">hhHh", raw)
    digits = struct.unpack_from(f">{ndigits}h", raw, 8)
    if sign == 0xC000:
        return "NaN"
    whole = "".join(f"{digits[i]:04d}" if 0 <= i < ndigits else "0000" for i in range(weight + 1)).lstrip("0")
    frac = "".join(f"{digits[i]:04d}" if 0 <= i < ndigits else "0000" for i in range(weight + 1, weight + 1
                                                                                     + (dscale + 3) // 4))
    text = (whole or "0") + ("." + frac[:dscale] if dscale else "")
    return ("-" if sign == 0x4000 else "") + text


def _date_send_text(raw: bytes, _typ: str) -> str:
    days = struct.unpack(">i", raw)[0]
    if days in (2**31 - 1, -2**31):
        return "infinity" if days > 0 else "-infinity"
    z = days + 10957 + 719468               # days since 0000-03-01 (proleptic Gregorian, astronomical years)
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day, month = doy - (153 * mp + 2) // 5 + 1, mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (month <= 2)
    return f"{year:04d}-{month:02d}-{day:02d}" if year > 0 else f"{1 - year:04d}-{month:02d}-{day:02d} BC"


def _interval_send_text(raw: bytes, _typ: str) -> str:
    """interval_out in the postgres style: C's truncating division, '+' before a positive part after a negative."""
    us, days, months = struct.unpack(">qii", raw)
    years = int(months / 12)
    parts, zero, before = [], True, False
    for n, unit in ((years, "year"), (months - years * 12, "mon"), (days, "day")):
        if n:
            parts.append(f"{'+' if not zero and before and n > 0 else ''}{n} {unit}{'' if n == 1 else 's'}")
            zero, before = False, n < 0
    if zero or us:
        sign = "-" if us < 0 else ("+" if before else "")
        secs, frac = divmod(abs(us), 1_000_000)
        clock = f"{sign}{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}"
        parts.append(clock + (f".{frac:06d}".rstrip("0") if frac else ""))
    return " ".join(parts)


def _array_element_text(value: str) -> str:
    if value == "" or value.upper() == "NULL" or any(c in value for c in '{}",\\ \t\n'):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return value


def _array_send_text(raw: bytes, typ: str) -> str:
    ndim, _flags, _elem = struct.unpack_from(">iiI", raw)
    if ndim == 0:
        return "{}"
    assert ndim == 1, "the captures hold one-dimensional arrays"
    count, _lower = struct.unpack_from(">ii", raw, 12)
    pos, items = 20, []
    element = typ[:-2]
    for _ in range(count):
        (size,) = struct.unpack_from(">i", raw, pos)
        pos += 4
        if size < 0:
            items.append("NULL")
            continue
        data = raw[pos:pos + size]
        pos += size
        items.append(str(struct.unpack(">i", data)[0]) if element == "integer"
                     else _array_element_text(data.decode("utf-8")))
    return "{" + ",".join(items) + "}"


_SEND_TEXT = {
    "numeric": _numeric_send_text,
    "uuid": lambda raw, _t: str(uuid.UUID(bytes=raw)),
    "jsonb": lambda raw, _t: raw[1:].decode("utf-8") if raw[:1] == b"\x01" else f"<jsonb version {raw[0]}>",
    "json": lambda raw, _t: raw.decode("utf-8"),
    "bytea": lambda raw, _t: "\\x" + raw.hex(),
    "date": _date_send_text,
    "interval": _interval_send_text,
    "character": lambda raw, _t: raw.decode("utf-8"),
    "name": lambda raw, _t: raw.decode("utf-8"),
    "real": lambda raw, _t: struct.unpack(">f", raw)[0],
    "double precision": lambda raw, _t: struct.unpack(">d", raw)[0],
    "text[]": _array_send_text,
    "integer[]": _array_send_text,
}


def _timestamptz_text(us: int) -> Any:
    if us == 2**63 - 1:
        return "infinity"
    if us == -2**63:
        return "-infinity"
    try:
        when = PG_EPOCH + dt.timedelta(microseconds=us)
    except OverflowError:
        return SKIP
    if when.year < 1000:
        return SKIP
    return when.strftime("%Y-%m-%d %H:%M:%S.%f").rstrip("0").rstrip(".") + "+00"


def _internal_text(raw: bytes, base: str) -> Any:
    """pglogical 'i' datums: host byte order (little-endian here), varlena with its header."""
    if base == "integer":
        return str(struct.unpack("<i", raw)[0])
    if base == "bigint":
        return str(struct.unpack("<q", raw)[0])
    if base == "smallint":
        return str(struct.unpack("<h", raw)[0])
    if base == "boolean":
        return "true" if raw[:1] == b"\x01" else "false"
    if base in ("text", "character varying"):
        if raw and raw[0] & 1:  # 1-byte header
            return raw[1:raw[0] >> 1].decode("utf-8") if raw[0] != 1 else SKIP
        if len(raw) >= 4 and raw[0] & 3 == 0:  # 4-byte uncompressed header
            return raw[4:struct.unpack("<I", raw[:4])[0] >> 2].decode("utf-8")
        return SKIP  # inline-compressed
    return SKIP


def _normalize_oracle_value(value: Any, typ: str) -> Any:
    if isinstance(value, str) and typ == "timestamp with time zone":
        return value  # both sides already as server text
    return value


def _compare_row(got: dict[str, Any], exp: dict[str, Any], header: dict[str, Any], where: str) -> None:
    assert got["_table"] == exp["table"], where
    assert got["_change_type"] == exp["change"], where
    assert got["_xid"] == exp["xid"], where
    toast_cols = sorted(k for k, v in exp["values"].items() if v is UNCHANGED_TOAST)
    assert sorted(got["_unchanged_toast"] or []) == toast_cols, where
    if not toast_cols:
        assert got["_unchanged_toast"] is None, where
    table_cols = [k for k in got if not k.startswith("_")]
    for col in table_cols:
        typ = exp["types"].get(col, "")
        if col not in exp["values"]:
            # test_decoding leaves NULLs out of old tuples; new tuples always list every column
            assert not exp["full"], f"{where}: column {col} missing from the oracle"
            assert got[col] is None, f"{where}: column {col} should be NULL, got {got[col]!r}"
            continue
        want = exp["values"][col]
        if want is UNCHANGED_TOAST:
            assert got[col] is None, f"{where}: unchanged TOAST column {col} must be null"
            continue
        have = _text_of(got[col], typ, header)
        if have is SKIP:
            assert want is not None, f"{where}: column {col} should be NULL"
            continue
        if isinstance(have, float):   # binary floats: the same number as the server's shortest text
            assert want is not None and (have == float(want) or (have != have and want == "NaN")), \
                f"{where}: column {col} ({typ}): {have!r} != {want!r}"
            continue
        assert have == _normalize_oracle_value(want, typ), f"{where}: column {col} ({typ}): {have!r} != {want!r}"
    assert set(exp["values"]) <= set(table_cols), f"{where}: decoded columns {table_cols} lack some of the oracle"


def _wal2json_commits(name: str) -> dict[int, dict[str, Any]]:
    """xid -> {"lsn": commit LSN, "ts": commit timestamp text, "origin": origin id} from the wal2json B rows."""
    out: dict[int, dict[str, Any]] = {}
    for row in read_wal2json(DATA / f"{name}.wal2json.jsonl"):
        if row["action"] == "B":
            out[row["xid"]] = {"lsn": parse_lsn(row["lsn"]), "ts": row.get("timestamp"), "origin": row.get("origin")}
    return out


def _parse_pg_ts(text: str) -> dt.datetime:
    base, _, _ = text.rpartition("+")
    fmt = "%Y-%m-%d %H:%M:%S.%f" if "." in base else "%Y-%m-%d %H:%M:%S"
    return dt.datetime.strptime(base, fmt).replace(tzinfo=dt.timezone.utc)


def _published(header: dict[str, Any], changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The oracle changes the captured plugin publishes. pglogical: the public tables in its sets plus
    pglogical.queue (set ddl_sql), which is how a TRUNCATE travels; no native TRUNCATE, no logical messages."""
    if header["protocol"] == "pglogical":
        return [c for c in changes if c["action"] in ("insert", "update", "delete")
                and (c["table"].startswith("public.") or c["table"] == "pglogical.queue")]
    return [c for c in changes if c["action"] not in ("insert", "update", "delete")
            or c["table"].startswith("public.")]


@pytest.mark.parametrize("name", ALL_CAPTURES)
def test_rows_match_test_decoding(impl: Any, name: str) -> None:
    header, events, _ = _decode(impl, name)
    got = _rows(events)
    expected = _expected_rows(_published(header, _oracle(name)))
    assert len(got) == len(expected), (
        f"{name}: {len(got)} decoded rows, test_decoding has {len(expected)}")
    for i, (g, e) in enumerate(zip(got, expected)):
        _compare_row(g, e, header, f"{name} row {i} ({e['table']} {e['change']})")


@pytest.mark.parametrize("name", ALL_CAPTURES)
def test_commit_lsn_ts_origin_match_wal2json(impl: Any, name: str) -> None:
    header, events, dec = _decode(impl, name)
    commits = _wal2json_commits(name)
    origins = header.get("origins", {})
    rows = _rows(events)
    assert rows
    for r in rows:
        w = commits[r["_xid"]]
        assert r["_commit_lsn"] == w["lsn"], f"xid {r['_xid']}"
        assert r["_commit_ts"] == _parse_pg_ts(w["ts"]), f"xid {r['_xid']}"
        want_origin = origins.get(str(w["origin"])) if w["origin"] else None
        assert r["_origin"] == want_origin, f"xid {r['_xid']}"
        # _seq numbers the outputs of a transaction from 0, without gaps between its rows of one table
    assert dec.committed_lsn >= max(r["_commit_lsn"] for r in rows)
    if name in ("pgoutput_v1_text", "pglogical_text"):
        assert any(r["_origin"] for r in rows), "the replication-origin transaction carries its origin"


@pytest.mark.parametrize("name", ALL_CAPTURES)
def test_events_in_commit_order_and_seq(impl: Any, name: str) -> None:
    _, events, _ = _decode(impl, name)
    last_per_table: dict[str, tuple[int, int]] = {}
    per_txn: dict[int, list[int]] = {}
    for ev in events:
        if hasattr(ev, "to_arrow"):
            table = f"{ev.relation.namespace}.{ev.relation.name}"
            for r in ev.to_arrow().to_pylist():
                key = (r["_commit_lsn"], r["_seq"])
                assert key > last_per_table.get(table, (-1, -1)), f"{table} rows out of order"
                last_per_table[table] = key
                per_txn.setdefault(r["_commit_lsn"], []).append(r["_seq"])
        elif hasattr(ev, "relations"):
            per_txn.setdefault(ev.commit_lsn, []).append(ev.seq)
        elif getattr(ev, "commit_lsn", None) is not None:
            per_txn.setdefault(ev.commit_lsn, []).append(ev.seq)
    for lsn, seqs in per_txn.items():
        # unique and starting at 0; a streamed transaction may leave gaps where an aborted subtransaction's
        # already-streamed changes were dropped
        assert len(set(seqs)) == len(seqs) and min(seqs) == 0, f"_seq of the transaction committed at {lsn:X}"


def test_truncates_and_messages_pgoutput_v1(impl: Any) -> None:
    name = "pgoutput_v1_text"
    header, events, _ = _decode(impl, name)
    oracle = _oracle(name)
    truncs = [e for e in events if hasattr(e, "relations") and hasattr(e, "cascade")]
    want_t = [c for c in oracle if c["action"] == "truncate"]
    assert [[f"{r.namespace}.{r.name}" for r in t.relations] for t in truncs] == [c["tables"] for c in want_t]
    assert [(t.cascade, t.restart_identity) for t in truncs] == [(c["cascade"], c["restart_identity"])
                                                                 for c in want_t]
    msgs = [e for e in events if hasattr(e, "prefix")]
    want_m = [c for c in oracle if c["action"] == "message"]
    assert [(m.prefix, bytes(m.content), m.transactional) for m in msgs] == [
        (c["prefix"], c["content"], c["transactional"]) for c in want_m]
    for m in msgs:
        if m.transactional:
            assert m.commit_lsn is not None and m.xid is not None
        else:
            assert m.commit_lsn is None


def test_relation_versions_pgoutput_v1(impl: Any) -> None:
    _, events, dec = _decode(impl, "pgoutput_v1_text")
    evolving = [r for r in dec.relations.values() if r.name == "evolving"]
    assert len(evolving) == 1
    assert evolving[0].version >= 2
    assert [c.name for c in evolving[0].columns] == ["id", "v", "extra"]
    kinds = next(r for r in dec.relations.values() if r.name == "kinds")
    assert [c.name for c in kinds.columns if c.is_key] == ["id"]
    full = next(r for r in dec.relations.values() if r.name == "full_ident")
    assert full.replica_identity in ("f", "full")


ROLLED_BACK_MARKERS = ("rolled back", "never", "aborted ", "gone ", "mallory")


@pytest.mark.parametrize("name", ALL_CAPTURES)
def test_rolled_back_work_contributes_nothing(impl: Any, name: str) -> None:
    header, events, _ = _decode(impl, name)
    for r in _rows(events):
        for col, value in r.items():
            if col.startswith("_") or value is None:
                continue
            text = value if isinstance(value, str) else bytes(value).decode("utf-8", "replace")
            assert len(text) > 200 or not any(m in text for m in ROLLED_BACK_MARKERS), (
                f"{name}: rolled-back value {text!r} in {r['_table']}")
    if name == "pgoutput_v2_binary_stream":
        ids = [struct.unpack(">i", bytes(r["id"]))[0] if isinstance(r["id"], (bytes, bytearray)) else int(r["id"])
               for r in _rows(events) if r["_table"] == "public.big"]
        assert not any(2001 <= i <= 2600 or i >= 10001 for i in ids)


def _numeric_nan_columns(raw_events: list[Any]) -> set[str]:
    """Columns declared numeric(p,s) that hold a NaN, found from the raw values the server sent."""
    found: set[str] = set()
    for ev in raw_events:
        if not hasattr(ev, "to_arrow"):
            continue
        constrained = {c.name for c in ev.relation.columns if c.type_oid == 1700 and (c.type_modifier or -1) >= 4}
        for row in ev.to_arrow().to_pylist():
            for col in constrained:
                if row[col] in ("NaN", b"NaN"):
                    found.add(col)
    return found


@pytest.mark.parametrize("name", ALL_CAPTURES)
def test_default_typed_mode_decodes_every_capture(impl: Any, name: str) -> None:
    """Every value a real server sent decodes in the default typed mode (infinite and BC timestamps, empty arrays,
    enums, domains), with the same rows as the raw mode. A NaN in a numeric(p,s) column, which decimal128 cannot
    hold, switches that column to PostgreSQL's text under a new relation version; on_unrepresentable="error"
    refuses it instead, naming the column."""
    header, body = read_frame_file(DATA / f"{name}.spwf")
    _, raw, _ = _decode(impl, name)
    nan_columns = _numeric_nan_columns(raw)
    if nan_columns:
        strict = impl.Decoder(protocol=header["protocol"], on_unrepresentable="error")
        with pytest.raises(ProtocolError, match="no decimal128 form") as info:
            strict.feed_frames(body)
        assert info.value.column_name in nan_columns
    dec = impl.Decoder(protocol=header["protocol"])
    dec.feed_frames(body)
    typed = dec.drain()
    assert [(r["_table"], r["_change_type"], r["_commit_lsn"], r["_seq"]) for r in _rows(typed)] == [
        (r["_table"], r["_change_type"], r["_commit_lsn"], r["_seq"]) for r in _rows(raw)]
    if nan_columns:
        assert any(r.get(col) == "NaN" for r in _rows(typed) for col in nan_columns)
        switched = [e for e in typed if hasattr(e, "to_arrow") and any(
            e.to_arrow().schema.field(col).type == pa.string() for col in nan_columns if col in e.relation.column_names)]
        assert switched and all(e.relation.version > 1 for e in switched)
