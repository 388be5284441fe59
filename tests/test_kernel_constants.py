"""The numbers the C value kernels and the pure-Python twin share are the same numbers.

The C side keeps them in spockwire/wire/include/sw_consts.h (compile-time constants the C compiler folds) and in
the `cdef enum` blocks of spockwire/wire/_values.pxi (value kinds, failure codes); the twin keeps them in
spockwire/values/kinds.py, failures.py, _convert_py.py, spockwire/model.py and spockwire/wire/_cursor_py.py.
This test reads the C sources as text and compares every constant with the twin's, so neither side can change
one alone.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from spockwire import model
from spockwire.values import _convert_py, catalog, failures
from spockwire.wire import _cursor_py

# the C sources are not in a wheel: a check of the checkout (the twin's modules are the installed ones)
pytestmark = pytest.mark.lint

WIRE = Path(os.environ.get("SPOCKWIRE_SOURCE_DIR") or Path(__file__).resolve().parents[1]) / "spockwire" / "wire"


def _header_defines() -> dict[str, int]:
    text = (WIRE / "include" / "sw_consts.h").read_text()
    raw = dict(re.findall(r"^#define (SW_[A-Z0-9_]+) (.+)$", text, re.M))
    values: dict[str, int] = {}

    def value(name: str) -> int:
        if name not in values:
            expr = re.sub(r"\((?:u?int\d+_t|Py_ssize_t)\)", "", raw[name])       # drop the casts
            expr = re.sub(r"(0x[0-9A-Fa-f]+|\d+)(?:U?LL|ULL)\b", r"\1", expr)        # and the suffixes
            expr = re.sub(r"SW_[A-Z0-9_]+", lambda m: str(value(m.group(0))), expr)
            values[name] = eval(expr, {"__builtins__": {}})                          # noqa: S307 - digits only
        return values[name]

    return {name: value(name) for name in raw if name != "SW_CONSTS_H"}


def _pxi_enum(prefix: str) -> dict[str, int]:
    text = (WIRE / "_values.pxi").read_text()
    return {name: int(number) for name, number in re.findall(rf"^    ({prefix}[A-Z0-9_]+) = (\d+)$", text, re.M)}


def test_header_constants_equal_the_twins():
    c = _header_defines()
    assert c == {
        "SW_I64_MAX": _convert_py.INT64_MAX,
        "SW_I64_MIN": _convert_py.INT64_MIN,
        "SW_U64_MAX": (1 << 64) - 1,
        "SW_I32_MAX": _convert_py.INT32_MAX,
        "SW_I32_MIN": _convert_py.INT32_MIN,
        "SW_US_PER_DAY": _convert_py.US_PER_DAY,
        "SW_UNIX_US_2000": _convert_py.UNIX_US_2000,
        "SW_UNIX_DAYS_2000": _convert_py.UNIX_DAYS_2000,
        "SW_OFFSET_LIMIT": failures.OFFSET_LIMIT,
        "SW_MIN_TXN_TS": _cursor_py.MIN_TXN_TS,
        "SW_MAX_TXN_TS": _cursor_py.MAX_TXN_TS,
    }
    assert c["SW_UNIX_US_2000"] == model.PG_EPOCH_OFFSET_US == c["SW_UNIX_DAYS_2000"] * c["SW_US_PER_DAY"]


def test_value_kinds_equal_the_catalogs():
    kinds = _pxi_enum("K_")
    names = {"DECIMAL", "NUMERIC_TEXT", "RAW", "BOOL", "INT2", "INT4", "INT8", "OID", "FLOAT4", "FLOAT8", "TEXT",
             "JSON", "JSONB", "BYTEA", "DATE", "TIMESTAMP", "TIMESTAMPTZ", "TIME", "TIMETZ", "INTERVAL", "UUID",
             "ENUM", "ARRAY", "OTHER", "CHAR", "PGTEXT"}
    assert kinds == {f"K_{name}": getattr(catalog, name) for name in names}


def test_failure_codes_equal_the_twins():
    codes = _pxi_enum("F_")
    assert codes, "no F_ enum found in _values.pxi"
    assert codes == {f"F_{name[2:]}": getattr(failures, name[2:]) for name in codes}


def test_internal_datum_codes_equal_the_twins():
    """The refusal codes of the C readers of internal datums (include/sw_varlena.h, sw_internal_types.h) and the
    jsonpath nesting limit are the twin's."""
    from spockwire.values import internal_types

    text = (WIRE / "include" / "sw_varlena.h").read_text() + (WIRE / "include" / "sw_internal_types.h").read_text()
    found = re.findall(r"^#define (SW_(?:VL|JP)_[A-Z_]+) (-?\d+)(?:\s|$)", text, re.M)
    defines = {name: int(value) for name, value in found}
    assert defines == {"SW_VL_OK": 0, "SW_VL_INVALID": failures.VARLENA_INVALID,
                       "SW_VL_EXTERNAL": failures.EXTERNAL_DATUM, "SW_VL_CORRUPT": failures.COMPRESSED_CORRUPT,
                       "SW_VL_RAWSIZE": failures.RAW_SIZE_MISMATCH, "SW_VL_LAYOUT": failures.LAYOUT_INVALID,
                       "SW_JP_MAX_DEPTH": internal_types.JSONPATH_MAX_DEPTH}
