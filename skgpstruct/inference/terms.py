"""Per-chunk expected log-likelihood and its gradients (paper eq. 10-12, 18-20).

A chunk is a run of consecutive sequences. The inducing variables (see
:mod:`~skgpstruct.inference.inducing`) give, for every sequence n, a small
dense ``B_n`` over the inducing variables ``rows_n`` its tokens depend on and
a residual variance per token, so that for label j and mixture component k
the unary potentials have the T_n-dimensional Gaussian marginal (eq. 18-19,
whitened)::

    b = B_n^T m_kj[rows_n],    Sigma = B_n^T S_kj[rows_n, rows_n] B_n + diag(r_n).

The residual of the conditional p(f | u) is kept on the diagonal (its
off-diagonal part inside a sequence is dropped; it is exactly zero for
inducing features, and for inducing points on the training tokens of a
linear kernel).

Two estimators of the gradient (``estimator``):

``"pathwise"``
    ``f = B_n^T (m_kj + R_kj eps)[rows_n] + sqrt(r_n) xi`` with an
    independent inducing draw per sequence, sample, component and label; the
    gradient is the exact derivative of this fixed-sample objective, using
    ``d log p / d f`` from the likelihood.
``"score"``
    the paper's black-box estimator: samples ``f = b + chol(Sigma) eta`` of
    the T_n-dimensional marginal, and the score of that Gaussian with respect
    to (b, Sigma) times ``log p(y | f) - a``, ``a`` a baseline (a control
    variate). Needs only ``log p``. The estimator's fits evaluate it with a
    reference posterior (``SharedState.reference``, the round's start in
    :func:`~skgpstruct.optim.minimize_lbfgs_rounds`): importance-weighted,
    each sample's baseline the mean of the others' ``log p`` (leave-one-out,
    unbiased; see :func:`_score`). Without one (direct callers and the
    tests) it is the plain estimator, with the paper's control-variate
    coefficient ``a`` (section 5.1) estimated per sequence on a second,
    independent set of samples so that the estimate stays unbiased.

Both return the chunk's ELL estimate and the gradients with respect to
``q_mu``, ``q_sqrt``, the mixture weights, the pairwise posterior, the
inducing state and the kernel hyperparameters. Everything is a pure
function, so a chunk can run in any joblib worker.
"""

from dataclasses import dataclass, field, replace

import numpy as np

from .._simd import kernels
from ..likelihoods.base import LikelihoodOutputError

stacked_kernels = kernels("_stacked")

# Largest size of the base samples a chunk keeps between evaluations.
NOISE_CACHE_BYTES = 64 * 2**20

#: Relative jitter on the diagonal of a sequence's Gaussian q(f_n) (times
#: the mean of its variances), always added: see :func:`_sequence_marginal`.
SEQUENCE_JITTER = 1e-8

__all__ = [
    "Chunk",
    "SharedState",
    "ReferencePosterior",
    "chunk_terms",
    "expand_local",
    "antithetic_normal",
    "sample_unary",
    "sample_unary_stacked",
]


@dataclass
class Chunk:
    """Data of a run of consecutive sequences, sent to a worker once per fit.

    Attributes
    ----------
    X : ndarray or CSR matrix of shape (n_tokens, n_features)
    offsets : ndarray of int64 of shape (n_sequences + 1,)
    labels : ndarray of int64 of shape (n_tokens,)
    seed : numpy.random.SeedSequence
        Seed of the chunk's Monte Carlo base samples.
    layout : object
        What the inducing variables precompute once per fit for this chunk
        (``inducing.chunk_layout(X, offsets)``); None if nothing.
    sequence_ids : ndarray of int or None
        The number of every sequence in the training set, used to name it
        when the likelihood returns a value that is not finite.
    """

    X: object
    offsets: np.ndarray
    labels: np.ndarray
    seed: np.random.SeedSequence
    layout: object = None
    # Batch-mode base samples, kept between evaluations in this process only.
    noise_cache: dict = field(default_factory=dict, repr=False)
    # The training-set number of every sequence (for error messages).
    sequence_ids: np.ndarray = None

    def __getstate__(self):
        state = self.__dict__.copy()
        state["noise_cache"] = {}  # never shipped to workers
        return state

    @property
    def n_sequences(self):
        return len(self.offsets) - 1

    @property
    def n_tokens(self):
        return int(self.offsets[-1])

    @property
    def nbytes(self):
        """Memory of the chunk's arrays, its layout and its base samples.

        An array held in several places is counted once. The layout's per-sequence
        ``rows``, views of parts of its ``stacked_rows``, are counted again:
        a slight over-estimate, which is safe for what it serves (the loky
        leak allowance).
        """
        return _nbytes(
            (self.X, self.offsets, self.labels, self.layout, self.noise_cache), set()
        )


def _nbytes(obj, seen):
    """Bytes of the arrays and sparse matrices in nested containers, each
    memory block counted once (``seen`` holds the address and size of those
    counted: an array and a view of all of it are one block; views of parts
    of an array are counted again, an over-estimate)."""
    if obj is None:
        return 0
    if hasattr(obj, "data") and hasattr(obj, "indices"):  # sparse matrix
        return sum(_nbytes(a, seen) for a in (obj.data, obj.indices, obj.indptr))
    if isinstance(obj, np.ndarray):
        block = (obj.__array_interface__["data"][0], obj.nbytes)
        if block in seen:
            return 0
        seen.add(block)
        return obj.nbytes
    if isinstance(obj, dict | list):
        # A snapshot first (taken at once under the GIL): another thread may
        # add base samples to a chunk's cache while this one counts them.
        values = tuple(obj.values() if isinstance(obj, dict) else obj)
        return sum(_nbytes(v, seen) for v in values)
    if isinstance(obj, tuple):
        return sum(_nbytes(v, seen) for v in obj)
    if hasattr(obj, "__dataclass_fields__"):
        return sum(
            _nbytes(getattr(obj, name), seen) for name in obj.__dataclass_fields__
        )
    return 0


@dataclass
class SharedState:
    """What every chunk needs from the parent at one evaluation."""

    inducing: object  # InducingPoints or InducingFeatures
    inducing_state: object  # from inducing.prepare(kernel)
    kernel: object
    params: object  # VariationalParameters
    pairwise_noise: np.ndarray  # (S, V, V) base samples of q(f_bin)
    likelihood: object
    n_samples: int
    estimator: str
    need_kernel_gradient: bool
    residual_floor: float
    iteration_key: int = 0  # 0 in batch mode (fixed base samples)
    control_variate: bool = True  # score estimator only
    reference: object = None  # score estimator: ReferencePosterior or None
    sample_dtype: type = np.float32  # of the stacked form's samples


@dataclass
class ReferencePosterior:
    """The posterior the score estimator's samples are drawn from."""

    params: object  # VariationalParameters
    kernel: object
    inducing_state: object


def _chunk_rng(chunk, iteration_key, *stream):
    """The generator of a chunk's Monte Carlo base samples at one iteration
    (``stream``: another, independent one of the same iteration)."""
    return np.random.default_rng(
        np.random.SeedSequence(
            entropy=chunk.seed.entropy,
            spawn_key=(*chunk.seed.spawn_key, iteration_key, *stream),
        )
    )


def _fresh_pairwise_noise(chunk, shared):
    """Base samples of the transitions for one chunk at one stochastic step.

    The batch objective shares one fixed set of draws among all chunks; a
    stochastic step draws the chunk's own, from a stream of the iteration
    key apart from the unaries' (whose draws :func:`expand_local` repeats),
    so that SAGA averages over the transitions' posterior instead of
    fitting them to ``S`` fixed draws.
    """
    rng = _chunk_rng(chunk, shared.iteration_key, 1)
    return rng.standard_normal(shared.pairwise_noise.shape)


def chunk_terms(chunk, shared, local=False):
    """ELL of one chunk and its gradients; see the module docstring.

    Parameters
    ----------
    chunk : Chunk
    shared : SharedState
    local : bool, default=False
        Pathwise estimator only. Also return the chunk's gradient in its own
        token space: ``local``, the derivative of the (weighted) log
        likelihood with respect to every sampled unary potential, shape
        (K, S, n_tokens, V). :func:`expand_local` maps it to ``q_mu`` and
        ``q_sqrt`` again (drawing the inducing noise anew from the iteration
        key, or taking it from ``noise``), so that a stored gradient takes
        memory in proportion to the chunk's tokens, not to the number of
        inducing variables. In the stacked form (inducing features,
        diagonal covariances) ``noise`` is also returned: the base samples
        ``(eps, xi)`` of :func:`_stacked_noise`, which ``expand_local`` can
        reuse instead of drawing them again.

    Returns
    -------
    result : dict
        ``ell`` (float), ``q_mu`` (K, V, M), ``q_sqrt`` (shape of q_sqrt),
        ``weights`` (K,), ``pairwise_mean`` (V, V), ``pairwise_std`` (V, V),
        ``inducing_state`` (gradient w.r.t. the inducing state, or None),
        ``theta`` (n_theta,) or None, and ``local`` (and in the stacked form
        ``noise``) when asked for.
    """
    try:
        return _chunk_terms(chunk, shared, local)
    except LikelihoodOutputError as exc:
        if chunk.sequence_ids is None or exc.sequence is None:
            raise
        # The likelihood saw the mixture components' samples one after the
        # other: sample k * S + s is sample s of component k.
        K, S = shared.params.q_mu.shape[0], shared.n_samples
        sample = getattr(exc, "sample", None)
        if sample is not None:
            sample = None if K == 1 else f"{sample % S} of component {sample // S}"
        raise exc.renumbered(int(chunk.sequence_ids[exc.sequence]), sample) from None


def _chunk_terms(chunk, shared, local):
    """:func:`chunk_terms` with the sequences numbered within the chunk."""
    if local and shared.estimator != "pathwise":
        raise ValueError("local gradients need the pathwise estimator")
    if shared.iteration_key > 0 and shared.estimator == "pathwise":
        shared = replace(shared, pairwise_noise=_fresh_pairwise_noise(chunk, shared))
    stacked = _stacked(shared, chunk)
    if stacked is not None and shared.estimator == "pathwise":
        cache = chunk.noise_cache if shared.iteration_key == 0 else None
        out, d_scales = _pathwise_stacked(chunk, shared, stacked, cache, local)
        if shared.need_kernel_gradient:
            out["inducing_state"], out["theta"] = shared.inducing.stacked_backward(
                shared.kernel, stacked, d_scales
            )
        else:
            out["inducing_state"], out["theta"] = None, None
        return out

    projection = shared.inducing.project(
        shared.kernel, shared.inducing_state, chunk.X, chunk.offsets, chunk.layout
    )
    residual_sd = np.sqrt(projection.residual + shared.residual_floor)
    rng = _chunk_rng(chunk, shared.iteration_key)
    if shared.estimator == "pathwise":
        cache = chunk.noise_cache if shared.iteration_key == 0 else None
        out, d_B, d_residual_sd = _pathwise(
            chunk, shared, projection, residual_sd, rng, cache, local=local
        )
    elif shared.estimator == "score":
        out, d_B, d_residual_sd = _score(chunk, shared, projection, residual_sd, rng)
    else:  # validated by the estimator; kept as a guard for direct callers
        raise ValueError(f"unknown estimator {shared.estimator!r}")

    if shared.need_kernel_gradient:
        # residual_sd = sqrt(max(residual, 0) + floor)
        d_residual = np.where(
            projection.residual > 0, d_residual_sd / (2.0 * residual_sd), 0.0
        )
        out["inducing_state"], out["theta"] = shared.inducing.backward(
            shared.kernel, shared.inducing_state, chunk.X, projection, d_B, d_residual
        )
    else:
        out["inducing_state"], out["theta"] = None, None
    return out


def _rows(array, rows):
    """``array[..., rows, :]``-style selection on the inducing axis (axis 2)."""
    return array if rows is None else array[:, :, rows]


def _stacked(shared, chunk):
    """The chunk's stacked projection, when its inducing variables have one.

    Only with diagonal covariances: the stacked path draws every row on its
    own.
    """
    if shared.params.full_covariance:
        return None
    return shared.inducing.stacked_projection(shared.inducing_state, chunk.layout)


def _row_counts(params, rows):
    """Inducing rows drawn for every sequence (all M with full covariances)."""
    M = params.q_mu.shape[2]
    full = params.full_covariance
    return [M if (full or r is None) else r.size for r in rows]


def antithetic_normal(rng, shape, axis, dtype=np.float64):
    """Standard normal draws in antithetic pairs along one axis.

    Positions ``2i`` and ``2i + 1`` along ``axis`` hold a draw and its
    negation (an odd length ends with one unpaired draw), so half the
    random numbers are drawn. Averages over that axis of a function of the
    draws stay unbiased, and the odd part of the function (its linear term,
    above all) cancels within every pair.

    Parameters
    ----------
    rng : numpy.random.Generator
    shape : tuple of int
    axis : int
        The axis of the pairs (the samples' axis), negative counting from
        the end.
    dtype : {numpy.float64, numpy.float32}, default=numpy.float64

    Returns
    -------
    ndarray of shape ``shape``
    """
    shape = tuple(shape)
    if not -len(shape) <= axis < len(shape):
        raise ValueError(
            f"axis must be in [-{len(shape)}, {len(shape)}) for shape "
            f"{shape}, got {axis}"
        )
    axis = axis % len(shape)
    n = shape[axis]
    drawn = rng.standard_normal(
        shape[:axis] + ((n + 1) // 2,) + shape[axis + 1 :], dtype=dtype
    )
    out = np.empty(shape, dtype=dtype)
    before = (slice(None),) * axis
    out[before + (slice(0, None, 2),)] = drawn
    np.negative(
        drawn[before + (slice(0, n // 2),)],
        out=out[before + (slice(1, None, 2),)],
    )
    return out


def _inducing_noise(params, sizes, S, rng, noise=None, antithetic=False):
    """Standard normal noise of the inducing draws of every sequence.

    ``sizes`` are the rows drawn per sequence (:func:`_row_counts`). Returns
    the list of per-sequence ``eps``, of shape (K, V, size, S), and the flat
    array they are views of. All the noise of a chunk is drawn in one call,
    so that the same generator state gives the same noise; with
    ``antithetic`` the samples come in pairs (:func:`antithetic_normal`).
    """
    K, V, _ = params.q_mu.shape
    if noise is None:
        noise = _normal(rng, (K * V * sum(sizes), S), 1, antithetic).ravel()
    pieces, start = [], 0
    for size in sizes:
        pieces.append(noise[start : start + K * V * size * S].reshape(K, V, size, S))
        start += K * V * size * S
    return pieces, noise


def _draw_inducing(params, rows, S, rng, noise=None, antithetic=False):
    """Inducing draws v[rows] of every sequence: list of (v, eps), and the noise.

    ``v`` has shape (K, V, n_rows, S); ``eps`` and ``antithetic`` are
    described in :func:`_inducing_noise`.
    """
    full = params.full_covariance
    pieces, noise = _inducing_noise(
        params, _row_counts(params, rows), S, rng, noise, antithetic
    )
    draws = []
    for r, eps in zip(rows, pieces, strict=True):
        mean = _rows(params.q_mu, r)[..., None]
        if full:
            v = mean + _rows(params.q_sqrt, r) @ eps
        else:
            v = mean + _rows(params.q_sqrt, r)[..., None] * eps
        draws.append((v, eps))
    return draws, noise


def sample_unary(
    params, projection, residual_sd, S, rng, cache=None, antithetic=False
):
    """Pathwise samples of the unary potentials of a chunk.

    Parameters
    ----------
    params : VariationalParameters
    projection : Projection
    residual_sd : ndarray of shape (n_tokens,)
    S : int
        Samples per mixture component.
    rng : numpy.random.Generator
    cache : dict or None
        If given, the standard normal draws are taken from it when present
        and stored in it otherwise (when they take at most
        ``NOISE_CACHE_BYTES``), so that fixed base samples are drawn once.
    antithetic : bool, default=False
        Draw the samples in antithetic pairs (:func:`antithetic_normal`):
        samples ``2i`` and ``2i + 1`` are reflections of each other about
        the posterior mean. Not with ``cache``.

    Returns
    -------
    unary : ndarray of shape (K, S, n_tokens, V)
    draws : list of (v, eps) per sequence, for the backward pass.
    xi : ndarray of shape (K, S, n_tokens, V)
        The standard normal noise multiplied by ``residual_sd``.
    """
    K, V, _ = params.q_mu.shape
    T = residual_sd.shape[0]
    if antithetic and cache is not None:
        raise ValueError("antithetic samples are not cached; pass cache=None")
    unary = np.empty((K, S, T, V))
    key = (K, V, S, params.full_covariance)
    if cache is not None and key in cache:
        noise, xi = cache[key]
    else:
        noise, xi = None, None
    draws, noise = _draw_inducing(
        params, projection.rows, S, rng, noise, antithetic
    )
    t0 = 0
    for B_n, (v, _) in zip(projection.B, draws, strict=True):
        t1 = t0 + B_n.shape[1]
        if t1 > t0:
            n_rows = B_n.shape[0]
            v_mat = v.transpose(2, 0, 3, 1).reshape(n_rows, K * S * V)
            f_n = (B_n.T @ v_mat).reshape(t1 - t0, K, S, V)
            unary[:, :, t0:t1, :] = f_n.transpose(1, 2, 0, 3)
        t0 = t1
    if xi is None:
        xi = _normal(rng, (K, S, T, V), 1, antithetic)
        if cache is not None:
            if noise.nbytes + xi.nbytes <= NOISE_CACHE_BYTES:
                cache[key] = (noise, xi)
    unary += residual_sd[None, None, :, None] * xi
    return unary, draws, xi


def sample_unary_stacked(
    params, stacked, row_starts, offsets, S, rngs, dtype=np.float32,
    antithetic=False,
):
    """Samples of a chunk's unary potentials in the stacked form, each
    sequence's from its own generator.

    The distribution of :func:`sample_unary`'s samples (every sequence its
    own draw of its inducing variables, the lone rows of a token summed into
    one draw: see :class:`~skgpstruct.inference.inducing.StackedProjection`)
    from fewer random numbers and in one compiled pass over the chunk.

    Parameters
    ----------
    params : VariationalParameters
        With diagonal covariances.
    stacked : StackedProjection
        The chunk's stacked projection (exact: no residual variance).
    row_starts : ndarray of int64 of shape (n_sequences + 1,)
        Sequence ``n`` owns the stacked rows ``row_starts[n]:row_starts[n + 1]``
        (:class:`~skgpstruct.inference.inducing.FeatureLayout`).
    offsets : ndarray of int64 of shape (n_sequences + 1,)
    S : int
        Samples per mixture component.
    rngs : sequence of numpy.random.Generator
        One per sequence: its drawn rows' noise, then its tokens' noise, come
        from it alone, so that a sequence's samples do not depend on the
        other sequences of the chunk.
    dtype : {numpy.float32, numpy.float64}, default=numpy.float32
        Precision of the noise and of the sums (single precision: one Monte
        Carlo draw's sampling error dwarfs its rounding, as in the fit).
    antithetic : bool, default=False
        Draw the samples in antithetic pairs, as in :func:`sample_unary`.

    Returns
    -------
    unary : ndarray of shape (K, S, n_tokens, V)
    """
    K, V, _ = params.q_mu.shape
    split = stacked.split
    # The drawn rows are stacked rows in increasing order: each sequence's
    # are a contiguous run of them.
    drawn_starts = np.searchsorted(split.drawn, row_starts)
    eps = np.empty((split.drawn.size, K * V, S), dtype=dtype)
    xi = np.empty((K, S, split.n_tokens, V), dtype=dtype)
    for n, rng in enumerate(rngs):
        d0, d1 = drawn_starts[n], drawn_starts[n + 1]
        t0, t1 = offsets[n], offsets[n + 1]
        eps[d0:d1] = _normal(rng, (d1 - d0, K * V, S), 2, antithetic, dtype)
        xi[:, :, t0:t1] = _normal(rng, (K, S, t1 - t0, V), 1, antithetic, dtype)
    state = _stacked_state(params, stacked, 0.0, dtype)
    return _stacked_unary(state, eps, xi)


def _normal(rng, shape, axis, antithetic, dtype=np.float64):
    """Standard normal draws of ``shape``: in antithetic pairs along
    ``axis`` (:func:`antithetic_normal`), or independent (``axis`` unused),
    the generator's stream as ``rng.standard_normal(shape)`` draws it."""
    if antithetic:
        return antithetic_normal(rng, shape, axis, dtype)
    return rng.standard_normal(shape, dtype=dtype)


def _tile_pairwise(params, noise, K):
    """Pairwise samples (K * S, V, V): the same S draws for every component."""
    samples = params.pairwise_mean[None] + params.pairwise_std[None] * noise
    return np.tile(samples, (K, 1, 1))


def _zero_grads(params):
    return np.zeros_like(params.q_mu), np.zeros_like(params.q_sqrt)


def _accumulate_inducing_gradient(grad_mu, grad_sqrt, rows, d_v, eps, full):
    """Add one sequence's share of the q_mu and q_sqrt gradients.

    ``d_v`` (K, V, n_rows, S) is the gradient with respect to the inducing
    draws ``v = q_mu + q_sqrt eps`` restricted to ``rows``.
    """
    if full:
        d_sqrt = d_v @ np.swapaxes(eps, -1, -2)
    else:
        d_sqrt = np.einsum("kvms,kvms->kvm", d_v, eps)
    if rows is None:
        grad_mu += d_v.sum(axis=-1)
        grad_sqrt += d_sqrt
    else:
        grad_mu[:, :, rows] += d_v.sum(axis=-1)
        if full:
            grad_sqrt[:, :, rows, :] += d_sqrt
        else:
            grad_sqrt[:, :, rows] += d_sqrt


def _sequence_d_v(B_n, g_unary, t0, t1):
    """Gradient w.r.t. the inducing draws from the token gradient of one sequence.

    Returns ``d_v`` (K, V, n_rows, S) and ``g_n``, the token gradient as a
    (T_n, K * V * S) matrix with columns ordered (k, j, s).
    """
    K, S, _, V = g_unary.shape
    n_rows = B_n.shape[0]
    g_n = g_unary[:, :, t0:t1, :].transpose(2, 0, 3, 1).reshape(t1 - t0, -1)
    d_v = (B_n @ g_n).reshape(n_rows, K, V, S).transpose(1, 2, 0, 3)
    return d_v, g_n


def expand_local(chunk, shared, local, iteration_key, noise=None):
    """The q_mu and q_sqrt gradients of a local gradient (see :func:`chunk_terms`).

    Parameters
    ----------
    chunk : Chunk
    shared : SharedState
        The current kernel and inducing state give the projection ``B``;
        ``shared.params`` its shapes and, in the stacked form, the current
        standard deviation of each token's lone rows (the derivative of the
        sampled potential with respect to ``q_sqrt`` depends on it there).
    local : ndarray of shape (K, S, n_tokens, V)
        The token-space gradient returned by ``chunk_terms(..., local=True)``.
    iteration_key : int
        The key it was computed with: the inducing noise is drawn again from
        the chunk's generator at that key (unless ``noise`` is given).
    noise : tuple of ndarray or None, default=None
        Stacked form only: the base samples ``chunk_terms(..., local=True)``
        returned with ``local`` (the same as drawing them again, without
        the cost).

    Returns
    -------
    q_mu : ndarray of shape (K, V, M)
    q_sqrt : ndarray of the shape of ``shared.params.q_sqrt``

    Raises
    ------
    ValueError
        If ``local`` or ``noise`` does not have the shapes of this chunk's
        (a gradient of another chunk).
    """
    params = shared.params
    K, V, _ = params.q_mu.shape
    S = local.shape[1] if local.ndim == 4 else -1
    if local.shape != (K, S, chunk.n_tokens, V):
        raise ValueError(
            f"local must have shape (K, S, n_tokens, V) = ({K}, S, "
            f"{chunk.n_tokens}, {V}) for this chunk, got {local.shape}"
        )
    stacked = _stacked(shared, chunk)
    if stacked is not None:
        T = chunk.n_tokens
        if noise is None:
            eps, xi = _stacked_noise(
                params, stacked, S, _chunk_rng(chunk, iteration_key), T,
                shared.sample_dtype,
            )
        else:
            eps, xi = noise
            n_drawn = stacked.split.drawn.size
            if eps.shape != (n_drawn, K * V, S) or xi.shape != local.shape:
                raise ValueError(
                    f"noise must be (eps, xi) of shapes ({n_drawn}, {K * V}, "
                    f"{S}) and {local.shape} for this chunk, got "
                    f"{eps.shape} and {xi.shape}"
                )
        state = _stacked_state(
            params, stacked, shared.residual_floor, shared.sample_dtype
        )
        grad_mu, grad_sqrt, _ = _stacked_inducing_gradient(
            state, *_stacked_backward(state, local, eps, xi), params
        )
        return grad_mu, grad_sqrt
    projection = shared.inducing.project(
        shared.kernel, shared.inducing_state, chunk.X, chunk.offsets, chunk.layout
    )
    S = local.shape[1]
    noise, _ = _inducing_noise(
        params, _row_counts(params, projection.rows), S,
        _chunk_rng(chunk, iteration_key),
    )
    grad_mu, grad_sqrt = _zero_grads(params)
    offsets = chunk.offsets
    for n, (rows, B_n, eps) in enumerate(
        zip(projection.rows, projection.B, noise, strict=True)
    ):
        t0, t1 = offsets[n], offsets[n + 1]
        if t1 == t0:
            continue
        d_v, _ = _sequence_d_v(B_n, local, t0, t1)
        _accumulate_inducing_gradient(
            grad_mu, grad_sqrt, rows, d_v, eps, params.full_covariance
        )
    if params.full_covariance:
        grad_sqrt = np.tril(grad_sqrt)
    return grad_mu, grad_sqrt


def _pathwise(chunk, shared, projection, residual_sd, rng, cache=None, local=False):
    params = shared.params
    K, V, M = params.q_mu.shape
    S = shared.n_samples
    offsets, n_seq, T = chunk.offsets, chunk.n_sequences, chunk.n_tokens
    full = params.full_covariance

    unary, draws, xi = sample_unary(params, projection, residual_sd, S, rng, cache)
    pairwise = _tile_pairwise(params, shared.pairwise_noise, K)
    log_p, g_unary, g_pair = shared.likelihood.log_prob_and_gradient(
        unary.reshape(K * S, T, V), pairwise, offsets, chunk.labels
    )
    log_p = log_p.reshape(K, S, n_seq)
    w = params.weights
    g_unary = g_unary.reshape(K, S, T, V) * (w / S)[:, None, None, None]

    grad_mu, grad_sqrt = _zero_grads(params)
    d_B = []
    for n, (rows, B_n, (v, eps)) in enumerate(
        zip(projection.rows, projection.B, draws, strict=True)
    ):
        t0, t1 = offsets[n], offsets[n + 1]
        if t1 == t0:
            d_B.append(np.zeros_like(B_n))
            continue
        # columns ordered (k, j, s) in both g_n and v_mat
        d_v, g_n = _sequence_d_v(B_n, g_unary, t0, t1)
        v_mat = v.transpose(2, 0, 1, 3).reshape(B_n.shape[0], -1)
        d_B.append(v_mat @ g_n.T)
        _accumulate_inducing_gradient(grad_mu, grad_sqrt, rows, d_v, eps, full)
    if full:
        grad_sqrt = np.tril(grad_sqrt)
    d_residual_sd = np.einsum("kstv,kstv->t", g_unary, xi)
    out = _pathwise_summary(shared, log_p, g_pair)
    out["q_mu"], out["q_sqrt"] = grad_mu, grad_sqrt
    if local:
        out["local"] = g_unary
    return out, d_B, d_residual_sd


def _pathwise_summary(shared, log_p, g_pair):
    """ELL, weight and pairwise gradients from log p (K, S, n_seq) and g_pair."""
    K, S, n_seq = log_p.shape
    V = g_pair.shape[-1]
    w = shared.params.weights
    g_pair_s = np.einsum("k,ksnij->sij", w / S, g_pair.reshape(K, S, n_seq, V, V))
    return {
        "ell": float(np.einsum("k,ksn->", w / S, log_p)),
        "weights": log_p.sum(axis=(1, 2)) / S,
        "pairwise_mean": g_pair_s.sum(axis=0),
        "pairwise_std": np.einsum("sij,sij->ij", g_pair_s, shared.pairwise_noise),
    }


def _stacked_noise(params, stacked, S, rng, n_tokens, dtype):
    """Base samples of the stacked form, of ``dtype``.

    Returns ``eps`` (n_drawn, K * V, S), the noise of the drawn rows, and
    ``xi`` (K, S, n_tokens, V), the noise of every token's lone rows and
    residual floor (see :class:`~skgpstruct.inference.inducing.StackedProjection`).
    """
    K, V, _ = params.q_mu.shape
    # Drawn in double precision and rounded: the precision changes the
    # rounding of the samples, not the draw.
    eps = rng.standard_normal((stacked.split.drawn.size, K * V, S))
    xi = rng.standard_normal((K, S, n_tokens, V))
    return eps.astype(dtype, copy=False), xi.astype(dtype, copy=False)


@dataclass
class _StackedForward:
    """What the backward pass of the stacked form needs from the forward one.

    ``mean`` and ``sd``: q_mu and q_sqrt as (n_inducing, K * V); ``c`` the
    feature scales (n_inducing,); ``token_sd`` (n_tokens, K * V) the
    standard deviation of each token's lone rows (with the residual floor);
    ``by_token``, ``by_row`` and ``lone_by_row`` the chunk's entries
    (:class:`~skgpstruct.inference.inducing.RowSplit`, ``lone_entries``). All
    in the precision of the samples, as the kernels take them; ``c64`` the
    scales in double precision, for the gradients.
    """

    mean: np.ndarray
    sd: np.ndarray
    c: np.ndarray
    token_sd: np.ndarray
    c64: np.ndarray
    by_token: tuple
    by_row: tuple
    lone_by_row: tuple


def _stacked_state(params, stacked, residual_floor, dtype):
    """The parameters as (n_inducing, K * V) and each token's lone-row spread."""
    K, V, M = params.q_mu.shape

    def by_inducing(a):
        # Beyond single precision's range a value becomes inf, and the
        # samples with it: _pathwise_stacked then rejects the point.
        with np.errstate(over="ignore"):
            return np.ascontiguousarray(a.transpose(2, 0, 1).reshape(M, K * V), dtype)

    split = stacked.split
    by_token, by_row = split.entries(dtype)
    sd = by_inducing(params.q_sqrt)
    c64 = np.ascontiguousarray(stacked.scales, dtype=np.float64)
    with np.errstate(over="ignore"):  # as in by_inducing
        c = c64.astype(dtype, copy=False)
    token_sd = np.empty((split.n_tokens, K * V), dtype=dtype)
    stacked_kernels.token_sd(
        *by_token, split.entry_drawn, c, sd, float(residual_floor), token_sd
    )
    return _StackedForward(
        by_inducing(params.q_mu), sd, c, token_sd, c64, by_token, by_row,
        split.lone_entries(dtype),
    )


def _stacked_unary(state, eps, xi):
    """Unary samples (K, S, n_tokens, V), C-ordered (``skgpstruct._stacked``)."""
    unary = np.empty(xi.shape)
    stacked_kernels.unary(
        *state.by_token, *state.by_row, state.c, state.mean, state.sd,
        state.token_sd, eps, xi, unary,
    )
    return unary


def _stacked_backward(state, g_unary, eps, xi):
    """Gradients of the stacked form from the token gradient g (K, S, T, V).

    Returns ``d_cm`` and ``d_cs``, each (n_inducing, K * V): the derivatives
    with respect to ``c * q_mu`` and ``c * q_sqrt`` (see
    ``skgpstruct._stacked.backward``).
    """
    d_cm, d_cs = np.zeros(state.mean.shape), np.zeros(state.mean.shape)
    stacked_kernels.backward(
        *state.lone_by_row, *state.by_row, state.c, state.sd,
        state.token_sd, eps, xi, np.ascontiguousarray(g_unary, dtype=np.float64),
        d_cm, d_cs,
    )
    return d_cm, d_cs


def _stacked_inducing_gradient(state, d_cm, d_cs, params):
    """q_mu and q_sqrt gradients (K, V, n_inducing), and the scales'.

    From :func:`_stacked_backward`'s ``d_cm`` and ``d_cs``: the chain rule
    through ``c * q_mu`` and ``c * q_sqrt``, with
    ``d c = m . d_cm + s . d_cs`` per inducing variable (``m`` and ``s``
    in double precision; ``skgpstruct._stacked.inducing_gradient``).
    """
    grad_mu, grad_sqrt = np.empty(params.q_mu.shape), np.empty(params.q_mu.shape)
    d_scales = np.empty(d_cm.shape[0])
    stacked_kernels.inducing_gradient(
        state.c64, np.ascontiguousarray(params.q_mu),
        np.ascontiguousarray(params.q_sqrt), d_cm, d_cs, grad_mu, grad_sqrt,
        d_scales,
    )
    return grad_mu, grad_sqrt, d_scales


def _pathwise_stacked(chunk, shared, stacked, cache=None, local=False):
    """:func:`_pathwise` with all the chunk's sequences at once (compiled loops).

    The same distribution of the unary potentials as the per-sequence loop
    (every sequence its own draw of the inducing variables), sampled with
    fewer random numbers: the lone rows of
    :class:`~skgpstruct.inference.inducing.StackedProjection` through one
    draw per token. Returns the output dict and the gradient with respect
    to ``stacked.scales``.
    """
    params = shared.params
    K, V, _ = params.q_mu.shape
    S = shared.n_samples
    offsets, T = chunk.offsets, chunk.n_tokens
    dtype = shared.sample_dtype
    key = ("stacked", K, V, S, dtype)
    if cache is not None and key in cache:
        eps, xi = cache[key]
    else:
        # The chunk's generator, made only here: with the noise cached
        # (batch fits) most evaluations need none.
        rng = _chunk_rng(chunk, shared.iteration_key)
        eps, xi = _stacked_noise(params, stacked, S, rng, T, dtype)
        if cache is not None and eps.nbytes + xi.nbytes <= NOISE_CACHE_BYTES:
            cache[key] = (eps, xi)
    state = _stacked_state(params, stacked, shared.residual_floor, dtype)
    unary = _stacked_unary(state, eps, xi)
    pairwise = _tile_pairwise(params, shared.pairwise_noise, K)
    if np.all(np.isfinite(unary)):
        log_p, g_unary, g_pair = shared.likelihood.log_prob_and_gradient(
            unary.reshape(K * S, T, V), pairwise, offsets, chunk.labels
        )
    else:
        # Single precision overflowed (beyond 3.4e38: a line search's far
        # trial, which double precision would have scored hugely negative).
        # The ELL there is -inf and the gradients NaN: a rejected trial.
        log_p = np.full((K * S, chunk.n_sequences), -np.inf)
        g_unary = np.full((K * S, T, V), np.nan)
        g_pair = np.full((K * S, chunk.n_sequences, V, V), np.nan)
    log_p = log_p.reshape(K, S, chunk.n_sequences)
    g_unary = g_unary.reshape(K, S, T, V) * (params.weights / S)[:, None, None, None]
    d_cm, d_cs = _stacked_backward(state, g_unary, eps, xi)
    grad_mu, grad_sqrt, d_scales = _stacked_inducing_gradient(
        state, d_cm, d_cs, params
    )
    out = _pathwise_summary(shared, log_p, g_pair)
    out["q_mu"], out["q_sqrt"] = grad_mu, grad_sqrt
    if local:
        out["local"], out["noise"] = g_unary, (eps, xi)
    return out, d_scales


def _sequence_marginal(params, rows, B_n, residual_sd_n):
    """Mean (K, V, T) and Cholesky factor (K, V, T, T) of q(f_n) per label."""
    mean = _rows(params.q_mu, rows) @ B_n  # (K, V, T)
    if params.full_covariance:
        W = np.swapaxes(_rows(params.q_sqrt, rows), -1, -2) @ B_n  # (K, V, M, T)
    else:
        W = _rows(params.q_sqrt, rows)[..., None] * B_n  # (K, V, rows, T)
    cov = np.swapaxes(W, -1, -2) @ W
    idx = np.arange(B_n.shape[1])
    cov[..., idx, idx] += residual_sd_n**2
    # A small relative jitter keeps the factor defined when tokens repeat
    # inside a sequence and the residual vanishes. Always added, unlike
    # _linalg.jitter_cholesky's jitter on failure: the score objective's
    # Gaussian densities must be one smooth function of the parameters
    # (a jitter switched on at some points only would make L-BFGS's line
    # searches see a jump); with it the matrix is positive definite.
    # (the mean, written out: np.mean warns on a zero-length sequence)
    mean_var = cov[..., idx, idx].sum(axis=-1)[..., None] / max(idx.size, 1)
    cov[..., idx, idx] += SEQUENCE_JITTER * (mean_var + 1e-12)
    return mean, np.linalg.cholesky(cov)


def _log_det_chol(chol):
    """log|Sigma| from its Cholesky factor, over the leading axes."""
    return 2.0 * np.sum(np.log(np.diagonal(chol, axis1=-2, axis2=-1)), axis=-1)


def _score(chunk, shared, projection, residual_sd, rng):
    """Score-function estimator, optionally importance-weighted.

    Without a reference the samples come from the current posterior and the
    gradient is the paper's estimator ``1/S sum_s h_s (log p_s - a)`` (h the
    score of q(f_n) q(f_bin), a the control-variate coefficient estimated on
    an independent baseline set of samples).

    With ``shared.reference`` the samples are drawn once from the reference
    posterior q0 and the objective is built on the self-normalised
    importance estimate ``J = sum_s w_s log p_s / sum_s w_s`` with
    ``w_s = q(f_s) q(P_s) / (q0(f_s) q0(P_s))``: deterministic and bounded,
    so that L-BFGS can maximise it. At ``q = q0`` the gradient of ``J`` is
    the score estimate with the sample mean of ``log p`` as baseline, which
    holds each sample's own value: in expectation it is ``(S - 1) / S`` of
    the expected log-likelihood's gradient, the data under-weighted against
    the exact KL. So the objective is ``lbar + S / (S - 1) (J - lbar)``,
    ``lbar`` the plain mean of the fixed ``log p_s``: its value at ``q0`` is
    the plain Monte Carlo estimate, and its gradient there the score
    estimate with each sample's baseline the mean of the others
    (leave-one-out), unbiased. The returned gradient is this objective's
    exact gradient. ``S >= 2`` (the estimator refuses fewer samples).

    The control variate's baseline set (plain estimator) has its own draws
    of the unaries and of the transitions: a coefficient estimated on the
    estimate set's transitions would be correlated with their score, and
    bias the transitions' gradient by ``(S - 1) / S`` the same way.
    """
    params = shared.params
    ref = shared.reference
    params0 = params if ref is None else ref.params
    if ref is None:
        projection0, residual_sd0 = projection, residual_sd
    else:
        projection0 = shared.inducing.project(
            ref.kernel, ref.inducing_state, chunk.X, chunk.offsets, chunk.layout
        )
        residual_sd0 = np.sqrt(projection0.residual + shared.residual_floor)
    K, V, M = params.q_mu.shape
    S = shared.n_samples
    offsets, n_seq, T = chunk.offsets, chunk.n_sequences, chunk.n_tokens
    full = params.full_covariance
    w = params.weights

    # Fixed samples from the reference marginals: the estimate set and, for
    # the plain estimator's control variate only, a baseline set (drawn
    # after the first: the estimate set is the same either way).
    use_control_variate = shared.control_variate and ref is None
    n_sets = 2 if use_control_variate else 1
    eta = rng.standard_normal((n_sets, K, V, T, S))
    samples = np.empty((n_sets, K, V, T, S))
    log_q0 = np.zeros((K, n_seq, S))  # estimate set, summed over labels
    marginals0 = []  # (mean, Cholesky factor) of q0(f_n) per sequence
    for n, (rows, B_n) in enumerate(
        zip(projection0.rows, projection0.B, strict=True)
    ):
        t0, t1 = offsets[n], offsets[n + 1]
        mean0, chol0 = _sequence_marginal(params0, rows, B_n, residual_sd0[t0:t1])
        marginals0.append((mean0, chol0))
        if t1 == t0:
            continue
        samples[:, :, :, t0:t1] = mean0[None, ..., None] + chol0[None] @ eta[
            :, :, :, t0:t1, :
        ]
        log_q0[:, n] = -np.sum(
            0.5 * np.sum(eta[0, :, :, t0:t1] ** 2, axis=2)
            + 0.5 * _log_det_chol(chol0)[..., None],
            axis=1,
        )
    pair0 = params0.pairwise_mean[None] + params0.pairwise_std[None] * (
        shared.pairwise_noise
    )
    unary = samples.transpose(0, 1, 4, 3, 2)  # (2, K, S, T, V)
    log_p = shared.likelihood.log_prob(
        np.ascontiguousarray(unary[0]).reshape(K * S, T, V),
        np.tile(pair0, (K, 1, 1)), offsets, chunk.labels,
    ).reshape(K, S, n_seq)
    if use_control_variate:
        # The baseline set: independent unaries (eta[1]) and transitions.
        pair_base = params0.pairwise_mean[None] + params0.pairwise_std[
            None
        ] * rng.standard_normal(shared.pairwise_noise.shape)
        log_p_base = shared.likelihood.log_prob(
            np.ascontiguousarray(unary[1]).reshape(K * S, T, V),
            np.tile(pair_base, (K, 1, 1)), offsets, chunk.labels,
        ).reshape(K, S, n_seq)

    # Pairwise posterior: its score and importance weight at the samples.
    std = params.pairwise_std
    # A line search's trial step may make exp(log std) underflow to 0: the
    # weights are then not finite, and L-BFGS rejects the trial (no warning).
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        resid_pair = (pair0 - params.pairwise_mean[None]) / std[None]  # (S, V, V)
        score_pair_mean = resid_pair / std
        score_pair_std = (resid_pair**2 - 1.0) / std
        log_w_pair = np.sum(
            -0.5 * resid_pair**2 - np.log(std)[None]
            + 0.5 * shared.pairwise_noise**2 + np.log(params0.pairwise_std)[None],
            axis=(1, 2),
        )  # (S,)

    grad_mu, grad_sqrt = _zero_grads(params)
    grad_pair_mean = np.zeros((V, V))
    grad_pair_std = np.zeros((V, V))
    grad_weights = np.zeros(K)
    ell = 0.0
    d_B = []
    d_residual_sd = np.zeros(T)
    for n, (rows, B_n) in enumerate(zip(projection.rows, projection.B, strict=True)):
        t0, t1 = offsets[n], offsets[n + 1]
        if t1 == t0:
            d_B.append(np.zeros_like(B_n))
            continue
        Tn = t1 - t0
        if ref is None:  # the samples' posterior is the current one
            mean, chol = marginals0[n]
        else:
            mean, chol = _sequence_marginal(params, rows, B_n, residual_sd[t0:t1])
        chol_inv = np.linalg.solve(chol, np.eye(Tn))  # (K, V, T, T)
        sigma_inv = np.swapaxes(chol_inv, -1, -2) @ chol_inv
        f = samples[0, :, :, t0:t1]  # (K, V, T, S)
        diff = f - mean[..., None]
        z = sigma_inv @ diff  # Sigma^{-1} (f - b)
        log_q = -np.sum(
            0.5 * np.sum(diff * z, axis=2) + 0.5 * _log_det_chol(chol)[..., None],
            axis=1,
        )  # (K, S)
        log_weight = log_q - log_q0[:, n] + log_w_pair[None]  # (K, S)

        # Control-variate coefficient from the baseline set (section 5.1):
        # a = sum_s |h_s|^2 log p_s / sum_s |h_s|^2, h the score.
        if use_control_variate:
            # Baseline samples come from the same (current) posterior.
            zb = np.swapaxes(chol_inv, -1, -2) @ eta[1, :, :, t0:t1, :]
            outer_b = np.einsum("kvts,kvus->kvstu", zb, zb) - sigma_inv[:, :, None]
            h_norm = np.einsum("kvts,kvts->ks", zb, zb) + 0.25 * np.einsum(
                "kvstu,kvstu->ks", outer_b, outer_b
            )
            a = np.sum(h_norm * log_p_base[:, :, n], axis=1) / np.sum(h_norm, axis=1)
        else:
            a = np.zeros(K)

        if ref is None:
            # Plain estimator: weights are 1, baseline a (control variate).
            centred = (log_p[:, :, n] - a[:, None]) * (w / S)[:, None]  # (K, S)
            per_component = log_p[:, :, n].mean(axis=1)
        else:
            # Self-normalised weights: J = sum_s w_s log p_s / sum_s w_s is
            # bounded, so L-BFGS cannot run off by inflating one weight; its
            # gradient is the score estimate with a weighted-mean baseline,
            # scaled by S / (S - 1) about the plain mean (leave-one-out).
            p_s = np.exp(log_weight - log_weight.max(axis=1, keepdims=True))
            p_s /= p_s.sum(axis=1, keepdims=True)
            weighted = np.sum(p_s * log_p[:, :, n], axis=1)
            plain = log_p[:, :, n].mean(axis=1)
            leave_one_out = S / (S - 1)
            per_component = plain + leave_one_out * (weighted - plain)
            centred = (
                leave_one_out * p_s * (log_p[:, :, n] - weighted[:, None])
                * w[:, None]
            )
        ell += float(np.dot(w, per_component))
        grad_weights += per_component
        g_b = np.einsum("kvts,ks->kvt", z, centred)
        g_sigma = 0.5 * (
            np.einsum("kvts,kvus,ks->kvtu", z, z, centred)
            - sigma_inv * centred.sum(axis=1)[:, None, None, None]
        )
        # Through _sequence_marginal's jitter, SEQUENCE_JITTER times the mean
        # of the diagonal added to it: to the covariance before the jitter.
        # Not negligible where the jitter alone makes Sigma invertible (more
        # tokens than inducing variables, no residual): there Sigma^-1, so
        # g_sigma, is of order 1 / (SEQUENCE_JITTER * the mean variance).
        idx = np.arange(Tn)
        g_sigma[..., idx, idx] += (SEQUENCE_JITTER / Tn) * np.einsum(
            "kvtt->kv", g_sigma
        )[..., None]
        # b = m[rows] B_n, Sigma = B_n^T S[rows, rows] B_n + diag(r): chain rule.
        q_sqrt_rows = _rows(params.q_sqrt, rows)
        BgB = B_n @ g_sigma @ B_n.T  # (K, V, rows, rows): d/dS[rows, rows]
        if full:
            d_sqrt = 2.0 * BgB @ q_sqrt_rows  # d/dR[rows, :]
            S_B = q_sqrt_rows @ (np.swapaxes(q_sqrt_rows, -1, -2) @ B_n)
        else:
            d_sqrt = 2.0 * np.diagonal(BgB, axis1=-2, axis2=-1) * q_sqrt_rows
            S_B = q_sqrt_rows[..., None] ** 2 * B_n
        if rows is None:
            grad_mu += g_b @ B_n.T
            grad_sqrt += d_sqrt
        else:
            grad_mu[:, :, rows] += g_b @ B_n.T
            grad_sqrt[:, :, rows] += d_sqrt
        d_B.append(
            np.einsum("kvm,kvt->mt", _rows(params.q_mu, rows), g_b)
            + 2.0 * np.einsum("kvmt,kvtu->mu", S_B, g_sigma)
        )
        d_residual_sd[t0:t1] += 2.0 * residual_sd[t0:t1] * np.einsum(
            "kvtt->t", g_sigma
        )
        pair_weight = centred.sum(axis=0)
        grad_pair_mean += np.einsum("s,sij->ij", pair_weight, score_pair_mean)
        grad_pair_std += np.einsum("s,sij->ij", pair_weight, score_pair_std)
    if full:
        grad_sqrt = np.tril(grad_sqrt)

    out = {
        "ell": ell,
        "q_mu": grad_mu,
        "q_sqrt": grad_sqrt,
        "weights": grad_weights,
        "pairwise_mean": grad_pair_mean,
        "pairwise_std": grad_pair_std,
    }
    return out, d_B, d_residual_sd
