"""The test_decoding oracle parser, on rows PostgreSQL 15 really printed."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.oracles import (UNCHANGED_TOAST, changes_of, escape_row, format_lsn, parse_columns, parse_lsn, parse_row,
                           read_test_decoding, read_wal2json, group_transactions, unescape_row)

DATA = Path(__file__).parent / "data"


def test_lsn_round_trip() -> None:
    assert parse_lsn("0/196D7D8") == 0x196D7D8
    assert parse_lsn("1/0") == 1 << 32
    assert format_lsn(0x196D7D8) == "0/196D7D8"


@pytest.mark.parametrize("raw", [b"plain", b"a\nb\tc\rd\\e", b"\x00\xff\x0a\x5c", "ünï 😀".encode(), b"\x7f\x1b"])
def test_escape_round_trip(raw: bytes) -> None:
    line = escape_row(raw)
    assert "\n" not in line and "\t" not in line
    assert unescape_row(line) == raw


def test_insert_with_quotes_arrays_and_nulls() -> None:
    row = parse_row("table public.kinds: INSERT: id[integer]:1 big[bigint]:9000000000 num[numeric]:12345.678 "
                    "txt[text]:'it''s a \"quote\" and a backslash \\ here' tags[text[]]:'{\"a b\",NULL,\"c\\\"d\",\"\"}' "
                    "nums[integer[]]:'{1,NULL,-3}' m[mood]:'happy' p[posint]:'7' flag[boolean]:true c[character]:'ab  ' "
                    "dp[double precision]:-2.25e-10 vc[character varying]:null")
    assert row["kind"] == "insert" and row["table"] == "public.kinds" and row["old"] is None
    new = row["new"]
    assert new["id"] == "1" and new["big"] == "9000000000" and new["num"] == "12345.678"
    assert new["txt"] == "it's a \"quote\" and a backslash \\ here"
    assert new["tags"] == '{"a b",NULL,"c\\"d",""}'
    assert new["nums"] == "{1,NULL,-3}"
    assert new["m"] == "happy" and new["p"] == "7" and new["flag"] == "true"
    assert new["c"] == "ab  " and new["dp"] == "-2.25e-10"
    assert new["vc"] is None
    typed = parse_columns("a[integer[]]:'{1}' b[timestamp with time zone]:'2024-01-01 00:00:00+00'", with_types=True)
    assert typed == {"a": ("integer[]", "{1}"), "b": ("timestamp with time zone", "2024-01-01 00:00:00+00")}


def test_update_forms() -> None:
    plain = parse_row("table public.docs: UPDATE: id[integer]:1 title[text]:'big, retitled' "
                      "body[text]:unchanged-toast-datum")
    assert plain["kind"] == "update" and plain["old"] is None
    assert plain["new"] == {"id": "1", "title": "big, retitled", "body": UNCHANGED_TOAST}
    key = parse_row("table public.kinds: UPDATE: old-key: id[integer]:2 new-tuple: id[integer]:200 "
                    "txt[text]:'moved' big[bigint]:null")
    assert key["old"] == {"id": "2"}
    assert key["new"] == {"id": "200", "txt": "moved", "big": None}
    full = parse_row("table public.full_ident: UPDATE: old-key: a[integer]:1 b[text]:'one new-tuple: x' "
                     "new-tuple: a[integer]:1 b[text]:'uno' c[integer]:null")
    assert full["old"] == {"a": "1", "b": "one new-tuple: x"}
    assert full["new"] == {"a": "1", "b": "uno", "c": None}


def test_delete_truncate_message_two_phase() -> None:
    d = parse_row("table public.full_ident: DELETE: a[integer]:2 c[integer]:20")
    assert d["old"] == {"a": "2", "c": "20"} and d["new"] is None and d["types"] == {"a": "integer", "c": "integer"}
    t = parse_row("table public.t2, public.t3: TRUNCATE: (no-flags)")
    assert t == {"kind": "truncate", "tables": ["public.t2", "public.t3"], "cascade": False,
                 "restart_identity": False}
    t2 = parse_row("table public.a: TRUNCATE: restart_seqs cascade")
    assert t2["cascade"] and t2["restart_identity"]
    m = parse_row("message: transactional: 0 prefix: bin, sz: 4 content:"
                  + unescape_row("\\x00\\xff\\n\\\\").decode("utf-8", "surrogateescape"))
    assert m == {"kind": "message", "transactional": False, "prefix": "bin", "content": b"\x00\xff\n\\"}
    assert parse_row("PREPARE TRANSACTION 'xfer-commit', txid 760") == {"kind": "prepare", "gid": "xfer-commit",
                                                                          "xid": 760}
    assert parse_row("ROLLBACK PREPARED 'it''s', txid 7")["gid"] == "it's"
    assert parse_row("BEGIN 743") == {"kind": "begin", "xid": 743}
    assert parse_row("COMMIT 743") == {"kind": "commit", "xid": 743}
    assert parse_row("aborting streamed (sub)transaction TXN 760") == {"kind": "stream_abort", "xid": 760}
    with pytest.raises(ValueError):
        parse_row("something else")


def test_transactions_and_two_phase_grouping() -> None:
    rows = [(1, "BEGIN 10"), (1, "table public.t: INSERT: id[integer]:1"), (2, "COMMIT 10"),
            (3, "message: transactional: 0 prefix: p, sz: 1 content:x"),
            (4, "BEGIN 11"), (4, "table public.t: INSERT: id[integer]:2"),
            (5, "PREPARE TRANSACTION 'g1', txid 11"),
            (6, "BEGIN 12"), (6, "table public.t: INSERT: id[integer]:3"),
            (7, "PREPARE TRANSACTION 'g2', txid 12"),
            (8, "ROLLBACK PREPARED 'g2', txid 12"), (9, "COMMIT PREPARED 'g1', txid 11")]
    txns = group_transactions(rows)
    assert [t.end for t in txns] == ["commit", "nontransactional", "prepare", "prepare", "rollback_prepared",
                                     "commit_prepared"]
    changes = changes_of(txns)
    assert [(c["action"], (c.get("new") or {}).get("id"), c["commit_lsn"]) for c in changes] == [
        ("insert", "1", 2), ("message", None, 3), ("insert", "2", 9)]


def test_saved_capture_parses_completely() -> None:
    rows = read_test_decoding(DATA / "pgoutput_v1_text.test_decoding.txt")
    txns = group_transactions(rows)
    changes = changes_of(txns)
    actions = {c["action"] for c in changes}
    assert actions == {"insert", "update", "delete", "truncate", "message"}
    toast = [c for c in changes if c["action"] == "update" and UNCHANGED_TOAST in c["new"].values()]
    assert len(toast) == 1 and toast[0]["table"] == "public.docs"
    kinds3 = next(c for c in changes if c["action"] == "insert" and c["table"] == "public.kinds"
                  and c["new"]["id"] == "3")
    assert kinds3["new"]["txt"] == "line1\nline2\ttab \u00fcn\u00ef\u00e7\u00f8d\u00e9 \U0001F600"
    assert kinds3["new"]["num"] == "NaN"
    msgs = [c for c in changes if c["action"] == "message"]
    assert [m["content"] for m in msgs] == [b"transactional payload", b"non-transactional", b"\x00\xff\n\\"]
    # the rolled-back savepoint and the rolled-back transaction are absent
    t1_ids = [c["new"]["id"] for c in changes if c.get("table") == "public.t1" and c["action"] == "insert"]
    assert "4" not in t1_ids and "6" not in t1_ids and {"3", "5"} <= set(t1_ids)


def test_saved_two_phase_capture() -> None:
    txns = group_transactions(read_test_decoding(DATA / "pgoutput_v3_twophase.test_decoding.txt"))
    ends = [t.end for t in txns]
    assert ends.count("prepare") == 4 and ends.count("commit_prepared") == 2 and ends.count("rollback_prepared") == 2
    changes = changes_of(txns)
    owners = [c["new"]["owner"] for c in changes if c["action"] == "insert" and c["table"] == "public.acct"]
    assert "mallory" not in owners
    bulk = [c for c in changes if c.get("table") == "public.bulk"]
    assert len(bulk) == 1500


def test_saved_wal2json() -> None:
    rows = read_wal2json(DATA / "pgoutput_v1_text.wal2json.jsonl")
    assert rows[0]["action"] == "B"
    assert {r["action"] for r in rows} >= {"B", "C", "I", "U", "D", "T", "M"}
    assert any(r.get("origin") for r in rows)
