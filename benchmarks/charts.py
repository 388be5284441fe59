"""The benchmark charts (SVG) from the stored runs: what BENCHMARKS.md, the README and the docs show.

    python -m benchmarks.charts [--run RUN.json] [--pipeline PIPELINE.json] [--out docs/images]

Without arguments the stored runs are drawn (benchmarks/runs.py: benchmarks/results/bench_run.json and the newest
pipeline run), with the figures benchmarks/report.py puts in BENCHMARKS.md's tables (the same functions compute
them). Needs matplotlib (scripts/setup-machine.sh installs it); drawn with the Agg backend, no display needed.

    bench_headline.svg   decoding the narrow workload: spockwire against every peer (rows/s)
    bench_decode.svg     the six captured workloads: spockwire's typed decoding against the peers (rows/s, log)
    bench_live.svg       a live slot, PostgreSQL 15 and 18: the streams against pg_recvlogical and the server
    bench_snapshot.svg   a whole table: read_table against ADBC, connectorx and the raw COPY transfer
    bench_pipeline.svg   the Spark pipeline into Delta: measured rates, their targets and anchors
    bench_soak.svg       the soak's micro-batches: seconds, state rows, table files
    bench_many_tables.svg  103 tables under pgbench: the lag over the run, each micro-batch's seconds
                         (benchmarks/results/many_tables_run.json)
"""
from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen

try:
    from . import report, runs
except ImportError:          # run as a script: benchmarks/ is on sys.path
    import report  # type: ignore[no-redef]
    import runs  # type: ignore[no-redef]

OURS = "#1f6feb"
OURS_LIGHT = "#7aa7f0"
PEER = "#8c959f"
ANCHOR = "#c9a227"
TARGET = "#cf222e"

plt.rcParams.update({
    "svg.fonttype": "none",          # text stays text: small files, crisp in a browser
    "svg.hashsalt": "spockwire",     # stable element ids: a chart redrawn from the same run is the same file
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 10,
    "axes.titleweight": "bold",
})


def _ours(label: str) -> bool:
    return label.startswith("spockwire") or label.startswith("spockwire.")


def _save(fig, out: Path, name: str) -> Path:
    path = out / name
    fig.savefig(path, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    return path


def _hbars(ax, labels: list[str], values: list[float], colors: list[str], unit: str, ratios: list[str] | None = None,
           room: float = 1.45):
    y = range(len(labels))[::-1]
    ax.barh(list(y), values, color=colors, height=0.7)
    ax.set_yticks(list(y), labels)
    top = max(values) if values else 1
    for yi, v, extra in zip(y, values, ratios or [""] * len(values)):
        ax.text(v + top * 0.01, yi, f"{v:,.0f}{' ' + extra if extra else ''}", va="center", fontsize=8)
    ax.set_xlim(0, top * room)
    ax.set_xlabel(unit)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v / 1e6:g}M" if v >= 1e6 else
                                                                 f"{v / 1e3:g}k" if v else "0"))


def headline(tables: dict[str, list[dict]], out: Path, date: str) -> Path | None:
    if not tables:
        return None
    workload = next(iter(tables))
    rows = [r for r in tables[workload] if r["role"] != "floor" and "Python" not in r["label"]
            and (r["role"] == "peer" or r["label"] in ("spockwire C, typed, text", "spockwire C, typed, binary, views"))]
    rows.sort(key=lambda r: -r["rps"])
    base = next((r for r in rows if r["peer"] == "pypgoutput"), None)
    fig, ax = plt.subplots(figsize=(7.5, 0.34 * len(rows) + 1.1))
    _hbars(ax, [r["label"] for r in rows], [r["rps"] for r in rows],
           [OURS if _ours(r["label"]) else PEER for r in rows],
           f"rows/s ({_description(tables, workload)}; spockwire: typed Arrow batches)\n"
           f"Median of rounds, one run ({date[:10]}), 2 cores",
           [f"({r['rps'] / base['rps']:.0f}x pypgoutput)" if base and r is not base and _ours(r["label"]) else ""
            for r in rows])
    ax.set_title(f"Decoding the same captured changes: {workload} workload", loc="left")
    return _save(fig, out, "bench_headline.svg")


def _description(tables: dict, workload: str) -> str:
    return _DESCRIPTIONS.get(workload, "")


_DESCRIPTIONS: dict[str, str] = {}

DECODE_SERIES = (
    ("spockwire C, typed, text", "spockwire, typed, text", OURS),
    ("spockwire C, typed, binary, views", "spockwire, typed, binary, views", OURS_LIGHT),
    ("pg-logical-replication (Node), binary", "pg-logical-replication, binary (undecoded)", "#57606a"),
    ("wal2json + orjson.loads", "wal2json + orjson", "#8c959f"),
    ("pg-logical-replication (Node), text", "pg-logical-replication, text", "#afb8c1"),
    ("wal2json + json.loads", "wal2json + json.loads", "#d0d7de"),
    ("pypgoutput, text", "pypgoutput", "#eaeef2"),
)


def decode(tables: dict[str, list[dict]], out: Path, date: str) -> Path | None:
    if not tables:
        return None
    workloads = list(tables)
    fig, ax = plt.subplots(figsize=(8.5, 3.6))
    width = 0.8 / len(DECODE_SERIES)
    for i, (label, legend, color) in enumerate(DECODE_SERIES):
        xs, vs = [], []
        for j, w in enumerate(workloads):
            r = next((r for r in tables[w] if r["label"] == label), None)
            if r:
                xs.append(j - 0.4 + width * (i + 0.5))
                vs.append(r["rps"])
        ax.bar(xs, vs, width=width, color=color, label=legend, edgecolor="#57606a", linewidth=0.3)
    ax.set_yscale("log")
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylabel("rows/s (log scale)")
    ax.set_title("Decode only: the same captured changes, six workloads", loc="left")
    ax.legend(fontsize=7, ncol=2, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    fig.text(0, -0.2, f"Median of rounds, one run ({date[:10]}), 2 cores. Workloads and every row: BENCHMARKS.md",
             fontsize=7, color="#57606a")
    return _save(fig, out, "bench_decode.svg")


LIVE_ORDER = ("test_server_decode", "test_sql_transport[c]", "test_stream[c]", "test_pg_recvlogical",
              "test_psycopg2_callback", "test_stream[python]", "test_pgoutput_decoder")
LIVE_LABELS = {
    "test_server_decode": "server's own decode (SQL interface)",
    "test_sql_transport[c]": "spockwire, transport=\"sql\"",
    "test_stream[c]": "spockwire, replication protocol",
    "test_pg_recvlogical": "pg_recvlogical",
    "test_psycopg2_callback": "psycopg2 consume_stream + spockwire per message",
    "test_stream[python]": "spockwire, pure-Python pump",
    "test_pgoutput_decoder": "pgoutput-decoder (Rust), rows as dicts",
}


def live(servers: dict[str, dict[str, dict]], out: Path, date: str) -> Path | None:
    if not servers:
        return None
    fig, axes = plt.subplots(len(servers), 1, figsize=(7.5, 2.6 * len(servers)), sharex=True)
    axes = axes if len(servers) > 1 else [axes]
    for ax, (server, named) in zip(axes, servers.items()):
        keys = [k for k in LIVE_ORDER if k in named]
        recv, decoded = named.get("test_pg_recvlogical"), named.get("test_server_decode")
        notes = {"test_stream[c]": f"({named['test_stream[c]']['rps'] / recv['rps']:.2f}x pg_recvlogical)"
                 if recv and "test_stream[c]" in named else "",
                 "test_sql_transport[c]": f"({named['test_sql_transport[c]']['rps'] / decoded['rps']:.2f}x server)"
                 if decoded and "test_sql_transport[c]" in named else ""}
        _hbars(ax, [LIVE_LABELS[k] for k in keys], [named[k]["rps"] for k in keys],
               [OURS if k.startswith(("test_stream", "test_sql")) else ANCHOR if k == "test_server_decode" else PEER
                for k in keys], "rows/s", [notes.get(k, "") for k in keys], room=1.5)
        ax.set_title(server.split(" (")[0], loc="left")
    for ax in axes[:-1]:
        ax.set_xlabel("")
    fig.suptitle("Streaming 1,000,000 rows from a live slot into Arrow batches", x=0.01, ha="left",
                 fontsize=10, fontweight="bold")
    fig.text(0, -0.04, f"Median of rounds, one run ({date[:10]}), server and client on the same 2 cores. "
             "Client CPU and every row: BENCHMARKS.md", fontsize=7, color="#57606a")
    fig.tight_layout()
    return _save(fig, out, "bench_live.svg")


def snapshot(readers: dict[str, dict], out: Path, date: str, rows: str) -> Path | None:
    if not readers:
        return None
    items = sorted(readers.items(), key=lambda kv: -kv[1]["rps"])
    adbc = readers.get("adbc")
    fig, ax = plt.subplots(figsize=(7.5, 0.34 * len(items) + 1.1))
    _hbars(ax, [v["label"].replace("`", "") for _, v in items], [v["rps"] for _, v in items],
           [OURS if k.startswith("spockwire") else ANCHOR if k == "raw_copy" else PEER for k, _ in items],
           f"rows/s. Median of rounds, one run ({date[:10]}), 2 cores",
           [f"({v['rps'] / adbc['rps']:.2f}x ADBC)" if adbc and k.startswith("spockwire") else "" for k, v in items])
    ax.set_title(f"Reading a whole table into Arrow ({rows})", loc="left")
    return _save(fig, out, "bench_snapshot.svg")


def pipeline(infos: list[dict], out: Path, date: str) -> Path | None:
    rates = [i for i in infos if i.get("unit", "").endswith("/s") and i.get("measured") is not None]
    if not rates:
        return None
    labels, values, colors = [], [], []
    targets: list[tuple[int, float]] = []
    for i in rates:
        labels.append(_short(i["label"]))
        values.append(i["measured"])
        colors.append(OURS)
        if i.get("target_value"):
            targets.append((len(values) - 1, float(i["target_value"])))
        for a in i.get("anchors") or []:
            if a.get("value") and a.get("unit", "").endswith("/s") and not a["label"].startswith("the "):
                labels.append("   anchor: " + a["label"])
                values.append(a["value"])
                colors.append(PEER)
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(values) + 1.3))
    y = list(range(len(values)))[::-1]
    ax.barh(y, values, color=colors, height=0.7)
    ax.set_yticks(y, labels)
    ax.set_xscale("log")
    beside = dict(targets)
    for n, (yi, v) in enumerate(zip(y, values)):
        ax.text(max(v, beside.get(n, 0)) * 1.08, yi, f"{v:,.0f}/s", va="center", fontsize=8)
    for idx, t in targets:
        ax.plot([t, t], [y[idx] - 0.45, y[idx] + 0.45], color=TARGET, linewidth=2)
    ax.plot([], [], color=TARGET, linewidth=2, label="target")
    ax.legend(fontsize=7, frameon=False, loc="lower right")
    ax.set_xlim(min(values + [t for _, t in targets]) / 2, max(values) * 4)
    ax.set_xlabel("rows/s or changes/s (log scale)")
    ax.set_title("The Spark pipeline into Delta (python -m spockwire.spark.job, local[2])", loc="left")
    timed = " The job's rates: rows or changes / ready to done." if report.is_ready_to_done(infos) else ""
    fig.text(0, -0.02, f"One pass of each phase, one run ({date[:10]}), 2 cores.{timed} Fixed cost, lag and memory: "
             "BENCHMARKS.md", fontsize=7, color="#57606a")
    return _save(fig, out, "bench_pipeline.svg")


def soak(record: dict | None, out: Path) -> Path | None:
    """The soak's micro-batches: seconds each (and a rolling median), state rows and table files."""
    if not record or not record.get("batches"):
        return None
    batches = record["batches"]
    x = [b["batch"] for b in batches]
    secs = [b["seconds"] for b in batches]
    window = int(record["summary"].get("window", 50))
    rolling = [sorted(secs[max(0, i - window + 1):i + 1])[len(secs[max(0, i - window + 1):i + 1]) // 2]
               for i in range(len(secs))]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 4.6), sharex=True, height_ratios=[3, 2])
    top.scatter(x, secs, s=4, color=OURS_LIGHT, label="seconds per micro-batch")
    top.plot(x, rolling, color=OURS, linewidth=1.6, label=f"median of the last {window}")
    top.set_ylabel("seconds")
    top.legend(fontsize=7, frameon=False, loc="upper right")
    top.set_title("500 micro-batches with state collection and OPTIMIZE (benchmarks/bench_soak.py)", loc="left")
    bottom.plot(x, [b["state_rows"] for b in batches], color=PEER, linewidth=1, label="state rows")
    bottom.set_ylabel("state rows")
    files = bottom.twinx()
    files.plot(x, [b["files"] for b in batches], color=TARGET, linewidth=1, label="table data files")
    files.set_ylabel("table files")
    bottom.set_xlabel("micro-batch")
    lines = bottom.get_lines() + files.get_lines()
    bottom.legend(lines, [ln.get_label() for ln in lines], fontsize=7, frameon=False, loc="upper left")
    fig.text(0, -0.02, f"One run ({record['when']}) on 2 cores shared with other work: the shape, not a quiet "
             "machine's seconds. BENCHMARKS.md", fontsize=7, color="#57606a")
    return _save(fig, out, "bench_soak.svg")


def many_tables(run: dict | None, out: Path) -> Path | None:
    """bench_many_tables.py: the job's lag_p95 of each micro-batch and the p95 of the commit-to-Delta lag per 5 s
    of commits over the run, against the target, the migration and the re-read marked; below, each micro-batch's
    seconds."""
    info = report.many_tables_info((run or {}).get("benchmarks", []))
    if not info or not info.get("series"):
        return None
    series = info["series"]            # [seconds since pgbench started, lag_p95, seconds, rows, re-read]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 4.8), sharex=True, height_ratios=[3, 2])
    pts = [(x, lag) for x, lag, _s, _r, _rr in series if lag is not None]
    top.plot([x for x, _ in pts], [lag for _, lag in pts], color=OURS, linewidth=1.2, marker="o", markersize=2.5,
             label="the job's lag_p95 of each micro-batch")
    windows = info.get("window_lag_p95") or []
    if windows:
        top.step([x for x, _ in windows], [v for _, v in windows], where="mid", color=PEER, linewidth=1.2,
                 label="commit-to-Delta lag p95 of the transactions committed in each 5 s")
    target = info.get("target_value")
    if target:
        top.axhline(target, color=TARGET, linewidth=1.2, linestyle="--", label=f"target: p95 <= {target:g} s")
    migrated = info.get("migrated_at_s")
    for ax in (top, bottom):
        if migrated is not None:
            ax.axvline(migrated, color=ANCHOR, linewidth=1, linestyle=":")
        ax.axvspan(info.get("run_seconds", 0), max(x for x, *_ in series) + 1, color="#eaeef2", zorder=0)
    rr = [(x, lag) for x, lag, _s, _r, r in series if r and lag is not None]
    if rr:
        top.scatter([x for x, _ in rr], [lag for _, lag in rr], marker="*", s=70, color=TARGET, zorder=5,
                    label="the micro-batch that read small_007 again")
    highest = max([lag for _, lag in pts] + [v for _, v in windows] + [target or 0])
    top.set_ylim(0, highest * 1.45)          # room for the legend above the lines
    if migrated is not None:
        bottom.text(migrated, 0.97, " ALTER TABLE small_007 ", color="#7d5d00", fontsize=7, va="top",
                    transform=matplotlib.transforms.blended_transform_factory(bottom.transData, bottom.transAxes),
                    bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1})
    top.set_ylabel("lag (s)")
    top.legend(fontsize=7, frameon=False, loc="upper left", ncol=2)
    top.set_title(f"{info['tables']} tables under pgbench (-c {info['pgbench_clients']}, "
                  f"{info['pgbench_tps']:,.0f} tps) and a writer: commit-to-Delta lag", loc="left")
    # each micro-batch as the span it took: from its start (its line's time less its seconds) to its line
    bottom.bar([x - sec for x, _l, sec, _r, _rr in series], [sec for _x, _l, sec, _r, _rr in series],
               width=[sec for _x, _l, sec, _r, _rr in series], align="edge", color=[TARGET if r else OURS_LIGHT
                                                                                    for *_, r in series],
               edgecolor="white", linewidth=0.6)
    bottom.set_ylabel("micro-batch (s)")
    others = info.get("other_cores") or []
    if others:
        # other work on the machine (processes outside the benchmark): cores it used between samples
        share = bottom.twinx()
        share.plot([x for x, _ in others], [c for _, c in others], color="#57606a", linewidth=1.2,
                   drawstyle="steps-pre")
        share.set_ylim(0, 2)
        share.set_ylabel("other processes (cores, line)", color="#57606a")
        share.spines["right"].set_visible(True)
    bottom.set_title("each micro-batch, from its read to its Delta commits (red: the re-read's)", loc="left",
                     fontsize=8, fontweight="normal")
    bottom.set_xlabel("seconds since pgbench started (shaded: the writers stopped, the job catching up)")
    fig.text(0, -0.02, f"One run ({(run or {}).get('datetime', '')[:10]}), python -m spockwire.spark.job on "
             f"{info.get('master', 'local[2]')}, PostgreSQL and pgbench on the same 2 cores. BENCHMARKS.md",
             fontsize=7, color="#57606a")
    return _save(fig, out, "bench_many_tables.svg")


def _short(label: str) -> str:
    return (label.replace(" into Delta (SCD 1), net", "").replace(" (SCD 1), net", "").replace(", net", "")
            .replace(" into Delta (SCD 1)", "").replace(" (SCD 1)", ""))


def draw(run: dict, pipeline_run: dict | None, out: Path) -> list[Path]:
    """Every chart of `run` (and the pipeline of `pipeline_run`, when given) into `out`; returns the files."""
    out.mkdir(parents=True, exist_ok=True)
    benches = run.get("benchmarks", [])
    peers = [b for b in benches if runs.is_peer(b)]
    for b in peers:
        _DESCRIPTIONS.setdefault(b["extra_info"]["workload"], b["extra_info"].get("description", ""))
    tables = report.decode_tables(peers)
    snap = [b for b in benches if runs.is_snapshot(b)]
    snap_rows = (snap[0].get("group") or "").split(": ", 1)[-1].split(" (")[0] if snap else ""
    pipe_run = pipeline_run or run
    date = run.get("datetime", "")
    made = [headline(tables, out, date), decode(tables, out, date),
            live(report.e2e_tables([b for b in benches if runs.is_e2e(b)]), out, date),
            snapshot(report.snapshot_rows(snap), out, date, snap_rows),
            pipeline(report.pipeline_infos([b for b in pipe_run.get("benchmarks", []) if runs.is_pipeline(b)]), out,
                     pipe_run.get("datetime", "")),
            soak(runs.load_soak(), out), many_tables(runs.load_many_tables(), out)]
    return [p for p in made if p is not None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", help="a pytest-benchmark JSON (default: benchmarks/results/bench_run.json)")
    parser.add_argument("--pipeline", help="a run whose pipeline measurements to draw instead of RUN's own")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / report.IMAGES))
    args = parser.parse_args()
    run, pipe = runs.load(args.run, args.pipeline)
    for path in draw(run, pipe, Path(args.out)):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
