"""The session settings pinned on every connection spockwire decodes from.

The text forms of many types depend on settings a database, a role or the server may change: ``DateStyle`` (``SQL,
DMY`` prints a date as ``04/03/2024``), ``IntervalStyle``, ``extra_float_digits`` (0 rounds float4/float8 text),
``TimeZone`` (the zone printed inside timestamptz and tstzrange text), ``lc_monetary`` (money text),
``bytea_output`` and ``client_encoding``. The output functions of a walsender, and of the SQL decoding functions,
run with the settings of the connection that asked, so pinning them at connect time (libpq's ``options``, applied
before any query) makes every server deliver the same text.

``client_encoding=UTF8`` matters beyond the text of values: pgoutput converts text values (text and binary
format) and relation/column names to the session's client encoding, so a LATIN1 database arrives as UTF-8.
pglogical and spock send the database encoding unconverted (see `spockwire.connection.options`).
"""
from __future__ import annotations

from typing import Any, Mapping

__all__ = ["SESSION_SETTINGS", "session_options", "pinned_kwargs", "pinned_connect"]

#: name -> value, as PostgreSQL's own subscriber pins the first three on its walsender connection
SESSION_SETTINGS: dict[str, str] = {
    "DateStyle": "ISO",
    "IntervalStyle": "postgres",
    "extra_float_digits": "3",
    "TimeZone": "UTC",
    "client_encoding": "UTF8",
    "bytea_output": "hex",
    "lc_monetary": "C",
}


def session_options(user_options: str | None = None) -> str:
    """libpq ``options``: what the user gave first, then ``-c name=value`` for each pinned setting (later wins)."""
    ours = " ".join(f"-c {name}={value}" for name, value in SESSION_SETTINGS.items())
    user = (user_options or "").strip()
    return f"{user} {ours}" if user else ours


def pinned_kwargs(dsn: str, kwargs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``psycopg2.connect`` keyword arguments for `dsn` with the session settings pinned.

    Options already in the DSN or in `kwargs` are kept (a keyword argument replaces the DSN's ``options``, so both
    are merged into it); the pinned settings come last and so take effect.
    """
    from psycopg2.extensions import parse_dsn

    out = dict(kwargs or {})
    given = []
    try:
        in_dsn = parse_dsn(dsn).get("options")
    except Exception:  # noqa: BLE001 - psycopg2.connect reports a bad DSN itself
        in_dsn = None
    if in_dsn:
        given.append(in_dsn)
    if out.get("options"):
        given.append(str(out["options"]))
    out["options"] = session_options(" ".join(given))
    return out


def pinned_connect(dsn: str, **kwargs: Any) -> Any:
    """``psycopg2.connect(dsn, **kwargs)`` with the session settings pinned."""
    import psycopg2

    return psycopg2.connect(dsn, **pinned_kwargs(dsn, kwargs))
