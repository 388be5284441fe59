"""PostgreSQL server encodings and the Python codecs that read them.

pglogical and spock send text values and names in the database encoding, unconverted (they refuse any other
``expected_encoding``), and say which in their startup message (``encoding``). The decoders convert such text to
UTF-8 with these codecs (LATIN1 through a fast path of their own). pgoutput needs none of this: it converts to the
session's client encoding, which spockwire pins to UTF8.
"""
from __future__ import annotations

__all__ = ["PG_CODECS", "text_codec", "encoding_name"]

#: PostgreSQL encoding name (upper case, no punctuation) -> Python codec; None: already UTF-8 / ASCII text
PG_CODECS: dict[str, str | None] = {
    "UTF8": None, "SQLASCII": None, "UNICODE": None,
    "LATIN1": "latin-1", "LATIN2": "iso8859-2", "LATIN3": "iso8859-3", "LATIN4": "iso8859-4",
    "LATIN5": "iso8859-9", "LATIN6": "iso8859-10", "LATIN7": "iso8859-13", "LATIN8": "iso8859-14",
    "LATIN9": "iso8859-15", "LATIN10": "iso8859-16",
    "ISO88595": "iso8859-5", "ISO88596": "iso8859-6", "ISO88597": "iso8859-7", "ISO88598": "iso8859-8",
    "WIN866": "cp866", "WIN874": "cp874", "WIN1250": "cp1250", "WIN1251": "cp1251", "WIN1252": "cp1252",
    "WIN1253": "cp1253", "WIN1254": "cp1254", "WIN1255": "cp1255", "WIN1256": "cp1256", "WIN1257": "cp1257",
    "WIN1258": "cp1258", "KOI8R": "koi8-r", "KOI8U": "koi8-u",
    "EUCJP": "euc-jp", "EUCJIS2004": "euc-jis-2004", "EUCKR": "euc-kr", "EUCCN": "gb2312",
}


def _norm(name: str) -> str:
    return "".join(ch for ch in name.upper() if ch.isalnum())


def text_codec(pg_encoding: str | None) -> str | None:
    """The Python codec of a PostgreSQL encoding name (None for UTF-8, SQL_ASCII or no name).

    Raises ValueError for an encoding without a codec here (MULE_INTERNAL, EUC_TW).
    """
    if not pg_encoding:
        return None
    key = _norm(pg_encoding)
    if key not in PG_CODECS:
        raise ValueError(f"text in the server encoding {pg_encoding!r} cannot be converted to UTF-8")
    return PG_CODECS[key]


def encoding_name(codec: str) -> str:
    """The PostgreSQL name of a codec of PG_CODECS (for messages)."""
    for name, value in PG_CODECS.items():
        if value == codec:
            return name
    return codec
