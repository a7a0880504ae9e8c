"""NumPy reference of the stacked unary potentials (``skgpstruct._stacked``).

The same sums written with scipy's sparse products, as the library computed
them before the compiled loops: the lone entries as a (tokens x inducing)
matrix, the drawn rows as a (rows x tokens) one, and a gather matrix that
sums per-row values into their inducing variables. Used by the tests and
by ``benchmarks/bench_stacked.py``. Also the stacked layout of a chunk
built sequence by sequence (:func:`layout_by_sequence`), as the library
built it before its vectorised ``InducingFeatures.chunk_layout``.
"""

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


@dataclass
class SparseSplit:
    """A :class:`~skgpstruct.inference.inducing.RowSplit` as sparse matrices."""

    lone: sp.csr_matrix  # (n_tokens, n_inducing)
    lone_squares: sp.csr_matrix
    U_drawn: sp.csr_matrix  # (n_drawn, n_tokens)
    drawn_gather: sp.csr_matrix  # (n_inducing, n_drawn)


def sparse_split(split, n_inducing):
    """The sparse matrices of ``split`` (a RowSplit) over ``n_inducing``."""
    T = split.n_tokens
    token = np.repeat(np.arange(T), np.diff(split.indptr))
    is_drawn = split.entry_drawn >= 0
    value = split.value.astype(np.float64)  # stored in single precision
    lone = sp.csr_matrix(
        (value[~is_drawn], (token[~is_drawn], split.inducing[~is_drawn])),
        shape=(T, n_inducing),
    )
    n_drawn = split.drawn.size
    U_drawn = sp.csr_matrix(
        (value[is_drawn], (split.entry_drawn[is_drawn], token[is_drawn])),
        shape=(n_drawn, T),
    )
    gather = sp.csr_matrix(
        (np.ones(n_drawn), (split.drawn_rows, np.arange(n_drawn))),
        shape=(n_inducing, n_drawn),
    )
    return SparseSplit(lone, lone.multiply(lone).tocsr(), U_drawn, gather)


def token_sd(sparse, c, sd, floor):
    """(n_tokens, K * V) standard deviation of every token's lone rows."""
    return np.sqrt(sparse.lone_squares @ (c[:, None] * sd) ** 2 + floor)


def unary(sparse, c, mean, sd, token_sd, eps, xi):
    """Unary samples (K, S, n_tokens, V)."""
    K, S, T, V = xi.shape
    cm, cs = c[:, None] * mean, c[:, None] * sd
    gather = sparse.drawn_gather.T
    drawn_mean = gather @ cm  # (n_drawn, K * V)
    drawn_noise = (gather @ cs)[..., None] * eps  # (n_drawn, K * V, S)
    f_mean = sparse.lone @ cm + sparse.U_drawn.T @ drawn_mean  # (T, K * V)
    f_noise = (sparse.U_drawn.T @ drawn_noise.reshape(len(eps), -1)).reshape(
        T, K * V, S
    )
    f = f_mean[:, :, None] + f_noise + token_sd[:, :, None] * xi.transpose(
        2, 0, 3, 1
    ).reshape(T, K * V, S)
    return np.ascontiguousarray(f.reshape(T, K, V, S).transpose(1, 3, 0, 2))


def backward(sparse, c, sd, token_sd, eps, xi, g):
    """``(d_cm, d_cs)``: derivatives of ``sum(g * unary)`` with respect to
    ``c * mean`` and ``c * sd``, each (n_inducing, K * V)."""
    K, S, T, V = g.shape
    g_tks = g.transpose(2, 0, 3, 1).reshape(T, K * V, S)
    xi_tks = xi.transpose(2, 0, 3, 1).reshape(T, K * V, S)
    g_mean = g_tks.sum(axis=-1)
    g_xi = np.einsum("tks,tks->tk", g_tks, xi_tks)
    g_xi = np.divide(g_xi, token_sd, out=np.zeros_like(g_xi), where=token_sd > 0)
    d_cm = sparse.lone.T @ g_mean + sparse.drawn_gather @ (sparse.U_drawn @ g_mean)
    d_cs = (sparse.lone_squares.T @ g_xi) * (c[:, None] * sd)
    u_g = (sparse.U_drawn @ g_tks.reshape(T, -1)).reshape(eps.shape)
    d_cs += sparse.drawn_gather @ np.einsum("iks,iks->ik", u_g, eps)
    return np.asarray(d_cm), np.asarray(d_cs)


def row_split(U, rows):
    """The arrays of a :class:`~skgpstruct.inference.inducing.RowSplit` of
    ``U`` (rows x tokens, CSR) by scipy's conversions: a row with one
    entry is lone, the others drawn; the entries token by token (CSC, rows
    sorted) and the drawn rows' entries row by row (``U[drawn]``)."""
    U = sp.csr_matrix(U, copy=True)
    U.sum_duplicates()
    rows = np.asarray(rows, dtype=np.int64)
    drawn = np.flatnonzero(np.diff(U.indptr) != 1)
    position = np.full(U.shape[0], -1)
    position[drawn] = np.arange(drawn.size)
    by_token = U.tocsc()
    by_token.sort_indices()
    U_drawn = U[drawn]
    # The lone rows' entries by inducing variable: U's lone rows gathered
    # into (variable x token), sorted.
    lone_U = U[np.flatnonzero(np.diff(U.indptr) == 1)].tocoo()
    lone_rows = rows[np.flatnonzero(np.diff(U.indptr) == 1)]
    by_variable = sp.coo_matrix(
        (lone_U.data, (lone_rows[lone_U.row], lone_U.col)),
        shape=(int(rows.max(initial=-1)) + 1, U.shape[1]),
    ).tocsr()
    by_variable.sort_indices()
    lone_counts = np.diff(by_variable.indptr)
    return {
        "drawn": drawn, "drawn_rows": rows[drawn], "indptr": by_token.indptr,
        "inducing": rows[by_token.indices], "value": by_token.data,
        "entry_drawn": position[by_token.indices], "row_indptr": U_drawn.indptr,
        "row_token": U_drawn.indices, "row_value": U_drawn.data,
        "lone_rows": np.flatnonzero(lone_counts),
        "lone_indptr": np.concatenate([[0], np.cumsum(lone_counts[lone_counts > 0])]),
        "lone_token": by_variable.indices, "lone_value": by_variable.data,
    }


def layout_by_sequence(n_features, X, offsets, compact):
    """``(rows, support, row_starts, U)`` of a chunk, one sequence at a time.

    Each sequence's active features (sorted; duplicates summed, stored
    zeros kept) and then its bias (``n_features``) are its stacked rows;
    ``U`` (stacked rows x tokens) holds their values at its tokens and a 1
    for the bias at every token. With ``compact`` the rows are numbered
    within the features active anywhere and the bias (``support``, None
    when that is all of them).
    """
    X = sp.csr_matrix(X, copy=True)
    rows, coords_row, coords_token, values = [], [], [], []
    n_stacked = 0
    for n in range(len(offsets) - 1):
        t0, t1 = int(offsets[n]), int(offsets[n + 1])
        X_n = X[t0:t1]
        X_n.sum_duplicates()
        active = np.unique(X_n.indices).astype(np.int64)
        coo = X_n.tocoo()
        coords_row += [n_stacked + np.searchsorted(active, coo.col),
                       np.full(t1 - t0, n_stacked + active.size)]
        coords_token += [t0 + coo.row, np.arange(t0, t1)]
        values += [coo.data, np.ones(t1 - t0)]
        rows.append(np.append(active, n_features))
        n_stacked += active.size + 1
    support = None
    if compact:
        support = np.unique(np.concatenate(rows))
        if support.size == n_features + 1:
            support = None
        else:
            rows = [np.searchsorted(support, r) for r in rows]
    U = sp.csr_matrix(
        (np.concatenate(values), (np.concatenate(coords_row),
                                  np.concatenate(coords_token))),
        shape=(n_stacked, X.shape[0]),
    )
    row_starts = np.concatenate([[0], np.cumsum([r.size for r in rows])])
    return rows, support, row_starts, U
