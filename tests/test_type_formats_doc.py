"""docs/protocols.md's table of every type in every value format is the one the live tests prove.

The table is rendered here from the type table itself (tests/test_typed_values.py CASES: what the text, binary,
internal and JSON tests stream) and from the set of types the plugins send as internal datums
(tests/test_internal_live.py INTERNAL_TYPES, checked live against Spock 6): a type added to the tests and not to
the document, or a cell that claims another format than the tests see, fails here. Regenerate the table with
`python -m tests.test_type_formats_doc`.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(os.environ.get("SPOCKWIRE_SOURCE_DIR") or Path(__file__).resolve().parents[1])
DOC = "docs/protocols.md"
START = "<!-- type-formats: rendered by tests/test_type_formats_doc.py -->"
END = "<!-- /type-formats -->"

pytestmark = pytest.mark.lint

#: the tests each column's cells point to
LEGEND = """\
* **T**: `tests/test_typed_values.py::test_values_match_the_server` (pgoutput text under two time zones and
  bytea_output settings, and binary; PostgreSQL 15 and 18; both implementations; against the server's values) and
  `::test_pglogical_with_a_catalog_matches_pgoutput` (pglogical text and binary, PostgreSQL 15).
* **I**: `tests/test_internal_live.py::test_spock_internal_type_table` (Spock 6 on PostgreSQL 18, negotiated as
  Spock's own subscriber does: which tables arrive as 'i' is asserted) and
  `tests/test_typed_values.py::test_pglogical_internal_format_decodes_every_type` (pglogical 2, PostgreSQL 15).
* **J**: `tests/test_json_protocol.py::test_pglogical_json_type_table_equals_native_text` (PostgreSQL 15) and
  `::test_spock_json_type_table_toast_and_keys_equal_native_text` (Spock 6, PostgreSQL 18): the same values as the
  native text protocol, but where the JSON form cannot say them (¹).
"""

NOTES = """\
¹ json and jsonb values that are JSON `null` arrive as SQL NULL (the JSON form writes both alike); an array's lower
bounds are not written (`[0:1]={a,b}` arrives as `{a,b}`; asserted on inet[]). See "6.4 What the JSON form cannot
say".

² Not a base type (an array, a domain, an enum, a range, a composite) or a base type with an element type (name,
point, line, lseg, box, oidvector, int2vector): under internal negotiation the plugins send it in its binary form,
decoded as in the binary column.
"""


def _base(sqltype: str) -> str:
    return sqltype.split("(")[0] + ("[]" if sqltype.endswith("[]") and "(" in sqltype else "")


def render() -> str:
    from tests.test_internal_live import INTERNAL_TYPES
    from tests.test_typed_values import CASES

    rows: dict[str, list[str]] = {}
    for case in CASES:
        rows.setdefault(_base(case.sqltype), []).append(case.name)
    lines = [START, "", "| type | text | binary | internal | JSON | cases (`t_<case>`) |", "|---|---|---|---|---|---|"]
    internal_names = {c.name for c in CASES if c.sqltype.split("(")[0] in INTERNAL_TYPES and not c.array}
    for sqltype, names in rows.items():
        internal = "'i' I" if all(n in internal_names for n in names) else "as binary² I"
        json_cell = "J¹" if sqltype in ("json", "jsonb", "jsonb[]", "inet[]") else "J"
        lines.append(f"| `{sqltype}` | T | T | {internal} | {json_cell} | {', '.join(names)} |")
    return "\n".join(lines + ["", LEGEND, NOTES, END])


def test_the_documented_type_table_is_the_tested_one() -> None:
    text = (ROOT / DOC).read_text()
    assert START in text and END in text, f"{DOC} has no rendered type table"
    documented = text[text.index(START):text.index(END) + len(END)]
    assert documented == render(), f"{DOC}'s type table differs from the tests; regenerate: " \
                                   "python -m tests.test_type_formats_doc"


def test_every_case_is_a_row() -> None:
    from tests.test_typed_values import CASES

    table = render()
    for case in CASES:
        assert f" {case.name}" in table or f"| {case.name}" in table, case.name


if __name__ == "__main__":
    print(render())
