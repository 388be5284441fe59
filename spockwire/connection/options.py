"""Output-plugin options, exactly as the servers want them, and the check of what the upstream answered.

* :func:`pgoutput_options` - START_REPLICATION options of PostgreSQL's ``pgoutput`` (proto_version 1-4).
* :func:`native_options` - startup parameters of ``pglogical_output`` (proto 1) and ``spock`` (proto 4-5).
* :func:`local_binary_params` - the ``binary.*`` compatibility keys, from this machine's real sizes and byte order.
* :func:`parse_startup_message` / :func:`check_startup` - read the native protocols' startup message ('S') and
  refuse, with :class:`StartupRejected`, a stream the decoder cannot handle.

All values are text, as the plugins parse them.
"""
from __future__ import annotations

import ctypes
import sys
from typing import Iterable, Mapping

from .errors import StartupRejected

__all__ = ["PLUGINS", "PGOUTPUT_MAX_PROTO", "SPOCK_PROTO_RANGE", "pgoutput_max_proto",
           "pgoutput_options", "native_options", "local_binary_params", "parse_startup_message", "check_startup",
           "quote_names", "plugin_protocol", "split_names"]

#: Plugin (slot output plugin name) -> decoder protocol.
PLUGINS = {
    "pgoutput": "pgoutput",
    "pglogical": "pglogical",
    "pglogical_output": "pglogical",
    "spock": "spock",
    "spock_output": "spock",
}

#: Highest pgoutput protocol version of each server major version.
PGOUTPUT_MAX_PROTO = {10: 1, 11: 1, 12: 1, 13: 1, 14: 2, 15: 3}
#: spock protocol versions this client offers (min, max); the decoder also reads 2 and 3.
SPOCK_PROTO_RANGE = (4, 5)
#: The spock_version_num sent to spock (required >= 50000 when proto 4 is negotiated).
SPOCK_CLIENT_VERSION_NUM = "60000"


def plugin_protocol(plugin: str) -> str:
    """The decoder protocol of an output plugin name ("pgoutput", "pglogical" or "spock")."""
    try:
        return PLUGINS[plugin]
    except KeyError:
        raise ValueError(f"unknown output plugin {plugin!r}: expected one of {', '.join(PLUGINS)}") from None


def pgoutput_max_proto(server_version_num: int) -> int:
    """The newest pgoutput protocol a server speaks (PG14: 2, PG15: 3, PG16 and later: 4)."""
    major = server_version_num // 10000
    if major >= 16:
        return 4
    return PGOUTPUT_MAX_PROTO.get(major, 1)


def _bool(value: bool) -> str:
    return "true" if value else "false"


def quote_names(names: Iterable[str]) -> str:
    """A comma-separated identifier list (publication_names), each name double-quoted."""
    items = [n for n in names]
    if not items:
        raise ValueError("at least one name is required")
    for name in items:
        if not isinstance(name, str) or not name or "\0" in name:
            raise ValueError(f"bad identifier {name!r}")
    return ",".join('"' + n.replace('"', '""') + '"' for n in items)


def _names(value: str | Iterable[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


def pgoutput_options(server_version_num: int, publication: str | Iterable[str], *, proto_version: int | None = None,
                     binary: bool = False, streaming: bool | str = False, two_phase: bool = False,
                     messages: bool = False, origin: str | None = None) -> dict[str, str]:
    """START_REPLICATION options for pgoutput; raises ValueError for a combination the server would refuse.

    Without `proto_version` the highest version the server supports is used. `streaming` is a bool, or on
    PostgreSQL 16+ "on" / "parallel" (parallel needs proto 4).
    """
    server_max = pgoutput_max_proto(server_version_num)
    major = server_version_num // 10000
    if proto_version is None:
        proto = server_max
    else:
        proto = int(proto_version)
        if not 1 <= proto <= 4:
            raise StartupRejected(f"pgoutput proto_version {proto} is not supported: the decoder reads 1 to 4")
        if proto > server_max:
            raise StartupRejected(f"pgoutput proto_version {proto} asked for, but PostgreSQL {major} speaks at "
                                  f"most {server_max}")
    pubs = _names(publication)
    if not pubs:
        raise ValueError("pgoutput needs publication=<name or list of names>")
    opts = {"proto_version": str(proto), "publication_names": quote_names(pubs)}
    if binary:
        if major < 14:
            raise StartupRejected(f"binary=True needs PostgreSQL 14 or later (server is {major})")
        opts["binary"] = "true"
    if messages:
        if major < 14:
            raise StartupRejected(f"messages=True needs PostgreSQL 14 or later (server is {major})")
        opts["messages"] = "true"
    if streaming:
        mode = "on" if streaming is True else str(streaming)
        if mode not in ("on", "parallel"):
            raise ValueError(f"streaming must be a bool, 'on' or 'parallel', not {streaming!r}")
        if proto < 2:
            raise StartupRejected("streaming needs pgoutput proto_version 2 or later")
        if mode == "parallel" and proto < 4:
            raise StartupRejected("streaming='parallel' needs pgoutput proto_version 4 (PostgreSQL 16+)")
        opts["streaming"] = "true" if major < 16 and mode == "on" else mode
    if two_phase:
        if proto < 3:
            raise StartupRejected("two_phase needs pgoutput proto_version 3 or later (PostgreSQL 15+)")
        opts["two_phase"] = "true"
    if origin is not None:
        if major < 16:
            raise StartupRejected(f"origin= needs PostgreSQL 16 or later (server is {major})")
        if origin not in ("any", "none"):
            raise ValueError(f"origin must be 'any' or 'none', not {origin!r}")
        opts["origin"] = origin
    return opts


def local_binary_params() -> dict[str, str]:
    """binary.* compatibility keys describing this machine (byte order and C type sizes).

    ``binary.float4_byval`` and ``binary.integer_datetimes`` are left out on purpose: on PostgreSQL 13+ the
    servers compare them against macros that no longer exist (they always report "f"), so sending the true
    values ("t") would make them switch binary transfer off. Each key is checked only when sent.
    """
    datum = ctypes.sizeof(ctypes.c_void_p)
    return {
        "binary.bigendian": "1" if sys.byteorder == "big" else "0",
        "binary.sizeof_datum": str(datum),
        "binary.sizeof_int": str(ctypes.sizeof(ctypes.c_int)),
        "binary.sizeof_long": str(ctypes.sizeof(ctypes.c_long)),
        "binary.float8_byval": "1" if datum >= 8 else "0",
    }


def internal_datum_params(server_version_num: int) -> dict[str, str]:
    """The two ``binary.*`` parameters that only internal datums need, as Spock's own subscriber sends them: the
    plugins compare them with the server's USE_FLOAT4_BYVAL (removed in PostgreSQL 13) and USE_INTEGER_DATETIMES
    (removed in 10), which read false on newer servers although float4 is by value and datetimes are integers."""
    return {"binary.float4_byval": "1" if server_version_num < 130000 else "0",
            "binary.integer_datetimes": "1" if server_version_num < 100000 else "0"}


def native_options(plugin: str, server_version_num: int, *, replication_sets: str | Iterable[str] | None = None,
                   forward_origins: bool = True, binary: bool | str = False,
                   extra: Mapping[str, str] | None = None, encoding: str | None = None,
                   proto_version: int | None = None, proto_format: str = "native") -> dict[str, str]:
    """Startup parameters for pglogical_output or spock.

    `encoding` is the database's server_encoding (default UTF8): the plugins send text in it, unconverted, and
    refuse any other ``expected_encoding``; the decoder converts it to UTF-8 (the startup message names it).

    `replication_sets` defaults to ``default``; without any set the plugins send no rows at all.
    `forward_origins` asks for transactions replicated from other nodes too (otherwise they are dropped).
    `binary` asks for the types' send/recv format; ``binary="internal"`` asks for internal datums as Spock's own
    subscriber does (every ``binary.*`` parameter, matching the server: internal_datum_params).
    `proto_version` (spock only: 4 or 5) pins min and max protocol version to that one version.
    `proto_format` "json" asks for the JSON protocol (docs/protocols.md, "The JSON protocol"); it carries every
    value as JSON text, so `binary` must stay False.
    """
    protocol = plugin_protocol(plugin)
    if protocol == "pgoutput":
        raise ValueError("native_options is for pglogical and spock; use pgoutput_options for pgoutput")
    sets = _names(replication_sets) or ["default"]
    for s in sets:
        if not s or "," in s:
            raise ValueError(f"bad replication set name {s!r}")
    prefix = "spock." if protocol == "spock" else "pglogical."
    if protocol == "spock":
        opts = {"startup_params_format": "1", "min_proto_version": str(SPOCK_PROTO_RANGE[0]),
                "max_proto_version": str(SPOCK_PROTO_RANGE[1]), "spock_version_num": SPOCK_CLIENT_VERSION_NUM}
        if proto_version is not None:
            if not SPOCK_PROTO_RANGE[0] <= int(proto_version) <= SPOCK_PROTO_RANGE[1]:
                raise StartupRejected(f"spock proto_version {proto_version} is not supported: the client reads "
                                      f"{SPOCK_PROTO_RANGE[0]} to {SPOCK_PROTO_RANGE[1]}")
            opts["min_proto_version"] = opts["max_proto_version"] = str(int(proto_version))
    elif proto_version is not None:
        raise StartupRejected(f"{plugin} has no proto_version option (protocol 1 only)")
    else:
        opts = {"startup_params_format": "1", "min_proto_version": "1", "max_proto_version": "1"}
    if encoding is not None:
        from ..wire.encodings import text_codec

        try:
            text_codec(encoding)
        except ValueError as exc:
            raise StartupRejected(str(exc)) from None
    opts["expected_encoding"] = encoding or "UTF8"
    opts[prefix + "replication_set_names"] = ",".join(sets)
    if forward_origins:
        opts[prefix + "forward_origins"] = "all"
    if binary not in (True, False, "internal"):
        raise ValueError(f"binary must be True, False or 'internal', not {binary!r}")
    if proto_format not in ("native", "json"):
        raise ValueError(f"proto_format must be 'native' or 'json', not {proto_format!r}")
    if proto_format == "json":
        if binary:
            raise StartupRejected("the JSON protocol carries every value as JSON text: binary must be False")
        opts["proto_format"] = "json"
    opts["binary.want_internal_basetypes"] = "1" if binary == "internal" else "0"
    if binary:
        opts["binary.want_binary_basetypes"] = "1"
        opts["binary.basetypes_major_version"] = str(_basetypes_major(server_version_num))
        opts.update(local_binary_params())
        if binary == "internal":
            opts.update(internal_datum_params(server_version_num))
    else:
        opts["binary.want_binary_basetypes"] = "0"
    if extra:
        opts.update({str(k): str(v) for k, v in extra.items()})
    return opts


def _basetypes_major(server_version_num: int) -> int:
    """PG_VERSION_NUM / 100 the way the plugins compare it (1500 for any 15.x)."""
    return server_version_num // 100


# ----------------------------------------------------------------------------------------------------------------
# the startup message

def parse_startup_message(payload: bytes | memoryview) -> dict[str, str]:
    """The key/value pairs of a native startup message ('S', u8 format=1, then cstring pairs to the end)."""
    buf = bytes(payload)
    if len(buf) < 2 or buf[0] != 0x53:
        raise StartupRejected("expected the startup message 'S' as the first message of the stream, got "
                              + (f"{chr(buf[0])!r}" if buf else "an empty message"))
    if buf[1] != 1:
        raise StartupRejected(f"unsupported startup message format {buf[1]} (this client reads format 1)")
    parts = buf[2:].split(b"\0")
    if parts and parts[-1] == b"":
        parts.pop()
    else:
        raise StartupRejected("startup message does not end with a NUL-terminated value")
    if len(parts) % 2:
        raise StartupRejected(f"startup message key {parts[-1]!r} has no value")
    return {parts[i].decode("utf-8", "replace"): parts[i + 1].decode("utf-8", "replace")
            for i in range(0, len(parts), 2)}


def _flag(params: Mapping[str, str], key: str) -> bool | None:
    value = params.get(key)
    if value is None:
        return None
    return value.strip().lower() in ("t", "true", "1", "on", "yes")


def check_startup(protocol: str, params: Mapping[str, str], *, binary_asked: bool = False,
                  basetypes_major: int | None = None, encoding: str | None = None,
                  internal_asked: bool = False) -> int:
    """Validate a native startup message against what was asked for; return the negotiated protocol version.

    Raises StartupRejected for an unknown protocol version, internal (host-order) datums that were not asked for
    (`internal_asked`), or whose byte order the message does not say, or whose text is not UTF-8, binary datums
    that were not asked for or of another major version, or a text encoding other than the one asked for
    (`encoding`, default UTF-8).
    """
    if protocol == "spock":
        text = params.get("proto_version")
        if text is None:
            num = params.get("spock_version_num", "")
            if not num.isdigit() or int(num) < 50000:
                raise StartupRejected(f"spock upstream sent no proto_version and spock_version_num={num!r}: "
                                      "spock older than 5.0 (protocol 2) is not negotiated by this client")
            version = 4
        else:
            if not text.strip().isdigit():
                raise StartupRejected(f"spock upstream sent proto_version={text!r}, not a number")
            version = int(text)
        lo, hi = SPOCK_PROTO_RANGE
        if not lo <= version <= hi:
            raise StartupRejected(f"spock upstream negotiated proto_version {version}; this client asked for "
                                  f"{lo} to {hi}")
    elif protocol == "pglogical":
        version = 1
        for key in ("max_proto_version", "min_proto_version"):
            value = params.get(key)
            if value is not None and value.strip() != "1":
                raise StartupRejected(f"pglogical upstream sent {key}={value!r}; this client reads protocol 1 only")
    else:
        raise ValueError(f"{protocol!r} has no startup message")
    if _flag(params, "binary.internal_basetypes"):
        if not internal_asked:
            raise StartupRejected("upstream sends internal (host-order, possibly compressed) datums "
                                  "(binary.internal_basetypes=t) but binary='internal' was not asked for")
        if _flag(params, "binary.bigendian") is None:
            raise StartupRejected("upstream sends internal datums (binary.internal_basetypes=t) but does not say "
                                  "its byte order (binary.bigendian)")
        dbenc = params.get("database_encoding")
        if dbenc is not None and _enc(dbenc) not in ("UTF8", "SQLASCII"):
            raise StartupRejected(f"upstream sends internal datums, whose text is in the database encoding "
                                  f"{dbenc!r} unconverted; binary='internal' reads UTF-8 databases only")
    if _flag(params, "binary.binary_basetypes"):
        if not binary_asked:
            raise StartupRejected("upstream sends binary send/recv datums (binary.binary_basetypes=t) "
                                  "but binary=False was asked for")
        sent = params.get("binary.basetypes_major_version")
        if basetypes_major is not None and sent is not None and sent.strip() != str(basetypes_major):
            raise StartupRejected(f"upstream binary datums are of major version {sent}, asked for "
                                  f"{basetypes_major}")
    wanted = _enc(encoding or "UTF8")
    for key in ("database_encoding", "encoding"):
        value = params.get(key)
        if value is not None and _enc(value) != wanted and not (wanted == "UTF8" and _enc(value) == "SQLASCII"):
            raise StartupRejected(f"upstream {key} is {value!r}; this client asked for text in "
                                  f"{'UTF-8' if wanted == 'UTF8' else encoding}")
    return version


def _enc(name: str) -> str:
    return "".join(ch for ch in name.upper() if ch.isalnum())


def split_names(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """Publication or replication set names as an option gives them (None, "a,b" or an iterable of names):
    stripped, without empty or repeated names, sorted."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = value.split(",")
    return tuple(sorted({str(v).strip() for v in value if str(v).strip()}))
