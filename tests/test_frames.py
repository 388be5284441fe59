"""The frame-file format: records, files, errors with byte offsets."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spockwire.errors import FrameError, ProtocolError
from spockwire.frames import (FORMAT_VERSION, MAGIC, FrameWriter, encode_frame, encode_frames, iter_frames,
                              read_frame_file, write_frame_file)

FRAMES = [(0x16B3740, b"B" + bytes(20)), (0x16B3741, b""), (0xFFFFFFFFFFFFFFFF, b"I\x00\x01payload")]


def test_encode_frame_layout() -> None:
    rec = encode_frame(0x0102030405060708, b"abc")
    assert rec == b"\x00\x00\x00\x03" + b"\x01\x02\x03\x04\x05\x06\x07\x08" + b"abc"
    assert len(rec) == 12 + 3


def test_encode_frame_rejects_bad_lsn() -> None:
    with pytest.raises(ValueError):
        encode_frame(-1, b"")
    with pytest.raises(ValueError):
        encode_frame(1 << 64, b"")


def test_iter_frames_round_trip_zero_copy() -> None:
    body = encode_frames(FRAMES)
    got = list(iter_frames(body))
    assert [(lsn, bytes(p)) for lsn, p in got] == FRAMES
    assert all(isinstance(p, memoryview) for _, p in got)
    view = memoryview(bytearray(body))
    first = next(iter_frames(view))[1]
    view[12] = ord("X")
    assert bytes(first[:1]) == b"X"  # a view into the caller's buffer, not a copy


def test_iter_frames_empty_body() -> None:
    assert list(iter_frames(b"")) == []
    assert list(iter_frames(memoryview(b""))) == []


@pytest.mark.parametrize("cut", [1, 5, 11])
def test_truncated_record_header(cut: int) -> None:
    body = encode_frames(FRAMES[:1])
    good = len(body)
    broken = body + encode_frame(7, b"xyz")[:cut]
    it = iter_frames(broken)
    assert next(it)[0] == FRAMES[0][0]
    with pytest.raises(FrameError) as info:
        next(it)
    err = info.value
    assert isinstance(err, ProtocolError) and isinstance(err, ValueError)
    assert err.offset == good
    assert err.needed == 12 and err.remaining == cut
    assert f"byte {good}" in str(err)


def test_truncated_payload() -> None:
    body = encode_frames(FRAMES)
    cut = body[:-3]
    with pytest.raises(FrameError) as info:
        list(iter_frames(cut))
    last_start = len(body) - (12 + len(FRAMES[-1][1]))
    assert info.value.offset == last_start
    assert info.value.needed == len(FRAMES[-1][1])
    assert info.value.remaining == len(FRAMES[-1][1]) - 3


def test_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "x.spwf"
    n = write_frame_file(path, "pgoutput", FRAMES, options={"proto_version": "1"}, server_version="15.20")
    assert n == len(FRAMES)
    header, body = read_frame_file(path)
    assert header["protocol"] == "pgoutput"
    assert header["options"] == {"proto_version": "1"}
    assert header["server_version"] == "15.20"
    assert "created_at" in header
    assert [(lsn, bytes(p)) for lsn, p in iter_frames(body)] == FRAMES
    raw = path.read_bytes()
    assert raw[:8] == MAGIC
    version, hlen = struct.unpack(">HI", raw[8:14])
    assert version == FORMAT_VERSION == 1
    assert json.loads(raw[14:14 + hlen].decode()) == header
    assert bytes(body) == raw[14 + hlen:]
    assert not (tmp_path / "x.spwf.tmp").exists()


def test_file_empty_body(tmp_path: Path) -> None:
    path = tmp_path / "empty.spwf"
    write_frame_file(path, "pglogical", [], created_at=None)
    header, body = read_frame_file(path)
    assert header == {"protocol": "pglogical"}
    assert body.nbytes == 0
    assert list(iter_frames(body)) == []


def test_frame_writer(tmp_path: Path) -> None:
    path = tmp_path / "w.spwf"
    with FrameWriter(path, "spock", slot="s1") as w:
        for lsn, payload in FRAMES:
            w.write(lsn, payload)
        w.flush()
        assert w.count == len(FRAMES)
        assert w.last_lsn == FRAMES[-1][0]
        # flushed records are already readable while the writer is open
        header, body = read_frame_file(path)
        assert len(list(iter_frames(body))) == len(FRAMES)
    assert w.closed
    assert w.bytes_written == path.stat().st_size
    header, body = read_frame_file(path)
    assert header["protocol"] == "spock" and header["slot"] == "s1"
    assert [(lsn, bytes(p)) for lsn, p in iter_frames(body)] == FRAMES
    with pytest.raises(ValueError):
        w.write(1, b"")


def test_frame_writer_accepts_memoryview(tmp_path: Path) -> None:
    path = tmp_path / "mv.spwf"
    with FrameWriter(path, "pgoutput") as w:
        w.write(5, memoryview(b"hello")[1:4])
    _, body = read_frame_file(path)
    assert [(lsn, bytes(p)) for lsn, p in iter_frames(body)] == [(5, b"ell")]


def _write_raw(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_bad_magic(tmp_path: Path) -> None:
    with pytest.raises(FrameError, match="bad magic"):
        read_frame_file(_write_raw(tmp_path / "a", b"NOTFRAME" + b"\x00" * 20))
    with pytest.raises(FrameError, match="bad magic"):
        read_frame_file(_write_raw(tmp_path / "b", b"PK\x03"))


def test_bad_version(tmp_path: Path) -> None:
    hdr = b'{"protocol":"pgoutput"}'
    with pytest.raises(FrameError, match="version 2"):
        read_frame_file(_write_raw(tmp_path / "v", MAGIC + struct.pack(">HI", 2, len(hdr)) + hdr))


def test_truncated_file_prefix_and_header(tmp_path: Path) -> None:
    with pytest.raises(FrameError) as info:
        read_frame_file(_write_raw(tmp_path / "p", MAGIC + b"\x00"))
    assert info.value.offset == 0
    hdr = b'{"protocol":"pgoutput"}'
    with pytest.raises(FrameError) as info:
        read_frame_file(_write_raw(tmp_path / "h", MAGIC + struct.pack(">HI", 1, len(hdr) + 5) + hdr))
    assert info.value.offset == 14 and info.value.needed == len(hdr) + 5


@pytest.mark.parametrize("hdr", [b"not json", b"[1,2]", b'{"options":{}}', b'{"protocol":1}', b"\xff\xfe"])
def test_bad_json_header(tmp_path: Path, hdr: bytes) -> None:
    with pytest.raises(FrameError):
        read_frame_file(_write_raw(tmp_path / "j", MAGIC + struct.pack(">HI", 1, len(hdr)) + hdr))


def test_truncated_record_in_file_body(tmp_path: Path) -> None:
    path = tmp_path / "t.spwf"
    write_frame_file(path, "pgoutput", FRAMES)
    _write_raw(path, path.read_bytes()[:-2])
    _, body = read_frame_file(path)  # the body is not validated eagerly
    with pytest.raises(FrameError) as info:
        list(iter_frames(body))
    assert info.value.offset == body.nbytes + 2 - (12 + len(FRAMES[-1][1]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.binary(max_size=64)), max_size=20))
def test_round_trip_property(frames: list[tuple[int, bytes]]) -> None:
    body = encode_frames(frames)
    assert len(body) == sum(12 + len(p) for _, p in frames)
    assert [(lsn, bytes(p)) for lsn, p in iter_frames(body)] == frames
    if body:
        with pytest.raises(FrameError):
            list(iter_frames(body[:-1]))


@pytest.mark.parametrize("reserve", [0, 64, 4096])
def test_set_header_in_place_or_rewritten_at_close(tmp_path: Path, reserve: int) -> None:
    """set_header rewrites the header in place while it fits the reserved room (the records already written and
    those after stay as they are); a header that outgrows it makes close() rewrite the file once."""
    path = tmp_path / "h.spwf"
    with FrameWriter(path, "pgoutput", header_reserve=reserve, slot="s") as w:
        w.write(1, b"first")
        w.set_header(note="x" * 40)
        w.write(2, b"second")
        in_place = read_frame_file(path)[0] if reserve >= 200 else None
        w.set_header(note=None, big="y" * 100)
        w.write(3, b"third")
    header, body = read_frame_file(path)
    assert header["big"] == "y" * 100 and "note" not in header and header["slot"] == "s"
    assert [(lsn, bytes(p)) for lsn, p in iter_frames(body)] == [(1, b"first"), (2, b"second"), (3, b"third")]
    if in_place is not None:       # already readable while the writer was open
        assert in_place["note"] == "x" * 40
    assert path.stat().st_size == 14 + max(reserve, len(json.dumps(header, separators=(",", ":")))) + 3 * 12 + 16
    assert not (tmp_path / "h.spwf.tmp").exists()


@pytest.mark.parametrize("bad, where", [
    ({"version": 2}, "version"),
    ({"version": 1, "types": {}}, "types: expected a list"),
    ({"version": 1, "types": [{"oid": "16400", "name": "t"}]}, "types[0].oid"),
    ({"version": 1, "types": [{"oid": 16400, "name": "t", "colour": 1}]}, "unknown keys ['colour']"),
    ({"version": 1, "types": [{"oid": 16400, "name": "t", "fields": [1, "x"]}]}, "types[0].fields"),
    ({"version": 1, "types": [{"oid": 1, "name": "a"}, {"oid": 1, "name": "b"}]}, "described twice"),
    ({"version": 1, "tables": {"public.t": {"id": [23]}}}, "tables['public.t']['id']"),
    ({"version": 1, "roles": {"ten": "postgres"}}, "roles['ten']"),
])
def test_a_malformed_recorded_catalog_is_a_clear_error(bad: dict, where: str) -> None:
    from spockwire.values.catalog import TypeCatalogError
    from spockwire.values.recorded import RecordedTypeCatalog

    with pytest.raises(TypeCatalogError, match="^cap.spwf: type_catalog: ") as info:
        RecordedTypeCatalog.from_frame_header({"protocol": "pgoutput", "type_catalog": bad}, source="cap.spwf")
    assert where in str(info.value)


def test_recorded_catalog_round_trip() -> None:
    from spockwire.values.catalog import TypeCatalogError, TypeInfo
    from spockwire.values.recorded import RecordedTypeCatalog

    cat = RecordedTypeCatalog(types={16400: TypeInfo(16400, "comp", "c"), 16410: TypeInfo(16410, "posint", "d", 23)},
                              fields={16400: [23, 16410]}, tables={"public.t": {"id": (23, -1)}})
    again = RecordedTypeCatalog.from_json(json.loads(json.dumps(cat.to_json())))
    assert again == cat and again.type_info(16410).base_oid == 23 and again.composite_fields(16400) == [23, 16410]
    with pytest.raises(TypeCatalogError, match="no role names"):
        again.role_name(10)
    assert RecordedTypeCatalog.from_frame_header({"protocol": "pgoutput"}) is None
