"""The pgoutput-decoder peer (Rust, PyPI), run by benchmarks/bench_connection.py in an interpreter of its own.

    <python3.12> benchmarks/live_peer_pgoutput_decoder.py HOST PORT USER DATABASE SLOT PUBLICATION ROWS

Reads the slot with ``LogicalReplicationReader`` (its own replication connection, nothing acknowledged, so the
slot keeps its contents for the next round) until ROWS row changes arrived, and prints one JSON line: rows,
seconds (from the first message to the last) and cpu (this process's user + system seconds over that span).
The package's wheel needs Python >= 3.12, hence the separate interpreter (scripts/setup-machine.sh makes it).
"""
import asyncio
import json
import os
import resource
import sys
import time


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def main() -> None:
    host, port, user, database, slot, publication, rows = sys.argv[1:8]
    from pgoutput_decoder import LogicalReplicationReader

    want = int(rows)
    reader = LogicalReplicationReader(publication, slot, host, database, port=int(port), user=user,
                                      auto_acknowledge=False)
    seen = 0
    t0 = c0 = None
    async for message in reader:
        if t0 is None:
            t0, c0 = time.perf_counter(), _cpu()
        if getattr(message, "op", None) in ("c", "u", "d", "r"):
            seen += 1
            if seen >= want:
                break
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    print(json.dumps({"rows": seen, "seconds": wall, "cpu": cpu}), flush=True)
    # the reader's stop() waits for its replication task: exit the process instead (nothing was acknowledged)
    os._exit(0)


asyncio.run(main())
