"""Compiled forward-backward, Viterbi and path scores over ragged batches.

Sequences are concatenated along the token axis and delimited by ``offsets``
(see :mod:`skgpstruct.chain`). Every function here trusts its caller for
shapes, dtypes, offsets and label ranges (they are checked once in
``skgpstruct.chain``) and runs its loops without the GIL.

Forward-backward picks one of two recursions per sample:

* scaled probability space (no exp/log per V^2 cell; the V exponentials
  of a token, computed by the forward pass, are kept for the backward one)
  when the range of the sample's pairwise potentials is at most
  ``MAX_SCALED_RANGE``;
* log space with max-shifting otherwise.

Both keep the forward and backward messages normalised at every token, so
nothing grows with the sequence length.
"""

import numpy as np

from libc.math cimport exp, log, INFINITY
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memcpy

# Safety bound of the scaled recursion. With R = max(P) - min(P) <= 300, every
# entry of E = exp(P - max P) is >= e^-300 (a normal double). The messages
# then satisfy, per token, a_i <= u_i e^R max(a) and b_i in [e^-R, e^R], so a
# term lost to underflow or to the flush of exp(x < -708) changes any message
# entry by a relative amount of at most V e^(-708 + 2R) < 1e-46 V.
# Unary potentials may have any range: each token is shifted by its own max.
cdef double MAX_SCALED_RANGE = 300.0
cdef double EXP_FLUSH = -708.0
# The bits of 1.5 * 2^52, the shifter of _polynomial_exp.
cdef int64_t SHIFTER_BITS = 0x4338000000000000
# From this many labels on the forward pass takes its exponentials from
# _polynomial_exp: 8 in the AVX2 build (four doubles per vector), 12 in the
# baseline one (two), where it gained from 12 labels and lost at 8
# (design.rst, "Two builds of the hot kernels").
cdef extern from *:
    """
    #if defined(__AVX2__)
    #define SKGPSTRUCT_VECTOR_EXP_MIN_LABELS 8
    #else
    #define SKGPSTRUCT_VECTOR_EXP_MIN_LABELS 12
    #endif
    """
    const Py_ssize_t SKGPSTRUCT_VECTOR_EXP_MIN_LABELS
cdef Py_ssize_t _VECTOR_EXP_MIN_LABELS = SKGPSTRUCT_VECTOR_EXP_MIN_LABELS
VECTOR_EXP_MIN_LABELS = _VECTOR_EXP_MIN_LABELS


cdef inline double _flushed_exp(double x) noexcept nogil:
    # exp of a non-positive shifted potential, without subnormal results
    if x < EXP_FLUSH:
        return 0.0
    return exp(x)


cdef inline double _polynomial_exp(double x) noexcept nogil:
    """:func:`_flushed_exp` within 2 ulp (exp(0) = 1 exactly), in
    branch-free arithmetic, so that the compiler vectorises the loops that
    call it: from ``VECTOR_EXP_MIN_LABELS`` labels on (8 in the AVX2 build,
    12 in the baseline one), the forward pass's exponentials (a call to
    libm per value took a third of its time at 12 labels; on fewer labels
    the vector loop's setup costs more than it saves).

    ``x = n ln 2 + r`` with ``n`` the nearest integer to ``x / ln 2`` (the
    shifter's rounding, whose low bits then hold ``n``) and ``|r| <= ln 2 /
    2``, reduced in two parts (Cody and Waite; fdlibm's split of ln 2, whose
    high part times ``n`` is exact); ``exp(r)`` is its Taylor polynomial of
    degree 13 (truncation below 1e-17, relative), and ``2^n`` is built from
    its exponent bits (``n >= -1022`` above the flush: a normal double).
    """
    cdef double xc = x if x > EXP_FLUSH else EXP_FLUSH
    cdef double t = xc * 1.4426950408889634 + 6755399441055744.0  # 1.5 * 2^52
    cdef double n = t - 6755399441055744.0
    cdef double r = (xc - n * 6.93147180369123816490e-01) - n * 1.90821492927058770002e-10
    cdef double p = 1.0 / 6227020800.0  # 1 / 13!
    p = p * r + 1.0 / 479001600.0
    p = p * r + 1.0 / 39916800.0
    p = p * r + 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    cdef int64_t bits
    memcpy(&bits, &t, 8)
    # t's bits minus the shifter's are n; (n + 1023) << 52 is 2^n.
    bits = (bits - SHIFTER_BITS + 1023) << 52
    cdef double scale
    memcpy(&scale, &bits, 8)
    p = p * scale  # computed before the select: the loops stay branch-free
    return p if x >= EXP_FLUSH else 0.0


cdef inline double _row_max(const double* x, Py_ssize_t n) noexcept nogil:
    cdef double m = x[0]
    cdef Py_ssize_t i
    for i in range(1, n):
        if x[i] > m:
            m = x[i]
    return m


cdef inline void _normalise(double* x, Py_ssize_t n) noexcept nogil:
    cdef double total = 0.0
    cdef Py_ssize_t i
    for i in range(n):
        total += x[i]
    total = 1.0 / total
    for i in range(n):
        # a probability: never above 1, which rounding could give by an ulp
        x[i] = min(x[i] * total, 1.0)


cdef inline double _log_sum_exp(const double* x, Py_ssize_t n) noexcept nogil:
    cdef double m = _row_max(x, n)
    cdef double s = 0.0
    cdef Py_ssize_t i
    for i in range(n):
        s += exp(x[i] - m)
    return m + log(s)


cdef inline void _vector_matrix(
    const double* x, const double* A, Py_ssize_t V, double* out,
) noexcept nogil:
    """``out = x^T A`` for ``A`` (V x V, C order): the rows of ``A`` two
    at a time, which halves the loads and stores of ``out``."""
    cdef Py_ssize_t i, j
    cdef double xi, xi1
    cdef const double* row
    for j in range(V):
        out[j] = 0.0
    for i in range(0, V - 1, 2):
        xi = x[i]
        xi1 = x[i + 1]
        row = A + i * V
        for j in range(V):
            out[j] += xi * row[j] + xi1 * row[V + j]
    if V % 2:
        xi = x[V - 1]
        row = A + (V - 1) * V
        for j in range(V):
            out[j] += xi * row[j]


# --------------------------------------------------------------------------
# Scaled probability-space recursion (eqs. of Rabiner 1989, sec. V.A, with the
# normaliser of the backward pass recomputed from alpha so that every token's
# marginal sums to one to rounding).
# --------------------------------------------------------------------------

cdef double _forward_scaled(
    const double* U, const double* E, double log_e_max, Py_ssize_t V,
    Py_ssize_t T, double* alpha, Py_ssize_t stride, double* s_buf,
    double* ex, double* e_buf,
) noexcept nogil:
    """Normalised forward messages; returns log Z of the sequence.

    ``U`` holds T rows of V unary potentials, ``E`` = exp(P - log_e_max).
    Row t of the messages is written at ``alpha + t * stride``; a stride of 0
    keeps only the last row (log Z only). Unless ``ex`` is NULL, row t of
    ``ex`` (T x V) receives exp(U[t] - max U[t]), for the backward pass;
    otherwise each row goes to ``e_buf`` (V values) in turn.
    """
    cdef Py_ssize_t t, j
    cdef double umax, c, inv, e, log_z = 0.0
    cdef const double* u_row
    cdef double* e_row
    cdef double* a
    cdef double* prev
    for t in range(T):
        u_row = U + t * V
        a = alpha + t * stride
        umax = _row_max(u_row, V)
        if t > 0:
            prev = alpha + (t - 1) * stride
            _vector_matrix(prev, E, V, s_buf)
            log_z += log_e_max
        if V >= _VECTOR_EXP_MIN_LABELS:
            # The exponentials in a loop of their own, which the compiler
            # vectorises.
            e_row = ex + t * V if ex != NULL else e_buf
            for j in range(V):
                e_row[j] = _polynomial_exp(u_row[j] - umax)
            if t == 0:
                for j in range(V):
                    a[j] = e_row[j]
            else:
                for j in range(V):
                    a[j] = e_row[j] * s_buf[j]
        # One loop (three short ones cost more than they save).
        elif t == 0:
            for j in range(V):
                e = _flushed_exp(u_row[j] - umax)
                if ex != NULL:
                    ex[j] = e
                a[j] = e
        else:
            for j in range(V):
                e = _flushed_exp(u_row[j] - umax)
                if ex != NULL:
                    ex[t * V + j] = e
                a[j] = e * s_buf[j]
        c = 0.0
        for j in range(V):
            c += a[j]
        inv = 1.0 / c
        for j in range(V):
            a[j] *= inv
        if t == T - 1:
            # the last token's marginal: rounding could give 1 + ulp
            for j in range(V):
                a[j] = min(a[j], 1.0)
        log_z += umax + log(c)
    return log_z


cdef void _backward_scaled(
    const double* ex, const double* E, const double* ET, Py_ssize_t V,
    Py_ssize_t T, double* alpha, double* pair, double* b, double* w,
    double* r,
) noexcept nogil:
    """Turn stored forward messages into marginals; add pair marginals.

    ``ex`` holds the forward pass's exp(U[t] - max U[t]) (T x V). ``alpha``
    (T rows) is overwritten with the token marginals; ``pair`` (V x V,
    zeroed by the caller) receives sum_t xi_t[i, j] / E[i, j], to be
    multiplied by E once per sequence; NULL when they are not wanted (an
    outer product per token saved).
    """
    cdef Py_ssize_t t, i, j
    cdef double z, inv_z, ai
    cdef const double* ex_row
    cdef double* a
    cdef double* p_row
    for j in range(V):
        b[j] = 1.0
    for t in range(T - 2, -1, -1):
        ex_row = ex + (t + 1) * V
        for j in range(V):
            w[j] = ex_row[j] * b[j]
        _vector_matrix(w, ET, V, r)  # r = E w
        a = alpha + t * V
        z = 0.0
        for i in range(V):
            z += a[i] * r[i]
        inv_z = 1.0 / z
        if pair != NULL:
            for i in range(V):
                ai = a[i] * inv_z
                if ai != 0.0:
                    p_row = pair + i * V
                    for j in range(V):
                        p_row[j] += ai * w[j]
        for i in range(V):
            b[i] = r[i] * inv_z
            a[i] = min(a[i] * b[i], 1.0)  # rounding could give 1 + ulp


# --------------------------------------------------------------------------
# Log-space recursion, for samples whose pairwise range is too wide.
# --------------------------------------------------------------------------

cdef double _forward_log(
    const double* U, const double* PT, Py_ssize_t V, Py_ssize_t T,
    double* alpha, Py_ssize_t stride, double* s_buf,
) noexcept nogil:
    """Log forward messages normalised to log-sum-exp 0; returns log Z.

    ``PT`` is the transposed pairwise matrix (row j = column j of P).
    """
    cdef Py_ssize_t t, i, j
    cdef double m, s, x, lse, log_z = 0.0
    cdef const double* u_row
    cdef const double* col
    cdef double* a
    cdef double* prev
    for t in range(T):
        u_row = U + t * V
        a = alpha + t * stride
        if t == 0:
            for j in range(V):
                a[j] = u_row[j]
        else:
            prev = alpha + (t - 1) * stride
            for j in range(V):
                col = PT + j * V
                m = -INFINITY
                for i in range(V):
                    x = prev[i] + col[i]
                    if x > m:
                        m = x
                s = 0.0
                for i in range(V):
                    s += exp(prev[i] + col[i] - m)
                s_buf[j] = u_row[j] + m + log(s)
            for j in range(V):
                a[j] = s_buf[j]
        lse = _log_sum_exp(a, V)
        for j in range(V):
            a[j] -= lse
        log_z += lse
    return log_z


cdef void _backward_log(
    const double* U, const double* P, Py_ssize_t V, Py_ssize_t T,
    double* alpha, double* pair, double* lb, double* w, double* lb_raw,
    double* log_s, double* e_buf,
) noexcept nogil:
    """Log-space counterpart of ``_backward_scaled``; ``pair`` gets xi itself
    (or is NULL).

    Every exponent is formed as a difference that is <= 0 in floating point
    (``w[i] - norm``, ``norm`` being the log-sum-exp of ``w``), never as a sum
    of terms of the potentials' size: with potentials of 1e19 one rounding
    of such a sum is 2048, and exp of it inf or 0 (NaN marginals).
    ``log_s`` receives log(s_i), the log of row i's sum of exponentials.
    """
    cdef Py_ssize_t t, i, j
    cdef double m, s, x, norm, f
    cdef const double* u_row
    cdef const double* p_row
    cdef double* a
    cdef double* e_row
    cdef double* out_row
    a = alpha + (T - 1) * V
    for j in range(V):
        lb[j] = 0.0
        a[j] = exp(a[j])
    # exponents are exact only to ~eps * |potential|: renormalise each token
    _normalise(a, V)
    for t in range(T - 2, -1, -1):
        u_row = U + (t + 1) * V
        for j in range(V):
            w[j] = u_row[j] + lb[j]
        for i in range(V):
            p_row = P + i * V
            e_row = e_buf + i * V
            m = -INFINITY
            for j in range(V):
                x = p_row[j] + w[j]
                if x > m:
                    m = x
            s = 0.0
            for j in range(V):
                e_row[j] = exp(p_row[j] + w[j] - m)
                s += e_row[j]
            log_s[i] = log(s)
            lb_raw[i] = m + log_s[i]
        a = alpha + t * V
        for i in range(V):
            w[i] = a[i] + lb_raw[i]
        norm = _log_sum_exp(w, V)
        for i in range(V if pair != NULL else 0):
            # alpha_i exp(m_i) / Z = exp(w_i - norm - log s_i)
            f = exp(w[i] - norm - log_s[i])
            if f != 0.0:
                e_row = e_buf + i * V
                out_row = pair + i * V
                for j in range(V):
                    out_row[j] += f * e_row[j]
        for i in range(V):
            lb[i] = lb_raw[i] - norm
            a[i] = exp(w[i] - norm)
        _normalise(a, V)


# --------------------------------------------------------------------------
# Entry points (called by skgpstruct.chain only)
# --------------------------------------------------------------------------

def forward_backward(
    const double[:, :, ::1] unary,
    const double[:, :, ::1] pairwise,
    const int64_t[::1] offsets,
    double[:, ::1] log_z,
    double[:, :, ::1] marginals,
    double[:, :, :, ::1] pair_marginals,
    bint with_marginals,
    bint with_pairs=True,
):
    """Fill ``log_z`` (S, n_seq) and, if ``with_marginals``, ``marginals``
    (S, n_tokens, V) and, if ``with_pairs`` too, ``pair_marginals`` (S,
    n_seq, V, V, zero-filled; not read otherwise).

    Returns the number of samples that used the log-space recursion.
    """
    cdef Py_ssize_t S = unary.shape[0]
    cdef Py_ssize_t V = unary.shape[2]
    cdef Py_ssize_t n_seq = offsets.shape[0] - 1
    cdef Py_ssize_t s, n, i, j, start, T
    cdef Py_ssize_t n_log_space = 0
    cdef double p_max, p_min, x
    cdef bint scaled
    cdef const double* P
    cdef const double* U
    cdef double* alpha
    cdef double* pair
    cdef Py_ssize_t stride = V if with_marginals else 0

    # E, ET (or P^T) and e_buf: 3 V x V; then 6 vectors of length V
    cdef double[::1] work = np.empty(3 * V * V + 6 * V + 2 * V, dtype=np.float64)
    # The forward pass's exponentials of the longest sequence, kept for the
    # backward pass (computed once instead of twice).
    cdef Py_ssize_t max_T = 0
    for n in range(n_seq):
        max_T = max(max_T, offsets[n + 1] - offsets[n])
    cdef double[::1] ex_work = np.empty(max(max_T * V, 1) if with_marginals else 1)
    cdef double* ex = &ex_work[0] if with_marginals else NULL
    cdef double* E = &work[0]
    cdef double* ET = E + V * V
    cdef double* e_buf = ET + V * V
    cdef double* v0 = e_buf + V * V
    cdef double* v1 = v0 + V
    cdef double* v2 = v1 + V
    cdef double* v3 = v2 + V
    cdef double* v4 = v3 + V
    cdef double* roll = v4 + V  # 2 V: forward messages when not stored

    with nogil:
        for s in range(S):
            P = &pairwise[s, 0, 0]
            p_max = _row_max(P, V * V)
            p_min = P[0]
            for i in range(V * V):
                if P[i] < p_min:
                    p_min = P[i]
            scaled = p_max - p_min <= MAX_SCALED_RANGE
            if scaled:
                for i in range(V):
                    for j in range(V):
                        x = exp(P[i * V + j] - p_max)
                        E[i * V + j] = x
                        ET[j * V + i] = x
            else:
                n_log_space += 1
                for i in range(V):
                    for j in range(V):
                        ET[j * V + i] = P[i * V + j]
            for n in range(n_seq):
                start = offsets[n]
                T = offsets[n + 1] - start
                if T == 0:
                    log_z[s, n] = 0.0
                    continue
                U = &unary[s, start, 0]
                alpha = &marginals[s, start, 0] if with_marginals else roll
                if scaled:
                    log_z[s, n] = _forward_scaled(
                        U, E, p_max, V, T, alpha, stride, v0, ex, v3)
                else:
                    log_z[s, n] = _forward_log(U, ET, V, T, alpha, stride, v0)
                if not with_marginals:
                    continue
                pair = &pair_marginals[s, n, 0, 0] if with_pairs else NULL
                if scaled:
                    _backward_scaled(ex, E, ET, V, T, alpha, pair, v0, v1, v2)
                    if with_pairs:
                        for i in range(V * V):
                            pair[i] *= E[i]
                else:
                    _backward_log(
                        U, P, V, T, alpha, pair, v0, v1, v2, v3, e_buf)
    return n_log_space


#: From this many labels on, ``viterbi`` runs its column-wise step (below).
VITERBI_COLUMNS_FROM = 10


cdef inline void _viterbi_step_rows(
    const double* P, const double* u_row, const double* d, Py_ssize_t V,
    double* nd, int32_t* bp,
) noexcept nogil:
    """One step back: ``nd[i] = u_row[i] + max_j (P[i, j] + d[j])`` and its
    lowest argmax in ``bp[i]``, label by label along the rows of ``P``."""
    cdef Py_ssize_t i, j, arg
    cdef double best, x
    cdef const double* p_row
    for i in range(V):
        p_row = P + i * V
        best = p_row[0] + d[0]
        arg = 0
        for j in range(1, V):
            x = p_row[j] + d[j]
            if x > best:
                best = x
                arg = j
        nd[i] = u_row[i] + best
        bp[i] = <int32_t> arg


cdef inline void _viterbi_step_columns(
    const double* PT, const double* u_row, const double* d, Py_ssize_t V,
    double* nd, double* best_arg, int32_t* bp,
) noexcept nogil:
    """The same step, every label at once, over the rows of ``PT = P.T``.

    The loop over the next label ``j`` is outside and the one over ``i``
    inside, with no dependence from one ``i`` to the next: it compiles to
    vector compares and blends, where the running maximum of the row-wise
    step chains every comparison to the one before. ``best_arg`` (V
    doubles, scratch) holds the argmaxes as doubles, the width of the
    scores, so that one vector blend updates both. The strict ``>`` over
    ascending ``j`` keeps the lowest argmax, as the row-wise step does,
    and the maxima are the same sums: both steps give the same bits.
    """
    cdef Py_ssize_t i, j
    cdef double x, dj, fj
    cdef const double* col
    dj = d[0]
    for i in range(V):
        nd[i] = PT[i] + dj
        best_arg[i] = 0.0
    for j in range(1, V):
        col = PT + j * V
        dj = d[j]
        fj = <double> j
        for i in range(V):
            x = col[i] + dj
            best_arg[i] = fj if x > nd[i] else best_arg[i]
            nd[i] = x if x > nd[i] else nd[i]
    for i in range(V):
        nd[i] = u_row[i] + nd[i]
        bp[i] = <int32_t> best_arg[i]


def viterbi(
    const double[:, ::1] unary,
    const double[:, ::1] pairwise,
    const int64_t[::1] offsets,
    int64_t[::1] labels,
    double[::1] scores,
    int32_t[:, ::1] backpointers,
    by_columns=None,
):
    """Max-plus decoding of every sequence into ``labels`` and ``scores``.

    Runs over suffixes (from the last token back) so that picking the lowest
    best label at each step, front to back, yields the lexicographically
    smallest of the optimal labellings. ``backpointers`` has shape
    (max(1, longest sequence - 1), V). Below ``VITERBI_COLUMNS_FROM``
    labels each step runs along the rows of ``pairwise``, from there on
    along its columns (the two give the same bits; in
    ``benchmarks/bench_builds.py`` the row-wise step was the faster below,
    the column-wise one from there on). ``by_columns`` True or False runs
    one of them whatever the labels (for the tests and that benchmark).
    """
    cdef Py_ssize_t V = unary.shape[1]
    cdef Py_ssize_t n_seq = offsets.shape[0] - 1
    cdef Py_ssize_t n, t, i, start, T, arg
    cdef bint columns = (
        V >= VITERBI_COLUMNS_FROM if by_columns is None else bool(by_columns)
    )
    # The row-wise step reads pairwise, the column-wise one its transpose.
    cdef const double[:, ::1] steps_matrix = pairwise
    if columns:
        steps_matrix = np.ascontiguousarray(np.asarray(pairwise).T)
    cdef const double* P = &steps_matrix[0, 0]
    cdef const double* U
    # d, nd: the suffix scores of this step and the next; then scratch.
    cdef double[::1] work = np.empty(3 * V, dtype=np.float64)
    cdef double* d
    cdef double* nd
    cdef double* tmp
    with nogil:
        for n in range(n_seq):
            start = offsets[n]
            T = offsets[n + 1] - start
            if T == 0:
                scores[n] = 0.0
                continue
            U = &unary[start, 0]
            d = &work[0]
            nd = d + V
            for i in range(V):
                d[i] = U[(T - 1) * V + i]
            for t in range(T - 2, -1, -1):
                if columns:
                    _viterbi_step_columns(
                        P, U + t * V, d, V, nd, &work[2 * V], &backpointers[t, 0]
                    )
                else:
                    _viterbi_step_rows(P, U + t * V, d, V, nd, &backpointers[t, 0])
                tmp = d
                d = nd
                nd = tmp
            arg = 0
            for i in range(1, V):
                if d[i] > d[arg]:
                    arg = i
            scores[n] = d[arg]
            labels[start] = arg
            for t in range(T - 1):
                arg = backpointers[t, arg]
                labels[start + t + 1] = arg


def path_scores(
    const double[:, :, ::1] unary,
    const double[:, :, ::1] pairwise,
    const int64_t[::1] offsets,
    const int64_t[::1] labels,
    double[:, ::1] scores,
):
    """Unnormalised log potential of ``labels`` per sample and sequence."""
    cdef Py_ssize_t S = unary.shape[0]
    cdef Py_ssize_t n_seq = offsets.shape[0] - 1
    cdef Py_ssize_t s, n, t, stop
    cdef double total
    with nogil:
        for s in range(S):
            for n in range(n_seq):
                stop = offsets[n + 1]
                total = 0.0
                for t in range(offsets[n], stop):
                    total += unary[s, t, labels[t]]
                    if t + 1 < stop:
                        total += pairwise[s, labels[t], labels[t + 1]]
                scores[s, n] = total


def flushed_exp(const double[::1] x, double[::1] out, bint polynomial):
    """``out = exp(x)`` as the scaled recursion computes it (for ``x <= 0``:
    0 below ``EXP_FLUSH``), element by element, from libm or (``polynomial``)
    from the vectorised polynomial; for the tests."""
    cdef Py_ssize_t i
    with nogil:
        if polynomial:
            for i in range(x.shape[0]):
                out[i] = _polynomial_exp(x[i])
        else:
            for i in range(x.shape[0]):
                out[i] = _flushed_exp(x[i])
