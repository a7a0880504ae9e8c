"""GPStructClassifier: the scikit-learn face of the structured GP."""

import contextlib
import dataclasses
import hashlib
import numbers
import sys
import warnings

import numpy as np
import scipy.sparse as sp
from joblib import Parallel, delayed
from numpy.random.bit_generator import ISeedSequence
from sklearn.base import BaseEstimator, clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.validation import check_is_fitted

from . import chain
from ._block_cache import reuse_blocks
from ._checks import (
    check_flag,
    check_groups,
    check_integer,
    check_n_jobs,
    check_random_state_seed,
    is_integer,
    is_real,
    outside_stacklevel,
)
from ._linalg import single_blas_thread
from ._sequences import (
    canonical_csr,
    check_sequence_features,
    check_sequence_labels,
    chunk_slices,
    entries_in_columns,
    hstack_csr,
    label_kinds,
    offsets_from_lengths,
    select_columns,
    split_by_offsets,
    stack_sequences,
    without_stored_zeros,
)
from .inference.elbo import SparseELBO
from .inference.ess import (
    DEFAULT_MEMORY_LIMIT,
    check_chain_length,
    check_chain_size,
    sample_posterior,
)
from .inference.inducing import (
    CollapsedFeatures,
    InducingFeatures,
    InducingPoints,
    Projection,
    active_columns,
    distinct_rows,
    select_inducing_points,
)
from .inference.posterior import ParameterLayout, VariationalParameters
from .inference.terms import (
    Chunk,
    antithetic_normal,
    sample_unary,
    sample_unary_stacked,
)
from .kernels import (
    GroupedLinearKernel,
    LinearKernel,
    RBFKernel,
    _checked_sq_distances,
    _row_sq_norms,
    _sq_distances,
    check_kernel,
)
from .likelihoods import ChainCRF, get_likelihood
from .likelihoods.base import _checked
from .metrics import token_accuracy
from .optim.lbfgs import (
    NonFiniteStart,
    OptimizationResult,
    Timer,
    minimize_lbfgs,
    minimize_lbfgs_rounds,
)
from .optim.saga import SAGADiverged, maximize_saga

__all__ = ["GPStructClassifier"]

# A chunk closes once it holds this many tokens. Fixed (never derived from
# n_jobs) so that results are bit-identical for every n_jobs and backend.
CHUNK_TOKENS = 2000

#: Private attributes that only cache what a fitted model's own attributes
#: give again: never pickled, dropped when a fit starts, not part of the
#: state a failed fit restores.
_CACHES = ("_centred_columns_of", "_sampling_posterior_of", "_mean_state_of")
#: Most bytes of random numbers ``predict_marginals`` draws at once: a chunk
#: whose stacked samples need more is sampled in halves.
PREDICT_NOISE_BYTES = 32 * 2**20
#: Most bytes of sampled potentials (mixture components x samples x tokens x
#: labels doubles) ``predict_marginals`` holds at once in a thread
#: (forward-backward keeps a few arrays of that size beside them): a chunk's
#: sequences are sampled in runs within it, and a sequence whose samples
#: alone exceed it in blocks of its samples, sized by its length alone.
PREDICT_SAMPLE_BYTES = 64 * 2**20
# L-BFGS iterations per round of the score estimator (samples are redrawn
# from the current posterior between rounds). One: longer rounds overfit
# their samples (design.rst, "Score estimator").
SCORE_ROUND_SIZE = 1
# Most bytes of Monte Carlo base samples SAGA's stored gradients keep during
# a stochastic fit, so that reading a stored gradient back does not draw
# them again (the same numbers either way; records beyond it draw them).
SAGA_NOISE_BYTES = 256 * 2**20
# Most bytes the score estimator's dense per-sequence arrays may take: each
# sequence's latent values have a (K, V, T, T) covariance, its Cholesky
# factor and inverse (SCORE_SQUARE_ARRAYS such arrays at once). Longer
# sequences are refused before the fit (one of 10,000 tokens raised a
# MemoryError; 3,000 tokens took 124 s and 1.4 GB).
SCORE_MEMORY_BYTES = 2 * 2**30
SCORE_SQUARE_ARRAYS = 5
# Largest number of inducing features for which full covariances are allowed.
_MAX_FULL_FEATURES = 2000

_OPTIONS = {
    "inference": ("variational", "ess"),
    "covariance": ("full", "diag"),
    "gradient": ("pathwise", "score"),
    "optimizer": ("lbfgs", "stochastic"),
    "decode": ("viterbi", "marginal"),
    "inducing": ("auto", "features", "kmeans++", "random"),
}


@contextlib.contextmanager
def _explained_start(X_all, kernel):
    """Say what makes the ELBO non-finite where the fit starts: features or
    a kernel too large for the potentials, which are sampled in single
    precision."""
    try:
        yield
    except NonFiniteStart as exc:
        prior_sd = _largest_prior_sd(X_all, kernel)
        raise ValueError(
            f"the ELBO cannot be evaluated where the fit starts ({exc}): X's "
            f"values may be too large (largest |x| = {_largest_magnitude(X_all):.3g};"
            " scale the features down), or the kernel's prior too wide (a "
            f"training token's potential has a prior standard deviation up to "
            f"{prior_sd:.3g}; the potentials are sampled in single precision: "
            "start or bound the kernel's variance lower)"
        ) from None


@contextlib.contextmanager
def _released(objective):
    """Drop the chunks the objective cached in this process when the fit ends."""
    try:
        yield objective
    finally:
        objective.release()


@dataclasses.dataclass(frozen=True)
class _PickledMean:
    """A ``feature_mean_`` in a pickle: its length and nonzero entries.

    The mean is zero but at the centred columns (those active at most
    training tokens), a few of a hashed design's 2**20: stored dense it
    was 8 MB of a 9.6 MB pickle.
    """

    size: int
    columns: np.ndarray
    values: np.ndarray

    @classmethod
    def of(cls, mean):
        columns = np.flatnonzero(mean)
        return cls(mean.size, columns, mean[columns])

    def dense(self):
        mean = np.zeros(self.size, dtype=self.values.dtype)
        mean[self.columns] = self.values
        return mean


class _PriorUnits:
    """The kernel's ``theta`` in units of a narrow hyperprior's standard
    deviation, for L-BFGS: ``z = (theta - centre) / scale``.

    A prior of standard deviation ``scale`` gives ``theta`` a curvature of
    ``1 / scale^2``; below 1 that makes its coordinates far stiffer than the
    whitened posterior's (curvature about 1), and L-BFGS, which scales
    every coordinate alike, then stalls on tiny steps (with ``scale=1e-4`` a
    fit stopped after one iteration). In these units the prior's curvature
    is 1. ``of`` returns None for a scale of 1 or more (nothing to do) or
    without a hyperprior.
    """

    def __init__(self, sl, centre, scale):
        self.sl, self.centre, self.scale = sl, centre, scale

    @classmethod
    def of(cls, objective, layout):
        scale = objective.hyperprior_scale
        if objective.hyperprior_center is None or not scale < 1:
            return None
        return cls(layout.slices["theta"], objective.hyperprior_center, float(scale))

    def to_units(self, x):
        z = np.array(x, dtype=np.float64)
        z[self.sl] = (x[self.sl] - self.centre) / self.scale
        return z

    def from_units(self, z):
        x = np.array(z, dtype=np.float64)
        x[self.sl] = self.centre + self.scale * z[self.sl]
        return x

    def bounds(self, bounds):
        out = np.array(bounds, dtype=np.float64)
        out[self.sl] = (bounds[self.sl] - self.centre[:, None]) / self.scale
        return out

    def wrap(self, value_and_grad):
        """``value_and_grad`` of ``z``: the chain rule through ``from_units``."""
        def in_units(z):
            value, grad = value_and_grad(self.from_units(z))
            grad = np.array(grad, dtype=np.float64)
            grad[self.sl] *= self.scale
            return value, grad

        return in_units


def _maximize(optimize, value_and_grad, x0, bounds, units, *, rounds=False,
              **options):
    """``optimize(value_and_grad, x0, bounds=bounds, **options)``, in the
    :class:`_PriorUnits` ``units`` unless they are None; the result's ``x``
    is in the packed coordinates. With ``rounds``, ``value_and_grad`` is
    :func:`minimize_lbfgs_rounds`' factory ``(round_index, reference)``."""
    if units is None:
        return optimize(value_and_grad, x0, bounds=bounds, **options)
    if rounds:
        def in_units(index, z):
            return units.wrap(value_and_grad(index, units.from_units(z)))
    else:
        in_units = units.wrap(value_and_grad)
    result = optimize(
        in_units, units.to_units(x0), bounds=units.bounds(bounds), **options
    )
    result.x = units.from_units(result.x)
    return result


def _shared_element_groups(X):
    """The ``feature_groups`` every matrix of ``X`` carries (a subset of a
    :class:`~skgpstruct.features.FeatureSequences`, such as a
    cross-validation fold), or None unless all carry equal ones."""
    if isinstance(X, str | bytes) or not hasattr(X, "__iter__"):
        return None
    first = None
    for matrix in X:
        groups = getattr(matrix, "feature_groups", None)
        if groups is None:
            return None
        if first is None:
            first = groups
        elif groups is not first and not np.array_equal(groups, first):
            return None
    return first


def _make_chunks(sequences, offsets, label_index, groups, seeds):
    """One Chunk per group of sequence indices (rows stacked in group order)."""
    chunks = []
    for group, chunk_seed in zip(groups, seeds, strict=True):
        X_c, chunk_offsets = stack_sequences([sequences[i] for i in group])
        labels = np.concatenate(
            [label_index[offsets[i] : offsets[i + 1]] for i in group]
        ).astype(np.int64)
        chunks.append(Chunk(
            X_c, chunk_offsets, labels, chunk_seed,
            sequence_ids=np.asarray(group, dtype=np.int64),
        ))
    return chunks


def _chunks_fingerprint(chunks):
    """A digest of SAGA's items: every chunk's features, labels, sequence
    boundaries and Monte Carlo seed. A stored SAGA state belongs to them."""
    digest = hashlib.blake2b(digest_size=16)
    for chunk in chunks:
        digest.update(_sequence_fingerprint(chunk.X).to_bytes(8, "little"))
        for part in (chunk.offsets, chunk.labels):
            digest.update(np.ascontiguousarray(part, dtype=np.int64).tobytes())
            digest.update(b"|")
        digest.update(repr((chunk.seed.entropy, chunk.seed.spawn_key)).encode())
    return digest.hexdigest()


class _NoiseBudget:
    """Which of SAGA's stored gradients keep their base samples.

    An item's new record replaces its previous one, so the bytes kept are
    those of each item's latest admitted record; a record is admitted while
    their sum stays within ``limit``.
    """

    def __init__(self, limit):
        self.limit, self.kept, self.total = limit, {}, 0

    def admit(self, item, nbytes):
        """Whether ``item``'s new record of ``nbytes`` of noise may keep it."""
        self.total -= self.kept.pop(item, 0)
        if self.total + nbytes > self.limit:
            return False
        self.kept[item] = nbytes
        self.total += nbytes
        return True


def _sequence_fingerprint(X_n):
    """A 64-bit integer determined by a sequence's feature values, whatever
    their storage: dense or sparse in any format, stored zeros or not (see
    :func:`_sequence_digest`)."""
    return int.from_bytes(_sequence_digest(X_n), "little")


def _sequence_digest(X_n, size=8, key=b""):
    """A blake2b digest of ``size`` bytes (keyed by ``key``) of a sequence's
    feature values, hashed in one canonical form: the CSR arrays of the
    nonzero float64 values, row by row, columns sorted."""
    if sp.issparse(X_n):
        # Copies where they change anything: the caller's matrix (maybe in
        # another thread of predict_marginals) is never changed. Cancelling
        # duplicates leave zeros, removed after the sum.
        X_n = without_stored_zeros(canonical_csr(X_n))
        indptr, indices, data = X_n.indptr, X_n.indices, X_n.data
    else:  # the same arrays without building a matrix (many short sequences)
        X_n = np.asarray(X_n, dtype=np.float64)
        nonzero = X_n != 0
        indices = np.nonzero(nonzero)[1]  # row-major: sorted within rows
        indptr = np.concatenate([[0], np.cumsum(nonzero.sum(axis=1))])
        data = X_n[nonzero]
    return _csr_digest(indptr, indices, data, X_n.shape, size, key)


def _csr_digest(indptr, indices, data, shape, size=8, key=b""):
    """:func:`_sequence_digest` of the canonical CSR arrays given."""
    digest = hashlib.blake2b(digest_size=size, key=key)
    for part, dtype in ((indptr, np.int64), (indices, np.int64), (data, np.float64)):
        digest.update(np.ascontiguousarray(part, dtype=dtype).tobytes())
    digest.update(str(shape).encode())
    return digest.digest()


def _chunk_digests(X_c, offsets, size=8, key=b""):
    """:func:`_sequence_digest` of every sequence of a stacked chunk
    (canonical CSR without stored zeros, or dense), from slices of its
    arrays: no matrix per sequence."""
    if not sp.issparse(X_c):
        return [
            _sequence_digest(X_c[t0:t1], size, key)
            for t0, t1 in zip(offsets[:-1], offsets[1:], strict=True)
        ]
    indptr, indices, data = X_c.indptr, X_c.indices, X_c.data
    out = []
    for t0, t1 in zip(offsets[:-1], offsets[1:], strict=True):
        a, b = indptr[t0], indptr[t1]
        out.append(_csr_digest(
            indptr[t0 : t1 + 1] - a, indices[a:b], data[a:b],
            (int(t1 - t0), int(X_c.shape[1])),  # as a shape prints: no np.int64
            size, key,
        ))
    return out


class _DigestSeed(ISeedSequence):
    """A hash digest as a bit generator's seed: its words are the state.

    ``np.random.default_rng([seed, fingerprint])`` mixes its entropy
    through a SeedSequence first, which cost about as much as hashing the
    sequence (17 to 39 us per sequence against 4 to 8 for PCG64 seeded
    here, timed with ``timeit`` on basenp's sentences); a keyed blake2b
    digest of the sequence is already uniformly distributed.
    """

    def __init__(self, digest):
        self.digest = digest

    def generate_state(self, n_words, dtype=np.uint32):
        dtype = np.dtype(dtype)
        if dtype not in (np.dtype(np.uint32), np.dtype(np.uint64)):
            # (as SeedSequence.generate_state)
            raise ValueError(f"only uint32 and uint64 are supported, got {dtype}")
        words = np.frombuffer(self.digest, dtype=dtype.newbyteorder("<"))
        if n_words > words.size:
            raise ValueError(
                f"a digest of {len(self.digest)} bytes holds {words.size} "
                f"words of {dtype}, {n_words} asked for"
            )
        return words[:n_words].astype(dtype)


def _sequence_generators(X_c, offsets, seed):
    """One generator per sequence of a stacked chunk, seeded by ``seed`` and
    the sequence's own feature values: its draws do not depend on the other
    sequences, their order, or the storage of its features."""
    key = int(seed).to_bytes(8, "little")
    return [
        np.random.Generator(np.random.PCG64(_DigestSeed(digest)))
        for digest in _chunk_digests(X_c, offsets, 32, key)
    ]


def _largest_magnitude(X):
    """``max |x|`` over a dense or sparse matrix (0 when it is empty)."""
    values = X.data if sp.issparse(X) else X
    return float(np.max(np.abs(values))) if values.size else 0.0


def _check_option(estimator, name):
    """Raise unless the parameter ``name`` is one of its ``_OPTIONS``."""
    value, accepted = getattr(estimator, name), _OPTIONS[name]
    if not isinstance(value, str) or value not in accepted:
        raise ValueError(f"{name} must be one of {list(accepted)}, got {value!r}")


def _check_integer(estimator, name, low):
    """Raise unless the parameter ``name`` is an integer of at least ``low``."""
    check_integer(getattr(estimator, name), name, low)


def _check_flag(estimator, name):
    """Raise unless the parameter ``name`` is True or False."""
    check_flag(getattr(estimator, name), name)


#: A learned hyperparameter within this distance (log space) of a bound of
#: its range is reported: the box saturates there and stops it.
BOUND_WARNING_DISTANCE = 0.01
#: The range of a learned pairwise prior variance.
PAIRWISE_PRIOR_VARIANCE_RANGE = (1e-4, 1e4)
#: A fresh batch fit starts a bounded coordinate (log hyperparameters) at
#: least this far inside its range (at most a quarter of its width in): the
#: smooth box's slope at a distance d from a bound is about d, and a start
#: on the bound (moved 1e-8 inside) never moved (variance=0.5 with bounds
#: (0.5, 100) stayed at 0.5; from 0.6 the fit learned 2.43). A warm start
#: continues where the fit it continues ended.
START_MARGIN = 0.1


def _warn_at_bounds(kernel, pairwise_prior_variance=None):
    """ConvergenceWarning (as scikit-learn's GP estimators give) for learned
    kernel hyperparameters (``kernel``, unless None) and a learned pairwise
    prior variance (unless None) that ended at a bound of their range. Fits
    of the benchmarks' data end 6 or more log units inside."""
    at = []
    learned = [] if kernel is None else list(zip(
        kernel.hyperparameter_names, kernel.theta, kernel.bounds, strict=True
    ))
    if pairwise_prior_variance is not None:
        learned.append((
            "pairwise_prior_variance", np.log(pairwise_prior_variance),
            np.log(PAIRWISE_PRIOR_VARIANCE_RANGE),
        ))
    advice = set()
    for name, value, (low, high) in learned:
        for bound, side in ((low, "lower"), (high, "upper")):
            if abs(value - bound) < BOUND_WARNING_DISTANCE:
                at.append(f"{name} = {np.exp(value):.3g} (its {side} bound)")
                advice.add(
                    "The pairwise prior variance's range is fixed (give it "
                    "with learn_hyperparameters=False to go beyond)"
                    if name == "pairwise_prior_variance" else
                    "The features may be on a scale the initial kernel does "
                    "not suit (standardise them, e.g. with StandardScaler), or "
                    "the bounds may need widening (give a kernel with other "
                    "bounds)"
                )
    if at:
        warnings.warn(
            "learned hyperparameters ended at a bound of their range: "
            + ", ".join(at[:5]) + (" ..." if len(at) > 5 else "")
            + ". " + "; ".join(sorted(advice)),
            ConvergenceWarning,
            stacklevel=outside_stacklevel(),
        )


#: Features whose shared offset (the mean token's squared norm) is this many
#: times their spread around it (squared norms) are reported under a linear
#: kernel object (used as given).
OFFSET_RATIO = 10.0
#: Under a linear kernel object, features whose potentials' prior variance
#: starts below this are reported (make_sequences scaled by 0.01, 4.6e-4,
#: gave a fit that ignored the features; by 0.03, 4.1e-3, fitted).
SMALL_PRIOR_VARIANCE = 1e-3
#: An RBF kernel object whose length scale is this many times below (or
#: above) the median distance between distinct training tokens warns: with
#: RBFKernel(length_scale=1e-2) on make_sequences' features (median
#: distance about 3) a fit predicted the majority label, silently.
LENGTH_SCALE_WARNING_RATIO = 100.0
#: kernel="linear" on features whose mean squared token norm reaches this
#: starts as on small features (half the prior variance on the offsets,
#: the variances' range moved with their start); from 1 to this, the
#: variances start at 1 / (mean_sq + 1) in the default range (1e-5, 1e5),
#: as the benchmarks' fits had them.
LARGE_MEAN_SQ = 1e3
#: The range of the largest feature magnitude a fit accepts (see
#: _check_feature_magnitudes), inside single precision's normal range.
FEATURE_MAGNITUDES = (1e-32, 1e32)


#: Of sparse features, the columns active at more than this share of the
#: training tokens are centred under the kernels that centre dense features
#: (see GPStructClassifier._feature_mean).
DENSE_COLUMN_SHARE = 0.5


def _with_new_columns(inducing, X, q_mu, q_sqrt):
    """``(inducing, q_mu, q_sqrt)`` covering the columns of ``X`` (a continued
    fit's data) active outside the inducing features' columns too, their
    variables at the whitened prior (mean 0, covariance I): the posterior
    the model implied for them. Unchanged when there are none (or the
    inducing variables are not features of some columns)."""
    if type(inducing) is not InducingFeatures or inducing.columns is None:
        return inducing, q_mu, q_sqrt
    new = inducing.prior_columns(X)
    if new.size == 0:
        return inducing, q_mu, q_sqrt
    columns = np.union1d(inducing.columns, new)
    grown = InducingFeatures(inducing.n_design_features, columns=columns)
    # Old variables at their new places; the bias stays last.
    place = np.append(np.searchsorted(columns, inducing.columns), columns.size)
    K, V, M = q_mu.shape[0], q_mu.shape[1], grown.n_inducing
    if q_sqrt.ndim == 4 and M > _MAX_FULL_FEATURES:
        raise ValueError(
            f"covariance='full' with inducing='features': this data activates "
            f"{new.size} features the model has no variable for, which would "
            f"make its factor ({M} x {M}) per label (M must be <= "
            f"{_MAX_FULL_FEATURES}); fit afresh with covariance='diag' or "
            "inducing points"
        )
    mu = np.zeros((K, V, M))
    mu[..., place] = q_mu
    if q_sqrt.ndim == 3:
        sqrt = np.ones((K, V, M))
        sqrt[..., place] = q_sqrt
    else:
        # Lower-triangular factors: the new variables independent of the
        # others, so the factor keeps its entries and gets 1 on their
        # diagonal (order-preserving placement keeps it triangular).
        sqrt = np.broadcast_to(np.eye(M), (K, V, M, M)).copy()
        sqrt[..., place[:, None], place[None, :]] = q_sqrt
    return grown, mu, sqrt


def _with_prior_columns(params, X, state, X_prior, prior_scales):
    """A sampling design with more columns whose weights are at their prior.

    ``X`` (n_tokens, M - 1), ``state`` (its feature scales, then the
    bias's) and ``params`` (diagonal covariances) are a design of inducing
    features and its posterior; the columns of the CSR ``X_prior`` (scales
    ``prior_scales``) are inserted before the bias with the whitened prior
    (mean 0, standard deviation 1).

    Returns
    -------
    params, X, state
    """
    E = X_prior.shape[1]
    X = hstack_csr([canonical_csr(X), canonical_csr(X_prior)])
    state = np.concatenate([state[:-1], prior_scales, state[-1:]])
    K, V, _ = params.q_mu.shape
    out = [
        np.concatenate([a[..., :-1], np.full((K, V, E), fill), a[..., -1:]], axis=-1)
        for a, fill in ((params.q_mu, 0.0), (params.q_sqrt, 1.0))
    ]
    return dataclasses.replace(params, q_mu=out[0], q_sqrt=out[1]), X, state


def _add_prior_weights(unary, weighted, rng):
    """Add to a sequence's unary samples (K, S, T, V), in place, those of
    weights at their prior: ``weighted`` (T, E) CSR holds the tokens'
    values times the weights' prior standard deviations; one standard
    normal weight per active column, label, component and sample, drawn
    from ``rng`` in antithetic pairs of samples, as the rest of the
    samples (:func:`~skgpstruct.inference.terms.antithetic_normal`)."""
    columns = np.unique(weighted.indices)
    if columns.size == 0:
        return
    K, S, T, V = unary.shape
    z = antithetic_normal(rng, (columns.size, K, S, V), 2)
    z = z.reshape(columns.size, K * S * V)
    f = np.asarray(weighted[:, columns] @ z).reshape(T, K, S, V)
    unary += f.transpose(1, 2, 0, 3)


def _centred(X, mean, columns=None):
    """``X - mean``: dense for dense ``X``, or for sparse ``X`` when every
    column is centred (continuing a fit on dense features); otherwise CSR,
    the columns with a nonzero mean filled in, the others as they were.

    ``columns``: ``np.flatnonzero(mean)`` when the caller has it. Nothing
    else here is as long as the design is wide: 2**20 hashed columns of
    which a few are centred cost their stored entries.
    """
    if not sp.issparse(X):
        return X - mean
    if columns is None:
        columns = np.flatnonzero(mean)
    if columns.size == X.shape[1]:
        return X.toarray() - mean
    if columns.size == 0:
        return X
    X = canonical_csr(X)
    in_centred, position = entries_in_columns(X, columns)
    filled = np.empty((X.shape[0], columns.size))  # (n_tokens, n_centred)
    filled[:] = -mean[columns]
    entry_rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    filled[entry_rows[in_centred], position[in_centred]] += X.data[in_centred]
    kept = X.copy()
    kept.data[in_centred] = 0.0
    rows, which = np.nonzero(filled)
    centred = kept + sp.csr_matrix(
        (filled[rows, which], (rows, columns[which])), shape=X.shape
    )
    return without_stored_zeros(canonical_csr(centred))


def _is_rbf(kernel):
    """Whether ``kernel`` (a name or an object) is skgpstruct's RBF kernel."""
    return isinstance(kernel, RBFKernel) or (
        isinstance(kernel, str) and kernel == "rbf"
    )


def _offset_and_spread(X_all):
    """``(offset, spread, column)`` of the training tokens: the mean token's
    squared norm, the mean squared distance of the tokens from it and the
    column contributing most to the offset.

    The spread is summed from the deviations themselves, not as the mean
    squared norm minus the offset, which loses it to cancellation far from
    the origin. Sparse input stays sparse: a column's absent entries each
    deviate by its mean.
    """
    n = X_all.shape[0]
    with np.errstate(over="ignore", invalid="ignore"):
        mean = np.asarray(X_all.mean(axis=0), dtype=np.float64).ravel()
        squares = mean * mean
        offset = float(np.sum(squares))
        if sp.issparse(X_all):
            X = canonical_csr(X_all)
            stored = np.bincount(X.indices, minlength=X.shape[1])
            deviations = X.data - mean[X.indices]
            total = float(deviations @ deviations) + float((n - stored) @ squares)
        else:
            deviations = X_all - mean
            total = float(np.einsum("ij,ij->", deviations, deviations))
    column = int(np.argmax(squares)) if squares.size else 0
    return offset, total / n, column


#: Features whose median squared norm reaches this many times the spread of
#: the tokens divided by the rounding unit are refused under an RBF kernel:
#: distances from inner products (||x||^2 + ||z||^2 - 2 x.z) then carry
#: rounding errors above 1e-3 of the squared distances between tokens.
#: Uncentred, make_sequences' features moved by 1e7 (as CSR) failed in the
#: Cholesky factor of the inducing inputs' kernel, with advice about the
#: hyperparameters, and a column of 1.7e9 at every token fitted one label;
#: since the centring of _feature_mean, continued fits on data far from the
#: first fit's are what is left.
RBF_ROUNDING_RATIO = 1e-3


def _check_rbf_distances(X_all, continuing=False):
    """Refuse, naming X, features too far from the origin for an RBF
    kernel's distances (computed from inner products).

    A first fit centres dense features and the sparse columns active at
    most tokens (_feature_mean): only large columns active at few tokens
    are left, which spread the tokens as much as they move them. A
    continued fit (``continuing``) centres new data by the first fit's
    mean, which may not suit it.
    """
    # The typical token's squared norm: a rare large value at a few tokens
    # only blurs the distances to those tokens, by less than they are.
    typical = float(np.median(_row_sq_norms(X_all)))
    _, spread, column = _offset_and_spread(X_all)
    if np.finfo(np.float64).eps * typical > RBF_ROUNDING_RATIO * spread:
        remedy = (
            "a continued fit (warm_start, partial_fit) keeps the coordinates "
            "of the fit it continues (centred by its feature_mean_, or as "
            "given when that is None), and these features lie far from that "
            "fit's: give features near its own, or fit a new model on them"
            if continuing else
            f"scale down the large columns (column {column} contributes most "
            "to the mean token)"
        )
        raise ValueError(
            "X's features lie too far from the origin for an RBF kernel: the "
            f"median squared norm of a token, {typical:.3g}, makes the "
            "rounding errors of distances computed from inner products over "
            f"{RBF_ROUNDING_RATIO:g} of the tokens' squared distances from "
            f"their mean ({spread:.3g} on average), and the kernel cannot tell "
            f"the tokens apart: {remedy}"
        )


def _warn_linear_kernel_object(X_all, kernel):
    """UserWarnings for features a linear kernel given as an object (used as
    given) does not suit, where fits learned to ignore the features and
    predicted one label: a shared offset (its diagonal posterior ties every
    weight to it), or features too small for the kernel's start."""
    if not isinstance(kernel, LinearKernel | GroupedLinearKernel):
        return
    sparse = sp.issparse(X_all)
    offset, spread, column = _offset_and_spread(X_all)
    start = float(np.max(kernel.variance)) * (offset + spread)
    kind = "sparse" if sparse else "dense"
    if np.isfinite(start) and start < SMALL_PRIOR_VARIANCE:
        scaler = "StandardScaler(with_mean=False)" if sparse else "StandardScaler"
        warnings.warn(
            f"X's {kind} features are small for the linear kernel given as an "
            "object: a token's potential starts with a prior standard "
            f"deviation of {np.sqrt(start):.3g} from them (the fit may learn "
            f"to ignore the features): standardise them ({scaler}), "
            "start the kernel's variance higher, or pass kernel='linear', "
            "which adapts to their scale",
            UserWarning,
            stacklevel=outside_stacklevel(),
        )
    if np.isfinite(offset) and offset > OFFSET_RATIO * max(spread, 0.0):
        remedy = (
            f"scale down the columns shared by most tokens (column {column} "
            "contributes most; a constant column is not needed: the kernel has "
            "its own bias), or pass kernel='linear', which centres the columns "
            "active at most tokens" if sparse else
            "centre them (StandardScaler), or pass kernel='linear', which "
            "centres dense features"
        )
        warnings.warn(
            f"X's {kind} features share an offset (the mean token's squared "
            f"norm, {offset:.3g}, is over {OFFSET_RATIO:g} times their "
            f"spread around it, {spread:.3g}). A linear kernel given as an "
            "object uses the features as given: the offset then correlates "
            "every weight with it, which a diagonal posterior cannot express "
            "(and inference='ess' fits lose accuracy too), and the fit may "
            f"learn to ignore the features: {remedy}",
            UserWarning,
            stacklevel=outside_stacklevel(),
        )


def _check_feature_magnitudes(X_all):
    """Refuse, naming X, features whose largest magnitude lies outside
    FEATURE_MAGNITUDES (all zero excepted).

    The fit samples in single precision (range about 1e-38 to 3e38): values
    beyond it were flushed to zero or to inf there (a fit failed with
    advice to scale large features down for values of 1e-40), and tokens
    of 1e-170 gave squared norms of zero, a fit that ignored the features
    without a word. Small values beside larger ones are harmless.
    """
    largest = _largest_magnitude(X_all)
    low, high = FEATURE_MAGNITUDES
    if largest != 0.0 and not low <= largest <= high:
        raise ValueError(
            f"X's largest magnitude must lie within {low:g} and {high:g}, got "
            f"{largest:.3g} (the fit samples in single precision): rescale the "
            "features, e.g. with StandardScaler"
        )


def _warn_rbf_kernel_object(X_all, kernel):
    """A UserWarning for an RBF kernel given as an object whose length scale
    is far from the distances between the training tokens: the kernel then
    sees all tokens alike or all apart, and fits learned to ignore the
    features (the length scale did not move from 1e-2). Per-feature length
    scales (ARD) are judged by the median distance in length scales."""
    if not isinstance(kernel, RBFKernel):
        return
    length_scale = np.asarray(kernel.length_scale, dtype=np.float64)
    if kernel.anisotropic:
        scaled = (
            X_all.multiply(1.0 / length_scale).tocsr() if sp.issparse(X_all)
            else X_all / length_scale
        )
        in_scales = _median_distance(scaled)
    else:
        distance = _median_distance(X_all)
        in_scales = distance / float(length_scale)
    ratio = max(in_scales, 1.0 / in_scales)
    if ratio <= LENGTH_SCALE_WARNING_RATIO:
        return
    seen = "apart" if in_scales > 1 else "alike"
    if kernel.anisotropic:
        found = (
            "per-feature length scales under which the median distance between "
            f"distinct training tokens is {in_scales:.3g} length scales"
        )
        advice = (
            "start the length scales near the features' spreads, or pass "
            "kernel='rbf'"
        )
    else:
        found = (
            f"length_scale {float(length_scale):.3g}, {ratio:.3g} times "
            f"{'below' if in_scales > 1 else 'above'} the median distance "
            f"between distinct training tokens ({distance:.3g})"
        )
        advice = (
            "start the length scale near that distance, or pass kernel='rbf', "
            "which does"
        )
    warnings.warn(
        f"the RBF kernel given as an object has {found}: the kernel sees the "
        f"tokens all {seen} and the fit may learn to ignore the features: "
        + advice,
        UserWarning,
        stacklevel=outside_stacklevel(),
    )


def _check_potentials(unary, pairwise, offsets, X_c, kind):
    """Refuse, naming X, potentials the chain cannot take (not finite, or
    paths beyond the chain's magnitude limit): X far off the training
    data's scale. Returns them as the chain's kernels take them
    (C-contiguous float64), so that the decoders need not check again."""
    # One pass: the largest magnitude is NaN or inf if any value is.
    unary_magnitude = np.abs(unary).max(initial=0.0)
    pairwise_magnitude = np.abs(pairwise).max(initial=0.0)
    if not (
        np.isfinite(unary_magnitude)
        and chain._fits_path_limit(unary_magnitude, pairwise_magnitude, offsets)
    ):
        raise ValueError(
            f"X's values are too large for the fitted model: its {kind} "
            "potentials overflow (largest |x| in this part of X = "
            f"{_largest_magnitude(X_c):.3g}); give features on the scale of "
            "the training data"
        )
    return (
        np.ascontiguousarray(unary, dtype=np.float64),
        np.ascontiguousarray(pairwise, dtype=np.float64),
    )


#: Most training tokens the median-distance start of ``kernel="rbf"`` reads.
MEDIAN_DISTANCE_TOKENS = 1000


def _largest_prior_sd(X_all, kernel):
    """The largest prior standard deviation of a training token's potential
    (inf or NaN when the kernel's values overflow)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.sqrt(np.max(kernel.diag(X_all))))


def _check_prior_scale(X_all, kernel):
    """Refuse, naming the kernel, a prior under which a training token's
    potential has a standard deviation beyond the largest feature magnitude
    accepted (FEATURE_MAGNITUDES): the potentials are sampled in single
    precision. (With a variance of 1e100 every mode failed with another
    cause, or, with the score estimator, fitted a model that could not
    predict.)"""
    prior_sd = _largest_prior_sd(X_all, kernel)
    if not prior_sd <= FEATURE_MAGNITUDES[1]:
        raise ValueError(
            f"the kernel's prior gives a training token's potential a standard "
            f"deviation of {prior_sd:.3g}, beyond {FEATURE_MAGNITUDES[1]:g} (the "
            f"potentials are sampled in single precision): give {kernel!r} a "
            "smaller variance"
        )


def _check_score_size(lengths, n_components, n_classes):
    """Refuse, naming gradient='score', a longest sequence whose dense
    arrays would exceed SCORE_MEMORY_BYTES."""
    longest = max(lengths)
    needed = SCORE_SQUARE_ARRAYS * 8 * n_components * n_classes * longest**2
    if needed > SCORE_MEMORY_BYTES:
        raise ValueError(
            "gradient='score' works with a dense covariance of every sequence's "
            "latent values (n_components x n_classes x T x T doubles, and its "
            f"factors: time in T**3): the longest sequence, {longest} tokens, "
            f"would need about {needed / 2**30:.3g} GiB, over its limit of "
            f"{SCORE_MEMORY_BYTES / 2**30:g} GiB. Split long sequences, or use "
            "gradient='pathwise' (memory and time linear in T) with a "
            "likelihood that has a gradient"
        )


def _median_distance(X_all):
    """Median Euclidean distance between distinct training tokens (at most
    ``MEDIAN_DISTANCE_TOKENS`` of them, evenly spaced: no random numbers
    drawn), or 1 when every token is the same.

    Repeated tokens are left out before the distances: the distance between
    two equal rows, computed from inner products, is rounding noise (1e-8
    rather than 0), and a token repeated over most of the data made it the
    median.
    """
    distinct = distinct_rows(X_all)
    n = distinct.size
    rows = distinct[
        np.unique(np.linspace(0, n - 1, min(n, MEDIAN_DISTANCE_TOKENS)).astype(int))
    ]
    d2 = _checked_sq_distances(_sq_distances(X_all[rows], None))
    d2 = d2[np.triu_indices(len(rows), 1)]
    d2 = d2[d2 > 0]  # distinct rows so close that rounding made them equal
    return float(np.sqrt(np.median(d2))) if d2.size else 1.0


def _one_entry_per_sequence(sequences):
    """A 1-D object array holding the arrays of ``sequences`` (filled entry
    by entry: ``np.array`` would make equal-length sequences a 2-D array)."""
    out = np.empty(len(sequences), dtype=object)
    for i, sequence in enumerate(sequences):
        out[i] = sequence
    return out


def _sample_blocks(lengths, K, S, V):
    """How :meth:`GPStructClassifier.predict_marginals` samples a chunk.

    Yields ``(n0, n1, block)``: sequences ``n0:n1`` are sampled together,
    ``block`` of the ``S`` samples at a time. Consecutive sequences are
    sampled together, all samples at once, while their samples of the
    potentials take at most ``PREDICT_SAMPLE_BYTES``. A sequence whose
    samples alone take more is sampled on its own, in blocks sized by its
    length alone, so that its random numbers (drawn block after block from
    its own generator) do not depend on the rest of the chunk. Blocks hold
    an even number of samples (at least two), so that every antithetic
    pair is drawn in one block: a pair of samples may exceed the budget.
    """
    run_bytes = 8 * K * V * S * np.asarray(lengths, dtype=np.int64)
    n0, held = 0, 0
    for n, size in enumerate(run_bytes):
        if held + size <= PREDICT_SAMPLE_BYTES:
            held += size
            continue
        if n > n0:
            yield n0, n, S
        if size > PREDICT_SAMPLE_BYTES:
            block = int(PREDICT_SAMPLE_BYTES * S // size)
            yield n, n + 1, max(2, block - block % 2)
            n0, held = n + 1, 0
        else:
            n0, held = n, size
    if len(run_bytes) > n0:
        yield n0, len(run_bytes), S


class GPStructClassifier(BaseEstimator):
    """Sequence labelling with a Gaussian-process CRF and variational inference.

    A linear-chain CRF whose unary potentials are Gaussian-process functions
    of the token features (one latent function per label) and whose pairwise
    potentials are Gaussian, fitted by sparse variational inference with
    inducing points ("gray-box inference for structured Gaussian process
    models", Galliani et al.). Kernel hyperparameters are learned by
    maximising the evidence lower bound, so no cross-validation is needed to
    set the regularisation.

    Parameters
    ----------
    kernel : {"linear", "rbf"} or Kernel or sklearn GP kernel, default="linear"
        Covariance of the unary latent functions, shared by all labels. A
        scikit-learn ``gaussian_process.kernels`` object is accepted for
        dense features. For ``"linear"`` the initial variance is set so that
        the prior standard deviation of a training token's potential is 1
        (with small or large features, a mean squared norm below 1 or from
        1e3, half of its variance on the features and half on the labels'
        offsets, the variances' bounds moved with their start: the same
        model at any such scale); for
        ``"rbf"`` the length scale starts at the median distance between
        distinct training tokens, its bounds moved with it. Under both, and
        under an :class:`~skgpstruct.kernels.RBFKernel` object, features are
        centred on their training mean (``feature_mean_``; of sparse
        features, the columns active at most tokens). Other kernel objects
        are used as given, on the features as given.
    n_inducing : int, default=500
        Number of inducing inputs, chosen among distinct training tokens
        (capped at their number).
    n_components : int, default=1
        Mixture components K of the posterior over inducing variables.
    covariance : {"full", "diag"}, default="diag"
        Full (lower-triangular factor) or diagonal posterior covariances.
        With ``inducing="auto"``, ``"full"`` also changes the inducing
        variables: ``n_inducing`` k-means++ inducing points instead of every
        feature's weight (whose full covariance would be an M x M matrix
        per label), an approximation that is slower and, on the CRF++ sets,
        less accurate than the default.
    likelihood : {"crf", "pseudo"}, Likelihood or callable, default="crf"
        The sequence likelihood: ``"crf"`` the exact linear chain, ``"pseudo"``
        Sutton and McCallum's piecewise pseudo-likelihood over the chain's
        unary and transition factors taken separately
        (:class:`~skgpstruct.likelihoods.PiecewisePseudoLikelihood`: the
        unaries are fitted as independent per-token softmaxes, the
        transitions to the label bigrams alone; O(V) per token instead of
        O(V^2), but less accurate than ``"crf"`` on most dev splits), a
        :class:`~skgpstruct.likelihoods.Likelihood`, or a plain function
        ``log_lik(unary, pairwise, y) -> (n_samples,)`` giving ``log p(y | f)``
        of one sequence (it then needs ``gradient="score"``, and must be
        picklable when ``n_jobs != 1``). Prediction always uses the chain
        (see ``decode``).
    gradient : {"pathwise", "score"}, default="pathwise"
        Monte Carlo gradient estimator: reparameterisation (needs the
        likelihood's gradient) or the score-function estimator with each
        sample's baseline the mean of the others' (a leave-one-out control
        variate; needs only ``log p(y | f)``). The score estimator works
        with each sequence's dense covariance: memory in ``T**2`` and time
        in ``T**3`` for a sequence of ``T`` tokens (pathwise: linear), and
        refuses sequences whose arrays would exceed 2 GiB (above about
        4,200 tokens with 3 labels).
    optimizer : {"lbfgs", "stochastic"}, default="lbfgs"
        ``"lbfgs"``: L-BFGS on the fixed-sample objective (batch mode).
        ``"stochastic"``: SAGA over mini-batches of ``batch_size`` sequences
        with fresh Monte Carlo samples at every step (the stored gradient of
        every mini-batch and their running sum are updated incrementally),
        the exact gradient of the KL terms and of the hyperprior
        (``hyperprior_scale``), and Adam-scaled steps of size
        ``learning_rate / sqrt(epoch)`` (half that for the kernel and
        pairwise-prior hyperparameters). ``max_iter`` then counts epochs, and
        the fit stops after ``n_iter_no_change`` epochs whose ELBO estimate
        does not beat the best epoch so far by ``tol * max(|best|, 1)``
        (relative, but absolute below 1: so for the per-token held-out
        score of ``early_stopping``). The
        estimate is kept as SAGA keeps its gradients: the last value of
        every mini-batch's expected log-likelihood, summed, minus the KL
        terms at the epoch's end. The posterior returned is the average of
        the epochs' end points, weighted exponentially over about five
        epochs (with ``early_stopping``: the best held-out epoch's).
    n_samples : int, default=8
        Monte Carlo samples per sequence (and component) in the ELBO. The
        score estimator needs more than the pathwise one (16 or more).
    max_iter : int, default=300
        Maximum number of L-BFGS iterations (epochs with
        ``optimizer="stochastic"``).
    batch_size : int, default=10
        Sequences per mini-batch (``optimizer="stochastic"`` and
        ``partial_fit``).
    learning_rate : float, default=0.1
        Initial step size of the stochastic optimiser. On the dev splits
        (before 757c9b3, when basenp's and chunking's overlapped section 2's
        data; mini-batches of 2), 0.1 matched or beat 0.05 on all four
        CRF++ sets. Steps so large that the gradient overflows
        stop the fit with a ValueError naming it.
    n_iter_no_change : int, default=5
        Epochs without improvement before the stochastic optimiser stops
        (an epoch's ELBO estimate is noisy: keep this above 2 or 3).
        On small data sets, whose epochs are a few steps, a larger value
        (15) was more accurate on the dev splits at about three times the
        fit time (user guide, "Choosing the optimiser").
    early_stopping : bool, default=False
        ``optimizer="stochastic"`` only (ignored by ``partial_fit``): hold out
        ``validation_fraction`` of the training sequences and stop on their
        expected log-likelihood under the posterior (the held-out part of
        the ELBO, estimated with fixed samples) instead of the training
        ELBO's trend; the posterior of the best epoch is kept. Held out
        from the optimisation only: their features (not their labels) count
        in ``feature_mean_``, the initial kernel and the choice of inducing
        points, as every training sequence's does. The split is the same in
        a warm-started fit with an integer ``random_state`` (and the same
        data), a new one with a Generator or None.
    validation_fraction : float, default=0.1
        Fraction of the training sequences held out when
        ``early_stopping=True`` (at least one sequence).
    tol : float, default=1e-5
        Relative change of the ELBO under which the optimisation stops:
        ``|change| / max(|ELBO|, 1)`` over an L-BFGS iteration (or a
        gradient entry below it); for the stochastic optimiser see
        ``optimizer``. On
        the dev splits before 757c9b3 (basenp, chunking, JapaneseNE) 1e-5
        gave the error of 1e-6 in about half the time, and 1e-4 was 0.1 to
        0.7 points worse on basenp, chunking and seg; on the dev splits
        since (off every benchmark's data) 1e-5 was the lowest of the three
        on basenp and within a token of 1e-4 on chunking
        (:doc:`/benchmark_history`, "Dev splits off the benchmark data").
        A ``tol`` at the ELBO's rounding (about 1e-15 and below) is out of
        L-BFGS's reach: such a fit ends when no step lowers the objective
        any more, with a ConvergenceWarning that its line search failed.
    decode : {"viterbi", "marginal"}, default="viterbi"
        ``predict`` runs Viterbi on the posterior mean potentials, or takes
        the per-token argmax of :meth:`predict_marginals`. Both decode with
        the linear chain on the unaries and the transitions the likelihood
        names (:meth:`~skgpstruct.likelihoods.Likelihood.decoding_pairwise`:
        the fitted ones, or for ``likelihood="pseudo"`` the pointwise mutual
        information of the label pairs they describe).
    learn_hyperparameters : bool, default=True
        Optimise the kernel hyperparameters and the pairwise prior variance
        with the ELBO; False freezes them. A batch fit starts one given on
        (or within 0.1 in log) of a bound of its range 0.1 inside it (on
        the bound it would not move). With ``inference="ess"`` the
        sampler's prior takes those of a variational fit of the same
        estimator (True) or their initial values (False).
    hyperprior_scale : float or None, default=3.0
        With ``learn_hyperparameters``: the standard deviation of a Gaussian
        prior on the log of each kernel hyperparameter (a log-normal prior
        on the variances), centred at its initial value; the fit maximises
        the ELBO plus this prior's log density (MAP-II). None: the ELBO
        alone (type-II maximum likelihood, as in the paper). Without a prior
        the ELBO switches many CRF++ templates off (on dev splits a sixth
        to three fifths of them end 100 to 10,000 times below their start);
        3.0 (a factor of 20 per standard deviation) had the lowest mean
        error on the dev splits (before and since 757c9b3), and cut the Table 1
        batch fits' iterations by a quarter to two fifths (user guide,
        "Learning the hyperparameters").
    pairwise_prior_variance : float, default=1.0
        Prior variance of every pairwise potential; its starting value when
        ``learn_hyperparameters`` is True (it is then learned from the ELBO,
        like the kernel hyperparameters, in the range (1e-4, 1e4), and a
        start outside it is refused).
    inducing : {"auto", "features", "kmeans++", "random"}, default="auto"
        The inducing variables. ``"features"`` (linear kernels, or any kernel
        with an explicit diagonal feature map) takes the weight of every
        feature as an inducing variable: exact, and
        cheap for sparse indicator features (M = the number of features
        active at a training token + 1, the ``n_inducing`` parameter is
        then unused; the weights of a feature no training token has keep
        their prior, which ``predict_marginals`` samples, so hashed
        features cost what their active columns cost). ``"kmeans++"`` and
        ``"random"`` draw ``n_inducing`` inducing inputs among the distinct
        training tokens (k-means++ seeding in the kernel's feature space, or
        uniformly). ``"auto"`` is ``"features"`` for the linear kernel with
        diagonal covariances and ``"kmeans++"`` otherwise.
    collapse_lone_features : bool, default=True
        With inducing features and diagonal covariances: the features active
        at a single training token (most of a CRF++ template's features)
        enter the fit as one inducing variable per such token and label,
        whose posterior is that of the sum of their weights, instead of one
        per feature and label (:class:`~skgpstruct.inference.inducing.\
CollapsedFeatures`). The posterior family is richer than the mean-field
        one it replaces (the bound is at least as tight), and the fit has 38
        to 47 % of the parameters on the CRF++ sets. After the fit every
        feature has its marginal posterior, so ``q_mu_`` and ``q_sqrt_``
        keep one entry per feature (active at a training token), and
        ``predict_marginals`` samples the collapsed posterior itself (see
        :doc:`/design`, "Lone features collapsed"). Not applied by
        ``partial_fit`` (a collapsed variable belongs to one training
        token, and the next piece has other tokens), nor by stochastic fits
        with ``warm_start=True`` (SAGA's state, which the next such fit
        continues, is kept per feature). False keeps one variable per
        feature and label.
    n_predict_samples : int, default=16
        Posterior samples averaged by :meth:`predict_marginals`, drawn in
        antithetic pairs (a draw of the potentials and its reflection about
        their posterior mean; an odd number ends with one unpaired draw).
        On the Table 1 folds 16 paired draws estimate the marginals about
        as accurately as 32 independent ones, in 0.47 to 0.75 times their
        time on larger test sets (:doc:`/benchmarks`, "Antithetic draws in
        predict_marginals"). Not used after an ``inference="ess"`` fit,
        whose marginals average over its kept samples.
    pairwise_uncertainty : bool, default=False
        Whether :meth:`predict_marginals` (and ``decode="marginal"``) also
        averages over the posterior spread of the pairwise potentials
        (True), or takes them at their posterior mean and averages over the
        unary potentials only (False). The mean-field spread of the
        transitions, fitted on a few Monte Carlo draws shared by all
        sequences, is too wide: on the dev splits of the four CRF++ sets
        (benchmarks/dev_splits.py) the fully averaged marginals were
        underconfident on the sets with many labels (chunking, JapaneseNE:
        mean top-label probability 0.877 and 0.922 against accuracies of
        0.911 and 0.955, ECE 0.036 and 0.034), and with the transitions at
        their mean they were not (0.910 and 0.955, ECE 0.011), with a lower
        NLL; on basenp and seg the two were the same within 0.005 ECE
        (user guide, "Reading predict_marginals").
        ``predict`` with Viterbi always uses the mean. Ignored with
        ``inference="ess"``, whose marginals average over the sampler's
        kept draws of both.
    feature_groups : "auto", None or array-like of int of shape (n_features,), \
            default="auto"
        With ``kernel="linear"``, give every group of columns its own prior
        variance, learned from the ELBO (:class:`~skgpstruct.kernels.\
GroupedLinearKernel`: automatic relevance determination per group).
        ``"auto"`` takes the groups from ``X.feature_groups`` when ``X`` has
        them (the output of :class:`~skgpstruct.CRFppTemplateVectorizer`
        groups columns by template), else one variance for all; None always
        uses one variance. Group ids are labels: the learned
        ``kernel_.variance`` has one value per distinct id, in the order of
        ``kernel_.group_ids``. Ignored for other kernels.
    inference : {"variational", "ess"}, default="variational"
        ``"variational"``: the sparse variational method above. ``"ess"``:
        the original GPstruct sampler, elliptical slice sampling of the unary
        values of all training tokens and the pairwise potentials under the
        full GP prior, with the kernel hyperparameters and the pairwise prior
        variance a variational fit learns first (``learn_hyperparameters``;
        False: their initial values, as GPstruct); O(N^2) memory, refused
        beyond ``ess_memory_limit`` before any fit).
    ess_n_iter : int, default=10000
        ESS iterations (``inference="ess"``).
    ess_burn_in : int or None, default=None
        Iterations discarded first; None discards half. ``ess_burn_in +
        ess_thin`` must be at most ``ess_n_iter`` (at least one sample kept).
    ess_thin : int, default=10
        Keep one sample in ``ess_thin`` after burn-in.
    ess_memory_limit : int, default=4 GiB
        Bytes the Gram matrix, its factor, the kept samples and the
        sampler's draw buffers may take; larger training sets are refused
        before anything is allocated.
    n_jobs : int or None, default=None
        Workers for the per-sequence terms (joblib semantics: None means 1
        unless in a ``joblib.parallel_config`` context, -1 all cores).
        Threads by default (the chunk terms release the GIL); a backend from
        joblib's context takes precedence, e.g. ``parallel_config("loky")``
        for processes or ``parallel_config("dask")`` for a cluster.
        ``predict_marginals`` samples its chunks of sequences in as many
        threads, whatever the context's backend. The result does not depend
        on ``n_jobs``.
    random_state : int, RandomState instance, Generator or None, default=None
        Seeds inducing-point choice and Monte Carlo samples. The same seed
        gives the same model for any ``n_jobs`` and backend. A RandomState
        or Generator is drawn from at every fit (so refits differ), as
        scikit-learn's estimators do with a RandomState.
    verbose : int or bool, default=0
        If positive (or True), print one progress line per iteration.
    warm_start : bool, default=False
        Start from the previous fit's inducing points, hyperparameters and
        posterior (same classes and features required): ``kernel``,
        ``n_inducing``, ``inducing``, ``feature_groups`` and
        ``pairwise_prior_variance`` set since are not used (the fitted
        ``kernel_``, ``inducing_`` and ``pairwise_prior_variance_`` are).
        A batch fit on the same training data with lone features collapsed
        (``collapse_lone_features``) continues from the collapsed posterior
        it fitted; on other data, from every feature's fitted marginal. A
        stochastic fit also continues SAGA's stored gradients when its
        mini-batches are the previous fit's (same data and
        ``random_state``), with Adam's moments (the step size schedule
        starts again, from the averaged posterior the previous fit
        returned), and starts them
        afresh otherwise; they are kept after a stochastic fit only with
        ``warm_start=True`` (they can take more memory than the posterior).
        Not available with ``inference="ess"``, nor after an ESS fit (there
        is no variational posterior to continue; the error says how to
        start from its hyperparameters).

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        Labels seen in ``fit``, sorted; columns of :meth:`predict_marginals`.
    n_features_in_ : int
    feature_mean_ : ndarray of shape (n_features,) or None
        The mean subtracted from the features before the kernel (at fit and
        at prediction) when ``kernel`` is ``"linear"`` or ``"rbf"`` by name,
        or an :class:`~skgpstruct.kernels.RBFKernel` object: the training
        tokens' mean of dense features; of sparse features, of the columns
        active at more than half of the training tokens (0 for the other
        columns; None when there is no such column). None under other
        kernel objects (features used as given). Under ``"linear"`` a
        shared offset in the features would otherwise tie every weight to
        the offset, which the diagonal posterior cannot express (on
        features moved by 10, or beside a sparse column of 100 at every
        token, the fit learned to ignore them and predicted one label);
        centred, the model has the same linear functions, the offset's
        prior on the mean token. An RBF kernel is the same model at any
        offset; centred, its distances keep their precision. ``kernel_``,
        ``inducing_points_`` and the posterior are in these coordinates.
    inducing_ : InducingPoints or InducingFeatures
        The inducing variables: inducing inputs among the training tokens,
        or (linear kernel, ``inducing="features"``) the weights of the
        features active at a training token (``inducing_.columns``, None
        when that is every column; the posterior of the others is their
        prior).
    inducing_points_ : ndarray or CSR matrix of shape (M, n_features) or None
        The inducing inputs (training tokens, minus ``feature_mean_`` when
        it is not None); None with inducing features.
    kernel_ : Kernel
        The kernel with its learned hyperparameters.
    q_mu_ : ndarray of shape (K, n_classes, M)
        Means of the whitened inducing variables.
    q_sqrt_ : ndarray of shape (K, n_classes, M, M) or (K, n_classes, M)
        Cholesky factors (full) or standard deviations (diag).
    weights_ : ndarray of shape (K,)
        Mixture weights.
    pairwise_mean_ : ndarray of shape (n_classes, n_classes)
        Posterior mean of the transition potentials (from row to column).
    pairwise_std_ : ndarray of shape (n_classes, n_classes)
    pairwise_prior_variance_ : float
        The (learned) prior variance of the pairwise potentials.
    elbo_history_ : list of float
        The objective after every iteration: the ELBO (of the collapsed
        posterior when the lone features were collapsed: a bound at least
        as tight) plus, with ``hyperprior_scale``, the hyperprior's log
        density without its constant (0 at the initial hyperparameters).
        With ``optimizer="stochastic"``, one entry per epoch: the estimate
        its stopping rule compares (see ``optimizer``; with
        ``early_stopping`` the rule compares ``validation_score_history_``),
        from fresh Monte Carlo samples, so not exactly comparable with a
        batch fit's. With
        ``gradient="score"``, after every round's step: the importance-
        weighted estimate on the samples drawn at the round's start.
    n_iter_ : int
        Iterations (L-BFGS), epochs (stochastic) or ESS iterations of the
        last call only: a warm-started fit counts its own, each
        ``partial_fit`` call its one epoch (``elbo_history_`` holds them
        all).
    ess_ : ESSPosterior
        Only with ``inference="ess"``: the kept samples (the variational
        attributes ``q_mu_`` etc. are then absent).
    log_likelihood_history_ : list of float
        Only with ``inference="ess"``: the training log-likelihood after
        every iteration.
    saga_memory_bytes_ : int
        Only after ``optimizer="stochastic"`` or ``partial_fit``: bytes held
        by SAGA's stored gradients at the end of the fit (kept per
        mini-batch in the space of its tokens' potentials, so they grow with
        the number of training tokens, not with the number of inducing
        variables), with the Monte Carlo base samples they keep during the
        fit (inducing features only; at most 256 MB).
    validation_score_history_ : list of float
        Only after ``optimizer="stochastic"`` with ``early_stopping=True``:
        the held-out expected log-likelihood per token after every epoch. A
        warm-started fit appends its epochs, as to ``elbo_history_``, when
        the fit it continues held sequences out too (the same ones only with
        an integer ``random_state``: see ``early_stopping``); otherwise the
        list covers its own epochs, the last ``n_iter_`` of
        ``elbo_history_``.

    Notes
    -----
    The estimator is deliberately not tagged as a scikit-learn *classifier*:
    for classifiers, ``cross_val_score(..., cv=5)`` and ``GridSearchCV`` use
    stratified folds, which are undefined for lists of label sequences. Left
    untagged, an integer ``cv`` gives ``KFold`` over whole sequences, which
    is what sequence labelling needs. ``score`` is token accuracy.

    Prediction keeps what it derives from the fitted posterior alone (the
    weights of the posterior mean; with lone features collapsed, the
    posterior it samples), about the size of the fitted parameters again,
    once computed: not pickled, dropped by the next fit. It is found again
    when a fitted attribute is replaced (``model.q_mu_ = ...``), not when
    one is changed in place: replace fitted arrays, do not write into them.

    Examples
    --------
    >>> from skgpstruct import GPStructClassifier
    >>> from skgpstruct.datasets import make_sequences
    >>> X, y = make_sequences(n_sequences=30, random_state=0)
    >>> clf = GPStructClassifier(max_iter=100, tol=1e-4, random_state=0)
    >>> clf = clf.fit(X, y)
    >>> clf.score(X, y) > 0.9
    True
    >>> [p.shape for p in clf.predict_marginals(X[:2])] == [
    ...     (len(X[0]), len(clf.classes_)), (len(X[1]), len(clf.classes_))]
    True
    """

    def __init__(
        self,
        kernel="linear",
        *,
        n_inducing=500,
        n_components=1,
        covariance="diag",
        likelihood="crf",
        gradient="pathwise",
        optimizer="lbfgs",
        n_samples=8,
        max_iter=300,
        batch_size=10,
        learning_rate=0.1,
        n_iter_no_change=5,
        early_stopping=False,
        validation_fraction=0.1,
        tol=1e-5,
        decode="viterbi",
        learn_hyperparameters=True,
        hyperprior_scale=3.0,
        pairwise_prior_variance=1.0,
        inducing="auto",
        collapse_lone_features=True,
        n_predict_samples=16,
        pairwise_uncertainty=False,
        feature_groups="auto",
        inference="variational",
        ess_n_iter=10000,
        ess_burn_in=None,
        ess_thin=10,
        ess_memory_limit=DEFAULT_MEMORY_LIMIT,
        n_jobs=None,
        random_state=None,
        verbose=0,
        warm_start=False,
    ):
        self.kernel = kernel
        self.n_inducing = n_inducing
        self.n_components = n_components
        self.covariance = covariance
        self.likelihood = likelihood
        self.gradient = gradient
        self.optimizer = optimizer
        self.n_samples = n_samples
        self.max_iter = max_iter
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.n_iter_no_change = n_iter_no_change
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.tol = tol
        self.decode = decode
        self.learn_hyperparameters = learn_hyperparameters
        self.hyperprior_scale = hyperprior_scale
        self.pairwise_prior_variance = pairwise_prior_variance
        self.inducing = inducing
        self.collapse_lone_features = collapse_lone_features
        self.n_predict_samples = n_predict_samples
        self.pairwise_uncertainty = pairwise_uncertainty
        self.feature_groups = feature_groups
        self.inference = inference
        self.ess_n_iter = ess_n_iter
        self.ess_burn_in = ess_burn_in
        self.ess_thin = ess_thin
        self.ess_memory_limit = ess_memory_limit
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.verbose = verbose
        self.warm_start = warm_start

    # ------------------------------------------------------------------ #
    # validation
    def _check_prediction_params(self):
        """The parameters prediction reads, which may be set after ``fit``."""
        _check_option(self, "decode")
        _check_integer(self, "n_predict_samples", 1)
        _check_flag(self, "pairwise_uncertainty")
        check_n_jobs(self.n_jobs)

    def _check_params(self, partial=False):
        """Check the parameters (``partial``: for :meth:`partial_fit`); return
        the likelihood."""
        for name in _OPTIONS:
            _check_option(self, name)
        for name, low in (
            ("n_inducing", 1),
            ("n_components", 1),
            ("n_samples", 1),
            ("max_iter", 1),
            ("n_predict_samples", 1),
            ("batch_size", 1),
            ("n_iter_no_change", 1),
            ("ess_n_iter", 1),
            ("ess_thin", 1),
            ("ess_memory_limit", 1),
        ):
            _check_integer(self, name, low)
        if self.ess_burn_in is not None and (
            not is_integer(self.ess_burn_in) or self.ess_burn_in < 0
        ):
            raise ValueError(
                "ess_burn_in must be None or an integer >= 0, got "
                f"{self.ess_burn_in!r}"
            )
        if self.inference == "ess":
            # The sampler's own rule, named by the estimator's parameters.
            check_chain_length(
                self.ess_n_iter, self.ess_burn_in, self.ess_thin, prefix="ess_"
            )
        for name in (
            "learn_hyperparameters", "warm_start", "early_stopping",
            "pairwise_uncertainty", "collapse_lone_features",
        ):
            _check_flag(self, name)
        if self.gradient == "score" and self.n_samples < 2:
            # Each sample's baseline is the mean of the others: one sample
            # has none (with its own value as baseline, the data's gradient
            # was exactly zero: the fit learned nothing and "converged").
            raise ValueError(
                "gradient='score' needs n_samples >= 2 (16 or more "
                f"recommended), got n_samples={self.n_samples}"
            )
        if not isinstance(self.verbose, (bool, np.bool_)):  # True: as 1
            _check_integer(self, "verbose", 0)
        check_n_jobs(self.n_jobs)
        for name in ("tol", "pairwise_prior_variance", "learning_rate"):
            value = getattr(self, name)
            if not is_real(value) or not 0 < value < np.inf:
                raise ValueError(
                    f"{name} must be a positive finite number, got {value!r}"
                )
        low, high = PAIRWISE_PRIOR_VARIANCE_RANGE
        value = self.pairwise_prior_variance
        # (A warm fit starts from pairwise_prior_variance_. A learned value
        # on a bound may lie outside by rounding, 1e4 * (1 + 1e-15); a start
        # on a bound begins START_MARGIN inside.)
        if (
            self.learn_hyperparameters and not self._continues(partial)
            and not low * (1 - 1e-9) <= value <= high * (1 + 1e-9)
        ):
            # It was clipped into the range and ended on its bound.
            raise ValueError(
                f"pairwise_prior_variance must lie in [{low:g}, {high:g}], the "
                "range it is learned in, when learn_hyperparameters=True; got "
                f"{value!r}"
            )
        scale = self.hyperprior_scale
        # (from below about 1e-154 its inverse square overflows)
        if scale is not None and (not is_real(scale) or not 1e-150 <= scale < np.inf):
            raise ValueError(
                f"hyperprior_scale must be None or a positive finite number "
                f"of at least 1e-150, got {scale!r}"
            )
        fraction = self.validation_fraction
        if not isinstance(fraction, numbers.Real) or not 0 < fraction < 1:
            raise ValueError(
                f"validation_fraction must be a number in (0, 1), got {fraction!r}"
            )
        if self.inference == "ess" and self.warm_start:
            # On every fit, not only on a refit: whether a parameter is
            # accepted does not depend on the estimator's history.
            raise ValueError(
                "warm_start=True is not available with inference='ess' (each "
                "ESS fit samples afresh); set warm_start=False"
            )
        likelihood = get_likelihood(self.likelihood)
        # (inference='ess' refuses every likelihood but the chain's, below)
        saga = self.inference != "ess" and (partial or self.optimizer == "stochastic")
        what = "partial_fit" if partial else "optimizer='stochastic'"
        if saga and not likelihood.has_gradient:
            raise ValueError(
                f"{what} runs SAGA with the pathwise estimator, which needs "
                f"a likelihood with a gradient; {likelihood!r} provides "
                "only log p(y | f), whose score estimator "
                "(gradient='score') is available with fit and "
                "optimizer='lbfgs' only"
            )
        if saga and self.gradient == "score":
            raise ValueError(
                f"{what} runs SAGA with the pathwise estimator: "
                "gradient='score' is available with fit and optimizer='lbfgs' "
                "only; use gradient='pathwise'"
            )
        if not likelihood.has_gradient and self.inference != "ess":
            if self.gradient == "pathwise":
                raise ValueError(
                    f"gradient='pathwise' needs a likelihood with a gradient; "
                    f"{likelihood!r} provides only log p(y | f): use "
                    "gradient='score'"
                )
        return likelihood

    def _rng(self):
        return check_random_state_seed(self.random_state)

    def _continues(self, partial):
        """Whether this fit continues a variational fit (``warm_start`` or
        ``partial_fit``, a posterior to continue)."""
        return (self.warm_start or partial) and hasattr(self, "q_mu_")

    # ------------------------------------------------------------------ #
    # fitting
    def fit(self, X, y):
        """Fit the variational posterior and the kernel hyperparameters.

        Parameters
        ----------
        X : list of array-like or sparse matrices of shape (T_n, n_features)
            Features of every token of every sequence: real, finite numbers,
            dense or sparse (any scipy format; all sequences one kind).
            Zero-length sequences are allowed, as long as some token is left.
        y : list of array-like of shape (T_n,)
            Labels (strings or integers) of every token.

        Returns
        -------
        self : GPStructClassifier

        Raises
        ------
        ValueError
            Naming the argument and what is accepted, for: a parameter out
            of its range; ``X`` and ``y`` of different numbers of sequences
            or tokens; a single 2-D array instead of a list; NaN, infinite,
            complex or string features, or features whose largest
            magnitude lies outside [1e-32, 1e32] (the fit samples in single
            precision);
            a malformed sparse matrix (indices out of range, decreasing
            index pointers); dense and sparse sequences mixed; sequences of
            different widths, or with no feature; no token at all; labels of
            several types (strings and numbers: NumPy would turn the numbers
            into strings) or of types that cannot be ordered; NaN labels.
            Also, naming the cause: a kernel whose prior gives a training
            token's potential a standard deviation beyond 1e32; under an RBF
            kernel, features too far from the origin for its distances
            (after centring; a continued fit's data far from its first
            fit's); with ``gradient="score"``, a sequence whose dense
            arrays would exceed 2 GiB.

        Notes
        -----
        Sparse sequences are read by their values: explicitly stored zeros
        are dropped (on a copy), so any storage of the same values gives the
        same model.

        A fit that fails (an error above, a diverging stochastic fit, an
        interrupt) leaves a fitted estimator as it was before the call.
        """
        return self._fit(X, y)

    def partial_fit(self, X, y, classes=None):
        """One stochastic epoch on (X, y), continuing from the current posterior.

        For data that arrives in pieces: the first call starts from the prior
        (and needs ``classes``, since a piece may not show every label); later
        calls continue from the posterior, kernel and inducing variables of
        the previous one, and centre their pieces as the first call did
        (``feature_mean_``: the first piece decides which columns of sparse
        features are centred, those active at most of its tokens). Always
        uses the SAGA optimiser, whatever ``optimizer`` says: one epoch, a
        step on each mini-batch of ``batch_size`` sequences of this piece
        once, in a random order. Each call starts SAGA afresh: its stored
        gradients, Adam's moments and its step size (``learning_rate``)
        belong to the call, so the posterior after a call is that epoch's
        last point and keeps moving by about ``learning_rate`` per
        coordinate from call to call; lower ``learning_rate`` for a model
        that should settle (see the user guide, "Choosing the
        optimiser"). Not available with ``inference="ess"``,
        nor after an ESS fit (no variational posterior to continue). A call
        that fails leaves the estimator as it was.

        Parameters
        ----------
        X : list of array-like or sparse matrices of shape (T_n, n_features)
        y : list of array-like of shape (T_n,)
        classes : array-like of shape (n_classes,), default=None
            All labels that will ever be seen; required on the first call.
            Later calls use ``classes_`` (a piece may show only some of the
            labels, none outside them); if given again, it must equal it.

        Returns
        -------
        self : GPStructClassifier
        """
        if self.inference == "ess":
            raise ValueError("partial_fit is not available with inference='ess'")
        return self._fit(X, y, classes=classes, partial=True)

    def _fit(self, X, y, classes=None, partial=False):
        """Fit, or leave the estimator as it was if the fit fails.

        A refit that raises (bad data, a diverging SAGA, an interrupt) keeps
        the previous model whole, not a mix of old and new attributes
        (nothing the fit reads is changed in place: SAGA continues a copy
        of its stored state).
        """
        # (without the centring cache, which the fit drops to free it)
        before = {k: v for k, v in self.__dict__.items() if k not in _CACHES}
        try:
            return self._fit_or_fail(X, y, classes, partial)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(before)
            raise

    def _fit_or_fail(self, X, y, classes, partial):
        likelihood = self._check_params(partial=partial)
        if (self.warm_start or partial) and hasattr(self, "ess_"):
            # Not silently a fresh fit.
            caller = "partial_fit" if partial else "warm_start=True"
            raise ValueError(
                f"{caller} continues a variational fit, but the previous fit "
                "was inference='ess' (posterior samples, no variational "
                "posterior to continue). To start from its hyperparameters, "
                "set kernel=<the fit's kernel_> and pairwise_prior_variance="
                "<its pairwise_prior_variance_> and fit with warm_start=False"
                + (" (or call partial_fit on a clone)" if partial else "")
            )
        if partial and classes is None:
            if not hasattr(self, "q_mu_"):
                raise ValueError(
                    "classes must be given on the first call to partial_fit (a "
                    "piece of data may not contain every label)"
                )
            # Later pieces may show only some of the labels.
            classes = self.classes_
        # (found again from the fit's own results; the old ones' can be large)
        for name in _CACHES:
            self.__dict__.pop(name, None)
        optimizer = "stochastic" if partial else self.optimizer
        max_iter = 1 if partial else self.max_iter
        sequences, is_sparse = check_sequence_features(X)
        lengths = [s.shape[0] for s in sequences]
        labels = check_sequence_labels(y, lengths)
        if sum(lengths) == 0:
            raise ValueError("X has no tokens: every sequence has length 0")
        # Empty label arrays would promote integer labels to float.
        all_labels = np.concatenate([lab for lab in labels if lab.size])
        try:
            if classes is None:
                classes, label_index = np.unique(all_labels, return_inverse=True)
            else:
                kinds = (label_kinds(classes), label_kinds(all_labels))
                if kinds[0] and (len(kinds[0]) > 1 or kinds[0] != kinds[1]):
                    raise ValueError(
                        f"classes and y must hold labels of one type; got "
                        f"{', '.join(sorted(kinds[0]))} labels in classes and "
                        f"{', '.join(sorted(kinds[1]))} labels in y"
                    )
                classes = np.asarray(classes)
                if classes.ndim != 1 or classes.size == 0:
                    raise ValueError(
                        "classes must be a non-empty 1-D array of labels, got "
                        f"an array of shape {classes.shape}"
                    )
                classes = np.unique(classes)
                label_index = np.searchsorted(classes, all_labels)
                label_index = np.minimum(label_index, len(classes) - 1)
                unknown = classes[label_index] != all_labels
                if np.any(unknown):
                    raise ValueError(
                        f"y has labels not in classes: "
                        f"{sorted(set(all_labels[unknown].tolist()))[:5]}"
                    )
        except TypeError:
            raise ValueError(
                "y mixes label types that cannot be ordered (for example "
                "strings and integers); give all labels as one type"
            ) from None
        if len(classes) < 2:
            where = "y and classes hold" if partial else "y holds"
            raise ValueError(
                f"{where} a single label ({classes.tolist()[0]!r}); a tagger "
                "needs at least two labels to tell apart (check which column "
                "of the data the labels were read from)"
            )
        X_all, offsets = stack_sequences(sequences)
        n_features = X_all.shape[1]
        if n_features == 0:
            raise ValueError(
                "X has 0 features per token; at least one is required (a "
                "feature extractor may have kept none, e.g. with a high min_count)"
            )
        _check_feature_magnitudes(X_all)
        self._groups = self._check_feature_groups(X, n_features)
        feature_mean = self._feature_mean(X_all, is_sparse, partial)
        if feature_mean is not None:
            X_all = _centred(X_all, feature_mean)
            is_sparse = sp.issparse(X_all)
            sequences = split_by_offsets(X_all, offsets)
        warm = self._continues(partial)
        if _is_rbf(self.kernel_ if warm else self.kernel):
            _check_rbf_distances(X_all, warm)
        rng = self._rng()
        if partial and warm:
            # Keyed by the epochs run so far: with an integer random_state
            # every call re-seeds, and passes over the same pieces drew the
            # same samples (SAGA's steps, which key them, restart per call).
            rng = np.random.default_rng(
                [int(rng.integers(2**63)), len(self.elbo_history_)]
            )
        if self.inference == "ess":
            with reuse_blocks():
                self._fit_ess(
                    X, y, X_all, offsets, classes, label_index, is_sparse, rng,
                    likelihood,
                )
            self.feature_mean_ = feature_mean
            return self

        # The draws only a fresh fit makes (inducing points, the starting
        # posterior) come from a child generator: the stream read after
        # them (chunk seeds, mini-batches, the held-out split) is then the
        # same for a fresh fit and for the warm fits that continue it.
        setup_rng = rng.spawn(1)[0]
        if self.gradient == "score":
            _check_score_size(lengths, self.n_components, len(classes))
        if warm:
            previous = {
                "classes": (self.classes_, classes),
                "number of features": (self.n_features_in_, n_features),
                "covariance": (
                    "full" if self.q_sqrt_.ndim == 4 else "diag", self.covariance
                ),
                "n_components": (self.q_mu_.shape[0], self.n_components),
            }
            changed = [
                f"{name} {new!r} (was {old!r})"
                for name, (old, new) in previous.items()
                if not np.array_equal(old, new)
            ]
            if changed:
                caller = "partial_fit" if partial else "warm_start=True"
                raise ValueError(
                    f"{caller} needs the same classes, number of features, "
                    "covariance and n_components as the previous fit; got "
                    + ", ".join(changed)
                )
        if warm:
            kernel, inducing = self.kernel_, self.inducing_
            # Equal, but of the first fit's type (classes=[0., 1.] after
            # integer labels made predict return floats).
            classes = self.classes_
            params = VariationalParameters(
                self.q_mu_, self.q_sqrt_, self.weights_,
                self.pairwise_mean_, self.pairwise_std_,
            ).copy()
            # Columns this data activates that the model had no variable for
            # join it at their prior.
            inducing, params.q_mu, params.q_sqrt = _with_new_columns(
                inducing, X_all, params.q_mu, params.q_sqrt
            )
        else:
            kernel = self._checked_initial_kernel(X_all, is_sparse)
            inducing = self._make_inducing(X_all, kernel, setup_rng)
        # Inducing features cover the columns active at a training token.
        X_fit = inducing.select(X_all)
        if X_fit is not X_all:
            sequences = split_by_offsets(X_fit, offsets)
        # The fit's own inducing variables: the lone features collapsed, or
        # the same as the model's.
        fit_inducing = inducing
        if self._collapses(inducing, optimizer, partial):
            collapsed = CollapsedFeatures.of(X_fit, original=inducing)
            if collapsed is not None:
                fit_inducing = collapsed
                sequences = split_by_offsets(collapsed.transform(X_fit), offsets)
        if warm:
            if fit_inducing is not inducing:
                stored = getattr(self, "_collapsed", None)
                if stored is not None and stored[0] == fit_inducing:
                    # The same training design: continue from the fitted
                    # collapsed posterior itself (collapsing its expanded
                    # marginals keeps each variable's marginal, not the
                    # posterior, and the ELBO would start lower).
                    params.q_mu, params.q_sqrt = stored[1].copy(), stored[2].copy()
                else:
                    params.q_mu, params.q_sqrt = fit_inducing.collapse(
                        params.q_mu, params.q_sqrt, kernel
                    )
        else:
            params = self._initial_parameters(
                len(classes), fit_inducing.n_inducing, setup_rng
            )

        n_classes = len(classes)
        n_theta = len(kernel.theta) if self.learn_hyperparameters else 0
        layout = ParameterLayout(
            self.n_components, n_classes, fit_inducing.n_inducing,
            self.covariance == "full", n_theta,
            learn_pairwise_prior=bool(self.learn_hyperparameters),
        )
        prior_variance = (
            self.pairwise_prior_variance_ if warm
            else float(self.pairwise_prior_variance)
        )
        x0 = layout.pack(params, kernel.theta if n_theta else None, prior_variance)

        seed = np.random.SeedSequence(int(rng.integers(2**63)))
        validation_groups = []
        if optimizer == "stochastic":
            # SAGA items: mini-batches of batch_size sequences, in an order
            # shuffled once per fit.
            order = rng.permutation(len(lengths))
            if self.early_stopping and not partial:
                order, validation_groups = self._validation_split(order, lengths)
            groups = [
                order[i : i + self.batch_size]
                for i in range(0, len(order), self.batch_size)
            ]
        else:
            groups = [
                np.arange(sl.start, sl.stop)
                for sl in chunk_slices(lengths, CHUNK_TOKENS)
            ]
        chunk_seeds = seed.spawn(len(groups) + len(validation_groups))
        chunks = _make_chunks(
            sequences, offsets, label_index, groups + validation_groups,
            chunk_seeds,
        )
        for chunk in chunks:
            chunk.layout = fit_inducing.chunk_layout(
                chunk.X, chunk.offsets, compact=self.covariance == "diag"
            )
        chunks, validation_chunks = chunks[: len(groups)], chunks[len(groups) :]
        centre = self._hyperprior_centre_for(kernel, warm, X_all, is_sparse)
        objective = SparseELBO(
            chunks, fit_inducing, kernel, likelihood, layout,
            n_samples=self.n_samples,
            estimator=self.gradient,
            pairwise_prior_variance=prior_variance,
            pairwise_noise=rng.standard_normal((self.n_samples, n_classes, n_classes)),
            residual_floor=1e-8 * float(np.mean(kernel.diag(X_all))),
            hyperprior_scale=self.hyperprior_scale,
            hyperprior_center=centre,
        )
        bounds = np.full((layout.size, 2), [-np.inf, np.inf])
        if n_theta:
            bounds[layout.slices["theta"]] = kernel.bounds
        if layout.learn_pairwise_prior:
            sl = layout.slices["pairwise_log_prior_variance"]
            bounds[sl] = np.log(PAIRWISE_PRIOR_VARIANCE_RANGE)

        start = x0
        if not warm:
            low, high = bounds[:, 0], bounds[:, 1]
            margin = np.minimum(START_MARGIN, 0.25 * (high - low))
            start = np.clip(x0, low + margin, high - margin)

        timer = Timer()
        verbose = self.verbose

        def print_progress(iteration, value, x):
            print(
                f"iteration {iteration:4d}  ELBO {value:14.4f}  {timer():8.2f} s",
                file=sys.stdout,
                flush=True,
            )

        # None when silent: L-BFGS then skips mapping every iterate into the
        # box for a callback that would ignore it.
        progress = print_progress if verbose else None

        # Attributes of a previous stochastic fit must not survive this one;
        # its SAGA state only into a stochastic fit that continues it.
        self.__dict__.pop("saga_memory_bytes_", None)
        previous_scores = self.__dict__.pop("validation_score_history_", None)
        if not (optimizer == "stochastic" and warm and not partial):
            for name in ("_saga_state", "_saga_items"):
                self.__dict__.pop(name, None)
        # Threads by default: the chunk terms release the GIL (compiled
        # chain and stacked-potential kernels, scipy's sparse products,
        # NumPy on large arrays) and
        # share the chunks with no copy; a backend set with
        # joblib.parallel_config (loky, dask) takes precedence. BLAS runs on
        # one thread in this process and its worker threads during the fit,
        # as chunks do in worker processes (see _linalg.single_blas_thread):
        # the fit is then the same whatever the backend. Large temporaries
        # freed during the fit are kept for the next ones of the same size
        # (see _block_cache: fresh memory costs page faults).
        with (
            reuse_blocks(),
            single_blas_thread(),
            Parallel(n_jobs=self.n_jobs, prefer="threads") as parallel,
            _released(objective),
            _explained_start(X_all, kernel),
        ):
            if optimizer == "stochastic":
                result = self._optimize_stochastic(
                    objective, layout, x0, bounds, parallel, rng, progress,
                    max_epochs=max_iter, continue_state=warm and not partial,
                    validation_chunks=validation_chunks, one_pass=partial,
                )
            elif self.gradient == "pathwise":

                def value_and_grad(x):
                    evaluation = objective.evaluate(x, parallel)
                    return evaluation.objective, evaluation.gradient

                result = _maximize(
                    minimize_lbfgs, value_and_grad, start, bounds,
                    _PriorUnits.of(objective, layout), max_iter=self.max_iter,
                    tol=self.tol, callback=progress,
                )
            else:
                # Score estimator: each round fixes samples drawn from the
                # posterior at its start and maximises the importance-weighted
                # objective, whose exact gradient is the score estimate.
                def make_value_and_grad(round_index, reference):
                    reference = reference.copy()

                    def value_and_grad(x):
                        evaluation = objective.evaluate(
                            x, parallel, iteration_key=round_index,
                            reference=reference,
                        )
                        return evaluation.objective, evaluation.gradient

                    return value_and_grad

                result = _maximize(
                    minimize_lbfgs_rounds, make_value_and_grad, start, bounds,
                    _PriorUnits.of(objective, layout), rounds=True,
                    round_size=SCORE_ROUND_SIZE, max_iter=self.max_iter,
                    tol=self.tol, callback=progress,
                )
        if not result.converged and not partial:
            warnings.warn(
                f"GPStructClassifier did not converge in {result.n_iter} "
                f"{'epochs' if optimizer == 'stochastic' else 'iterations'} "
                f"({result.message}); increase max_iter or tol",
                ConvergenceWarning,
                stacklevel=outside_stacklevel(),
            )

        params, theta = layout.unpack(result.x)
        self.classes_ = classes
        self._fitted_likelihood = likelihood
        self.n_features_in_ = n_features
        self.feature_mean_ = feature_mean
        self.inducing_ = inducing
        self.inducing_points_ = getattr(inducing, "Z", None)
        self.kernel_ = objective.kernel_at(theta)
        self.__dict__.pop("_collapsed", None)
        if fit_inducing is not inducing:  # every feature's marginal posterior
            # predict_marginals samples the collapsed posterior itself.
            self._collapsed = (fit_inducing, params.q_mu, params.q_sqrt)
            params.q_mu, params.q_sqrt = fit_inducing.expand(
                params.q_mu, params.q_sqrt, self.kernel_
            )
        self.q_mu_ = params.q_mu
        self.q_sqrt_ = params.q_sqrt
        self.weights_ = params.weights
        self.pairwise_mean_ = params.pairwise_mean
        self.pairwise_std_ = params.pairwise_std
        self.pairwise_prior_variance_ = layout.pairwise_prior_variance(
            result.x, prior_variance
        )
        _warn_at_bounds(
            self.kernel_ if layout.n_theta else None,
            self.pairwise_prior_variance_ if layout.learn_pairwise_prior else None,
        )
        history = list(result.history)
        if warm and previous_scores and hasattr(self, "validation_score_history_"):
            # Appended as elbo_history_ is.
            self.validation_score_history_ = (
                previous_scores + self.validation_score_history_
            )
        self.elbo_history_ = (
            self.elbo_history_ + history if warm else history
        )
        self.n_iter_ = result.n_iter
        self._inducing_state = inducing.prepare(self.kernel_)
        self._hyperprior_centre = np.array(centre)
        for name in ("ess_", "log_likelihood_history_"):  # of an earlier ESS fit
            self.__dict__.pop(name, None)
        self._predict_seed = int(rng.integers(2**63))
        return self

    def _hyperprior_centre_for(self, kernel, warm, X_all, is_sparse):
        """The hyperprior's centre: the initial ``theta`` of the model's first
        fit, kept through warm starts and ``partial_fit`` calls (whose data,
        and so the data-dependent initial kernel, may differ)."""
        if not warm:
            return kernel.theta
        centre = getattr(self, "_hyperprior_centre", None)
        if centre is None:  # a model from a version that did not keep it
            centre = self._initial_kernel(X_all, is_sparse).theta
        return centre

    def _check_feature_groups(self, X, n_features):
        """The column groups to use, or None (one variance for all)."""
        spec = self.feature_groups
        if spec is None:
            return None
        if isinstance(spec, str):
            if spec != "auto":
                raise ValueError(
                    "feature_groups must be 'auto', None or an array of group "
                    f"indices, got {spec!r}"
                )
            groups = getattr(X, "feature_groups", None)
            if groups is None:
                groups = _shared_element_groups(X)
            if groups is None:
                return None
            # feature_groups='auto' took them from X: that is what is wrong.
            name = "X.feature_groups (feature_groups='auto' reads them)"
        else:
            groups, name = spec, "feature_groups"
        return check_groups(groups, name, n_features)

    def _feature_mean(self, X_all, is_sparse, partial):
        """The training mean subtracted from the features before the kernel,
        or None (features as given).

        Under the kernels by name and an :class:`RBFKernel` object, dense
        features are centred, and of sparse features the columns active at
        more than half of the training tokens (``DENSE_COLUMN_SHARE``; the
        other columns' entries are zero). Under ``"linear"`` an offset
        shared by the features (positive measurements, ``x + 10``, a column
        of 100 at every token) correlates every weight with the offset,
        which the diagonal posterior cannot express, and the fit learned to
        ignore the features (one label predicted); centred, the same linear
        functions with the offset's prior on the mean token. An RBF kernel
        is the same model at any offset, and its distances (from inner
        products) keep their precision. Centring a sparse column active at
        most tokens fills in fewer entries than it has; a column active at
        at most half of them adds no more to the offset than to the spread.
        A continued fit (``warm_start``, ``partial_fit``) keeps the
        coordinates of the fit it continues.
        """
        if self._continues(partial):
            mean = getattr(self, "feature_mean_", None)
            # Other features are refused with the other changes below.
            return mean if mean is not None and mean.size == X_all.shape[1] else None
        if not (
            isinstance(self.kernel, RBFKernel)
            or (isinstance(self.kernel, str) and self.kernel in ("linear", "rbf"))
        ):
            return None
        with np.errstate(over="ignore", invalid="ignore"):
            # Sums over the count, not scipy's sparse mean, which scales the
            # entries first: a column of ones averaged 1 - 2.5e-14, and
            # centred it stayed a column of 2.5e-14 at every token.
            mean = np.asarray(X_all.sum(axis=0), dtype=np.float64).ravel()
            mean /= X_all.shape[0]
        if is_sparse:
            active = np.bincount(canonical_csr(X_all).indices, minlength=mean.size)
            mean[active <= DENSE_COLUMN_SHARE * X_all.shape[0]] = 0.0
            if not mean.any():
                return None
        # An overflowing mean is left to the kernel's check of the squares.
        return mean if np.all(np.isfinite(mean)) else None

    def _checked_initial_kernel(self, X_all, is_sparse):
        """:meth:`_initial_kernel`, refusing a prior too wide for single
        precision, with UserWarnings when a kernel given as an object (used
        as given) does not suit the features."""
        kernel = self._initial_kernel(X_all, is_sparse)
        _check_prior_scale(X_all, kernel)
        if not isinstance(self.kernel, str):
            _warn_linear_kernel_object(X_all, kernel)
            _warn_rbf_kernel_object(X_all, kernel)
        return kernel

    def _initial_kernel(self, X_all, is_sparse):
        if isinstance(self.kernel, str) and self.kernel == "linear":
            # Prior sd of a training token's potential starts at 1. (The
            # squares do not overflow: _check_feature_magnitudes.)
            mean_sq = float(np.mean(_row_sq_norms(X_all)))
            if 1.0 <= mean_sq < LARGE_MEAN_SQ or mean_sq == 0.0:
                scale = 1.0 / (mean_sq + 1.0)
                if self._groups is not None:
                    return GroupedLinearKernel(
                        self._groups, variance=scale, bias=scale,
                        variance_bounds=(1e-5, 1e5), bias_bounds=(1e-5, 1e5),
                    )
                return LinearKernel(variance=scale, bias=1.0)
            # Features on a small or a large scale: half the prior variance
            # on them and half on the offset, as at mean_sq = 1 (where both
            # rules agree), the variances' range moved with their start and
            # the offset's prior variance kept, so that the fit is the same
            # model at any such scale. With the rule above, small features
            # would start with mean_sq / 2 of it (1e-8 at a scale of 1e-4)
            # and the fit would learn to ignore them; large ones had the
            # range clipped at 1e-5 (from mean_sq = 1e5, silently), then,
            # moved, the offsets' prior variance start at 1 / mean_sq, where
            # its gradient vanished (one-token sequences of 85 % one label
            # were predicted at 0.5).
            variance = 0.5 / mean_sq
            bounds = (1e-5 / mean_sq, 1e5 / mean_sq)
            if self._groups is not None:
                return GroupedLinearKernel(
                    self._groups, variance=variance, bias=0.5,
                    variance_bounds=bounds,
                )
            # (LinearKernel's offset variance is variance * bias.)
            return LinearKernel(
                variance=variance, bias=mean_sq, variance_bounds=bounds,
                bias_bounds=(1e-5 * mean_sq, 1e5 * mean_sq),
            )
        if isinstance(self.kernel, str) and self.kernel == "rbf":
            # The length scale starts at the median distance between distinct
            # training tokens, its range moved with it: the same fit at any scale of
            # the features (from 1, features scaled by 1e-4 or 1e3 gave a
            # kernel that saw all tokens alike or all apart, and a fit at
            # chance level).
            scale = _median_distance(X_all)
            return RBFKernel(
                length_scale=scale, length_scale_bounds=(1e-5 * scale, 1e5 * scale)
            )
        return check_kernel(self.kernel, sparse=is_sparse)

    def _fit_ess(self, X, y, X_all, offsets, classes, label_index, is_sparse, rng,
                 likelihood):
        """GPstruct: elliptical slice sampling under the full GP prior, at the
        hyperparameters a variational fit learns (``learn_hyperparameters``)
        or at their initial values."""
        if type(likelihood) is not ChainCRF:
            raise ValueError(
                "inference='ess' samples with the exact chain likelihood only; "
                f"got likelihood={self.likelihood!r}, use likelihood='crf'"
            )
        # Refuse a chain too large for memory before any fit.
        check_chain_size(
            X_all.shape[0], len(classes), self.ess_n_iter, self.ess_burn_in,
            self.ess_thin, self.ess_memory_limit,
        )
        if self.learn_hyperparameters:
            # The same estimator, variational: its kernel and pairwise prior
            # variance, learned from the ELBO, are the sampler's prior.
            learner = clone(self).set_params(inference="variational")
            learner.fit(X, y)
            kernel = learner.kernel_
            prior_variance = float(learner.pairwise_prior_variance_)
        else:
            kernel = self._checked_initial_kernel(X_all, is_sparse)
            prior_variance = float(self.pairwise_prior_variance)
        self.ess_ = sample_posterior(
            X_all, offsets, label_index.astype(np.int64), kernel, len(classes),
            pairwise_prior_variance=prior_variance,
            n_iter=self.ess_n_iter, burn_in=self.ess_burn_in, thin=self.ess_thin,
            random_state=rng, verbose=self.verbose,
            memory_limit=self.ess_memory_limit,
        )
        # Attributes of an earlier variational or stochastic fit.
        for name in ("q_mu_", "q_sqrt_", "weights_", "inducing_", "inducing_points_",
                     "elbo_history_", "pairwise_std_", "saga_memory_bytes_",
                     "validation_score_history_", "_saga_state", "_saga_items",
                     "_collapsed", "_inducing_state", "_hyperprior_centre",
                     "_predict_seed"):
            self.__dict__.pop(name, None)
        self.classes_ = classes
        self._fitted_likelihood = likelihood
        self.n_features_in_ = X_all.shape[1]
        self.kernel_ = kernel
        self.pairwise_mean_ = self.ess_.pairwise_mean
        self.pairwise_prior_variance_ = prior_variance
        self.log_likelihood_history_ = list(self.ess_.log_likelihood_trace)
        self.n_iter_ = self.ess_n_iter
        return self

    def _collapses(self, inducing, optimizer, partial):
        """Whether the fit runs with the lone features collapsed."""
        return (
            self.collapse_lone_features
            and type(inducing) is InducingFeatures
            and self.covariance == "diag"
            # A collapsed variable belongs to one training token: the next
            # partial_fit piece has other tokens. SAGA's state, which the
            # next warm stochastic fit continues, is kept per feature.
            and not partial
            and not (self.warm_start and optimizer == "stochastic")
        )

    def _make_inducing(self, X_all, kernel, rng):
        method = self.inducing
        if method == "auto":
            method = (
                "features"
                if InducingFeatures.supports(kernel) and self.covariance == "diag"
                else "kmeans++"
            )
        if method == "features":
            if not InducingFeatures.supports(kernel):
                raise ValueError(
                    "inducing='features' needs a linear kernel (an explicit "
                    f"feature map), got {kernel!r}; use inducing='kmeans++' or "
                    "'random'"
                )
            # A weight no training token reaches keeps its prior: variables
            # for the active columns only (hashed features: a few thousand
            # of 2**20), the others sampled at their prior by
            # predict_marginals.
            n_features = X_all.shape[1]
            columns = active_columns(X_all)
            M = columns.size + 1
            if self.covariance == "full" and M > _MAX_FULL_FEATURES:
                raise ValueError(
                    f"covariance='full' with inducing='features' needs a "
                    f"({M} x {M}) factor per label; use covariance='diag' or "
                    "inducing points (the number of features active at a "
                    f"training token + 1 must be <= {_MAX_FULL_FEATURES})"
                )
            return InducingFeatures(
                n_features, columns=None if columns.size == n_features else columns
            )
        chosen = select_inducing_points(X_all, kernel, self.n_inducing, method, rng)
        return InducingPoints(X_all[chosen])

    def _validation_split(self, order, lengths):
        """Hold out validation_fraction of the sequences (early stopping)."""
        n_held = int(np.ceil(self.validation_fraction * len(order)))
        if len(order) - n_held < 1:
            raise ValueError(
                f"early_stopping=True holds out {n_held} of the "
                f"{len(order)} training sequences and leaves none to fit; "
                "give more sequences or set early_stopping=False"
            )
        held, order = order[:n_held], order[n_held:]
        if sum(lengths[i] for i in held) == 0:
            raise ValueError(
                "early_stopping=True: the held-out sequences are all empty; "
                "give more (non-empty) sequences or a larger validation_fraction"
            )
        if sum(lengths[i] for i in order) == 0:
            raise ValueError(
                "early_stopping=True: the sequences left to fit are all empty "
                "(the held-out ones hold every token); give more (non-empty) "
                "sequences or a smaller validation_fraction"
            )
        validation_groups = [
            held[sl] for sl in chunk_slices([lengths[i] for i in held], CHUNK_TOKENS)
        ]
        return order, validation_groups

    def _optimize_stochastic(self, objective, layout, x0, bounds, parallel, rng,
                             progress, *, max_epochs, continue_state,
                             validation_chunks=(), one_pass=False):
        """SAGA over the mini-batches (see :mod:`skgpstruct.optim.saga`).

        Runs in this process (one mini-batch per step is too little work to
        send to joblib workers); ``parallel`` only serves the held-out score.
        With ``one_pass`` (``partial_fit``) an epoch steps on every
        mini-batch once, in a random order.
        """
        budget = _NoiseBudget(SAGA_NOISE_BYTES)

        def item(i, step, x):
            value, record, gradient = objective.evaluate_local(
                x, i, step, keep_noise=True
            )
            if record.noise is not None and not budget.admit(i, record.noise_nbytes):
                record = dataclasses.replace(record, noise=None)
            return value, record, gradient

        def expand(record, x):
            return objective.expand_local(x, record)

        def exact(x):
            kl_u, kl_bin, gradient = objective.kl_terms(x)
            log_prior = objective.add_log_hyperprior(x, gradient)
            return log_prior - (kl_u + kl_bin), gradient

        step = np.full(layout.size, float(self.learning_rate))
        for name in ("theta", "pairwise_log_prior_variance"):
            step[layout.slices[name]] *= 0.5
        validation, held_out = None, None
        if validation_chunks:
            held_out = SparseELBO(
                list(validation_chunks), objective.inducing, objective.kernel,
                objective.likelihood, layout, n_samples=objective.n_samples,
                estimator="pathwise",
                pairwise_prior_variance=objective.pairwise_prior_variance,
                pairwise_noise=objective.pairwise_noise,
                residual_floor=objective.residual_floor,
            )
            n_held_tokens = sum(c.n_tokens for c in validation_chunks)

            def validation(x):
                # Fixed samples (iteration key 0): epochs compare like with like.
                ell = held_out.evaluate(x, parallel, include_kl=False).ell
                return ell / n_held_tokens

        # A stored state is continued only on the same items (data,
        # mini-batches and seeds): another's records have other shapes. Only
        # warm starts keep or read one.
        items = (
            (_chunks_fingerprint(objective.chunks), repr(objective.likelihood))
            if self.warm_start else None
        )
        warm = None
        if continue_state and getattr(self, "_saga_items", None) == items:
            warm = getattr(self, "_saga_state", None)
        try:
            result = maximize_saga(
                item, expand, exact, x0, len(objective.chunks), step_size=step,
                max_epochs=max_epochs, tol=self.tol, bounds=bounds, rng=rng,
                n_iter_no_change=self.n_iter_no_change,
                callback=(
                    None if progress is None
                    else lambda epoch, value, seconds: progress(epoch, value, None)
                ),
                state=warm, validation=validation, shuffle=one_pass,
            )
        except SAGADiverged as exc:
            if exc.steps_taken == 0:  # at the start: not the steps' fault
                raise NonFiniteStart(str(exc)) from None
            raise ValueError(
                f"optimizer='stochastic' diverged ({exc}); learning_rate="
                f"{self.learning_rate!r} is too large for this data: lower it "
                "(the default is 0.1)"
            ) from None
        finally:
            # The held-out chunks leave the caches with the fit, as the
            # training chunks do (_released in _fit).
            if held_out is not None:
                held_out.release()
        self.saga_memory_bytes_ = result.stored_bytes
        if self.warm_start:
            # Kept for the next fit to continue. The base samples only save
            # time during a fit: the state holds the gradients alone.
            stored = result.state["stored"]
            for i, record in enumerate(stored):
                if record is not None and record.noise is not None:
                    stored[i] = dataclasses.replace(record, noise=None)
            self._saga_state, self._saga_items = result.state, items
        else:
            # No later fit reads it: not kept in the model (nor pickled).
            self.__dict__.pop("_saga_state", None)
            self.__dict__.pop("_saga_items", None)
        if validation is not None:
            self.validation_score_history_ = result.validation_history
        return OptimizationResult(
            x=result.x, value=result.history[-1], n_iter=result.n_epochs,
            converged=result.converged, message=f"{result.n_steps} SAGA steps",
            history=result.history,
        )

    def _initial_parameters(self, n_classes, n_inducing, rng):
        K, V, M = self.n_components, n_classes, n_inducing
        # Components start apart so that they do not stay identical.
        q_mu = 0.1 * rng.standard_normal((K, V, M)) if K > 1 else np.zeros((K, V, M))
        # Start at the whitened prior (KL = 0): with many inducing variables
        # any narrower start costs a huge KL and the first steps overshoot.
        if self.covariance == "full":
            q_sqrt = np.broadcast_to(np.eye(M), (K, V, M, M)).copy()
        else:
            q_sqrt = np.ones((K, V, M))
        return VariationalParameters(
            q_mu=q_mu,
            q_sqrt=q_sqrt,
            weights=np.full(K, 1.0 / K),
            pairwise_mean=np.zeros((V, V)),
            pairwise_std=np.full((V, V), 0.1),
        )

    # ------------------------------------------------------------------ #
    # prediction
    def _check_predict_input(self, X):
        check_is_fitted(self, "classes_")
        self._check_prediction_params()
        sequences, is_sparse = check_sequence_features(
            X, n_features=self.n_features_in_, allow_empty=True
        )
        # Models saved before feature_mean_ existed used features as given.
        # Sparse sequences are centred by chunk (_chunks): one by one, many
        # short ones took seconds.
        mean = getattr(self, "feature_mean_", None)
        if mean is not None and not is_sparse:
            sequences = [s - mean for s in sequences]
        return sequences

    def _params(self):
        return VariationalParameters(
            self.q_mu_, self.q_sqrt_, self.weights_,
            self.pairwise_mean_, self.pairwise_std_,
        )

    def __getstate__(self):
        # The training mean by its nonzero entries, and without the cache
        # of _centred_columns (set again from them on loading).
        state = dict(super().__getstate__())
        for name in _CACHES:
            state.pop(name, None)
        mean = state.get("feature_mean_")
        # (an index and a value per nonzero entry: smaller below half full)
        if (
            isinstance(mean, np.ndarray) and mean.ndim == 1
            and 2 * np.count_nonzero(mean) < mean.size
        ):
            state["feature_mean_"] = _PickledMean.of(mean)
        return state

    def __setstate__(self, state):
        mean = state.get("feature_mean_")
        if isinstance(mean, _PickledMean):
            state = dict(state, feature_mean_=mean.dense())
            state["_centred_columns_of"] = ((state["feature_mean_"],), mean.columns)
        super().__setstate__(state)

    def _centred_columns(self, mean):
        """``np.flatnonzero(mean)``, kept with the ``feature_mean_`` it was
        found in (not pickled): 5 ms per call over 2**20 hashed columns."""
        return self._kept("_centred_columns_of", (mean,), lambda: np.flatnonzero(mean))

    def _chunks(self, sequences):
        """(stacked X, offsets) of consecutive runs of the given sequences,
        sparse ones centred here (``feature_mean_``)."""
        lengths = [s.shape[0] for s in sequences]
        mean = getattr(self, "feature_mean_", None)
        centred_columns = None if mean is None else self._centred_columns(mean)
        for sl in chunk_slices(lengths, CHUNK_TOKENS):
            part = sequences[sl]
            if sum(s.shape[0] for s in part) == 0:
                yield sl, None, offsets_from_lengths([0] * len(part))
                continue
            if len(part) == 1:  # (checked: a float64 array or canonical CSR)
                X_c = part[0]
                offsets = np.array([0, X_c.shape[0]], dtype=np.int64)
            else:
                X_c, offsets = stack_sequences(part)
            # The fit's bound, checked once per chunk (by sequence it cost a
            # fifth of basenp's predict): both decoders then take the same X
            # (the float64 mean potentials of Viterbi took 1e200, the
            # single-precision samples of the marginals refused 1e40).
            largest = _largest_magnitude(X_c)
            if largest > FEATURE_MAGNITUDES[1]:
                raise ValueError(
                    f"X's largest magnitude must be at most "
                    f"{FEATURE_MAGNITUDES[1]:g}, as in fit, got {largest:.3g} "
                    "(the model samples in single precision): give features "
                    "on the training data's scale"
                )
            if mean is not None and sp.issparse(X_c):
                X_c = _centred(X_c, mean, centred_columns)
            yield sl, X_c, offsets

    def predict_marginals(self, X):
        """Posterior probability of every label at every token.

        Forward-backward marginals averaged over posterior samples of the
        unary potentials (``n_predict_samples`` per mixture component, in
        antithetic pairs, weighted by the mixture weights), with the
        pairwise potentials at their posterior mean or, with
        ``pairwise_uncertainty=True``, drawn from their posterior too (each
        pair of them with a pair of the unaries). A sequence whose samples
        would take more than 64 MiB is sampled and decoded a block of
        samples (an even number of them) at a time, so that memory grows
        with its length alone.

        Parameters
        ----------
        X : list of array-like or sparse matrices of shape (T_n, n_features)

        Returns
        -------
        marginals : list of ndarray of shape (T_n, n_classes)
            Rows sum to one; columns follow ``classes_``.
        """
        sequences = self._check_predict_input(X)
        if hasattr(self, "ess_"):
            return self._predict_marginals_ess(sequences)
        params = self._params()
        V = params.q_mu.shape[1]
        S = self.n_predict_samples
        # Per-sequence unary draws seeded by the sequence's own features and,
        # with pairwise_uncertainty, the same pairwise draws for every call:
        # the marginals of a sequence do not depend on the rest of the batch
        # or its order.
        pairwise = np.repeat(params.pairwise_mean[None], S, axis=0)
        if self.pairwise_uncertainty:
            pairwise += params.pairwise_std * antithetic_normal(
                np.random.default_rng(self._predict_seed), (S, V, V), 0
            )
        # Chunks in threads (with n_jobs and more than one chunk): the
        # sampling and forward-backward kernels release the GIL, and every
        # sequence's draws are its own, so the result does not depend on
        # n_jobs.
        chunks = list(self._chunks(sequences))
        decoding = self._decoding_pairwise(pairwise)
        sampling = self._sampling_posterior(params)
        with single_blas_thread():
            if len(chunks) == 1:  # (joblib's set-up would cost more than a sentence)
                (sl, X_c, offsets), = chunks
                return self._chunk_marginals(
                    sampling, decoding, sequences[sl], X_c, offsets
                )
            per_chunk = Parallel(n_jobs=self.n_jobs, backend="threading")(
                delayed(self._chunk_marginals)(
                    sampling, decoding, sequences[sl], X_c, offsets
                )
                for sl, X_c, offsets in chunks
            )
        return [piece for pieces in per_chunk for piece in pieces]

    def _chunk_marginals(self, sampling, pairwise, sequences, X_c, offsets):
        """:meth:`predict_marginals` of one chunk: a list of (T_n, V) arrays.

        ``sampling`` is :meth:`_sampling_posterior`'s; ``pairwise`` (S, V, V)
        are the transitions the chain decodes with."""
        params = sampling[0]
        K, V, _ = params.q_mu.shape
        if X_c is None:  # only zero-length sequences
            return [np.zeros((0, V)) for _ in sequences]
        rngs = _sequence_generators(X_c, offsets, self._predict_seed)
        S = len(pairwise)
        marg = np.zeros((X_c.shape[0], V))
        sampled, X_s, inducing, state, prior = self._sampling_design(sampling, X_c)
        # Runs of sequences sampled together: a long one alone, in blocks.
        for n0, n1, block in _sample_blocks(np.diff(offsets), K, S, V):
            t0, t1 = offsets[n0], offsets[n1]
            if t1 == t0:  # zero-length sequences: no token to sample
                continue
            part_offsets = offsets[n0 : n1 + 1] - t0
            # (a whole chunk is not sliced: scipy's slice of a sentence cost
            # a tenth of its prediction)
            X_part, X_s_part, prior_part = (
                (X_c, X_s, prior) if (t0, t1) == (0, X_c.shape[0]) else
                (X_c[t0:t1], X_s[t0:t1], None if prior is None else prior[t0:t1])
            )
            for s0 in range(0, S, block):
                s1 = min(S, s0 + block)
                with np.errstate(over="ignore", invalid="ignore"):  # refused below
                    unary = self._unary_samples(
                        sampled, X_s_part, part_offsets, s1 - s0, rngs[n0:n1],
                        inducing, state, prior_part,
                    )
                unary, pairwise_s = _check_potentials(
                    unary, pairwise[s0:s1], part_offsets, X_part, "sampled"
                )
                for k in range(K):
                    _, m_k, _ = chain._forward_backward(
                        unary[k], pairwise_s, part_offsets, with_marginals=True,
                        with_pairs=False,
                    )
                    marg[t0:t1] += params.weights[k] * (m_k.sum(axis=0) / S)
                del unary, m_k
        marg /= marg.sum(axis=1, keepdims=True)
        np.minimum(marg, 1.0, out=marg)  # the division can give 1 + ulp
        return split_by_offsets(marg, offsets)

    def _unary_samples(self, params, X_c, offsets, S, rngs, inducing=None,
                       state=None, prior=None):
        """Posterior samples (K, S, n_tokens, V) of a chunk's unary potentials,
        each sequence's from its own generator in ``rngs``, in antithetic
        pairs (samples ``2i`` and ``2i + 1`` mirror each other about the
        posterior mean).

        Inducing features with diagonal covariances sample in the stacked
        form (one compiled pass, a token's lone features in one draw); other
        models sequence by sequence, one draw per inducing variable. Both
        have the same distribution. ``inducing`` and ``state`` (the model's
        when None) are those of ``X_c``'s columns (see
        :meth:`_sampling_design`).
        """
        if inducing is None:
            inducing, state = self.inducing_, self._inducing_state
        K, V, _ = params.q_mu.shape
        if not params.full_covariance:
            # Numbered within the chunk's own features (compact): sampled
            # with the parameters of its support alone, so that a short chunk
            # costs its own features', not the model's (laying out every
            # parameter took 0.4 ms of a one-sentence call on basenp).
            layout = inducing.chunk_layout(X_c, offsets, compact=True)
            support = inducing.support(layout)
            stacked = inducing.stacked_projection(
                state if support is None else inducing.restrict_state(state, support),
                layout,
            )
            if stacked is not None:
                # float32 noise of the drawn rows and of the tokens
                n_noise = (stacked.split.drawn.size + X_c.shape[0]) * K * V * S
                n_seq = len(offsets) - 1
                if 4 * n_noise > PREDICT_NOISE_BYTES and n_seq > 1:
                    # Halve the chunk: a sequence's samples do not depend on
                    # the others, so the result is the same.
                    half = n_seq // 2
                    t = offsets[half]
                    unary = np.empty((K, S, X_c.shape[0], V))
                    unary[:, :, :t] = self._unary_samples(
                        params, X_c[:t], offsets[: half + 1], S, rngs[:half],
                        inducing, state,
                    )
                    unary[:, :, t:] = self._unary_samples(
                        params, X_c[t:], offsets[half:] - t, S, rngs[half:],
                        inducing, state,
                    )
                    return unary
                if support is not None:
                    params = params.restricted(support)
                return sample_unary_stacked(
                    params, stacked, layout.row_starts, offsets, S, rngs,
                    antithetic=True,
                )
        projection = inducing.project(self.kernel_, state, X_c, offsets)
        residual_sd = np.sqrt(projection.residual)
        unary = np.empty((K, S, X_c.shape[0], V))
        for n, rng in enumerate(rngs):
            t0, t1 = offsets[n], offsets[n + 1]
            if t1 == t0:
                continue
            one = Projection(
                projection.rows[n : n + 1], projection.B[n : n + 1],
                projection.residual[t0:t1],
            )
            unary[:, :, t0:t1], _, _ = sample_unary(
                params, one, residual_sd[t0:t1], S, rng, antithetic=True
            )
            if prior is not None:
                _add_prior_weights(unary[:, :, t0:t1], prior[t0:t1], rng)
        return unary

    def _sampling_posterior(self, params):
        """``(params, state, posterior)``: the posterior ``predict_marginals``
        samples with, for every chunk's :meth:`_sampling_design`.

        The model's own (``posterior`` None), unless the fit collapsed the
        lone features: then the collapsed posterior itself
        (:meth:`CollapsedFeatures.sampling_posterior`: the per-feature
        marginals ``q_mu_``, ``q_sqrt_`` drop the lone weights'
        correlation), on the design's feature scales ``state``. That one is
        computed once per fitted posterior and kept (not pickled): it costs
        in proportion to the parameters, milliseconds on the CRF++ sets,
        which made a call on one sentence 45 times crfsuite's.
        """
        collapsed = getattr(self, "_collapsed", None)
        if collapsed is None:
            return params, self._inducing_state, None

        def compute():
            features, q_mu_c, q_sqrt_c = collapsed
            posterior = features.sampling_posterior(
                self._inducing_state, self.kernel_, (params.q_mu, params.q_sqrt),
                (q_mu_c, q_sqrt_c),
            )
            sampled = dataclasses.replace(
                params, q_mu=posterior.q_mu, q_sqrt=posterior.q_sqrt
            )
            return sampled, posterior.scales, posterior

        return self._kept(
            "_sampling_posterior_of",
            (*params.astuple(), collapsed, self.kernel_, self._inducing_state),
            compute,
        )

    def _kept(self, name, key, compute):
        """``compute()``, kept in the attribute ``name`` (one of
        ``_CACHES``) with the objects ``key`` it was computed from: given
        again while they are the same objects (compared with ``is``; the
        cache holds them, so a refit's new ones are never mistaken for
        them), computed afresh when any was replaced."""
        cached = self.__dict__.get(name)
        if cached is None or not all(
            a is b for a, b in zip(cached[0], key, strict=True)
        ):
            cached = (key, compute())
            self.__dict__[name] = cached
        return cached[1]

    def _sampling_design(self, sampling, X_c):
        """``(params, X, inducing, state, prior)`` that ``predict_marginals``
        samples a chunk's unaries with, for :meth:`_sampling_posterior`'s
        ``sampling``.

        The model's own, unless the fit collapsed the lone features: then
        the collapsed posterior, on a design of the chunk's tokens built
        for it (:meth:`CollapsedFeatures.sampling_design`). The chunk's
        columns that no training token had (no inducing variable) have their
        weights at the prior: with diagonal covariances inserted into the
        design, with full ones returned as ``prior``, the CSR (n_tokens,
        n_columns) of their values times their scales, which
        :meth:`_unary_samples` adds draws of (a full factor padded with them
        would take (M + n_columns)^2 floats per label); None when there are
        none.
        """
        params, state, posterior = sampling
        inducing = self.inducing_
        X_s = inducing.select(X_c, keep_lookup=True)
        if posterior is not None:
            X_s = self._collapsed[0].sampling_design(X_s, posterior)
            inducing = InducingFeatures(X_s.shape[1])
        columns = self.inducing_.prior_columns(X_c)
        if columns.size == 0:
            return params, X_s, inducing, state, None
        # The chunk's columns no training token had: weights at their
        # prior, sampled as the full model would.
        scales = self.inducing_.design_scales(self.kernel_, columns)[:-1]
        X_prior = (
            select_columns(canonical_csr(X_c), columns) if sp.issparse(X_c)
            else sp.csr_matrix(X_c[:, columns])
        )
        if params.full_covariance:
            return params, X_s, inducing, state, X_prior.multiply(scales).tocsr()
        params, X_s, state = _with_prior_columns(params, X_s, state, X_prior, scales)
        return params, X_s, InducingFeatures(X_s.shape[1]), state, None

    def _predict_marginals_ess(self, sequences):
        """GPstruct's prediction: marginals averaged over the kept samples of
        the conditional mean of the test unaries."""
        V = len(self.classes_)
        out = [None] * len(sequences)
        for sl, X_c, offsets in self._chunks(sequences):
            if X_c is None:
                for i in range(sl.start, sl.stop):
                    out[i] = np.zeros((0, V))
                continue
            marg = self.ess_.predict_marginals(X_c, offsets)
            pieces = split_by_offsets(marg, offsets)
            for i, piece in zip(range(sl.start, sl.stop), pieces, strict=True):
                out[i] = piece
        return out

    def predict_proba(self, X):
        """Alias of :meth:`predict_marginals`, so that a ``Pipeline`` ending in
        this estimator exposes the marginals.

        Parameters
        ----------
        X : list of array-like or sparse matrices of shape (T_n, n_features)

        Returns
        -------
        marginals : list of ndarray of shape (T_n, n_classes)
        """
        return self.predict_marginals(X)

    def _decoding_pairwise(self, pairwise):
        """The transitions the chain decodes with (the fitted likelihood says
        how, whatever ``likelihood`` was set to since), checked: a user's
        likelihood may return anything."""
        likelihood = getattr(self, "_fitted_likelihood", None)
        if likelihood is None:  # a model saved before the fit kept it
            likelihood = get_likelihood(self.likelihood)
        out = _checked(
            likelihood, "transition matrix", likelihood.decoding_pairwise(pairwise),
            pairwise.shape, where=" from decoding_pairwise",
        )
        if not np.all(np.isfinite(out)):
            raise ValueError(
                f"{likelihood!r} returned NaN or infinite transitions from "
                "decoding_pairwise"
            )
        return out.astype(np.float64, copy=False)

    def _mean_potentials(self, X_c):
        """Posterior mean of the unary potentials, (n_tokens, n_classes)."""
        if hasattr(self, "ess_"):
            return self.ess_.mean_unary(X_c)
        # What the mean needs of the posterior, kept per fitted posterior:
        # it costs in proportion to the parameters, most of a call on a few
        # sentences.
        inducing = self.inducing_
        state = self._kept(
            "_mean_state_of",
            (inducing, self.weights_, self.q_mu_, self.kernel_, self._inducing_state),
            lambda: inducing.mean_state(
                self.kernel_, self._inducing_state,
                np.einsum("k,kvm->vm", self.weights_, self.q_mu_),
            ),
        )
        # (columns without a variable have weights of prior mean 0)
        return inducing.mean_potentials(
            state, inducing.select(X_c, keep_lookup=True)
        )

    def predict(self, X):
        """Most probable labelling of every sequence.

        Parameters
        ----------
        X : list of array-like or sparse matrices of shape (T_n, n_features)

        Returns
        -------
        y_pred : ndarray of object of shape (n_sequences,)
            One array of labels from ``classes_``, of shape (T_n,), per
            sequence (empty for a zero-length sequence). A one-dimensional
            array of arrays, as scikit-learn's ``predict`` returns one entry
            per sample (so that ``cross_val_predict`` joins its folds) and as
            sklearn-crfsuite's does; it iterates and indexes as a list.

        Raises
        ------
        ValueError
            Naming X, for features as fit refuses them (NaN, infinite,
            another number of features, magnitudes beyond 1e32), and
            features so far off the training scale that the potentials
            overflow; naming the parameter, for prediction parameters set
            since the fit to values it does not accept (``decode``,
            ``n_predict_samples``, ``pairwise_uncertainty``, ``n_jobs``).
        """
        if self.decode == "marginal":
            return _one_entry_per_sequence([
                self.classes_[np.argmax(m, axis=1)] if len(m) else self.classes_[:0]
                for m in self.predict_marginals(X)
            ])
        sequences = self._check_predict_input(X)
        out = [None] * len(sequences)
        pairwise = self._decoding_pairwise(self.pairwise_mean_)
        for sl, X_c, offsets in self._chunks(sequences):
            if X_c is None:
                for i in range(sl.start, sl.stop):
                    out[i] = self.classes_[:0]
                continue
            with np.errstate(over="ignore", invalid="ignore"):  # refused below
                unary = self._mean_potentials(X_c)
            unary, pairwise_c = _check_potentials(unary, pairwise, offsets, X_c, "mean")
            labels, _ = chain._viterbi(unary, pairwise_c, offsets)
            for i, piece in zip(range(sl.start, sl.stop),
                                split_by_offsets(labels, offsets), strict=True):
                out[i] = self.classes_[piece]
        return _one_entry_per_sequence(out)

    def score(self, X, y, sample_weight=None):
        """Token accuracy of :meth:`predict` on ``X`` against ``y``.

        Parameters
        ----------
        X : list of array-like or sparse matrices of shape (T_n, n_features)
        y : list of array-like of shape (T_n,)
        sample_weight : None
            Not supported (must be None).

        Returns
        -------
        accuracy : float
        """
        if sample_weight is not None:
            raise ValueError("sample_weight is not supported; pass None")
        y_pred = self.predict(X)
        labels = check_sequence_labels(y, [len(p) for p in y_pred])
        n_tokens = sum(len(p) for p in y_pred)
        if n_tokens == 0:
            raise ValueError("X has no tokens to score")
        # token_accuracy refuses labels of another kind than the classes
        # (strings never equal numbers: the score was 0 for the right labels).
        return token_accuracy(labels, y_pred)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.input_tags.sparse = True
        tags.target_tags.required = True
        tags.non_deterministic = False
        return tags
