"""Turn pytest-benchmark JSON into the Markdown tables of BENCHMARKS.md.

    python benchmarks/report.py out/bench.json [--out BENCHMARKS.md]

Rows/s and MB/s come from the best (minimum) round of each benchmark; every row also gets its ratio to the
fastest row of its group, so the claims are ratios measured in one run, not absolute times.

Benchmarks of bench_peers.py (``extra_info["role"]``) get one table per captured workload: rows/s, MB/s of the
row's own input, its ratio to each peer's rows/s and its speed as a fraction of copying the same bytes (memcpy).
Benchmarks of bench_e2e.py / bench_connection.py get one end-to-end table (rows/s, client CPU, ratio to the
server's decode rate). A time in ``extra_info["seconds"]`` (measured inside another process, or the timed part of
a round) takes the place of the round's minimum.
"""
from __future__ import annotations

import argparse
import json
import platform
from collections import defaultdict
from pathlib import Path


def _machine(info: dict) -> str:
    cpu = info.get("cpu", {})
    return (f"{cpu.get('brand_raw', platform.processor() or 'unknown CPU')}, {cpu.get('count', '?')} cores, "
            f"Python {info.get('python_version', platform.python_version())}, {info.get('system', '')} "
            f"{info.get('release', '')}")


def render(data: dict) -> str:
    groups: dict[str, list[dict]] = defaultdict(list)
    peers = [b for b in data["benchmarks"] if "role" in b.get("extra_info", {})]
    e2e = [b for b in data["benchmarks"] if _is_e2e(b)]
    snapshot = [b for b in data["benchmarks"] if "snapshot_reader" in b.get("extra_info", {})]
    for bench in data["benchmarks"]:
        if "role" in bench.get("extra_info", {}) or _is_e2e(bench) or bench in snapshot:
            continue
        groups[bench.get("group") or bench["name"]].append(bench)
    lines = ["# Benchmarks", "",
             f"Machine: {_machine(data.get('machine_info', {}))}. Run: {data.get('datetime', '')}.", ""]
    lines += _setup_lines(data, peers + e2e)
    lines += _peer_sections(peers) + _e2e_section(e2e) + _snapshot_section(snapshot)
    if groups:
        lines += ["## Synthetic decode workloads", "",
                  "Each table is one workload measured in one run; `ratio` is the row's rows/s divided by the "
                  "slowest row's rows/s in the same table.", ""]
    for group, benches in sorted(groups.items()):
        rows = []
        for b in benches:
            extra = b.get("extra_info", {})
            best = b["stats"]["min"]
            n = extra.get("rows")
            size = extra.get("bytes")
            label = extra.get("label") or " ".join(str(extra[k]) for k in ("implementation", "types") if k in extra)
            # a benchmark that times only its busy part (e.g. ingest up to its last staging commit) says so in
            # extra_info["rows_per_s"]
            rps = extra.get("rows_per_s") or (n / best if n else None)
            rows.append((label or b["name"], rps, size / best / 1e6 if size else None, best))
        slowest = min((r[1] for r in rows if r[1]), default=None)
        lines += [f"### {group}", "", "| implementation | rows/s | MB/s | best time (s) | ratio |", "|---|---:|---:|---:|---:|"]
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
    return float(extra["seconds"]) if extra.get("seconds") else float(bench["stats"]["min"])


def _is_e2e(bench: dict) -> bool:
    full = bench.get("fullname", "")
    return "bench_e2e.py" in full or "bench_connection.py" in full


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
    lines += ["### Summary", "",
              "spockwire C with `types=\"typed\"` (Arrow columns of the PostgreSQL types) against each peer that "
              "decodes text-format pgoutput or wal2json; spockwire C with `types=\"raw\"` against the peer that "
              "hands binary-format values over undecoded.", ""]
    head = ["workload", "C typed text rows/s"] + [f"× {p}" for p in text_peers] + \
        [f"C raw binary × {p}" for p in binary_peers] + ["C typed text, of memcpy"]
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
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")

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
    "test_stream[c]": "spockwire stream, Cython pump, Arrow batches",
    "test_stream[python]": "spockwire stream, pure-Python pump, Arrow batches",
    "test_psycopg2_callback": "psycopg2 consume_stream, callback feeding spockwire per message",
    "test_psycopg2_noop_callback": "psycopg2 consume_stream, no-op callback",
}


def _e2e_section(benches: list[dict]) -> list[str]:
    if not benches:
        return []
    rows = []
    for b in benches:
        e = b.get("extra_info", {})
        t = _seconds(b)
        rows.append((E2E_LABELS.get(b["name"], b["name"]), e.get("rows", 0) / t, e.get("messages", 0) / t,
                     e.get("client_cpu_cores"), b["name"] == "test_server_decode"))
    server = next((r[1] for r in rows if r[4]), None)
    n = benches[0].get("extra_info", {}).get("rows", 0)
    lines = ["## End to end from a live slot", "",
             f"{n:,} rows in transactions of 1,000 (pgoutput protocol 1, text; benchmarks/bench_connection.py, run "
             "by benchmarks/bench_e2e.py on one slot of one cluster). The server and the client share the "
             "machine. `client CPU` is the client process's user + system seconds per wall second; `× server "
             "decode` is the row's rows/s divided by the rate at which the server decodes the same slot.", "",
             "| consumer | rows/s | messages/s | client CPU (cores) | × server decode |", "|---|---:|---:|---:|---:|"]
    for label, rps, mps, cpu, _ in sorted(rows, key=lambda r: -r[1]):
        ratio = f"{rps / server:.2f}" if server else ""
        lines.append(f"| {label} | {rps:,.0f} | {mps:,.0f} | {'' if cpu is None else f'{cpu:.2f}'} | {ratio} |")
    lines.append("")
    return lines


def _snapshot_section(benches: list[dict]) -> list[str]:
    """bench_snapshot.py: whole-table reads, as ratios to the raw COPY transfer and to ADBC in the same run."""
    if not benches:
        return []
    lines = [f"## {benches[0].get('group') or 'snapshot read'}", "",
             "Each reader's best of rounds run in rotating order in one run; `vs raw COPY` is its rows/s divided "
             "by the rows/s of moving the same `COPY ... (FORMAT binary)` bytes into the process undecoded.", "",
             "| reader | rows/s | best time (s) | vs raw COPY | vs ADBC |", "|---|---:|---:|---:|---:|"]
    for b in sorted(benches, key=lambda b: -b["extra_info"].get("rows_per_s", 0)):
        e = b["extra_info"]
        raw = e.get("ratio_to_raw_copy")
        adbc = e.get("ratio_to_adbc")
        lines.append(f"| {e['snapshot_reader']} | {e['rows_per_s']:,.0f} | {e['seconds']:.3f} | "
                     f"{_fmt_ratio(raw) if raw else ''} | {_fmt_ratio(adbc) if adbc else ''} |")
    return lines + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_file")
    parser.add_argument("--out", default="BENCHMARKS.md")
    args = parser.parse_args()
    data = json.loads(Path(args.json_file).read_text())
    Path(args.out).write_text(render(data))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
