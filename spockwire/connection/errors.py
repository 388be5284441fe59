"""Errors of live replication streams (part of the spockwire exception family).

* :class:`ReplicationError` - base class; a problem with the replication connection or its negotiation.
* :class:`StartupRejected` - the upstream's startup message (or the options asked for) describes a stream the
  decoder cannot handle: an unknown protocol version, binary compatibility that was not asked for, ...
* :class:`ConnectionLost` - the connection broke or the server ended the stream in a way that a reconnect can
  cure (server restart, administrator shutdown, network error). The stream retries these by itself.
* :class:`ServerError` - the server reported an error a reconnect does not cure (a missing publication, a slot
  in use by another process, an output-plugin error). Carries the SQLSTATE.
"""
from __future__ import annotations

from ..errors import SpockwireError

__all__ = ["ReplicationError", "StartupRejected", "ConnectionLost", "ServerError", "PluginNotAllowed",
           "plugin_not_allowed", "FailoverNotSupported", "FailoverUnsafe", "TimelineDiverged",
           "RETRYABLE_SQLSTATE_CLASSES"]

#: SQLSTATE classes after which reconnecting makes sense: 08 connection exception, 57 operator intervention
#: (admin/crash shutdown, cannot connect now), 53 insufficient resources (too many connections).
RETRYABLE_SQLSTATE_CLASSES = ("08", "57", "53")


class ReplicationError(SpockwireError):
    """A replication connection or its negotiation failed."""


class StartupRejected(ReplicationError, ValueError):
    """The upstream offers (or the caller asked for) a stream the decoder cannot handle."""


class ConnectionLost(ReplicationError):
    """The connection broke; reconnecting and resuming from the last acknowledged LSN can cure it."""

    def __init__(self, message: str, *, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class ServerError(ReplicationError):
    """The server reported an error that reconnecting does not cure."""

    def __init__(self, message: str, *, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def classify(message: str, sqlstate: str | None) -> ReplicationError:
    """ConnectionLost for a retryable SQLSTATE (or none: the socket broke), ServerError otherwise."""
    message = message.strip() or "the replication connection ended"
    if sqlstate is None or sqlstate[:2] in RETRYABLE_SQLSTATE_CLASSES:
        return ConnectionLost(message, sqlstate=sqlstate)
    return ServerError(f"{message} (SQLSTATE {sqlstate})", sqlstate=sqlstate)


class PluginNotAllowed(ServerError):
    """The server's ``output_plugin_libraries`` setting (Debian's PostgreSQL 15.19+, PostgreSQL 18.6+) does not list
    the output plugin a slot needs."""


def plugin_not_allowed(exc: BaseException, library: str, allowed: str | None = None) -> PluginNotAllowed | None:
    """The one-line error for a server that refused `library` as an output plugin (`exc`, the server's error:
    SQLSTATE 42501 "may not be used as an output plugin"), naming the setting and the line to add; None for any
    other error. `allowed`: the setting's value, when it could be read."""
    text = str(exc)
    if getattr(exc, "pgcode", None) != "42501" or "may not be used as an output plugin" not in text:
        return None
    listed = [p.strip() for p in (allowed or "").split(",") if p.strip()]
    line = ", ".join(listed + [library]) if listed else f"pgoutput, {library}" if library != "pgoutput" else library
    return PluginNotAllowed(f"the server does not allow the output plugin {library!r}: add it to its "
                            f"output_plugin_libraries setting (postgresql.conf: output_plugin_libraries = '{line}') "
                            "and reload the server", sqlstate="42501")


class FailoverNotSupported(ServerError):
    """A failover slot was asked of a server before PostgreSQL 17."""


class FailoverUnsafe(ServerError):
    """``require_failover_safety``: no standby would hold this slot after a failover (see FailoverSafety)."""


class TimelineDiverged(ServerError):
    """The server's timeline history branches before a position the consumer already acknowledged: the consumer
    holds changes the server never had (it read a primary that a lagging standby replaced)."""

    def __init__(self, message: str, *, acked: int, switch_point: int, timeline: int) -> None:
        super().__init__(message, sqlstate=None)
        self.acked = acked
        self.switch_point = switch_point
        self.timeline = timeline
