"""Compiled loops over whole packed parameter vectors: the optimisers' Adam
step, and the bitwise comparison of two points.

One SAGA step (:func:`skgpstruct.optim.saga.maximize_saga`) moves every
coordinate of the packed vector (the stored gradients' sum and the KL
gradient are dense), so Adam's update is a pass over five to seven vectors
of the parameters' length. Written with NumPy it makes about a dozen passes,
each with its own division or square root; here it is one loop without the
GIL, the bias corrections applied as products, that the compiler vectorises.
The NumPy formula is the reference in ``tests/test_stochastic.py``.

The objective is then read several times at the same point (the item's
gradient, a stored one, the KL terms), and recognises it by comparing the
point with the last one: :func:`same_bits` is ``memcmp``, without the
temporary array of ``numpy.array_equal``.
"""

from libc.string cimport memcmp


cdef extern from *:
    """
    #include <math.h>
    /* restrict: the arrays never overlap, so that the compiler may
       vectorise the loop. */
    static void adam_loop(
        Py_ssize_t n, double *restrict x, double *restrict m,
        double *restrict v, const double *restrict d,
        const double *restrict rate, double beta1, double beta2,
        double eps, double inv_correction1, double inv_correction2)
    {
        for (Py_ssize_t j = 0; j < n; j++) {
            double mj = m[j] * beta1 + d[j] * (1.0 - beta1);
            double vj = v[j] * beta2 + (d[j] * d[j]) * (1.0 - beta2);
            m[j] = mj;
            v[j] = vj;
            x[j] += (mj * inv_correction1) * rate[j]
                    / (sqrt(vj * inv_correction2) + eps);
        }
    }
    static void clip_loop(
        Py_ssize_t n, double *restrict x, const double *restrict low,
        const double *restrict high)
    {
        for (Py_ssize_t j = 0; j < n; j++) {
            double xj = x[j] < low[j] ? low[j] : x[j];
            x[j] = xj > high[j] ? high[j] : xj;
        }
    }
    """
    void adam_loop(
        Py_ssize_t n, double* x, double* m, double* v, const double* d,
        const double* rate, double beta1, double beta2, double eps,
        double inv_correction1, double inv_correction2) noexcept nogil
    void clip_loop(
        Py_ssize_t n, double* x, const double* low, const double* high
    ) noexcept nogil


def adam_ascent_step(
    double[::1] x,
    double[::1] m,
    double[::1] v,
    const double[::1] direction,
    const double[::1] rate,
    double beta1,
    double beta2,
    double eps,
    long long t,
    const double[::1] low=None,
    const double[::1] high=None,
):
    """One Adam step of ascent along ``direction``, in place.

    For every coordinate ``j``::

        m_j = beta1 m_j + (1 - beta1) d_j
        v_j = beta2 v_j + (1 - beta2) d_j^2
        x_j += rate_j (m_j / (1 - beta1^t)) / (sqrt(v_j / (1 - beta2^t)) + eps)

    then ``x_j`` is clipped to ``[low_j, high_j]`` when bounds are given.

    Parameters
    ----------
    x, m, v : ndarray of float64 of shape (n,), C-contiguous
        The point and Adam's first and second moments; updated in place.
        These and ``direction`` and ``rate`` must not share memory.
    direction, rate : ndarray of float64 of shape (n,), C-contiguous
        The ascent direction ``d`` and the step size per coordinate.
    beta1, beta2, eps : float
    t : int
        The step count, from 1 (bias corrections).
    low, high : ndarray of float64 of shape (n,) or None
        Bounds (both or neither).
    """
    cdef Py_ssize_t n = x.shape[0]
    if not (m.shape[0] == v.shape[0] == direction.shape[0] == rate.shape[0] == n):
        raise ValueError("x, m, v, direction and rate must have the same length")
    if (low is None) != (high is None):
        raise ValueError("give both low and high, or neither")
    if t < 1:
        raise ValueError(f"t must be >= 1, got {t}")
    cdef bint clip = low is not None
    if clip and not (low.shape[0] == high.shape[0] == n):
        raise ValueError("low and high must have the length of x")
    if n == 0:
        return
    # The loop's restrict pointers: no two of the arrays may overlap.
    cdef size_t[5] start = [
        <size_t>&x[0], <size_t>&m[0], <size_t>&v[0], <size_t>&direction[0],
        <size_t>&rate[0],
    ]
    cdef size_t nbytes = n * sizeof(double)
    cdef int a, b
    for a in range(5):
        for b in range(a):
            if start[a] < start[b] + nbytes and start[b] < start[a] + nbytes:
                raise ValueError(
                    "x, m, v, direction and rate must not share memory"
                )
    cdef double inv_correction1 = 1.0 / (1.0 - beta1 ** t)
    cdef double inv_correction2 = 1.0 / (1.0 - beta2 ** t)
    with nogil:
        adam_loop(
            n, &x[0], &m[0], &v[0], &direction[0], &rate[0], beta1, beta2, eps,
            inv_correction1, inv_correction2,
        )
        if clip:
            clip_loop(n, &x[0], &low[0], &high[0])


def same_bits(const double[::1] a, const double[::1] b):
    """Whether two float64 vectors hold the same bits (``memcmp``).

    Stricter than ``==`` on two counts, both harmless for a cache key:
    ``0.0`` and ``-0.0`` differ, and a NaN equals the same NaN.

    Parameters
    ----------
    a, b : ndarray of float64 of shape (n,), C-contiguous

    Returns
    -------
    bool
    """
    cdef Py_ssize_t n = a.shape[0]
    if b.shape[0] != n:
        return False
    if n == 0:
        return True
    cdef int differ
    with nogil:
        differ = memcmp(&a[0], &b[0], n * sizeof(double))
    return differ == 0
