"""Turn pytest-benchmark JSON into BENCHMARKS.md: a summary of ratios against the peers, the charts, then the tables.

    python benchmarks/report.py [RUN.json] [--pipeline PIPELINE.json] [--out BENCHMARKS.md]

Without RUN.json the stored runs are used (benchmarks/runs.py: benchmarks/results/bench_run.json, and the newest
pipeline run). One statistic everywhere: rows/s and MB/s come from the median round of each benchmark
(pytest-benchmark's ``median``, or the median measured inside a peer's process or a benchmark's own loop, passed as
``extra_info["seconds"]``); every row also gets its ratio to other rows of its table, so the claims are ratios
measured in one run, not absolute times. The charts (benchmarks/charts.py) are drawn from the same runs.

Benchmarks of bench_peers.py (``extra_info["role"]``) get one table per captured workload: rows/s, MB/s of the
row's own input, its ratio to each peer's rows/s and its speed as a fraction of copying the same bytes (memcpy).
Benchmarks of bench_e2e.py / bench_connection.py get one end-to-end table (rows/s, client CPU, ratio to the
server's decode rate). A time in ``extra_info["seconds"]`` (measured inside another process, or the timed part of
a round) takes the place of the round's minimum. Dated analyses are not part of it: benchmarks/analysis.md.
"""
from __future__ import annotations

import argparse
import platform
from collections import defaultdict
from pathlib import Path
from typing import Any

try:
    from . import runs
except ImportError:          # run as a script: benchmarks/ is on sys.path
    import runs  # type: ignore[no-redef]

#: the charts benchmarks/charts.py draws, in the order BENCHMARKS.md shows them: (file, alt text)
CHARTS = (("bench_headline.svg", "Decoding the narrow workload: spockwire against every peer, rows/s"),
          ("bench_decode.svg", "Decoding the same captured changes: spockwire against its peers, six workloads"),
          ("bench_live.svg", "Streaming from a live slot: rows/s against pg_recvlogical and the server's own decode"),
          ("bench_snapshot.svg", "Reading a whole table: read_table against ADBC, connectorx and the raw COPY"),
          ("bench_pipeline.svg", "The Spark pipeline into Delta: measured rates against targets and anchors"),
          ("bench_soak.svg", "500 micro-batches with state collection and OPTIMIZE: seconds, state rows, files"),
          ("bench_many_tables.svg", "Many tables under pgbench: commit-to-Delta lag and micro-batch seconds over the "
           "run"))
#: charts shown in their own section, not among the summary's
SECTION_CHARTS = ("bench_many_tables.svg",)
IMAGES = "docs/images"
#: render()'s default for the many-tables run: the one kept in benchmarks/results/ (runs.load_many_tables)
STORED = object()


def _machine(info: dict) -> str:
    cpu = info.get("cpu", {})
    return (f"{cpu.get('brand_raw', platform.processor() or 'unknown CPU')}, {cpu.get('count', '?')} cores, "
            f"Python {info.get('python_version', platform.python_version())}, {info.get('system', '')} "
            f"{info.get('release', '')}")


def render(data: dict, pipeline_run: dict | None = None, soak: dict | None = None,
           many_tables: Any = STORED) -> str:
    """BENCHMARKS.md from a run; the pipeline section from `pipeline_run` when given (a run of its own); the soak
    section from `soak` (benchmarks/bench_soak.py's record); the many-tables section from `many_tables` (a run of
    benchmarks/bench_many_tables.py; by default the kept one, else `data`'s own)."""
    if many_tables is STORED:
        many_tables = runs.load_many_tables()
    groups: dict[str, list[dict]] = defaultdict(list)
    peers = [b for b in data["benchmarks"] if runs.is_peer(b)]
    e2e = [b for b in data["benchmarks"] if runs.is_e2e(b)]
    snapshot = [b for b in data["benchmarks"] if runs.is_snapshot(b)]
    pipeline = [b for b in (pipeline_run or data)["benchmarks"] if runs.is_pipeline(b)]
    for bench in data["benchmarks"]:
        if runs.is_peer(bench) or runs.is_e2e(bench) or runs.is_snapshot(bench) or runs.is_pipeline(bench) \
                or runs.is_many_tables(bench) or runs.is_hot_keys(bench):
            continue
        groups[bench.get("group") or bench["name"]].append(bench)
    lines = ["# Benchmarks", "",
             "spockwire measured beside the tools people use for the same job, in one run on one machine, stated as "
             "ratios: decoding captured changes (pypgoutput, wal2json + JSON, Node's pg-logical-replication, a "
             "memcpy of the same bytes), streaming from a live slot (pg_recvlogical, the server's own decode), "
             "reading whole tables (ADBC, connectorx, the raw COPY transfer) and the Spark pipeline into Delta. "
             "Every figure is the median of its rounds. `scripts/bench.sh` runs it all and writes this file and "
             "the charts (docs/images/) from the runs it keeps in benchmarks/results/; dated analyses (profiles, "
             "instruction counts, before/after comparisons) are in benchmarks/analysis.md, newest first.", "",
             f"Machine: {_machine(data.get('machine_info', {}))}. Run: {data.get('datetime', '')}.", ""]
    lines += _setup_lines(data, peers + e2e)
    lines += _summary(peers, e2e, snapshot, pipeline, pipeline_run)
    lines += _peer_sections(peers) + _e2e_section(e2e) + _snapshot_section(snapshot)
    lines += _pipeline_section(pipeline, pipeline_run)
    lines += _many_tables_section([b for b in (many_tables or data)["benchmarks"] if runs.is_many_tables(b)],
                                  many_tables)
    lines += _soak_section(soak)
    lines += _failover_section(runs.load_failover())
    lines += _hot_keys_section(runs.load_hot_keys())
    if groups:
        lines += ["## Synthetic decode workloads", "",
                  "Each table is one workload measured in one run; `ratio` is the row's rows/s divided by the "
                  "slowest row's rows/s in the same table.", ""]
    for group, benches in sorted(groups.items()):
        rows = []
        for b in benches:
            extra = b.get("extra_info", {})
            best = b["stats"]["median"]
            n = extra.get("rows")
            size = extra.get("bytes")
            label = extra.get("label") or " ".join(str(extra[k]) for k in ("implementation", "types") if k in extra)
            # a benchmark that times only its busy part (e.g. ingest up to its last staging commit) says so in
            # extra_info["rows_per_s"]
            rps = extra.get("rows_per_s") or (n / best if n else None)
            rows.append((label or b["name"], rps, size / best / 1e6 if size else None, best))
        slowest = min((r[1] for r in rows if r[1]), default=None)
        lines += [f"### {group}", "", "| implementation | rows/s | MB/s | median time (s) | ratio |", "|---|---:|---:|---:|---:|"]
        for label, rps, mbs, best in sorted(rows, key=lambda r: -(r[1] or 0)):
            ratio = f"{rps / slowest:.1f}x" if rps and slowest else ""
            mb_cell = f"{mbs:,.0f}" if mbs else ""
            lines.append(f"| {label} | {rps:,.0f} | {mb_cell} | {best:.4f} | {ratio} |" if rps else
                         f"| {label} | | | {best:.4f} | |")
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# peers (bench_peers.py) and end-to-end (bench_e2e.py, bench_connection.py)

def _seconds(bench: dict) -> float:
    extra = bench.get("extra_info", {})
    return float(extra["seconds"]) if extra.get("seconds") else float(bench["stats"]["median"])


def _fmt_ratio(x: float) -> str:
    return f"{x:.2f}x" if x < 10 else f"{x:.0f}x"


def _setup_lines(data: dict, benches: list[dict]) -> list[str]:
    info = data.get("machine_info", {})
    extras = [b.get("extra_info", {}) for b in benches]
    servers = sorted({e["server_version"] for e in extras if e.get("server_version")})
    versions = sorted({e["version"] for e in extras if e.get("version")})
    out = []
    if info.get("memory_gb"):
        load = info.get("loadavg_at_start")
        out.append(f"Memory: {info['memory_gb']} GB. Load average when the run started: "
                   f"{', '.join(str(x) for x in load) if load else 'unknown'} (the machine was shared with other "
                   f"work, so absolute numbers are noisy; every table compares rows measured in the same run).")
    if servers:
        out.append(f"PostgreSQL: {', '.join(servers)}.")
    if versions:
        out.append(f"Peers: {'; '.join(versions)}.")
    return [" ".join(out), ""] if out else []


def _peer_rows(benches: list[dict]) -> list[dict]:
    rows = []
    for b in benches:
        e = b["extra_info"]
        t = _seconds(b)
        rows.append(dict(label=e.get("label") or b["name"], input=e.get("input", ""), role=e.get("role"),
                         peer=e.get("peer"), rps=e["rows"] / t, mbs=e["bytes"] / t / 1e6, seconds=t))
    return rows


def _peer_sections(benches: list[dict]) -> list[str]:
    if not benches:
        return []
    by_workload: dict[str, list[dict]] = defaultdict(list)
    for b in benches:
        by_workload[b["extra_info"]["workload"]].append(b)
    order = sorted(by_workload, key=lambda w: by_workload[w][0]["extra_info"].get("workload_index", 99))
    tables: dict[str, list[dict]] = {w: _peer_rows(by_workload[w]) for w in order}
    peer_names = list(dict.fromkeys(r["peer"] for w in order for r in tables[w] if r["role"] == "peer"))

    lines = ["## Decode only: spockwire and its peers on the same captured changes", "",
             "Each workload was captured once from the throwaway PostgreSQL 15 at benchmark setup "
             "(benchmarks/captured.py): pgoutput text and binary format from one slot, wal2json format-version 2 "
             "from a second slot created at the same LSN. Every row below decodes the same committed changes held "
             "in memory. `rows/s` counts row changes (INSERT/UPDATE/DELETE); `MB/s` is over the row's own input "
             "(frame records for pgoutput, JSON lines for wal2json); `× peer` is the row's rows/s divided by the "
             "peer's; `of memcpy` is the row's MB/s as a fraction of copying the same input bytes into a buffer "
             "allocated beforehand (numpy.copyto). spockwire rows include building the Arrow record batches.", ""]

    # headline: spockwire C against every peer, each on the peer's terms
    text_peers = [p for p in peer_names if not any(r["peer"] == p and r["input"] == "pgoutput-binary"
                                                   for w in order for r in tables[w])]
    binary_peers = [p for p in peer_names if p not in text_peers]
    lines += ["### All workloads", "",
              "spockwire C with `types=\"typed\"` (Arrow columns of the PostgreSQL types) against each peer that "
              "decodes text-format pgoutput or wal2json; spockwire C with `types=\"raw\"` against the peer that "
              "hands binary-format values over undecoded.", ""]
    head = ["workload", "C typed text rows/s"] + [f"× {p}" for p in text_peers] + \
        [f"C raw binary × {p}" for p in binary_peers] + ["C typed text, of memcpy", "fastest peer",
                                                         "C typed text, views × fastest",
                                                         "C typed binary, views × fastest"]
    lines += ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for w in order:
        text = next((r for r in tables[w] if r["label"] == "spockwire C, typed, text"), None)
        raw_binary = next((r for r in tables[w] if r["label"] == "spockwire C, raw, binary"), None)
        if text is None:
            continue
        peers = {r["peer"]: r for r in tables[w] if r["role"] == "peer"}
        floor = next((r for r in tables[w] if r["role"] == "floor" and r["input"] == text["input"]), None)
        cells = [w, f"{text['rps']:,.0f}"]
        cells += [_fmt_ratio(text["rps"] / peers[p]["rps"]) if p in peers else "" for p in text_peers]
        cells += [_fmt_ratio(raw_binary["rps"] / peers[p]["rps"]) if p in peers and raw_binary else ""
                  for p in binary_peers]
        cells.append(f"{text['mbs'] / floor['mbs']:.3f}" if floor else "")
        fastest = max(peers.values(), key=lambda r: r["rps"], default=None)
        views = next((r for r in tables[w] if r["label"] == "spockwire C, typed, text, views"), None)
        typed_binary = next((r for r in tables[w] if r["label"] == "spockwire C, typed, binary, views"), None)
        cells.append(f"{fastest['label']} ({fastest['rps']:,.0f})" if fastest else "")
        cells += [_fmt_ratio(r["rps"] / fastest["rps"]) if r and fastest else "" for r in (views, typed_binary)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "`fastest peer` is the peer with the most rows/s on the workload, whatever its input format; the "
              "last two columns compare spockwire's typed decoding (values parsed into Arrow types) against it: "
              "text and binary format, both with `strings=\"view\"`.", ""]

    for w in order:
        first = by_workload[w][0]["extra_info"]
        lines += [f"### {w}: {first.get('description', '')}", ""]
        rows = tables[w]
        peers = {r["peer"]: r for r in rows if r["role"] == "peer"}
        floors = {r["input"]: r for r in rows if r["role"] == "floor"}
        head = ["implementation", "input", "rows/s", "MB/s"] + [f"× {p}" for p in peer_names if p in peers] + \
            ["of memcpy"]
        lines += ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
        for r in sorted(rows, key=lambda r: (r["role"] == "floor", -r["rps"])):
            cells = [r["label"], r["input"], f"{r['rps']:,.0f}", f"{r['mbs']:,.0f}"]
            cells += ["" if r["role"] == "floor" or r["peer"] == p else _fmt_ratio(r["rps"] / peers[p]["rps"])
                      for p in peer_names if p in peers]
            floor = floors.get(r["input"])
            cells.append("1" if r["role"] == "floor" else (f"{r['mbs'] / floor['mbs']:.3f}" if floor else ""))
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    notes = list(dict.fromkeys(b["extra_info"]["note"] for b in benches if b["extra_info"].get("note")))
    if notes:
        lines += ["### What the peers do", ""] + [f"- {n}" for n in notes] + [""]
    return lines


E2E_LABELS = {
    "test_server_decode": "server decode (pg_logical_slot_peek_binary_changes, counted on the server)",
    "test_pg_recvlogical": "pg_recvlogical (the server's client, output to /dev/null)",
    "test_pgoutput_decoder": "pgoutput-decoder (Rust, PyPI; Python 3.12), rows as dicts",
    "test_stream[c]": "spockwire stream, replication, Cython pump, Arrow batches",
    "test_stream[python]": "spockwire stream, replication, pure-Python pump, Arrow batches",
    "test_sql_transport[c]": "spockwire stream, sql transport, Cython pump, Arrow batches",
    "test_sql_transport[python]": "spockwire stream, sql transport, pure-Python pump, Arrow batches",
    "test_psycopg2_callback": "psycopg2 consume_stream, callback feeding spockwire per message",
    "test_psycopg2_noop_callback": "psycopg2 consume_stream, no-op callback",
}


def _e2e_name(name: str) -> str:
    """``test_stream[pg15-c]`` -> ``test_stream[c]``, ``test_server_decode[pg18]`` -> ``test_server_decode``."""
    if "[" not in name:
        return name
    base, param = name[:-1].split("[", 1)
    rest = [p for p in param.split("-") if not (p.startswith("pg") and p[2:].isdigit())]
    return f"{base}[{'-'.join(rest)}]" if rest else base


def _e2e_section(benches: list[dict]) -> list[str]:
    if not benches:
        return []
    n = benches[0].get("extra_info", {}).get("rows", 0)
    lines = ["## End to end from a live slot", "",
             f"{n:,} rows in transactions of 1,000 (pgoutput protocol 1, text; benchmarks/bench_connection.py, run "
             "by benchmarks/bench_e2e.py on one slot per server). The server and the client share the machine. "
             "Median of the rounds. `client CPU` is the client process's (or the peer process's) user + system "
             "seconds per wall second; `× server decode` is the row's rows/s divided by the rate at which the "
             "server decodes the same slot (`pg_logical_slot_peek_binary_changes`), `× pg_recvlogical` by the "
             "rate of the server's own client on a copy of the same slot.", ""]
    by_server: dict[int, list[dict]] = defaultdict(list)
    for b in benches:
        by_server[int(b.get("extra_info", {}).get("server_major", 0))].append(b)
    for major in sorted(by_server):
        rows = []
        for b in by_server[major]:
            e = b.get("extra_info", {})
            t = _seconds(b)
            name = _e2e_name(b["name"])
            rows.append((E2E_LABELS.get(name, name), e.get("rows", 0) / t, e.get("messages", 0) / t,
                         e.get("client_cpu_cores"), name))
        server = next((r[1] for r in rows if r[4] == "test_server_decode"), None)
        recv = next((r[1] for r in rows if r[4] == "test_pg_recvlogical"), None)
        version = next((b["extra_info"]["server_version"] for b in by_server[major]
                        if b.get("extra_info", {}).get("server_version")), "")
        if major:
            lines += [f"### PostgreSQL {version or major}", ""]
        lines += ["| consumer | rows/s | messages/s | client CPU (cores) | × server decode | × pg_recvlogical |",
                  "|---|---:|---:|---:|---:|---:|"]
        for label, rps, mps, cpu, _ in sorted(rows, key=lambda r: -r[1]):
            ratio = f"{rps / server:.2f}" if server else ""
            vs_recv = f"{rps / recv:.2f}" if recv else ""
            lines.append(f"| {label} | {rps:,.0f} | {mps:,.0f} | {'' if cpu is None else f'{cpu:.2f}'} | {ratio} | "
                         f"{vs_recv} |")
        lines.append("")
    return lines


SNAPSHOT_LABELS = {
    "raw_copy": "raw COPY transfer (no decoding)",
    "spockwire_w1": "spockwire `read_table`, 1 connection",
    "spockwire_w2": "spockwire `read_table`, 2 workers",
    "adbc": "ADBC (`adbc-driver-postgresql`)",
    "connectorx_p1": "connectorx, 1 partition",
    "connectorx_p2": "connectorx, 2 partitions",
}


def _snapshot_section(benches: list[dict]) -> list[str]:
    """bench_snapshot.py: whole-table reads, as ratios to the raw COPY transfer and to ADBC in the same run."""
    if not benches:
        return []
    lines = [f"## {benches[0].get('group') or 'snapshot read'}", "",
             "Each reader's median of rounds run in rotating order in one run; `vs raw COPY` is its rows/s divided "
             "by the rows/s of moving the same `COPY ... (FORMAT binary)` bytes into the process undecoded.", "",
             "| reader | rows/s | median time (s) | vs raw COPY | vs ADBC |", "|---|---:|---:|---:|---:|"]
    for b in sorted(benches, key=lambda b: -b["extra_info"].get("rows_per_s", 0)):
        e = b["extra_info"]
        e = dict(e, snapshot_reader=SNAPSHOT_LABELS.get(e["snapshot_reader"], e["snapshot_reader"]))
        raw = e.get("ratio_to_raw_copy")
        adbc = e.get("ratio_to_adbc")
        lines.append(f"| {e['snapshot_reader']} | {e['rows_per_s']:,.0f} | {e['seconds']:.3f} | "
                     f"{_fmt_ratio(raw) if raw else ''} | {_fmt_ratio(adbc) if adbc else ''} |")
    return lines + [""]


#: the order of the pipeline's measurements: the rates at sizes where the job's fixed cost is small beside its
#: work, the secondary ones, then the micro-batch, the lag and the memory
PIPELINE_ORDER = ("big_snapshot", "changes", "changes_history", "snapshot", "changes_small", "fixed_cost", "lag",
                  "memory")
#: the order of a run whose rates are net of an empty-source run (bench_pipeline.py before "ready to done")
NET_ORDER = ("snapshot", "changes", "changes_history", "fixed_cost", "lag", "memory", "big_snapshot")


def is_ready_to_done(infos: list[dict]) -> bool:
    """The run times its rates from ready to done (bench_pipeline.py's TIMING), not net of an empty source."""
    return any(i.get("timing") == "ready_to_done" for i in infos)


def _fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return ""
    if unit.endswith("/s"):
        return f"{value:,.0f} {unit}"
    if unit == "GB":
        return f"{value:.2f} GB"
    return f"{value:.3f} {unit}"


def _pipeline_section(benches: list[dict], own_run: dict | None = None) -> list[str]:
    """bench_pipeline.py: the Spark pipeline into Delta (the job as a child process, local[2]), each measurement
    against its target and against anchors measured in the same run (`own_run`: a run of its own, named)."""
    if not benches:
        return []
    # a phase that failed after its timed part has no extra_info["pipeline"]: listed by name, without figures
    failed = [b["name"] for b in benches if not isinstance(b.get("extra_info", {}).get("pipeline"), dict)]
    infos = pipeline_infos([b for b in benches if b["name"] not in failed])
    if not is_ready_to_done(infos):
        return _net_pipeline_section(infos, failed, own_run)
    lines = ["## Pipeline into Delta", "",
             _pipeline_job(infos) + "One pass of each phase, each building on the last; after "
             "every phase the Delta table equals the source table (checked, or the benchmark fails). The first rows "
             "are at sizes where the job's fixed cost (below) is small beside its work; the smaller snapshot and "
             "backlog are secondary.", "",
             "Every rate is rows (or changes) / **ready to done**: the time from the moment the tool is ready to "
             "read to the durable commit of the last row in its target. For the job: from its streaming query's "
             "start to the line of its last micro-batch holding rows of the table, which it prints right after "
             "that micro-batch's Delta commits; in every run this time is at least the work its micro-batches "
             "report (their own `seconds`; checked, or the benchmark fails). For `spockwire ingest`, the backlogs' "
             "anchor, from a copy of the job's slot (pg_copy_logical_replication_slot: the same WAL): from its "
             "`start` log line, written once its staging folder is open and right before it opens the replication "
             "stream, to the `created_at` of its last staging commit that wrote files (stamped once the commit's "
             "Parquet files are durable, as its log entry is written). `spockwire.read_table` and "
             "`deltalake.write_deltalake`: the call, in the benchmark's process. **Gross**, beside it in the second "
             "table: from the process's launch to the same last commit. `ratio` is measured / anchor: for a rate "
             "the fraction of the anchor's rate, for a time the multiple of the anchor's time."
             + (_own_run_note(own_run) if own_run else ""), ""]
    lines += _fixed_cost_line(infos)
    lines += _measurement_table(infos, failed)
    ratios = _job_against_readers(infos)
    if ratios:
        lines += ["", "The job against spockwire's own readers, each timed from ready to done:", "",
                  "| the job | rate | the reader | rate | ratio |", "|---|---:|---|---:|---:|"]
        lines += [f"| {job} | {ours} | {reader} | {theirs} | {ratio} |" for job, ours, reader, theirs, ratio in ratios]
    lines += ["", "| measurement | ready to done (s) | of it, before the first micro-batch (s) | start to ready (s) "
              "| gross: start to done (s) | gross rate | start to exit (s) | runs | micro-batches | their own seconds "
              "| peak RSS of the job (GB) | peak PSS (GB) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for i in infos:
        job = i.get("job") or {}
        runs_n = len(i.get("ready_to_done_runs_s") or [])
        cells = [_num(i.get("ready_to_done_s")), _num(i.get("ready_to_first_batch_s")),
                 _num(i.get("start_to_ready_s")), _num(i.get("gross_s")),
                 f"{i['gross_rate']:,}" if i.get("gross_rate") else "", _num(i.get("wall_s")),
                 str(runs_n or ""), str(job.get("batches", "")), _num(job.get("batch_seconds")),
                 f"{i['peak_rss_bytes'] / 1e9:.2f}" if i.get("peak_rss_bytes") else
                 (f"{i['measured']:.2f}" if i.get("unit") == "GB" else ""),
                 f"{i['peak_pss_bytes'] / 1e9:.2f}" if i.get("peak_pss_bytes") else ""]
        lines.append(f"| {i['label']} | " + " | ".join(cells) + " |")
        ing = i.get("ingest")
        if ing:
            lines.append(f"| anchor: spockwire ingest, the same {i.get('changes', 0):,} changes | "
                         f"{_num(ing.get('ready_to_done_s'))} | | {_num(ing.get('start_to_ready_s'))} | "
                         f"{_num(ing.get('gross_s'))} | {ing.get('gross_rate', 0):,} | {_num(ing.get('wall_s'))} "
                         "| 1 | | | | |")
    notes = ["Ready to done, start to ready, gross and start to exit: medians over the runs (the snapshots: each "
             "on a slot and target of its own; a backlog: its job's runs from copies of its slot, checkpoint and "
             "tables, then its last run). Their own seconds: the sum of the last run's micro-batches' `seconds` "
             "(each from the call of the micro-batch's function to its Delta commits). A snapshot's micro-batches "
             "but its last are written while Spark reads the next one (`deferred`), so over several micro-batches "
             "the sum is more than the time they span; the check counts only such a micro-batch's read.",
             "Peak RSS: the peak, sampled every 0.2 s, of the sum of the resident set sizes of the job's processes "
             "(its process group and their descendants: the Python driver, the JVM, Spark's Python workers); a page "
             "shared by forked Python workers counts once per worker. Peak PSS counts it once (read at each new "
             "peak of the RSS and once a second).",
             "spockwire ingest's start to exit includes the 5 s it waits with nothing to read before it exits "
             "(`--idle-exit 5`)."]
    for i in infos:
        notes += _phase_notes(i)
        if i.get("ingest"):
            notes.append(f"{i['label']}: spockwire ingest wrote its files in "
                         f"{_count(i['ingest'].get('commits', 0), 'staging commit')}.")
        if i.get("key") in ("changes", "changes_small", "memory") and i.get("backlog_write_s"):
            notes.append(f"{i['label'].split(':')[0]}: the backlog (transactions of 600 updates spread over the table, 200 "
                         f"deletes, 200 inserts) was written in {i['backlog_write_s']:.1f} s while no job ran.")
    return lines + [""] + [f"- {n}" for n in notes] + [""]


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}" + ("" if n == 1 else "s")


def _fixed_cost_line(infos: list[dict]) -> list[str]:
    """The job's fixed cost, from its runs on an empty source: start to ready and stop."""
    parts = []
    for key, name, what in (("fixed_first_start", "a first start", "a snapshot of a 0-row table"),
                            ("fixed_restart", "a restart", "from its checkpoint, nothing of the table to read")):
        for i in infos:
            f = i.get(key)
            if f:
                with_history = " with --history" if i.get("key") == "changes_history" else ""
                stop = (f"stop {_num(f['stop_s'])} s, the query's start to its first micro-batch "
                        f"{_num(f.get('ready_to_first_batch_s'))} s" if f.get("stop_s") is not None
                        else "no micro-batch")
                parts.append(f"{name}{with_history} ({what}; {_count(f['runs'], 'run')}): start to ready "
                             f"{_num(f['start_to_ready_s'])} s, {stop}")
    if not parts:
        return []
    return ["**The job's fixed cost**, medians of its runs on an empty source (start to ready: from the process's "
            "launch to its streaming query's start -- the JVM, the Spark session, registering the sources; stop: "
            "from the line of its last micro-batch to the process's exit): " + "; ".join(parts) + ". The query's "
            "start to its first micro-batch (Spark starting the source, the job's check of Spark's Python workers, "
            "which the first micro-batch waits for, the micro-batch's planning) is part of the job's start that "
            "every ready to done includes.", ""]


def _measurement_table(infos: list[dict], failed: list[str], net: bool = False) -> list[str]:
    lines = ["| measurement | target | measured | anchor measured in the same run | ratio | met |",
             "|---|---|---:|---|---:|---|"]
    for i in infos:
        anchors = i.get("anchors") or []
        anchor_cell = "<br>".join(f"{a['label']}: {_fmt_value(a.get('value'), a.get('unit', ''))}" for a in anchors)
        ratio_cell = "<br>".join(f"{a['ratio']:.3f}" if a.get("ratio") is not None else "" for a in anchors)
        met = i.get("met")
        measured = _fmt_value(i.get("measured"), i.get("unit", ""))
        if net and i.get("measured") is None and i.get("net_s") is not None and i["net_s"] <= 0:
            measured = "not measurable: net time <= 0 (within the noise of the job's own start and stop)"
        lines.append(f"| {i['label']} | {i.get('target', '')} | {measured} "
                     f"| {anchor_cell} | {ratio_cell} | {'met' if met else 'not met' if met is not None else ''} |")
    return lines + [f"| {name} | | no result: the benchmark failed | | | |" for name in failed]


def _job_against_readers(infos: list[dict]) -> list[tuple[str, str, str, str, str]]:
    """(the job's measurement, its rate, the reader, its rate, the ratio): the snapshot against
    spockwire.read_table, each backlog against spockwire ingest, from a run timed from ready to done."""
    rows = []
    readers = {"big_snapshot": "spockwire.read_table", "changes": "spockwire ingest",
               "changes_history": "spockwire ingest"}
    for i in infos:
        reader = readers.get(i.get("key"))
        a = next((a for a in i.get("anchors") or [] if reader and a["label"].startswith(reader)), None)
        if a and a.get("ratio") is not None:
            rows.append((i["label"], _fmt_value(i["measured"], i.get("unit", "")), a["label"],
                         _fmt_value(a.get("value"), a.get("unit", "")), f"{a['ratio']:.3f}"))
    return rows


def _phase_notes(i: dict) -> list[str]:
    """The notes of the micro-batch's fixed cost and of the lag, the same in every run."""
    if i.get("key") == "fixed_cost":
        return [f"Fixed cost: median of {i.get('rounds')} rounds of the batches' own `seconds` (from "
                "reading the micro-batch to its Delta commit); from the source's commit to the batch's "
                f"line: {_num(i.get('one_change_commit_to_line_s'))} s with one change, "
                f"{_num(i.get('empty_commit_to_line_s'))} s empty (the trigger interval included)."]
    if i.get("key") == "lag":
        job = i.get("job") or {}
        own = (f"; the job's own lag_p95: median {job['lag_p95']['median']} s, max {job['lag_p95']['max']} s"
               if isinstance(job.get("lag_p95"), dict) else "")
        return [f"Lag: {i.get('transactions', 0):,} transactions of 1,000 changes, written at "
                f"{i.get('write_rate_achieved', 0):,} changes/s (paced to "
                f"{i.get('write_rate_target', 0):,.0f}); p50 {_num(i.get('lag_p50_s'))} s, max "
                f"{_num(i.get('lag_max_s'))} s. A transaction's lag is the time the job printed the line "
                "of the micro-batch holding it (right after its Delta commit) minus the time its COMMIT "
                f"returned to the writer{own}."]
    return []


def _pipeline_job(infos: list[dict]) -> str:
    """The pipeline section's first sentence: the job as it was run."""
    master = infos[0].get("master", "local[2]") if infos else "local[2]"
    return (f"`python -m spockwire.spark.job` on `{master}` as users run it (a child process: the Python driver, "
            "its JVM and Spark's Python workers), from a throwaway PostgreSQL 15 into Delta tables through "
            "`deltalake` (benchmarks/bench_pipeline.py). ")


def _net_pipeline_section(infos: list[dict], failed: list[str], own_run: dict | None) -> list[str]:
    """The section of a run whose rates are net of an empty-source run (bench_pipeline.py before "ready to
    done"), in that run's own terms."""
    lines = ["## Pipeline into Delta", "",
             _pipeline_job(infos) + "One pass of each phase, in this order, each building on "
             "the last; after every phase the Delta table equals the source table (checked, or the benchmark "
             "fails). `net` is the job's time from its streaming query's start to its exit minus the same of the same "
             "command on an empty source (a table of 0 rows; a restart from the checkpoint with no change of the "
             "table to read), medians of their runs in the same run: what comes before the query's start (the JVM, "
             "the Spark session, registering the sources) is the same work with or without rows and varies by "
             "seconds from run to run on this machine, so it is left out of both (the check of Spark's Python "
             "workers runs beside the query and is counted); the wall times and their difference are in the second "
             "table. "
             "`ratio` is "
             "measured / anchor: for a rate the fraction of the anchor's rate, for a time the multiple of the "
             "anchor's time." + (_own_run_note(own_run) if own_run else ""), ""]
    lines += _measurement_table(infos, failed, net=True)
    lines += ["", "| measurement | gross (s) | empty source (s) | net of the walls (s) | before the query's start: "
              "job, empty (s) | net (s) | micro-batches | their own seconds | peak RSS of the job (GB) | peak PSS (GB) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for i in infos:
        job = i.get("job") or {}
        starts = (f"{_num(i.get('start_s'))}, {_num(i.get('empty_start_s'))}"
                  if i.get("start_s") is not None else "")
        cells = [_num(i.get("gross_s")), _num(i.get("empty_s") if not isinstance(i.get("empty_s"), list) else None),
                 _num(i.get("wall_net_s")), starts, _num(i.get("net_s")), str(job.get("batches", "")),
                 _num(job.get("batch_seconds")),
                 f"{i['peak_rss_bytes'] / 1e9:.2f}" if i.get("peak_rss_bytes") else
                 (f"{i['measured']:.2f}" if i.get("unit") == "GB" else ""),
                 f"{i['peak_pss_bytes'] / 1e9:.2f}" if i.get("peak_pss_bytes") else ""]
        lines.append(f"| {i['label']} | " + " | ".join(cells) + " |")
    notes = ["Their own seconds: the sum of the last run's micro-batches' `seconds` (each from reading the "
             "micro-batch to its Delta commit), a cross-check of `net`; a snapshot's micro-batches but its last are "
             "written while Spark reads the next one (`deferred`), so over several micro-batches the sum is more than "
             "the time they span. Gross and empty source: medians of the wall times of the runs "
             "(the snapshot: as many runs of each, alternating; a backlog: its job's runs from copies of its slot, "
             "checkpoint and tables, then its last run).",
             "Peak RSS: the peak, sampled every 0.2 s, of the sum of the resident set sizes of the job's processes "
             "(its process group and their descendants: the Python driver, the JVM, Spark's Python workers); a page "
             "shared by forked Python workers counts once per worker. Peak PSS counts it once (read at each new peak of "
             "the RSS and once a second)."]
    for i in infos:
        notes += _phase_notes(i)
        if i.get("key") in ("changes", "changes_history") and i.get("ingest"):
            ing = i["ingest"]
            notes.append(f"Ingest anchor: `spockwire ingest` from a copy of the job's slot "
                         f"(pg_copy_logical_replication_slot, the same WAL), {ing.get('seconds')} s from its start to "
                         "its last staging commit.")
        if i.get("key") in ("changes", "memory") and i.get("backlog_write_s"):
            notes.append(f"{i['label'].split(':')[0]}: the backlog (transactions of 600 updates spread over the "
                         "table, 200 deletes, 200 inserts) was written in "
                         f"{i['backlog_write_s']:.1f} s while no job ran.")
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return lines + [""]


def many_tables_info(benches: list[dict]) -> dict | None:
    """The figures of benchmarks/bench_many_tables.py (``extra_info["many_tables"]``), None without them."""
    return next((b["extra_info"]["many_tables"] for b in benches
                 if isinstance(b.get("extra_info", {}).get("many_tables"), dict)), None)


def _many_tables_section(benches: list[dict], own_run: dict | None) -> list[str]:
    """bench_many_tables.py: the job over a whole publication of 103 tables while pgbench and a writer run, with one
    migration; its lag against the target, the micro-batches' seconds, memory, and where the time went."""
    if not benches:
        return []
    i = many_tables_info(benches)
    if i is None:
        return ["## Many tables under pgbench", "",
                f"No result: {benches[0]['name']} failed (benchmarks/bench_many_tables.py).", ""]
    secs = i.get("run_seconds", 0)
    rr = (i.get("reread") or [{}])[0]
    met = i.get("met")
    t = i.get("timings") or {}
    chart = next(f"![{alt}]({IMAGES}/{name})" for name, alt in CHARTS if name == "bench_many_tables.svg")
    lines = ["## Many tables under pgbench", "",
             f"`python -m spockwire.spark.job` on `{i.get('master', 'local[2]')}` with no `--table`: every table of "
             f"its publication, {i['tables']} of them (benchmarks/bench_many_tables.py; a child process as in the "
             "pipeline section). A throwaway PostgreSQL 15 on the same 2 cores holds pgbench's tables "
             f"(`pgbench -i -s {i['pgbench_scale']}`: pgbench_accounts {i['accounts_rows']:,} rows) and "
             f"{i['small_tables']} small tables small_000, small_001, ... ({i['small_rows']:,} rows each: an int key "
             "and five typed columns). pgbench_history is not in the publication: the benchmark's pgbench transactions "
             "are counted from it, and it is insert-only. After the snapshot and one change of every table (a warm-up), for "
             f"{secs:g} s: `pgbench -c {i['pgbench_clients']} -n -T {secs:g}` (unthrottled; each transaction updates "
             "one row of pgbench_accounts, pgbench_tellers and pgbench_branches) beside a writer that updates 1-3 "
             "random rows of a random small table per transaction, paced to "
             f"{i['writer_rate_target']:,.0f} transactions/s; at {_num(i.get('migrated_at_s'))} s, "
             f"`{i['migration']}` (without the DDL capture: the job reads small_007 again). Then the writers stop, "
             "the job catches up, stops on SIGTERM, and every Delta table equals its source table, every column "
             "(checked, or the benchmark fails)." + (_own_run_note(own_run) if own_run else ""), "",
             "| measurement | target | measured | met |", "|---|---|---:|---|",
             f"| commit-to-Delta lag p95 over every change (pgbench's and the writer's) | {i['target']} | "
             f"{_num(i.get('measured'))} s | {'met' if met else 'not met' if met is not None else ''} |",
             f"| commit-to-Delta lag p50, max | | {_num(i.get('lag_p50_s'))} s, {_num(i.get('lag_max_s'))} s | |",
             f"| the job's own lag_p95 of each micro-batch: median, max | | {_num(i.get('own_lag_p95_median_s'))} s, "
             f"{_num(i.get('own_lag_p95_max_s'))} s | |",
             f"| seconds of a micro-batch: median, p95, max ({i['batches']} micro-batches) | | "
             f"{_num(i.get('batch_seconds_median'))} s, {_num(i.get('batch_seconds_p95'))} s, "
             f"{_num(i.get('batch_seconds_max'))} s | |",
             f"| the re-read of small_007: its micro-batch's seconds, lag_p95 | | {_num(rr.get('seconds'))} s, "
             f"{_num(rr.get('lag_p95'))} s | |",
             *_spread_row(i.get("spread")),
             f"| peak RSS of the job's processes (PSS) | | {i['peak_rss_bytes'] / 1e9:.2f} GB "
             f"({i['peak_pss_bytes'] / 1e9:.2f} GB) | |",
             f"| pgbench, {i['pgbench_clients']} clients | | {i['pgbench_tps']:,.1f} tps | |",
             f"| the writer (paced to {i['writer_rate_target']:,.0f}) | | {i['writer_rate_achieved']:,.1f} "
             "transactions/s | |", "",
             chart, "",
             f"- Lag: {i['changes']:,} changes, {i['pgbench_transactions']:,} pgbench transactions (3 changes each) "
             f"and {i['writer_transactions']:,} of the writer ({i['writer_changes']:,} changes). A transaction's lag "
             "is the time the job printed the line of the micro-batch holding it (right after its Delta commits) minus "
             "the time its COMMIT returned to its client (pgbench's per-transaction log, the writer's clock); the "
             "percentiles count each change. By source: pgbench's p95 "
             f"{_num(i.get('pgbench_lag_p95_s'))} s, the writer's {_num(i.get('writer_lag_p95_s'))} s. The job's "
             "own lag_p95 is taken from the changes' commit timestamps to its Delta commits. The chart's lines: that "
             "lag_p95 per micro-batch, and the p95 of the commit-to-Delta lags of the transactions committed in each "
             "5 s.",
             f"- Where the time goes: the {len(i['series'])} micro-batches' own seconds sum to "
             f"{_num(sum(row[2] for row in i['series']))} s over the {_num(i.get('written_s'))} s of writes and "
             f"the {_num(i.get('catch_up_s'))} s of catching up; reading a micro-batch (Spark's "
             f"job: the slot's range decoded into files) {_num(i.get('read_seconds_median'))} s at the median and "
             f"{_num(t.get('read_s'))} s over the run; the Delta writes of each table (4 at a time, a median of "
             f"{t.get('tables_per_batch_median', 0):g} tables per micro-batch) summed "
             f"{_num(t.get('apply_s_pgbench'))} s for pgbench's 3 tables and {_num(t.get('apply_s_small'))} s for "
             f"the {i['small_tables']} small ones"
             + _many_steps(t)
             + "; the most: "
             + ", ".join(f"{name.split('.', 1)[-1]} {sec:,.1f} s" for name, sec in t.get("apply_s_by_table_top", []))
             + (f"; the tables' maintenance after each write (state collection) {_num(t['maintenance_s'])} s"
                if t.get("maintenance_s") is not None else "") + ".",
             f"- The snapshot of the {i['tables']} tables took {_num(i.get('snapshot_s'))} s from the job's launch "
             f"({i['snapshot_batches']} micro-batches; peak RSS by its end {i['snapshot_peak_rss_bytes'] / 1e9:.2f} "
             f"GB). After the writers stopped, the job caught up in {_num(i.get('catch_up_s'))} s. "
             + _many_load_note(i), ""]
    return lines


def _spread_row(spread: dict | None) -> list[str]:
    """The micro-batch over every small table against one over a single table (the same changes), when measured."""
    if not spread:
        return []
    ratio = spread["ratio"]
    return [f"| a micro-batch of {spread['changes']:,} changes over the {spread['tables']} small "
            f"tables against one of as many in one table (medians of {spread['rounds']}, the job idle otherwise) | "
            f"<= {spread['target_ratio']:g}x | {ratio:.2f}x ({_num(spread['tables_median_s'])} s against "
            f"{_num(spread['one_table_median_s'])} s) | {'met' if ratio <= spread['target_ratio'] else 'not met'} |"]


def _many_steps(t: dict) -> str:
    """The Delta writes' steps summed over every table (apply.py's metrics: `write` holds `state`)."""
    steps = t.get("apply_s_by_step") or {}
    if not steps:
        return ""
    named = steps.get("stored", 0.0) + steps.get("resolve", 0.0) + steps.get("write", 0.0)
    rest = t.get("apply_s_pgbench", 0.0) + t.get("apply_s_small", 0.0) - named
    return (f" (by step, every table: reading the touched keys' stored rows {steps.get('stored', 0.0):,.1f} s, "
            f"resolving {steps.get('resolve', 0.0):,.1f} s, writing and committing {steps.get('write', 0.0):,.1f} s "
            f"of which the state table {steps.get('state', 0.0):,.1f} s, the rest -- opening each table, its "
            f"idempotence and shape checks -- {rest:,.1f} s)")


def _many_load_note(i: dict) -> str:
    samples = [row[1] for row in i.get("loadavg") or [] if row]
    if not samples:
        return ""
    note = f"Load average during the run {min(samples):.1f}-{max(samples):.1f}"
    other = i.get("other_cpu_s")
    if other is None:
        return note + " (PostgreSQL, pgbench, the writer and the job on 2 cores)."
    cores = 2 * float(i.get("written_s") or i.get("run_seconds") or 0)
    return (note + f"; processes other than the benchmark's (PostgreSQL, pgbench, the writer, the job) used "
            f"{other:,.0f} CPU-seconds of the {cores:,.0f} the 2 cores had while the writers ran"
            + (": next to none." if other < 0.02 * cores else ": the machine was shared with other work, which "
               "took cycles from the job."))


def _failover_section(run: dict | None) -> list[str]:
    """bench_failover.py: per promotion, the outage, the time to the first change landed from the new primary and
    the lag it left, for the ingest worker and the pipeline job."""
    if not run:
        return []
    figures: dict = {}
    for b in run["benchmarks"]:
        figures.update(b["extra_info"]["failover"])
    lines = ["## Failover", "",
             "benchmarks/bench_failover.py: a PostgreSQL 18 primary with a physical standby (`pg_basebackup`, "
             "`sync_replication_slots = on`, `synchronized_standby_slots` naming it) on the same 2 cores; a writer "
             "commits one row at a time, about 100 a second, through a multi-host DSN. Each round the primary is "
             "stopped at once (`pg_ctl stop -m immediate`), the standby promoted (`pg_ctl promote`) and a new "
             "standby made. *Outage*: from the stop to the end of the promotion. The staging and the Delta table "
             f"equal the last primary's table at the end (checked). Run: {run.get('datetime', '')}.", ""]
    ingest = figures.get("ingest")
    if ingest:
        lines += [f"**`spockwire ingest --failover-slot`** (flush every 0.2 s; {ingest['rows']:,} rows): steady "
                  f"commit-to-staging lag p50 {ingest['steady_lag_p50_s']:.3f} s, p95 "
                  f"{ingest['steady_lag_p95_s']:.3f} s.", "",
                  "| promotion | outage | promotion end → first new row staged | highest lag around it |",
                  "|---|---|---|---|"]
        lines += [f"| {k + 1} | {r['outage_s']:.3f} s | {r['to_first_change_s']:.3f} s | {r['max_lag_s']:.3f} s |"
                  for k, r in enumerate(ingest["rounds"])]
        lines += [""]
    job = figures.get("pipeline")
    if job:
        steady = job.get("steady_lag_p95_median_s")
        lines += [f"**`spockwire pipeline --failover-slot`** (trigger 0.5 s; {job['rows']:,} rows): steady "
                  f"micro-batch lag p95, median {steady if steady is None else f'{steady:.3f}'} s. The query fails "
                  "when its source goes away in the middle of a micro-batch and starts again from its checkpoint "
                  "(Spark's start of a query included).", "",
                  "| promotion | outage | query started again | promotion end → first micro-batch | highest lag p95 "
                  "after |", "|---|---|---|---|---|"]
        lines += [f"| {k + 1} | {r['outage_s']:.3f} s | {'yes' if r['reconnected'] else 'no'} | "
                  f"{_num(r['to_first_batch_s'])} s | {_num(r['max_lag_p95_s'])} s |"
                  for k, r in enumerate(job["rounds"])]
        lines += [""]
    return lines


def _hot_keys_section(run: dict | None) -> list[str]:
    """bench_hot_keys.py: the per-change cost of resolving a micro-batch whose changes land mostly on a few keys,
    against a uniform one of as many changes, and the keys that left the vectorised path."""
    if not run:
        return []
    infos = {b["extra_info"]["hot_keys"]["kind"]: b["extra_info"]["hot_keys"] for b in run["benchmarks"]
             if isinstance(b.get("extra_info", {}).get("hot_keys"), dict)}
    uniform, hot = infos.get("uniform"), infos.get("hot")
    if not uniform or not hot:
        return []
    ratio = hot.get("per_change_ratio_to_uniform") or hot["per_change_us"] / uniform["per_change_us"]
    lines = ["## Hot keys", "",
             f"benchmarks/bench_hot_keys.py: the resolution of a micro-batch (spockwire.spark.resolve, the step of "
             f"the Delta write between reading the touched keys' stored rows and writing files) of "
             f"{hot['changes']:,} updates in stream order, in transactions of 10, over a table of "
             f"{hot['table_keys']:,} stored keys (SCD 1), median of its rounds: once with each change's key drawn "
             f"uniformly, once with {hot['hot_share']:.0%} of the changes on {hot['hot_keys']} keys (pgbench's "
             "branches and tellers). `ratio` is the row's time per change divided by the uniform batch's; `keys "
             "resolved one at a time` counts the keys that left the vectorised path (the benchmark fails unless it "
             "is 0)." + _own_run_note(run), "",
             "| batch | keys touched | changes on the 10 busiest keys | median time (s) | per change (us) | ratio "
             "| keys resolved one at a time |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, i, r in (("uniform", uniform, 1.0), (f"hot: {hot['hot_share']:.0%} on {hot['hot_keys']} keys", hot,
                                                   ratio)):
        lines.append(f"| {name} | {i['keys_touched']:,} | {i['top_10_keys_share']:.1%} | {i['seconds']:.4f} | "
                     f"{i['per_change_us']:.3f} | {_fmt_ratio(r)} | {i['sequential_keys']:,} |")
    off = uniform["sequential_keys"] + hot["sequential_keys"]
    lines += ["", "Every change of both batches stayed on the vectorised path: no key was resolved one at a time."
              if off == 0 else f"{off:,} keys were resolved one at a time, off the vectorised path.", ""]
    return lines


def _soak_section(soak: dict | None) -> list[str]:
    """bench_soak.py: the pipeline job over many micro-batches with its table maintenance on."""
    if not soak:
        return []
    s = soak["summary"]
    batches = soak["batches"]
    window = int(s.get("window", 50))
    lines = ["## Tables that stay fast: the soak", "",
             f"`benchmarks/bench_soak.py` ({soak['when']}): the pipeline job ({soak['master']}) on a "
             f"{soak['rows']:,}-row table, then {s['batches']} micro-batches of {soak['changes']:,} changes each "
             f"(updates, deletes and inserts; a TRUNCATE and a reload every {soak['truncate_every']}th), with state "
             f"collection, OPTIMIZE (every {soak['optimize_every']} micro-batches, or at {soak['small_files']} small "
             "files) and VACUUM on. The time per micro-batch must stay flat and the state and the files bounded.", "",
             "| | batches 50-100 | last 50 | ratio |", "|---|---:|---:|---:|",
             f"| median seconds per micro-batch | {s['median_s_early']:.2f} | {s['median_s_last']:.2f} | "
             f"{s['median_s_last'] / s['median_s_early']:.2f} (at most 1.5) |",
             f"| most state rows (tombstones, truncates) | {s['max_state_rows_early']:,} | "
             f"{s['max_state_rows_last']:,} | |",
             f"| most state files | {s['max_state_files_early']} | {s['max_state_files_last']} | |",
             f"| most table data files | {s['max_files_early']} | {s['max_files_last']} | |", "",
             f"{len(batches)} micro-batches recorded; OPTIMIZE ran {s['optimized']} times; the table equalled the "
             f"source at the end ({soak['final_rows']:,} rows). {_load_note(soak)} Per-batch figures: "
             f"benchmarks/results/soak.json; the analysis: benchmarks/analysis.md. Windows of {window} batches.", ""]
    return lines


#: a load average above this during the soak means other work shared the machine (the job alone: about 2-3)
SHARED_LOAD = 4.0


def _load_note(soak: dict) -> str:
    """What the machine's load says of the soak's seconds: well above the 2-core machine's own job (other work
    running), the curve's shape only."""
    highest = max((row[0] for row in soak.get("loadavg") or [] if row), default=0.0)
    if highest > SHARED_LOAD:
        return (f"The machine was shared while it ran (load average {_load_range(soak)}): the seconds are the "
                "curve's shape, not a quiet machine's.")
    return f"Nothing else ran (load average {_load_range(soak)}, the job's own processes included)."


def _load_range(soak: dict) -> str:
    samples = [row[0] for row in soak.get("loadavg") or [] if row]
    return f"{min(samples):.1f}-{max(samples):.1f}" if samples else "not recorded"


def _own_run_note(run: dict) -> str:
    info = run.get("machine_info", {})
    load = info.get("loadavg_at_start")
    return (f" From a run of its own: {run.get('datetime', '')} ({_machine(info)}"
            + (f"; load average at its start {', '.join(str(x) for x in load)}" if load else "") + ").")


# ---------------------------------------------------------------------------------------------------------------
# the figures the summary and the charts share

def decode_tables(peers: list[dict]) -> dict[str, list[dict]]:
    """Per captured workload, in the run's order: its rows (label, input, role, peer, rps, mbs, seconds)."""
    by_workload: dict[str, list[dict]] = defaultdict(list)
    for b in peers:
        by_workload[b["extra_info"]["workload"]].append(b)
    order = sorted(by_workload, key=lambda w: by_workload[w][0]["extra_info"].get("workload_index", 99))
    return {w: _peer_rows(by_workload[w]) for w in order}


def e2e_tables(benches: list[dict]) -> dict[str, dict[str, dict]]:
    """Per server ("PostgreSQL 15.20 ..."): {bench name without the server: {label, rps, cpu}}."""
    out: dict[str, dict[str, dict]] = {}
    for b in sorted(benches, key=lambda b: int(b.get("extra_info", {}).get("server_major", 0))):
        e = b.get("extra_info", {})
        server = f"PostgreSQL {e.get('server_version') or e.get('server_major', '')}"
        name = _e2e_name(b["name"])
        out.setdefault(server, {})[name] = dict(label=E2E_LABELS.get(name, name), rps=e.get("rows", 0) / _seconds(b),
                                                cpu=e.get("client_cpu_cores"))
    return out


def snapshot_rows(benches: list[dict]) -> dict[str, dict]:
    return {b["extra_info"]["snapshot_reader"]: dict(label=SNAPSHOT_LABELS.get(b["extra_info"]["snapshot_reader"],
                                                                                b["extra_info"]["snapshot_reader"]),
                                                      rps=b["extra_info"]["rows_per_s"]) for b in benches}


def pipeline_infos(benches: list[dict]) -> list[dict]:
    infos = [b["extra_info"]["pipeline"] for b in benches if isinstance(b.get("extra_info", {}).get("pipeline"), dict)]
    order = PIPELINE_ORDER if is_ready_to_done(infos) else NET_ORDER
    return sorted(infos, key=lambda i: order.index(i["key"]) if i.get("key") in order else 99)


def _summary(peers: list[dict], e2e: list[dict], snapshot: list[dict], pipeline: list[dict],
             pipeline_run: dict | None) -> list[str]:
    """The lead table: spockwire against what it is compared with, each pair measured in the same run."""
    rows: list[tuple[str, str, str, str]] = []
    tables = decode_tables(peers)
    if tables:
        first = next(iter(tables))
        t = {r["label"]: r for r in tables[first]}
        typed = t.get("spockwire C, typed, text")
        for r in tables[first]:
            if typed and r["role"] == "peer" and r["input"] != "pgoutput-binary":
                rows.append((f"decode {first}: typed Arrow columns from text pgoutput", f"{typed['rps']:,.0f} rows/s",
                             f"{r['label']}: {r['rps']:,.0f} rows/s", _fmt_ratio(typed["rps"] / r["rps"])))
        for label, what in (("spockwire C, typed, binary, views", "typed from binary pgoutput, `strings=\"view\"`"),
                            ("spockwire C, raw, binary", "values as sent (`types=\"raw\"`), binary pgoutput")):
            ours = t.get(label)
            peer = next((r for r in tables[first] if r["role"] == "peer" and r["input"] == "pgoutput-binary"), None)
            if ours and peer:
                rows.append((f"decode {first}: {what}", f"{ours['rps']:,.0f} rows/s",
                             f"{peer['label']} (values undecoded): {peer['rps']:,.0f} rows/s",
                             _fmt_ratio(ours["rps"] / peer["rps"])))
        ratios = []
        for w, rs in tables.items():
            fastest = max((r for r in rs if r["role"] == "peer"), key=lambda r: r["rps"], default=None)
            ours = next((r for r in rs if r["label"] == "spockwire C, typed, text, views"), None)
            if fastest and ours:
                ratios.append(ours["rps"] / fastest["rps"])
        if ratios:
            rows.append((f"decode, each of the {len(ratios)} workloads: typed from text, `strings=\"view\"`", "",
                         "the workload's fastest peer", f"{_fmt_ratio(min(ratios))} to {_fmt_ratio(max(ratios))}"))
    for server, named in e2e_tables(e2e).items():
        decode = named.get("test_server_decode")
        recv = named.get("test_pg_recvlogical")
        for name, anchor in (("test_stream[c]", recv), ("test_sql_transport[c]", decode)):
            ours = named.get(name)
            if ours and anchor:
                rows.append((f"live slot, {server.split(' (')[0]}: {ours['label']}", f"{ours['rps']:,.0f} rows/s",
                             f"{anchor['label'].split(' (')[0]}: {anchor['rps']:,.0f} rows/s",
                             _fmt_ratio(ours["rps"] / anchor["rps"])))
    readers = snapshot_rows(snapshot)
    ours = readers.get("spockwire_w2")
    for key in ("adbc", "connectorx_p2", "raw_copy"):
        if ours and key in readers:
            rows.append((f"whole table: {ours['label']}", f"{ours['rps']:,.0f} rows/s",
                         f"{readers[key]['label']}: {readers[key]['rps']:,.0f} rows/s",
                         _fmt_ratio(ours["rps"] / readers[key]["rps"])))
    infos = pipeline_infos(pipeline)
    if is_ready_to_done(infos):
        for job, ours, reader, theirs, ratio in _job_against_readers(infos):
            rows.append((f"Spark pipeline into Delta: {job}, ready to done", ours, f"{reader}: {theirs}", ratio))
    for info in [] if is_ready_to_done(infos) else infos:
        if info.get("key") in ("snapshot", "changes") and info.get("measured") is not None:
            for a in info.get("anchors") or []:
                if a.get("ratio") is not None:
                    rows.append((f"Spark pipeline into Delta: {info['label']}",
                                 _fmt_value(info["measured"], info.get("unit", "")),
                                 f"{a['label']}: {_fmt_value(a.get('value'), a.get('unit', ''))}", f"{a['ratio']:.3f}"))
    if not rows:
        return []
    lines = ["## Summary", "",
             "spockwire against each tool it is compared with, both measured in the same run (the pipeline in a "
             "run of its own, named in its section). `ratio`: spockwire's rows/s divided by the other's.", "",
             "| measurement | spockwire | compared with | ratio |", "|---|---:|---|---:|"]
    lines += [f"| {what} | {ours} | {other} | {ratio} |" for what, ours, other, ratio in rows]
    for name, alt in CHARTS:
        if name not in SECTION_CHARTS:
            lines += ["", f"![{alt}]({IMAGES}/{name})"]
    return lines + [""]
    return lines


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:,.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_file", nargs="?", help="a pytest-benchmark JSON (default: the stored runs)")
    parser.add_argument("--pipeline", help="a run whose pipeline measurements to show instead of RUN's own")
    parser.add_argument("--out", default="BENCHMARKS.md")
    args = parser.parse_args()
    data, pipeline = runs.load(args.json_file, args.pipeline)
    Path(args.out).write_text(render(data, pipeline, runs.load_soak()))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
