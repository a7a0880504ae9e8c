"""Dense linear algebra shared by the whole package.

Every Cholesky factorisation in skgpstruct goes through :func:`jitter_cholesky`,
so that near-singular kernel matrices are handled the same way everywhere,
and fits run their BLAS on one thread (:func:`single_blas_thread`).
"""

import os
import threading
from contextlib import contextmanager

import numpy as np
import threadpoolctl
from scipy import linalg
from threadpoolctl import ThreadpoolController

from ._vectors import same_bits

__all__ = [
    "jitter_cholesky", "cholesky_backward", "CholeskyError", "single_blas_thread",
    "same_vector",
]


class CholeskyError(np.linalg.LinAlgError):
    """Raised when a matrix stays non positive definite after all jitter."""


def jitter_cholesky(matrix, *, initial_jitter=1e-10, max_tries=8, name="matrix"):
    """Lower Cholesky factor of a symmetric matrix, adding jitter on failure.

    The jitter added to the diagonal starts at ``initial_jitter`` times the
    mean diagonal and grows tenfold at each failed attempt.

    Parameters
    ----------
    matrix : ndarray of shape (n, n)
        Symmetric positive (semi-)definite matrix. It is not modified.
    initial_jitter : float, default=1e-10
        First relative jitter tried after the plain factorisation fails.
    max_tries : int, default=8
        Number of jitter levels tried before giving up.
    name : str, default="matrix"
        Name used in the error message.

    Returns
    -------
    lower : ndarray of shape (n, n)
        Lower-triangular ``L`` with ``L @ L.T == matrix + jitter * I``.
    jitter : float
        The absolute jitter that was added (0.0 when none was needed).

    Raises
    ------
    CholeskyError
        If the matrix is not finite or is still not positive definite after
        the largest jitter.
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"{name} must be a square matrix, got shape {matrix.shape}")
    if matrix.shape[0] == 0:
        return np.zeros((0, 0)), 0.0
    if not np.all(np.isfinite(matrix)):
        raise CholeskyError(f"{name} contains NaN or infinite entries")
    try:
        return linalg.cholesky(matrix, lower=True, check_finite=False), 0.0
    except linalg.LinAlgError:
        pass
    scale = float(np.mean(np.abs(np.diag(matrix))))
    scale = scale if scale > 0 else 1.0
    jitter = initial_jitter * scale
    eye = np.eye(matrix.shape[0])
    for _ in range(max_tries):
        try:
            lower = linalg.cholesky(
                matrix + jitter * eye, lower=True, check_finite=False
            )
            return lower, jitter
        except linalg.LinAlgError:
            jitter *= 10.0
    raise CholeskyError(
        f"{name} of shape {matrix.shape} is not positive definite even with "
        f"jitter {jitter / 10.0:.3g} added to its diagonal; check the kernel "
        "hyperparameters or use fewer (more distinct) inducing points"
    )


def cholesky_backward(lower, lower_bar):
    """Reverse-mode derivative of the Cholesky factorisation.

    Given ``L = chol(A)`` and the gradient ``L_bar`` of a scalar with respect
    to the lower triangle of ``L``, return the gradient with respect to the
    symmetric matrix ``A`` (as a symmetric matrix, each off-diagonal pair
    carrying half of the total). This is Murray (2016), "Differentiation of
    the Cholesky decomposition", eq. 10 in symmetric form.

    Parameters
    ----------
    lower : ndarray of shape (n, n)
        Lower Cholesky factor ``L``.
    lower_bar : ndarray of shape (n, n)
        Gradient with respect to ``L``; its upper triangle is ignored.

    Returns
    -------
    a_bar : ndarray of shape (n, n)
        Symmetric gradient with respect to ``A``.
    """
    phi = np.tril(lower.T @ np.tril(lower_bar))
    phi[np.diag_indices_from(phi)] *= 0.5
    # A_bar = L^{-T} Phi L^{-1}, then symmetrised.
    tmp = linalg.solve_triangular(lower, phi, lower=True, trans="T", check_finite=False)
    a_bar = linalg.solve_triangular(
        lower, tmp.T, lower=True, trans="T", check_finite=False
    ).T
    return 0.5 * (a_bar + a_bar.T)


_BLAS = {"lock": threading.Lock(), "users": 0, "limit": None, "controller": None}


@contextmanager
def single_blas_thread():
    """BLAS on one thread in this process while the context is open.

    A fit must be bit-identical for every ``n_jobs`` and backend, and
    OpenBLAS may round differently with its number of threads (seen here:
    1e-13 apart between the parent's two threads and a loky worker's one).
    So chunks run their BLAS on one thread, in whatever process (the
    estimator opens the context for the whole fit, before its worker
    threads start: a limit set inside a joblib worker thread was not seen
    there); parallelism comes from the chunks. The limit is process-wide
    and counted: the first context in sets it, the last one out restores
    it, so that fits and chunks running in threads of one process do not
    lift it under each other.

    The first context may open in one thread and the last close in
    another: the limit and its restoration are made by whichever thread
    they fall to (see :func:`_release_openblas_control`).
    """
    with _BLAS["lock"]:
        if _BLAS["users"] == 0:
            if _BLAS["controller"] is None:
                _BLAS["controller"] = ThreadpoolController()
            _release_openblas_control()
            _BLAS["limit"] = _BLAS["controller"].limit(limits=1, user_api="blas")
            _release_openblas_control()
        _BLAS["users"] += 1
    try:
        yield
    finally:
        with _BLAS["lock"]:
            _BLAS["users"] -= 1
            if _BLAS["users"] == 0:
                _release_openblas_control()
                _BLAS["limit"].restore_original_limits()
                _release_openblas_control()
                _BLAS["limit"] = None


def _reset_after_fork():
    """In a child forked while contexts were open (their threads are not in
    the child), give BLAS back its number of threads from before them and
    start counting afresh; the lock may have been held by a thread the
    child does not have."""
    limit, _BLAS["limit"], _BLAS["users"] = _BLAS["limit"], None, 0
    _BLAS["lock"] = threading.Lock()
    if limit is not None:
        _release_openblas_control()
        limit.restore_original_limits()
        _release_openblas_control()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_reset_after_fork)


def _release_openblas_control():
    """Let the next thread that sets OpenBLAS's thread count do so.

    OpenBLAS built on pthreads (NumPy's and SciPy's wheels) has one thread
    pool for the whole process. Recent threadpoolctl (3.8 here) lets one
    thread at a time change its size: the first to set a limit, until that
    thread's ``with`` block ends; a limit set from any other thread
    silently does nothing. :func:`single_blas_thread` limits the whole
    process from whichever thread a fit runs in, so it hands control back
    after each change; without that, a fit in a worker thread (after one
    in the main thread had set and lifted its limit) ran its BLAS on every
    core and ended 1e-15 away from the same fit in the main thread.
    Without this mechanism (older threadpoolctl) there is nothing to do.
    """
    controller_class = getattr(threadpoolctl, "OpenBLASController", None)
    release = getattr(controller_class, "clear_controlling_thread", None)
    if release is not None:
        release(force=True)


def same_vector(a, b):
    """Whether ``a`` and ``b`` are the same point: the test of a cache.

    Contiguous float64 vectors are compared bit for bit (``memcmp``, see
    :func:`skgpstruct._vectors.same_bits`: ``0.0`` and ``-0.0`` differ,
    a NaN equals itself, both harmless for a cache); other arrays with
    ``numpy.array_equal``. Optimisers move every coordinate at once, so
    unequal points almost always differ at the first entry.
    """
    if a is b:
        return True
    if a.shape != b.shape:
        return False
    if _is_plain_vector(a) and _is_plain_vector(b):
        return same_bits(a, b)
    return a.size == 0 or bool(a.flat[0] == b.flat[0] and np.array_equal(a, b))


def _is_plain_vector(a):
    return a.ndim == 1 and a.dtype == np.float64 and a.flags.c_contiguous
