"""GPstruct: elliptical slice sampling on the full GP prior.

The original GPstruct sampler (Bratieres, Quadrianto and Ghahramani, TPAMI
2015), the "GP-ESS" row of Table 1 of the gray-box paper. The latent state
is every unary potential of every training token and the pairwise
potentials, jointly::

    f_unary[:, j] ~ N(0, K)        for every label j (one Gram matrix K of
                                   the N training tokens, shared by labels)
    f_bin         ~ N(0, sigma^2 I_{V x V})

and its posterior under the exact linear-chain likelihood is sampled with
elliptical slice sampling (Murray, Adams and MacKay, AISTATS 2010): one
ellipse through the current state and a prior draw of the whole
``N * V + V**2`` vector per iteration.

Cost: one ``N x N`` Gram matrix and its Cholesky factor per fit (``O(N^3)``
time, ``O(N^2)`` memory); then per iteration one prior draw and a few exact
log-likelihood evaluations (``O(N V^2)`` each). A prior draw is ``L @ z``
with the Cholesky factor (``O(N^2 V)``), or, for the linear kernels, whose
Gram matrix is ``Phi Phi^T`` for the scaled features ``Phi`` (one column per
feature and the bias), ``Phi @ z`` (``O((D + nnz) V)`` for ``D`` columns of
``nnz`` entries): the same Gaussian, drawn through the columns of ``Phi``
instead of the tokens. The features active at one training token are
collapsed into one column per token first
(:class:`~skgpstruct.inference.inducing.CollapsedFeatures`: the same Gram
matrix), and ``Phi`` is used where it is the cheaper of the two: at most
``N^2 / 600`` columns (``benchmarks/bench_prior_draws.py`` on the CRF++
sets: a normal deviate with its share of the sparse product 17 to 21 ns, a
multiply-add of the triangular product 66 to 101 ps, so ``Phi`` is the
cheaper below about ``N^2 / 500`` columns). Prior draws do not depend on
the state, so they are computed for blocks of iterations with one matrix
product (level-3 BLAS for ``L`` instead of a memory-bound matrix-vector
product per iteration); the prior,
pairwise and slice random numbers come from three independent streams, so
the chain does not depend on the block size.

Kernel hyperparameters and the pairwise prior variance are fixed, as in
GPstruct's experiments (its hyperparameter sampling was optional and off by
default): this module does not learn them. ``GPStructClassifier(inference=
"ess")`` passes it those a variational fit of the same estimator learned,
unless ``learn_hyperparameters=False``.

Prediction follows GPstruct: for every kept sample the test unaries come
from the GP conditional ``f_* | f`` (its mean ``K_*X K^{-1} f``, or a draw),
forward-backward gives the token marginals, and they are averaged over the
samples. Decoding (max-marginal, as GPstruct did, or Viterbi on the
posterior mean potentials) is left to the caller.
"""

import math
import sys
import time

import numpy as np
import scipy.sparse as sp
from scipy import linalg
from scipy.linalg import blas

from .. import chain
from .._checks import check_integer
from .._linalg import jitter_cholesky
from .._sequences import _check_finite, chunk_slices
from .inducing import CollapsedFeatures

__all__ = [
    "DEFAULT_MEMORY_LIMIT",
    "ESSPosterior",
    "check_chain_length",
    "check_chain_size",
    "elliptical_slice",
    "ess_memory_bytes",
    "sample_posterior",
]

#: Default bound (bytes) on the memory :func:`sample_posterior` may allocate.
DEFAULT_MEMORY_LIMIT = 4 * 2**30
# Iterations whose prior draws are computed by one matrix product.
_DRAW_BLOCK = 64
# Prior draws go through the feature map when it has at most N^2 / this many
# columns. A draw costs D V deviates through the map and N^2 V / 2
# multiply-adds through the factor; benchmarks/bench_prior_draws.py measured
# 17 to 21 ns per deviate and 66 to 101 ps per multiply-add on the Table 1
# folds, a break-even near N^2 / 500 columns.
_FEATURE_MAP_BREAK_EVEN = 600
# Test tokens per block of the prediction (kernel rows and unaries).
_PREDICT_TOKENS = 1000
# An angle bracket narrower than this means the threshold cannot be met
# (it is at the current log-likelihood to rounding): the state is kept.
_MIN_BRACKET = 1e-12


def _format_bytes(n_bytes):
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= size:
            return f"{n_bytes / size:.3g} {unit}"
    return f"{int(n_bytes)} bytes"


def _n_kept(n_iter, burn_in, thin):
    return (n_iter - burn_in) // thin


def ess_memory_bytes(n_tokens, n_classes, n_kept):
    """Memory that :func:`sample_posterior` allocates, in bytes.

    Parameters
    ----------
    n_tokens : int
        Number of training tokens ``N``.
    n_classes : int
        Number of labels ``V``.
    n_kept : int
        Number of retained samples.

    Returns
    -------
    gram_bytes : int
        The ``N x N`` Gram matrix and its Cholesky factor, both float64.
    other_bytes : int
        The retained samples (``n_kept * (N V + V^2)`` floats), the block of
        prior draws and the state. Drawing through the feature map of a
        linear kernel (:func:`prior_feature_map`) adds that map, with at most
        the entries of the training design.
    """
    n, v = int(n_tokens), int(n_classes)
    gram = 2 * 8 * n * n
    other = 8 * (int(n_kept) * (n * v + v * v) + 2 * _DRAW_BLOCK * n * v + 4 * n * v)
    return gram, other


def prior_feature_map(X, kernel, *, always=False):
    """A sparse ``Phi`` with ``Phi @ Phi.T == kernel(X)``, when it is cheaper.

    For a kernel with an explicit feature map (``feature_scales``: the linear
    kernels), the scaled features of the training tokens and the scaled bias
    column, each token's lone features collapsed into one column
    (:class:`~skgpstruct.inference.inducing.CollapsedFeatures`, which keeps
    the Gram matrix). A prior draw ``Phi @ z`` then costs a normal deviate
    per column instead of the ``N^2 / 2`` multiply-adds of ``L @ z``.

    Parameters
    ----------
    X : ndarray or sparse matrix of shape (n_tokens, n_features)
    kernel : Kernel
    always : bool, default=False
        Return the map whatever its size (to time or test it).

    Returns
    -------
    CSR matrix of shape (n_tokens, n_columns) or None
        None for a kernel without a feature map, and (unless ``always``)
        when ``Phi`` has more than ``n_tokens**2 / 600`` columns: drawing
        through the Cholesky factor is then cheaper.
    """
    if not hasattr(kernel, "feature_scales"):
        return None
    n_tokens = X.shape[0]
    collapsed = CollapsedFeatures.of(X)
    if collapsed is None:
        design = sp.csr_matrix(X, dtype=np.float64)
        scales = kernel.feature_scales(X.shape[1])
    else:
        design = collapsed.transform(X)
        scales = collapsed.prepare(kernel)
    if not always and scales.size * _FEATURE_MAP_BREAK_EVEN > n_tokens**2:
        return None
    bias = sp.csr_matrix(np.ones((n_tokens, 1)))
    return (sp.hstack([design, bias], format="csr") @ sp.diags(scales)).tocsr()


class _PriorDraws:
    """Blocks of draws of ``N(0, K + jitter I)`` for every label, unary part.

    Through the feature map ``Phi`` when there is one (plus an independent
    ``sqrt(jitter)`` term if the factorisation needed jitter), else through
    the Cholesky factor. Either way a block consumes the random numbers of
    its iterations in order, so a chain does not depend on the block size.
    """

    def __init__(self, factor, jitter, feature_map, n_classes, rng):
        self.factor_t = factor.T  # Fortran-ordered upper triangle: dtrmm in place
        self.jitter = jitter
        self.feature_map = feature_map
        self.n_classes = n_classes
        self.rng = rng

    def block(self, size):
        """Draws of ``size`` iterations, shape (N, size, V)."""
        n_tokens, V = self.factor_t.shape[0], self.n_classes
        if self.feature_map is None:
            z = self.rng.standard_normal((size, n_tokens, V))
            z = np.asfortranarray(z.transpose(1, 0, 2).reshape(n_tokens, -1))
            nu = blas.dtrmm(1.0, self.factor_t, z, lower=0, trans_a=1, overwrite_b=1)
            return nu.reshape(n_tokens, size, V)  # column b*V + v
        n_columns = self.feature_map.shape[1]
        n_normals = n_columns + (n_tokens if self.jitter > 0 else 0)
        nu = np.empty((n_tokens, size, V))
        # Sub-blocks of at most N * _DRAW_BLOCK deviates per label (one
        # iteration at least), as the triangular product's block.
        step = max(1, n_tokens * _DRAW_BLOCK // n_normals)
        for start in range(0, size, step):
            stop = min(size, start + step)
            z = self.rng.standard_normal((stop - start, n_normals, V))
            weights = np.ascontiguousarray(z[:, :n_columns].transpose(1, 0, 2))
            part = self.feature_map @ weights.reshape(n_columns, -1)
            nu[:, start:stop] = part.reshape(n_tokens, stop - start, V)
            if self.jitter > 0:
                lift = math.sqrt(self.jitter) * z[:, n_columns:].transpose(1, 0, 2)
                nu[:, start:stop] += lift
        return nu


# --------------------------------------------------------------------------
# The update
# --------------------------------------------------------------------------


def elliptical_slice(state, prior_draw, log_likelihood, current_log_likelihood, rng):
    """One elliptical slice sampling update (Murray, Adams and MacKay, 2010).

    Leaves ``p(f) proportional to N(f; 0, Sigma) L(f)`` invariant, given a
    draw ``nu`` of the Gaussian prior ``N(0, Sigma)``: the threshold
    ``log L(f) + log u`` is drawn, then angles on the ellipse
    ``f cos(theta) + nu sin(theta)`` are drawn from a bracket that shrinks
    towards ``theta = 0`` until one lands above the threshold (Fig. 2 of the
    paper).

    Parameters
    ----------
    state : ndarray
        Current state ``f`` (any shape).
    prior_draw : ndarray of the same shape as ``state``
        A draw ``nu ~ N(0, Sigma)``, independent of everything else.
    log_likelihood : callable
        ``log_likelihood(f) -> float``.
    current_log_likelihood : float
        ``log_likelihood(state)``.
    rng : numpy.random.Generator
        Source of the threshold and the angles.

    Returns
    -------
    new_state : ndarray
        The next state (``state`` itself, not a copy, in the degenerate case
        where the bracket collapses below ``1e-12`` radians, which happens
        only when the threshold equals the current log-likelihood to
        rounding).
    new_log_likelihood : float
    n_evaluations : int
        Number of likelihood evaluations used (at least one).
    """
    # log(1 - U) with U in [0, 1): log u in (-inf, 0], never log(0).
    log_threshold = current_log_likelihood + math.log1p(-rng.random())
    theta = rng.uniform(0.0, 2.0 * math.pi)
    low, high = theta - 2.0 * math.pi, theta
    n_evaluations = 0
    while True:
        proposal = state * math.cos(theta)
        proposal += prior_draw * math.sin(theta)
        value = float(log_likelihood(proposal))
        n_evaluations += 1
        if value > log_threshold:
            return proposal, value, n_evaluations
        if theta < 0.0:
            low = theta
        else:
            high = theta
        if high - low < _MIN_BRACKET:
            return state, current_log_likelihood, n_evaluations
        theta = rng.uniform(low, high)


class _ChainLogLikelihood:
    """``log p(y | f)`` of the training sequences for a flat state vector.

    The first call validates the offsets, the labels and the state's shape
    and values (:func:`skgpstruct.chain.log_likelihood`, clear messages);
    later calls skip the checks, which cost about as much as a short
    sequence's forward pass. Their states are proposals on an ellipse through
    the current state and a Gaussian draw, finite like both.
    """

    def __init__(self, offsets, labels, n_tokens, n_classes):
        self.offsets = offsets
        self.labels = labels
        self.n_unary = n_tokens * n_classes
        self.unary_shape = (1, n_tokens, n_classes)
        self.pairwise_shape = (1, n_classes, n_classes)
        self.checked = False

    def __call__(self, state):
        unary = state[: self.n_unary].reshape(self.unary_shape)
        pairwise = state[self.n_unary :].reshape(self.pairwise_shape)
        if self.checked:
            loglik = chain._log_likelihood_unchecked(
                unary, pairwise, self.offsets, self.labels, return_gradient=False
            )
        else:
            loglik = chain.log_likelihood(unary, pairwise, self.offsets, self.labels)
            self.checked = True
        return float(loglik.sum())


def check_chain_length(n_iter, burn_in, thin, prefix=""):
    """``(n_iter, burn_in, thin)`` as ints, ``burn_in`` None as half the
    chain, else a ValueError naming the argument (``prefix`` + its name, as
    the caller calls it) when one is not an integer in range or no sample
    would be kept (``burn_in + thin > n_iter``)."""
    n_iter = int(check_integer(n_iter, prefix + "n_iter", 1))
    thin = int(check_integer(thin, prefix + "thin", 1))
    halved = burn_in is None
    if halved:
        burn_in = n_iter // 2
    burn_in = int(check_integer(burn_in, prefix + "burn_in", 0))
    if burn_in + thin > n_iter:
        half = f" (None: {prefix}n_iter // 2)" if halved else ""
        raise ValueError(
            f"no sample would be kept: {prefix}burn_in{half} + {prefix}thin "
            f"({burn_in} + {thin}) must be at most {prefix}n_iter ({n_iter})"
        )
    return n_iter, burn_in, thin


def check_chain_size(n_tokens, n_classes, n_iter, burn_in, thin, memory_limit):
    """Validate a chain's length and what it would allocate, allocating nothing.

    Parameters
    ----------
    n_tokens, n_classes : int
        Training tokens ``N`` and labels ``V``.
    n_iter, burn_in, thin : int (burn_in may be None: ``n_iter // 2``)
        As for :func:`sample_posterior`.
    memory_limit : int
        Largest number of bytes the sampler may allocate.

    Returns
    -------
    n_iter, burn_in, thin, n_kept : int

    Raises
    ------
    ValueError
        When an argument is not an integer in range, when no sample would be
        kept, or when the Gram matrix, its factor, the kept samples and the
        sampler's buffers would exceed ``memory_limit`` (the message says
        how to proceed).
    """
    n_iter, burn_in, thin = check_chain_length(n_iter, burn_in, thin)
    n_kept = _n_kept(n_iter, burn_in, thin)
    gram_bytes, other_bytes = ess_memory_bytes(n_tokens, n_classes, n_kept)
    if gram_bytes + other_bytes > memory_limit:
        raise ValueError(
            f"inference='ess' needs the dense Gram matrix of all N = {n_tokens} "
            f"training tokens and its Cholesky factor ({_format_bytes(gram_bytes)}"
            f"), plus {_format_bytes(other_bytes)} for the {n_kept} kept samples "
            "and the sampler's draw buffers: "
            f"{_format_bytes(gram_bytes + other_bytes)} in all, more than the "
            f"memory limit of {_format_bytes(memory_limit)}. Use "
            "inference='variational', whose memory does not grow with N^2; or "
            "train on fewer tokens, keep fewer samples (larger thin) or raise "
            "the memory limit"
        )
    return n_iter, burn_in, thin, n_kept


# --------------------------------------------------------------------------
# The sampler
# --------------------------------------------------------------------------


def _check_stacked_features(X):
    """``X`` as a 2-D array of real numbers (a list is read as one) or a
    sparse matrix, with finite values; else a ValueError naming ``X``."""
    X = X.tocsr() if sp.issparse(X) else np.asarray(X)  # LIL, DOK: no .data
    if X.dtype.kind not in "biuf":
        raise ValueError(f"X must hold real numbers, got dtype {X.dtype}")
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (n_tokens, n_features), got shape {X.shape}")
    _check_finite(X.data if sp.issparse(X) else X, "X")
    return X


def sample_posterior(
    X,
    offsets,
    labels,
    kernel,
    n_classes,
    *,
    pairwise_prior_variance=1.0,
    n_iter=1000,
    burn_in=None,
    thin=1,
    random_state=None,
    verbose=0,
    memory_limit=DEFAULT_MEMORY_LIMIT,
):
    """Sample the GPstruct posterior by elliptical slice sampling.

    Parameters
    ----------
    X : array-like or CSR matrix of shape (n_tokens, n_features)
        Stacked features of the training tokens (finite real numbers).
    offsets : ndarray of int of shape (n_sequences + 1,)
        Sequence boundaries in ``X`` (see :mod:`skgpstruct.chain`).
    labels : ndarray of int of shape (n_tokens,)
        Label index of every token, in ``[0, n_classes)``.
    kernel : Kernel
        Covariance of the unary latent functions, shared by all labels. Its
        hyperparameters are used as they are (not learned).
    n_classes : int
        Number of labels ``V``.
    pairwise_prior_variance : float, default=1.0
        Prior variance ``sigma^2`` of every pairwise potential.
    n_iter : int, default=1000
        Number of ESS iterations (each one update of the whole state).
    burn_in : int or None, default=None
        Iterations discarded before samples are kept; None means
        ``n_iter // 2``.
    thin : int, default=1
        Keep every ``thin``-th state after the burn-in: the states after
        iterations ``burn_in + thin, burn_in + 2 thin, ...``, i.e.
        ``(n_iter - burn_in) // thin`` samples, at least one.
    random_state : int, numpy.random.Generator or None, default=None
        Seed; the same seed gives the same chain.
    verbose : int or bool, default=0
        If positive (or True), print about twenty progress lines (iteration,
        log-likelihood, likelihood evaluations per iteration, seconds);
        if 2 or more, one per iteration.
    memory_limit : int, default=4 GiB
        Largest number of bytes the sampler may allocate (Gram matrix,
        Cholesky factor, kept samples and draw buffers); checked before anything is
        allocated.

    Returns
    -------
    posterior : ESSPosterior
        The kept samples, with what prediction needs.

    Raises
    ------
    ValueError
        On invalid arguments, or when the Gram matrix of the training tokens
        (with its factor and the kept samples) would exceed
        ``memory_limit``; the message says how to proceed.

    Notes
    -----
    The chain starts at ``f = 0`` (inside the support, as in GPstruct).
    The Gram matrix goes through :func:`skgpstruct._linalg.jitter_cholesky`;
    any jitter it adds is part of the prior that is sampled (and of the
    conditional used in prediction), and is recorded in
    :attr:`ESSPosterior.jitter`.
    """
    n_classes = int(check_integer(n_classes, "n_classes", 1))
    # True and False as 1 and 0, as the estimator takes them
    verbose = int(verbose if isinstance(verbose, bool | np.bool_)
                  else check_integer(verbose, "verbose", 0))
    sigma2 = float(pairwise_prior_variance)
    if not (np.isfinite(sigma2) and sigma2 > 0):
        raise ValueError(
            "pairwise_prior_variance must be a positive number, got "
            f"{pairwise_prior_variance!r}"
        )
    X = _check_stacked_features(X)
    n_tokens = X.shape[0]
    if n_tokens == 0:
        raise ValueError("X has no tokens")
    # The chain's own checks: integers only (1.9 was cast to 1), in range.
    labels = chain._check_labels(labels, n_tokens, n_classes)
    offsets = chain._check_offsets(offsets, n_tokens)
    n_iter, burn_in, thin, n_kept = check_chain_size(
        n_tokens, n_classes, n_iter, burn_in, thin, memory_limit
    )

    rng = np.random.default_rng(random_state)
    unary_rng, pairwise_rng, slice_rng = rng.spawn(3)
    log_likelihood = _ChainLogLikelihood(offsets, labels, n_tokens, n_classes)
    n_unary = n_tokens * n_classes
    state = np.zeros(n_unary + n_classes * n_classes)
    # Validates offsets and labels (clear messages) before the O(N^3) work.
    current = log_likelihood(state)

    start = time.perf_counter()
    gram = kernel(X)
    factor, jitter = jitter_cholesky(
        gram, name="the Gram matrix of the training tokens"
    )
    del gram
    draws = _PriorDraws(
        factor, jitter, prior_feature_map(X, kernel), n_classes, unary_rng
    )
    sigma = math.sqrt(sigma2)

    prior_draw = np.empty_like(state)
    unary_samples = np.empty((n_kept, n_tokens, n_classes))
    pairwise_samples = np.empty((n_kept, n_classes, n_classes))
    sample_iterations = np.empty(n_kept, dtype=np.int64)
    trace = np.empty(n_iter)
    evaluations = np.empty(n_iter, dtype=np.int64)
    report_every = 1 if verbose >= 2 else max(1, n_iter // 20)
    kept = 0
    for block_start in range(0, n_iter, _DRAW_BLOCK):
        size = min(_DRAW_BLOCK, n_iter - block_start)
        nu_unary = draws.block(size)
        nu_pairwise = sigma * pairwise_rng.standard_normal((size, n_classes, n_classes))
        for b in range(size):
            prior_draw[:n_unary].reshape(n_tokens, n_classes)[...] = nu_unary[:, b, :]
            prior_draw[n_unary:] = nu_pairwise[b].ravel()
            state, current, n_eval = elliptical_slice(
                state, prior_draw, log_likelihood, current, slice_rng
            )
            iteration = block_start + b + 1
            trace[iteration - 1] = current
            evaluations[iteration - 1] = n_eval
            if iteration > burn_in and (iteration - burn_in) % thin == 0:
                unary_samples[kept] = state[:n_unary].reshape(n_tokens, n_classes)
                pairwise_samples[kept] = state[n_unary:].reshape(n_classes, n_classes)
                sample_iterations[kept] = iteration
                kept += 1
            if verbose and (iteration % report_every == 0 or iteration == n_iter):
                recent = evaluations[max(0, iteration - report_every) : iteration]
                print(
                    f"ESS iteration {iteration:7d}  log-likelihood {current:14.4f}  "
                    f"evaluations/iteration {recent.mean():5.2f}  "
                    f"{time.perf_counter() - start:8.2f} s",
                    file=sys.stdout,
                    flush=True,
                )
    return ESSPosterior(
        kernel=kernel,
        X_train=X,
        factor=factor,
        jitter=jitter,
        unary_samples=unary_samples,
        pairwise_samples=pairwise_samples,
        sample_iterations=sample_iterations,
        log_likelihood_trace=trace,
        n_evaluations=evaluations,
    )


# --------------------------------------------------------------------------
# The posterior samples and prediction
# --------------------------------------------------------------------------


def _psd_root(cov):
    """``R`` with ``R @ R.T == cov`` for a symmetric positive semi-definite
    ``cov``: eigenvalues that rounding left below zero count as zero.

    A conditional covariance at tokens equal to training tokens is zero up
    to rounding (the draw is then the conditional mean): too degenerate for
    a Cholesky factor, whose jitter scales with the matrix's own diagonal.
    """
    eigenvalues, vectors = np.linalg.eigh(cov)
    return vectors * np.sqrt(np.clip(eigenvalues, 0.0, None))


def _token_marginals(unary, pairwise, offsets):
    """:func:`skgpstruct.chain.forward_backward`'s token marginals (its
    checks, clear messages), without the pair marginals prediction discards."""
    unary, pairwise, offsets = chain._check_chain(
        unary, pairwise, offsets, with_samples=True
    )
    return chain._forward_backward(
        unary, pairwise, offsets, with_marginals=True, with_pairs=False
    )[1]


class ESSPosterior:
    """Kept samples of an ESS run, and prediction from them.

    Built by :func:`sample_posterior`; the attributes are read-only by
    convention.

    Parameters
    ----------
    kernel : Kernel
        The (fixed) kernel of the unary latent functions.
    X_train : ndarray or CSR matrix of shape (N, n_features)
        Training tokens.
    factor : ndarray of shape (N, N)
        Lower Cholesky factor of ``K + jitter I``.
    jitter : float
        Jitter added to the Gram matrix's diagonal.
    unary_samples : ndarray of shape (n_samples, N, V)
        Kept unary potentials of the training tokens.
    pairwise_samples : ndarray of shape (n_samples, V, V)
        Kept pairwise potentials (row: label at t, column: label at t + 1).
    sample_iterations : ndarray of int of shape (n_samples,)
        The iteration (1-based) after which each sample was kept.
    log_likelihood_trace : ndarray of shape (n_iter,)
        ``log p(y | f)`` of the training data after every iteration.
    n_evaluations : ndarray of int of shape (n_iter,)
        Likelihood evaluations of every iteration.
    """

    def __init__(
        self,
        kernel,
        X_train,
        factor,
        jitter,
        unary_samples,
        pairwise_samples,
        sample_iterations,
        log_likelihood_trace,
        n_evaluations,
    ):
        self.kernel = kernel
        self.X_train = X_train
        self.factor = factor
        self.jitter = jitter
        self.unary_samples = unary_samples
        self.pairwise_samples = pairwise_samples
        self.sample_iterations = sample_iterations
        self.log_likelihood_trace = log_likelihood_trace
        self.n_evaluations = n_evaluations
        self._alpha = None

    @property
    def n_samples(self):
        """Number of kept samples."""
        return self.unary_samples.shape[0]

    @property
    def n_classes(self):
        """Number of labels ``V``."""
        return self.unary_samples.shape[2]

    @property
    def pairwise_mean(self):
        """Posterior mean of the pairwise potentials, shape (V, V)."""
        return self.pairwise_samples.mean(axis=0)

    def _weights(self):
        """``alpha = (K + jitter I)^{-1} f`` for every sample, (N, S, V)."""
        if self._alpha is None:
            S, N, V = self.unary_samples.shape
            rhs = self.unary_samples.transpose(1, 0, 2).reshape(N, S * V)
            alpha = linalg.cho_solve((self.factor, True), rhs, check_finite=False)
            self._alpha = alpha.reshape(N, S, V)
        return self._alpha

    def _check_test(self, X, offsets):
        if X.ndim != 2 or X.shape[1] != self.X_train.shape[1]:
            raise ValueError(
                f"X must have shape (n_tokens, {self.X_train.shape[1]}), got "
                f"{X.shape}"
            )
        if offsets is None:
            return np.arange(X.shape[0] + 1, dtype=np.int64)
        return chain._check_offsets(offsets, X.shape[0])

    def _blocks(self, offsets):
        """Runs of whole sequences of about ``_PREDICT_TOKENS`` tokens."""
        for sl in chunk_slices(np.diff(offsets), _PREDICT_TOKENS):
            t0, t1 = int(offsets[sl.start]), int(offsets[sl.stop])
            yield t0, t1, offsets[sl.start : sl.stop + 1] - t0

    def _conditional_noise(self, X_block, cross, local_offsets, rng):
        """Draws of ``f_* - E[f_* | f]`` for every sample and label.

        Jointly Gaussian within a sequence (covariance
        ``K_** + jitter I - K_*X (K + jitter I)^{-1} K_X*``), independent
        between sequences, samples and labels.
        """
        S, V = self.n_samples, self.n_classes
        q = linalg.solve_triangular(
            self.factor, cross.T, lower=True, check_finite=False
        )
        noise = np.empty((S, X_block.shape[0], V))
        for t0, t1 in zip(local_offsets[:-1], local_offsets[1:], strict=True):
            if t1 == t0:
                continue
            cov = self.kernel(X_block[t0:t1])
            cov -= q[:, t0:t1].T @ q[:, t0:t1]
            cov[np.diag_indices_from(cov)] += self.jitter
            root = _psd_root(cov)
            z = rng.standard_normal((t1 - t0, S * V))
            noise[:, t0:t1, :] = (root @ z).reshape(t1 - t0, S, V).transpose(1, 0, 2)
        return noise

    def _unary_blocks(self, X, offsets, conditional, random_state):
        if conditional not in ("mean", "sample"):
            raise ValueError(
                f"conditional must be 'mean' or 'sample', got {conditional!r}"
            )
        rng = np.random.default_rng(random_state)
        alpha = self._weights()
        N, S, V = alpha.shape
        for t0, t1, local_offsets in self._blocks(offsets):
            X_block = X[t0:t1]
            cross = self.kernel(X_block, self.X_train)  # (n_block, N)
            unary = (cross @ alpha.reshape(N, S * V)).reshape(t1 - t0, S, V)
            unary = unary.transpose(1, 0, 2)
            if conditional == "sample":
                unary = unary + self._conditional_noise(
                    X_block, cross, local_offsets, rng
                )
            yield t0, t1, local_offsets, np.ascontiguousarray(unary)

    def predict_unary(self, X, *, offsets=None, conditional="mean", random_state=None):
        """Unary potentials of test tokens for every kept sample.

        Parameters
        ----------
        X : ndarray or CSR matrix of shape (n_tokens, n_features)
            Test tokens.
        offsets : ndarray of int of shape (n_sequences + 1,) or None
            Sequence boundaries of ``X``; only used by
            ``conditional="sample"`` (tokens of a sequence are drawn
            jointly). None treats every token as its own sequence.
        conditional : {"mean", "sample"}, default="mean"
            ``"mean"``: the GP conditional mean ``K_*X K^{-1} f`` (what
            GPstruct used); ``"sample"``: a draw of ``f_* | f``.
        random_state : int, numpy.random.Generator or None, default=None
            Seeds the conditional draws.

        Returns
        -------
        unary : ndarray of shape (n_samples, n_tokens, V)
        """
        offsets = self._check_test(X, offsets)
        out = np.empty((self.n_samples, X.shape[0], self.n_classes))
        blocks = self._unary_blocks(X, offsets, conditional, random_state)
        for t0, t1, _, unary in blocks:
            out[:, t0:t1] = unary
        return out

    def mean_unary(self, X):
        """Posterior mean of the unary potentials of test tokens.

        ``K_*X K^{-1} E[f]``: the conditional mean is linear in ``f``, so the
        mean over samples needs one product.

        Parameters
        ----------
        X : ndarray or CSR matrix of shape (n_tokens, n_features)

        Returns
        -------
        unary : ndarray of shape (n_tokens, V)
        """
        self._check_test(X, None)
        alpha = self._weights().mean(axis=1)  # (N, V)
        out = np.empty((X.shape[0], self.n_classes))
        for t0 in range(0, X.shape[0], _PREDICT_TOKENS):
            t1 = min(t0 + _PREDICT_TOKENS, X.shape[0])
            out[t0:t1] = self.kernel(X[t0:t1], self.X_train) @ alpha
        return out

    def sample_marginals(self, X, offsets, *, conditional="mean", random_state=None):
        """Forward-backward token marginals of every kept sample.

        Parameters
        ----------
        X : ndarray or CSR matrix of shape (n_tokens, n_features)
        offsets : ndarray of int of shape (n_sequences + 1,)
            Sequence boundaries of ``X``.
        conditional : {"mean", "sample"}, default="mean"
            As in :meth:`predict_unary`.
        random_state : int, numpy.random.Generator or None, default=None

        Returns
        -------
        marginals : ndarray of shape (n_samples, n_tokens, V)
            ``p(y_t = v | f_s)``; rows sum to one.
        """
        offsets = self._check_test(X, offsets)
        out = np.empty((self.n_samples, X.shape[0], self.n_classes))
        blocks = self._unary_blocks(X, offsets, conditional, random_state)
        pairwise = self.pairwise_samples
        for t0, t1, local_offsets, unary in blocks:
            _, out[:, t0:t1], _ = chain.forward_backward(unary, pairwise, local_offsets)
        return out

    def predict_marginals(self, X, offsets, *, conditional="mean", random_state=None):
        """Token marginals averaged over the kept samples (GPstruct's prediction).

        Parameters
        ----------
        X : ndarray or CSR matrix of shape (n_tokens, n_features)
        offsets : ndarray of int of shape (n_sequences + 1,)
            Sequence boundaries of ``X``.
        conditional : {"mean", "sample"}, default="mean"
            As in :meth:`predict_unary`.
        random_state : int, numpy.random.Generator or None, default=None

        Returns
        -------
        marginals : ndarray of shape (n_tokens, V)
            Rows sum to one; the argmax of a row is GPstruct's max-marginal
            decode.
        """
        offsets = self._check_test(X, offsets)
        out = np.empty((X.shape[0], self.n_classes))
        blocks = self._unary_blocks(X, offsets, conditional, random_state)
        pairwise = self.pairwise_samples
        for t0, t1, local_offsets, unary in blocks:
            out[t0:t1] = _token_marginals(unary, pairwise, local_offsets).mean(axis=0)
        return out
