"""Round trips: random streams built with the encoder decode to what a simple model of the protocol expects.

The model walks the same random choices that build the messages and records what must come out: the rows,
truncates and messages of every committed transaction (streamed ones with their aborted subtransactions left out,
prepared ones released by COMMIT PREPARED), the relations, and committed_lsn after every message. A differential
test then mutates valid streams at random: both implementations must give the same events or the same error.
"""
from __future__ import annotations

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from spockwire.errors import ProtocolError
from tests import normalize as N
from tests import wire_encoder as W
from tests.golden_vectors import ts
from tests.wire_encoder import UNCHANGED, Col, Internal

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

COLUMN_NAMES = ["id", "name", "amount", "note", "payload", "created", "flag", "ref"]
TYPE_OIDS = [20, 23, 25, 1700, 1184, 3802, 2950, 16, 16744]
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=10)
NAME = st.text("abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=8)


class Table:
    def __init__(self, relid: int, namespace: str, name: str) -> None:
        self.relid, self.namespace, self.name = relid, namespace, name
        self.cols: list[Col] = []
        self.replident = "d"
        self.version = 0        # 0: not described yet

    @property
    def qualified(self) -> str:
        return f"{self.namespace}.{self.name}"


class Txn:
    """A transaction the model has open: its items, each tagged with the (sub)transaction that made it."""

    def __init__(self, xid: int, origin: str | None, commit_ts: int) -> None:
        self.xid, self.origin, self.commit_ts = xid, origin, commit_ts
        self.items: list[tuple[int, dict]] = []
        self.aborted: set[int] = set()
        self.subxids = [xid]
        self.gid: str | None = None


class StreamModel:
    """Builds one random stream for one protocol and, alongside, what decoding it must give."""

    def __init__(self, draw, protocol: str, spock_version: int | None = None) -> None:
        self.draw, self.protocol, self.spock_version = draw, protocol, spock_version
        self.native = protocol != "pgoutput"
        self.records: list[tuple[int, bytes]] = []
        self.trace: list[int] = []
        self.expected: list[dict] = []
        self.nontx: list[dict] = []
        self.lsn = draw(st.integers(0x1000, 1 << 40))
        self.next_xid = draw(st.integers(3, 1 << 31))
        self.last_end = 0
        self.holds: dict[tuple, int] = {}
        self.streams: dict[int, Txn] = {}
        self.prepared: dict[str, Txn] = {}
        self.decoder_kwargs: dict = {}
        relids = draw(st.lists(st.integers(1, 0xFFFFFFFF), min_size=1, max_size=3, unique=True))
        self.tables = [Table(r, draw(st.sampled_from(["public", "sales", "x"])), f"t{i}_{draw(NAME)}")
                       for i, r in enumerate(relids)]

    # ------------------------------------------------------------------ bookkeeping
    def committed(self) -> int:
        return min([self.last_end, *self.holds.values()])

    def advance(self, step_max: int = 0x100) -> int:
        self.lsn += self.draw(st.integers(1, step_max))
        return self.lsn

    def new_xid(self) -> int:
        self.next_xid += self.draw(st.integers(1, 5))
        return self.next_xid & 0xFFFFFFFF or 1

    def emit(self, msg_type: str, **fields) -> None:
        if self.protocol == "spock":
            payload = W.spock(msg_type, proto=self.spock_version, insert_lsn=self.lsn, **fields)
        else:
            payload = W.encode(self.protocol, msg_type, **fields)
        self.records.append((self.lsn, payload))
        self.trace.append(self.committed())

    def release(self, txn: Txn, commit_lsn: int, commit_ts: int) -> None:
        seq = 0
        for sub, template in txn.items:
            if sub in txn.aborted:
                continue
            if template["kind"] == "row":
                item = dict(template, _commit_lsn=commit_lsn, _commit_ts=ts(commit_ts), _seq=seq,
                            _xid=txn.xid, _origin=txn.origin)
            else:
                item = dict(template, commit_lsn=commit_lsn, seq=seq, xid=txn.xid, origin=txn.origin)
                item["commit_ts"] = ts(commit_ts)
            self.expected.append(item)
            seq += 1

    # ------------------------------------------------------------------ values and relations
    def value(self, in_new_update: bool):
        kinds = ["n", "t", "t", "b"] + (["i"] if self.native else []) + (["u"] if in_new_update else [])
        kind = self.draw(st.sampled_from(kinds))
        if kind == "n":
            return None, None
        if kind == "u":
            return UNCHANGED, None
        if kind == "t":
            text = self.draw(TEXT)
            return text, text
        data = self.draw(st.binary(max_size=10))
        return (Internal(data) if kind == "i" else data), data

    def tuple_values(self, table: Table, in_new_update: bool = False):
        wire, decoded, toast = [], {}, []
        for col in table.cols:
            w, d = self.value(in_new_update)
            wire.append(w)
            decoded[col.name] = d
            if w is UNCHANGED:
                toast.append(col.name)
        return wire, decoded, (toast or None)

    def describe(self, table: Table, sub: int | None, change_columns: bool) -> None:
        if change_columns or not table.cols:
            names = self.draw(st.lists(st.sampled_from(COLUMN_NAMES), min_size=1, max_size=5, unique=True))
            table.cols = [Col(n, self.draw(st.sampled_from(TYPE_OIDS)), self.draw(st.sampled_from([-1, 0x000c0006])),
                              self.draw(st.booleans())) for n in names]
            table.replident = self.draw(st.sampled_from("dnfi"))
        table.version += 1
        if self.protocol == "pgoutput":
            for col in table.cols:
                if col.type_oid >= 10000 and self.draw(st.booleans()):
                    self.emit("Y", xid=sub, type_oid=col.type_oid, namespace="", name="int4")
            self.emit("R", xid=sub, relid=table.relid, namespace=table.namespace, name=table.name,
                      replident=table.replident, columns=table.cols)
        else:
            self.emit("R", relid=table.relid, namespace=table.namespace, name=table.name, columns=table.cols)

    # ------------------------------------------------------------------ changes inside a transaction
    def changes(self, txn: Txn, sub_choices: list[int] | None = None, allow_messages: bool = True) -> None:
        ops = ["insert", "insert", "update", "delete", "resend"]
        if self.protocol != "pglogical":
            ops.append("truncate")
            if allow_messages:
                ops.append("message")
        for _ in range(self.draw(st.integers(0, 8))):
            sub = self.draw(st.sampled_from(sub_choices)) if sub_choices else None
            tag = sub if sub is not None else txn.xid
            xid_field = {"xid": sub} if (sub is not None and self.protocol == "pgoutput") else {}
            op = self.draw(st.sampled_from(ops))
            table = self.draw(st.sampled_from(self.tables))
            if op == "truncate":
                described = [t for t in self.tables if t.version]
                if not described:
                    continue
                chosen = self.draw(st.lists(st.sampled_from(described), min_size=1, max_size=3, unique_by=id))
                flags = self.draw(st.integers(0, 3))
                self.advance()
                self.emit("T", flags=flags, relids=[t.relid for t in chosen], **xid_field)
                txn.items.append((tag, {"kind": "truncate", "tables": [t.qualified for t in chosen],
                                        "cascade": bool(flags & 1), "restart_identity": bool(flags & 2)}))
                continue
            if op == "message":
                content = self.draw(st.binary(max_size=12))
                lsn = self.advance()
                if self.protocol == "spock":
                    prefix = "Spock"
                    self.emit("M", xid=txn.xid, lsn=lsn, transactional=1, content=content)
                else:
                    prefix = self.draw(NAME)
                    self.emit("M", flags=1, lsn=lsn, prefix=prefix, content=content, **xid_field)
                txn.items.append((tag, {"kind": "message", "prefix": prefix, "content": content,
                                        "transactional": True, "lsn": lsn}))
                continue
            if table.version == 0 or op == "resend":
                self.advance()
                self.describe(table, sub, change_columns=table.version > 0 and self.draw(st.booleans()))
                if op == "resend":
                    continue
            self.advance()
            head = {"kind": "row", "table": table.qualified, "version": table.version}
            if op == "insert":
                wire, decoded, _ = self.tuple_values(table)
                self.emit("I", relid=table.relid, new=wire, **xid_field)
                txn.items.append((tag, dict(head, _change_type="insert", _unchanged_toast=None, **decoded)))
            elif op == "update":
                old_kind = self.draw(st.sampled_from(["", "K", "O"]))
                new_wire, new_decoded, toast = self.tuple_values(table, in_new_update=True)
                if old_kind:
                    old_wire, old_decoded, _ = self.tuple_values(table)
                    self.emit("U", relid=table.relid, old_kind=old_kind, old=old_wire, new=new_wire, **xid_field)
                    txn.items.append((tag, dict(head, _change_type="update_preimage", _unchanged_toast=None,
                                                **old_decoded)))
                else:
                    self.emit("U", relid=table.relid, new=new_wire, **xid_field)
                txn.items.append((tag, dict(head, _change_type="update_postimage", _unchanged_toast=toast,
                                            **new_decoded)))
            else:
                old_wire, old_decoded, _ = self.tuple_values(table)
                old_kind = self.draw(st.sampled_from(["K", "O"]))
                self.emit("D", relid=table.relid, old_kind=old_kind, old=old_wire, **xid_field)
                txn.items.append((tag, dict(head, _change_type="delete", _unchanged_toast=None, **old_decoded)))

    # ------------------------------------------------------------------ transactions
    def origin_for_plain(self) -> str | None:
        """Send ORIGIN (and spock's LAST-COMMIT) after BEGIN; return the origin the rows must carry."""
        if self.protocol == "spock":
            origin_lsn = self.draw(st.sampled_from([0, 0, self.draw(st.integers(1, 1 << 40))]))
            node = self.draw(st.integers(0, 0xFFFF))
            name = self.draw(NAME) if self.spock_version >= 5 and self.draw(st.booleans()) else None
            self.emit("O", origin_lsn=origin_lsn, origin_id=node, name=name)
            self.emit("L", last_commit_ts=self.draw(st.integers(0, 1 << 50)))
            if origin_lsn == 0:
                return None
            return name if name is not None else str(node)
        if self.draw(st.booleans()):
            name = self.draw(NAME)
            self.emit("O", origin_lsn=self.draw(st.integers(0, 1 << 40)), name=name)
            return name
        return None

    def plain(self) -> None:
        xid, commit_ts = self.new_xid(), self.draw(st.integers(-(1 << 40), 1 << 52))
        commit_lsn = self.advance(0x10000)    # nothing else commits before this block's COMMIT
        self.emit("B", final_lsn=commit_lsn, commit_ts=commit_ts, xid=xid)
        txn = Txn(xid, self.origin_for_plain(), commit_ts)
        self.changes(txn)
        end_lsn = commit_lsn + self.draw(st.integers(1, 0x100))
        self.lsn = max(self.lsn, end_lsn)
        self.release(txn, commit_lsn, commit_ts)
        self.last_end = end_lsn
        self.emit("C", commit_lsn=commit_lsn, end_lsn=end_lsn, commit_ts=commit_ts)

    def nontransactional_message(self) -> None:
        content, lsn = self.draw(st.binary(max_size=12)), self.advance()
        if self.protocol == "spock":
            prefix = "Spock"
            self.emit("M", xid=0, lsn=lsn, transactional=0, content=content)
        else:
            prefix = self.draw(NAME)
            self.emit("M", flags=0, lsn=lsn, prefix=prefix, content=content)
        self.nontx.append({"kind": "message", "prefix": prefix, "content": content, "transactional": False,
                           "lsn": lsn, "xid": None, "commit_lsn": None, "commit_ts": None, "seq": None,
                           "origin": None})

    # pgoutput only from here on
    def stream_segment(self) -> None:
        open_xids = sorted(self.streams)
        if open_xids and self.draw(st.booleans()):
            xid = self.draw(st.sampled_from(open_xids))
            txn = self.streams[xid]
            self.emit("S", xid=xid, first_segment=0)
        else:
            xid = self.new_xid()
            self.next_xid += 10          # room for its subtransaction xids
            txn = self.streams[xid] = Txn(xid, None, 0)
            self.holds[("stream", xid)] = self.committed()
            self.emit("S", xid=xid, first_segment=1)
            if self.draw(st.booleans()):
                txn.origin = self.draw(NAME)
                self.emit("O", origin_lsn=self.draw(st.integers(0, 1 << 40)), name=txn.origin)
        if self.draw(st.booleans()) and len(txn.subxids) < 4:
            txn.subxids.append(txn.subxids[-1] + 1)
        live = [s for s in txn.subxids if s not in txn.aborted]
        self.changes(txn, sub_choices=live)
        self.emit("E")

    def stream_abort_sub(self) -> None:
        candidates = [(x, s) for x, t in sorted(self.streams.items()) for s in t.subxids[1:] if s not in t.aborted]
        if not candidates:
            return
        xid, sub = self.draw(st.sampled_from(candidates))
        self.streams[xid].aborted.add(sub)
        self.emit("A", xid=xid, subxid=sub)

    def stream_end(self) -> None:
        if not self.streams:
            return
        xid = self.draw(st.sampled_from(sorted(self.streams)))
        txn = self.streams.pop(xid)
        how = self.draw(st.sampled_from(["commit", "commit", "abort", "prepare"]))
        if how == "commit":
            commit_lsn, commit_ts = self.advance(), self.draw(st.integers(0, 1 << 52))
            end_lsn = self.advance()
            self.release(txn, commit_lsn, commit_ts)
            del self.holds[("stream", xid)]
            self.last_end = end_lsn
            self.emit("c", xid=xid, commit_lsn=commit_lsn, end_lsn=end_lsn, commit_ts=commit_ts)
        elif how == "abort":
            del self.holds[("stream", xid)]
            if self.draw(st.booleans()):
                self.emit("A", xid=xid, subxid=xid, abort_lsn=self.advance(), abort_ts=self.draw(st.integers(0, 1 << 52)))
            else:
                self.emit("A", xid=xid, subxid=xid)
        else:
            gid = f"gid-{xid}"
            txn.gid = gid
            self.prepared[gid] = txn
            self.holds[("prepared", gid)] = self.holds.pop(("stream", xid))
            lsn = self.advance()
            self.emit("p", lsn=lsn, end_lsn=self.advance(), ts=self.draw(st.integers(0, 1 << 52)), xid=xid, gid=gid)

    def begin_prepare(self) -> None:
        xid, prepare_ts = self.new_xid(), self.draw(st.integers(0, 1 << 52))
        gid = f"gid-{xid}"
        prepare_lsn = self.advance()
        end_lsn = prepare_lsn + 0x10
        self.holds[("prepared", gid)] = self.committed()
        self.emit("b", lsn=prepare_lsn, end_lsn=end_lsn, ts=prepare_ts, xid=xid, gid=gid)
        txn = Txn(xid, None, 0)
        if self.draw(st.booleans()):
            txn.origin = self.draw(NAME)
            self.emit("O", origin_lsn=1, name=txn.origin)
        txn.gid = gid
        self.changes(txn)
        self.lsn = max(self.lsn, end_lsn)
        self.prepared[gid] = txn
        self.emit("P", lsn=prepare_lsn, end_lsn=end_lsn, ts=prepare_ts, xid=xid, gid=gid)

    def resolve_prepared(self) -> None:
        if not self.prepared:
            return
        gid = self.draw(st.sampled_from(sorted(self.prepared)))
        txn = self.prepared.pop(gid)
        del self.holds[("prepared", gid)]
        if self.draw(st.booleans()):
            commit_lsn, commit_ts = self.advance(), self.draw(st.integers(0, 1 << 52))
            end_lsn = self.advance()
            self.release(txn, commit_lsn, commit_ts)
            self.last_end = end_lsn
            self.emit("K", lsn=commit_lsn, end_lsn=end_lsn, ts=commit_ts, xid=txn.xid, gid=gid)
        else:
            self.emit("r", prepare_end_lsn=self.advance(), rollback_end_lsn=self.advance(), prepare_ts=1,
                      rollback_ts=2, xid=txn.xid, gid=gid)

    # ------------------------------------------------------------------ the whole stream
    def build(self, steps: int, streaming: bool, two_phase: bool) -> "StreamModel":
        if self.protocol == "spock":
            if self.spock_version == 4 and self.draw(st.booleans()):
                self.decoder_kwargs = {"proto_version": 4}
            else:
                params = {"max_proto_version": "5", "min_proto_version": "4", "coltypes": "f"}
                if self.spock_version == 5:
                    params["proto_version"] = "5"
                else:
                    params["spock_version_num"] = "50003"
                self.emit("S", params=params)
        elif self.protocol == "pglogical":
            self.emit("S", params={"max_proto_version": "1", "min_proto_version": "1"})
        # small batches, so that batches fill up and close in the middle of transactions (between a relation's
        # re-description and the rows after it, around truncates and messages), and sometimes every closed batch
        # of an open transaction spilled to disk
        batch_rows = self.draw(st.sampled_from([None, 1, 2, 3]))
        if batch_rows is not None:
            self.decoder_kwargs["batch_rows"] = batch_rows
            if self.draw(st.booleans()):
                self.decoder_kwargs["spill_bytes"] = 0
        actions = [self.plain, self.plain]
        if self.protocol != "pglogical":
            actions.append(self.nontransactional_message)
        if streaming:
            actions += [self.stream_segment, self.stream_segment, self.stream_abort_sub, self.stream_end]
        if two_phase:
            actions += [self.begin_prepare, self.resolve_prepared]
        for _ in range(steps):
            action = self.draw(st.sampled_from(actions))
            if self.protocol == "pglogical" and action is self.plain and self.draw(st.integers(0, 9)) == 0:
                self.emit("S", params={"max_proto_version": "1", "min_proto_version": "1"})
            action()
        return self

    def relations(self) -> dict:
        out = {}
        for t in self.tables:
            if t.version:
                cols = [(c.name, None if self.protocol == "pglogical" else c.type_oid,
                         None if self.protocol == "pglogical" else c.typmod, c.key) for c in t.cols]
                out[t.relid] = {"relid": t.relid, "namespace": t.namespace, "name": t.name,
                                "replica_identity": t.replident if self.protocol == "pgoutput" else None,
                                "version": t.version, "columns": cols}
        return out


@st.composite
def streams(draw, protocol: str, spock_version: int | None = None, streaming=False, two_phase=False):
    model = StreamModel(draw, protocol, spock_version)
    return model.build(draw(st.integers(1, 8)), streaming, two_phase)


# ---------------------------------------------------------------------------------------------------------------

def _decode_and_check(impl, model: StreamModel, draw_points) -> list:
    dec = impl.Decoder(protocol=model.protocol, **{"types": "raw", **model.decoder_kwargs})
    events, trace = [], []
    if draw_points is None:
        body = W.frames(model.records)
        assert dec.feed_frames(body) == len(body)
        events.extend(dec.drain())
        assert dec.committed_lsn == (model.trace[-1] if model.trace else 0)
    else:
        for i, (lsn, payload) in enumerate(model.records):
            dec.feed(payload, lsn)
            trace.append(dec.committed_lsn)
            if i in draw_points:
                events.extend(dec.drain())
        events.extend(dec.drain())
        assert trace == model.trace
    N.check_ordering(events)
    for event in events:
        if hasattr(event, "to_arrow"):
            N.check_batch_schema(event)
    assert N.values_as_bytes(N.changes(events)) == N.values_as_bytes(model.expected)
    N.check_text_columns(events, model.expected)
    assert N.nontransactional(events) == model.nontx
    assert {r: N.relation_data(rel) for r, rel in dec.relations.items()} == model.relations()
    return N.plain_events(events)


def _describe_model(model: StreamModel) -> str:
    lines = [f"protocol={model.protocol} spock_version={model.spock_version} kwargs={model.decoder_kwargs}"]
    lines += [f"  {lsn:#x} {payload.hex(' ')}" for lsn, payload in model.records]
    lines += ["expected:"] + [f"  {item}" for item in model.expected] + [f"committed trace: {model.trace}"]
    return "\n".join(lines)


def _round_trip(both_impls, data, model):
    note(_describe_model(model))
    use_frames = data.draw(st.booleans())
    points = None if use_frames else set(data.draw(st.lists(st.integers(0, len(model.records)), max_size=5)))
    results = [_decode_and_check(impl, model, points) for impl in both_impls]
    assert results[0] == results[1], "C and Python cut or typed the batches differently"


@settings(max_examples=60, **SETTINGS)
@given(data=st.data())
def test_pgoutput_round_trip(both_impls, data):
    model = data.draw(streams("pgoutput", streaming=True, two_phase=True))
    _round_trip(both_impls, data, model)


@settings(max_examples=25, **SETTINGS)
@given(data=st.data())
def test_pgoutput_plain_round_trip(both_impls, data):
    model = data.draw(streams("pgoutput"))
    _round_trip(both_impls, data, model)


@settings(max_examples=40, **SETTINGS)
@given(data=st.data())
def test_pglogical_round_trip(both_impls, data):
    model = data.draw(streams("pglogical"))
    _round_trip(both_impls, data, model)


@settings(max_examples=40, **SETTINGS)
@given(data=st.data(), version=st.sampled_from([4, 5]))
def test_spock_round_trip(both_impls, data, version):
    model = data.draw(streams("spock", spock_version=version))
    _round_trip(both_impls, data, model)


# ---------------------------------------------------------------------------------------------------------------
# differential: mutated streams give the same events or the same error in both implementations

def _mutate(data, records: list[bytes]) -> list[bytes]:
    records = list(records)
    if not records:
        return records
    i = data.draw(st.integers(0, len(records) - 1))
    msg = bytearray(records[i])
    how = data.draw(st.sampled_from(["flip", "set", "cut", "insert", "delete", "drop", "duplicate", "swap"]))
    if how in ("flip", "set", "delete") and msg:
        at = data.draw(st.integers(0, len(msg) - 1))
        if how == "flip":
            msg[at] ^= 1 << data.draw(st.integers(0, 7))
        elif how == "set":
            msg[at] = data.draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF, ord("n"), ord("u"), ord("t"), ord("b"),
                                                 ord("i"), ord("K"), ord("O"), ord("N")]))
        else:
            del msg[at]
    elif how == "cut":
        del msg[data.draw(st.integers(0, len(msg))):]
    elif how == "insert":
        msg.insert(data.draw(st.integers(0, len(msg))), data.draw(st.integers(0, 255)))
    elif how == "drop":
        return records[:i] + records[i + 1:]
    elif how == "duplicate":
        return records[:i + 1] + records[i:]
    elif how == "swap" and i + 1 < len(records):
        records[i], records[i + 1] = records[i + 1], records[i]
        return records
    records[i] = bytes(msg)
    return records


def _run_until_error(impl, protocol, kwargs, records):
    dec = impl.Decoder(protocol=protocol, **{"types": "raw", **kwargs})
    events, trace = [], []
    for index, payload in enumerate(records):
        try:
            dec.feed(payload)
        except ProtocolError as exc:
            return (N.plain_events(events + dec.drain()), trace,
                    (index, type(exc), str(exc), exc.offset, exc.needed, exc.remaining, exc.column))
        trace.append(dec.committed_lsn)
        if index % 3 == 0:
            events.extend(dec.drain())
    return N.plain_events(events + dec.drain()), trace, None


@settings(max_examples=150, **SETTINGS)
@given(data=st.data(), kind=st.sampled_from(["pgoutput", "pglogical", "spock4", "spock5"]))
def test_mutated_streams_behave_the_same(both_impls, data, kind):
    if kind.startswith("spock"):
        model = data.draw(streams("spock", spock_version=int(kind[-1])))
    else:
        model = data.draw(streams(kind, streaming=kind == "pgoutput", two_phase=kind == "pgoutput"))
    records = [p for _, p in model.records]
    for _ in range(data.draw(st.integers(1, 3))):
        records = _mutate(data, records)
    c_impl, py_impl = both_impls
    c_result = _run_until_error(c_impl, model.protocol, model.decoder_kwargs, records)
    py_result = _run_until_error(py_impl, model.protocol, model.decoder_kwargs, records)
    assert c_result == py_result
