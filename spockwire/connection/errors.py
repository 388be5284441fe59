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

__all__ = ["ReplicationError", "StartupRejected", "ConnectionLost", "ServerError", "RETRYABLE_SQLSTATE_CLASSES"]

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
