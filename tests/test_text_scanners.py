"""The pure-Python twin's text-form scanners (spockwire/values/_convert_py.py) accept exactly the forms of the
C kernels' character loops, written here as regular expressions (the specification, independent of either
implementation), and return the same fields: checked on valid values and on thousands of byte mutations of them.
The differential suites check the twin against the C decoder on whole streams."""
from __future__ import annotations

import random
import re

import pytest

from spockwire.values import _convert_py as twin

pytestmark = pytest.mark.fast

FORMS = {
    "int": (re.compile(rb"-?[0-9]+"), twin._scan_int),
    "float": (re.compile(rb"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"), twin._scan_float),
    "numeric": (re.compile(rb"(-)?([0-9]+)(?:\.([0-9]+))?"), twin._scan_numeric),
    "date": (re.compile(rb"([0-9]{4,})-([0-9]{2})-([0-9]{2})( BC)?"), twin._scan_date),
    "timestamp": (re.compile(rb"([0-9]{4,})-([0-9]{2})-([0-9]{2}) ([0-9]{2}):([0-9]{2}):([0-9]{2})"
                             rb"(?:\.([0-9]{1,6}))?(?:([-+])([0-9]{2})(?::([0-9]{2})(?::([0-9]{2}))?)?)?( BC)?"),
                  twin._scan_timestamp),
    "time": (re.compile(rb"([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?"), twin._scan_time),
    "uuid": (re.compile(rb"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"),
             twin._scan_uuid),
    "interval time": (re.compile(rb"([-+])?([0-9]+):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?"), twin._scan_iv_time),
    "interval part": (re.compile(rb"([-+])?([0-9]+)"), twin._scan_iv_part),
    "array bounds": (re.compile(rb"\[-?[0-9]+:-?[0-9]+\]="), twin._scan_dims),
}
SEEDS = [b"-123", b"0", b"1.5e-3", b".5", b"5.", b"-0.25", b"2020-01-31", b"12345-12-31 BC",
         b"2020-01-31 12:34:56.123456+05:30:15 BC", b"2020-01-31 12:34:56-08", b"2020-01-31 12:34:56.1234567",
         b"2020-01-31 12:34:56+05:3", b"23:59:59.999999", b"0a1b2c3d-1111-2222-3333-444455556666",
         b"-12:30:00.5", b"+7", b"[-3:5]=", b"[1:2]=", b"", b"-", b"."]
ALPHABET = b"0123456789-+.:eE BCaf[]=x\xc3"


def _fields(name: str, m: re.Match) -> object:
    if name == "numeric":
        return (m.group(1) is not None, m.group(2), m.group(3))
    return m.groups()


def _mutations(count: int, seed: int):
    rng = random.Random(seed)
    for _ in range(count):
        b = bytearray(rng.choice(SEEDS))
        for _ in range(rng.randint(0, 3)):
            pos = rng.randint(0, len(b))
            op = rng.randint(0, 2)
            if op == 0 and b:
                b[min(pos, len(b) - 1)] = rng.choice(ALPHABET)
            elif op == 1:
                b.insert(pos, rng.choice(ALPHABET))
            elif b:
                del b[min(pos, len(b) - 1)]
        yield bytes(b)


@pytest.mark.parametrize("name", list(FORMS))
def test_scanner_accepts_the_form_and_returns_its_fields(name):
    form, scan = FORMS[name]
    accepted = 0
    for raw in [*SEEDS, *_mutations(20000, seed=len(name))]:
        m, got = form.fullmatch(raw), scan(raw)
        if isinstance(got, bool):
            assert got == (m is not None), raw
        else:
            assert (got is None) == (m is None), raw
            if m is not None:
                assert tuple(got) == tuple(_fields(name, m)), raw
        accepted += m is not None
    assert accepted > 50, f"the mutations of the seeds hardly ever form a valid {name}"


def test_the_twin_has_no_regular_expressions():
    import inspect

    assert "import re" not in inspect.getsource(twin)
