"""The sequential path of a resolution (spockwire.spark.resolve, step 4): keys whose changes interleave with what is
stored, and TOASTed values carried across a key change, resolved one key at a time by `_fold`, the sequential
definition of the rules."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .resolve_frame import _NO, _Frame, _Refs

# ---------------------------------------------------------------------------------------------------------------
# the sequential path

def _moves(fr: _Frame) -> list[tuple[int, int, int, int]]:
    """Key changes whose postimage carries a column: (old key, new key, preimage position, postimage row), in
    position order."""
    if fr.moves_found is not None:
        return fr.moves_found
    t = fr.ev.table
    found: list[tuple[int, int, int, int]] = []
    carrying = np.zeros(t.num_rows, dtype=bool)
    for mask in fr.ev.carried.values():
        carrying |= mask
    if carrying.any() and {"_commit_lsn", "_seq"} <= set(t.column_names):
        kinds = t.column("_change_type").to_numpy(zero_copy_only=False)
        pre_rows = np.nonzero(kinds == "update_preimage")[0]
        if len(pre_rows):
            lsn = t.column("_commit_lsn").to_numpy(zero_copy_only=False)
            seq = t.column("_seq").to_numpy(zero_copy_only=False)
            post = {(lsn[i], seq[i]): i for i in np.nonzero((kinds == "update_postimage") & carrying)[0]}
            for i in pre_rows:
                j = post.get((lsn[i], seq[i] + 1))
                if j is not None and fr.ev_key[j] != fr.ev_key[i]:
                    found.append((int(fr.ev_key[i]), int(fr.ev_key[j]), int(fr.ev_pos[i]), int(j)))
    found.sort(key=lambda m: m[2])
    fr.moves_found = found
    return found


def _moved_keys(fr: _Frame) -> np.ndarray:
    """Keys of key changes whose postimage carries TOAST values, old and new (resolved sequentially)."""
    if not fr.ev.carried:
        return np.zeros(0, np.int64)
    return np.array(sorted({k for m in _moves(fr) for k in m[:2]}), np.int64)


def _sequential(fr: _Frame, refs: _Refs, keys: np.ndarray, order: np.ndarray, gs: np.ndarray, ge: np.ndarray,
                gkey: np.ndarray) -> None:
    """Resolve `keys` one at a time with :func:`_fold`. Values carried across a key change are filled first, in
    sequence order, from the old key's state just before it."""
    plan = fr.plan
    group_of = {int(k): g for g, k in enumerate(gkey)}
    stored_of: dict[int, list[int]] = {}
    if fr.st_key is not None:
        for i in np.nonzero(np.isin(fr.st_key, keys))[0]:
            stored_of.setdefault(int(fr.st_key[i]), []).append(int(i))
    tombs_of: dict[int, list[int]] = {}
    if fr.tb_key is not None:
        for i in np.nonzero(np.isin(fr.tb_key, keys))[0]:
            tombs_of.setdefault(int(fr.tb_key[i]), []).append(int(i))
    truncates = sorted(int(p) for p in np.concatenate([fr.stored_tr, fr.batch_tr]))
    columns = list(fr.ev.carried)

    def events_of(k: int) -> list[int]:
        g = group_of.get(k)
        return [] if g is None else [int(i) for i in order[gs[g]:ge[g]]]

    fixed: dict[int, dict[str, int]] = {}
    for old, _new, pre_pos, post_row in _moves(fr):
        recs = _records(fr, events_of(old), stored_of.get(old, []), tombs_of.get(old, []), fixed, columns,
                        before=pre_pos)
        state = _fold(recs, [p for p in truncates if p < pre_pos], 1)
        if state and state[0]["op"] == 0:
            values, base = state[0]["values"], state[0]["base"]
            fixed[post_row] = {c: (values.get(c, base) if fr.ev.carried[c][post_row] else post_row)
                               for c in columns}
    for k in keys:
        k = int(k)
        recs = _records(fr, events_of(k), stored_of.get(k, []), tombs_of.get(k, []), fixed, columns)
        key_row = next(r["row"] for r in recs if r["row"] != _NO)
        for row in _fold(recs, truncates, plan.scd):
            if row["changed"]:
                base = row["base"]
                refs.add(np.array([key_row]), np.array([base]),
                         {c: np.array([row["values"].get(c, base)]) for c in columns},
                         np.array([row["start"]]), np.array([row["end"]]), np.array([row["op"]]))


def _records(fr: _Frame, ev_rows: list[int], st_rows: list[int], tb_rows: list[int],
             fixed: dict[int, dict[str, int]], columns: list[str], before: int | None = None) -> list[dict]:
    """A key's timeline entries for :func:`_fold`: stored versions (kind 0), remembered deletes (kind 1) and the
    batch's changes (kind 2) -- positions as ranks, values as row references; only those before `before`."""
    ne = fr.ev.table.num_rows
    limit = np.iinfo(np.int64).max if before is None else before
    recs: list[dict] = []
    for i in st_rows:
        if fr.st_pos[i] < limit:
            end = int(fr.st_end[i]) if fr.st_end is not None else _NO
            recs.append({"kind": 0, "pos": int(fr.st_pos[i]), "row": ne + i, "end": end if end < limit else _NO})
    for i in tb_rows:
        if fr.tb_pos[i] < limit:
            recs.append({"kind": 1, "pos": int(fr.tb_pos[i]), "row": _NO})
    for i in ev_rows:
        if fr.ev_pos[i] < limit:
            recs.append({"kind": 2, "pos": int(fr.ev_pos[i]), "row": i, "op": int(fr.ev.op[i]),
                         "fixed": fixed.get(i),
                         "carry": tuple(c for c in columns if fr.ev.carried[c][i])})
    return recs


def _fold(records: list[dict], truncates: Sequence[int], scd: int) -> list[dict]:
    """The rows to store for one key, by replaying its timeline in position order: the definition the vectorised
    passes follow. Entries at the same position count once (the stored one first: a re-applied change).

    Returns dicts: ``op`` (0 upsert / version, 1 delete), ``start``, ``end`` (position ranks, -1 none), ``base``
    (the row the values come from), ``values`` (carried column -> row), ``changed`` (differs from the target)."""
    timeline: list[tuple[int, int, int, dict]] = []
    stored_starts = set()
    stored_tomb = _NO
    for r in records:
        if r["kind"] == 0:
            timeline.append((r["pos"], 0, 0, r))
            stored_starts.add(r["pos"])
        elif r["kind"] == 1:
            timeline.append((r["pos"], 0, 1, r))
            stored_tomb = max(stored_tomb, r["pos"])
        else:
            timeline.append((r["pos"], 1, r["op"], r))
    ended = {"kind": 3, "row": _NO}
    if scd == 2:
        for r in records:
            if r["kind"] == 0 and r["end"] != _NO and r["end"] not in stored_starts:
                timeline.append((r["end"], 0, 1, ended))
    for p in truncates:
        timeline.append((p, 0, 1, ended))
    timeline.sort(key=lambda t: (t[0], t[1]))
    versions: list[dict] = []
    new_deletes: list[int] = []
    alive: dict | None = None
    last_pos = None
    last_delete = None
    for pos, prio, op, r in timeline:
        if pos == last_pos:
            continue
        last_pos = pos
        if op == 0:
            row = r["row"]
            if r.get("fixed") is not None:
                values = dict(r["fixed"])
            else:
                values = {c: (alive["values"].get(c, alive["base"]) if alive is not None else row)
                          for c in r.get("carry", ())}
            if alive is not None:
                alive["end"] = pos
            alive = {"start": pos, "base": row, "values": values, "end": _NO, "stored": r if prio == 0 else None}
            versions.append(alive)
        else:
            if alive is not None:
                alive["end"] = pos
            alive = None
            last_delete = pos
            if prio == 1:
                new_deletes.append(pos)
    if scd == 1:
        if alive is not None:
            return [{"op": 0, "start": alive["start"], "end": _NO, "base": alive["base"], "values": alive["values"],
                     "changed": alive["stored"] is None}]
        if last_delete is not None:
            return [{"op": 1, "start": last_delete, "end": _NO, "base": _NO, "values": {},
                     "changed": bool(stored_starts) or stored_tomb != last_delete}]
        return []
    out = [{"op": 0, "start": v["start"], "end": v["end"], "base": v["base"], "values": v["values"],
            "changed": v["stored"] is None or v["stored"]["end"] != v["end"]} for v in versions]
    out += [{"op": 1, "start": p, "end": _NO, "base": _NO, "values": {}, "changed": True} for p in new_deletes]
    return out
