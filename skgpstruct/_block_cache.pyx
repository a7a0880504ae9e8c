"""A NumPy memory handler that keeps large freed blocks for reuse.

An iteration of a fit allocates and frees the same large temporaries again
and again (the sampled potentials, their gradients, the packed vectors:
megabytes each). glibc's ``malloc`` serves blocks of that size with
``mmap``, or from the top of its heap, which it gives back to the system
as soon as enough is free there; either way every new temporary is fresh
memory, and the kernel zeroes each of its pages at the first touch. On a
JapaneseNE fit that is about 2,500 page faults per L-BFGS iteration and a
fifth of the fit's time in the kernel (``benchmarks/bench_block_cache.py``).

Inside :func:`reuse_blocks`, NumPy allocates array data through this
handler (NumPy's data memory policy, NEP 49, which NumPy keeps per context
variable, so only the code run inside the block and in its context is
affected). A freed block of at least :data:`MIN_BLOCK_BYTES` is kept, up
to :data:`MAX_CACHED_BYTES` and :data:`N_SLOTS` blocks (the oldest evicted
first), and handed to the next request of exactly the same size (a zeroed
request gets it cleared with ``memset``). Everything else goes to NumPy's
own default allocator (its cache of small blocks, its huge-page advice for
large ones), as does everything once no :func:`reuse_blocks` is open; the
kept blocks are given back to it when the last open one closes. Every
block comes from the default allocator, so ``realloc`` and a late free (an
array made inside and freed after) need no bookkeeping.

The handler's state is guarded by a lock: threads may allocate and free
concurrently.
"""

import os
from contextlib import contextmanager

cimport numpy as cnp

cnp.import_array()

cdef extern from *:
    """
    #include <stdlib.h>
    #include <string.h>
    #include "pythread.h"

    #define SKG_MIN_BLOCK_BYTES ((size_t)1 << 16)    /* 64 KiB */
    #define SKG_MAX_CACHED_BYTES ((size_t)1 << 27)   /* 128 MiB */
    #define SKG_N_SLOTS 128

    typedef struct {
        void *ptr;
        size_t size;
        unsigned long long age;  /* when it was kept: the oldest goes first */
    } skg_block;

    static skg_block skg_slots[SKG_N_SLOTS];
    static size_t skg_cached_bytes = 0;
    static size_t skg_n_cached = 0;
    static long skg_open = 0;           /* reuse_blocks() blocks open */
    static unsigned long long skg_clock = 0;
    static unsigned long long skg_hits = 0;
    static PyThread_type_lock skg_lock = NULL;

    /* A kept block of exactly `size` bytes (the newest), or NULL. */
    static void *skg_take(size_t size)
    {
        void *found = NULL;
        int best = -1;
        if (size < SKG_MIN_BLOCK_BYTES || skg_lock == NULL) {
            return NULL;
        }
        PyThread_acquire_lock(skg_lock, WAIT_LOCK);
        for (int i = 0; i < SKG_N_SLOTS; i++) {
            if (skg_slots[i].ptr != NULL && skg_slots[i].size == size
                    && (best < 0 || skg_slots[i].age > skg_slots[best].age)) {
                best = i;
            }
        }
        if (best >= 0) {
            found = skg_slots[best].ptr;
            skg_slots[best].ptr = NULL;
            skg_cached_bytes -= size;
            skg_n_cached -= 1;
            skg_hits += 1;
        }
        PyThread_release_lock(skg_lock);
        return found;
    }

    /* NumPy's default allocator: everything not served from, or kept in,
       the cache goes through it (its cache of small blocks, its huge page
       advice for large ones). */
    static PyDataMemAllocator skg_default;

    static void *skg_malloc(void *ctx, size_t size)
    {
        void *p = skg_take(size);
        return p != NULL ? p : skg_default.malloc(skg_default.ctx, size);
    }

    static void *skg_calloc(void *ctx, size_t nelem, size_t elsize)
    {
        void *p;
        if (elsize != 0 && nelem > (size_t)-1 / elsize) {
            return NULL;  /* overflow: as calloc */
        }
        p = skg_take(nelem * elsize);
        if (p != NULL) {
            memset(p, 0, nelem * elsize);
            return p;
        }
        return skg_default.calloc(skg_default.ctx, nelem, elsize);
    }

    static void *skg_realloc(void *ctx, void *ptr, size_t new_size)
    {
        return skg_default.realloc(skg_default.ctx, ptr, new_size);
    }

    static void skg_free(void *ctx, void *ptr, size_t size)
    {
        void *evicted = NULL;
        size_t evicted_size = 0;
        int slot = -1;
        if (ptr == NULL) {
            return;
        }
        if (size < SKG_MIN_BLOCK_BYTES || size > SKG_MAX_CACHED_BYTES
                || skg_lock == NULL) {
            skg_default.free(skg_default.ctx, ptr, size);
            return;
        }
        PyThread_acquire_lock(skg_lock, WAIT_LOCK);
        if (skg_open > 0) {
            /* No room: the oldest kept block goes. */
            if (skg_n_cached > 0 && (skg_n_cached == SKG_N_SLOTS
                    || skg_cached_bytes + size > SKG_MAX_CACHED_BYTES)) {
                int oldest = -1;
                for (int i = 0; i < SKG_N_SLOTS; i++) {
                    if (skg_slots[i].ptr != NULL && (oldest < 0
                            || skg_slots[i].age < skg_slots[oldest].age)) {
                        oldest = i;
                    }
                }
                /* (the counters say there is one; should they ever
                   disagree with the slots, keep nothing rather than read
                   outside them) */
                if (oldest >= 0) {
                    evicted = skg_slots[oldest].ptr;
                    evicted_size = skg_slots[oldest].size;
                    skg_cached_bytes -= evicted_size;
                    skg_n_cached -= 1;
                    skg_slots[oldest].ptr = NULL;
                }
            }
            if (skg_n_cached < SKG_N_SLOTS
                    && skg_cached_bytes + size <= SKG_MAX_CACHED_BYTES) {
                for (int i = 0; i < SKG_N_SLOTS; i++) {
                    if (skg_slots[i].ptr == NULL) {
                        slot = i;
                        break;
                    }
                }
                if (slot >= 0) {
                    skg_slots[slot].ptr = ptr;
                    skg_slots[slot].size = size;
                    skg_slots[slot].age = ++skg_clock;
                    skg_cached_bytes += size;
                    skg_n_cached += 1;
                }
            }
        }
        PyThread_release_lock(skg_lock);
        if (evicted != NULL) {
            skg_default.free(skg_default.ctx, evicted, evicted_size);
        }
        if (slot < 0) {
            skg_default.free(skg_default.ctx, ptr, size);
        }
    }

    static PyDataMem_Handler skg_handler = {
        "skgpstruct_block_cache",
        1,
        {NULL, skg_malloc, skg_calloc, skg_realloc, skg_free},
    };

    /* The lock, and the default allocator to delegate to; 0 on failure
       (a Python exception set). */
    static int skg_init(void)
    {
        PyDataMem_Handler *handler = (PyDataMem_Handler *)PyCapsule_GetPointer(
            PyDataMem_DefaultHandler, "mem_handler");
        if (handler == NULL) {
            return 0;
        }
        skg_default = handler->allocator;
        if (skg_lock == NULL) {
            skg_lock = PyThread_allocate_lock();
        }
        if (skg_lock == NULL) {
            PyErr_NoMemory();
            return 0;
        }
        return 1;
    }

    /* Open (+1) or close (-1) a reuse_blocks() block; the last close frees
       the kept blocks. */
    static void skg_open_close(int delta)
    {
        skg_block release[SKG_N_SLOTS];
        int n = 0;
        PyThread_acquire_lock(skg_lock, WAIT_LOCK);
        skg_open += delta;
        if (skg_open < 0) {
            /* a block opened before a fork, closed in the child */
            skg_open = 0;
        }
        if (skg_open == 0) {
            for (int i = 0; i < SKG_N_SLOTS; i++) {
                if (skg_slots[i].ptr != NULL) {
                    release[n++] = skg_slots[i];
                    skg_slots[i].ptr = NULL;
                }
            }
            skg_cached_bytes = 0;
            skg_n_cached = 0;
        }
        PyThread_release_lock(skg_lock);
        for (int i = 0; i < n; i++) {
            skg_default.free(skg_default.ctx, release[i].ptr, release[i].size);
        }
    }

    /* In a forked child: a fresh lock (the parent's may have been held by
       a thread that does not exist here), no block open, none kept (the
       kept ones stay allocated: a child must not free the parent's memory
       behind its copy, and they are few). */
    static int skg_after_fork(void)
    {
        skg_lock = PyThread_allocate_lock();
        skg_open = 0;
        skg_cached_bytes = 0;
        skg_n_cached = 0;
        memset(skg_slots, 0, sizeof(skg_slots));
        return skg_lock != NULL;
    }

    static size_t skg_get_cached_bytes(void) { return skg_cached_bytes; }
    static unsigned long long skg_get_hits(void) { return skg_hits; }
    static long skg_get_open(void) { return skg_open; }
    """
    size_t SKG_MIN_BLOCK_BYTES
    size_t SKG_MAX_CACHED_BYTES
    int SKG_N_SLOTS
    cnp.PyDataMem_Handler skg_handler
    int skg_init() except 0
    int skg_after_fork()
    void skg_open_close(int delta)
    size_t skg_get_cached_bytes()
    unsigned long long skg_get_hits()
    long skg_get_open()

from cpython.pycapsule cimport PyCapsule_New

#: Smallest data block kept for reuse (bytes).
MIN_BLOCK_BYTES = SKG_MIN_BLOCK_BYTES
#: Most memory the kept blocks may hold at once (bytes).
MAX_CACHED_BYTES = SKG_MAX_CACHED_BYTES
#: Most blocks kept at once.
N_SLOTS = SKG_N_SLOTS
#: The handler's name, as ``numpy._core.multiarray.get_handler_name`` reports.
HANDLER_NAME = "skgpstruct_block_cache"

skg_init()
_HANDLER = PyCapsule_New(<void*>&skg_handler, "mem_handler", NULL)


def _after_fork_in_child():
    if not skg_after_fork():
        raise MemoryError("could not allocate the block cache's lock")


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextmanager
def reuse_blocks():
    """Allocate NumPy arrays through the block cache inside this block.

    Large blocks freed inside are kept and reused for arrays of the same
    size; see the module docstring. Affects the current thread (and
    context) only; blocks may nest and run in several threads at once.
    """
    previous = cnp.PyDataMem_SetHandler(_HANDLER)
    skg_open_close(1)
    try:
        yield
    finally:
        skg_open_close(-1)
        cnp.PyDataMem_SetHandler(previous)


def cache_info():
    """The cache's state: bytes kept, reuses since import, blocks open.

    Returns
    -------
    dict
        ``cached_bytes``, ``hits`` and ``open``.
    """
    return {
        "cached_bytes": skg_get_cached_bytes(),
        "hits": skg_get_hits(),
        "open": skg_get_open(),
    }
