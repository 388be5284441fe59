"""Independent oracles for the real captures in tests/data/: test_decoding text and wal2json JSON lines.

File formats (written by tests/data/capture_streams.py):

``<name>.test_decoding.txt``
    One test_decoding output row per line: ``<lsn>\\t<data>``. ``<lsn>`` is the row's LSN as PostgreSQL prints it
    (``0/1A2B3C``). ``<data>`` is the row's bytes (read with pg_logical_slot_peek_binary_changes, so nothing is
    lost) with backslash escapes so that every row stays on one line: ``\\\\`` is a backslash, ``\\n``, ``\\r`` and
    ``\\t`` are newline, carriage return and tab, ``\\xHH`` is any other control byte or a byte that is not part
    of valid UTF-8. Options: include-xids=1, include-timestamp=0, skip-empty-xacts=0 (two-phase captures use a
    slot created with two_phase=true; the ``.test_decoding_stream.txt`` variant adds stream-changes=1).

``<name>.wal2json.jsonl``
    One wal2json format-version 2 row per line, exactly as the plugin printed it.

test_decoding's row format (PostgreSQL 15, ``contrib/test_decoding``):

* ``BEGIN <xid>`` / ``COMMIT <xid>``; two-phase: ``PREPARE TRANSACTION '<gid>', txid <xid>``,
  ``COMMIT PREPARED '<gid>', txid <xid>``, ``ROLLBACK PREPARED '<gid>', txid <xid>``.
* ``table <nsp>.<rel>: INSERT: <cols>``; ``UPDATE: <cols>`` (no old tuple); ``UPDATE: old-key: <cols> new-tuple:
  <cols>``; ``DELETE: <cols>`` (the old key or, under REPLICA IDENTITY FULL, the old row); ``DELETE: (no-tuple
  data)``; ``UPDATE: (no-tuple data)``.
* ``table <a>, <b>: TRUNCATE: (no-flags)`` or ``TRUNCATE: cascade restart_seqs`` (either word).
* old tuples (DELETE, ``old-key:``) leave NULL columns out entirely; a missing column there means NULL.
* a column is ``name[type]:value``. The value is ``null``, ``unchanged-toast-datum``, or the type's text output:
  unquoted for int2/4/8, oid, float4/8 and numeric; bool as ``true``/``false`` (not the type's ``t``/``f``);
  bit/varbit as ``B'0101'``; single-quoted with ``''`` doubling
  for every other type. Names and types are quoted identifiers (``"Mixed Case"[text]``) when they need it.
* ``message: transactional: <0|1> prefix: <prefix>, sz: <n> content:<n raw bytes>``; a non-transactional
  message is printed outside BEGIN/COMMIT.
* stream-changes=1 adds ``opening a streamed block for transaction TXN <xid>``, ``closing a streamed block for
  transaction TXN <xid>``, ``streaming change for TXN <xid>`` (no data), ``streaming message: ...``,
  ``streaming truncate for TXN <xid>``, ``aborting streamed (sub)transaction TXN <xid>``,
  ``committing streamed transaction TXN <xid>``, ``preparing streamed transaction TXN <xid>``.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Union

__all__ = ["UNCHANGED_TOAST", "escape_row", "unescape_row", "parse_lsn", "format_lsn", "read_test_decoding",
           "parse_columns", "parse_row", "OracleTransaction", "group_transactions",
           "read_wal2json", "changes_of"]


class _UnchangedToast:
    """The marker for a column test_decoding prints as ``unchanged-toast-datum``."""

    _instance: "_UnchangedToast | None" = None

    def __new__(cls) -> "_UnchangedToast":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST = _UnchangedToast()

Value = Union[str, None, _UnchangedToast]

# ---------------------------------------------------------------------------------------------------------------
# one row per line: escaping


def escape_row(data: bytes) -> str:
    """Bytes of one plugin output row -> one line of text (see the module docstring)."""
    text = data.decode("utf-8", errors="surrogateescape")
    out: list[str] = []
    for ch in text:
        code = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif 0xDC80 <= code <= 0xDCFF:  # a byte that is not valid UTF-8
            out.append(f"\\x{code - 0xDC00:02x}")
        else:
            out.append(ch)
    return "".join(out)


_ESCAPE = re.compile(r"\\(\\|n|r|t|x[0-9a-fA-F]{2})")
_SIMPLE = {"\\": b"\\", "n": b"\n", "r": b"\r", "t": b"\t"}


def unescape_row(line: str) -> bytes:
    """Inverse of escape_row."""
    out = bytearray()
    pos = 0
    for m in _ESCAPE.finditer(line):
        out += line[pos:m.start()].encode("utf-8")
        code = m.group(1)
        out += _SIMPLE[code] if code in _SIMPLE else bytes([int(code[1:], 16)])
        pos = m.end()
    out += line[pos:].encode("utf-8")
    return bytes(out)


def parse_lsn(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def read_test_decoding(path: Union[str, Path]) -> list[tuple[int, str]]:
    """The rows of a saved test_decoding file: (lsn, data text). Bytes that are not UTF-8 come back as lone
    surrogates (``surrogateescape``), so ``text.encode('utf-8', 'surrogateescape')`` restores them."""
    rows: list[tuple[int, str]] = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line:
            continue
        lsn, _, data = line.partition("\t")
        rows.append((parse_lsn(lsn), unescape_row(data).decode("utf-8", errors="surrogateescape")))
    return rows


# ---------------------------------------------------------------------------------------------------------------
# columns and rows

_UNQUOTED_END = re.compile(r"[ ]")


def _read_ident(s: str, pos: int, stop: str) -> tuple[str, int]:
    """A possibly double-quoted identifier starting at pos, ending before the first `stop` char outside quotes."""
    if s.startswith('"', pos):
        out: list[str] = []
        i = pos + 1
        while True:
            j = s.index('"', i)
            out.append(s[i:j])
            if s.startswith('""', j):
                out.append('"')
                i = j + 2
                continue
            return "".join(out), j + 1
    j = pos
    while j < len(s) and s[j] not in stop:
        j += 1
    return s[pos:j], j


def _read_type(s: str, pos: int) -> tuple[str, int]:
    """The ``[type]`` after a column name; types may contain brackets (``integer[]``) and quotes."""
    if s[pos] != "[":
        raise ValueError(f"expected '[' at {pos} in {s!r}")
    depth = 0
    i = pos
    in_quote = False
    while i < len(s):
        ch = s[i]
        if in_quote:
            if ch == '"':
                in_quote = False
        elif ch == '"':
            in_quote = True
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth == 0:
                return s[pos + 1:i], i + 1
        i += 1
    raise ValueError(f"unterminated type at {pos} in {s!r}")


def _read_value(s: str, pos: int) -> tuple[Value, int]:
    if s.startswith("'", pos):
        out: list[str] = []
        i = pos + 1
        while True:
            j = s.index("'", i)
            out.append(s[i:j])
            if s.startswith("''", j):
                out.append("'")
                i = j + 2
                continue
            return "".join(out), j + 1
    j = s.find(" ", pos)
    if j < 0:
        j = len(s)
    word = s[pos:j]
    if word == "null":
        return None, j
    if word == "unchanged-toast-datum":
        return UNCHANGED_TOAST, j
    return word, j


def parse_columns(s: str, with_types: bool = False) -> dict[str, Any]:
    """``a[integer]:1 b[text]:'x'`` -> ``{"a": "1", "b": "x"}`` (values as text, None, or UNCHANGED_TOAST).

    With ``with_types=True`` the values are ``(type, value)`` pairs.
    """
    cols: dict[str, Any] = {}
    pos = 0
    n = len(s)
    while pos < n:
        while pos < n and s[pos] == " ":
            pos += 1
        if pos >= n:
            break
        name, pos = _read_ident(s, pos, "[")
        typ, pos = _read_type(s, pos)
        if s[pos] != ":":
            raise ValueError(f"expected ':' at {pos} in {s!r}")
        value, pos = _read_value(s, pos + 1)
        cols[name] = (typ, value) if with_types else value
    return cols


_TABLE = re.compile(r'^table ((?:"(?:[^"]|"")*"|[^.]+)\.(?:"(?:[^"]|"")*"|[^:]+)): (INSERT|UPDATE|DELETE): ?')
_TRUNC = re.compile(r"^table (.+): TRUNCATE: (.*)$")
_MSG = re.compile(r"^(streaming )?message: transactional: ([01]) prefix: (.*?), sz: (\d+) content:", re.S)


def _types(s: str) -> dict[str, str]:
    return {name: typ for name, (typ, _) in parse_columns(s, with_types=True).items()}


def _split_old_new(rest: str) -> tuple[str | None, str]:
    if rest.startswith("old-key: "):
        # the old part ends at ' new-tuple: ' outside quotes
        body = rest[len("old-key: "):]
        i = 0
        in_quote = False
        while i < len(body):
            ch = body[i]
            if ch == "'":
                in_quote = not in_quote  # '' toggles twice: harmless
            elif not in_quote and body.startswith(" new-tuple: ", i):
                return body[:i], body[i + len(" new-tuple: "):]
            i += 1
        raise ValueError(f"old-key without new-tuple: {rest!r}")
    return None, rest


def parse_row(data: str) -> dict[str, Any]:
    """One test_decoding output row -> a dict with a "kind" (begin, commit, prepare, commit_prepared,
    rollback_prepared, insert, update, delete, truncate, message, stream_*)."""
    if data.startswith("BEGIN"):
        return {"kind": "begin", "xid": int(data.split()[1]) if len(data.split()) > 1 else None}
    if data.startswith("COMMIT PREPARED") or data.startswith("ROLLBACK PREPARED") \
            or data.startswith("PREPARE TRANSACTION"):
        m = re.match(r"^(PREPARE TRANSACTION|COMMIT PREPARED|ROLLBACK PREPARED) '((?:[^']|'')*)'(?:, txid (\d+))?",
                     data)
        if not m:
            raise ValueError(f"unparsable two-phase row {data!r}")
        kind = {"PREPARE TRANSACTION": "prepare", "COMMIT PREPARED": "commit_prepared",
                "ROLLBACK PREPARED": "rollback_prepared"}[m.group(1)]
        return {"kind": kind, "gid": m.group(2).replace("''", "'"),
                "xid": int(m.group(3)) if m.group(3) else None}
    if data.startswith("COMMIT"):
        parts = data.split()
        return {"kind": "commit", "xid": int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None}
    m = _MSG.match(data)
    if m:
        size = int(m.group(4))
        raw = data[m.end():].encode("utf-8", errors="surrogateescape")
        return {"kind": "stream_message" if m.group(1) else "message", "transactional": m.group(2) == "1",
                "prefix": m.group(3), "content": raw[:size]}
    m = _TRUNC.match(data)
    if m:
        tables = [t.strip() for t in m.group(1).split(", ")]
        flags = m.group(2)
        return {"kind": "truncate", "tables": tables, "cascade": "cascade" in flags.split(),
                "restart_identity": "restart_seqs" in flags.split()}
    m = _TABLE.match(data)
    if m:
        table, action, rest = m.group(1), m.group(2).lower(), data[m.end():]
        if rest.startswith("(no-tuple data)"):
            return {"kind": action, "table": table, "old": None, "new": None}
        if action == "insert":
            return {"kind": "insert", "table": table, "old": None, "new": parse_columns(rest),
                    "types": _types(rest)}
        if action == "delete":
            return {"kind": "delete", "table": table, "old": parse_columns(rest), "new": None,
                    "types": _types(rest)}
        old, new = _split_old_new(rest)
        types = _types(new)
        if old is not None:
            types = {**_types(old), **types}
        return {"kind": "update", "table": table, "old": parse_columns(old) if old is not None else None,
                "new": parse_columns(new), "types": types}
    for prefix, kind in (("opening a streamed block", "stream_start"), ("closing a streamed block", "stream_stop"),
                         ("streaming change", "stream_change"), ("streaming truncate", "stream_truncate"),
                         ("aborting streamed", "stream_abort"), ("committing streamed", "stream_commit"),
                         ("preparing streamed", "stream_prepare")):
        if data.startswith(prefix):
            m2 = re.search(r"TXN (\d+)", data)
            return {"kind": kind, "xid": int(m2.group(1)) if m2 else None}
    raise ValueError(f"unparsable test_decoding row {data!r}")


# ---------------------------------------------------------------------------------------------------------------
# transactions


@dataclass
class OracleTransaction:
    """One decoded transaction: its changes in order, how it ended, and LSNs."""

    xid: int | None
    begin_lsn: int
    changes: list[dict[str, Any]] = field(default_factory=list)
    end: str = "open"  # commit | prepare | commit_prepared | rollback_prepared | nontransactional
    end_lsn: int | None = None
    gid: str | None = None

    @property
    def committed(self) -> bool:
        return self.end in ("commit", "commit_prepared", "nontransactional")


def group_transactions(rows: Iterable[tuple[int, str]]) -> list[OracleTransaction]:
    """Group parsed rows into transactions in output order.

    A prepared transaction appears at PREPARE with end="prepare"; the later COMMIT PREPARED / ROLLBACK PREPARED row
    yields a second, change-less entry (end="commit_prepared"/"rollback_prepared") and marks the prepared one via
    ``gid``. Non-transactional messages are one-change entries with end="nontransactional". Stream rows
    (stream-changes=1) are skipped here.
    """
    txns: list[OracleTransaction] = []
    current: OracleTransaction | None = None
    for lsn, data in rows:
        row = parse_row(data)
        kind = row["kind"]
        if kind.startswith("stream_"):
            continue
        if kind == "begin":
            current = OracleTransaction(xid=row["xid"], begin_lsn=lsn)
            continue
        if kind == "message" and not row["transactional"]:
            change = dict(row, action="message", xid=None, lsn=lsn)
            txns.append(OracleTransaction(xid=None, begin_lsn=lsn, changes=[change], end="nontransactional",
                                          end_lsn=lsn))
            continue
        if kind in ("commit", "prepare"):
            if current is None:
                raise ValueError(f"{kind} without BEGIN at {format_lsn(lsn)}")
            current.end, current.end_lsn, current.gid = kind, lsn, row.get("gid")
            txns.append(current)
            current = None
            continue
        if kind in ("commit_prepared", "rollback_prepared"):
            txns.append(OracleTransaction(xid=row["xid"], begin_lsn=lsn, end=kind, end_lsn=lsn, gid=row["gid"]))
            continue
        if current is None:
            raise ValueError(f"change outside a transaction at {format_lsn(lsn)}: {data!r}")
        change = dict(row, action=kind, xid=current.xid, lsn=lsn)
        change.pop("kind")
        current.changes.append(change)
    return txns


def changes_of(txns: list[OracleTransaction]) -> list[dict[str, Any]]:
    """The changes that really committed, in commit order: plain commits, COMMIT PREPARED (placed at the commit)
    and non-transactional messages; rolled-back prepared transactions contribute nothing."""
    prepared: dict[str, OracleTransaction] = {}
    out: list[dict[str, Any]] = []
    for txn in txns:
        if txn.end == "prepare" and txn.gid is not None:
            prepared[txn.gid] = txn
        elif txn.end == "commit_prepared" and txn.gid is not None:
            src = prepared.pop(txn.gid, None)
            if src is not None:
                out.extend(dict(c, commit_lsn=txn.end_lsn) for c in src.changes)
        elif txn.end == "rollback_prepared" and txn.gid is not None:
            prepared.pop(txn.gid, None)
        elif txn.end in ("commit", "nontransactional"):
            out.extend(dict(c, commit_lsn=txn.end_lsn) for c in txn.changes)
    return out


def read_wal2json(path: Union[str, Path]) -> list[dict[str, Any]]:
    """The rows of a saved wal2json format-version 2 file."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def iter_test_decoding_changes(path: Union[str, Path]) -> Iterator[dict[str, Any]]:
    """Shortcut: the committed changes of a saved test_decoding file."""
    yield from changes_of(group_transactions(read_test_decoding(path)))
