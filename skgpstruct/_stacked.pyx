"""Compiled sampling and back-propagation of a chunk's stacked unary potentials.

A chunk of sequences evaluated in the stacked form (see
:class:`skgpstruct.inference.inducing.StackedProjection`) has, at every token
``t``, a short list of *entries*: the inducing variables ``m`` active there,
with their feature value ``u`` and, for a row active at several tokens of its
sequence (a *drawn* row), the index ``i`` of that row's own noise (``-1`` for
a *lone* row, active at that token only). The entries are stored by token,
CSR style: ``indptr`` (n_tokens + 1), ``inducing``, ``value``, ``drawn``.

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

These loops replace sparse products with (n_tokens, K * V * S) dense blocks
and their gathers and scatters, one pass over each token's entries instead of
several over the whole chunk. Every function trusts its caller for shapes,
dtypes and index ranges (``skgpstruct.inference.terms`` builds the arrays)
and runs without the GIL.
"""

import numpy as np

from libc.math cimport sqrt
from libc.stdint cimport int64_t


def token_sd(
    const int64_t[::1] indptr,
    const int64_t[::1] inducing,
    const double[::1] value,
    const int64_t[::1] drawn,
    const double[::1] c,
    const double[:, ::1] sd,
    double floor,
    double[:, ::1] out,
):
    """Standard deviation of every token's lone rows plus ``floor``.

    ``out`` (n_tokens, K * V) is overwritten.
    """
    cdef Py_ssize_t T = out.shape[0], KV = out.shape[1]
    cdef Py_ssize_t t, j, kv
    cdef int64_t m
    cdef double w
    with nogil:
        for t in range(T):
            for kv in range(KV):
                out[t, kv] = floor
            for j in range(indptr[t], indptr[t + 1]):
                if drawn[j] >= 0:
                    continue
                m = inducing[j]
                w = value[j] * c[m]
                w = w * w
                for kv in range(KV):
                    out[t, kv] += w * sd[m, kv] * sd[m, kv]
            for kv in range(KV):
                out[t, kv] = sqrt(out[t, kv])


def unary(
    const int64_t[::1] indptr,
    const int64_t[::1] inducing,
    const double[::1] value,
    const int64_t[::1] drawn,
    const int64_t[::1] drawn_rows,
    const double[::1] c,
    const double[:, ::1] mean,
    const double[:, ::1] sd,
    const double[:, ::1] token_sd,
    const double[:, :, ::1] eps,
    const double[:, :, :, ::1] xi,
    double[:, :, :, ::1] out,
):
    """Unary samples ``out`` (K, S, n_tokens, V), overwritten.

    ``drawn_rows`` is the inducing variable of every drawn row.
    """
    cdef Py_ssize_t K = xi.shape[0], S = xi.shape[1], T = xi.shape[2]
    cdef Py_ssize_t V = xi.shape[3], KV = K * V, n_drawn = eps.shape[0]
    cdef double[::1] mean_t = np.empty(KV)
    cdef double[::1] noise_buffer = np.empty(KV * S)
    # Every drawn row's noise times c sd, (K * V * S) per row: an entry then
    # adds u times its row, in one flat loop.
    cdef double[:, ::1] scaled = np.empty((n_drawn, KV * S))
    cdef double* noise_t = &noise_buffer[0]
    cdef double* acc
    cdef const double* row
    cdef const double* noise
    cdef Py_ssize_t t, j, k, v, kv, s, n
    cdef int64_t m, i
    cdef double u, w
    with nogil:
        for i in range(n_drawn):
            m = drawn_rows[i]
            acc = &scaled[i, 0]
            noise = &eps[i, 0, 0]
            for kv in range(KV):
                w = c[m] * sd[m, kv]
                for s in range(S):
                    acc[kv * S + s] = w * noise[kv * S + s]
        for t in range(T):
            for kv in range(KV):
                mean_t[kv] = 0.0
            for n in range(KV * S):
                noise_t[n] = 0.0
            for j in range(indptr[t], indptr[t + 1]):
                m = inducing[j]
                u = value[j]
                acc = &mean_t[0]
                row = &mean[m, 0]
                w = u * c[m]
                for kv in range(KV):
                    acc[kv] += w * row[kv]
                i = drawn[j]
                if i >= 0:
                    row = &scaled[i, 0]
                    for n in range(KV * S):
                        noise_t[n] += u * row[n]
            for k in range(K):
                for s in range(S):
                    for v in range(V):
                        kv = k * V + v
                        out[k, s, t, v] = (
                            mean_t[kv] + noise_t[kv * S + s]
                            + token_sd[t, kv] * xi[k, s, t, v]
                        )


def backward(
    const int64_t[::1] indptr,
    const int64_t[::1] inducing,
    const double[::1] value,
    const int64_t[::1] drawn,
    const int64_t[::1] drawn_rows,
    const double[::1] c,
    const double[:, ::1] sd,
    const double[:, ::1] token_sd,
    const double[:, :, ::1] eps,
    const double[:, :, :, ::1] xi,
    const double[:, :, :, ::1] g,
    double[:, ::1] d_cm,
    double[:, ::1] d_cs,
):
    """Add the gradients of :func:`unary`'s samples into ``d_cm`` and ``d_cs``.

    ``g`` (K, S, n_tokens, V) is the gradient with respect to the samples;
    ``drawn_rows`` the inducing variable of every drawn row; ``d_cm`` and
    ``d_cs`` (n_inducing, K * V) receive the derivatives with respect to
    ``c * mean`` and ``c * sd``: an entry adds ``u sum_s g`` to the first
    and, to the second, its share of the token's spread,
    ``u^2 (c sd)[m] / token_sd * sum_s g xi`` (lone), or ``u g`` into its
    drawn row's sum, which adds ``sum_s (sum of u g) eps`` once per row.
    """
    cdef Py_ssize_t K = xi.shape[0], S = xi.shape[1], T = xi.shape[2]
    cdef Py_ssize_t V = xi.shape[3], KV = K * V, n_drawn = eps.shape[0]
    cdef double[:, ::1] g_t = np.empty((KV, S))
    cdef double[::1] g_sum = np.empty(KV)
    cdef double[::1] g_xi = np.empty(KV)
    # Per drawn row: sum over its entries of u g, (K * V * S).
    cdef double[:, ::1] row_g = np.zeros((n_drawn, KV * S))
    cdef const double* g_flat = &g_t[0, 0]
    cdef const double* noise
    cdef double* acc_row
    cdef Py_ssize_t t, j, k, v, kv, s, n
    cdef int64_t m, i
    cdef double u, acc, spread
    with nogil:
        for t in range(T):
            for k in range(K):
                for v in range(V):
                    kv = k * V + v
                    g_sum[kv] = 0.0
                    acc = 0.0
                    for s in range(S):
                        g_t[kv, s] = g[k, s, t, v]
                        g_sum[kv] += g[k, s, t, v]
                        acc = acc + g[k, s, t, v] * xi[k, s, t, v]
                    spread = token_sd[t, kv]
                    g_xi[kv] = acc / spread if spread > 0 else 0.0
            for j in range(indptr[t], indptr[t + 1]):
                m = inducing[j]
                u = value[j]
                for kv in range(KV):
                    d_cm[m, kv] += u * g_sum[kv]
                i = drawn[j]
                if i < 0:
                    u = u * u * c[m]
                    for kv in range(KV):
                        d_cs[m, kv] += u * sd[m, kv] * g_xi[kv]
                else:
                    acc_row = &row_g[i, 0]
                    for n in range(KV * S):
                        acc_row[n] += u * g_flat[n]
        for i in range(n_drawn):
            m = drawn_rows[i]
            acc_row = &row_g[i, 0]
            noise = &eps[i, 0, 0]
            for n in range(KV * S):
                acc_row[n] *= noise[n]
            for kv in range(KV):
                acc = 0.0
                for s in range(S):
                    acc = acc + acc_row[kv * S + s]
                d_cs[m, kv] += acc
