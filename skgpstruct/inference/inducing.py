"""Inducing variables: their choice, and the projection of tokens on them."""

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy import linalg

from .._layout import chunk_rows, collapsed_design, split_rows
from .._linalg import cholesky_backward, jitter_cholesky
from .._sequences import (
    canonical_csr,
    column_positions,
    select_columns,
    sorted_unique,
    without_stored_zeros,
)
from ..kernels import _feature_scales_at, _feature_scales_vjp_at

__all__ = [
    "distinct_rows",
    "select_inducing_points",
    "Projection",
    "StackedProjection",
    "RowSplit",
    "FeatureLayout",
    "InducingPoints",
    "InducingFeatures",
    "CollapsedFeatures",
]

#: Largest lookup table of a model's columns kept for its predictions
#: (:meth:`InducingFeatures.select`): 4 bytes per design column, so designs
#: of up to 2**24 columns (FeatureHasher's default is 2**20); wider ones
#: select through a binary search per stored entry.
COLUMN_LOOKUP_BYTES = 64 * 2**20
#: Stands for the lookup table of a posterior without one (the compiled
#: design then searches the lone columns).
_NO_LOOKUP = np.empty(0, dtype=np.int32)


def distinct_rows(X):
    """Indices of the first occurrence of every distinct row of X.

    Parameters
    ----------
    X : ndarray or CSR matrix of shape (n_tokens, n_features)

    Returns
    -------
    indices : ndarray of int64, sorted
    """
    if sp.issparse(X):
        # Compared by value: canonical (sorted, duplicates summed), without
        # stored zeros (which include -0.0).
        X = without_stored_zeros(canonical_csr(X))
        seen = {}
        indptr, indices, data = X.indptr, X.indices, X.data
        for row in range(X.shape[0]):
            lo, hi = indptr[row], indptr[row + 1]
            seen.setdefault((indices[lo:hi].tobytes(), data[lo:hi].tobytes()), row)
        return np.sort(np.fromiter(seen.values(), dtype=np.int64))
    _, first = np.unique(X, axis=0, return_index=True)
    return np.sort(first.astype(np.int64))


def select_inducing_points(X, kernel, n_inducing, method, rng):
    """Pick ``n_inducing`` distinct training tokens as inducing inputs.

    Parameters
    ----------
    X : ndarray or CSR matrix of shape (n_tokens, n_features)
    kernel : Kernel
    n_inducing : int
        Capped at the number of distinct rows.
    method : {"kmeans++", "random"}
        ``"kmeans++"`` draws each new point with probability proportional to
        its squared kernel distance to the nearest point already chosen (the
        k-means++ seeding rule in the kernel's feature space), which spreads
        the points over the data; ``"random"`` draws uniformly.
    rng : numpy.random.Generator

    Returns
    -------
    indices : ndarray of int64 of shape (n_chosen,)
        Row indices into X, sorted.
    """
    candidates = distinct_rows(X)
    m = min(int(n_inducing), candidates.shape[0])
    if m == candidates.shape[0]:
        return candidates
    if method == "random":
        return np.sort(rng.choice(candidates, size=m, replace=False))
    Xc = X[candidates]
    self_sim = kernel.diag(Xc)
    chosen = [int(rng.integers(candidates.shape[0]))]
    dist2 = np.full(candidates.shape[0], np.inf)
    for _ in range(m - 1):
        last = Xc[chosen[-1] : chosen[-1] + 1]
        k_last = kernel(Xc, last)[:, 0]
        d2 = np.maximum(self_sim + self_sim[chosen[-1]] - 2.0 * k_last, 0.0)
        np.minimum(dist2, d2, out=dist2)
        dist2[chosen] = 0.0
        total = dist2.sum()
        if total <= 0:
            remaining = np.setdiff1d(np.arange(candidates.shape[0]), chosen)
            chosen.extend(rng.choice(remaining, size=m - len(chosen), replace=False))
            break
        chosen.append(int(rng.choice(candidates.shape[0], p=dist2 / total)))
    return np.sort(candidates[np.asarray(chosen, dtype=np.int64)])


# ---------------------------------------------------------------------- #
# Inducing variables: how the whitened inducing vector v maps to the unary
# potentials of a chunk of tokens, f_t = B[:, t] . v + sqrt(residual_t) xi.
@dataclass
class Projection:
    """Per-sequence whitened projections of a chunk of tokens.

    Attributes
    ----------
    rows : list of (ndarray of int64 or None)
        Per sequence, the inducing variables its tokens depend on (None: all).
    B : list of ndarray of shape (n_rows, T_n)
        Per sequence, ``f[t] = B[:, t] . v[rows]`` (before the residual).
    residual : ndarray of shape (n_tokens,)
        Conditional prior variance of every token given the inducing variables.
    cache : object
        Whatever :meth:`backward` needs.
    """

    rows: list
    B: list
    residual: np.ndarray
    cache: object = None


def _sequence_features(X, offsets):
    """Per sequence of a CSR ``X``: ``(t0, t1, X_n, active)``.

    ``X_n`` are its rows with duplicate entries summed and ``active`` its
    active features, sorted.
    """
    for n in range(len(offsets) - 1):
        t0, t1 = int(offsets[n]), int(offsets[n + 1])
        X_n = X[t0:t1]
        X_n.sum_duplicates()
        yield t0, t1, X_n, np.unique(X_n.indices).astype(np.int64)


@dataclass
class StackedProjection:
    """All sequences of a chunk as one sparse block-diagonal projection.

    Row ``r`` of the stack is inducing variable ``rows[r]`` as seen by the
    sequence that owns the row, so that every sequence keeps its own draw of
    the inducing variables: ``B = diag(scale) U`` with ``U`` sparse (only the
    feature activations and a bias row per sequence), and the unary
    potentials of the whole chunk are ``f = U^T (scale * v)`` for draws
    ``v = m + s * eps`` of every row.

    The pathwise estimator never forms that product over all rows (see
    :class:`RowSplit`). Most rows are active at a single token of their
    sequence (a word seen once in it). Such a *lone* row's draw reaches that
    token only, independently of every other row, so the sum of a token's
    lone rows is one Gaussian per token, label and sample, of mean
    ``sum_r u_r scale_r m_r`` and variance ``sum_r u_r^2 scale_r^2 s_r^2``;
    it is sampled as one draw (the local reparameterisation of Kingma,
    Salimans and Welling, 2015). Only the other rows, the *drawn* ones (the
    bias, and features repeated within a sequence), are drawn one by one.
    The joint distribution of every sequence's potentials is the same as
    with one draw per row.

    Attributes
    ----------
    rows : ndarray of int64 of shape (n_rows,)
        The inducing variable of every stacked row (its scale is
        ``scales[rows]``).
    scales : ndarray of shape (n_inducing,)
        The feature scales of the inducing variables.
    split : RowSplit
        ``U`` by lone and drawn rows.

    The conditional ``p(f | u)`` is exact: there is no residual variance.
    """

    rows: np.ndarray
    scales: np.ndarray
    split: "RowSplit"


@dataclass
class RowSplit:
    """The stacked rows ``U`` by how many tokens they are active at, by token.

    A row active at exactly one token is *lone*; the others (active at no
    token or at several) are *drawn*, each with its own noise. The nonzero
    entries of ``U`` are listed token by token (CSR style), which is how
    the compiled kernels of ``skgpstruct._stacked`` read them. The arrays
    with one index or value per entry are 32-bit: they are most of a
    chunk's memory (on ``bench_scale.py``'s data, 100 active features per
    token). The values are single precision, as the kernels sample in it.

    Attributes
    ----------
    drawn : ndarray of int64
        The drawn rows (indices of stacked rows).
    drawn_rows : ndarray of int64
        Their inducing variables.
    indptr : ndarray of int64 of shape (n_tokens + 1,)
        Token ``t``'s entries are ``indptr[t]:indptr[t + 1]``.
    inducing : ndarray of int32
        Every entry's inducing variable.
    value : ndarray of float32
        Every entry's value (the feature's value at that token).
    entry_drawn : ndarray of int32
        Every entry's position in ``drawn``, or -1 for a lone row.
    row_indptr : ndarray of int64 of shape (drawn.size + 1,)
        The drawn rows' entries again, row by row: drawn row ``i`` has
        ``row_indptr[i]:row_indptr[i + 1]`` of ``row_token`` and
        ``row_value``.
    row_token : ndarray of int32
        The token of each of those entries.
    row_value : ndarray of float32
        Its value.
    lone_rows : ndarray of int64
        The inducing variables of the lone rows, each once, increasing.
    lone_indptr : ndarray of int64 of shape (lone_rows.size + 1,)
        The lone rows' entries again, by inducing variable (the backward
        pass then writes each variable's gradient once, in order):
        variable ``lone_rows[i]`` has ``lone_indptr[i]:lone_indptr[i + 1]``
        of ``lone_token`` and ``lone_value``, in token order.
    lone_token : ndarray of int32
        The token of each of those entries.
    lone_value : ndarray of float32
        Its value.
    """

    drawn: np.ndarray
    drawn_rows: np.ndarray
    indptr: np.ndarray
    inducing: np.ndarray
    value: np.ndarray
    entry_drawn: np.ndarray
    row_indptr: np.ndarray
    row_token: np.ndarray
    row_value: np.ndarray
    lone_rows: np.ndarray
    lone_indptr: np.ndarray
    lone_token: np.ndarray
    lone_value: np.ndarray

    @property
    def n_tokens(self):
        return self.indptr.size - 1

    @property
    def by_token(self):
        """``(indptr, inducing, value)``: the entries token by token."""
        return self.indptr, self.inducing, self.value

    @property
    def by_row(self):
        """``(row_indptr, row_token, row_value, drawn_rows)``: the drawn rows'
        entries row by row, and their inducing variables."""
        return self.row_indptr, self.row_token, self.row_value, self.drawn_rows

    def lone_entries(self, dtype=np.float32):
        """``(lone_indptr, lone_token, lone_value, lone_rows)``, the lone
        rows' entries by inducing variable and those variables, with the
        values in ``dtype`` (as :meth:`entries`)."""
        value = self.lone_value.astype(dtype, copy=False)
        return self.lone_indptr, self.lone_token, value, self.lone_rows

    def entries(self, dtype=np.float32):
        """``(by_token, by_row)`` with the values in ``dtype``, as the kernels
        of ``skgpstruct._stacked`` take them in that precision (the stored
        arrays themselves in single precision, copies in double)."""
        indptr, inducing, value = self.by_token
        row_indptr, row_token, row_value, drawn_rows = self.by_row
        return (
            (indptr, inducing, value.astype(dtype, copy=False)),
            (row_indptr, row_token, row_value.astype(dtype, copy=False), drawn_rows),
        )

    @classmethod
    def of(cls, U, rows, n_inducing):
        """Split the stacked rows of ``U`` (CSR, rows x tokens).

        ``rows[r]`` is the inducing variable of stacked row ``r``, in
        ``[0, n_inducing)``.
        """
        U = sp.csr_matrix(U, copy=True)
        U.sum_duplicates()
        # The entries token by token, each token's in row order: the CSC
        # form (a counting sort, no comparison sort).
        by_token = U.tocsc()
        by_token.sort_indices()
        return cls.of_token_entries(
            by_token.indptr, by_token.indices, by_token.data, U.shape[0], rows,
            n_inducing,
        )

    @classmethod
    def of_token_entries(cls, indptr, entry_row, value, n_rows, rows, n_inducing):
        """The split of a ``U`` given by its entries token by token.

        Parameters
        ----------
        indptr : ndarray of int of shape (n_tokens + 1,)
            Token ``t``'s entries are ``indptr[t]:indptr[t + 1]``.
        entry_row : ndarray of int
            Every entry's stacked row, increasing within each token (one
            entry per row and token at most).
        value : ndarray of float
            Every entry's value.
        n_rows : int
            Number of stacked rows (a row with no entry is drawn).
        rows : ndarray of int of shape (n_rows,)
            The inducing variable of every stacked row, in ``[0, n_inducing)``.
        n_inducing : int

        Returns
        -------
        RowSplit
        """
        n_tokens = len(indptr) - 1
        if max(n_rows, n_tokens, n_inducing) > np.iinfo(np.int32).max:
            raise ValueError(
                f"a chunk's rows ({n_rows}), tokens ({n_tokens}) and inducing "
                f"variables ({n_inducing}) must each fit 32-bit indices"
            )
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and not 0 <= rows.min() <= rows.max() < n_inducing:
            raise ValueError(f"rows must lie in [0, {n_inducing})")
        entry_row = np.asarray(entry_row, dtype=np.int64)
        if entry_row.size and not 0 <= entry_row.min() <= entry_row.max() < n_rows:
            raise ValueError(f"entry_row must lie in [0, {n_rows})")
        drawn, entry_drawn, row_indptr, by_row, entry_token = split_rows(
            np.asarray(indptr, dtype=np.int64), entry_row, n_rows
        )
        value = np.asarray(value)
        inducing = rows.astype(np.int32)[entry_row]
        # The lone entries by inducing variable (a stable radix sort keeps
        # each variable's in token order).
        lone = np.flatnonzero(entry_drawn < 0)
        lone = lone[np.argsort(inducing[lone], kind="stable")]
        lone_variable = inducing[lone]
        starts = np.flatnonzero(np.diff(lone_variable, prepend=-1))
        return cls(
            drawn,
            rows[drawn],
            np.asarray(indptr, dtype=np.int64),
            inducing,
            value.astype(np.float32),
            entry_drawn,
            row_indptr,
            entry_token[by_row],
            value[by_row].astype(np.float32),
            lone_variable[starts].astype(np.int64),
            np.append(starts, lone.size).astype(np.int64),
            entry_token[lone],
            value[lone].astype(np.float32),
        )


@dataclass
class FeatureLayout:
    """What :meth:`InducingFeatures.chunk_layout` precomputes for a chunk.

    Attributes
    ----------
    rows : list of ndarray of int64
        Per sequence, its active features and the bias (numbered within
        ``support`` when it is not None): views of ``stacked_rows``.
    support : ndarray of int64 or None
        Compact layouts: the features active anywhere in the chunk and the
        bias, which ``rows`` are numbered within. None when that is every
        inducing variable (the numbers are then the global ones).
    row_starts : ndarray of int64 of shape (n_sequences + 1,)
        Sequence ``n`` owns the stacked rows ``row_starts[n]`` to
        ``row_starts[n + 1]`` (its active features, then its bias).
    stacked_rows : ndarray of int64
        ``rows`` concatenated: the inducing variable of every stacked row.
    split : RowSplit
        The block-diagonal matrix ``U`` of :class:`StackedProjection` (each
        sequence's block), split by lone and drawn rows: about as large as
        the chunk's ``X``.
    """

    rows: list
    support: object
    row_starts: np.ndarray
    stacked_rows: np.ndarray
    split: RowSplit


def active_columns(X):
    """The columns of ``X`` with a nonzero entry, increasing, as int64 (a
    stored zero is not one)."""
    if sp.issparse(X):
        X = canonical_csr(X)
        return sorted_unique(X.indices[X.data != 0]).astype(np.int64)
    return np.flatnonzero(np.any(np.asarray(X) != 0, axis=0)).astype(np.int64)


class InducingPoints:
    """Inducing inputs Z among the tokens: ``u_j = f_j(Z)``, whitened.

    ``v = L_zz^{-1} u`` with ``L_zz = chol(K(Z, Z))``, so that
    ``B = L_zz^{-1} K(Z, X)`` and ``residual = diag K(X, X) - |B|^2``
    (eq. 18-19). Cost per chunk of T tokens: O(M^2 T).

    Parameters
    ----------
    Z : ndarray or CSR matrix of shape (M, n_features)
    """

    def __init__(self, Z):
        self.Z = Z

    @property
    def n_inducing(self):
        return self.Z.shape[0]

    def chunk_layout(self, X, offsets, compact=False):
        """Nothing to precompute for inducing points."""
        return None

    @staticmethod
    def select(X, keep_lookup=False):
        """The design as the variables take it: every column (a kernel
        between tokens reads all of them; ``keep_lookup`` is
        :meth:`InducingFeatures.select`'s)."""
        return X

    @staticmethod
    def prior_columns(X):
        """No column is left at its prior: an empty array."""
        return np.zeros(0, dtype=np.int64)

    @staticmethod
    def support(layout):
        """Every token depends on every inducing point: no restriction."""
        return None

    @staticmethod
    def stacked_projection(L_zz, layout):
        """Inducing points have no sparse stacked form (see InducingFeatures)."""
        return None

    @staticmethod
    def restrict_state(L_zz, support):
        """The state is used whole (there is never a support)."""
        return L_zz

    def prepare(self, kernel):
        """Per-evaluation state shared by all chunks: the factor L_zz."""
        L_zz, _ = jitter_cholesky(
            kernel(self.Z), name="K_zz (kernel of the inducing inputs)"
        )
        return L_zz

    def _whitened(self, kernel, L_zz, X):
        """``B = L_zz^{-1} K_zx``: the tokens' whitened projection."""
        return linalg.solve_triangular(
            L_zz, kernel(self.Z, X), lower=True, check_finite=False
        )

    def project(self, kernel, L_zz, X, offsets, layout=None):
        """Projection of the tokens X (sequences delimited by offsets)."""
        B = self._whitened(kernel, L_zz, X)
        residual = np.maximum(kernel.diag(X) - np.einsum("mt,mt->t", B, B), 0.0)
        n_seq = len(offsets) - 1
        pieces = [B[:, offsets[n] : offsets[n + 1]] for n in range(n_seq)]
        return Projection([None] * n_seq, pieces, residual, cache=B)

    @staticmethod
    def mean_state(kernel, L_zz, mean):
        """What :meth:`mean_potentials` needs of the posterior mean ``mean``
        (V, M): here the arguments themselves (the tokens' projection is
        the work, done per call)."""
        return kernel, L_zz, mean

    def mean_potentials(self, mean_state, X):
        """Posterior mean of the latent functions at the tokens ``X``,
        ``(mean @ B).T`` of shape (n_tokens, V), from :meth:`mean_state`."""
        kernel, L_zz, mean = mean_state
        return (mean @ self._whitened(kernel, L_zz, X)).T

    def backward(self, kernel, L_zz, X, projection, d_B, d_residual):
        """Chunk part of the gradient: (d L_zz, d theta) from d B and d residual.

        ``d_B`` is a list of per-sequence arrays shaped like ``projection.B``.
        """
        B = projection.cache
        d_B = np.concatenate(d_B, axis=1) if d_B else np.zeros_like(B)
        d_B = d_B - 2.0 * B * d_residual[None, :]
        # B = L^{-1} K_zx  =>  dK_zx = L^{-T} dB,  dL = -L^{-T} dB B^T
        d_K_zx = linalg.solve_triangular(
            L_zz, d_B, lower=True, trans="T", check_finite=False
        )
        d_theta = kernel.gradient_vjp(self.Z, X, d_K_zx) + kernel.diag_gradient_vjp(
            X, d_residual
        )
        return -np.tril(d_K_zx @ B.T), d_theta

    def finish_gradient(self, kernel, L_zz, d_L):
        """Gradient in theta through K_zz, from the summed d L_zz."""
        return kernel.gradient_vjp(self.Z, None, cholesky_backward(L_zz, d_L))


class InducingFeatures:
    """The weights of a linear kernel as inducing variables (weight space).

    For a kernel with an explicit diagonal feature map,
    ``k(x, x') = phi(x) . phi(x')`` with ``phi(x) = c * [x, 1]`` (the linear
    kernels: ``c`` holds the square roots of the weight and offset prior
    variances), ``f_j(x) = w_j . phi(x)`` with ``w_j ~ N(0, I)``. Taking
    ``u_j = w_j`` (an inter-domain inducing variable, already white) makes
    ``p(f | u)`` exact, so the residual is zero and every feature is
    represented. ``B`` restricted to the features active in a sequence is a
    small dense matrix; no M x M factorisation is needed. M = n_features + 1.

    The variables may cover some of the design's columns only
    (``columns``): those active at a training token, whose posterior the
    fit changes (a weight no training token reaches keeps its prior). The
    other columns cost nothing: a design of 2**20 hashed columns of which
    a few thousand are active keeps a few thousand variables per label.
    The methods taking a design ``X`` then take it restricted to
    ``columns`` (:meth:`select`), numbered within them.

    Parameters
    ----------
    n_features : int
        Number of columns of the design.
    columns : ndarray of int or None, default=None
        The columns, increasing, that have inducing variables; None for all.

    Attributes
    ----------
    n_features : int
        Number of columns with inducing variables (M - 1).
    n_design_features : int
        Number of columns of the design (the ``n_features`` given).
    columns : ndarray of int64 or None
    """

    columns = None  # (models pickled before columns existed have all)

    def __init__(self, n_features, columns=None):
        if columns is not None:
            columns = np.asarray(columns, dtype=np.int64)
            if columns.ndim != 1 or np.any(np.diff(columns) <= 0) or (
                columns.size and (columns[0] < 0 or columns[-1] >= n_features)
            ):
                raise ValueError(
                    f"columns must be increasing column indices below "
                    f"n_features={n_features}"
                )
            self._n_design_features = n_features
            n_features = columns.size
        self.columns = columns
        self.n_features = n_features

    @property
    def n_design_features(self):
        """Number of columns of the design (``n_features`` with all of them)."""
        return self.__dict__.get("_n_design_features", self.n_features)

    def select(self, X, keep_lookup=False):
        """The design's columns that have inducing variables, numbered within
        them: ``X`` itself when every column has one.

        Parameters
        ----------
        X : ndarray or sparse matrix of shape (n_tokens, n_design_features)
        keep_lookup : bool, default=False
            For callers that select from many designs (predictions): a
            sparse ``X`` is read through a lookup table of the columns,
            built at the first such call and kept (not pickled), unless it
            would take more than ``COLUMN_LOOKUP_BYTES``; otherwise through
            a binary search per stored entry.

        Returns
        -------
        ndarray or CSR matrix of shape (n_tokens, n_features)
        """
        if self.columns is None:
            return X
        if X.shape[1] != self.n_design_features:
            raise ValueError(
                f"X has {X.shape[1]} features, but the inducing features "
                f"cover a design of {self.n_design_features}"
            )
        if sp.issparse(X):
            positions = self._column_positions() if keep_lookup else None
            return select_columns(canonical_csr(X), self.columns, positions)
        return np.asarray(X)[:, self.columns]

    def _column_positions(self):
        """:func:`~skgpstruct._sequences.column_positions` of :attr:`columns`,
        built once and kept (not pickled); None when it would take more than
        ``COLUMN_LOOKUP_BYTES`` (a design of more than 2**24 columns)."""
        positions = self.__dict__.get("_positions")
        if positions is None:
            if 4 * self.n_design_features > COLUMN_LOOKUP_BYTES:
                return None
            positions = column_positions(self.columns, self.n_design_features)
            self._positions = positions
        return positions

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_positions", None)
        return state

    def prior_columns(self, X):
        """The columns active in ``X`` (a design of every column) that have
        no inducing variable: sorted, empty when all columns have one."""
        if self.columns is None:
            return np.zeros(0, dtype=np.int64)
        return np.setdiff1d(active_columns(X), self.columns, assume_unique=True)

    def design_scales(self, kernel, columns=None):
        """The kernel's scales of the design's ``columns`` (every column when
        None), then the bias's.

        The linear kernels of :mod:`skgpstruct.kernels` compute the columns
        asked for only; another kernel with a feature map, the whole design's
        scales.
        """
        if columns is None:
            return kernel.feature_scales(self.n_design_features)
        return _feature_scales_at(kernel, self.n_design_features, columns)

    def _design_vjp(self, kernel, d_scales):
        """Gradient in theta from the gradient w.r.t. :meth:`prepare`'s scales."""
        if self.columns is None:
            return kernel.feature_scales_vjp(d_scales)
        return _feature_scales_vjp_at(
            kernel, d_scales, self.n_design_features, self.columns
        )

    @property
    def n_inducing(self):
        return self.n_features + 1

    @staticmethod
    def supports(kernel):
        """Whether the kernel has the explicit feature map this needs."""
        return hasattr(kernel, "feature_scales") and hasattr(
            kernel, "feature_scales_vjp"
        )

    def chunk_layout(self, X, offsets, compact=False):
        """Per sequence: its active features and X with local column indices.

        Computed once per fit, so that :meth:`project` only rescales.

        Parameters
        ----------
        X : ndarray or CSR matrix of shape (n_tokens, n_features)
        offsets : ndarray of int64
        compact : bool, default=False
            Number the active features within the chunk's *support* (the
            features active anywhere in the chunk, plus the bias): the chunk
            is then evaluated with the parameters and feature scales of its
            support only (see :meth:`support`), so that its work and its
            gradients scale with its own features, not with all of them. A
            chunk where every feature is active keeps the global numbers.

        Returns
        -------
        layout : FeatureLayout
        """
        # Explicit zeros are kept, as entries.
        X = canonical_csr(X)
        if X.shape[1] != self.n_features:
            raise ValueError(
                f"X has {X.shape[1]} columns; these inducing features take "
                f"{self.n_features}"
            )
        row_starts, all_rows, support, indptr, entry_row, value = chunk_rows(
            X.indptr, X.indices, X.data, np.asarray(offsets, dtype=np.int64),
            self.n_features, self.n_inducing, compact,
        )
        n_space = self.n_inducing if support is None else support.size
        split = RowSplit.of_token_entries(
            indptr, entry_row, value, row_starts[-1], all_rows, n_space
        )
        # Each sequence's rows as a view of the stacked ones: one copy kept.
        rows = [
            all_rows[a:b]
            for a, b in zip(row_starts[:-1], row_starts[1:], strict=True)
        ]
        return FeatureLayout(rows, support, row_starts, all_rows, split)

    @staticmethod
    def support(layout):
        """The inducing variables a compact layout is numbered within, or None."""
        return None if layout is None else layout.support

    @staticmethod
    def stacked_projection(scales, layout):
        """The chunk's :class:`StackedProjection` at these feature scales.

        ``scales`` are those of the layout's support when it is compact (see
        :meth:`restrict_state`). None without a precomputed layout.
        """
        if layout is None:
            return None
        return StackedProjection(layout.stacked_rows, scales, layout.split)

    def stacked_backward(self, kernel, stacked, d_scales):
        """(d scales, d theta) from the gradient w.r.t. ``stacked.scales``."""
        return d_scales, np.zeros(kernel.n_dims)

    @staticmethod
    def restrict_state(scales, support):
        """The feature scales of a compact layout's support."""
        return scales[support]

    def _check_kernel(self, kernel):
        if not self.supports(kernel):
            raise ValueError(
                "inducing features need a kernel with an explicit feature map "
                f"(the linear kernels), got {kernel!r}; use inducing points"
            )

    def prepare(self, kernel):
        """Per-evaluation state: the feature scales of the kernel (of the
        columns with inducing variables, then the bias's)."""
        self._check_kernel(kernel)
        return self.design_scales(kernel, self.columns)

    def project(self, kernel, scales, X, offsets, layout=None):
        """Projection of the tokens X (sequences delimited by offsets).

        Each sequence's block of the stack, its active features and then the
        bias, as a dense (n_rows, T_n) array; numbered within the layout's
        support when a compact layout is given.
        """
        pieces, unscaled, rows = [], [], []
        sequences = _sequence_features(sp.csr_matrix(X), offsets)
        for n, (t0, t1, X_n, active) in enumerate(sequences):
            U_n = np.vstack([X_n[:, active].toarray().T, np.ones((1, t1 - t0))])
            rows_n = np.append(active, self.n_features)
            if layout is not None:
                rows_n = layout.rows[n]
            unscaled.append(U_n)
            pieces.append(scales[rows_n][:, None] * U_n)
            rows.append(rows_n)
        return Projection(rows, pieces, np.zeros(X.shape[0]), cache=unscaled)

    @staticmethod
    def mean_state(kernel, scales, mean):
        """What :meth:`mean_potentials` needs of the posterior mean ``mean``
        (V, n_features + 1): the feature weights ``(c m)^T`` (n_features,
        V), C-ordered, and the bias's share (V,). Work in proportion to the
        parameters, which depends on the posterior alone: a fitted model
        keeps it."""
        return (
            np.ascontiguousarray((mean[:, :-1] * scales[:-1]).T),
            scales[-1] * mean[:, -1],
        )

    @staticmethod
    def mean_potentials(mean_state, X):
        """Posterior mean of the latent functions at the tokens ``X``, of
        shape (n_tokens, V), from :meth:`mean_state`: one sparse product
        plus the bias's share (no per-sequence projection is needed: each
        token's mean is its own)."""
        weights, bias = mean_state
        return np.asarray(X @ weights) + bias

    def backward(self, kernel, scales, X, projection, d_B, d_residual):
        """Gradient w.r.t. the feature scales (returned as the state gradient)."""
        # B_n = scales[rows_n] * U_n  =>  d scale_d = sum_t dB_n[d, t] U_n[d, t]
        d_scales = np.zeros_like(scales)
        for rows_n, g, u in zip(projection.rows, d_B, projection.cache, strict=True):
            d_scales[rows_n] += np.einsum("rt,rt->r", g, u)
        return d_scales, np.zeros(kernel.n_dims)

    def finish_gradient(self, kernel, scales, d_scales):
        """Gradient in theta from the summed gradient w.r.t. the scales."""
        return self._design_vjp(kernel, d_scales)


@dataclass(frozen=True)
class SamplingPosterior:
    """A collapsed posterior as :meth:`CollapsedFeatures.sampling_design`'s
    designs sample it: its model-level half
    (:meth:`CollapsedFeatures.sampling_posterior`).

    Attributes
    ----------
    loadings : CSR matrix of shape (n_collapsed, n_lone)
        ``a_j`` of every lone feature in the row of its training token's
        collapsed variable.
    lone_variable, lone_loading : ndarray of shape (n_lone,)
        Every lone feature's collapsed variable and ``a_j`` (its one entry
        of ``loadings``).
    lone_positions : ndarray of shape (n_original,) or None
        Every original column's position among the lone ones (the lookup
        table of :func:`~skgpstruct._sequences.column_positions`); None
        above ``COLUMN_LOOKUP_BYTES`` (a binary search instead).
    lone_scales, inverse_lone_scales : ndarray of shape (n_lone,)
        The lone features' scales ``c_j`` and their reciprocals.
    inverse_sigma : ndarray of shape (n_collapsed,)
        ``1 / sigma_t`` of every collapsed variable.
    scales : ndarray of shape (n_original + n_collapsed + 1,)
        The design's feature scales (the original features', every
        ``sigma_t``, the bias').
    q_mu, q_sqrt : ndarray of shape (K, V, n_original + n_collapsed + 1)
        The posterior of the design's weights: the kept features' and the
        bias' marginals, lone features at the prior, the collapsed
        variables' posterior.
    """

    loadings: sp.csr_matrix
    lone_variable: np.ndarray
    lone_loading: np.ndarray
    lone_positions: np.ndarray | None
    lone_scales: np.ndarray
    inverse_lone_scales: np.ndarray
    inverse_sigma: np.ndarray
    scales: np.ndarray
    q_mu: np.ndarray
    q_sqrt: np.ndarray


class CollapsedFeatures(InducingFeatures):
    """Inducing features with each training token's lone features as one variable.

    A *lone* feature is active at one training token only. With inducing
    features (:class:`InducingFeatures`: white weights ``u_j`` and feature
    scales ``c_j``), the lone features of a token ``t`` reach the potentials
    through one sum per label, ``g = sum_j x_tj c_j u_j``, whose prior is
    ``N(0, sigma_t^2)`` with ``sigma_t^2 = sum_j (x_tj c_j)^2``. The
    variational posterior of those weights is taken as ``q(g) p(u | g)``:
    the prior's conditional given the sum, with a Gaussian ``q`` on the white
    variable ``g / sigma_t``. The expected log-likelihood depends on the
    weights only through ``g``, and the KL divergence of ``q(u)`` from the
    prior is that of ``q(g)`` from ``p(g)`` (chain rule of the KL), so the
    token's lone features cost one inducing variable per label instead of
    one per feature and label: a *collapsed* variable, whose feature scale
    is ``sigma_t`` and whose feature value is 1 at ``t`` (0 elsewhere).

    Every mean-field posterior of those weights gives ``g`` a Gaussian
    distribution that this family can take, with a KL divergence no smaller
    (the chain rule again), so the bound is at least as tight as the
    mean-field one. Features active at no training token carry no parameter
    (their posterior is the prior). The fit runs on :meth:`transform`'s
    design; :meth:`expand` gives every original feature its marginal
    posterior for prediction (under ``p(u | g)``, ``u_j`` has mean
    ``a_j g / sigma_t`` and variance ``1 - a_j^2``, with
    ``a_j = x_tj c_j / sigma_t``), and :meth:`collapse` the collapsed
    posterior that keeps the marginal of every ``g`` (a warm start).

    Diagonal covariances only. Build with :meth:`of`.

    Parameters
    ----------
    original : InducingFeatures
        The inducing features of the original design (the model's), whose
        feature scales the collapsed ones are made of.
    kept : ndarray of int64
        Original features active at two training tokens or more, in order:
        the first inducing variables.
    lone : ndarray of int64
        Original features active at exactly one training token.
    token_values : CSR matrix of shape (n_collapsed, lone.size)
        Row ``p``: the lone features' values at the token of collapsed
        variable ``p``, each feature in exactly one row.
    tokens : ndarray of int64 of shape (n_collapsed,)
        The training token (row of the stacked design) of each collapsed
        variable, increasing.
    """

    def __init__(self, original, kept, lone, token_values, tokens):
        super().__init__(kept.size + tokens.size)
        self.original = original
        self.n_original = original.n_features
        self.kept, self.lone = kept, lone
        self.token_values, self.tokens = token_values, tokens
        self._squares = token_values.multiply(token_values).tocsr()
        self._squares_t = self._squares.T.tocsr()  # for the theta gradient
        # The collapsed variable and the original feature of every lone entry.
        self._entry_variable = np.repeat(
            np.arange(tokens.size), np.diff(token_values.indptr)
        )
        self._entry_feature = lone[token_values.indices]

    @classmethod
    def of(cls, X, original=None):
        """The collapsed features of a training design ``X`` (all tokens stacked).

        Parameters
        ----------
        X : sparse matrix or ndarray of shape (n_tokens, n_features)
            A stored zero is not an active feature.
        original : InducingFeatures or None, default=None
            The model's inducing features, of which ``X`` is the selected
            design (:meth:`InducingFeatures.select`); None for every column.

        Returns
        -------
        CollapsedFeatures or None
            None when collapsing would not lower the number of inducing
            variables: every feature is active at some token, and no token
            has two lone features or more.
        """
        n_original = X.shape[1]
        if original is None:
            original = InducingFeatures(n_original)
        if sp.issparse(X):
            X = sp.csr_matrix(X)
            counts = np.bincount(X.indices[X.data != 0], minlength=n_original)
        else:
            counts = np.count_nonzero(X, axis=0)
        kept = np.flatnonzero(counts >= 2)
        if kept.size == n_original:  # every feature at two tokens or more
            return None
        lone = np.flatnonzero(counts == 1)
        values = sp.csr_matrix(X[:, lone], dtype=np.float64)
        values.eliminate_zeros()
        tokens = np.flatnonzero(np.diff(values.indptr))
        if kept.size + tokens.size >= n_original:
            return None
        values = values[tokens]
        values.sort_indices()
        return cls(original, kept, lone, values, tokens)

    def __eq__(self, other):
        """Whether ``other`` collapses the same tokens' same lone features
        (built from the same training design): then a posterior fitted on
        one is a posterior on the other."""
        if not isinstance(other, CollapsedFeatures):
            return NotImplemented
        if self is other:
            return True
        mine, theirs = self.token_values, other.token_values
        columns = (self._original().columns, other._original().columns)
        return (
            self.n_original == other.n_original
            and (columns[0] is None) == (columns[1] is None)
            and (columns[0] is None or np.array_equal(*columns))
            and np.array_equal(self.kept, other.kept)
            and np.array_equal(self.lone, other.lone)
            and np.array_equal(self.tokens, other.tokens)
            and np.array_equal(mine.indptr, theirs.indptr)
            and np.array_equal(mine.indices, theirs.indices)
            and np.array_equal(mine.data, theirs.data)
        )

    __hash__ = None  # mutable arrays: equal objects need not stay equal

    def _original(self):
        """:attr:`original` (models pickled before it existed: every column)."""
        original = self.__dict__.get("original")
        return InducingFeatures(self.n_original) if original is None else original

    @property
    def n_collapsed(self):
        """Number of collapsed variables (training tokens with lone features)."""
        return self.tokens.size

    def transform(self, X):
        """The training design in the collapsed space, CSR (n_tokens, n_inducing - 1).

        The kept features' columns, then one column per collapsed variable,
        1 at its token. ``X`` must be the design :meth:`of` was built from.
        """
        n_tokens = X.shape[0]
        indicator = sp.csr_matrix(
            (np.ones(self.n_collapsed), (self.tokens, np.arange(self.n_collapsed))),
            shape=(n_tokens, self.n_collapsed),
        )
        return sp.hstack(
            [sp.csr_matrix(X[:, self.kept], dtype=np.float64), indicator],
            format="csr",
        )

    def prepare(self, kernel):
        """Feature scales in the collapsed space: the kept features', then
        every collapsed variable's ``sigma_t``, then the bias's."""
        self._check_kernel(kernel)
        scales = self._original().prepare(kernel)
        return np.concatenate([scales[self.kept], self._spread(scales), scales[-1:]])

    def _spread(self, scales):
        """``sigma_t`` of every collapsed variable, from the original scales."""
        return np.sqrt(self._squares @ scales[self.lone] ** 2)

    def finish_gradient(self, kernel, scales, d_scales):
        """Gradient in theta from the gradient w.r.t. the collapsed scales."""
        original = self._original().prepare(kernel)
        n_kept, n_collapsed = self.kept.size, self.n_collapsed
        d_original = np.zeros_like(original)
        d_original[self.kept] = d_scales[:n_kept]
        d_original[-1] = d_scales[-1]
        # sigma_t = sqrt(sum_j x_tj^2 c_j^2), so
        # d sigma_t / d c_j = x_tj^2 c_j / sigma_t
        spread = scales[n_kept : n_kept + n_collapsed]
        per_spread = d_scales[n_kept : n_kept + n_collapsed] / spread
        d_original[self.lone] = (self._squares_t @ per_spread) * original[self.lone]
        return self._original().finish_gradient(kernel, original, d_original)

    def sampling_posterior(self, scales, kernel, expanded, collapsed):
        """The posterior on which sampling is exact for this collapsed
        posterior (design.rst, "Lone features collapsed"), with
        :meth:`sampling_design`'s design of the tokens.

        A token's lone features of training token ``t`` reach the
        potentials through ``sum_j v_j u_j`` (``v_j = x_j c_j``), and under
        ``q(g_t) p(u | g)`` ``u_j = a_j w_t + e_j``, ``w_t`` the collapsed
        (white) variable and ``e = (I - a a^T) z``, ``z`` white prior
        weights. So every collapsed variable gets the column ``(a . v) /
        sigma_t`` (scale ``sigma_t``, its posterior) and every lone feature
        the value ``x_j - (a . v) a_j / c_j`` (its own scale, the prior).
        Each token's row depends on its own features only. This half
        depends on the model alone: computed once per prediction, it serves
        every chunk's :meth:`sampling_design`.

        Parameters
        ----------
        scales : ndarray of shape (n_original + 1,)
            The original features' scales, then the bias'.
        kernel : Kernel
            The kernel the posterior was fitted with.
        expanded : (q_mu, q_sqrt) of shape (K, V, n_original + 1)
            Every original feature's marginal (:meth:`expand`).
        collapsed : (q_mu, q_sqrt) of shape (K, V, n_inducing)
            The collapsed posterior.

        Returns
        -------
        SamplingPosterior
        """
        n, lone = self.n_original, self.lone
        n_kept, n_collapsed = self.kept.size, self.n_collapsed
        sigma = self._spread(scales[:-1])
        loadings = sp.csr_matrix(
            (self._loadings(kernel), self.token_values.indices,
             self.token_values.indptr),
            shape=self.token_values.shape,
        )  # (n_collapsed, n_lone): a_j in the row of its training token
        lone_variable = np.empty(lone.size, dtype=np.int64)
        lone_variable[self.token_values.indices] = self._entry_variable
        lone_loading = np.empty(lone.size)
        lone_loading[self.token_values.indices] = loadings.data
        lone_prior = np.zeros(n + 1, dtype=bool)
        lone_prior[lone] = True
        columns = np.s_[..., n_kept : n_kept + n_collapsed]
        out = []
        for marginal, fitted, prior in zip(expanded, collapsed, (0.0, 1.0),
                                           strict=True):
            out.append(np.concatenate(
                [np.where(lone_prior, prior, marginal)[..., :n], fitted[columns],
                 marginal[..., n:]], axis=-1,
            ))
        return SamplingPosterior(
            loadings=loadings,
            lone_variable=lone_variable,
            lone_loading=lone_loading,
            lone_positions=(
                None if 4 * n > COLUMN_LOOKUP_BYTES else column_positions(lone, n)
            ),
            lone_scales=scales[lone],
            inverse_lone_scales=1.0 / scales[lone],
            inverse_sigma=1.0 / sigma,
            scales=np.concatenate([scales[:n], sigma, scales[n:]]),
            q_mu=out[0],
            q_sqrt=out[1],
        )

    def sampling_design(self, X, posterior):
        """The tokens' design for :meth:`sampling_posterior`'s posterior.

        Parameters
        ----------
        X : sparse matrix or ndarray of shape (n_tokens, n_original)
        posterior : SamplingPosterior

        Returns
        -------
        X_s : CSR matrix of shape (n_tokens, n_original + n_collapsed)
            Canonical, without stored zeros. The original columns, the lone
            ones shifted, then one column per collapsed variable.

        Notes
        -----
        Compiled (:func:`skgpstruct._layout.collapsed_design`), one pass
        over the tokens: the same matrix as the sparse algebra
        ``[X - ((X_v @ A.T) @ A) / c, (X_v @ A.T) / sigma]`` (``X_v`` the
        lone columns times their scales, ``A`` the loadings), summed in the
        same order (in scipy, those products took about 0.8 ms of a
        one-sentence ``predict_marginals`` on basenp; written as NumPy
        array operations on the CSR arrays, about a quarter of that call's
        own work). Every lone feature has one
        loading, in the row of its variable: a token's ``a . v`` per
        variable is a sum over its own lone entries, and its shifts are the
        variables' other lone features.
        """
        X = canonical_csr(X)
        n_tokens, n = X.shape
        lookup = posterior.lone_positions
        loadings = posterior.loadings
        indptr, indices, data = collapsed_design(
            X.indptr, X.indices, X.data, n,
            _NO_LOOKUP if lookup is None else lookup, lookup is not None,
            self.lone, posterior.lone_variable, posterior.lone_scales,
            posterior.lone_loading, posterior.inverse_lone_scales,
            loadings.indptr, loadings.indices, loadings.data,
            posterior.inverse_sigma,
        )
        X_s = sp.csr_matrix(
            (data, indices, indptr), shape=(n_tokens, n + self.n_collapsed)
        )
        X_s.has_canonical_format = True
        return X_s

    def _loadings(self, kernel):
        """``a_j = x_tj c_j / sigma_t`` of every lone entry (entry order)."""
        scales = self._original().prepare(kernel)
        return (
            self.token_values.data * scales[self._entry_feature]
            / self._spread(scales)[self._entry_variable]
        )

    def expand(self, q_mu, q_sqrt, kernel):
        """Every original feature's marginal posterior, ``(q_mu, q_sqrt)``.

        Parameters
        ----------
        q_mu, q_sqrt : ndarray of shape (K, V, n_inducing)
            The collapsed posterior (diagonal).
        kernel : Kernel
            The kernel the posterior was fitted with.

        Returns
        -------
        q_mu, q_sqrt : ndarray of shape (K, V, n_original + 1)
            Kept features and the bias copied, lone features from their
            collapsed variable, features active at no training token at
            the prior (mean 0, standard deviation 1).
        """
        K, V, _ = q_mu.shape
        n_kept = self.kept.size
        out_mu = np.zeros((K, V, self.n_original + 1))
        out_sqrt = np.ones((K, V, self.n_original + 1))
        for out, source in ((out_mu, q_mu), (out_sqrt, q_sqrt)):
            out[..., self.kept] = source[..., :n_kept]
            out[..., -1] = source[..., -1]
        a = self._loadings(kernel)
        variable = n_kept + self._entry_variable
        out_mu[..., self._entry_feature] = a * q_mu[..., variable]
        # 1 - a^2 (1 - s^2), with 1 - a^2 >= 0 kept so despite rounding
        a_sq = a * a
        out_sqrt[..., self._entry_feature] = np.sqrt(
            np.maximum(1.0 - a_sq, 0.0) + a_sq * q_sqrt[..., variable] ** 2
        )
        return out_mu, out_sqrt

    def collapse(self, q_mu, q_sqrt, kernel):
        """The collapsed posterior with the same marginal of every ``g``.

        ``q_mu``, ``q_sqrt`` (K, V, n_original + 1) are a diagonal posterior
        over the original features; the collapsed variable of a token gets
        mean ``sum_j a_j mu_j`` and variance ``sum_j a_j^2 s_j^2``.
        """
        K, V, _ = q_mu.shape
        n_kept, n_collapsed = self.kept.size, self.n_collapsed
        out_mu = np.empty((K, V, self.n_inducing))
        out_sqrt = np.empty((K, V, self.n_inducing))
        a = self._loadings(kernel)
        entries = (self._entry_variable, self._entry_feature)
        shape = (n_collapsed, self.n_original + 1)
        # mean: sum_j a_j mu_j; variance: sum_j a_j^2 s_j^2
        for out, source, power in ((out_mu, q_mu, 1), (out_sqrt, q_sqrt, 2)):
            out[..., :n_kept] = source[..., self.kept]
            out[..., -1] = source[..., -1]
            loadings = sp.csr_matrix((a**power, entries), shape=shape)
            flat = source.reshape(K * V, -1) ** power
            out[..., n_kept:-1] = (loadings @ flat.T).T.reshape(K, V, n_collapsed)
        out_sqrt[..., n_kept:-1] = np.sqrt(out_sqrt[..., n_kept:-1])
        return out_mu, out_sqrt
