"""The `spockwire` command line, run as `python -m spockwire` in a subprocess (both decoder implementations)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from spockwire.cli import config as cfgmod
from spockwire.connection.slots import format_lsn
from spockwire.frames import read_frame_file, write_frame_file
from spockwire.ingest import list_tables, read_log, read_staging
from tests.conftest import load_impl

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
PGOUTPUT = DATA / "pgoutput_v1_text.spwf"
PGLOGICAL = DATA / "pglogical_text.spwf"


def run(*args: str, impl: str | None = None, env: dict[str, str] | None = None, cwd: Path | None = None):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SPOCKWIRE_")}
    environ["PYTHONPATH"] = str(ROOT) + os.pathsep + environ.get("PYTHONPATH", "")
    if impl is not None:
        environ["SPOCKWIRE_IMPL"] = impl
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "spockwire", *args], capture_output=True, text=True,
                          env=environ, cwd=cwd or ROOT, timeout=300)


def assert_one_line_error(proc, command: str, *needles: str) -> None:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"spockwire {command}: error: ")
    for needle in needles:
        assert needle in lines[0]


@pytest.fixture
def impl_name(impl) -> str:
    return impl.IMPLEMENTATION


# ----------------------------------------------------------------------------------------- help and usage

def test_help_everywhere():
    top = run("--help")
    assert top.returncode == 0
    for command in ("main", "inspect", "decode"):
        assert command in top.stdout
        sub = run(command, "--help")
        assert sub.returncode == 0, sub.stderr
        assert "SPOCKWIRE_IMPL" in sub.stdout and "--config" in sub.stdout
    assert "SPOCKWIRE_OUT" in run("decode", "--help").stdout
    assert run("--version").stdout.startswith("spockwire ")


def test_usage_errors_exit_2(tmp_path):
    assert run().returncode == 2
    assert run("frobnicate").returncode == 2
    assert run("inspect", str(PGOUTPUT), "--no-such-flag").returncode == 2
    missing_out = run("decode", str(PGOUTPUT))
    assert missing_out.returncode == 2 and "--out is required" in missing_out.stderr
    bad_limit = run("inspect", str(PGOUTPUT), "--limit", "0")
    assert bad_limit.returncode == 2 and "--limit" in bad_limit.stderr
    bad_env = run("inspect", str(PGOUTPUT), env={"SPOCKWIRE_LIMIT": "many"})
    assert bad_env.returncode == 2 and "SPOCKWIRE_LIMIT" in bad_env.stderr
    bad_choice = run("decode", str(PGOUTPUT), "--out", str(tmp_path / "o"), "--compression", "brotli9")
    assert bad_choice.returncode == 2 and "not one of" in bad_choice.stderr


# ----------------------------------------------------------------------------------------- main

def test_main_summarises_the_bundled_captures(impl_name):
    proc = run("main", "--min-time", "0", "--min-runs", "1", "--types", "raw", impl=impl_name)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"decoder implementation '{impl_name}'" in out
    assert "pgoutput_v1_text.spwf" in out and "pglogical_text.spwf" in out
    assert "public.kinds" in out and "v1,v2" in out          # relation versions of public.evolving
    assert "sample rows:" in out and "public.t1 insert" in out
    assert out.count("rows/s") == 3 and "MB/s" in out
    # the counts, against the server's own test_decoding output of the same changes
    kinds = ("insert", "upd_pre", "upd_post", "delete", "truncate")
    for capture in (PGOUTPUT, PGLOGICAL):
        section = out.split(f"== {capture.name}:", 1)[1].split("\n== ", 1)[0]
        counted = {}
        for line in section.splitlines():
            parts = line.split()
            if len(parts) == 7 and parts[0].count(".") == 1 and parts[1].startswith("v"):
                counted[parts[0]] = dict(zip(kinds, map(int, parts[2:])))
        oracle = oracle_summary(capture)
        # pglogical sends a TRUNCATE as a row of its queue table (the oracle's pglogical.queue insert), not as a
        # truncate of the table: that column is compared for pgoutput only
        compared = kinds if capture == PGOUTPUT else kinds[:4]
        assert {t: {k: c[k] for k in compared} for t, c in counted.items()} == \
            {t: {k: c[k] for k in compared} for t, c in oracle["tables"].items()}, capture.name
        rows = sum(c[k] for c in oracle["tables"].values() for k in kinds[:4])
        assert f"rows: {rows}," in section, capture.name
        assert f"committed_lsn {format_lsn(oracle['committed_lsn'])}" in section
    oracle = oracle_summary(PGOUTPUT)
    messages = oracle["messages"]
    assert (oracle["truncates"], messages[True], messages[False]) == (1, 1, 2)
    assert f"truncates: {oracle['truncates']}, messages: {messages[True] + messages[False]} " \
           f"({messages[True]} transactional, {messages[False]} non-transactional)" in out


def test_main_with_given_files(impl_name):
    proc = run("main", str(PGLOGICAL), "--samples", "0", "--min-time", "0", "--min-runs", "1", impl=impl_name)
    assert proc.returncode == 0, proc.stderr
    assert "pglogical_text.spwf" in proc.stdout and "pgoutput_v1_text" not in proc.stdout
    assert "sample rows" not in proc.stdout


# ----------------------------------------------------------------------------------------- inspect

def test_inspect_text(impl_name):
    proc = run("inspect", str(PGOUTPUT), "--types", "raw", impl=impl_name)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "B  begin" in lines[0] and lines[0].strip().startswith("0/")
    assert any("R  relation" in ln and "public.kinds v1 (id key" in ln for ln in lines)
    assert any("-> insert" in ln and "public.kinds" in ln and "id='1'" in ln for ln in lines)
    assert any("-> truncate" in ln and "public.t2, public.t3" in ln for ln in lines)
    assert any("-> message" in ln and "non-transactional" in ln for ln in lines)
    assert lines[-1].startswith("committed_lsn 0/")
    limited = run("inspect", str(PGOUTPUT), "--types", "raw", "--limit", "5", impl=impl_name)
    assert limited.returncode == 0 and len(limited.stdout.splitlines()) == 5


def test_inspect_json(impl_name):
    proc = run("inspect", str(PGLOGICAL), "--json", impl=impl_name)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(ln) for ln in proc.stdout.splitlines()]
    kinds = {r["record"] for r in records}
    assert {"frame", "change", "end"} <= kinds
    assert records[0]["record"] == "frame" and records[0]["type"] == "S"      # pglogical startup message
    changes = [r for r in records if r["record"] == "change"]
    assert all({"table", "change_type", "commit_lsn", "seq", "values"} <= set(r) for r in changes)
    events = run("inspect", str(PGLOGICAL), "--json", "--events-only", "-n", "3", impl=impl_name)
    assert [json.loads(ln)["record"] for ln in events.stdout.splitlines()] == ["change"] * 3


# every typed value of the type table, as text on the wire, and the JSON form `inspect --json` must give for it
# (written from PostgreSQL's text of the value, not from spockwire's output)
_JSON_CASES = [
    # (type oid, typmod, text sent, expected JSON value)
    (16, -1, "t", True), (21, -1, "-32768", -32768), (23, -1, "2147483647", 2147483647),
    (20, -1, "-9223372036854775808", -9223372036854775808), (26, -1, "4294967295", 4294967295),
    (700, -1, "1.5", 1.5), (701, -1, "NaN", "NaN"), (701, -1, "-Infinity", "-Infinity"),
    (701, -1, "0.1", 0.1), (1700, (12 << 16 | 2) + 4, "-1234567890.25", "-1234567890.25"),
    (1700, -1, "NaN", "NaN"), (1700, -1, "0.00000000000000000001", "0.00000000000000000001"),
    (25, -1, "ünï \"q\"", "ünï \"q\""), (1043, -1, "v", "v"), (1042, -1, "c  ", "c  "), (19, -1, "nm", "nm"),
    (18, -1, "x", "x"), (142, -1, "<a/>", "<a/>"), (114, -1, '{"a": [1]}', '{"a": [1]}'),
    (3802, -1, '{"a": [1]}', '{"a": [1]}'), (17, -1, "\\x00ff", "\\x00ff"),
    (1082, -1, "2024-03-04", "2024-03-04"), (1114, -1, "2024-03-04 05:06:07.5", "2024-03-04T05:06:07.500000"),
    (1184, -1, "2024-03-04 05:06:07+02", "2024-03-04T03:06:07+00:00"), (1083, -1, "23:59:59.999999", "23:59:59.999999"),
    (1266, -1, "04:05:06.5+05:30", "04:05:06.5+05:30"),
    (1186, -1, "1 year 2 mons 3 days 04:05:06.5", {"months": 14, "days": 3, "nanoseconds": 14706500000000}),
    (2950, -1, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    (1007, -1, "{1,NULL,3}", [1, None, 3]), (1022, -1, "{NaN,1.5}", ["NaN", 1.5]),
    (1231, -1, "{1.5,NaN}", ["1.5", "NaN"]), (1182, -1, "{2024-01-01,NULL}", ["2024-01-01", None]),
    (2951, -1, "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}", ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]),
    (1187, -1, "{\"1 day\"}", [{"months": 0, "days": 1, "nanoseconds": 0}]),
    (1001, -1, "{\"\\\\x01\"}", ["\\x01"]), (1009, -1, "{a,\"b c\"}", ["a", "b c"]),
]


def test_inspect_json_every_type(tmp_path, impl_name):
    """Every typed value has a strict JSON form (no NaN tokens, no traceback): Decimal, date, time, UUID, interval,
    bytes, floats that JSON cannot hold, lists of them."""
    from tests import wire_encoder as W

    cols = [W.Col("id", 23, -1, True)] + [W.Col(f"c{i}", oid, typmod) for i, (oid, typmod, _t, _j) in
                                          enumerate(_JSON_CASES)]
    rows = [["1"] + [text for (_o, _m, text, _j) in _JSON_CASES], ["2"] + [None] * len(_JSON_CASES)]
    msgs = [W.pgoutput("R", relid=7, namespace="public", name="every", columns=cols),
            W.pgoutput("B", final_lsn=0x200, commit_ts=0, xid=9)]
    msgs += [W.pgoutput("I", relid=7, new=row) for row in rows]
    msgs.append(W.pgoutput("C", commit_lsn=0x200, end_lsn=0x240, commit_ts=0))
    path = tmp_path / "every.spwf"
    write_frame_file(path, "pgoutput", [(0x100 + i, m) for i, m in enumerate(msgs)])
    proc = run("inspect", str(path), "--json", "--events-only", impl=impl_name)
    assert proc.returncode == 0, proc.stderr
    changes = [json.loads(ln, parse_constant=lambda c: pytest.fail(f"non-JSON token {c}"))
               for ln in proc.stdout.splitlines()]
    assert [c["values"]["id"] for c in changes] == [1, 2]
    for i, (oid, _m, text, expected) in enumerate(_JSON_CASES):
        assert changes[0]["values"][f"c{i}"] == expected, (oid, text)
        assert changes[1]["values"][f"c{i}"] is None
    text_mode = run("inspect", str(path), impl=impl_name)
    assert text_mode.returncode == 0 and "Traceback" not in text_mode.stderr, text_mode.stderr


def test_inspect_json_bundled_captures(impl_name):
    for capture in (PGOUTPUT, PGLOGICAL):
        proc = run("inspect", str(capture), "--json", impl=impl_name)
        assert proc.returncode == 0, proc.stderr
        assert all(json.loads(ln) for ln in proc.stdout.splitlines())


# ----------------------------------------------------------------------------------------- decode

def test_decode_writes_the_staging_layout(tmp_path, impl_name):
    out = tmp_path / "staging"
    proc = run("decode", str(PGOUTPUT), "--out", str(out), "--types", "raw", impl=impl_name)
    assert proc.returncode == 0, proc.stderr
    assert "staging commits: 1" in proc.stdout and "public.kinds" in proc.stdout
    oracle = oracle_summary(PGOUTPUT)          # the server's test_decoding output of the same changes
    expected = {t: sum(c[k] for k in ("insert", "upd_pre", "upd_post", "delete")) for t, c in oracle["tables"].items()}
    assert {t: read_staging(out, t).num_rows for t in list_tables(out)} == expected
    assert read_log(out)[-1]["committed_lsn"] == oracle["committed_lsn"]
    again = run("decode", str(PGOUTPUT), "-o", str(out), "--types", "raw", impl=impl_name)
    assert again.returncode == 0 and "skipped as already staged" in again.stdout
    assert len(read_log(out)) == 1


def test_decode_flushes_by_rows(tmp_path):
    out = tmp_path / "staging"
    proc = run("decode", str(DATA / "pgoutput_v2_binary_stream.spwf"), "--out", str(out), "--flush-rows", "100")
    assert proc.returncode == 0, proc.stderr
    assert len(read_log(out)) >= 2


def test_settings_from_env_and_config_file(tmp_path):
    out_file, out_env, out_flag = tmp_path / "from_file", tmp_path / "from_env", tmp_path / "from_flag"
    conf = tmp_path / "spockwire.toml"
    conf.write_text(f'types = "raw"\n[decode]\nout = "{out_file}"\ncompression = "snappy"\nflush-rows = 7\n')
    proc = run("decode", str(PGOUTPUT), "--config", str(conf))
    assert proc.returncode == 0, proc.stderr
    import pyarrow.parquet as pq

    first = read_log(out_file)[0]["files"][0]["path"]
    assert pq.ParquetFile(out_file / first).metadata.row_group(0).column(0).compression == "SNAPPY"
    proc = run("decode", str(PGOUTPUT), env={"SPOCKWIRE_CONFIG": str(conf), "SPOCKWIRE_OUT": str(out_env)})
    assert proc.returncode == 0 and out_env.is_dir() and str(out_env) in proc.stdout
    proc = run("decode", str(PGOUTPUT), "--out", str(out_flag), "--config", str(conf),
               env={"SPOCKWIRE_OUT": str(out_env)})
    assert proc.returncode == 0 and out_flag.is_dir()
    conf.write_text('[decode]\noutt = "x"\n')
    bad = run("decode", str(PGOUTPUT), "--config", str(conf))
    assert bad.returncode == 2 and "unknown setting 'outt'" in bad.stderr
    assert run("decode", str(PGOUTPUT), "--config", str(tmp_path / "nope.toml")).returncode == 2


def test_config_precedence_in_process(tmp_path):
    setting = cfgmod.Setting("flush_rows", "rows", type=cfgmod.positive_int, default=10)
    parser = argparse.ArgumentParser()
    cfgmod.add_settings(parser, [cfgmod.CONFIG, setting])
    conf = tmp_path / "c.toml"
    conf.write_text("flush_rows = 20\n[decode]\nflush-rows = 30\n")
    resolved = cfgmod.resolve(parser.parse_args([]), "decode", environ={})
    assert (resolved.flush_rows, resolved.source("flush_rows")) == (10, "default")
    resolved = cfgmod.resolve(parser.parse_args(["--config", str(conf)]), "inspect", environ={})
    assert (resolved.flush_rows, resolved.source("flush_rows")) == (20, "file")
    resolved = cfgmod.resolve(parser.parse_args(["--config", str(conf)]), "decode", environ={})
    assert resolved.flush_rows == 30
    env = {"SPOCKWIRE_FLUSH_ROWS": "40", "SPOCKWIRE_CONFIG": str(conf)}
    resolved = cfgmod.resolve(parser.parse_args([]), "decode", environ=env)
    assert (resolved.flush_rows, resolved.source("flush_rows")) == (40, "env")
    resolved = cfgmod.resolve(parser.parse_args(["--flush-rows", "50"]), "decode", environ=env)
    assert (resolved.flush_rows, resolved.source("flush_rows")) == (50, "flag")
    assert cfgmod.parse_size("64MiB") == 64 << 20 and cfgmod.parse_size("512k") == 512 << 10
    with pytest.raises(cfgmod.ConfigError):
        cfgmod.resolve(parser.parse_args(["--flush-rows", "-1"]), "decode", environ={})


# ----------------------------------------------------------------------------------------- errors

def test_missing_file_is_one_line_exit_1(tmp_path):
    assert_one_line_error(run("inspect", str(tmp_path / "nope.spwf")), "inspect", "No such file")
    assert_one_line_error(run("decode", str(tmp_path / "nope.spwf"), "--out", str(tmp_path / "o")), "decode",
                          "nope.spwf")
    assert_one_line_error(run("main", str(tmp_path)), "main", "is a folder")


def test_bad_frame_files_are_one_line_exit_1(tmp_path, impl_name):
    garbage = tmp_path / "garbage.spwf"
    garbage.write_bytes(b"this is not a frame file at all")
    assert_one_line_error(run("inspect", str(garbage), impl=impl_name), "inspect", "FrameError", "bad magic")
    cut = tmp_path / "cut.spwf"
    cut.write_bytes(PGOUTPUT.read_bytes()[:-7])
    assert_one_line_error(run("decode", str(cut), "--out", str(tmp_path / "o"), "--types", "raw", impl=impl_name),
                          "decode",
                          "FrameError", "truncated frame record")
    broken = tmp_path / "broken.spwf"
    write_frame_file(broken, "pgoutput", [(0x16B3748, b"B\x00\x00")])
    proc = run("inspect", str(broken), impl=impl_name)
    assert_one_line_error(proc, "inspect", "TruncatedMessage", "truncated 'B' message", "at LSN 0/16B3748")
    assert_one_line_error(run("decode", str(broken), "-o", str(tmp_path / "o2"), impl=impl_name), "decode",
                          "TruncatedMessage")
    assert not (tmp_path / "o2" / "_spockwire" / "log" / "00000000000000000001.json").exists()
    staging_in_the_way = tmp_path / "file"
    staging_in_the_way.write_text("x")
    assert_one_line_error(run("decode", str(PGLOGICAL), "--out", str(staging_in_the_way)), "decode",
                          "cannot create the staging folder")


def test_decode_column_type_overrides(tmp_path, impl_name):
    """--column-type (repeated, or comma-separated) reaches the decoder: those columns are staged as the text that
    arrived (this capture is in the text format). The capture holds a NaN in numeric(14,3): with
    --on-unrepresentable error only the override of that column lets it through."""
    out = tmp_path / "staging"
    proc = run("decode", str(PGOUTPUT), "--out", str(out), "--column-type", "public.kinds.nums=text",
               "--column-type", "public.kinds.ts=text,public.kinds.iv=raw,public.kinds.num=text",
               "--on-unrepresentable", "error",
               impl=impl_name)
    assert proc.returncode == 0, proc.stderr
    staged = read_staging(out, "public.kinds")
    raw = load_impl(impl_name).Decoder("pgoutput", types="raw")
    raw.feed_frames(read_frame_file(PGOUTPUT)[1])
    sent = [r for e in raw.drain() if getattr(e, "relation", None) is not None and e.relation.name == "kinds"
            for r in e.to_pylist()]
    for col in ("nums", "ts", "iv", "num"):
        assert staged.schema.field(col).type == pa.string()
        assert staged.column(col).to_pylist() == [r[col] for r in sent]
    bad = run("decode", str(PGOUTPUT), "--out", str(tmp_path / "x"), "--column-type", "kinds.nums=text",
              impl=impl_name)
    assert bad.returncode == 2 and "schema.table.column" in bad.stderr


# ----------------------------------------------------------------------------------------- the oracle

def oracle_summary(capture: Path) -> dict:
    """What the server's own test_decoding output (tests/data/<capture>.test_decoding.txt, read from a second slot
    of the same slot contents) says a capture holds: per table the count of each change kind as the `main`
    summary names them, the truncates and messages, and the end LSN of the last commit."""
    from collections import Counter

    from tests.oracles import changes_of, group_transactions, read_test_decoding

    txns = group_transactions(read_test_decoding(capture.with_suffix(".test_decoding.txt")))
    tables: dict[str, Counter] = {}
    truncates, messages = 0, Counter()
    for change in changes_of(txns):
        action = change["action"]
        if action == "message":
            messages[change["transactional"]] += 1
        elif action == "truncate":
            truncates += 1
            for table in change["tables"]:
                tables.setdefault(table, Counter())["truncate"] += 1
        else:
            kinds = tables.setdefault(change["table"], Counter())
            if action == "update":
                kinds["upd_post"] += 1
                kinds["upd_pre"] += change["old"] is not None
            else:
                kinds[action] += 1
    committed = max(t.end_lsn for t in txns if t.end in ("commit", "commit_prepared"))
    return {"tables": tables, "truncates": truncates, "messages": messages, "committed_lsn": committed}
