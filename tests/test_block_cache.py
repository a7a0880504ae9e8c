"""The block cache: NumPy's data memory through kept blocks inside a fit."""

import multiprocessing
import os
import threading

import numpy as np
import pytest
from numpy._core.multiarray import get_handler_name

from skgpstruct import GPStructClassifier
from skgpstruct._block_cache import (
    HANDLER_NAME,
    MAX_CACHED_BYTES,
    MIN_BLOCK_BYTES,
    N_SLOTS,
    cache_info,
    reuse_blocks,
)
from skgpstruct.datasets import make_sequences

LARGE = 4 * MIN_BLOCK_BYTES // 8  # float64 entries of a kept block


def test_a_freed_block_serves_the_next_array_of_its_size():
    with reuse_blocks():
        a = np.full(LARGE, 7.0)
        assert get_handler_name(a) == HANDLER_NAME
        address = a.ctypes.data
        del a
        assert cache_info()["cached_bytes"] == LARGE * 8
        hits = cache_info()["hits"]
        b = np.empty(LARGE)
        assert b.ctypes.data == address and cache_info()["hits"] == hits + 1
        del b
        # zeroed requests get a cleared block
        c = np.zeros(LARGE)
        assert c.ctypes.data == address
        assert not np.any(c)
        # another size is not served from it
        d = np.empty(LARGE + 1)
        assert d.ctypes.data != address
    assert get_handler_name(np.empty(LARGE)) != HANDLER_NAME


def test_small_blocks_are_not_kept():
    with reuse_blocks():
        a = np.ones(MIN_BLOCK_BYTES // 8 - 1)
        del a
        assert cache_info()["cached_bytes"] == 0


def test_arrays_outlive_the_block_and_nothing_is_kept_after_it():
    with reuse_blocks():
        kept = [np.full(LARGE, float(i)) for i in range(5)]
        for i in range(3):
            temporary = np.arange(LARGE, dtype=np.float64) * i
            del temporary
        assert cache_info()["cached_bytes"] > 0
    assert cache_info() | {"hits": 0} == {"cached_bytes": 0, "hits": 0, "open": 0}
    for i, array in enumerate(kept):
        assert np.all(array == i)
    del kept  # freed straight to malloc's free now
    assert cache_info()["cached_bytes"] == 0


def test_nested_blocks_keep_the_cache_until_the_outer_one_closes():
    with reuse_blocks():
        with reuse_blocks():
            assert cache_info()["open"] == 2
            np.ones(LARGE).sum()  # a temporary, freed at once
        assert cache_info()["open"] == 1
        assert cache_info()["cached_bytes"] == LARGE * 8
    assert cache_info()["cached_bytes"] == 0 and cache_info()["open"] == 0


def test_the_cache_stays_within_its_bounds():
    size = MIN_BLOCK_BYTES // 8
    with reuse_blocks():
        arrays = [np.empty(size + i) for i in range(N_SLOTS + 10)]
        del arrays
        info = cache_info()
        assert 0 < info["cached_bytes"] <= MAX_CACHED_BYTES
        assert info["cached_bytes"] <= N_SLOTS * (size + N_SLOTS + 10) * 8
        big = np.empty(MAX_CACHED_BYTES // 8 + 1)  # larger than the cache
        del big
        assert cache_info()["cached_bytes"] <= MAX_CACHED_BYTES


def test_resized_arrays_keep_their_values():
    with reuse_blocks():
        a = np.arange(LARGE, dtype=np.float64)
        a.resize(2 * LARGE, refcheck=False)  # realloc
        assert np.array_equal(a[:LARGE], np.arange(LARGE))
        del a
        b = np.ones(2 * LARGE)
        assert np.all(b == 1.0)


def test_threads_share_the_cache_without_mixing_their_arrays():
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        with reuse_blocks():
            for _ in range(50):
                n = LARGE + int(rng.integers(3))
                value = float(rng.integers(1000))
                a = np.full(n, value)
                b = np.zeros(n)
                b += a
                if not (np.all(b == value) and np.all(a == value)):
                    errors.append(seed)
                del a, b

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert cache_info()["open"] == 0 and cache_info()["cached_bytes"] == 0


def _allocate_in_child(queue):
    with reuse_blocks():
        hits = cache_info()["hits"]
        a = np.full(LARGE, 3.0)
        # nothing kept yet: a fresh block, and no bytes counted
        fresh = (cache_info()["cached_bytes"], cache_info()["hits"] - hits)
        del a
        kept = cache_info()["cached_bytes"]
        b = np.zeros(LARGE)
        queue.put((fresh, kept, float(b.sum()), cache_info()["open"]))
    queue.put(cache_info()["open"])


def test_a_forked_child_starts_with_its_own_cache():
    # The parent's kept block is not the child's (reused without being
    # counted, a byte count that wraps: mutant B24 of the h32b audit).
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork start method on this platform")
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    with reuse_blocks():  # open in the parent while it forks
        np.ones(LARGE).sum()  # a block kept in the parent
        child = context.Process(target=_allocate_in_child, args=(queue,))
        child.start()
        result = queue.get(timeout=60)
        after = queue.get(timeout=60)
        child.join(timeout=60)
    assert child.exitcode == 0
    assert result == ((0, 0), LARGE * 8, 0.0, 1)  # its own block only
    assert after == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
def test_a_block_opened_before_a_fork_closes_in_the_child():
    # os.fork inside the block: the child leaves the block too, with a
    # count that restarted at zero, and can open blocks afterwards.
    read, write = os.pipe()
    with reuse_blocks():
        pid = os.fork()
    if pid == 0:  # the child, out of the inherited block
        status = 1
        try:
            closed = cache_info()["open"]
            with reuse_blocks():
                reopened = cache_info()["open"]
            os.write(write, f"{closed} {reopened}".encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read) as pipe:
        answer = pipe.read()
    _, wait_status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(wait_status) == 0
    assert answer == "0 1"
    assert cache_info()["open"] == 0


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_a_fit_leaves_the_handler_and_the_cache_as_it_found_them():
    # 60 sequences of about 17 tokens: 8 samples of 3 labels per token take
    # about 200 KB, a block the cache keeps
    X, y = make_sequences(n_sequences=60, random_state=0)
    hits = cache_info()["hits"]
    GPStructClassifier(max_iter=5, random_state=0).fit(X, y)
    assert cache_info()["hits"] > hits  # the fit reused blocks
    assert cache_info()["open"] == 0 and cache_info()["cached_bytes"] == 0
    assert get_handler_name(np.empty(LARGE)) == get_handler_name()


# Mutants B01 (skg_take: `size <= MIN`) and B09 (skg_free: `size <= MIN`).
def test_a_block_of_exactly_the_smallest_size_is_kept_and_reused():
    n = MIN_BLOCK_BYTES // 8
    with reuse_blocks():
        a = np.empty(n)
        address = a.ctypes.data
        del a
        assert cache_info()["cached_bytes"] == MIN_BLOCK_BYTES
        hits = cache_info()["hits"]
        b = np.empty(n)
        assert b.ctypes.data == address and cache_info()["hits"] == hits + 1
        assert cache_info()["cached_bytes"] == 0
        del b


# Mutants B02 (skg_take picks the oldest block) and B17 (the age clock never
# advances), B03 (a taken block's bytes stay counted).
def test_the_newest_block_of_a_size_is_reused_first_and_uncounted():
    with reuse_blocks():
        older, newer = np.empty(LARGE), np.empty(LARGE)
        older_address, newer_address = older.ctypes.data, newer.ctypes.data
        del older
        del newer  # freed last: the newest
        assert cache_info()["cached_bytes"] == 2 * LARGE * 8
        first = np.empty(LARGE)
        assert first.ctypes.data == newer_address
        assert cache_info()["cached_bytes"] == LARGE * 8
        second = np.empty(LARGE)
        assert second.ctypes.data == older_address
        assert cache_info()["cached_bytes"] == 0
        del first, second


# Mutants B14 (the newest block evicted instead of the oldest) and B28 (an
# evicted block stays counted: the cache stops keeping blocks once full).
def test_a_full_cache_evicts_its_oldest_block_and_keeps_the_new_one():
    size = MIN_BLOCK_BYTES // 8
    with reuse_blocks():
        arrays = [np.empty(size + i) for i in range(N_SLOTS + 1)]
        for i in range(N_SLOTS + 1):  # freed in order: size + 0 is the oldest
            arrays[i] = None
        info = cache_info()
        expected = sum((size + i) * 8 for i in range(1, N_SLOTS + 1))
        assert info["cached_bytes"] == expected
        hits = info["hits"]
        newest = np.empty(size + N_SLOTS)  # the last one freed: kept
        assert cache_info()["hits"] == hits + 1
        oldest = np.empty(size)  # evicted
        assert cache_info()["hits"] == hits + 1
        second = np.empty(size + 1)  # kept
        assert cache_info()["hits"] == hits + 2
        del newest, oldest, second


# Mutant B04 (a taken block is not uncounted from the slots in use: after
# N_SLOTS reuses the cache believes itself full of blocks it no longer holds).
def test_a_block_reused_again_and_again_stays_in_the_cache():
    with reuse_blocks():
        hits = cache_info()["hits"]
        for _ in range(3 * N_SLOTS):
            a = np.empty(LARGE)
            del a
        assert cache_info()["hits"] == hits + 3 * N_SLOTS - 1
        assert cache_info()["cached_bytes"] == LARGE * 8
        # and blocks of other sizes are still kept beside it
        b = np.empty(LARGE + 1)
        del b
        assert cache_info()["cached_bytes"] == LARGE * 8 + (LARGE + 1) * 8


# Mutants B10 (a block of exactly MAX_CACHED_BYTES is not kept), B13 (an
# eviction when the cache would be exactly full) and B16 (`<` MAX instead of
# `<=` when keeping).
def test_the_cache_fills_to_exactly_its_maximum():
    half = MAX_CACHED_BYTES // 2 // 8
    with reuse_blocks():
        a, b = np.empty(half), np.empty(half)
        del a, b
        assert cache_info()["cached_bytes"] == MAX_CACHED_BYTES
    with reuse_blocks():
        whole = np.empty(MAX_CACHED_BYTES // 8)
        del whole
        assert cache_info()["cached_bytes"] == MAX_CACHED_BYTES
