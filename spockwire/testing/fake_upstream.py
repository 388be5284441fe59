"""A scripted spock upstream: a small TCP server speaking enough of the PostgreSQL protocol for a replication client.

Spock needs a patched PostgreSQL, so tests of spock negotiation and streaming run against this server instead. It
accepts psycopg2's ``LogicalReplicationConnection`` (SSL refused, trust authentication, ParameterStatus,
ReadyForQuery), answers ``IDENTIFY_SYSTEM`` and simple queries, and on ``START_REPLICATION`` negotiates the spock
protocol the way spock does (startup_params_format, min/max_proto_version, spock_version_num), replies with a
CopyBothResponse and replays a script of transactions as spock-layout XLogData ``'w'`` frames: the startup message
``'S'`` first, then per transaction ``B O L {R* I|U|D|T|M}* C``, relations described once per session. Then it
sends primary keepalives ``'k'`` (asking for a reply) and records the client's standby status updates ``'r'``.

A session resumes like a real walsender: transactions whose end LSN is at or before the requested start LSN are
skipped. ``drop_after`` cuts the first sessions off after that many frames, as a crash would.

Example::

    script = SpockScript(proto_version=5)
    items = script.relation(16400, "public", "items", [("id", 23, True), ("name", 25, False)])
    script.transaction([("insert", items, (1, "one")), ("insert", items, (2, "two"))])
    with FakeSpockUpstream(script) as up:
        stream = spockwire.connection.connect(up.dsn, slot="s", plugin="spock")
"""
from __future__ import annotations

import re
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

__all__ = ["SpockScript", "ScriptRelation", "ScriptTransaction", "FakeSpockUpstream", "StatusUpdate"]

_PG_EPOCH_OFFSET_US = 946_684_800_000_000
_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_PROTOCOL_3 = 196608


def _u8(v: int) -> bytes:
    return struct.pack(">B", v)


def _u16(v: int) -> bytes:
    return struct.pack(">H", v)


def _u32(v: int) -> bytes:
    return struct.pack(">I", v)


def _i32(v: int) -> bytes:
    return struct.pack(">i", v)


def _u64(v: int) -> bytes:
    return struct.pack(">Q", v)


def _i64(v: int) -> bytes:
    return struct.pack(">q", v)


# ------------------------------------------------------------------------------------------------------------------
# the script: relations and transactions, encoded per session in the spock layout

@dataclass(frozen=True)
class ScriptRelation:
    relid: int
    namespace: str
    name: str
    columns: tuple[tuple[Any, ...], ...]  # (name, type oid, in replica identity[, type modifier (default -1)])


@dataclass
class ScriptTransaction:
    xid: int
    begin_lsn: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int  # µs since 2000-01-01
    changes: list[tuple] = field(default_factory=list)
    origin: tuple[int, str | None, int] | None = None  # (node id, name, origin lsn); None = local node
    last_commit_ts: int = 0  # what 'L' carries (0 unless the slot belongs to a slot group)
    insert_lsn: int | None = None  # protocol 4: the LSN trailing 'C' (None: end_lsn)


class SpockScript:
    """Transactions to replay, with their LSNs assigned in order (each transaction takes 0x1000 bytes of WAL).

    Changes are ``("insert", rel, values)``, ``("update", rel, new_values, old_values_or_None)``,
    ``("delete", rel, key_values)``, ``("truncate", [rels], flags)``, ``("message", prefix, content[, lsn])``
    (a spock sync-event ``'M'``; its LSN defaults to the change's) or ``("relation", rel)`` (``'R'`` again, as the
    server re-sends a relation after its cache entry was invalidated: before the ``'T'`` of a TRUNCATE and at
    the next change after it). Values are Python objects sent as text (``'t'``); None is NULL, and the
    :data:`UNCHANGED` marker an unchanged TOAST value (``'u'``).
    """

    UNCHANGED = object()

    def __init__(self, proto_version: int = 5, *, first_lsn: int = 0x1000000, local_node_id: int = 1,
                 local_node_name: str = "n1", start_xid: int = 1000, start_ts: int = 800_000_000_000_000) -> None:
        if proto_version not in (4, 5):
            raise ValueError("the fake upstream speaks spock protocol 4 or 5")
        self.proto_version = proto_version
        self.relations: dict[int, ScriptRelation] = {}
        self.transactions: list[ScriptTransaction] = []
        self._next_lsn = first_lsn
        self._next_xid = start_xid
        self._ts = start_ts
        self.local_node_id = local_node_id
        self.local_node_name = local_node_name

    def relation(self, relid: int, namespace: str, name: str,
                 columns: Sequence[tuple[Any, ...]]) -> ScriptRelation:
        rel = ScriptRelation(relid, namespace, name, tuple(columns))
        self.relations[relid] = rel
        return rel

    def transaction(self, changes: Iterable[tuple], *, origin: tuple[int, str | None, int] | None = None
                    ) -> ScriptTransaction:
        begin = self._next_lsn
        changes = list(changes)
        commit = begin + 0x100 + 0x20 * len(changes)
        txn = ScriptTransaction(self._next_xid, begin, commit, commit + 0x30, self._ts, changes, origin)
        self._next_lsn = begin + 0x1000 * (1 + (0x20 * len(changes)) // 0x1000)
        self._next_xid += 1
        self._ts += 1000
        self.transactions.append(txn)
        return txn

    @property
    def last_end_lsn(self) -> int:
        return self.transactions[-1].end_lsn if self.transactions else 0

    # -- encoding ----------------------------------------------------------------------------------------------
    def _prefix(self, lsn: int) -> bytes:
        return _u64(lsn) if self.proto_version >= 5 else b""

    @staticmethod
    def startup_message(params: dict[str, str]) -> bytes:
        body = b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in params.items())
        return b"S" + _u8(1) + body

    def _relation(self, rel: ScriptRelation, lsn: int) -> bytes:
        nsp = rel.namespace.encode() + b"\0"
        name = rel.name.encode() + b"\0"
        out = [self._prefix(lsn), b"R", _u8(0), _u32(rel.relid), _u8(len(nsp)), nsp, _u8(len(name)), name,
               b"A", _u16(len(rel.columns))]
        for col, typoid, is_key, *typmod in rel.columns:
            cname = col.encode() + b"\0"
            out += [b"C", _u8(1 if is_key else 0), b"N", _u16(len(cname)), cname, _u32(typoid),
                    _i32(typmod[0] if typmod else -1)]
        return b"".join(out)

    def _tuple(self, values: Sequence[Any]) -> bytes:
        out = [b"T", _u16(len(values))]
        for v in values:
            if v is None:
                out.append(b"n")
            elif v is SpockScript.UNCHANGED:
                out.append(b"u")
            elif isinstance(v, bytes):
                out += [b"b", _u32(len(v)), v]
            else:
                text = (("t" if v else "f") if isinstance(v, bool) else str(v)).encode() + b"\0"
                out += [b"t", _u32(len(text)), text]
        return b"".join(out)

    def encode(self, txn: ScriptTransaction, sent_relations: set[int]) -> list[tuple[int, bytes]]:
        """One transaction as (dataStart LSN, payload) frames; adds described relations to `sent_relations`."""
        frames: list[tuple[int, bytes]] = []
        lsn = txn.begin_lsn
        p = self._prefix
        frames.append((lsn, p(lsn) + b"B" + _u8(0) + _u64(txn.commit_lsn) + _i64(txn.commit_ts) + _u32(txn.xid)))
        if txn.origin is None:
            node_id, name, origin_lsn = self.local_node_id, self.local_node_name, 0
        else:
            node_id, name, origin_lsn = txn.origin
        if self.proto_version >= 5 and name is not None:
            origin = b"O" + _u8(1) + _u64(origin_lsn) + _u16(node_id) + name.encode() + b"\0"
        else:
            origin = b"O" + _u8(0) + _u64(origin_lsn) + _u16(node_id)
        frames.append((lsn, p(lsn) + origin))
        frames.append((lsn, p(lsn) + b"L" + _u8(0) + _i64(txn.last_commit_ts)))
        for i, change in enumerate(txn.changes):
            lsn = txn.begin_lsn + 0x20 * (i + 1)
            kind = change[0]
            if kind == "relation":   # 'R' again, as the server sends it after a relcache invalidation
                frames.append((lsn, self._relation(change[1], lsn)))
                sent_relations.add(change[1].relid)
                continue
            rels = change[1] if kind == "truncate" else ([change[1]] if kind != "message" else [])
            for rel in rels:
                if rel.relid not in sent_relations:
                    sent_relations.add(rel.relid)
                    frames.append((lsn, self._relation(rel, lsn)))
            if kind == "insert":
                body = b"I" + _u8(0) + _u32(change[1].relid) + b"N" + self._tuple(change[2])
            elif kind == "update":
                old = change[3] if len(change) > 3 else None
                body = b"U" + _u8(0) + _u32(change[1].relid)
                if old is not None:
                    body += b"K" + self._tuple(old)
                body += b"N" + self._tuple(change[2])
            elif kind == "delete":
                body = b"D" + _u8(0) + _u32(change[1].relid) + b"K" + self._tuple(change[2])
            elif kind == "truncate":
                body = b"T" + _u32(len(change[1])) + _u8(change[2]) + b"".join(_u32(r.relid) for r in change[1])
            elif kind == "message":
                content = change[2]
                body = (b"M" + _u32(txn.xid) + _u64(change[3] if len(change) > 3 else lsn) + _u8(1)
                        + change[1].encode() + b"\0"
                        + _u32(len(content)) + content)
            else:
                raise ValueError(f"unknown change kind {kind!r}")
            frames.append((lsn, p(lsn) + body))
        commit = b"C" + _u8(0) + _u64(txn.commit_lsn) + _u64(txn.end_lsn) + _i64(txn.commit_ts)
        if self.proto_version == 4:
            commit += _u64(txn.end_lsn if txn.insert_lsn is None else txn.insert_lsn)
        frames.append((txn.commit_lsn, p(txn.commit_lsn) + commit))
        return frames


# ------------------------------------------------------------------------------------------------------------------
# the server

@dataclass(frozen=True)
class StatusUpdate:
    """One standby status update the client sent."""

    write_lsn: int
    flush_lsn: int
    apply_lsn: int
    reply_requested: bool
    session: int


@dataclass
class StartRequest:
    slot: str
    start_lsn: int
    options: dict[str, str]


def _parse_lsn(text: str) -> int:
    hi, _, lo = text.partition("/")
    return (int(hi, 16) << 32) | int(lo, 16)


_START_RE = re.compile(r'START_REPLICATION\s+SLOT\s+"?([^"\s]+)"?\s+LOGICAL\s+([0-9A-Fa-f]+/[0-9A-Fa-f]+)\s*(?:\((.*)\))?',
                       re.S | re.I)
_OPT_RE = re.compile(r'\s*("(?:[^"]|"")*"|[A-Za-z_][\w.]*)\s+\'((?:[^\']|\'\')*)\'\s*(?:,|$)')


def _parse_options(text: str | None) -> dict[str, str]:
    opts: dict[str, str] = {}
    if not text:
        return opts
    pos = 0
    while pos < len(text) and text[pos:].strip():
        m = _OPT_RE.match(text, pos)
        if m is None:
            raise ValueError(f"cannot parse START_REPLICATION options at {text[pos:]!r}")
        key = m.group(1)
        if key.startswith('"'):
            key = key[1:-1].replace('""', '"')
        opts[key] = m.group(2).replace("''", "'")
        pos = m.end()
    return opts


class _ClientGone(Exception):
    pass


class FakeSpockUpstream:
    """A threaded TCP server on 127.0.0.1 replaying a :class:`SpockScript` to replication clients.

    * ``startup_overrides``: keys to change in (or add to; None removes) the startup message, to test refusals.
    * ``drop_after``: cut each of the first ``drop_sessions`` sessions off after that many frames.
    * ``keepalive_interval``: seconds between keepalives (with reply requested) once the script is sent.
    * ``keepalive_delay``: seconds between the last frame of the script and the first keepalive (a walsender
      that reached the end of the WAL a while after its last transaction).

    Records ``status_updates`` (every 'r' from the client), ``start_requests`` and ``sessions``.
    """

    def __init__(self, script: SpockScript, *, startup_overrides: dict[str, str | None] | None = None,
                 drop_after: int | None = None, drop_sessions: int = 1, keepalive_interval: float = 0.2,
                 keepalive_delay: float = 0.0,
                 server_version: str = "15.20", spock_version_num: int = 60000) -> None:
        self.script = script
        self.startup_overrides = dict(startup_overrides or {})
        self.drop_after = drop_after
        self.drop_sessions = drop_sessions
        self.keepalive_interval = keepalive_interval
        self.keepalive_delay = keepalive_delay
        self.server_version = server_version
        self.spock_version_num = spock_version_num
        self.status_updates: list[StatusUpdate] = []
        self.start_requests: list[StartRequest] = []
        self.queries: list[str] = []
        self.sessions = 0
        self.errors: list[BaseException] = []
        self._sock: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._clients: list[socket.socket] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.port = 0

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> "FakeSpockUpstream":
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        sock.settimeout(0.1)
        self._sock = sock
        self.port = sock.getsockname()[1]
        t = threading.Thread(target=self._accept_loop, name="fake-spock-accept", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            for c in self._clients:
                try:
                    c.close()
                except OSError:
                    pass
        for t in self._threads:
            t.join(timeout=5)
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> "FakeSpockUpstream":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=spock dbname=spockdb sslmode=disable connect_timeout=5"

    def disconnect_all(self) -> None:
        """Cut every client off (a crashed walsender)."""
        with self._lock:
            for c in self._clients:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def flushed(self) -> int:
        """The highest flush LSN any client reported."""
        return max((s.flush_lsn for s in self.status_updates), default=0)

    # -- connections -------------------------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._clients.append(client)
            t = threading.Thread(target=self._serve, args=(client,), name="fake-spock-session", daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, client: socket.socket) -> None:
        try:
            self._session(client)
        except (_ClientGone, OSError):
            pass
        except BaseException as exc:  # noqa: BLE001 - recorded for the test to inspect
            self.errors.append(exc)
        finally:
            try:
                client.close()
            except OSError:
                pass
            with self._lock:
                if client in self._clients:
                    self._clients.remove(client)

    @staticmethod
    def _recv_exact(client: socket.socket, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = client.recv(n - len(out))
            if not chunk:
                raise _ClientGone()
            out += chunk
        return bytes(out)

    def _read_message(self, client: socket.socket) -> tuple[bytes, bytes]:
        head = self._recv_exact(client, 5)
        length = struct.unpack(">i", head[1:])[0]
        return head[:1], self._recv_exact(client, length - 4)

    @staticmethod
    def _msg(kind: bytes, body: bytes = b"") -> bytes:
        return kind + struct.pack(">i", len(body) + 4) + body

    def _error(self, client: socket.socket, sqlstate: str, message: str) -> None:
        body = b"SERROR\0" + b"VERROR\0" + b"C" + sqlstate.encode() + b"\0" + b"M" + message.encode() + b"\0\0"
        client.sendall(self._msg(b"E", body) + self._msg(b"Z", b"I"))

    def _session(self, client: socket.socket) -> None:
        # startup, refusing SSL / GSS encryption
        while True:
            length = struct.unpack(">i", self._recv_exact(client, 4))[0]
            body = self._recv_exact(client, length - 4)
            code = struct.unpack(">i", body[:4])[0]
            if code in (_SSL_REQUEST, _GSSENC_REQUEST):
                client.sendall(b"N")
                continue
            if code != _PROTOCOL_3:
                raise _ClientGone()
            break
        out = [self._msg(b"R", _i32(0))]
        for key, value in (("server_version", self.server_version), ("server_encoding", "UTF8"),
                           ("client_encoding", "UTF8"), ("DateStyle", "ISO, MDY"), ("integer_datetimes", "on"),
                           ("standard_conforming_strings", "on"), ("TimeZone", "UTC"),
                           ("application_name", "")):
            out.append(self._msg(b"S", key.encode() + b"\0" + value.encode() + b"\0"))
        out.append(self._msg(b"K", _i32(4242) + _i32(1234)))
        out.append(self._msg(b"Z", b"I"))
        client.sendall(b"".join(out))
        while not self._stop.is_set():
            kind, body = self._read_message(client)
            if kind == b"X":
                return
            if kind != b"Q":
                self._error(client, "08P01", f"unexpected message {kind!r}")
                continue
            query = body.rstrip(b"\0").decode()
            self.queries.append(query)
            if query.strip().upper().startswith("START_REPLICATION"):
                self._replicate(client, query)
                return
            self._simple_query(client, query)

    def _simple_query(self, client: socket.socket, query: str) -> None:
        q = query.strip().upper()
        if q.startswith("IDENTIFY_SYSTEM"):
            cols = [("systemid", 25), ("timeline", 23), ("xlogpos", 25), ("dbname", 25)]
            row = ["7000000000000000001", "1", f"{self.script.last_end_lsn >> 32:X}/"
                   f"{self.script.last_end_lsn & 0xFFFFFFFF:X}", "spockdb"]
            self._rows(client, cols, [row], "IDENTIFY_SYSTEM")
        elif q.startswith("SELECT") or q.startswith("SHOW"):
            self._rows(client, [("?column?", 25)], [], "SELECT 0")
        else:
            client.sendall(self._msg(b"C", q.split()[0].encode() + b"\0" if q else b"\0") + self._msg(b"Z", b"I"))

    def _rows(self, client: socket.socket, cols: list[tuple[str, int]], rows: list[list[str]], tag: str) -> None:
        desc = _u16(len(cols)) + b"".join(name.encode() + b"\0" + _i32(0) + _u16(0) + _u32(oid) + _u16(0xFFFF)
                                          + _i32(-1) + _u16(0) for name, oid in cols)
        out = [self._msg(b"T", desc)]
        for row in rows:
            out.append(self._msg(b"D", _u16(len(row)) + b"".join(_i32(len(v.encode())) + v.encode() for v in row)))
        out.append(self._msg(b"C", tag.encode() + b"\0"))
        out.append(self._msg(b"Z", b"I"))
        client.sendall(b"".join(out))

    # -- the replication session -------------------------------------------------------------------------------
    def _negotiate(self, opts: dict[str, str]) -> tuple[str, str] | dict[str, str]:
        """Spock's checks on the startup parameters: an (sqlstate, message) error, or the startup message keys."""
        if opts.get("startup_params_format") != "1":
            return ("22023", "client sent startup parameters in format %s but we only support format 1"
                    % opts.get("startup_params_format"))
        try:
            cmin, cmax = int(opts["min_proto_version"]), int(opts["max_proto_version"])
        except (KeyError, ValueError):
            return ("22023", "missing or bad min_proto_version / max_proto_version")
        server_max = self.script.proto_version
        if cmin > server_max or cmax < 4:
            return ("22023", f"client sent min_proto_version={cmin} max_proto_version={cmax} but we only "
                             f"support protocol 4 to {server_max}")
        proto = min(server_max, cmax)
        if proto == 4 and int(opts.get("spock_version_num", "0") or 0) < 50000:
            return ("22023", "spock protocol 4 needs spock_version_num >= 50000")
        binary = opts.get("binary.want_binary_basetypes", "0") in ("1", "t", "true", "on") and \
            opts.get("binary.basetypes_major_version") == "1500"
        params = {
            "max_proto_version": str(server_max), "min_proto_version": "4", "proto_version": str(proto),
            "coltypes": "f", "pg_version_num": "150020", "pg_version": self.server_version,
            "pg_catversion": "202209061", "database_encoding": "UTF8",
            "encoding": "UTF8" if opts.get("expected_encoding") else "SQL_ASCII",
            "forward_changeset_origins": "t", "walsender_pid": "4242", "spock_version": "6.0.0",
            "spock_version_num": str(self.spock_version_num),
            "binary.internal_basetypes": "f", "binary.binary_basetypes": "t" if binary else "f",
            "binary.basetypes_major_version": "1500", "binary.sizeof_int": "4", "binary.sizeof_long": "8",
            "binary.sizeof_datum": "8", "binary.maxalign": "8", "binary.bigendian": "f",
            "binary.float4_byval": "f", "binary.float8_byval": "t", "binary.integer_datetimes": "f",
            "binary.binary_pg_version": "1500", "no_txinfo": "f",
        }
        if proto == 4:
            del params["proto_version"]
        for key, value in self.startup_overrides.items():
            if value is None:
                params.pop(key, None)
            else:
                params[key] = value
        return params

    def _replicate(self, client: socket.socket, query: str) -> None:
        m = _START_RE.match(query.strip())
        if m is None:
            self._error(client, "42601", f"syntax error in {query!r}")
            return
        opts = _parse_options(m.group(3))
        start = _parse_lsn(m.group(2))
        with self._lock:
            self.sessions += 1
            session = self.sessions
        self.start_requests.append(StartRequest(m.group(1), start, opts))
        negotiated = self._negotiate(opts)
        if isinstance(negotiated, tuple):
            self._error(client, *negotiated)
            return
        sets = opts.get("spock.replication_set_names")
        client.sendall(self._msg(b"W", _u8(0) + _u16(0)))
        frames: list[tuple[int, bytes]] = []
        sent: set[int] = set()
        first_data = None
        for txn in self.script.transactions:
            if txn.end_lsn <= start:
                continue
            if first_data is None:
                first_data = txn.begin_lsn
            if not sets:
                continue  # spock sends no rows without replication sets: skip the whole transaction here
            frames.extend(self.script.encode(txn, sent))
        if frames:
            frames.insert(0, (frames[0][0], SpockScript.startup_message(negotiated)))
        limit = self.drop_after if (self.drop_after is not None and session <= self.drop_sessions) else None
        wal_end = max(self.script.last_end_lsn, start)
        now_us = lambda: time.time_ns() // 1000 - _PG_EPOCH_OFFSET_US  # noqa: E731
        batch = []
        for i, (lsn, payload) in enumerate(frames):
            if limit is not None and i >= limit:
                client.sendall(b"".join(batch))
                client.shutdown(socket.SHUT_RDWR)  # the walsender died
                return
            batch.append(self._msg(b"d", b"w" + _u64(lsn) + _u64(lsn) + _i64(now_us()) + payload))
            if len(batch) >= 256:
                client.sendall(b"".join(batch))
                batch = []
                self._drain_status(client, session, 0.0)
        if batch:
            client.sendall(b"".join(batch))
        if self.keepalive_delay > 0:
            self._drain_status(client, session, self.keepalive_delay)
        # idle: keepalives asking for a reply, and whatever the client reports
        while not self._stop.is_set():
            client.sendall(self._msg(b"d", b"k" + _u64(wal_end) + _i64(now_us()) + _u8(1)))
            self._drain_status(client, session, self.keepalive_interval)

    def _drain_status(self, client: socket.socket, session: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([client], [], [], max(remaining, 0.0))
            if not ready:
                return
            kind, body = self._read_message(client)
            if kind == b"d" and body[:1] == b"r" and len(body) >= 34:
                write, flush, apply, _ts, reply = struct.unpack(">QQQqB", body[1:34])
                self.status_updates.append(StatusUpdate(write, flush, apply, bool(reply), session))
            elif kind in (b"c", b"X"):
                raise _ClientGone()
            if remaining <= 0:
                return
