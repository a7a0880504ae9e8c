"""Compiled sampling and back-propagation of a chunk's stacked unary potentials.

A chunk of sequences evaluated in the stacked form (see
:class:`skgpstruct.inference.inducing.StackedProjection`) has, at every token
``t``, a short list of *entries*: the inducing variables ``m`` active there,
with their feature value ``u``. A *lone* row is active at one token only;
the rows active at several tokens of their sequence (and the bias) are
*drawn*, each with its own noise. The entries are given twice (see
:class:`skgpstruct.inference.inducing.RowSplit`): token by token, CSR style
(``indptr``, ``inducing``, ``value``, and ``drawn``: the entry's drawn row
or -1), and, for the drawn rows, row by row (``row_indptr``, ``row_token``,
``row_value``, with ``drawn_rows`` their inducing variables); the backward
pass also takes the lone rows' entries by inducing variable
(``lone_indptr``, ``lone_token``, ``lone_value``, with ``lone_rows`` those
variables).

With ``c`` the feature scales, ``mean`` and ``sd`` the posterior means and
standard deviations as (n_inducing, K * V) and the base samples ``eps``
(n_drawn, K * V, S) and ``xi`` (K, S, n_tokens, V), the unary sample of
component ``k``, sample ``s``, token ``t`` and label ``v`` (``kv = k V + v``)
is::

    f = sum_entries u c_m mean[m, kv]
        + sum_drawn entries u c_m sd[m, kv] eps[i, kv, s]
        + token_sd[t, kv] xi[k, s, t, v]

with ``token_sd[t, kv]^2 = floor + sum_lone entries (u c_m sd[m, kv])^2``:
the lone rows of a token are summed into one Gaussian draw.

The loops read each token's entries once, and each drawn row's noise once,
adding it into (or, backwards, collecting from) per-token arrays of
``K * V * S`` values that stay in cache: one pass over the noise, where
sparse products with blocks of ``K * V * S`` columns (the reference in
``tests/_stacked_reference.py``) make several, with their temporaries.
The per-entry indices (``inducing``, ``drawn``, ``row_token``,
``lone_token``) are 32-bit:
there is one per feature entry of the chunk, the bulk of its memory.

Precision: each function is compiled for single and double precision
(Cython's ``floating``), chosen by the dtype of its inputs: the feature
values, scales, means and spreads, the base samples (and with them the
per-token buffers). The estimator samples in single precision: a sample is
one Monte Carlo draw, whose sampling error (of order ``1/sqrt(S)``) dwarfs
the rounding (``1e-7`` relative), and single precision halves the memory
the loops stream through and doubles the width of their vector
instructions. Double precision is there for the finite-difference tests of
the gradients. What leaves the kernels is double either way: the samples
``out`` (for the forward-backward recursions), the gradient ``g`` read back
from them, and the sums ``d_cm`` and ``d_cs``, which collect a feature's
entries over the whole chunk; the backward pass also sums each token's
gradient over the samples in double precision.
Every function trusts its caller for shapes, dtypes and index ranges
(``skgpstruct.inference.terms`` builds the arrays) and runs without the GIL.
"""

import numpy as np

from cython cimport floating
from libc.math cimport sqrt
from libc.stdint cimport int32_t, int64_t


cdef inline object _dtype(floating zero):
    """The NumPy dtype of a specialisation's buffers (``zero`` selects it)."""
    return np.float32 if floating is float else np.float64


def token_sd(
    const int64_t[::1] indptr,
    const int32_t[::1] inducing,
    const floating[::1] value,
    const int32_t[::1] drawn,
    const floating[::1] c,
    const floating[:, ::1] sd,
    double floor,
    floating[:, ::1] out,
):
    """The spread of every token's lone rows, ``out`` (n_tokens, K * V).

    ``out[t, kv] = sqrt(floor + sum over the lone entries of t of
    (u c_m sd[m, kv])^2)``, overwritten. The squares are summed in double
    precision whatever the inputs': in single precision they would
    overflow once ``u c_m sd`` passes 1.8e19 (a line search's far trial),
    where the spread itself stays within range.
    """
    cdef Py_ssize_t T = out.shape[0], KV = out.shape[1]
    cdef Py_ssize_t t, j, kv
    cdef int64_t m
    cdef double w, spread
    cdef double[::1] squares = np.empty(KV)
    with nogil:
        for t in range(T):
            for kv in range(KV):
                squares[kv] = floor
            for j in range(indptr[t], indptr[t + 1]):
                if drawn[j] >= 0:
                    continue
                m = inducing[j]
                w = <double>value[j] * c[m]
                w = w * w
                for kv in range(KV):
                    spread = sd[m, kv]
                    squares[kv] += w * spread * spread
            for kv in range(KV):
                out[t, kv] = <floating>sqrt(squares[kv])


def unary(
    const int64_t[::1] indptr,
    const int32_t[::1] inducing,
    const floating[::1] value,
    const int64_t[::1] row_indptr,
    const int32_t[::1] row_token,
    const floating[::1] row_value,
    const int64_t[::1] drawn_rows,
    const floating[::1] c,
    const floating[:, ::1] mean,
    const floating[:, ::1] sd,
    const floating[:, ::1] token_sd,
    const floating[:, :, ::1] eps,
    const floating[:, :, :, ::1] xi,
    double[:, :, :, ::1] out,
):
    """Unary samples ``out`` (K, S, n_tokens, V), overwritten.

    ``row_indptr``, ``row_token`` and ``row_value`` list the drawn rows'
    entries row by row (CSR style) and ``drawn_rows`` their inducing
    variables: each drawn row's noise is read once and added into the
    tokens it reaches.
    """
    cdef Py_ssize_t K = xi.shape[0], S = xi.shape[1], T = xi.shape[2]
    cdef Py_ssize_t V = xi.shape[3], KV = K * V, n_drawn = eps.shape[0]
    cdef floating[::1] mean_t = np.empty(KV, dtype=_dtype(<floating>0))
    # The drawn rows' noise summed per token, (K * V * S) per token.
    cdef floating[:, ::1] noise = np.zeros((T, KV * S), dtype=_dtype(<floating>0))
    cdef floating[::1] scaled_buffer = np.empty(KV * S, dtype=_dtype(<floating>0))
    cdef floating* scaled = &scaled_buffer[0]
    cdef floating* acc
    cdef const floating* row
    cdef Py_ssize_t t, j, k, v, kv, s, n
    cdef int64_t m, i
    cdef floating u, w
    with nogil:
        for i in range(n_drawn):
            # The row's noise times c sd, then added, times u, into each of
            # its tokens in one flat loop.
            m = drawn_rows[i]
            row = &eps[i, 0, 0]
            for kv in range(KV):
                w = c[m] * sd[m, kv]
                for s in range(S):
                    scaled[kv * S + s] = w * row[kv * S + s]
            for j in range(row_indptr[i], row_indptr[i + 1]):
                u = row_value[j]
                acc = &noise[row_token[j], 0]
                for n in range(KV * S):
                    acc[n] += u * scaled[n]
        for t in range(T):
            for kv in range(KV):
                mean_t[kv] = 0.0
            for j in range(indptr[t], indptr[t + 1]):
                m = inducing[j]
                w = value[j] * c[m]
                acc = &mean_t[0]
                row = &mean[m, 0]
                for kv in range(KV):
                    acc[kv] += w * row[kv]
            for k in range(K):
                for s in range(S):
                    for v in range(V):
                        kv = k * V + v
                        out[k, s, t, v] = (
                            mean_t[kv] + noise[t, kv * S + s]
                            + token_sd[t, kv] * xi[k, s, t, v]
                        )


def backward(
    const int64_t[::1] lone_indptr,
    const int32_t[::1] lone_token,
    const floating[::1] lone_value,
    const int64_t[::1] lone_rows,
    const int64_t[::1] row_indptr,
    const int32_t[::1] row_token,
    const floating[::1] row_value,
    const int64_t[::1] drawn_rows,
    const floating[::1] c,
    const floating[:, ::1] sd,
    const floating[:, ::1] token_sd,
    const floating[:, :, ::1] eps,
    const floating[:, :, :, ::1] xi,
    const double[:, :, :, ::1] g,
    double[:, ::1] d_cm,
    double[:, ::1] d_cs,
):
    """Add the gradients of :func:`unary`'s samples into ``d_cm`` and ``d_cs``.

    ``g`` (K, S, n_tokens, V) is the gradient with respect to the samples;
    the drawn rows are given as for :func:`unary`, the lone rows' entries
    by inducing variable (``lone_indptr``, ``lone_token``, ``lone_value``,
    with ``lone_rows`` those variables, each once). ``d_cm`` and ``d_cs``
    (n_inducing, K * V) receive the derivatives with respect to
    ``c * mean`` and ``c * sd``: an entry adds ``u sum_s g`` to the first;
    a lone entry adds its share of the token's spread,
    ``u^2 (c sd)[m] / token_sd * sum_s g xi``, to the second, and a drawn
    row ``sum_s eps * (sum over its entries of u g)``.

    Every token's sums over the samples come first, into arrays of
    (n_tokens, K * V); each inducing variable then sums its entries' shares
    of them and writes its gradients once. (Visiting the entries token by
    token instead scatters into the rows of ``d_cm`` and ``d_cs`` in the
    order of the features: random writes over twice the gradients' size,
    which outgrows the cache on the Table 1 data sets.)
    """
    cdef Py_ssize_t K = xi.shape[0], S = xi.shape[1], T = xi.shape[2]
    cdef Py_ssize_t V = xi.shape[3], KV = K * V, n_drawn = eps.shape[0]
    cdef Py_ssize_t n_lone = lone_rows.shape[0]
    # g per token as (K * V * S), the layout of a drawn row's noise.
    cdef floating[:, ::1] g_t = np.empty((T, KV * S), dtype=_dtype(<floating>0))
    # Per-token sums over the samples of g and of g xi / token_sd, in
    # double precision.
    cdef double[:, ::1] g_sum = np.empty((T, KV))
    cdef double[:, ::1] g_xi = np.empty((T, KV))
    cdef floating[::1] row_g_buffer = np.empty(KV * S, dtype=_dtype(<floating>0))
    # One variable's sums of its entries' shares (d_cm, then d_cs).
    cdef double[::1] sums_buffer = np.empty(2 * KV)
    cdef floating* row_g = &row_g_buffer[0]
    cdef double* dm = &sums_buffer[0]
    cdef double* ds = dm + KV
    cdef const floating* row
    cdef Py_ssize_t t, j, k, v, kv, s, n
    cdef int64_t m, i
    cdef floating u, acc, spread
    cdef double w
    cdef const double* g_row
    cdef const double* token_sums
    cdef const floating* xi_row
    cdef floating* g_t_row
    cdef double* sum_row
    cdef double* xi_sum
    cdef double gv
    with nogil:
        for t in range(T):
            # Rows of V contiguous values of g and xi, sample by sample.
            g_t_row = &g_t[t, 0]
            sum_row = &g_sum[t, 0]
            xi_sum = &g_xi[t, 0]
            for kv in range(KV):
                sum_row[kv] = 0.0
                xi_sum[kv] = 0.0
            for k in range(K):
                for s in range(S):
                    g_row = &g[k, s, t, 0]
                    xi_row = &xi[k, s, t, 0]
                    for v in range(V):
                        gv = g_row[v]
                        g_t_row[(k * V + v) * S + s] = <floating>gv
                        sum_row[k * V + v] += gv
                        xi_sum[k * V + v] += gv * xi_row[v]
            for kv in range(KV):
                spread = token_sd[t, kv]
                xi_sum[kv] = xi_sum[kv] / spread if spread > 0 else 0.0
        for i in range(n_lone):
            for kv in range(2 * KV):
                dm[kv] = 0.0
            for j in range(lone_indptr[i], lone_indptr[i + 1]):
                w = lone_value[j]
                t = lone_token[j]
                token_sums = &g_sum[t, 0]
                for kv in range(KV):
                    dm[kv] += w * token_sums[kv]
                w = w * w
                token_sums = &g_xi[t, 0]
                for kv in range(KV):
                    ds[kv] += w * token_sums[kv]
            m = lone_rows[i]
            w = c[m]
            for kv in range(KV):
                d_cm[m, kv] += dm[kv]
                d_cs[m, kv] += w * sd[m, kv] * ds[kv]
        for i in range(n_drawn):
            for n in range(KV * S):
                row_g[n] = 0.0
            for kv in range(KV):
                dm[kv] = 0.0
            for j in range(row_indptr[i], row_indptr[i + 1]):
                u = row_value[j]
                t = row_token[j]
                row = &g_t[t, 0]
                for n in range(KV * S):
                    row_g[n] += u * row[n]
                token_sums = &g_sum[t, 0]
                for kv in range(KV):
                    dm[kv] += u * token_sums[kv]
            row = &eps[i, 0, 0]
            for n in range(KV * S):
                row_g[n] *= row[n]
            m = drawn_rows[i]
            for kv in range(KV):
                acc = 0.0
                for s in range(S):
                    acc = acc + row_g[kv * S + s]
                d_cs[m, kv] += acc
                d_cm[m, kv] += dm[kv]


# Inducing variables per block of inducing_gradient (its sums' rows stay in
# the first-level cache).
cdef enum:
    _GRADIENT_BLOCK = 128


def inducing_gradient(
    const double[::1] c,
    const double[:, :, ::1] q_mu,
    const double[:, :, ::1] q_sqrt,
    const double[:, ::1] d_cm,
    const double[:, ::1] d_cs,
    double[:, :, ::1] grad_mu,
    double[:, :, ::1] grad_sqrt,
    double[::1] d_scales,
):
    """:func:`backward`'s sums as gradients of the parameters and the scales.

    With ``d_cm`` and ``d_cs`` (n_inducing, K * V) the derivatives with
    respect to ``c * q_mu`` and ``c * q_sqrt`` by inducing variable, writes
    ``grad_mu[k, v, m] = c[m] d_cm[m, kv]``, the same for ``grad_sqrt`` from
    ``d_cs`` (both (K, V, n_inducing), the parameters' own layout) and
    ``d_scales[m] = sum_kv q_mu[k, v, m] d_cm[m, kv] + q_sqrt[k, v, m]
    d_cs[m, kv]``, all overwritten: one pass where NumPy's broadcast
    products, transposed copies and contractions make six over arrays of
    ``K * V`` columns.
    """
    cdef Py_ssize_t K = q_mu.shape[0], V = q_mu.shape[1], M = q_mu.shape[2]
    cdef Py_ssize_t block, m, m0, m1, k, v, kv
    cdef double a, b
    with nogil:
        # Blocks of inducing variables, label by label within a block: every
        # array is then read and written in runs of contiguous values (the
        # parameters' rows and the sums' columns), which a loop over the
        # variables with all labels inside would visit K * V rows apart.
        for block in range((M + _GRADIENT_BLOCK - 1) // _GRADIENT_BLOCK):
            m0 = block * _GRADIENT_BLOCK
            m1 = min(m0 + _GRADIENT_BLOCK, M)
            for m in range(m0, m1):
                d_scales[m] = 0.0
            for k in range(K):
                for v in range(V):
                    kv = k * V + v
                    for m in range(m0, m1):
                        a = d_cm[m, kv]
                        b = d_cs[m, kv]
                        grad_mu[k, v, m] = c[m] * a
                        grad_sqrt[k, v, m] = c[m] * b
                        d_scales[m] += q_mu[k, v, m] * a + q_sqrt[k, v, m] * b
