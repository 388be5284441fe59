"""Write the seed corpus of fuzz/fuzz_decoder.py.

    python fuzz/seeds.py OUT_DIR

Seeds, each in the input layout of fuzz_decoder.py (two configuration bytes, then the bytes):
* "message": one message fed after the fixed preamble -- inserts, updates, deletes with text, binary, internal
  (fixed-size, varlena, pglz- and LZ4-compressed), NULL and unchanged-TOAST values of every column type of the preamble's relations, truncates, logical messages,
  relation and type messages -- for each protocol, spock version and preamble kind, typed and raw;
* "messages": the golden streams (tests/golden_vectors.py) and single transactions of the real captures
  (tests/data/*.spwf) as length-prefixed message sequences;
* "expanding": transactions of binary values whose text is thousands of times longer (numeric 1e131068 alone
  and in numeric[] arrays), which the batch limit must count by what they add to their columns;
* "frames" / "partial": the same transactions as frame-record bodies, each preceded by the startup and relation
  messages it needs;
* "datum": the data of jsonb, tsvector, tsquery, jsonpath and aclitem datums made by real servers, and a few in
  the other byte order.
"""
from __future__ import annotations

import hashlib
import os
import struct
import sys
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path

# Seeds are bytes: writing them needs the encoder and the frame reader, never a compiled decoder (the source tree
# this runs from may have none built, and SPOCKWIRE_REQUIRE_EXT=1 would refuse the twin).
os.environ["SPOCKWIRE_IMPL"] = "python"
sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_decoder as F  # noqa: E402

from spockwire.frames import iter_frames, read_frame_file  # noqa: E402
from tests import golden_vectors as G  # noqa: E402
from tests import internal_datums as D  # noqa: E402
from tests import wire_encoder as W  # noqa: E402

DATA = F.ROOT / "tests" / "data"
MAX_SEED = 12_000

# -------------------------------------------------------------------------------------------------------------
# binary (send/recv) forms of the preamble's column types

PG_EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)


def b_numeric(value: str) -> bytes:
    """numeric's binary form: ndigits, weight, sign, dscale, then base-10000 digits."""
    special = {"NaN": 0xC000, "Infinity": 0xD000, "-Infinity": 0xF000}
    if value in special:
        return struct.pack(">hhHH", 0, 0, special[value], 0)
    d = Decimal(value)
    sign = 0x4000 if d < 0 else 0
    sign_, digits, exp = abs(d).as_tuple()
    dscale = max(0, -exp)
    text = "".join(map(str, digits))
    if exp > 0:
        text += "0" * exp
        exp = 0
    int_part, frac = (text[:len(text) + exp], text[len(text) + exp:]) if exp else (text, "")
    int_part = int_part.lstrip("0")
    int_part = "0" * (-len(int_part) % 4) + int_part
    frac = frac + "0" * (-len(frac) % 4)
    groups = [int(int_part[i:i + 4]) for i in range(0, len(int_part), 4)]
    weight = len(groups) - 1
    groups += [int(frac[i:i + 4]) for i in range(0, len(frac), 4)]
    while groups and groups[0] == 0:
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        weight = 0
    return struct.pack(">hhHH", len(groups), weight, sign, dscale) + b"".join(struct.pack(">h", g) for g in groups)


def b_array(elem_oid: int, elems: list, lbound: int = 1) -> bytes:
    """1-D binary array: ndim, has-null flag, element type, (dim, lower bound), then (length, bytes) per element."""
    if not elems:
        return struct.pack(">iiI", 0, 0, elem_oid)
    has_null = int(any(e is None for e in elems))
    out = [struct.pack(">iiIii", 1, has_null, elem_oid, len(elems), lbound)]
    for e in elems:
        out.append(struct.pack(">i", -1) if e is None else struct.pack(">i", len(e)) + e)
    return b"".join(out)


def us_since_2000(dt: datetime) -> int:
    delta = dt - PG_EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


i2, i4, i8, u4 = (lambda v: struct.pack(">h", v)), (lambda v: struct.pack(">i", v)), \
    (lambda v: struct.pack(">q", v)), (lambda v: struct.pack(">I", v))

TEXT_ROWS = {
    0x101: [["42", "héllo", "12.50", "\\x0102ff", "t", "2024-01-02 03:04:05.123456+00", '{"a": [1, 2]}'],
            ["-7", "", "-0.01", "\\x", "f", "infinity", "null"]],
    0x102: [["{1,2,NULL}", '{a,"b c",NULL}', "{1.5,NaN,-2}", "1 year 2 mons 3 days 04:05:06.5",
             "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "2024-02-29", "04:05:06.5+05:30"],
            ["{}", "{}", "{}", "-00:00:01", "00000000-0000-0000-0000-000000000000", "-infinity", "00:00:00-14:59"]],
    0x103: [["1.5", "NaN", "-32768", "9223372036854775807", "4294967295", "23:59:59.999999",
             "2000-01-01 00:00:00", "123456789012345678901234567890.123456789", "-1.00001", "(1,2)", "[1, {}]",
             "abc"],
            ["-Infinity", "1e308", "0", "-9223372036854775808", "0", "00:00:00", "294276-12-31 23:59:59.999999",
             "Infinity", "NaN", "(0,0)", '""', ""]],
}

BINARY_ROWS = {
    0x101: [[i4(42), "héllo".encode(), b_numeric("12.50"), b"\x01\x02\xff", b"\x01",
             i8(us_since_2000(datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc))), b'\x01{"a": [1, 2]}'],
            [i4(-7), b"", b_numeric("-0.01"), b"", b"\x00", i8(0x7FFFFFFFFFFFFFFF), b"\x01null"],
            [i4(0), b"x", b_numeric("NaN"), b"\x00", b"\x02", i8(-(1 << 63)), b"\x02{}"]],
    0x102: [[b_array(23, [i4(1), i4(2), None]), b_array(25, [b"a", b"b c", None]),
             b_array(1700, [b_numeric("1.5"), b_numeric("NaN"), b_numeric("-2")]),
             struct.pack(">qii", 4 * 3600_000_000 + 5 * 60_000_000 + 6_500_000, 3, 14),
             bytes.fromhex("a0eebc999c0b4ef8bb6d6bb9bd380a11"), i4((date(2024, 2, 29) - date(2000, 1, 1)).days),
             struct.pack(">qi", 14706_500_000, -19800)],
            [b_array(23, []), b_array(25, [], 0), b_array(1700, [None]), struct.pack(">qii", -1, -1, -1),
             bytes(16), i4(0x7FFFFFFF), struct.pack(">qi", 0, 53940)],
            [struct.pack(">iiIiiii", 2, 0, 23, 1, 1, 1, 1) + i4(4) + i4(1), b_array(25, [b"\xff"]),
             b_array(1700, [b_numeric("Infinity")]), struct.pack(">qii", 1 << 62, 1 << 30, 1 << 30), bytes(15),
             i4(-0x80000000), struct.pack(">qi", 86_400_000_000, 0)]],
    0x103: [[struct.pack(">f", 1.5), struct.pack(">d", float("nan")), i2(-32768), i8(2 ** 63 - 1), u4(2 ** 32 - 1),
             i8(86_399_999_999), i8(0), b_numeric("123456789012345678901234567890.123456789"),
             b_numeric("-1.00001"), struct.pack(">dd", 1, 2), b"[1, {}]", b"abc"],
            [struct.pack(">f", float("-inf")), struct.pack(">d", -0.0), i2(0), i8(-(1 << 63)), u4(0), i8(0),
             i8(0x7FFFFFFFFFFFFFFF), b_numeric("Infinity"), b_numeric("NaN"), bytes(16), b'""', b""],
            [b"\x00\x00\x80", b"\x00" * 9, b"\x01", i8(1)[:7], b"", i8(-1), i8(1 << 62), b_numeric("0"),
             struct.pack(">hhHH", 1, 0, 0x4000, 5) + i2(10000), b"\x00", b"\xff\xfe", b"\xc3"]],
}


def internal_rows() -> list:
    """Host-order (little-endian, as the preamble's startup says) internal datums of fz_c's fixed-size columns."""
    le = lambda fmt, v: W.Internal(struct.pack("<" + fmt, v))  # noqa: E731
    return [[le("f", 2.5), le("d", -1.25), le("h", 7), le("q", -5), le("I", 99), le("q", 3_600_000_000),
             le("q", 1_000_000), "3.14", None, None, None, None],
            [W.Internal(b"\x00\x00"), le("d", 0.0), W.Internal(b""), le("q", 0), le("I", 0), le("q", -1),
             le("q", 0x7FFFFFFFFFFFFFFF), W.Internal(b"\x0b\x00\x00\x00\x00\x00\x00\x00"), W.Internal(b"\x05x"),
             W.Internal(bytes(16)), W.Internal(b"\x13[1]"), W.Internal(b"\x09abc")],
            # varlena datums: numeric short and long forms, pglz- and LZ4-compressed json and varchar
            [None, None, None, None, None, None, None, W.Internal(D.varlena(D.numeric_short(0, True, 2, [12, 3400]))),
             W.Internal(D.varlena(D.numeric_long((2, 1, 0, 5), [7, 1234]), short=False)), None,
             W.Internal(D.compressed(D.pglz(_JSON), len(_JSON), 0)),
             W.Internal(D.compressed(D.lz4(b"abcd" * 40), 160, 1))]]


_JSON = b'{"k": [' + b"1, " * 60 + b"2]}"


# -------------------------------------------------------------------------------------------------------------

class Corpus:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.count = 0
        out.mkdir(parents=True, exist_ok=True)

    def add(self, tag: str, data: bytes) -> None:
        if len(data) > MAX_SEED:
            return
        name = f"{tag}-{hashlib.sha1(data).hexdigest()[:12]}"
        path = self.out / name
        if not path.exists():
            path.write_bytes(data)
            self.count += 1


def variants():
    """(protocol, spock variant, spock version) of every stream kind the preamble speaks."""
    yield "pgoutput", 0, None
    yield "pglogical", 0, None
    yield "spock", 0, 5
    yield "spock", 1, 4


def single_messages(protocol: str, version: int | None, xid: int | None) -> list[tuple[str, bytes]]:
    """Valid messages for the preamble's relations (xid: pgoutput's xid field inside a stream block)."""
    native = protocol != "pgoutput"
    extra = {"xid": xid} if (xid is not None and protocol == "pgoutput") else {}

    def msg(t, **fields):
        return F.message(protocol, t, version, **fields, **extra)

    out = []
    rows = {relid: TEXT_ROWS[relid] + BINARY_ROWS[relid] for relid in TEXT_ROWS}
    if native:
        rows[0x103] = rows[0x103] + internal_rows()
    for relid, values_list in rows.items():
        for k, values in enumerate(values_list):
            out.append((f"I{relid:x}.{k}", msg("I", relid=relid, new=values)))
        first, second = values_list[0], values_list[-1]
        keyed = [v if c[3] else None for v, c in zip(first, F.RELATIONS[relid - 0x101][3])]
        with_toast = [W.UNCHANGED if i % 2 else v for i, v in enumerate(second)]
        out.append((f"U{relid:x}.K", msg("U", relid=relid, old=keyed, new=with_toast)))
        out.append((f"U{relid:x}.O", msg("U", relid=relid, old_kind="O", old=second, new=first)))
        out.append((f"U{relid:x}.N", msg("U", relid=relid, new=second)))
        out.append((f"D{relid:x}", msg("D", relid=relid, old=keyed)))
        out.append((f"D{relid:x}.null", msg("D", relid=relid, old_kind="O", old=[None] * len(first))))
    if protocol == "pgoutput":
        out.append(("T", msg("T", flags=3, relids=[0x101, 0x102, 0x103])))
        out.append(("T.one", msg("T", flags=0, relids=[0x102])))
        out.append(("M", msg("M", flags=1, lsn=F.FINAL_LSN - 8, prefix="app", content=b"hello")))
        out.append(("M.nontx", F.message(protocol, "M", flags=0, lsn=5, prefix="p", content=b"\0\1")))
        out.append(("Y", msg("Y", type_oid=0x4168, namespace="public", name="mood")))
    elif protocol == "spock":
        out.append(("T", msg("T", flags=3, relids=[0x101, 0x103])))
        out.append(("M", msg("M", xid=F.XID, lsn=F.FINAL_LSN - 8, content=W.spock_sync_event(2))))
        out.append(("L", msg("L", last_commit_ts=F.COMMIT_TS)))
    cols = [W.Col(c[0], c[1], c[2], c[3]) for c in F.RELATIONS[0][3]]
    if protocol == "pgoutput":
        out.append(("R", msg("R", relid=0x101, namespace="public", name="fz_a", replident="f", columns=cols[:3])))
    else:
        out.append(("R", msg("R", relid=0x101, namespace="public", name="fz_a", columns=cols[:3])))
    return out


def message_seeds(corpus: Corpus) -> None:
    for protocol, variant, version in variants():
        for preamble in range(4):
            if preamble == 2 and protocol != "pgoutput" and version != 5:
                continue   # no startup message: only a spock decoder told its version can go on
            xid = F.XID if (protocol == "pgoutput" and preamble == 2) else None
            for k, (tag, body) in enumerate(single_messages(protocol, version, xid)):
                raw = k % 3 == 2
                corpus.add(f"message-{protocol}{version or ''}-p{preamble}-{tag}",
                           F.make_input(protocol, "message", body, raw=raw, numeric_text=k % 4 == 1,
                                        spock_variant=variant, batch_rows=k % 4, preamble=preamble,
                                        strict=k % 5 == 3))


def golden_seeds(corpus: Corpus) -> None:
    for g in G.GOLDEN:
        protocol = g.protocol
        version = g.decoder_kwargs.get("proto_version")
        messages = [v.data for v in g.vectors]
        if protocol == "spock":
            # frames: the stream's own startup decides (variant 2: None); messages: the decoder is told
            frame_variant = 1 if version == 4 else 2
            msg_variant = 0 if g.name == "spock5" else 1
        else:
            frame_variant = msg_variant = 0
        lsn = 0x1000
        frames = W.frames([(lsn + 8 * i, m) for i, m in enumerate(messages)])
        for raw in (False, True):
            corpus.add(f"golden-{g.name}-messages", F.make_input(protocol, "messages", F.join_messages(messages),
                                                                raw=raw, spock_variant=msg_variant,
                                                                drain_each=raw))
            corpus.add(f"golden-{g.name}-frames", F.make_input(protocol, "frames", frames, raw=raw,
                                                              spock_variant=frame_variant, batch_rows=1 + raw))
        corpus.add(f"golden-{g.name}-partial", F.make_input(protocol, "partial", frames[:-3],
                                                           spock_variant=frame_variant))
        for i, m in enumerate(messages):
            corpus.add(f"golden-{g.name}-one", F.make_input(protocol, "message", m, raw=bool(i % 2),
                                                           spock_variant=msg_variant))


ENDS = set(b"CcKPrE")


def capture_windows(path: Path):
    """(protocol, records): short runs of a capture's records that end at a commit-like message, each preceded
    by the startup/type/relation messages seen before it."""
    header, body = read_frame_file(path)
    protocol = header["protocol"]
    context: dict = {}
    window: list = []
    size = 0
    in_stream = False
    for lsn, payload in iter_frames(body):
        payload = bytes(payload)
        t = payload[:1]
        if t == b"S" and protocol != "pgoutput":
            context["S"] = (lsn, payload)
            continue
        if protocol == "pgoutput" and t in (b"S", b"E"):
            in_stream = t == b"S"
        if t == b"R" and not in_stream:   # a streamed R carries an xid and belongs to its stream block
            context[("R", payload[1:5] if protocol == "pgoutput" else payload[2:6])] = (lsn, payload)
        if t == b"Y" and not in_stream:
            context[("Y", payload[1:5])] = (lsn, payload)
        window.append((lsn, payload))
        size += len(payload) + 12
        if payload[0] in ENDS and (size > 600 or len(window) > 6):
            yield protocol, list(context.values()) + window
            window, size = [], 0
    if window:
        yield protocol, list(context.values()) + window


def capture_seeds(corpus: Corpus) -> None:
    for path in sorted(DATA.glob("*.spwf")):
        for k, (protocol, records) in enumerate(capture_windows(path)):
            if k % 3 and path.stem.startswith("pgoutput_v2"):
                continue   # 4548 small records: every third window is plenty
            frames = W.frames(records)
            typed = k % 2 == 0
            corpus.add(f"capture-{path.stem}-frames", F.make_input(protocol, "frames", frames, raw=not typed,
                                                                  batch_rows=k % 4))
            if k % 5 == 0:
                corpus.add(f"capture-{path.stem}-partial",
                           F.make_input(protocol, "partial", frames[:len(frames) - 1 - k % 13]))
            if k % 2 == 0:
                messages = [p for _lsn, p in records if not (p[:1] == b"S" and protocol != "pgoutput")]
                corpus.add(f"capture-{path.stem}-messages",
                           F.make_input(protocol, "messages", F.join_messages(messages), raw=k % 4 == 0,
                                        numeric_text=k % 8 == 2, drain_each=k % 3 == 0))


# 1e131068: ten bytes in binary, 131,069 characters of numeric_out text -- the most a binary value expands
HUGE_NUMERIC = struct.pack(">hhHHh", 1, 32767, 0, 0, 1)


def expanding_seeds(corpus: Corpus) -> None:
    """Transactions of binary values whose text is far longer than their bytes (numeric without a type modifier,
    numeric[], timetz): the batch limit counts what a value adds to its column, not only what arrived."""
    for protocol, variant, version in variants():
        if protocol == "spock" and version == 4:
            continue
        row_c = list(BINARY_ROWS[0x103][0])
        row_c[7] = HUGE_NUMERIC
        row_b = list(BINARY_ROWS[0x102][0])
        row_b[2] = b_array(1700, [HUGE_NUMERIC] * 24)
        msgs = [F.message(protocol, "B", version, final_lsn=F.FINAL_LSN, commit_ts=F.COMMIT_TS, xid=F.XID)]
        msgs += [F.message(protocol, "I", version, relid=0x103, new=row_c) for _ in range(40)]
        msgs += [F.message(protocol, "I", version, relid=0x102, new=row_b) for _ in range(8)]
        msgs.append(F.message(protocol, "C", version, commit_lsn=F.FINAL_LSN, end_lsn=F.END_LSN,
                              commit_ts=F.COMMIT_TS))
        for batch_rows in (0, 1):
            corpus.add(f"expanding-{protocol}{version or ''}", F.make_input(
                protocol, "messages", F.join_messages(msgs), numeric_text=bool(batch_rows), spock_variant=variant,
                batch_rows=batch_rows))


COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"


def copy_data(rows: list, extension: bytes = b"") -> bytes:
    """Binary COPY data (`COPY ... TO STDOUT (FORMAT binary)`) of `rows` (lists of field bytes, None = NULL)."""
    out = COPY_SIGNATURE + struct.pack(">ii", 0, len(extension)) + extension
    for row in rows:
        out += struct.pack(">h", len(row))
        for field in row:
            out += struct.pack(">i", -1) if field is None else struct.pack(">i", len(field)) + field
    return out + struct.pack(">h", -1)


def copy_seeds(corpus: Corpus) -> None:
    """The binary values of each preamble table as binary COPY data (CopyBinaryDecoder, the "copy" entry): valid
    rows, NULL rows, a header extension, the expanding numeric, and each cut short."""
    for index, relid in enumerate((0x101, 0x102, 0x103)):
        rows = BINARY_ROWS[relid]
        ncols = len(rows[0])
        nulls = [None] * ncols
        good = copy_data(rows[:2] + [nulls], extension=b"ext" if index == 1 else b"")
        for piece in range(4):
            corpus.add(f"copy-{relid:x}", F.make_copy_input(index, good, piece=piece, batch_rows=piece & 3))
        corpus.add(f"copy-{relid:x}-all", F.make_copy_input(index, copy_data(rows + [nulls] * 3), piece=3))
        corpus.add(f"copy-{relid:x}-strict", F.make_copy_input(index, copy_data(rows), strict=True, piece=1))
        corpus.add(f"copy-{relid:x}-raw", F.make_copy_input(index, good, raw=True, numeric_text=True, piece=2))
        corpus.add(f"copy-{relid:x}-cut", F.make_copy_input(index, good[:len(good) * 2 // 3], piece=0))
    big = list(BINARY_ROWS[0x103][0])
    big[7] = HUGE_NUMERIC
    corpus.add("copy-expanding", F.make_copy_input(2, copy_data([big] * 30), numeric_text=True, piece=3))


def datum_seeds(corpus: Corpus) -> None:
    """The "datum" entry: the data of the jsonb, tsvector, tsquery, jsonpath and aclitem datums made by real
    servers (tests/data/internal_layouts.json), little-endian, compressed, and written big-endian by the tests'
    layout writers."""
    import json

    from spockwire.values.internal import unpack_varlena

    records = json.loads((DATA / "internal_layouts.json").read_text())
    index = {name: k for k, (name, as_text) in enumerate(F.DATUM_TYPES) if not as_text and k < 5}
    for k, rec in enumerate(records):
        raw = bytes.fromhex(rec["datum"])
        data = raw if rec["type"] == "aclitem" else unpack_varlena(raw, False)
        if len(data) > MAX_SEED:
            continue
        slot = 5 if rec["type"] == "jsonb" and k % 3 == 0 else index[rec["type"]]
        corpus.add(f"datum-{rec['type']}", F.make_datum_input(slot, data, compressed=k % 4 == 1))
    docs = [{"a": [1, "x", None, True, {"b": -1.5}], "": {}}, list(range(40)), "scalar", 0.5]
    for doc in docs:
        corpus.add("datum-jsonb-big", F.make_datum_input(0, D.jsonb(doc, True), big=True))
    corpus.add("datum-tsvector-big", F.make_datum_input(1, D.tsvector([("ab", [(1, 3), (2, 0)]), ("c", [])], True),
                                                        big=True))
    tree = ("|", ("&", ("v", "x", 8, 1), ("!", ("v", "y", 3, 0))), ("<N>", 3, ("v", "a", 0, 0), ("v", "b", 0, 1)))
    corpus.add("datum-tsquery-big", F.make_datum_input(2, D.tsquery(tree, True), big=True))
    corpus.add("datum-aclitem-big", F.make_datum_input(4, struct.pack(">IIQ", 16384, 10, 3 | 1 << 32), big=True))


def write(out: Path) -> int:
    corpus = Corpus(out)
    datum_seeds(corpus)
    copy_seeds(corpus)
    message_seeds(corpus)
    expanding_seeds(corpus)
    golden_seeds(corpus)
    capture_seeds(corpus)
    return corpus.count


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python fuzz/seeds.py OUT_DIR")
    print(f"{write(Path(sys.argv[1]))} seeds written to {sys.argv[1]}")
