"""A plain-Python replay of change rows: the independent oracle of the `apply_changes` tests, and a generator of
change workloads (inserts, updates with and without unchanged TOAST values, key changes, deletes, truncates).

Rows are dicts with the change columns and the table's columns (`id` the key, `name`, `doc`; `doc` is the
column PostgreSQL may send as unchanged TOAST)."""
from __future__ import annotations

import datetime as dt
import random

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
COLUMNS = ("id", "name", "doc")


def ts_of(lsn: int) -> dt.datetime:
    return T0 + dt.timedelta(seconds=lsn)


def replay_scd1(rows: list[dict]) -> dict[int, tuple]:
    """key -> (id, name, doc) after replaying `rows` in (_commit_lsn, _seq) order (an update's preimage of the same
    key as its postimage changes nothing)."""
    table: dict = {}
    moved_from = None
    for r in sorted(rows, key=lambda r: (r["_commit_lsn"], r["_seq"])):
        kind = r["_change_type"]
        if kind == "truncate":
            table.clear()
        elif kind == "delete":
            table.pop(r["id"], None)
        elif kind == "update_preimage":
            moved_from = table.pop(r["id"], None)
            continue
        else:
            previous = table.get(r["id"]) if moved_from is None else moved_from
            toast = r.get("_unchanged_toast") or []
            row = {c: (previous[c] if c in toast and previous else r[c]) for c in COLUMNS}
            table[r["id"]] = row
        moved_from = None
    return {k: tuple(v[c] for c in COLUMNS) for k, v in table.items()}


def replay_scd2(rows: list[dict]) -> set[tuple]:
    """Every version: (id, name, doc, start lsn, start seq, start ts, end lsn, end seq, end ts). A version ends at
    the next change of its key; a preimage ends it only when its postimage has another key (the key changed)."""
    current: dict = {}
    history: list[dict] = []
    moved_from = None

    def close(key, r):
        v = current.pop(key, None)
        if v is not None:
            v["end"] = (r["_commit_lsn"], r["_seq"], r["_commit_ts"])
        return v

    preimage = None
    for r in sorted(rows, key=lambda r: (r["_commit_lsn"], r["_seq"])):
        kind = r["_change_type"]
        if kind == "truncate":
            for key in list(current):
                close(key, r)
        elif kind == "delete":
            close(r["id"], r)
        elif kind == "update_preimage":
            preimage = r        # it ends its key only when the postimage after it has another key
            continue
        else:
            if preimage is not None and preimage["id"] != r["id"]:
                moved_from = close(preimage["id"], preimage)
            previous = current.get(r["id"]) if moved_from is None else moved_from
            toast = r.get("_unchanged_toast") or []
            values = {c: (previous["values"][c] if c in toast and previous else r[c]) for c in COLUMNS}
            close(r["id"], r)
            v = {"values": values, "start": (r["_commit_lsn"], r["_seq"], r["_commit_ts"]), "end": (None,) * 3}
            current[r["id"]] = v
            history.append(v)
        moved_from = preimage = None
    return {(*[v["values"][c] for c in COLUMNS], *v["start"], *v["end"]) for v in history}


def workload(seed: int, transactions: int, *, toast: bool = True, truncates: bool = True,
             keys: int = 12, truncate_at: frozenset[int] | None = None) -> list[list[dict]]:
    """Random transactions (lists of change rows); commit LSNs 100, 200, ...; `_seq` from 0 in each.

    `truncate_at`: the transactions (by index) that are truncates, instead of random ones (histories that share
    them can be applied to one table, a truncate ending every history's keys at the same place)."""
    rnd = random.Random(seed)
    alive: dict[int, dict] = {}
    out = []
    for t in range(transactions):
        lsn = 100 * (t + 1)
        rows: list[dict] = []

        def add(kind, rid, name=None, doc=None, unchanged=None):
            rows.append({"_change_type": kind, "_commit_lsn": lsn, "_commit_ts": ts_of(lsn), "_xid": t + 1,
                         "_seq": len(rows), "_origin": None, "_unchanged_toast": unchanged,
                         "id": rid, "name": name, "doc": doc})

        if (t in truncate_at) if truncate_at is not None else (truncates and t > 2 and rnd.random() < 0.08):
            add("truncate", None)
            alive.clear()
            out.append(rows)
            continue
        for _ in range(rnd.randint(1, 4)):
            free = [k for k in range(1, keys + 1) if k not in alive]
            choice = rnd.random()
            if not alive or (choice < 0.35 and free):
                k = rnd.choice(free)
                alive[k] = {"name": f"n{lsn}.{len(rows)}", "doc": f"doc{lsn}.{len(rows)}"}
                add("insert", k, alive[k]["name"], alive[k]["doc"])
            elif choice < 0.7:
                k = rnd.choice(sorted(alive))
                name = f"u{lsn}.{len(rows)}"
                if toast and rnd.random() < 0.5:
                    add("update_postimage", k, name, None, ["doc"])
                    alive[k]["name"] = name
                else:
                    doc = None if rnd.random() < 0.2 else f"d{lsn}.{len(rows)}"   # a real NULL sometimes
                    add("update_postimage", k, name, doc)
                    alive[k] = {"name": name, "doc": doc}
            elif choice < 0.82 and free:
                old = rnd.choice(sorted(alive))
                new = rnd.choice(free)
                add("update_preimage", old)
                row = alive.pop(old)
                if toast and rnd.random() < 0.6:
                    add("update_postimage", new, f"m{lsn}", None, ["doc"])
                    alive[new] = {"name": f"m{lsn}", "doc": row["doc"]}
                else:
                    add("update_postimage", new, f"m{lsn}", f"md{lsn}")
                    alive[new] = {"name": f"m{lsn}", "doc": f"md{lsn}"}
            else:
                k = rnd.choice(sorted(alive))
                add("delete", k)
                alive.pop(k)
        out.append(rows)
    return out
