"""Where a staging folder's changes come from: server, database, slot, plugin and publications / replication sets.

The ingest worker reads its source once at start (`read_source`) and hands it to `StagingWriter(source=...)`,
which records it in every log entry and refuses to add changes from another source to a folder (docs/staging.md,
"Source").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..connection.options import split_names
from ..errors import SpockwireError

__all__ = ["StagingSource", "read_source", "plugin_name"]

_PLUGINS = {"pgoutput": "pgoutput", "pglogical": "pglogical_output", "pglogical_output": "pglogical_output",
            "spock": "spock_output", "spock_output": "spock_output"}


def plugin_name(plugin: str) -> str:
    """The server's output plugin name of a `plugin` setting ("pglogical" -> "pglogical_output")."""
    return _PLUGINS.get(plugin, plugin)


@dataclass(frozen=True)
class StagingSource:
    """The identity of a change stream. `system_identifier` is the server's (``pg_control_system()``,
    ``IDENTIFY_SYSTEM``) as a decimal string; `sets` are the publications (pgoutput) or replication sets
    (pglogical, spock), sorted."""

    system_identifier: str
    database: str
    slot: str
    plugin: str
    sets: tuple[str, ...]

    @property
    def sets_key(self) -> str:
        return "publications" if self.plugin == "pgoutput" else "replication_sets"

    def to_json(self) -> dict[str, Any]:
        return {"system_identifier": self.system_identifier, "database": self.database, "slot": self.slot,
                "plugin": self.plugin, self.sets_key: list(self.sets)}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "StagingSource":
        plugin = str(obj["plugin"])
        sets = obj.get("publications") if plugin == "pgoutput" else obj.get("replication_sets")
        return cls(str(obj["system_identifier"]), str(obj["database"]), str(obj["slot"]), plugin,
                   tuple(sets or ()))

    @classmethod
    def of(cls, system_identifier: Any, database: str, slot: str, plugin: str, sets: Any) -> "StagingSource":
        """A source from the worker's settings (plugin aliases and the order of set names do not matter)."""
        name = plugin_name(plugin)
        names = split_names(sets)
        if not names and name != "pgoutput":
            names = ("default",)
        return cls(str(system_identifier), database, slot, name, names)

    def describe(self) -> str:
        sets = ",".join(self.sets) or "-"
        label = "publications" if self.plugin == "pgoutput" else "replication sets"
        return (f"system {self.system_identifier} database {self.database!r} slot {self.slot!r} plugin "
                f"{self.plugin} {label} {sets}")


def read_source(dsn: str, *, slot: str, plugin: str, publication: Any = None, replication_sets: Any = None,
                connect_kwargs: Mapping[str, Any] | None = None) -> StagingSource:
    """The source a worker with these settings streams from: asks the server for its system identifier and the
    database of `dsn` (``pg_control_system()``; ``IDENTIFY_SYSTEM`` on a replication connection when the role
    may not call it). Raises SpockwireError when the server cannot be asked."""
    import psycopg2

    sets = publication if plugin_name(plugin) == "pgoutput" else replication_sets
    try:
        conn = psycopg2.connect(dsn, **dict(connect_kwargs or {}))
    except psycopg2.Error as exc:
        raise SpockwireError(f"cannot connect to the source to identify it: {str(exc).strip()}") from exc
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT current_database()")
            database = cur.fetchone()[0]
            try:
                cur.execute("SELECT system_identifier::text FROM pg_control_system()")
                system = cur.fetchone()[0]
            except psycopg2.Error:
                system = None
    finally:
        conn.close()
    if system is None:
        from psycopg2.extras import LogicalReplicationConnection

        try:
            rconn = psycopg2.connect(dsn, connection_factory=LogicalReplicationConnection,
                                     **dict(connect_kwargs or {}))
        except psycopg2.Error as exc:
            raise SpockwireError(f"cannot connect to the source to identify it: {str(exc).strip()}") from exc
        try:
            with rconn.cursor() as cur:
                cur.execute("IDENTIFY_SYSTEM")
                row = cur.fetchone()
                system, database = row[0], row[3] or database
        except psycopg2.Error as exc:
            raise SpockwireError(f"cannot identify the source server: {str(exc).strip()}") from exc
        finally:
            rconn.close()
    return StagingSource.of(system, database, slot, plugin, sets)
