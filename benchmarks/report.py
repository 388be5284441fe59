"""Turn pytest-benchmark JSON into the Markdown tables of BENCHMARKS.md.

    python benchmarks/report.py out/bench.json [--out BENCHMARKS.md]

Rows/s and MB/s come from the best (minimum) round of each benchmark; every row also gets its ratio to the
fastest row of its group, so the claims are ratios measured in one run, not absolute times.
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
    for bench in data["benchmarks"]:
        groups[bench.get("group") or bench["name"]].append(bench)
    lines = ["# Benchmarks", "",
             f"Machine: {_machine(data.get('machine_info', {}))}. Run: {data.get('datetime', '')}.", "",
             "Each table is one workload measured in one run; `ratio` is the row's rows/s divided by the slowest "
             "row's rows/s in the same table.", ""]
    for group, benches in sorted(groups.items()):
        rows = []
        for b in benches:
            extra = b.get("extra_info", {})
            best = b["stats"]["min"]
            n = extra.get("rows")
            size = extra.get("bytes")
            label = extra.get("label") or " ".join(str(extra[k]) for k in ("implementation", "types") if k in extra)
            rows.append((label or b["name"], n / best if n else None, size / best / 1e6 if size else None, best))
        slowest = min((r[1] for r in rows if r[1]), default=None)
        lines += [f"## {group}", "", "| implementation | rows/s | MB/s | best time (s) | ratio |", "|---|---:|---:|---:|---:|"]
        for label, rps, mbs, best in sorted(rows, key=lambda r: -(r[1] or 0)):
            ratio = f"{rps / slowest:.1f}x" if rps and slowest else ""
            lines.append(f"| {label} | {rps:,.0f} | {mbs:,.0f} | {best:.4f} | {ratio} |" if rps else
                         f"| {label} | | | {best:.4f} | |")
        lines.append("")
    return "\n".join(lines)


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
