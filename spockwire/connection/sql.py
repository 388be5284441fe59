"""The SQL transport: read a logical slot through ``pg_logical_slot_get_binary_changes`` on an ordinary connection.

Why a second slot. The SQL functions decode from a slot's confirmed position: ``peek`` never moves it (every call
would decode the same changes again), ``get`` moves it past everything it returned (before the consumer has
persisted anything). So the stream copies the slot into a private cursor slot (``pg_copy_logical_replication_
slot``) and reads that one with ``get``: each call returns the changes after the previous call, nothing is decoded
twice. The real slot moves only when the consumer acknowledges: ``pg_replication_slot_advance(slot, acked)``,
never past the acknowledged position. When the connection breaks, the next connection copies the real slot
again, so everything not acknowledged comes again (at-least-once, as with the replication protocol). The stream
pipelines the calls over two connections (see `SqlSource`), so its cursor slot is an ordinary slot, dropped at
close or, after a crash, by the next source on the same slot; a single-connection source uses a temporary one.

Each call runs ``COPY (SELECT lsn, data FROM pg_logical_slot_get_binary_changes(cursor, NULL, <batch_changes>,
<options>)) TO STDOUT (FORMAT binary)``; the pump (`CopyPump`) turns the binary rows into frame records, one
bounded batch at a time, so a large call never sits in client memory. The server materializes one call's result
(a tuplestore: memory up to work_mem, then a temporary file) before sending it.

A backlog of at least `split_bytes` of WAL is read as two halves decoded side by side ("split"): the head, up to
the middle LSN, on the cursor slot; the tail, from the middle on, on a copy of it advanced to the middle
(``pg_replication_slot_advance``). A call with ``upto_lsn`` processes exactly the WAL records that start before
it, and a slot whose confirmed position is the middle skips exactly the transactions whose commit record starts
before it, so the two halves hand out every transaction once. Each call then costs the server its own half, plus,
for the tail, reading the first half again in skip mode: two backends do in parallel what one would do in turn.
"""
from __future__ import annotations

import time
from typing import Any, Mapping

from .errors import ConnectionLost, ServerError
from .session import pinned_kwargs
from .slots import format_lsn, parse_lsn

__all__ = ["SqlSource", "sql_options", "cursor_slot_name", "pipelined_cursor_slot_name", "split_cursor_slot_name",
           "drop_stale_cursor_slots", "advance_slot"]

#: pause before the next call after one that reached the end of the WAL (lets a trickle gather)
_CAUGHT_UP_PAUSE = 0.05
#: at most this often the real slot is moved over WAL that had nothing for the stream (see `idle_advance`)
IDLE_ADVANCE_INTERVAL = 0.5
#: at most this much WAL in a split's head (its call reads all of it before sending a row)
SPLIT_HEAD_MAX_BYTES = 1 << 30
#: where the server's WAL ends for the SQL functions (their end of WAL: flushed, or replayed on a standby)
_WAL_END = ("(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_flush_lsn() END)"
            "::text")


def sql_options(options: Mapping[str, str]) -> dict[str, str]:
    """The plugin options for the SQL functions: those of START_REPLICATION minus pgoutput's ``streaming``.

    Each call of the SQL functions is a decoding session of its own: a transaction streamed in part by one call
    would be streamed again from its start by the next. Without ``streaming`` the server spills large
    transactions to disk and sends them at commit; the events handed out are the same.
    """
    return {k: v for k, v in options.items() if k != "streaming"}


def cursor_slot_name(slot: str, backend_pid: int) -> str:
    """The temporary slot of one connection (slot names: at most 63 of [a-z0-9_])."""
    return f"{slot[:40]}_swsql_{backend_pid}"


class SqlSource:
    """One connection's worth of the SQL transport: the cursor slot, the running COPYs, the acks.

    `read(timeout)` returns frame records (``b""`` when none arrived in time). `flush_lsn` is the acknowledged
    position (only grows); `advance_real(force)` moves the real slot there - between calls, at most every
    `status_interval` s unless forced. Not thread-safe: the stream serializes access.

    With `second_conn` the calls are pipelined over two connections: the function decodes a whole call, confirms
    the cursor slot's new position and releases the slot before the executor sends the first row, so once the
    first row of call N arrives, call N+1 is started on the other connection and the server decodes it while call
    N's rows are sent and decoded here. Rows are still handed out strictly in call order (all of call N, then call
    N+1). A temporary slot belongs to the backend that made it, so the pipelined cursor slot is an ordinary
    (persistent) slot named after the first connection's backend; `drop_cursor_slot` drops it at close, and a
    cursor slot left behind by a client that died is dropped by the next `SqlSource` on the same slot once its
    backend is gone (`drop_stale_cursor_slots`).

    Pipelined, a call that starts with both connections idle and at least `split_bytes` of WAL (0: never) ahead
    of the cursor slot is a split (see the module): the head on this connection, the tail on the other, both
    decoding at once. The tail's slot, a copy of the cursor slot made just before, becomes the cursor slot once
    the head's rows were handed out, and the head's is dropped. A head call that stops at `batch_changes` before
    the middle is followed by another up to the middle before the tail's rows are handed out.
    """

    def __init__(self, conn: Any, pump_module: Any, *, slot: str, options: Mapping[str, str],
                 batch_changes: int, max_batch_bytes: int, start_lsn: int, flush_lsn: int,
                 status_interval: float, max_idle_wait: float, second_conn: Any = None,
                 split_bytes: int = 0) -> None:
        self.conn = conn
        self.conns = [conn] if second_conn is None else [conn, second_conn]
        self.pipelined = second_conn is not None
        self.slot = slot
        self.batch_changes = int(batch_changes)
        self.status_interval = status_interval
        self.max_idle_wait = max(max_idle_wait, 0.05)
        self._flush_lsn = flush_lsn
        self.calls = 0
        self.splits = 0
        self.split_bytes = int(split_bytes) if second_conn is not None else 0
        self.status_sent = 0
        self.wal_end = 0
        self.write_lsn = 0
        self._backoff = 0.0
        self._next_call = 0.0
        self._last_advance = time.monotonic()
        self._last_wal_check = 0.0
        self._advance_wanted = False
        self._idle_wanted = False
        #: the cursor slot's confirmed position after the last call whose rows were all handed out: the end of the
        #: WAL it has read
        self.read_end = 0
        #: per connection: the cursor slot's position right after its running call was decoded (pipelined)
        self._ends: list[int | None] = [None] * len(self.conns)
        self._cur = 0  # the connection whose call's rows are handed out now
        # per connection: when its running (or last) call started; the source's opening until the first call
        self._started = [time.monotonic()] * len(self.conns)
        self._behind_since: float | None = None
        self._ahead = False  # the next call runs on the other connection
        #: per connection: the cursor slot its running (or last) call reads
        self._call_slot: list[str] = [""] * len(self.conns)
        #: while a split's head runs or its rows are handed out: (head's connection, middle LSN, tail's slot)
        self._split: tuple[int, int, str] | None = None
        self._tail: int | None = None  # the connection of a split's tail (no call starts early beside it)
        self._queries: dict[str, bytes] = {}
        with conn.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            pid = cur.fetchone()[0]
            self.cursor_slot = (pipelined_cursor_slot_name(slot, pid) if self.pipelined
                                else cursor_slot_name(slot, pid))
            #: the two names a pipelined source's cursor slot takes in turn (a split's tail reads the other)
            self._slot_names = (self.cursor_slot, split_cursor_slot_name(slot, pid))
            cur.execute("SELECT confirmed_flush_lsn::text, active_pid FROM pg_replication_slots "
                        "WHERE slot_name = %s AND slot_type = 'logical'", (slot,))
            row = cur.fetchone()
            if row is None:
                raise ServerError(f'replication slot "{slot}" does not exist (SQLSTATE 42704)', sqlstate="42704")
            if row[1] is not None:
                # the replication protocol refuses a slot in use the same way (retried while reconnecting)
                raise ConnectionLost(f'replication slot "{slot}" is active for PID {row[1]}', sqlstate="55006")
            #: the real slot's confirmed position as far as this connection knows
            self.real_confirmed = parse_lsn(row[0])
            drop_stale_cursor_slots(cur, slot)
            cur.execute("SELECT pg_copy_logical_replication_slot(%s, %s, %s)",
                        (slot, self.cursor_slot, not self.pipelined))
            #: where the cursor slot starts: the server's position, or a later one asked for / acknowledged
            self.start_position = max(self.real_confirmed, start_lsn, flush_lsn)
            if self.start_position > self.real_confirmed:
                cur.execute("SELECT pg_replication_slot_advance(%s, %s)",
                            (self.cursor_slot, format_lsn(self.start_position)))
            self._pairs: list[str] = []
            for key, value in options.items():
                self._pairs += [key, value]
            self._queries[self.cursor_slot] = self._call_query(cur, self.cursor_slot)
        self.pumps = [pump_module.CopyPump(c.pgconn_ptr, max_batch_bytes=max_batch_bytes) for c in self.conns]
        self.pump = self.pumps[0]

    # ------------------------------------------------------------------------------------------------ positions
    @property
    def flush_lsn(self) -> int:
        return self._flush_lsn

    @flush_lsn.setter
    def flush_lsn(self, value: int) -> None:
        if value > self._flush_lsn:
            self._flush_lsn = value

    @property
    def busy(self) -> bool:
        """True while a call's COPY runs (a connection cannot take other queries)."""
        return any(p.active for p in self.pumps)

    def _idle_conn(self) -> Any:
        for conn, pump in zip(self.conns, self.pumps):
            if not pump.active:
                return conn
        return None

    @property
    def caught_up(self) -> bool:
        """True when the last call that ended stopped short of `batch_changes` (it read to the end of the WAL and
        all its rows were handed out) and the call running since, if any, has not sent a row yet."""
        return self._backoff > 0.0 and not any(p.active and p.rows for p in self.pumps)

    @property
    def behind_since(self) -> float | None:
        """`time.monotonic()` when the call that found the source behind started (None while caught up)."""
        return None if self.caught_up else (self._behind_since or self._started[self._cur])

    def counters(self) -> dict[str, int]:
        return {"messages": sum(p.messages for p in self.pumps), "bytes": sum(p.bytes for p in self.pumps),
                "batches": sum(p.batches for p in self.pumps), "calls": self.calls, "splits": self.splits,
                "status_sent": self.status_sent}

    def _call_query(self, cur: Any, cursor_slot: str, upto_lsn: int | None = None,
                    advance_to: int | None = None) -> bytes:
        """One call's COPY: the changes after `cursor_slot`'s position, at most `batch_changes` of them (a split's
        head: of the WAL records that start before `upto_lsn`; its tail: after advancing the slot to
        `advance_to`, in the same statement so the server does both while this side reads the head)."""
        options = ", %s" * len(self._pairs)
        if advance_to is None:
            return cur.mogrify(
                "COPY (SELECT lsn, data FROM pg_logical_slot_get_binary_changes(%s, %s, %s" + options
                + ")) TO STDOUT (FORMAT binary)",
                [cursor_slot, None if upto_lsn is None else format_lsn(upto_lsn), self.batch_changes,
                 *self._pairs])
        # LATERAL: the function call takes its slot name from the advance's result, so the advance runs first
        return cur.mogrify(
            "COPY (SELECT c.lsn, c.data FROM pg_replication_slot_advance(%s, %s) a, "
            "LATERAL pg_logical_slot_get_binary_changes(a.slot_name, NULL, %s" + options
            + ") c) TO STDOUT (FORMAT binary)",
            [cursor_slot, format_lsn(advance_to), self.batch_changes, *self._pairs])

    def _query_for(self, cursor_slot: str) -> bytes:
        query = self._queries.get(cursor_slot)
        if query is None:
            with self.conn.cursor() as cur:
                query = self._queries[cursor_slot] = self._call_query(cur, cursor_slot)
        return query

    def _start_call(self, index: int, query: bytes, cursor_slot: str) -> None:
        self.pumps[index].start(query)
        self._started[index] = time.monotonic()
        self._call_slot[index] = cursor_slot
        self.calls += 1

    # ------------------------------------------------------------------------------------------------ reading
    def read(self, timeout: float) -> bytes:
        """Frame records of the next batch of rows, starting the next call when one is due; ``b""`` if none."""
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            pump = self.pumps[self._cur]
            if not pump.active:
                now = time.monotonic()
                if now < self._next_call:
                    if self._next_call > deadline:
                        time.sleep(max(deadline - now, 0.0))
                        return b""
                    time.sleep(self._next_call - now)
                self.housekeeping()
                if not self._start_split():
                    self._start_call(self._cur, self._query_for(self.cursor_slot), self.cursor_slot)
            data = pump.read(max(deadline - time.monotonic(), 0.0))
            if pump.max_lsn > self.write_lsn:
                self.write_lsn = pump.max_lsn
            if (self.pipelined and not self._ahead and self._backoff == 0.0 and self._tail is None
                    and (pump.rows > 0 or not pump.active)):
                # this call is decoded (its first row came, or it ended) and the backlog was not exhausted by
                # the previous call: have the server decode the next one meanwhile
                self._start_ahead()
            if not pump.active:
                self._call_done(pump.rows)
            if self.caught_up:
                self._behind_since = None
            elif self._behind_since is None:
                self._behind_since = self._started[self._cur]
            if data or time.monotonic() >= deadline:
                return data

    def _slot_position(self, conn: Any, cursor_slot: str) -> int:
        with conn.cursor() as cur:
            cur.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                        (cursor_slot,))
            row = cur.fetchone()
        return parse_lsn(row[0]) if row is not None and row[0] is not None else 0

    def _start_ahead(self) -> None:
        other = 1 - self._cur
        conn = self.conns[other]
        # the running call has confirmed the cursor slot's position and released it: that position is its end
        self._ends[self._cur] = self._slot_position(conn, self._call_slot[self._cur])
        self.housekeeping(conn)
        self._start_call(other, self._query_for(self.cursor_slot), self.cursor_slot)
        self._ahead = True

    def _start_split(self) -> bool:
        """Start a split (head here, tail on the other connection) when at least `split_bytes` of WAL lie ahead;
        False (nothing started) otherwise."""
        import psycopg2

        other = 1 - self._cur
        if not self.split_bytes or self._ahead or self.pumps[other].active:
            return False
        # housekeeping's WAL position (at most a second old) filters out the calls of a stream that keeps up
        if self.wal_end - max(self.read_end, self.start_position) < self.split_bytes:
            return False
        spare = self._slot_names[1] if self.cursor_slot == self._slot_names[0] else self._slot_names[0]
        with self.conns[other].cursor() as cur:
            cur.execute("SELECT confirmed_flush_lsn::text, " + _WAL_END + " FROM pg_replication_slots "
                        "WHERE slot_name = %s", (self.cursor_slot,))
            row = cur.fetchone()
            if row is None or row[0] is None or row[1] is None:
                return False   # the cursor slot is gone: the plain call reports it as the server words it
            start, end = parse_lsn(row[0]), parse_lsn(row[1])
            if end - start < self.split_bytes:
                return False
            middle = start + min((end - start) // 2, SPLIT_HEAD_MAX_BYTES)
            try:
                # a spare left by a drop that failed goes first
                cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                            "WHERE slot_name = %s AND active_pid IS NULL", (spare,))
                cur.execute("SELECT pg_copy_logical_replication_slot(%s, %s, false)", (self.cursor_slot, spare))
            except psycopg2.Error as exc:
                if getattr(exc, "pgcode", None) != "53400":
                    raise
                self.split_bytes = 0  # no free slot for the tail (max_replication_slots): read in turn
                return False
            head = self._call_query(cur, self.cursor_slot, upto_lsn=middle)
            tail = self._call_query(cur, spare, advance_to=middle)
        self._split = (self._cur, middle, spare)
        self._tail = other
        self._start_call(self._cur, head, self.cursor_slot)
        self._start_call(other, tail, spare)
        self._ahead = True
        self.splits += 1
        return True

    def _head_done(self, end: int, middle: int, spare: str) -> None:
        """A call of a split's head has handed out all its rows (its connection is idle now)."""
        conn, other = self.conns[self._cur], 1 - self._cur
        self.read_end = max(self.read_end, end)
        self._backoff, self._next_call = 0.0, time.monotonic()
        if end < middle:
            # stopped at batch_changes short of the middle: another call goes on to it before the tail's rows
            with conn.cursor() as cur:
                query = self._call_query(cur, self.cursor_slot, upto_lsn=middle)
            self._split = (self._cur, middle, spare)
            self._start_call(self._cur, query, self.cursor_slot)
            return
        # the head read every record that starts before the middle: the tail's rows follow on
        self._drop_slot(conn, self.cursor_slot)
        self.cursor_slot = spare
        self._cur = other
        self._ahead = False

    @staticmethod
    def _drop_slot(conn: Any, name: str) -> None:
        import psycopg2

        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_drop_replication_slot(%s)", (name,))
        except psycopg2.Error as exc:
            if getattr(exc, "pgcode", None) in (None, "08000", "08003", "08006", "57P01"):
                raise
            # still in use for a moment: the next split or close() drops it

    def _call_done(self, rows: int) -> None:
        # where the call stopped reading: `get` confirms the end of the WAL it decoded on the cursor slot, also
        # when nothing there was for this stream
        end = self._ends[self._cur]
        self._ends[self._cur] = None
        if end is None:
            end = self._slot_position(self.conns[self._cur], self._call_slot[self._cur])
        if self._split is not None and self._split[0] == self._cur:
            split, self._split = self._split, None
            self._head_done(end, split[1], split[2])
            return
        if self._tail == self._cur:
            self._tail = None
        self.read_end = max(self.read_end, end)
        now = time.monotonic()
        if rows == 0:
            # nothing new: back off up to max_idle_wait
            self._backoff = min(max(self._backoff * 2, _CAUGHT_UP_PAUSE), self.max_idle_wait)
        elif rows < self.batch_changes:
            self._backoff = _CAUGHT_UP_PAUSE  # reached the end of the WAL
        else:
            self._backoff = 0.0  # more is waiting
        self._next_call = now + self._backoff
        if self._ahead:
            # the next call is running already: hand out its rows next
            self._cur = 1 - self._cur
            self._ahead = False

    # ------------------------------------------------------------------------------------------------ acks
    def request_advance(self) -> None:
        """Move the real slot to the acknowledged position now if a connection is free, else after this call."""
        self._advance_wanted = True
        self.housekeeping()

    def idle_advance(self) -> None:
        """The stream confirmed WAL that had nothing for it: move the real slot there soon (at most once every
        IDLE_ADVANCE_INTERVAL s), so a quiet stream on a busy server does not hold WAL."""
        self._idle_wanted = True
        self.housekeeping()

    def housekeeping(self, conn: Any = None) -> None:
        """Between calls: move the real slot when due; refresh the server's WAL position for lag figures."""
        if conn is None:
            conn = self._idle_conn()
            if conn is None:
                return
        now = time.monotonic()
        since = now - self._last_advance
        if self._flush_lsn > self.real_confirmed and (
                self._advance_wanted or since >= self.status_interval
                or (self._idle_wanted and since >= IDLE_ADVANCE_INTERVAL)):
            self._advance_real(conn)
        if now - self._last_wal_check >= 1.0:
            self._last_wal_check = now
            with conn.cursor() as cur:
                cur.execute("SELECT pg_current_wal_lsn()::text")
                self.wal_end = max(self.wal_end, parse_lsn(cur.fetchone()[0]))

    def _advance_real(self, conn: Any) -> None:
        import psycopg2

        target = self._flush_lsn
        self._last_advance = time.monotonic()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT end_lsn::text FROM pg_replication_slot_advance(%s, %s)",
                            (self.slot, format_lsn(target)))
                self.real_confirmed = max(self.real_confirmed, parse_lsn(cur.fetchone()[0]), target)
        except psycopg2.Error as exc:
            code = getattr(exc, "pgcode", None)
            if code is None or code[:2] in ("08", "57", "53"):
                raise
            # in use by another process for a moment ("55006"), or already further ("55000"): try again later
            return
        self._advance_wanted = self._idle_wanted = False
        self.status_sent += 1

    def advance_now(self) -> bool:
        """The final advance (close): True when the real slot is at the acknowledged position."""
        conn = self._idle_conn()
        if conn is None:
            return False
        if self._flush_lsn > self.real_confirmed:
            self._advance_real(conn)
        return self._flush_lsn <= self.real_confirmed

    def drop_cursor_slot(self) -> None:
        """Drop the cursor slot now (at close), so that it is gone when close() returns instead of when the backend
        has finished exiting (temporary) or the next stream cleans up (pipelined). Best effort."""
        if self.busy:
            return
        names = list(self._slot_names) if self.pipelined else [self.cursor_slot]
        try:
            with self.conn.cursor() as cur:
                cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                            "WHERE slot_name = ANY(%s)", (names,))
        except Exception:  # noqa: BLE001 - see above
            pass

    def stop(self, timeout: float = 5.0) -> bool:
        """End the running calls (cancel, drain, collect their results); True when the connections are idle."""
        ok = True
        for pump in self.pumps:
            if pump.active:
                ok = bool(pump.cancel(timeout)) and ok
        return ok

    def detach(self) -> None:
        for pump in self.pumps:
            pump.detach()
        for conn in self.conns[1:]:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - broken already
                pass


def pipelined_cursor_slot_name(slot: str, backend_pid: int) -> str:
    """The persistent cursor slot of a pipelined source (its first connection's backend pid in the name)."""
    return f"{slot[:40]}_swsqlp_{backend_pid}"


def split_cursor_slot_name(slot: str, backend_pid: int) -> str:
    """The other name a pipelined source's cursor slot takes (a split's tail reads a copy by this name)."""
    return f"{slot[:40]}_swsqls_{backend_pid}"


def drop_stale_cursor_slots(cur: Any, slot: str) -> None:
    """Drop pipelined cursor slots of `slot` whose owning backend has exited (a client that died before close):
    inactive slots named ``<slot>_swsqlp_<pid>`` or ``<slot>_swsqls_<pid>`` with no backend `pid`."""
    import psycopg2

    names = []
    for prefix in (f"{slot[:40]}_swsqlp_", f"{slot[:40]}_swsqls_"):
        cur.execute("SELECT slot_name FROM pg_replication_slots WHERE active_pid IS NULL AND NOT temporary "
                    "AND left(slot_name, %s) = %s AND substr(slot_name, %s) ~ '^[0-9]+$' "
                    "AND substr(slot_name, %s)::int NOT IN (SELECT pid FROM pg_stat_activity)",
                    (len(prefix), prefix, len(prefix) + 1, len(prefix) + 1))
        names += [name for (name,) in cur.fetchall()]
    for name in names:
        try:
            cur.execute("SELECT pg_drop_replication_slot(%s)", (name,))
        except psycopg2.Error:
            pass  # taken or dropped meanwhile


def advance_slot(dsn: str, slot: str, lsn: int, connect_kwargs: Mapping[str, Any] | None = None,
                 timeout: float = 5.0) -> bool:
    """Move `slot` to `lsn` over a fresh connection (when the stream's own connection is unusable).

    Retries for up to `timeout` s while the slot is in use (the old backend may still be leaving). Returns True
    when the slot's confirmed position is at `lsn` or later.
    """
    import psycopg2

    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = psycopg2.connect(dsn, **pinned_kwargs(dsn, connect_kwargs))
        except psycopg2.Error:
            return False
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                            (slot,))
                row = cur.fetchone()
                if row is None:
                    return False
                if parse_lsn(row[0]) >= lsn:
                    return True
                cur.execute("SELECT pg_replication_slot_advance(%s, %s)", (slot, format_lsn(lsn)))
                return True
        except psycopg2.Error as exc:
            if getattr(exc, "pgcode", None) != "55006" or time.monotonic() >= deadline:
                return False
        finally:
            conn.close()
        time.sleep(0.05)
