"""Settings shared by the commands that read a live replication slot (`ingest`, `capture`)."""
from __future__ import annotations

from typing import Any

from .config import Setting

DSN = Setting("dsn", "libpq connection string of the upstream database (a replication connection is made from it)",
              required=True, metavar="DSN")
SLOT = Setting("slot", "logical replication slot to stream", required=True, metavar="NAME")
PLUGIN = Setting("plugin", "output plugin of the slot", choices=("pgoutput", "pglogical", "spock"),
                 default="pgoutput")
PUBLICATION = Setting("publication", "pgoutput: publication name(s), comma-separated", metavar="NAMES")
REPLICATION_SETS = Setting("replication_sets", "pglogical/spock: replication set names, comma-separated",
                           metavar="NAMES")
CREATE_SLOT = Setting("create_slot", "create the slot when it does not exist", is_flag=True, default=False)
BINARY = Setting("binary", "ask for the binary value format", is_flag=True, default=False)
INTERNAL = Setting("internal", "pglogical/spock: ask for internal datums as Spock's own subscriber does (every "
                   "binary.* parameter; implies --binary)", is_flag=True, default=False)
STREAMING = Setting("streaming", "pgoutput: stream large in-progress transactions", is_flag=True, default=False)
TWO_PHASE = Setting("two_phase", "pgoutput: decode prepared transactions at PREPARE", is_flag=True, default=False)
MESSAGES = Setting("messages", "pgoutput: include pg_logical_emit_message messages", is_flag=True, default=False)
PROTO_FORMAT = Setting("proto_format", "pglogical/spock: the plugin's message format, native or json (the JSON "
                       "protocol, a diagnostics format: docs/connection.md)", choices=("native", "json"),
                       default="native")
TRANSPORT = Setting("transport", "replication (walsender; low latency) or sql (batched reads of the slot through "
                    "the SQL interface; catch-up throughput)", choices=("replication", "sql"), default="replication")

STREAM_SETTINGS = (DSN, SLOT, PLUGIN, PUBLICATION, REPLICATION_SETS, CREATE_SLOT, BINARY, STREAMING, TWO_PHASE,
                   MESSAGES, TRANSPORT)


def names(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [n.strip() for n in value.split(",") if n.strip()]


def stream_kwargs(cfg: Any) -> dict[str, Any]:
    """`spockwire.connection.connect` keyword arguments from resolved settings."""
    binary = "internal" if getattr(cfg, "internal", False) else cfg.binary
    kwargs: dict[str, Any] = dict(slot=cfg.slot, plugin=cfg.plugin, create_slot=cfg.create_slot, binary=binary,
                                  transport=cfg.transport)
    if cfg.plugin == "pgoutput":
        kwargs.update(publication=names(cfg.publication), streaming=cfg.streaming, two_phase=cfg.two_phase,
                      messages=cfg.messages)
    else:
        kwargs.update(replication_sets=names(cfg.replication_sets))
        if getattr(cfg, "proto_format", "native") != "native":
            kwargs.update(proto_format=cfg.proto_format)
    return kwargs
