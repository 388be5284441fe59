"""The options of the ``spockwire`` data source (their table: datasource.py) as the readers use them. Light: Spark's
planning processes import it to create the source."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .slot import SlotSpec

__all__ = ["STARTING_POSITIONS", "ON_DIVERGENCE", "flag", "names", "options_to_spec", "staging_path"]

#: values of the streaming option startingPosition
STARTING_POSITIONS = ("slot", "snapshot")
#: what the stream reader does when a promoted standby's timeline left the one its position was read on before
#: that position: read every table again (a snapshot replaces them), or stop with that one line
ON_DIVERGENCE = ("repair", "stop")


def flag(value: Any, default: bool = False) -> bool:
    """A boolean option's value (`default` when it is not given)."""
    if value is None:
        return default
    return str(value).strip().lower() in ("1", "true", "t", "yes", "on")


def names(value: Any) -> tuple[str, ...]:
    """A comma-separated option's names."""
    if not value:
        return ()
    return tuple(v.strip() for v in str(value).split(",") if v.strip())


def options_to_spec(options: Any) -> SlotSpec:
    """The SlotSpec a set of data source options describes (option names are case-insensitive)."""
    from ..values.catalog import parse_column_types
    from .slot import SlotSpec, refuse_password_in_dsn

    opts = {str(k).lower(): v for k, v in dict(options).items()}
    dsn = opts.get("dsn")
    slot = opts.get("slot")
    if not dsn or not slot:
        raise ValueError("the spockwire data source needs the options dsn and slot")
    refuse_password_in_dsn(str(dsn))
    extra = {str(k)[len("pluginOption."):]: v for k, v in dict(options).items()
             if str(k).lower().startswith("pluginoption.")}
    proto = opts.get("protoversion")
    return SlotSpec(dsn=dsn, slot=slot, plugin=opts.get("plugin", "pgoutput"),
                    publication=names(opts.get("publication")),
                    replication_sets=names(opts.get("replicationsets")),
                    binary=flag(opts.get("binary")), proto_version=int(proto) if proto else None,
                    types=str(opts.get("types", "auto")).lower(), extra_options=extra,
                    column_types=parse_column_types(opts.get("columntypes") or ""),
                    on_unrepresentable=str(opts.get("onunrepresentable", "text")).lower(),
                    password=opts.get("password") or None)


def staging_path(options: Any) -> str | None:
    """The option stagingPath (None: the rows go through the DataFrame)."""
    opts = {str(k).lower(): v for k, v in dict(options).items()}
    return opts.get("stagingpath") or None
