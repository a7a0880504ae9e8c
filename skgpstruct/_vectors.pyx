"""Compiled loops over whole packed parameter vectors: the optimisers' Adam
step, L-BFGS's diagonal update, and the bitwise comparison of two points.

One SAGA step (:func:`skgpstruct.optim.saga.maximize_saga`) moves every
coordinate of the packed vector (the stored gradients' sum and the KL
gradient are dense), so Adam's update is a pass over five to seven vectors
of the parameters' length. Written with NumPy it makes about a dozen passes,
each with its own division or square root; here it is one loop without the
GIL, the bias corrections applied as products, that the compiler vectorises.
The NumPy formula is the reference in ``tests/test_stochastic.py``.

L-BFGS's diagonal Hessian approximation (:class:`skgpstruct.optim.lbfgs.
_LBFGSMemory`) is updated by every pair, and its initial matrix taken from
it: :func:`diagonal_bfgs_update` and :func:`secant_inverse_sqrt` are two
passes each, where NumPy would make about ten with their temporaries.

The objective is then read several times at the same point (the item's
gradient, a stored one, the KL terms), and recognises it by comparing the
point with the last one: :func:`same_bits` is ``memcmp``, without the
temporary array of ``numpy.array_equal``.
"""

from libc.math cimport INFINITY
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
    /* sum_j b_j s_j^2, in eight partial sums that the compiler keeps in
       vector registers (a single sum would be one long dependency chain). */
    static double weighted_square_sum(
        Py_ssize_t n, const double *restrict b, const double *restrict s)
    {
        double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        Py_ssize_t j = 0;
        for (; j + 8 <= n; j += 8)
            for (int l = 0; l < 8; l++)
                part[l] += b[j + l] * (s[j + l] * s[j + l]);
        double total = 0.0;
        for (; j < n; j++)
            total += b[j] * (s[j] * s[j]);
        for (int l = 0; l < 8; l++)
            total += part[l];
        return total;
    }
    static void diagonal_update_loop(
        Py_ssize_t n, double *restrict b, const double *restrict s,
        const double *restrict y, double c, double inv_sy, double floor)
    {
        for (Py_ssize_t j = 0; j < n; j++) {
            double cb = c * b[j];
            double cbs = cb * s[j];
            double bj = cb - (cbs * cbs) * inv_sy + (y[j] * y[j]) * inv_sy;
            b[j] = bj > floor ? bj : floor;
        }
    }
    /* out_j = 1 / sqrt(b_j), returning sum_j y_j^2 out_j (eight partial
       sums, as above). */
    static double inverse_sqrt_loop(
        Py_ssize_t n, const double *restrict b, const double *restrict y,
        double *restrict out)
    {
        double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        Py_ssize_t j = 0;
        for (; j + 8 <= n; j += 8)
            for (int l = 0; l < 8; l++) {
                double r = 1.0 / sqrt(b[j + l]);
                out[j + l] = r;
                part[l] += (y[j + l] * y[j + l]) * r;
            }
        double total = 0.0;
        for (; j < n; j++) {
            double r = 1.0 / sqrt(b[j]);
            out[j] = r;
            total += (y[j] * y[j]) * r;
        }
        for (int l = 0; l < 8; l++)
            total += part[l];
        return total;
    }
    static void scale_loop(Py_ssize_t n, double *restrict x, double a)
    {
        for (Py_ssize_t j = 0; j < n; j++)
            x[j] *= a;
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
    double inverse_sqrt_loop(
        Py_ssize_t n, const double* b, const double* y, double* out) noexcept nogil
    void scale_loop(Py_ssize_t n, double* x, double a) noexcept nogil
    double weighted_square_sum(
        Py_ssize_t n, const double* b, const double* s) noexcept nogil
    void diagonal_update_loop(
        Py_ssize_t n, double* b, const double* s, const double* y, double c,
        double inv_sy, double floor) noexcept nogil


cdef inline bint _share_memory(size_t a, size_t b, size_t nbytes) noexcept:
    """Whether the ``nbytes`` from address ``a`` and those from ``b`` overlap
    (the loops' ``restrict`` pointers must not)."""
    return a < b + nbytes and b < a + nbytes


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
            if _share_memory(start[a], start[b], nbytes):
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


cdef bint _check_pair_update(
    const double[::1] written, const double[::1] u, const double[::1] v,
    double sy, str written_name, str u_name, str v_name,
) except -1:
    """The checks of L-BFGS's diagonal loops: three vectors of one length,
    ``sy > 0``, and the written one apart from the other two. Returns
    whether the vectors are not empty."""
    cdef Py_ssize_t n = written.shape[0]
    if not (u.shape[0] == v.shape[0] == n):
        raise ValueError(
            f"{written_name}, {u_name} and {v_name} must have the same length"
        )
    if not sy > 0:
        raise ValueError(f"sy must be positive, got {sy!r}")
    if n == 0:
        return False
    cdef size_t nbytes = n * sizeof(double)
    cdef size_t start = <size_t>&written[0]
    if (_share_memory(start, <size_t>&u[0], nbytes)
            or _share_memory(start, <size_t>&v[0], nbytes)):
        raise ValueError(
            f"{written_name} must not share memory with {u_name} or {v_name}"
        )
    return True


def diagonal_bfgs_update(
    double[::1] b,
    const double[::1] s,
    const double[::1] y,
    double sy,
    double floor,
):
    """The scaled diagonal BFGS update of a diagonal Hessian ``b``, in place.

    With ``c = s^T y / sum_j b_j s_j^2``, for every coordinate ``j``::

        b_j = max(c b_j - (c b_j s_j)^2 / s^T y + y_j^2 / s^T y, floor)

    the diagonal of the BFGS update of ``diag(c b)`` by the pair ``(s, y)``
    (see :class:`skgpstruct.optim.lbfgs._LBFGSMemory`).

    Parameters
    ----------
    b : ndarray of float64 of shape (n,), C-contiguous
        Positive; updated in place. It must not share memory with ``s``
        or ``y``.
    s, y : ndarray of float64 of shape (n,), C-contiguous
        The pair: step and gradient change.
    sy : float
        ``s^T y``, positive.
    floor : float
        The smallest value written.

    Returns
    -------
    float
        The scaling ``c``.
    """
    cdef Py_ssize_t n = b.shape[0]
    if not _check_pair_update(b, s, y, sy, "b", "s", "y"):
        return 1.0
    cdef double sbs, c
    with nogil:
        sbs = weighted_square_sum(n, &b[0], &s[0])
    if not sbs > 0:
        raise ValueError(
            "s^T B s must be positive: b must be positive and s nonzero"
        )
    c = sy / sbs
    with nogil:
        diagonal_update_loop(n, &b[0], &s[0], &y[0], c, 1.0 / sy, floor)
    return c


def secant_inverse_sqrt(
    const double[::1] b,
    const double[::1] y,
    double sy,
    double[::1] out,
):
    """``out = t / sqrt(b)``, with ``t`` such that ``y^T diag(out) y = s^T y``.

    The initial inverse Hessian of :class:`skgpstruct.optim.lbfgs.
    _LBFGSMemory` from its diagonal Hessian approximation ``b``: the
    inverse square root of ``b``, scaled as ``gamma = s^T y / y^T y``
    scales the identity.

    Parameters
    ----------
    b : ndarray of float64 of shape (n,), C-contiguous
        Positive.
    y : ndarray of float64 of shape (n,), C-contiguous
        The newest pair's gradient change, not zero.
    sy : float
        Its ``s^T y``, positive.
    out : ndarray of float64 of shape (n,), C-contiguous
        Written; it must not share memory with ``b`` or ``y``.

    Returns
    -------
    float
        The scale ``t = s^T y / sum_j y_j^2 / sqrt(b_j)``.
    """
    cdef Py_ssize_t n = b.shape[0]
    if not _check_pair_update(out, b, y, sy, "out", "b", "y"):
        return 1.0
    cdef double weighted, t
    with nogil:
        weighted = inverse_sqrt_loop(n, &b[0], &y[0], &out[0])
    if not (weighted > 0 and weighted < INFINITY):
        raise ValueError(
            "sum y^2 / sqrt(b) must be positive and finite: b must be "
            "positive and y nonzero"
        )
    t = sy / weighted
    with nogil:
        scale_loop(n, &out[0], t)
    return t


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
