"""What a `ReplicationStream` does while its consumer is between reads: a status thread keeps the walsender from
timing out and answers keepalives (replication), moves the slot to acknowledged positions (sql), writes heartbeat
messages (`heartbeat_interval`), and lets an idle slot follow the server once everything handed out is
acknowledged (docs/connection.md).
"""
from __future__ import annotations

import logging
import time
from typing import Any

from .errors import ReplicationError
from .session import pinned_kwargs

__all__ = ["BetweenReads", "HEARTBEAT_PREFIX", "IDLE_POLL_INTERVAL", "is_heartbeat"]

log = logging.getLogger("spockwire.connection")

#: replication: how often the status thread reads (and answers keepalives) while the consumer is between reads and
#: has acknowledged everything handed out (a walsender that is shutting down waits; see `_poll_between_reads`)
IDLE_POLL_INTERVAL = 0.25
#: prefix of the non-transactional messages `heartbeat_interval` writes; the stream never hands them out
HEARTBEAT_PREFIX = "spockwire.heartbeat"


def is_heartbeat(event: Any) -> bool:
    """Whether a decoded event is one of the stream's own heartbeat messages (never handed out)."""
    return getattr(event, "prefix", None) == HEARTBEAT_PREFIX and getattr(event, "transactional", True) is False


class BetweenReads:
    """The part of `ReplicationStream` that runs between the consumer's reads (on its status thread, or at the end of
    an `ack`); it uses the stream's own state and lock."""

    def _settle_idle(self) -> None:
        """With nothing open and everything handed out acknowledged, let the slot follow the server (lock held).

        Replication: the pump may confirm the walEnd of keepalives (`FramePump.idle`); the latest one already
        received is confirmed now. SQL: the end of the WAL the last finished call read is confirmed (the slot is
        advanced over it). Both only ever cover WAL whose decoded output was handed out and acknowledged.
        """
        pump, source, decoder = self._pump, self._source, self.decoder
        if pump is None and source is None:
            return
        idle = (decoder is not None and not self._undecoded and self._pending is None
                and self._acked == self._delivered and decoder.committed_lsn <= self._delivered
                and not getattr(decoder, "open_transactions", 1))
        if pump is not None:
            pump.idle = idle
            target = pump.keepalive_end
        else:
            target = source.read_end
        if idle and target > self._acked:
            self._acked = self._delivered = target
            (pump if pump is not None else source).flush_lsn = target
        if idle and source is not None and source.flush_lsn > source.real_confirmed:
            source.idle_advance()
        elif idle and pump is not None and pump.flush_lsn > pump.sent_flush:
            # tell the server now: a walsender sends its next keepalive only once the last one was answered
            try:
                pump.send_status()
            except ReplicationError:
                pass  # the next read sees the broken connection and reconnects

    def _heartbeat_loop(self) -> None:
        """Keep the server from timing the walsender out while the consumer is busy between reads (replication),
        move the slot to acknowledged positions while the consumer does not read (sql)."""
        period = max(self.status_interval / 2.0, 0.05)
        if self.heartbeat_interval is not None:
            period = max(min(period, self.heartbeat_interval / 2.0), 0.05)
        if self.transport == "replication":
            period = min(period, IDLE_POLL_INTERVAL)
        while not self._stop.wait(period):
            if self.heartbeat_interval is not None and time.monotonic() - self._last_beat >= self.heartbeat_interval:
                self._beat()
            if not self._lock.acquire(blocking=False):
                continue  # a read is running: it sends status updates itself
            try:
                pump, source = self._pump, self._source
                if pump is not None:
                    self._poll_between_reads(pump)
                    if pump.seconds_since_status >= self.status_interval:
                        pump.send_status()
                elif source is not None:
                    source.housekeeping()
            except Exception:  # noqa: BLE001 - the consumer's next read sees the broken connection and reconnects
                pass
            finally:
                self._lock.release()

    def _poll_between_reads(self, pump: Any) -> None:
        """Replication, consumer between reads (lock held): read what the server sent, as a read would.

        A walsender that is shutting down (`pg_ctl stop -m fast`) decodes the WAL written since the last reply, then
        waits until the client confirms its end before it exits, and the server's shutdown waits for it (the
        periodic status updates keep `wal_sender_timeout` from ending that wait). So while everything handed out is
        acknowledged and no decoded event waits, what has arrived is read and decoded here without waiting:
        keepalives are answered (their walEnd confirmed once nothing is open), a batch without events (part of a
        transaction, or the BEGIN/COMMIT pglogical and spock send of every transaction) is passed over as an empty
        read passes it, and a batch with events waits for the consumer's next read, which returns it (one batch at
        most: the polling stops until the consumer has read and acknowledged it)."""
        self._settle_idle()  # an ack() made while this thread held the lock could not settle it
        decoder = self.decoder
        if (self._pending is not None or self._pending_error is not None or self._undecoded or decoder is None
                or self._acked != self._delivered or decoder.committed_lsn > self._delivered):
            return
        try:
            data = pump.read(0.0)
            if not data:
                return
            events, lsn = self._decode(data)
        except ReplicationError as exc:
            self._pending_error = exc  # the consumer's next read raises it (and reconnects where it would)
            return
        except Exception as exc:  # noqa: BLE001 - a batch that failed to decode: the next read raises it
            self._pending_error = exc
            return
        if events:
            self._pending = (events, lsn)
        else:
            self._advance(events, lsn)
            self._settle_idle()

    def _beat(self) -> None:
        """Write a non-transactional logical message (never handed out) over an ordinary connection of its own, so
        that the server has WAL to pass, and the slot moves, even when nothing at all is written."""
        self._last_beat = time.monotonic()
        try:
            if self._beat_conn is None or self._beat_conn.closed:
                import psycopg2

                self._beat_conn = psycopg2.connect(self.dsn, **pinned_kwargs(self.dsn, {
                    **self._connect_kwargs, "application_name": f"spockwire-heartbeat-{self.slot}"}))
                self._beat_conn.autocommit = True
            with self._beat_conn.cursor() as cur:
                cur.execute("SELECT pg_logical_emit_message(false, %s, '')", (HEARTBEAT_PREFIX,))
        except Exception as exc:  # noqa: BLE001 - a missed heartbeat only delays the slot; tried again later
            log.debug("slot %s: heartbeat failed: %s", self.slot, exc)
            self._close_beat()

    def _close_beat(self) -> None:
        conn, self._beat_conn = self._beat_conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
