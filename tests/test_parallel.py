"""The per-sequence terms under other joblib backends give the same model.

Chunks have a fixed token budget and are reduced in chunk order, so a fit is
bit-identical whatever the backend (see DESIGN.md, "Scale").
"""

import warnings

import numpy as np
import pytest
from joblib import parallel_config
from sklearn.exceptions import ConvergenceWarning

import skgpstruct._estimator as estimator_module
from skgpstruct import GPStructClassifier
from skgpstruct.datasets import make_sequences


@pytest.fixture
def small_chunks(monkeypatch):
    # Several chunks even on a small data set, so that work is really spread.
    monkeypatch.setattr(estimator_module, "CHUNK_TOKENS", 40)


def _fit(**params):
    X, y = make_sequences(24, length_range=(3, 9), random_state=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return GPStructClassifier(
            kernel="rbf", n_inducing=15, max_iter=8, random_state=0, **params
        ).fit(X, y)


def test_dask_backend_gives_the_same_model(small_chunks):
    distributed = pytest.importorskip(
        "distributed", reason="dask.distributed is not installed (extra 'dask')"
    )
    local = _fit(n_jobs=1)
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            scheduler_port=0,
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        distributed.Client(cluster),
        parallel_config(backend="dask"),
    ):
        remote = _fit(n_jobs=2)
    np.testing.assert_array_equal(local.q_mu_, remote.q_mu_)
    np.testing.assert_array_equal(local.q_sqrt_, remote.q_sqrt_)
    assert local.elbo_history_ == remote.elbo_history_


def test_threading_backend_gives_the_same_model(small_chunks):
    local = _fit(n_jobs=1)
    with parallel_config(backend="threading"):
        threaded = _fit(n_jobs=2)
    np.testing.assert_array_equal(local.q_mu_, threaded.q_mu_)


def test_n_jobs_runs_threads_unless_a_backend_is_configured(small_chunks, monkeypatch):
    # n_jobs alone spreads the chunks over threads of this process (the
    # chunk terms release the GIL); a backend from parallel_config wins.
    import os
    import threading

    from skgpstruct.inference import elbo as elbo_module

    calls = []
    real = elbo_module._cached_chunk_terms

    def where(token, index, chunk, shared):
        calls.append((os.getpid(), threading.get_ident()))
        return real(token, index, chunk, shared)

    monkeypatch.setattr(elbo_module, "_cached_chunk_terms", where)
    local = _fit(n_jobs=1)
    assert {pid for pid, _ in calls} == {os.getpid()}
    assert {thread for _, thread in calls} == {threading.get_ident()}
    calls.clear()
    threaded = _fit(n_jobs=2)
    assert {pid for pid, _ in calls} == {os.getpid()}
    assert threading.get_ident() not in {thread for _, thread in calls}
    np.testing.assert_array_equal(local.q_mu_, threaded.q_mu_)
    calls.clear()
    with parallel_config(backend="sequential"):
        _fit(n_jobs=2)
    assert {thread for _, thread in calls} == {threading.get_ident()}


def test_loky_backend_gives_the_same_model(small_chunks):
    # Worker processes keep the chunks between evaluations: same model.
    local = _fit(n_jobs=1)
    with parallel_config(backend="loky"):
        spread = _fit(n_jobs=2)
    np.testing.assert_array_equal(local.q_mu_, spread.q_mu_)
    assert local.elbo_history_ == spread.elbo_history_


def test_a_single_chunk_is_evaluated_in_the_fitting_process(monkeypatch):
    # One chunk, nothing to share out: under loky it went to a worker at
    # every evaluation, and the two workers taking turns each missed the
    # other's cached copy (the chunk sent again at nearly every call).
    import os

    from skgpstruct.inference import elbo as elbo_module

    calls = []
    real = elbo_module._cached_chunk_terms

    def here(token, index, chunk, shared):  # only this process is patched
        calls.append((os.getpid(), index, chunk is not None))
        return real(token, index, chunk, shared)

    monkeypatch.setattr(elbo_module, "_cached_chunk_terms", here)
    local = _fit(n_jobs=1)
    n_local = len(calls)
    calls.clear()
    with parallel_config(backend="loky"):
        spread = _fit(n_jobs=2)
    assert len(calls) == n_local > 2
    assert {pid for pid, _, _ in calls} == {os.getpid()}
    # cached from the first evaluation on: the chunk passed once (the first
    # call asks for it and misses)
    assert [sent for _, _, sent in calls[:3]] == [False, True, False]
    assert sum(sent for _, _, sent in calls) == 1
    np.testing.assert_array_equal(local.q_mu_, spread.q_mu_)
    assert local.elbo_history_ == spread.elbo_history_


def test_chunks_are_sent_once_and_again_to_a_process_that_lacks_them(
    small_chunks, monkeypatch
):
    from joblib import Parallel

    from skgpstruct.inference import elbo as elbo_module

    captured = {}
    original = elbo_module.SparseELBO.evaluate

    def spy(self, vector, parallel, **kw):
        captured.setdefault("objective", self)
        captured.setdefault("vector", vector.copy())
        return original(self, vector, parallel, **kw)

    monkeypatch.setattr(elbo_module.SparseELBO, "evaluate", spy)
    _fit(n_jobs=1)
    objective, x = captured["objective"], captured["vector"]
    assert len(objective.chunks) > 2
    # The fit released what it cached in this process.
    assert objective._token not in elbo_module._CHUNK_CACHE

    sent = []
    real = elbo_module._cached_chunk_terms

    def counting(token, index, chunk, shared):
        sent.append((index, chunk is not None))
        return real(token, index, chunk, shared)

    monkeypatch.setattr(elbo_module, "_cached_chunk_terms", counting)
    with Parallel(n_jobs=1) as parallel:
        first = objective.evaluate(x, parallel)
        n = len(objective.chunks)
        assert sent == [(i, True) for i in range(n)]
        sent.clear()
        second = objective.evaluate(x, parallel)
        assert sent == [(i, False) for i in range(n)]  # indices only
        # A process that lost its chunks (a new worker) gets them again.
        elbo_module._CHUNK_CACHE.clear()
        sent.clear()
        third = objective.evaluate(x, parallel)
        assert sent == [(i, False) for i in range(n)] + [(i, True) for i in range(n)]
    objective.release()
    assert objective._token not in elbo_module._CHUNK_CACHE
    for other in (second, third):
        assert other.elbo == first.elbo
        np.testing.assert_array_equal(other.gradient, first.gradient)


def _first_chunk_task(monkeypatch, n_sequences, **params):
    """The arguments of the first chunk task of a one-iteration fit that
    carries its chunk."""
    from skgpstruct.inference import elbo as elbo_module

    X, y = make_sequences(n_sequences, random_state=0)
    captured = {}
    original = elbo_module._cached_chunk_terms

    def spy(token, index, chunk, shared):
        if chunk is not None:
            captured.setdefault("call", (token, index, chunk, shared))
        return original(token, index, chunk, shared)

    with monkeypatch.context() as patch:
        patch.setattr(elbo_module, "_cached_chunk_terms", spy)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            GPStructClassifier(max_iter=1, random_state=0, **params).fit(X, y)
    return captured["call"]


def test_a_new_fit_replaces_the_cached_chunks_of_the_previous_one(monkeypatch):
    from skgpstruct.inference import elbo as elbo_module

    elbo_module._CHUNK_CACHE.clear()
    elbo_module._CHUNK_CACHE["old"] = {0: object()}
    assert elbo_module._cached_chunk_terms("new", 0, None, None) is None
    assert "old" in elbo_module._CHUNK_CACHE  # a miss changes nothing
    token, index, chunk, shared = _first_chunk_task(monkeypatch, 3)
    elbo_module._CHUNK_CACHE["old"] = {0: object()}
    assert elbo_module._cached_chunk_terms(token, index, chunk, shared)["ell"] < 0
    assert list(elbo_module._CHUNK_CACHE) == [token]
    elbo_module._CHUNK_CACHE.clear()


def test_loky_leak_allowance_covers_the_cached_chunks(monkeypatch):
    # loky restarts a worker that grew by more than 300 MB, taking it for a
    # leak; a worker holding a fit's chunks raises its allowance by what it
    # holds (layouts and base samples included), so it is not restarted and
    # sent every chunk again.
    from joblib.externals.loky import process_executor

    from skgpstruct.inference import elbo as elbo_module

    monkeypatch.setattr(process_executor, "_MAX_MEMORY_LEAK_SIZE", int(3e8))
    token, index, chunk, shared = _first_chunk_task(monkeypatch, 6, kernel="linear")
    elbo_module._CHUNK_CACHE.clear()
    elbo_module._cached_chunk_terms(token, index, chunk, shared)
    held = elbo_module._CHUNK_CACHE[token][index]
    split = held.layout.split
    layout_bytes = sum(
        a.nbytes for a in (split.indptr, split.inducing, split.value, split.entry_drawn)
    )
    assert held.noise_cache  # the base samples were kept
    noise_bytes = sum(a.nbytes for pair in held.noise_cache.values() for a in pair)
    assert held.nbytes >= held.X.data.nbytes + layout_bytes + noise_bytes
    assert process_executor._MAX_MEMORY_LEAK_SIZE == int(3e8) + 2 * held.nbytes
    # An array held in two places is counted once.
    before, drawn_rows_bytes = held.nbytes, split.drawn_rows.nbytes
    assert drawn_rows_bytes > 0
    split.drawn_rows = split.drawn
    assert held.nbytes == before - drawn_rows_bytes
    elbo_module._CHUNK_CACHE.clear()


def test_cached_bytes_are_counted_while_the_cache_grows():
    # Threads of one process share the chunk cache: while one counts the
    # bytes held, another may add base samples to a chunk's cache. Counting
    # must take a snapshot of each dict first (a fit with n_jobs=2 threads
    # failed with "dictionary changed size during iteration"). Here the
    # growth happens deterministically in the middle of the count.
    from skgpstruct.inference.terms import _nbytes

    class GrowsWhenRead:
        __dataclass_fields__ = {"samples": None}

        def __init__(self, cache):
            self.cache = cache

        @property
        def samples(self):
            self.cache[len(self.cache)] = np.zeros(3)  # another thread's insert
            return np.zeros(4)

    cache = {}
    cache[0] = GrowsWhenRead(cache)
    cache[1] = np.zeros(2)
    assert _nbytes(cache, set()) == 4 * 8 + 2 * 8
    assert len(cache) == 3


def test_single_blas_thread_limits_blas_from_any_thread():
    # OpenBLAS (pthreads) has one pool per process, and threadpoolctl lets
    # one thread at a time size it: a limit set from another thread did
    # nothing once the main thread had set one (a fit in a worker thread
    # then ran its BLAS on every core and rounded differently).
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import threadpool_info, threadpool_limits

    from skgpstruct._linalg import single_blas_thread

    def blas_threads():
        return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}

    def limited_in_this_thread():
        with single_blas_thread():
            return blas_threads()

    if not blas_threads():
        pytest.skip("threadpoolctl finds no BLAS library in this process")
    assert limited_in_this_thread() == {1}  # the main thread sets and lifts one
    # Two threads to start from, and the main thread inside its own limit.
    with threadpool_limits(limits=2, user_api="blas"):
        with ThreadPoolExecutor(1) as pool:
            assert pool.submit(limited_in_this_thread).result() == {1}
        assert blas_threads() == {2}  # restored, from the worker thread
    with ThreadPoolExecutor(1) as pool:
        pool.submit(limited_in_this_thread).result()
    assert limited_in_this_thread() == {1}  # and the main thread again


def test_fit_in_a_worker_thread_is_the_fit_in_the_main_thread():
    # Inducing points: their matrix products are large enough for OpenBLAS
    # to split them over threads, which rounds differently.
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import threadpool_limits

    X, y = make_sequences(n_sequences=60, n_features=20, n_classes=4, random_state=0)

    def fit():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            return GPStructClassifier(
                kernel="rbf", n_inducing=60, max_iter=2, random_state=0
            ).fit(X, y)

    # Two BLAS threads to start from, whatever OPENBLAS_NUM_THREADS says
    # (with one, the worker's fit could not differ), the main thread
    # holding its own limit meanwhile.
    with threadpool_limits(limits=2, user_api="blas"):
        main = fit()
        with ThreadPoolExecutor(1) as pool:
            worker = pool.submit(fit).result()
    np.testing.assert_array_equal(main.q_mu_, worker.q_mu_)
    np.testing.assert_array_equal(main.q_sqrt_, worker.q_sqrt_)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_child_forked_during_a_fit_counts_its_blas_limit_afresh():
    # The child inherited the count of contexts open in the parent's
    # threads: it never set the limit (nor restored it) in its own fits.
    import os

    from threadpoolctl import threadpool_info, threadpool_limits

    from skgpstruct._linalg import _BLAS, single_blas_thread

    def blas_threads():
        return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}

    if not blas_threads():
        pytest.skip("threadpoolctl finds no BLAS library in this process")
    with threadpool_limits(limits=2, user_api="blas"), single_blas_thread():
        pid = os.fork()
        if pid == 0:  # the child: report by exit status, never return
            try:
                ok = _BLAS["users"] == 0 and blas_threads() == {2}
                with single_blas_thread():
                    ok = ok and blas_threads() == {1}
                ok = ok and blas_threads() == {2}
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert _BLAS["users"] == 1 and blas_threads() == {1}  # the parent's
    assert os.waitstatus_to_exitcode(status) == 0


def test_early_stopping_releases_its_held_out_chunks():
    # The held-out objective's chunks stayed in this process's cache after
    # the fit (until a later fit evicted them).
    from skgpstruct.inference import elbo as elbo_module

    elbo_module._CHUNK_CACHE.clear()
    X, y = make_sequences(30, length_range=(3, 9), random_state=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = GPStructClassifier(
            optimizer="stochastic", early_stopping=True, validation_fraction=0.3,
            max_iter=3, random_state=0,
        ).fit(X, y)
    assert model.validation_score_history_  # the held-out part was used
    assert elbo_module._CHUNK_CACHE == {}


def test_single_blas_thread_is_counted_and_restored():
    # The limit holds until the last open context closes (fits and chunks in
    # threads of one process share it), then the original is back.
    from threadpoolctl import threadpool_info

    from skgpstruct._linalg import single_blas_thread

    def blas_threads():
        return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}

    from threadpoolctl import threadpool_limits

    if not blas_threads():
        pytest.skip("threadpoolctl finds no BLAS library in this process")
    # Two threads to start from, whatever OPENBLAS_NUM_THREADS says.
    with threadpool_limits(limits=2, user_api="blas"):
        assert blas_threads() == {2}
        with single_blas_thread():
            assert blas_threads() == {1}
            with single_blas_thread():
                assert blas_threads() == {1}
            assert blas_threads() == {1}  # the inner context did not lift it
        assert blas_threads() == {2}
