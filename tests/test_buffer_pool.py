"""The pool of large column buffers (spockwire/wire/_buffers.pxi): buffers that pyarrow lets go of are reused by
later batches, and reuse never changes a value, in batches being built or in batches still held."""
from __future__ import annotations

import gc

import pytest

from tests import wire_encoder as W
from tests.test_views import _expected, _records, _rows, _source_rows

pytestmark = pytest.mark.fast

# 6,000 rows and their 6,000 updates: the int4, offsets and validity buffers of a batch pass the 64 KiB from
# which a buffer is large (pooled), and the text data buffers pass it many times over
ROWS = _source_rows(6000)


def _decode(impl, binary: bool, strings: str = "plain", batch_rows: int = 4096):
    dec = impl.Decoder("pgoutput", strings=strings, batch_rows=batch_rows)
    dec.feed_frames(W.frames(_records(ROWS, binary)))
    return [e.to_arrow() for e in dec.drain()]


@pytest.fixture
def pool(impl):
    """The pool limit of the module under test, restored afterwards (the pool starts empty)."""
    previous = impl.set_buffer_pool_bytes(0)
    impl.set_buffer_pool_bytes(previous)
    yield impl
    impl.set_buffer_pool_bytes(previous)


def test_limit_is_set_and_checked_alike(both_impls):
    for impl in both_impls:
        previous = impl.set_buffer_pool_bytes(1 << 20)
        try:
            assert impl.set_buffer_pool_bytes(2 << 20) == 1 << 20
            assert impl.buffer_pool_stats()["limit"] == 2 << 20
        finally:
            impl.set_buffer_pool_bytes(previous)
    errors = []
    for impl in both_impls:
        with pytest.raises(ValueError) as info:
            impl.set_buffer_pool_bytes(-1)
        errors.append(str(info.value))
    assert errors[0] == errors[1] == "the buffer pool limit must be 0 or more bytes, got -1"


@pytest.mark.parametrize("strings", ["plain", "view"])
@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_reused_buffers_give_the_same_values_and_held_batches_stay_intact(pool, binary, strings):
    expected = _expected(ROWS)
    pool.set_buffer_pool_bytes(0)
    held = _decode(pool, binary, strings)           # built with the pool off, kept alive throughout
    assert _rows(held) == expected
    pool.set_buffer_pool_bytes(64 << 20)
    for _ in range(3):
        batches = _decode(pool, binary, strings)
        for b in batches:
            b.validate(full=True)
        assert _rows(batches) == expected
        del batches
        gc.collect()
    assert _rows(held) == expected
    stats = pool.buffer_pool_stats()
    if pool.IMPLEMENTATION == "c":
        # the later rounds were built in the buffers the earlier ones gave back
        assert stats["hits"] > 0
        assert 0 < stats["buffers"] and 0 < stats["bytes"] <= 64 << 20
    else:
        assert stats["buffers"] == stats["bytes"] == 0


def test_pool_is_bounded_and_emptied(both_impls):
    pool = both_impls[0]                       # the compiled decoder: the twin keeps no buffers
    previous = pool.set_buffer_pool_bytes(256 << 10)
    try:
        _bounded_and_emptied(pool)
    finally:
        pool.set_buffer_pool_bytes(previous)


def _bounded_and_emptied(pool):
    batches = _decode(pool, False)
    del batches
    gc.collect()
    stats = pool.buffer_pool_stats()
    assert 0 < stats["bytes"] <= 256 << 10
    pool.set_buffer_pool_bytes(0)
    stats = pool.buffer_pool_stats()
    assert stats["buffers"] == stats["bytes"] == 0
    assert _rows(_decode(pool, False)) == _expected(ROWS)   # no pool: still the same values


def test_buffers_are_reserved_in_the_sizes_the_pool_holds(both_impls):
    """A builder reserves ahead (the rows the rest of the fed input can bring, the value bytes at their average so
    far) instead of doubling through sizes the pool never holds: once one decode has filled the pool, the same
    input decodes again with its large buffers taken from it."""
    pool = both_impls[0]                       # the compiled decoder: the twin keeps no buffers
    previous = pool.set_buffer_pool_bytes(0)
    pool.set_buffer_pool_bytes(64 << 20)
    try:
        expected = _expected(ROWS)
        for binary in (False, True):
            assert _rows(_decode(pool, binary, batch_rows=1 << 18)) == expected
            gc.collect()
            before = pool.buffer_pool_stats()
            for _ in range(2):
                assert _rows(_decode(pool, binary, batch_rows=1 << 18)) == expected
                gc.collect()
            after = pool.buffer_pool_stats()
            hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
            # doubling from 256 rows missed all but the last size of every buffer; reserving ahead misses at most
            # where the average value size moves (the updates' rows differ from the inserts')
            assert hits >= 2 * 8 and misses * 4 <= hits, (before, after)
    finally:
        pool.set_buffer_pool_bytes(previous)


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_null_counts_equal_the_nulls_in_every_column(impl, binary):
    """Arrow trusts the null count the decoder hands over: it must equal the column's nulls, counted over whole
    64-bit words of the validity bitmap and the bytes and bits after them (batch sizes 4096 and 777)."""
    for batch_rows in (4096, 777):
        for batch in _decode(impl, binary, batch_rows=batch_rows):
            for name in batch.schema.names:
                column = batch.column(name)
                assert column.null_count == sum(v is None for v in column.to_pylist()), name
            assert 0 < batch.column("js").null_count < batch.num_rows
