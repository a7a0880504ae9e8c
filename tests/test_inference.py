"""The variational engine against independent references.

- every gradient of the fixed-sample ELBO against central finite differences
  (pathwise estimator), for all parameter groups, K = 1 and 2, full and
  diagonal covariances, an RBF kernel on dense X and a linear kernel on
  sparse X;
- the score estimator against finite differences of the importance-weighted
  fixed-sample objective it is the exact gradient of, computed here from
  the textbook sparse-GP marginal (eq. 18-19) with scipy's Gaussian density;
- score and pathwise estimators agree in expectation;
- KL terms against closed forms and the Jensen bound against Monte Carlo;
- the Monte Carlo ELL against brute-force enumeration of labellings.
"""

import dataclasses
import warnings

import _stacked_reference as stacked_reference
import numpy as np
import pytest
import scipy.sparse as sp
from _builds import compiled_builds
from _chain_reference import enumerate_one
from joblib import Parallel
from scipy import stats
from scipy.special import logsumexp

from skgpstruct._linalg import CholeskyError, cholesky_backward, jitter_cholesky
from skgpstruct._sequences import chunk_slices, stack_sequences
from skgpstruct.inference.elbo import SparseELBO
from skgpstruct.inference.inducing import (
    CollapsedFeatures,
    InducingFeatures,
    InducingPoints,
    RowSplit,
    distinct_rows,
    select_inducing_points,
)
from skgpstruct.inference.posterior import (
    ParameterLayout,
    VariationalParameters,
    kl_pairwise,
    kl_unary,
    kl_unary_diagonal_packed,
)
from skgpstruct.inference.terms import (
    Chunk,
    SharedState,
    antithetic_normal,
    chunk_terms,
    expand_local,
    sample_unary,
    sample_unary_stacked,
)
from skgpstruct.kernels import GroupedLinearKernel, LinearKernel, RBFKernel
from skgpstruct.likelihoods import ChainCRF, Likelihood

V, M = 3, 5


def _random_params(rng, K, full, V=V, M=M):
    q_mu = rng.normal(size=(K, V, M))
    if full:
        q_sqrt = np.tril(0.3 * rng.normal(size=(K, V, M, M)))
        idx = np.arange(M)
        q_sqrt[..., idx, idx] = np.abs(q_sqrt[..., idx, idx]) + 0.5
    else:
        q_sqrt = rng.uniform(0.3, 1.0, size=(K, V, M))
    return VariationalParameters(
        q_mu,
        q_sqrt,
        rng.dirichlet(np.ones(K)),
        rng.normal(size=(V, V)),
        rng.uniform(0.2, 1.0, size=(V, V)),
    )


def _problem(
    kernel_name, *, K=1, full=False, estimator="pathwise", S=3, seed=0,
    features=False, compact=False, n_features=12, hyperprior_scale=None,
    sample_dtype=np.float64, design_columns=None,
):
    """A tiny fixed-sample ELBO: 6 sequences of 1-5 tokens in 2 chunks.

    ``features=True`` uses the weights of the linear kernel as inducing
    variables instead of inducing points; ``compact=True`` then lays the
    chunks out on their own features, as the estimator does.
    ``features="collapsed"`` collapses the lone features
    (:class:`CollapsedFeatures`, compact layout). ``design_columns`` spreads
    the features over a wider design, whose other columns no token has,
    with inducing variables for the active columns only (the estimator's
    ``InducingFeatures(columns=...)``, of the design the kernel sees). The
    stacked form samples
    in double precision unless ``sample_dtype`` says otherwise: finite
    differences of step 1e-5 would see single precision's rounding.
    """
    rng = np.random.default_rng(seed)
    lengths = [3, 1, 5, 2, 4, 3]
    if kernel_name == "rbf":
        X = [rng.normal(size=(t, 3)) for t in lengths]
        kernel = RBFKernel(variance=1.3, length_scale=0.9)
    else:
        # Sparse indicator rows over 12 features, 3 active per token.
        X = []
        for t in lengths:
            rows = np.zeros((t, n_features))
            for i in range(t):
                rows[i, rng.choice(n_features, size=3, replace=False)] = 1.0
            X.append(sp.csr_matrix(rows))
        if kernel_name == "grouped":
            kernel = GroupedLinearKernel(
                groups=np.arange(design_columns or n_features) % 3,
                variance=[1.3, 0.4, 2.0],
                bias=0.7,
            )
        else:
            kernel = LinearKernel(variance=1.3, bias=0.7)
    y = [rng.integers(V, size=t) for t in lengths]
    Xs, offsets = stack_sequences(X)
    labels = np.concatenate(y).astype(np.int64)
    original = None
    if design_columns is not None:
        place = np.sort(np.random.default_rng(seed + 1).choice(
            design_columns, Xs.shape[1], replace=False
        ))
        wide = sp.csr_matrix(
            (Xs.data, place[Xs.indices], Xs.indptr), shape=(Xs.shape[0], design_columns)
        )
        original = InducingFeatures(design_columns, columns=np.unique(wide.indices))
        assert original.n_features < design_columns
        Xs = original.select(wide)
    if features == "collapsed":
        inducing = CollapsedFeatures.of(Xs, original=original)
        # Some token has two lone features or more: a sum is collapsed.
        assert np.diff(inducing.token_values.indptr).max() >= 2
        Xs = inducing.transform(Xs)
        compact = True
    elif features:
        inducing = original or InducingFeatures(Xs.shape[1])
    else:
        inducing = InducingPoints(Xs[distinct_rows(Xs)[:M]])
    n_inducing = inducing.n_inducing
    seeds = np.random.SeedSequence(seed).spawn(8)
    chunks = [
        Chunk(
            Xs[offsets[sl.start] : offsets[sl.stop]],
            offsets[sl.start : sl.stop + 1] - offsets[sl.start],
            labels[offsets[sl.start] : offsets[sl.stop]],
            seeds[i],
        )
        for i, sl in enumerate(chunk_slices(lengths, 8))
    ]
    assert len(chunks) == 2
    if compact:
        for chunk in chunks:
            chunk.layout = inducing.chunk_layout(chunk.X, chunk.offsets, compact=True)
    layout = ParameterLayout(
        K, V, n_inducing, full, kernel.n_dims, learn_pairwise_prior=True
    )
    objective = SparseELBO(
        chunks,
        inducing,
        kernel,
        ChainCRF(),
        layout,
        n_samples=S,
        estimator=estimator,
        pairwise_prior_variance=1.3,
        pairwise_noise=rng.normal(size=(S, V, V)),
        residual_floor=1e-6,
        hyperprior_scale=hyperprior_scale,
        sample_dtype=sample_dtype,
    )
    x0 = layout.pack(_random_params(rng, K, full, M=n_inducing), kernel.theta, 1.7)
    return objective, layout, x0


def test_collapsed_features_ignore_stored_zeros():
    # A stored zero is not an active feature: the same collapsed model as
    # without it, here a zero stored in a lone column at a token that has no
    # lone feature of its own.
    X = sp.csr_matrix(np.array([
        [1.0, 1, 0, 0, 0, 1], [0, 0, 1, 1, 0, 1], [0, 0, 0, 0, 1, 1],
        [0, 0, 0, 0, 0, 1],
    ]))
    with_zero = sp.csr_matrix(
        (np.r_[X.data, 0.0], np.r_[X.indices, 0], np.r_[X.indptr[:-1], X.nnz + 1]),
        shape=X.shape,
    )
    with_zero.sort_indices()
    assert with_zero.nnz == X.nnz + 1
    expected, got = CollapsedFeatures.of(X), CollapsedFeatures.of(with_zero)
    np.testing.assert_array_equal(got.tokens, expected.tokens)
    kernel = LinearKernel()
    np.testing.assert_array_equal(got.prepare(kernel), expected.prepare(kernel))

@pytest.mark.parametrize(
    ("lengths", "budget", "expected"),
    [
        ([5, 5, 5], 10, [(0, 2), (2, 3)]),  # closed at exactly the budget
        ([4, 5, 3, 9], 10, [(0, 3), (3, 4)]),
        ([12, 0, 1], 10, [(0, 1), (1, 3)]),
        ([0, 0], 1, [(0, 2)]),
        ([], 3, []),
    ],
)
def test_chunks_close_at_the_budget(lengths, budget, expected):
    # A chunk is closed as soon as it holds at least the budget's tokens.
    got = [(sl.start, sl.stop) for sl in chunk_slices(lengths, budget)]
    assert got == expected

@pytest.mark.parametrize(
    "columns", [[1, 3, 3], [3, 1], [-1, 2], [2, 10], [[1, 2]]],
    ids=["repeated", "decreasing", "negative", "at the width", "2-D"],
)
def test_inducing_columns_must_be_increasing_indices_of_the_design(columns):
    with pytest.raises(ValueError, match="columns must be increasing column "
                       "indices below n_features=10"):
        InducingFeatures(10, columns=columns)
    assert InducingFeatures(10, columns=[0, 3, 9]).n_features == 3


def test_jitter_cholesky_adds_tenfold_jitter_scaled_by_the_diagonal():
    # A matrix with a slightly negative eigenvalue: the jitter grows tenfold
    # from 1e-10 times the mean diagonal until the factor exists, and the
    # factor is that of the jittered matrix.
    for scale in (1.0, 1e6):
        matrix = scale * np.diag([1.0, 1.0, -1e-7])
        lower, jitter = jitter_cholesky(matrix)
        steps = np.log10(jitter / (1e-10 * np.mean(np.abs(np.diag(matrix)))))
        assert steps == pytest.approx(round(steps)) and 0 < round(steps) < 8
        np.testing.assert_allclose(
            lower @ lower.T, matrix + jitter * np.eye(3), rtol=1e-12,
            atol=1e-12 * scale,
        )
        assert np.linalg.eigvalsh(matrix + jitter * np.eye(3)).min() > 0
    for bad in (np.nan, np.inf):
        matrix = np.eye(3)
        matrix[2, 0] = matrix[0, 2] = bad
        with pytest.raises(CholeskyError, match="NaN or infinite"):
            jitter_cholesky(matrix)


def test_cholesky_backward_matches_finite_differences_and_is_symmetric():
    # f(A) = sum(W * chol(A)) over the factor's lower triangle. A symmetric
    # step of A at (i, j) and (j, i) changes f by a_bar[i, j] + a_bar[j, i]
    # (a_bar[i, i] on the diagonal): central differences. The gradient is
    # returned symmetric, each off-diagonal pair carrying half the total,
    # and the upper triangle of lower_bar is ignored.
    rng = np.random.default_rng(4)
    n = 5
    root = rng.standard_normal((n, n))
    matrix = root @ root.T + n * np.eye(n)
    weights = np.tril(rng.standard_normal((n, n)))

    def f(a):
        return float(np.sum(weights * np.linalg.cholesky(a)))

    lower = np.linalg.cholesky(matrix)
    with_upper = weights + np.triu(rng.standard_normal((n, n)), 1)
    a_bar = cholesky_backward(lower, with_upper)
    np.testing.assert_array_equal(a_bar, a_bar.T)
    np.testing.assert_array_equal(a_bar, cholesky_backward(lower, weights))
    h = 1e-6
    for i in range(n):
        for j in range(i + 1):
            step = np.zeros((n, n))
            step[i, j] = step[j, i] = h
            numeric = (f(matrix + step) - f(matrix - step)) / (2 * h)
            analytic = a_bar[i, j] if i == j else a_bar[i, j] + a_bar[j, i]
            assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-8)


class _RecordingGenerator:
    """Draws the first point given; then the most probable point, keeping
    the probabilities asked for."""

    def __init__(self, first):
        self.first, self.probabilities = first, []

    def integers(self, n):
        return self.first

    def choice(self, n, p=None, **kwargs):
        self.probabilities.append(np.array(p))
        return int(np.argmax(p))


def test_kmeans_plus_plus_draws_by_squared_kernel_distance():
    # k-means++ in the kernel's feature space: the next point with
    # probability proportional to its squared distance to the nearest chosen
    # one, k(x, x) + k(c, c) - 2 k(x, c); RBF of unit variance and length
    # scale: 2 - 2 exp(-d^2 / 2).
    X = np.array([[0.0], [0.1], [3.0], [1.2]])
    kernel = RBFKernel(variance=1.0, length_scale=1.0)
    rng = _RecordingGenerator(first=0)
    chosen = select_inducing_points(X, kernel, 3, "kmeans++", rng)
    np.testing.assert_array_equal(chosen, [0, 2, 3])

    def squared(centres):
        d2 = np.min((X[:, 0, None] - X[None, centres, 0]) ** 2, axis=1)
        return 2.0 - 2.0 * np.exp(-d2 / 2.0)

    for p, centres in zip(rng.probabilities, ([0], [0, 2]), strict=True):
        expected = squared(centres)
        np.testing.assert_allclose(p, expected / expected.sum(), rtol=1e-12, atol=1e-15)

class _FeatureMapOnly:
    """A kernel of another hierarchy: the two public feature-map methods only."""

    def __init__(self, kernel):
        self.kernel = kernel

    def feature_scales(self, n_features):
        return self.kernel.feature_scales(n_features)

    def feature_scales_vjp(self, d_scales):
        return self.kernel.feature_scales_vjp(d_scales)


@pytest.mark.parametrize("features", ["columns", "collapsed columns"])
def test_inducing_columns_with_any_feature_map_kernel(features):
    # The linear kernels give the scales of the inducing features' columns
    # alone; another kernel with a feature map is asked for the whole
    # design's, restricted afterwards: the same scales and theta gradients.
    objective, _, _ = _problem(
        "grouped", features="collapsed" if "collapsed" in features else True,
        n_features=40, design_columns=55,
    )
    inducing, kernel = objective.inducing, objective.kernel
    other = _FeatureMapOnly(kernel)
    scales = inducing.prepare(kernel)
    assert scales.size == inducing.n_inducing
    np.testing.assert_array_equal(inducing.prepare(other), scales)
    d_scales = np.random.default_rng(2).normal(size=scales.size)
    np.testing.assert_allclose(
        inducing.finish_gradient(other, scales, d_scales),
        inducing.finish_gradient(kernel, scales, d_scales), rtol=1e-13,
    )


@pytest.mark.parametrize(
    "kernel_name, K, full, features",
    [
        ("rbf", 1, False, False),
        ("rbf", 1, True, False),
        ("rbf", 2, False, False),
        ("rbf", 2, True, False),
        ("linear", 1, False, False),
        ("linear", 3, True, False),
        ("linear", 1, False, True),
        ("linear", 2, True, True),
        ("grouped", 1, False, True),
        ("grouped", 1, False, False),
        ("linear", 1, False, "compact"),
        ("grouped", 2, False, "compact"),
        ("linear", 1, False, "collapsed"),
        ("grouped", 2, False, "collapsed"),
        # inducing variables for the design's active columns only
        ("grouped", 1, False, "columns"),
        ("grouped", 1, True, "columns"),
        ("linear", 1, False, "columns"),
        ("grouped", 2, False, "collapsed columns"),
    ],
)
def test_pathwise_gradient_matches_finite_differences(kernel_name, K, full, features):
    objective, layout, x0 = _problem(
        kernel_name, K=K, full=full,
        features="collapsed" if "collapsed" in str(features) else bool(features),
        compact=features == "compact" or (features == "columns" and not full),
        n_features=40 if features else 12,
        design_columns=55 if "columns" in str(features) else None,
    )
    rng = np.random.default_rng(1)
    with Parallel(n_jobs=1) as parallel:
        gradient = objective.evaluate(x0, parallel).gradient
        for name, sl in layout.slices.items():
            if sl.stop == sl.start:
                continue
            direction = np.zeros_like(x0)
            direction[sl] = rng.normal(size=sl.stop - sl.start)
            h = 1e-5
            plus = objective.evaluate(x0 + h * direction, parallel).elbo
            minus = objective.evaluate(x0 - h * direction, parallel).elbo
            finite_diff = (plus - minus) / (2 * h)
            np.testing.assert_allclose(
                gradient @ direction, finite_diff, rtol=1e-5, atol=1e-7, err_msg=name
            )


@pytest.mark.parametrize(
    ("kernel_name", "options"),
    [("rbf", {}), ("grouped", {"features": "collapsed", "design_columns": 55})],
)
def test_evaluation_at_a_point_seen_before_is_that_point(kernel_name, options):
    # The objective keeps the last point's parameters (its buffer reused
    # from point to point): going back to an earlier point, as a line
    # search or the stochastic optimiser may, must not return the
    # parameters of the point evaluated in between.
    objective, _, x0 = _problem(kernel_name, n_features=40, **options)
    points = [x0, x0 + 0.1, x0 - 0.05, x0, x0 + 0.1]
    with Parallel(n_jobs=1) as parallel:
        results = [objective.evaluate(x, parallel) for x in points]
        for x, result in zip(points, results, strict=True):
            fresh = _problem(kernel_name, n_features=40, **options)[0]
            expected = fresh.evaluate(x, parallel)
            assert result.elbo == expected.elbo
            np.testing.assert_array_equal(result.gradient, expected.gradient)

@pytest.mark.parametrize("estimator", ["pathwise", "score"])
def test_batch_objective_draws_the_transitions_from_its_noise(estimator):
    # The batch objective's transitions are pairwise_mean + pairwise_std *
    # its pairwise_noise, shared by every chunk: with that noise all zero
    # the expected log-likelihood does not depend on pairwise_std.
    objective, layout, x0 = _problem("rbf", estimator=estimator)
    objective.pairwise_noise = np.zeros_like(objective.pairwise_noise)
    sl = layout.slices["pairwise_log_std"]
    ells = []
    with Parallel(n_jobs=1) as parallel:
        for log_std in (-3.0, 0.0, 1.0):
            x = x0.copy()
            x[sl] = log_std
            ells.append(objective.evaluate(x, parallel).ell)
    assert ells[0] == ells[1] == ells[2]

@pytest.mark.parametrize("features", ["compact", "collapsed"])
def test_single_precision_samples_round_the_double_precision_ones(features):
    # The estimator's stacked form samples in single precision: the same
    # base samples as in double precision (drawn in double and rounded),
    # so the ELBO and its gradient differ by rounding only.
    options = dict(
        K=2, features="collapsed" if features == "collapsed" else True, compact=True,
        n_features=40, S=5,
    )
    single, layout, x0 = _problem("grouped", sample_dtype=np.float32, **options)
    double, _, _ = _problem("grouped", **options)
    with Parallel(n_jobs=1) as parallel:
        a, b = single.evaluate(x0, parallel), double.evaluate(x0, parallel)
    assert a.elbo != b.elbo  # rounded differently: not the same code path
    np.testing.assert_allclose(a.elbo, b.elbo, rtol=1e-6)
    np.testing.assert_allclose(
        a.gradient, b.gradient, rtol=1e-4, atol=1e-5 * np.abs(b.gradient).max()
    )


def test_single_precision_overflow_is_a_rejected_point_not_an_error():
    # Far out (a line search's trial), single-precision samples overflow
    # where double precision's stay finite: the ELBO there is -inf (the
    # optimisers reject the point), not a ValueError from the chain.
    options = dict(features=True, compact=True)
    single, layout, x0 = _problem("grouped", sample_dtype=np.float32, **options)
    double, _, _ = _problem("grouped", **options)
    x = x0.copy()
    x[layout.slices["q_mu"]] *= 1e40
    with Parallel(n_jobs=1) as parallel:
        assert single.evaluate(x, parallel).elbo == -np.inf
        assert np.isfinite(double.evaluate(x, parallel).elbo)
        assert np.isfinite(single.evaluate(x0, parallel).elbo)


@pytest.mark.parametrize("kernel_name", ["rbf", "grouped"])
def test_hyperprior_adds_a_gaussian_log_density_on_theta(kernel_name):
    features = kernel_name == "grouped"
    plain, layout, x0 = _problem(kernel_name, features=features)
    objective, _, _ = _problem(kernel_name, features=features, hyperprior_scale=0.7)
    sl = layout.slices["theta"]
    start = x0[sl].copy()  # _problem packs the kernel's own theta
    rng = np.random.default_rng(3)
    x = x0.copy()
    x[sl] += rng.normal(size=sl.stop - sl.start)
    with Parallel(n_jobs=1) as parallel:
        at_start = objective.evaluate(x0, parallel)
        a, b = plain.evaluate(x, parallel), objective.evaluate(x, parallel)
        # log N(theta; start, 0.7^2) up to its constant, computed by scipy.
        log_density = stats.norm.logpdf(x[sl], start, 0.7) - stats.norm.logpdf(
            start, start, 0.7
        )
        assert at_start.log_hyperprior == 0.0
        assert at_start.objective == at_start.elbo
        assert b.elbo == a.elbo
        np.testing.assert_allclose(b.log_hyperprior, log_density.sum(), rtol=1e-12)
        np.testing.assert_allclose(b.objective, a.elbo + log_density.sum())
        # Only the theta block of the gradient changes.
        outside = np.ones(layout.size, bool)
        outside[sl] = False
        np.testing.assert_array_equal(b.gradient[outside], a.gradient[outside])
        direction = np.zeros_like(x)
        direction[sl] = rng.normal(size=sl.stop - sl.start)
        h = 1e-5
        plus = objective.evaluate(x + h * direction, parallel).objective
        minus = objective.evaluate(x - h * direction, parallel).objective
        np.testing.assert_allclose(
            b.gradient @ direction, (plus - minus) / (2 * h), rtol=1e-5, atol=1e-7
        )
        # The stochastic optimiser's exact part: KL terms and the prior.
        gradient = np.zeros(layout.size)
        assert objective.add_log_hyperprior(x, gradient) == b.log_hyperprior
        np.testing.assert_allclose(
            gradient[sl], b.gradient[sl] - a.gradient[sl], rtol=1e-12
        )


@pytest.mark.parametrize(
    "kernel_name, K, full, features, n_features",
    [
        ("rbf", 1, False, False, 12),
        ("rbf", 2, True, False, 12),
        ("linear", 1, False, True, 12),
        ("grouped", 1, False, True, 12),
        ("grouped", 1, False, "compact", 12),
        # Every token has all 3 features: a sequence of 4 or 5 tokens has
        # more tokens than inducing variables (4), no residual, and only
        # _sequence_marginal's jitter makes its covariance invertible.
        ("linear", 1, False, True, 3),
        ("linear", 1, True, True, 3),
    ],
)
def test_score_objective_gradient_matches_finite_differences(
    kernel_name, K, full, features, n_features
):
    # Away from its reference posterior the score objective is importance
    # weighted (weights != 1) and includes the control variate; its gradient
    # must still be exact.
    objective, layout, x0 = _problem(
        kernel_name, K=K, full=full, features=bool(features), estimator="score",
        S=5, compact=features == "compact", n_features=n_features,
    )
    rng = np.random.default_rng(3)
    reference = x0 + 0.05 * rng.normal(size=x0.shape)
    with Parallel(n_jobs=1) as parallel:

        def evaluate(x):
            return objective.evaluate(x, parallel, reference=reference)

        gradient = evaluate(x0).gradient
        for name, sl in layout.slices.items():
            if sl.stop == sl.start:
                continue
            direction = np.zeros_like(x0)
            direction[sl] = rng.normal(size=sl.stop - sl.start)
            # (with a covariance invertible by its jitter alone, its inverse
            # of order 1e8 magnifies rounding: a longer step)
            h = 1e-4 if n_features == 3 else 1e-5
            finite_diff = (
                evaluate(x0 + h * direction).elbo - evaluate(x0 - h * direction).elbo
            ) / (2 * h)
            np.testing.assert_allclose(
                gradient @ direction, finite_diff, rtol=1e-5, atol=1e-7, err_msg=name
            )


class _RecordUnary(Likelihood):
    """A likelihood that keeps the unary samples it is given (log p = 0)."""

    has_gradient = True

    def _log_prob(self, unary, pairwise, offsets, labels):
        return np.zeros((unary.shape[0], len(offsets) - 1))

    def _log_prob_and_gradient(self, unary, pairwise, offsets, labels):
        self.unary = unary.copy()
        S, _, n_labels = unary.shape
        n_seq = len(offsets) - 1
        return (
            np.zeros((S, n_seq)), np.zeros_like(unary),
            np.zeros((S, n_seq, n_labels, n_labels)),
        )


def _stacked_problem(dense, rng):
    """A chunk of 4 sequences (one empty) on 9 real-valued sparse features.

    Feature 2 is active at two tokens of the first sequence, and the sparse
    form gives the entry (3, 5) as two parts that sum to 1.5.
    """
    n_features = 9
    lengths = [3, 0, 4, 1]
    X = rng.uniform(0.5, 2.0, size=(8, n_features)) * (
        rng.random(size=(8, n_features)) < 0.3
    )
    X[0, 2] = X[2, 2] = 1.0
    if dense:
        X_chunk = X
    else:
        coo = sp.coo_matrix(X)
        X_chunk = sp.csr_matrix(
            (
                np.concatenate([coo.data, [1.0, 0.5]]),
                (np.concatenate([coo.row, [3, 3]]), np.concatenate([coo.col, [5, 5]])),
            ),
            shape=X.shape,
        )
        X[3, 5] += 1.5
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    kernel = GroupedLinearKernel(
        groups=np.arange(n_features) % 2, variance=[1.3, 0.4], bias=0.7
    )
    return X, X_chunk, offsets, kernel


def _sequence_blocks(X, offsets, n_features):
    """Per sequence: its active features and the bias, and their values."""
    for n in range(len(offsets) - 1):
        X_n = X[offsets[n] : offsets[n + 1]]
        active = np.flatnonzero(np.any(X_n != 0, axis=0))
        yield (
            np.append(active, n_features),
            np.vstack([X_n[:, active].T, np.ones(len(X_n))]),
        )


def _assert_layout_is_the_reference(n_features, X_chunk, offsets, compact):
    """``chunk_layout``'s layout against the one built sequence by sequence
    (rows, support, and the split of U, also through ``RowSplit.of``)."""
    inducing = InducingFeatures(n_features)
    layout = inducing.chunk_layout(X_chunk, offsets, compact=compact)
    rows, support, row_starts, U = stacked_reference.layout_by_sequence(
        n_features, X_chunk, offsets, compact
    )
    if support is not None:
        np.testing.assert_array_equal(layout.support, support)
    else:
        assert layout.support is None
    np.testing.assert_array_equal(layout.row_starts, row_starts)
    assert len(layout.rows) == len(rows)
    for a, b in zip(layout.rows, rows, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(layout.stacked_rows, np.concatenate(rows))
    n_space = inducing.n_inducing if support is None else support.size
    expected = stacked_reference.row_split(U, np.concatenate(rows))
    for name, value in expected.items():
        np.testing.assert_array_equal(
            getattr(layout.split, name), value.astype(np.float32)
            if name.endswith("value") else value, err_msg=name,
        )
    # RowSplit.of, from a CSR U, gives the same split
    of_U = RowSplit.of(U, np.concatenate(rows), n_space)
    for name in expected:
        np.testing.assert_array_equal(
            getattr(of_U, name), getattr(layout.split, name), err_msg=name
        )
    return layout


@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("dense", [False, True])
def test_chunk_layout_matches_the_sequence_by_sequence_construction(dense, compact):
    # The vectorised layout against one built sequence by sequence: empty
    # sequences, entries given twice (summed), a stored zero (kept as an
    # entry), and a feature active nowhere (so that compact layouts
    # restrict).
    rng = np.random.default_rng(8)
    n_features = 15
    lengths = [4, 0, 6, 1, 0, 5]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    T = offsets[-1]
    X = rng.uniform(0.5, 2.0, (T, n_features)) * (rng.random((T, n_features)) < 0.3)
    X[:, 7:9] = 0.0
    X[0, 3] = X[2, 3] = 1.0  # a feature repeated within a sequence
    if dense:
        X_chunk = X
    else:
        # CSR arrays as given (a COO constructor would sum the duplicates):
        # token 5 lists feature 1 twice more, token 9 stores a zero.
        extra = {5: [(1, 0.25), (1, 0.25)], 9: [(7, 0.0)]}
        indptr, indices, data = [0], [], []
        for t in range(T):
            cols = np.flatnonzero(X[t])
            pairs = [(c, X[t, c]) for c in cols] + extra.get(t, [])
            indices += [c for c, _ in pairs]
            data += [v for _, v in pairs]
            indptr.append(len(indices))
        X_chunk = sp.csr_matrix((data, indices, indptr), shape=X.shape)
        assert not X_chunk.has_canonical_format
    layout = _assert_layout_is_the_reference(n_features, X_chunk, offsets, compact)
    # The stored zero (token 9 of sequence 2, feature 7) is an entry of the
    # sparse chunk; feature 8 is active nowhere.
    rows_2 = layout.rows[2]
    if layout.support is not None:
        rows_2 = layout.support[rows_2]
    assert (7 in rows_2) is not dense
    if compact:
        assert 8 not in layout.support


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_chunk_layouts_of_random_chunks_match_the_sequence_by_sequence_construction(
    index_dtype,
):
    # Chunks of one to forty sequences (some empty, some of tokens without
    # features), one to 3,000 features, sparse to dense, compact or not,
    # the CSR's indices in 32 or 64 bits: the compiled layout (entries
    # sorted by packed (sequence, feature) keys) is the reference's.
    rng = np.random.default_rng(21)
    for _ in range(24):
        n_features = int(rng.choice([1, 3, 40, 3000]))
        lengths = rng.integers(0, 12, size=int(rng.integers(1, 41)))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        T = int(offsets[-1])
        density = rng.choice([0.0, 0.02, 0.3, 1.0])
        X = sp.random(T, n_features, density=density, format="csr", random_state=rng,
                      data_rvs=lambda k: rng.uniform(0.5, 2.0, k))
        X.indices = X.indices.astype(index_dtype)
        X.indptr = X.indptr.astype(index_dtype)
        for compact in (False, True):
            _assert_layout_is_the_reference(n_features, X, offsets, compact)


def test_the_layout_module_sorts_keys_as_numpy_does():
    # The introsort of the collapsed design's new entries (quicksort,
    # insertion sort of short runs, heapsort past its depth: 0 for heapsort
    # alone) on sorted, reversed, constant, organ-pipe, few-valued and
    # random keys of 0 to 3,000 entries: NumPy's order of the keys, and
    # every position once.
    from skgpstruct._layout import _sorted_by_key

    rng = np.random.default_rng(23)
    for n in (0, 1, 2, 15, 16, 17, 100, 3000):
        up = np.arange(n, dtype=np.int64)
        for keys in (up, up[::-1].copy(), np.zeros(n, dtype=np.int64),
                     np.minimum(up, n - up), rng.integers(0, 3, n),
                     rng.integers(-(2**62), 2**62, n)):
            for depth in (-1, 0, 2):
                got, positions = _sorted_by_key(keys, depth)
                np.testing.assert_array_equal(got, np.sort(keys))
                np.testing.assert_array_equal(np.sort(positions), up)
                np.testing.assert_array_equal(keys[positions], got)


def test_layout_kernels_refuse_inconsistent_input():
    # The compiled loops index their arrays unchecked: what would send them
    # out of bounds stops before them, with the argument named.
    from skgpstruct import _layout

    X = sp.csr_matrix(np.eye(3))
    offsets = np.array([0, 2, 3], dtype=np.int64)
    with pytest.raises(ValueError, match="X has 3 columns; these inducing "
                       "features take 4"):
        InducingFeatures(4).chunk_layout(X, offsets)
    for bad in ([0, 2, 4], [1, 2, 3]):
        with pytest.raises(ValueError, match="offsets must run from 0 to the "
                           "number of tokens"):
            _layout.chunk_rows(X.indptr, X.indices, X.data,
                               np.array(bad, dtype=np.int64), 3, 4, False)
    # sort keys of (sequence, feature, entry) beyond 62 bits
    with pytest.raises(ValueError, match="too large for its 64-bit sort keys"):
        _layout.chunk_rows(X.indptr, X.indices, X.data, offsets, 2**61, 2**61 + 1,
                           False)
    with pytest.raises(ValueError, match="indptr must run from 0 to the number "
                       "of entries"):
        _layout.split_rows(np.array([0, 1, 3]), np.array([0, 1]), 2)
    for entry_row in ([0, 2], [-1, 0]):
        with pytest.raises(ValueError, match=r"entry_row must lie in \[0, 2\)"):
            RowSplit.of_token_entries(
                np.array([0, 1, 2]), np.array(entry_row), np.ones(2), 2,
                np.array([0, 1]), 2,
            )


@pytest.mark.parametrize("dense", [False, True])
def test_stacked_projection_blocks_are_the_sequences_features(dense):
    # Both the per-sequence projection and the stacked one (drawn rows and
    # lone entries) against B_n written from the dense X: the sequence's
    # active features and the bias, scaled, nothing outside its own tokens;
    # a row is lone exactly when it is active at one token.
    X, X_chunk, offsets, kernel = _stacked_problem(dense, np.random.default_rng(4))
    inducing = InducingFeatures(X.shape[1])
    scales = inducing.prepare(kernel)
    layout = inducing.chunk_layout(X_chunk, offsets)
    projection = inducing.project(kernel, scales, X_chunk, offsets)
    stacked = inducing.stacked_projection(scales, layout)
    assert inducing.stacked_projection(scales, None) is None
    split = stacked.split
    n_tokens = X.shape[0]
    assert split.n_tokens == n_tokens and split.indptr[0] == 0
    # The entries listed by token, as drawn rows (their position in
    # `drawn`) and lone entries (token x inducing variable).
    token = np.repeat(np.arange(n_tokens), np.diff(split.indptr))
    is_drawn = split.entry_drawn >= 0
    U_drawn = np.zeros((split.drawn.size, n_tokens))
    U_drawn[split.entry_drawn[is_drawn], token[is_drawn]] = split.value[is_drawn]
    np.testing.assert_array_equal(
        split.inducing[is_drawn], split.drawn_rows[split.entry_drawn[is_drawn]]
    )
    # The drawn rows' entries listed again row by row: the same matrix.
    by_row = np.zeros_like(U_drawn)
    row_of = np.repeat(np.arange(split.drawn.size), np.diff(split.row_indptr))
    by_row[row_of, split.row_token] = split.row_value
    np.testing.assert_array_equal(by_row, U_drawn)
    lone = np.zeros((n_tokens, inducing.n_inducing))
    is_lone = ~is_drawn
    np.add.at(lone, (token[is_lone], split.inducing[is_lone]), split.value[is_lone])
    # U rebuilt from the split: drawn rows as listed, every lone row from
    # its single entry among its own sequence's tokens.
    U = np.zeros((stacked.rows.size, n_tokens))
    U[split.drawn] = U_drawn
    start, expected_drawn = 0, []
    for n, (rows, values) in enumerate(_sequence_blocks(X, offsets, X.shape[1])):
        t0, t1 = offsets[n], offsets[n + 1]
        np.testing.assert_array_equal(stacked.rows[start : start + rows.size], rows)
        for i, row in enumerate(rows):
            active = np.count_nonzero(values[i])
            if active != 1:
                expected_drawn.append(start + i)
            else:
                U[start + i, t0:t1] = lone[t0:t1, row]
        expected = scales[rows][:, None] * values
        np.testing.assert_array_equal(projection.rows[n], rows)
        # The layout's per-sequence rows view its stacked rows (one copy).
        np.testing.assert_array_equal(layout.rows[n], rows)
        assert np.shares_memory(layout.rows[n], layout.stacked_rows)
        np.testing.assert_allclose(projection.B[n], expected)
        block = scales[stacked.rows[start : start + rows.size], None] * U[
            start : start + rows.size
        ]
        np.testing.assert_allclose(block[:, t0:t1], expected)
        outside = np.delete(block, np.arange(t0, t1), axis=1)
        assert not np.any(outside)
        start += rows.size
    assert start == stacked.rows.size
    np.testing.assert_array_equal(split.drawn, expected_drawn)
    np.testing.assert_array_equal(split.drawn_rows, stacked.rows[split.drawn])
    # Every lone entry was used above, and nothing else is listed.
    assert np.count_nonzero(lone) == stacked.rows.size - split.drawn.size > 0
    assert np.count_nonzero(~is_drawn) == np.count_nonzero(lone)
    assert np.count_nonzero(U_drawn) == np.count_nonzero(is_drawn)
    assert split.drawn.size > 0


def _random_split(rng, n_tokens=7, n_inducing=6, n_rows=12):
    """A RowSplit of a random U (rows x tokens) with lone, drawn and idle rows.

    U's values are single-precision numbers, as the split stores them.
    """
    U = rng.normal(size=(n_rows, n_tokens)) * (rng.random((n_rows, n_tokens)) < 0.25)
    U[0] = 0.0  # active at no token: drawn, no entry
    U[1] = 0.0
    U[1, 3] = 1.7  # lone
    U[2, [2, 5]] = 0.8, -1.1  # drawn, two tokens
    U = U.astype(np.float32).astype(np.float64)
    rows = rng.integers(n_inducing, size=n_rows)
    return RowSplit.of(sp.csr_matrix(U), rows, n_inducing), U, rows


def test_a_compact_layout_holding_every_feature_keeps_the_global_numbers():
    # No support (nothing to restrict) and the same layout as without
    # compact numbering, when every feature is active in the chunk.
    rng = np.random.default_rng(6)
    X = sp.csr_matrix(rng.uniform(0.5, 1.5, size=(7, 4)))
    offsets = np.array([0, 3, 7], dtype=np.int64)
    inducing = InducingFeatures(4)
    compact = inducing.chunk_layout(X, offsets, compact=True)
    full = inducing.chunk_layout(X, offsets)
    assert compact.support is None and inducing.support(compact) is None
    np.testing.assert_array_equal(compact.stacked_rows, full.stacked_rows)
    np.testing.assert_array_equal(compact.split.inducing, full.split.inducing)
    # One feature missing from the chunk: a support of the others and the bias.
    X_missing = X.toarray()
    X_missing[:, 2] = 0.0
    missing = inducing.chunk_layout(sp.csr_matrix(X_missing), offsets, compact=True)
    np.testing.assert_array_equal(missing.support, [0, 1, 3, 4])


def test_row_split_refuses_inducing_variables_out_of_range():
    # The compiled loops index the parameters with these numbers unchecked,
    # so the split is where a wrong number must stop.
    U = sp.csr_matrix(np.array([[1.0, 0.0], [0.0, 2.0]]))
    RowSplit.of(U, np.array([0, 2]), 3)
    # 2**32 + 1 would read as 1 in 32 bits: refused before the narrowing
    for rows in (np.array([0, 3]), np.array([-1, 0]), np.array([0, 2**32 + 1])):
        with pytest.raises(ValueError, match=r"rows must lie in \[0, 3\)"):
            RowSplit.of(U, rows, 3)
    with pytest.raises(ValueError, match="must each fit 32-bit indices"):
        RowSplit.of(U, np.array([0, 1]), 2**31)


def test_row_split_keeps_its_per_entry_indices_in_32_bits():
    rng = np.random.default_rng(5)
    split, U, rows = _random_split(rng, 9, 6)
    for name in ("inducing", "entry_drawn", "row_token", "lone_token"):
        assert getattr(split, name).dtype == np.int32, name
    for name in ("value", "row_value", "lone_value"):
        assert getattr(split, name).dtype == np.float32, name
    assert split.lone_token.size > 0  # not vacuous
    assert split.lone_entries(np.float32)[2] is split.lone_value
    # In single precision the kernels read the stored values, not copies.
    by_token, by_row = split.entries(np.float32)
    assert by_token[2] is split.value and by_row[2] is split.row_value
    assert by_token[2] is not split.entries(np.float64)[0][2]
    # the same entries as the stacked matrix, token by token
    token = np.repeat(np.arange(split.n_tokens), np.diff(split.indptr))
    dense = np.zeros((split.n_tokens, 6))
    np.add.at(dense, (token, split.inducing), split.value)
    np.testing.assert_allclose(dense, U.T @ np.eye(6)[rows])


@pytest.mark.parametrize("stacked_kernels", compiled_builds("_stacked"))
def test_stacked_kernels_against_dense_products(stacked_kernels):
    # The compiled unary samples against the same formula written with dense
    # matrices (lone rows through one draw per token, drawn rows through their
    # own noise), and their backward pass against the exact derivative of
    # sum(g * f): linear in c * mean, and by central differences in sd.
    rng = np.random.default_rng(11)
    K, V, S, M, T, floor = 2, 3, 4, 6, 7, 1e-3
    split, U, rows = _random_split(rng, T, M)
    counts = np.count_nonzero(U, axis=1)
    drawn = np.flatnonzero(counts != 1)
    np.testing.assert_array_equal(split.drawn, drawn)
    c = rng.uniform(0.5, 2.0, size=M)
    mean = rng.normal(size=(M, K * V))
    sd = rng.uniform(0.2, 1.5, size=(M, K * V))
    eps = rng.normal(size=(drawn.size, K * V, S))
    xi = rng.normal(size=(K, S, T, V))
    g = rng.normal(size=(K, S, T, V))
    lone = np.zeros((T, M))
    for r in np.flatnonzero(counts == 1):
        lone[:, rows[r]] += U[r]

    def dense_unary(mean, sd):
        token_sd = np.sqrt(lone**2 @ (c[:, None] * sd) ** 2 + floor)  # (T, KV)
        f = (lone @ (c[:, None] * mean))[:, :, None] + token_sd[:, :, None] * (
            xi.transpose(2, 0, 3, 1).reshape(T, K * V, S)
        )
        m_drawn = rows[drawn]
        cm = c[m_drawn, None] * mean[m_drawn]
        cs = c[m_drawn, None] * sd[m_drawn]
        f += np.einsum("it,ik->tk", U[drawn], cm)[:, :, None]
        f += np.einsum("it,iks->tks", U[drawn], cs[:, :, None] * eps)
        return f.reshape(T, K, V, S).transpose(1, 3, 0, 2), token_sd

    expected, expected_sd = dense_unary(mean, sd)
    token_sd = np.empty((T, K * V))
    by_token, by_row = split.entries(np.float64)
    args = (*by_token, split.entry_drawn)
    stacked_kernels.token_sd(*args, c, sd, floor, token_sd)
    np.testing.assert_allclose(token_sd, expected_sd, rtol=1e-13)
    f = np.empty((K, S, T, V))
    stacked_kernels.unary(*by_token, *by_row, c, mean, sd, token_sd, eps, xi, f)
    np.testing.assert_allclose(f, expected, rtol=1e-12, atol=1e-13)

    d_cm, d_cs = np.zeros((M, K * V)), np.zeros((M, K * V))
    stacked_kernels.backward(
        *split.lone_entries(np.float64), *by_row, c, sd, token_sd, eps, xi, g,
        d_cm, d_cs,
    )
    # d sum(g f) / d mean = c * d_cm, exactly (f is linear in mean).
    basis = np.zeros_like(mean)
    for m in range(M):
        for kv in range(K * V):
            basis[m, kv] = 1.0
            bumped = np.sum(g * dense_unary(mean + basis, sd)[0])
            basis[m, kv] = 0.0
            assert c[m] * d_cm[m, kv] == pytest.approx(
                bumped - np.sum(g * expected), rel=1e-9, abs=1e-10
            )
    # d sum(g f) / d sd = c * d_cs, by central differences.
    h = 1e-6
    for m in range(M):
        for kv in range(K * V):
            basis[m, kv] = h
            up = np.sum(g * dense_unary(mean, sd + basis)[0])
            down = np.sum(g * dense_unary(mean, sd - basis)[0])
            basis[m, kv] = 0.0
            assert c[m] * d_cs[m, kv] == pytest.approx(
                (up - down) / (2 * h), rel=1e-6, abs=1e-8
            )
    assert np.count_nonzero(d_cs) > M  # not vacuous


@pytest.mark.parametrize("stacked_kernels", compiled_builds("_stacked"))
@pytest.mark.parametrize("shape", [(1, 12, 300), (2, 3, 129), (1, 1, 1)])
def test_stacked_inducing_gradient_is_the_chain_rule_through_the_scales(
    stacked_kernels, shape
):
    # The compiled chain rule from the sums by inducing variable (M, K * V)
    # to the parameters' gradients (K, V, M) and the scales' gradient,
    # against NumPy's broadcast products and contractions; shapes below, at
    # and across the kernel's block of 128 variables. That the formula is
    # the derivative is test_pathwise_gradient_matches_finite_differences'
    # check (the stacked path, kernel hyperparameters included).
    K, V, M = shape
    rng = np.random.default_rng(5)
    c = rng.uniform(0.5, 2.0, M)
    q_mu, q_sqrt = rng.normal(size=shape), rng.uniform(0.1, 2.0, shape)
    d_cm, d_cs = rng.normal(size=(M, K * V)), rng.normal(size=(M, K * V))
    grad_mu, grad_sqrt = np.full(shape, np.nan), np.full(shape, np.nan)
    d_scales = np.full(M, np.nan)  # every output overwritten
    stacked_kernels.inducing_gradient(
        c, q_mu, q_sqrt, d_cm, d_cs, grad_mu, grad_sqrt, d_scales
    )
    by_variable = (M, K, V)
    np.testing.assert_allclose(
        grad_mu, (c[:, None] * d_cm).reshape(by_variable).transpose(1, 2, 0),
        rtol=1e-15,
    )
    np.testing.assert_allclose(
        grad_sqrt, (c[:, None] * d_cs).reshape(by_variable).transpose(1, 2, 0),
        rtol=1e-15,
    )
    expected = np.einsum("kvm,mkv->m", q_mu, d_cm.reshape(by_variable)) + np.einsum(
        "kvm,mkv->m", q_sqrt, d_cs.reshape(by_variable)
    )
    np.testing.assert_allclose(d_scales, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("stacked_kernels", compiled_builds("_stacked"))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_stacked_kernels_against_the_sparse_product_reference(dtype, stacked_kernels):
    # The compiled loops against scipy's sparse products
    # (tests/_stacked_reference.py) on a chunk laid out by InducingFeatures:
    # 40 sequences (empty ones too) on 60 sparse features, two components.
    # In single precision (the estimator's), the inputs are rounded to it
    # and the results agree with the double-precision reference on those
    # inputs to single precision's rounding, relative to their size.
    rng = np.random.default_rng(12)
    lengths = rng.integers(0, 15, size=40)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    T, n_features, K, V, S, floor = int(offsets[-1]), 60, 2, 3, 5, 1e-6
    X = sp.random(T, n_features, density=0.08, format="csr", random_state=rng)
    X.data[:] = rng.choice([1.0, 0.5, 2.0], size=X.nnz)
    inducing = InducingFeatures(n_features)
    split = inducing.chunk_layout(X, offsets).split
    M = inducing.n_inducing
    assert split.drawn.size > 0 and np.any(split.entry_drawn < 0)
    c = rng.uniform(0.3, 2.0, size=M)
    mean = rng.normal(size=(M, K * V))
    sd = rng.uniform(0.1, 2.0, size=(M, K * V))
    eps = rng.normal(size=(split.drawn.size, K * V, S))
    xi, g = rng.normal(size=(2, K, S, T, V))
    # The kernels' inputs are rounded to dtype; the reference computes in
    # double precision on the same (rounded) values.
    c, mean, sd, eps, xi = (
        a.astype(dtype).astype(np.float64) for a in (c, mean, sd, eps, xi)
    )

    def rounded(*arrays):
        return (a.astype(dtype) for a in arrays)

    reference = stacked_reference.sparse_split(split, M)
    expected_sd = stacked_reference.token_sd(reference, c, sd, floor)
    by_token, by_row = split.entries(dtype)
    args = (*by_token, split.entry_drawn)
    token_sd = np.empty((T, K * V), dtype=dtype)
    stacked_kernels.token_sd(*args, *rounded(c, sd), floor, token_sd)
    rtol = 1e-12 if dtype == np.float64 else 1e-6

    def assert_close(actual, expected):
        np.testing.assert_allclose(
            actual, expected, rtol=rtol, atol=rtol * np.abs(expected).max()
        )

    assert_close(token_sd, expected_sd)
    # The kernels' own spreads from here, in both.
    f = np.empty((K, S, T, V))
    stacked_kernels.unary(
        *by_token, *by_row, *rounded(c, mean, sd), token_sd, *rounded(eps, xi), f
    )
    token_sd = token_sd.astype(np.float64)
    assert_close(f, stacked_reference.unary(reference, c, mean, sd, token_sd, eps, xi))
    d_cm, d_cs = np.zeros((M, K * V)), np.zeros((M, K * V))
    stacked_kernels.backward(
        *split.lone_entries(dtype), *by_row, *rounded(c, sd, token_sd, eps, xi), g,
        d_cm, d_cs,
    )
    expected_cm, expected_cs = stacked_reference.backward(
        reference, c, sd, token_sd, eps, xi, g
    )
    assert_close(d_cm, expected_cm)
    assert_close(d_cs, expected_cs)
    if dtype == np.float32:
        # Mixed precision is refused, not silently converted.
        with pytest.raises((TypeError, ValueError)):
            stacked_kernels.token_sd(
                *args, c, sd.astype(dtype), floor, np.empty((T, K * V), dtype)
            )


def _assert_gaussian(samples, mean, cov):
    """``samples`` (S, T) have mean ``mean`` (to 4 standard errors of the
    widest token) and covariance ``cov`` (to 5 % of its largest variance)."""
    sd = np.sqrt(np.diag(cov))
    np.testing.assert_allclose(
        samples.mean(axis=0), mean, atol=4 * sd.max() / np.sqrt(len(samples))
    )
    np.testing.assert_allclose(
        np.cov(samples, rowvar=False).reshape(cov.shape), cov,
        atol=0.05 * cov.diagonal().max(),
    )


@pytest.mark.parametrize("dense", [False, True])
def test_stacked_samples_have_each_sequence_s_gaussian(dense):
    # The stacked form samples the lone rows through one draw per token;
    # the potentials of every sequence must still have the Gaussian of
    # eq. 18-19, mean B_n^T m and covariance B_n^T diag(s^2) B_n + floor I,
    # including the covariance between tokens that share a feature or the
    # bias. Compared on 40,000 samples (standard error of a covariance
    # entry about 1 % of the variances here).
    rng = np.random.default_rng(4)
    X, X_chunk, offsets, kernel = _stacked_problem(dense, rng)
    inducing = InducingFeatures(X.shape[1])
    params = _random_params(rng, 1, False, M=inducing.n_inducing)
    params.q_sqrt[:] = rng.uniform(0.8, 1.5, size=params.q_sqrt.shape)
    S, floor = 40_000, 1e-6
    recorder = _RecordUnary()
    shared = SharedState(
        inducing, inducing.prepare(kernel), kernel, params,
        np.zeros((S, V, V)), recorder, S, "pathwise",
        need_kernel_gradient=False, residual_floor=floor,
    )
    chunk = Chunk(
        X_chunk, offsets, np.zeros(8, np.int64), np.random.SeedSequence(3),
        layout=inducing.chunk_layout(X_chunk, offsets),
    )
    chunk_terms(chunk, shared)
    f = recorder.unary  # (S, n_tokens, V)
    scales = shared.inducing_state
    for n, (rows, values) in enumerate(_sequence_blocks(X, offsets, X.shape[1])):
        t0, t1 = offsets[n], offsets[n + 1]
        if t1 == t0:
            continue
        B_n = scales[rows][:, None] * values
        for j in range(V):
            mean = B_n.T @ params.q_mu[0, j, rows]
            cov = B_n.T @ (params.q_sqrt[0, j, rows, None] ** 2 * B_n)
            cov += floor * np.eye(t1 - t0)
            _assert_gaussian(f[:, t0:t1, j], mean, cov)
    # Tokens of a sequence are correlated (the bias row at least).
    first = f[:, offsets[0] : offsets[1], 0]
    assert np.corrcoef(first, rowvar=False)[0, 1] > 0.05


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_antithetic_normal_pairs_each_draw_with_its_negation(axis, dtype):
    shape = (5, 7, 4)
    out = antithetic_normal(np.random.default_rng(0), shape, axis, dtype)
    assert out.shape == shape and out.dtype == dtype
    pairs = np.moveaxis(out, axis, 0)
    n = pairs.shape[0]
    # positions 2i and 2i + 1 mirror each other; an odd length (5 and 7)
    # ends with one unpaired draw
    np.testing.assert_array_equal(pairs[1::2], -pairs[0 : 2 * (n // 2) : 2])
    # the drawn half is the generator's stream, in order: one draw per pair
    half = list(np.moveaxis(np.empty(shape), axis, 0).shape)
    half[0] = (n + 1) // 2
    expected = np.random.default_rng(0).standard_normal(
        np.moveaxis(np.empty(half), 0, axis).shape, dtype=dtype
    )
    np.testing.assert_array_equal(pairs[::2], np.moveaxis(expected, axis, 0))
    with pytest.raises(ValueError, match=r"axis must be in \[-3, 3\)"):
        antithetic_normal(np.random.default_rng(0), shape, 3, dtype)


@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("dense", [False, True])
def test_prediction_samples_have_each_sequence_s_gaussian(dense, antithetic):
    # predict_marginals samples a chunk in the stacked form with each
    # sequence's noise from its own generator (sample_unary_stacked, single
    # precision): every sequence must have the Gaussian of eq. 18-19 (no
    # residual: inducing features are exact), per mixture component, and
    # sequences must be independent of each other. 40,000 samples, as above.
    # In antithetic pairs, the odd samples are the even ones reflected about
    # the mean (every noise source negated), and the even ones (20,000
    # independent draws) have the Gaussian.
    rng = np.random.default_rng(5)
    X, X_chunk, offsets, kernel = _stacked_problem(dense, rng)
    inducing = InducingFeatures(X.shape[1])
    K, S = 2, 40_000
    params = _random_params(rng, K, False, M=inducing.n_inducing)
    scales = inducing.prepare(kernel)
    layout = inducing.chunk_layout(X_chunk, offsets)
    stacked = inducing.stacked_projection(scales, layout)
    n_seq = len(offsets) - 1

    def sample(seeds):
        rngs = [np.random.default_rng(seed) for seed in seeds]
        return sample_unary_stacked(
            params, stacked, layout.row_starts, offsets, S, rngs,
            antithetic=antithetic,
        )

    f = sample(range(n_seq))
    assert f.shape == (K, S, offsets[-1], V) and f.dtype == np.float64
    drawn = f[:, ::2] if antithetic else f
    blocks = list(_sequence_blocks(X, offsets, X.shape[1]))
    for n, (rows, values) in enumerate(blocks):
        t0, t1 = offsets[n], offsets[n + 1]
        if t1 == t0:
            continue
        B_n = scales[rows][:, None] * values
        for k in range(K):
            for j in range(V):
                mean = B_n.T @ params.q_mu[k, j, rows]
                cov = B_n.T @ (params.q_sqrt[k, j, rows, None] ** 2 * B_n)
                _assert_gaussian(drawn[k, :, t0:t1, j], mean, cov)
                if antithetic:  # (sums in single precision)
                    np.testing.assert_allclose(
                        f[k, 1::2, t0:t1, j], 2 * mean - f[k, ::2, t0:t1, j],
                        rtol=0, atol=1e-4 * (1 + np.abs(f[k, :, t0:t1, j]).max()),
                    )
    # Sequences 0 and 2 share the bias and may share features, yet each has
    # its own draw: their tokens are uncorrelated.
    between = np.corrcoef(drawn[0, :, 0, 0], drawn[0, :, offsets[2], 0])[0, 1]
    assert abs(between) < 4 / np.sqrt(drawn.shape[1])
    # A sequence's samples come from its own generator only.
    other = sample([0, 11, 12, 13])
    np.testing.assert_array_equal(other[:, :, : offsets[1]], f[:, :, : offsets[1]])
    assert not np.array_equal(other[:, :, offsets[2] :], f[:, :, offsets[2] :])
    other = sample([10, 1, 2, 3])
    np.testing.assert_array_equal(other[:, :, offsets[1] :], f[:, :, offsets[1] :])
    assert not np.array_equal(other[:, :, : offsets[1]], f[:, :, : offsets[1]])


def test_stacked_chunk_agrees_with_the_per_sequence_loop_in_expectation():
    # The stacked form (in single precision, as the estimator runs it) and
    # the per-sequence loop sample the same distribution with different
    # random numbers: their ELL estimates and gradients agree up to Monte
    # Carlo error, 5 standard errors of the difference measured over 24
    # independent keys (136 entries: with 23 degrees of freedom a false
    # alarm somewhere has a probability below 1 %; 8 keys and 4 standard
    # errors, as before, one near 50 %).
    rng = np.random.default_rng(4)
    X, X_chunk, offsets, kernel = _stacked_problem(False, rng)
    inducing = InducingFeatures(X.shape[1])
    params = _random_params(rng, 2, False, M=inducing.n_inducing)
    labels = rng.integers(V, size=8)
    S = 2000
    seed = np.random.SeedSequence(3)
    looped = Chunk(X_chunk, offsets, labels, seed)
    stacked = Chunk(
        X_chunk, offsets, labels, seed, layout=inducing.chunk_layout(X_chunk, offsets)
    )
    names = ["ell", "q_mu", "q_sqrt", "weights", "inducing_state", "theta"]
    draws = {"looped": [], "stacked": []}
    for key in range(1, 25):
        shared = SharedState(
            inducing, inducing.prepare(kernel), kernel, params,
            np.random.default_rng(key).normal(size=(S, V, V)), ChainCRF(), S,
            "pathwise", need_kernel_gradient=True, residual_floor=1e-6,
            iteration_key=key,
        )
        for name, chunk in (("looped", looped), ("stacked", stacked)):
            out = chunk_terms(chunk, shared)
            draws[name].append(np.concatenate([np.ravel(out[k]) for k in names]))
    a, b = np.array(draws["looped"]), np.array(draws["stacked"])
    standard_error = np.sqrt((a.var(axis=0) + b.var(axis=0)) / len(a))
    difference = np.abs(a.mean(axis=0) - b.mean(axis=0))
    assert np.all(difference <= 5 * standard_error + 1e-9)
    # Not vacuous: the estimates move between keys, and agree far better
    # than the gradient's own size.
    assert np.all(standard_error[:1] > 0)
    assert np.linalg.norm(difference) < 0.05 * np.linalg.norm(a.mean(axis=0))


@pytest.mark.parametrize("estimator", ["pathwise", "score"])
def test_compact_chunks_give_the_full_layout_s_elbo(estimator):
    # A chunk evaluated on its own features only (compact layout) gives the
    # ELBO and gradient of the same chunk laid out on all features.
    kw = dict(K=2, features=True, estimator=estimator, S=4, n_features=40)
    full_objective, _, x0 = _problem("grouped", **kw)
    for chunk in full_objective.chunks:  # the stacked form, on all features
        chunk.layout = full_objective.inducing.chunk_layout(chunk.X, chunk.offsets)
    compact_objective, _, _ = _problem("grouped", compact=True, **kw)
    supports = [
        compact_objective.inducing.support(c.layout) for c in compact_objective.chunks
    ]
    assert all(0 < s.size < 41 for s in supports)  # strictly fewer features
    reference = x0 + 0.03 * np.random.default_rng(5).normal(size=x0.shape)
    reference = reference if estimator == "score" else None
    with Parallel(n_jobs=1) as parallel:
        a = full_objective.evaluate(x0, parallel, reference=reference)
        b = compact_objective.evaluate(x0, parallel, reference=reference)
    np.testing.assert_allclose(b.elbo, a.elbo, rtol=1e-12)
    np.testing.assert_allclose(b.gradient, a.gradient, rtol=1e-9, atol=1e-12)


def test_self_normalised_score_objective_is_consistent():
    # Away from its reference the self-normalised objective estimates the ELL
    # at x (with an O(1/S) bias): with many samples it matches the pathwise
    # estimate at x.
    x = None
    values = {"score": [], "pathwise": []}
    for estimator in values:
        objective, layout, x0 = _problem("rbf", estimator=estimator, S=400)
        x = x0 if x is None else x
        reference = x + 0.05 * np.random.default_rng(4).normal(size=x.shape)
        with Parallel(n_jobs=1) as parallel:
            for key in range(1, 9):
                values[estimator].append(
                    objective.evaluate(
                        x, parallel, iteration_key=key, reference=reference
                    ).ell
                )
    score, pathwise = np.array(values["score"]), np.array(values["pathwise"])
    stderr = np.sqrt(score.var() / score.size + pathwise.var() / pathwise.size)
    assert abs(score.mean() - pathwise.mean()) < 4 * stderr + 0.01 * abs(
        pathwise.mean()
    )


def test_elbo_is_deterministic_with_fixed_samples():
    objective, _, x0 = _problem("rbf", K=2, full=True)
    with Parallel(n_jobs=1) as parallel:
        first = objective.evaluate(x0, parallel)
        second = objective.evaluate(x0, parallel)
    assert first.elbo == second.elbo
    np.testing.assert_array_equal(first.gradient, second.gradient)


# ---------------------------------------------------------------------- #
# Score estimator: exact gradient of an importance-weighted objective.
def _reference_marginal(kernel, Z, X_n, q_mu_kj, cov_kj, floor):
    """Mean and covariance of q(f_n) for one label, from eq. 18-19 (whitened).

    Written from the textbook formulas with plain inverses, independently of
    the engine: A = K_nz K_zz^{-1} L, b = A m, Sigma = A S A^T + diag(resid).
    """
    K_zz = kernel(Z)
    L = np.linalg.cholesky(K_zz)
    K_nz = kernel(X_n, Z)
    A = K_nz @ np.linalg.inv(K_zz) @ L
    resid = np.diag(kernel(X_n)) - np.einsum("tm,tm->t", A, A)
    resid = np.maximum(resid, 0.0) + floor
    S = cov_kj if cov_kj.ndim == 2 else np.diag(cov_kj)
    sigma = A @ S @ A.T + np.diag(resid)
    sigma += np.eye(len(sigma)) * 1e-8 * (np.mean(np.diag(sigma)) + 1e-12)
    return A @ q_mu_kj, sigma


def test_score_gradient_is_exact_gradient_of_importance_weighted_objective():
    # Without the control variate, the score estimate at lam0 is the exact
    # gradient of J(lam) = 1/S sum_{n,s} w_ns(lam) log p(y_n | f_ns, P_s),
    # w_ns = q_lam(f_ns) q_lam(P_s) / (q_lam0(f_ns) q_lam0(P_s)), with the
    # samples f_ns, P_s drawn once at lam0.
    objective, layout, x0 = _problem("rbf", K=1, full=True, estimator="score", S=4)
    chunk = objective.chunks[0]
    likelihood = ChainCRF()

    def shared_state(vector):
        params, theta = layout.unpack(vector)
        kernel = objective.kernel_at(theta)
        return SharedState(
            inducing=objective.inducing,
            inducing_state=np.linalg.cholesky(kernel(objective.inducing.Z)),
            kernel=kernel,
            params=params,
            pairwise_noise=objective.pairwise_noise,
            likelihood=likelihood,
            n_samples=objective.n_samples,
            estimator="score",
            need_kernel_gradient=True,
            residual_floor=objective.residual_floor,
            control_variate=False,
        )

    # Draw the samples the engine uses at x0, by replaying its recipe: the
    # engine exposes them only through log p, so recompute them here from
    # the reference marginal with the same base noise.
    state0 = shared_state(x0)
    params0, theta0 = layout.unpack(x0)
    kernel0 = objective.kernel_at(theta0)
    S = objective.n_samples
    rng = np.random.default_rng(
        np.random.SeedSequence(
            entropy=chunk.seed.entropy, spawn_key=(*chunk.seed.spawn_key, 0)
        )
    )
    T = chunk.n_tokens
    eta = rng.standard_normal((2, 1, V, T, S))[0, 0]  # (V, T, S)
    cov0 = params0.q_cov()[0]
    samples = []  # per sequence: f of shape (S, T_n, V), means, covs
    for n in range(chunk.n_sequences):
        t0, t1 = chunk.offsets[n], chunk.offsets[n + 1]
        f = np.empty((S, t1 - t0, V))
        for j in range(V):
            mean, sigma = _reference_marginal(
                kernel0, objective.inducing.Z, chunk.X[t0:t1], params0.q_mu[0, j],
                cov0[j], objective.residual_floor,
            )
            f[:, :, j] = (mean[:, None] + np.linalg.cholesky(sigma) @ eta[j, t0:t1]).T
        samples.append(f)
    pair0 = params0.pairwise_mean + params0.pairwise_std * objective.pairwise_noise
    log_p = np.stack(
        [
            likelihood.log_prob(
                f, pair0, np.array([0, f.shape[1]]), chunk.labels[t0:t1]
            )[:, 0]
            for f, t0, t1 in zip(
                samples, chunk.offsets[:-1], chunk.offsets[1:], strict=True
            )
        ]
    )  # (n_seq, S)

    def log_q(vector):
        params, theta = layout.unpack(vector)
        kernel = objective.kernel_at(theta)
        cov = params.q_cov()[0]
        out = np.zeros((chunk.n_sequences, S))
        for n, f in enumerate(samples):
            t0, t1 = chunk.offsets[n], chunk.offsets[n + 1]
            for j in range(V):
                mean, sigma = _reference_marginal(
                    kernel, objective.inducing.Z, chunk.X[t0:t1], params.q_mu[0, j],
                    cov[j], objective.residual_floor,
                )
                out[n] += stats.multivariate_normal(mean, sigma).logpdf(f[:, :, j])
        pair_q = stats.norm(params.pairwise_mean, params.pairwise_std)
        pair_logpdf = pair_q.logpdf(pair0)
        return out + pair_logpdf.sum(axis=(1, 2))[None, :]

    log_q0 = log_q(x0)

    def weighted_objective(vector):
        return np.sum(np.exp(log_q(vector) - log_q0) * log_p) / S

    out = chunk_terms(chunk, state0)
    np.testing.assert_allclose(out["ell"], log_p.sum() / S, rtol=1e-10)
    grads = VariationalParameters(
        out["q_mu"], out["q_sqrt"], out["weights"], out["pairwise_mean"],
        out["pairwise_std"],
    )
    L0, _ = jitter_cholesky(kernel0(objective.inducing.Z))
    theta_grad = out["theta"] + kernel0.gradient_vjp(
        objective.inducing.Z, None, cholesky_backward(L0, out["inducing_state"])
    )
    # The ELL does not depend on the pairwise prior variance (KL only).
    engine = layout.pack_gradient(params0, grads, theta_grad, prior_grad=0.0)
    rng = np.random.default_rng(2)
    for name, sl in layout.slices.items():
        if sl.stop == sl.start or name == "logits":
            continue
        direction = np.zeros_like(x0)
        direction[sl] = rng.normal(size=sl.stop - sl.start)
        h = 1e-5
        finite_diff = (
            weighted_objective(x0 + h * direction)
            - weighted_objective(x0 - h * direction)
        ) / (2 * h)
        np.testing.assert_allclose(
            engine @ direction, finite_diff, rtol=1e-4, atol=1e-6, err_msg=name
        )


@pytest.mark.parametrize("K, full", [(1, False), (2, True)])
def test_score_and_pathwise_agree_in_expectation(K, full):
    means, errors = {}, {}
    for estimator in ("pathwise", "score"):
        objective, layout, x0 = _problem(
            "rbf", K=K, full=full, estimator=estimator, S=64
        )
        grads = []
        with Parallel(n_jobs=1) as parallel:
            for key in range(1, 31):
                objective.pairwise_noise = np.random.default_rng(key).normal(
                    size=objective.pairwise_noise.shape
                )
                evaluation = objective.evaluate(x0, parallel, iteration_key=key)
                grads.append(evaluation.gradient)
        grads = np.array(grads)
        means[estimator] = grads.mean(axis=0)
        errors[estimator] = grads.std(axis=0) / np.sqrt(len(grads))
    z = (means["pathwise"] - means["score"]) / np.sqrt(
        errors["pathwise"] ** 2 + errors["score"] ** 2 + 1e-12
    )
    # Unbiased estimators: |z| is a standard normal deviate per coordinate.
    assert np.mean(np.abs(z)) < 1.3
    assert np.max(np.abs(z)) < 5.0
    assert np.corrcoef(means["pathwise"], means["score"])[0, 1] > 0.95


class _LinearInPotentials(Likelihood):
    """``log p(y | f, P) = sum_t f[t, y_t] + P[0, 1]`` per sequence: its
    expected value is linear in the posterior means, so one pathwise draw
    gives the exact gradient with respect to them."""

    has_gradient = True

    def _log_prob(self, unary, pairwise, offsets, labels):
        return self._log_prob_and_gradient(unary, pairwise, offsets, labels)[0]

    def _log_prob_and_gradient(self, unary, pairwise, offsets, labels):
        S, T, n_labels = unary.shape
        n_seq = len(offsets) - 1
        own = unary[:, np.arange(T), labels]  # (S, T)
        log_p = np.add.reduceat(own, offsets[:-1], axis=1) + pairwise[:, 0, 1, None]
        grad_unary = np.zeros_like(unary)
        grad_unary[:, np.arange(T), labels] = 1.0
        grad_pairwise = np.zeros((S, n_seq, n_labels, n_labels))
        grad_pairwise[:, :, 0, 1] = 1.0
        return log_p, grad_unary, grad_pairwise


@pytest.mark.parametrize(
    "reference, block",
    [(False, "pairwise_mean"), (True, "pairwise_mean"), (True, "q_mu")],
)
def test_score_gradient_is_unbiased_with_two_samples(reference, block):
    # With the samples' own values in their baseline, the score gradient
    # was (S - 1) / S of the exact one in expectation: half at S = 2, in the
    # fit's importance-weighted rounds (reference) for every block, and in
    # the plain estimator for the transitions (whose control variate reused
    # the estimate's transition draws).
    objective, layout, x0 = _problem(
        "linear", features=True, estimator="pathwise", S=2
    )
    objective.likelihood = _LinearInPotentials()
    # The other block's spread small (inducing features: no residual), so
    # that this block's score is not drowned in its noise.
    spread = {"q_sqrt": 0.01, "pairwise_log_std": 0.01}
    spread["q_sqrt" if block == "q_mu" else "pairwise_log_std"] = 0.3
    for name, sd in spread.items():
        x0[layout.slices[name]] = np.log(sd)
    with Parallel(n_jobs=1) as parallel:
        exact = objective.evaluate(x0, parallel, include_kl=False).gradient
        objective.estimator = "score"
        grads = []
        for key in range(1, 201):
            objective.pairwise_noise = np.random.default_rng(key).normal(
                size=objective.pairwise_noise.shape
            )
            grads.append(objective.evaluate(
                x0, parallel, iteration_key=key, include_kl=False,
                reference=x0 if reference else None,
            ).gradient)
    sl = layout.slices[block]
    e = exact[sl]
    assert np.abs(e).max() > 0.5  # the block has a gradient
    # The mean gradient's projection on the exact one, in its units.
    slopes = np.array(grads)[:, sl] @ e / (e @ e)
    mean, error = slopes.mean(), slopes.std() / np.sqrt(len(slopes))
    assert error < 0.1  # precise enough to tell 1 from 1/2 (4 errors: 0.4)
    assert abs(mean - 1.0) < 4 * error, (mean, error)


def test_score_estimator_refuses_one_sample():
    # Each sample's baseline is the mean of the others: one has none.
    objective, layout, x0 = _problem("rbf", estimator="score", S=2)
    with pytest.raises(ValueError, match="needs n_samples >= 2"):
        SparseELBO(
            objective.chunks, objective.inducing, objective.kernel,
            ChainCRF(), layout, n_samples=1, estimator="score",
            pairwise_prior_variance=1.0,
            pairwise_noise=objective.pairwise_noise[:1], residual_floor=1e-6,
        )


def test_control_variate_reduces_variance():
    variances = {}
    for control_variate in (True, False):
        objective, layout, x0 = _problem("rbf", estimator="score", S=8)
        params, theta = layout.unpack(x0)
        kernel = objective.kernel_at(theta)
        grads = []
        for key in range(1, 41):
            state = SharedState(
                inducing=objective.inducing,
                inducing_state=np.linalg.cholesky(kernel(objective.inducing.Z)),
                kernel=kernel, params=params,
                pairwise_noise=objective.pairwise_noise, likelihood=ChainCRF(),
                n_samples=8, estimator="score", need_kernel_gradient=False,
                residual_floor=1e-6, iteration_key=key,
                control_variate=control_variate,
            )
            grads.append(chunk_terms(objective.chunks[0], state)["q_mu"].ravel())
        variances[control_variate] = np.var(np.array(grads), axis=0).sum()
    assert variances[True] < 0.5 * variances[False]


# ---------------------------------------------------------------------- #
# KL terms
def _kl_gaussians(m0, S0, m1, S1):
    """KL(N(m0, S0) || N(m1, S1)), the textbook closed form."""
    S1_inv = np.linalg.inv(S1)
    d = m1 - m0
    return 0.5 * (
        np.trace(S1_inv @ S0)
        + d @ S1_inv @ d
        - len(m0)
        + np.linalg.slogdet(S1)[1]
        - np.linalg.slogdet(S0)[1]
    )


@pytest.mark.parametrize("full", [False, True])
def test_kl_unary_single_component_is_exact(full):
    rng = np.random.default_rng(3)
    params = _random_params(rng, 1, full)
    kl, _ = kl_unary(params)
    cov = params.q_cov()[0]
    expected = sum(
        _kl_gaussians(
            params.q_mu[0, j],
            cov[j] if full else np.diag(cov[j]),
            np.zeros(M),
            np.eye(M),
        )
        for j in range(V)
    )
    np.testing.assert_allclose(kl, expected, rtol=1e-12)


@pytest.mark.parametrize("full", [False, True])
def test_kl_unary_mixture_is_jensen_bound(full):
    rng = np.random.default_rng(4)
    V1, M1, K = 1, 2, 3
    params = _random_params(rng, K, full, V=V1, M=M1)
    kl, _ = kl_unary(params)
    cov = params.q_cov()[:, 0]
    covs = [c if full else np.diag(c) for c in cov]
    mus = params.q_mu[:, 0]
    w = params.weights
    # eq. 35 written out with scipy densities.
    entropy_bound = -sum(
        w[k]
        * np.log(
            sum(
                w[o] * stats.multivariate_normal(mus[o], covs[k] + covs[o]).pdf(mus[k])
                for o in range(K)
            )
        )
        for k in range(K)
    )
    cross = sum(
        w[k] * (-0.5 * (M1 * np.log(2 * np.pi) + mus[k] @ mus[k] + np.trace(covs[k])))
        for k in range(K)
    )
    np.testing.assert_allclose(kl, -(entropy_bound + cross), rtol=1e-10)
    # The bound is above the true KL, estimated by Monte Carlo.
    draws_rng = np.random.default_rng(5)
    comp = draws_rng.choice(K, size=200_000, p=w)
    draws = np.empty((comp.size, M1))
    for c in range(K):
        idx = comp == c
        draws[idx] = draws_rng.multivariate_normal(mus[c], covs[c], size=idx.sum())
    log_q = logsumexp(
        np.stack(
            [np.log(w[c]) + stats.multivariate_normal(mus[c], covs[c]).logpdf(draws)
             for c in range(K)]
        ),
        axis=0,
    )
    log_p = stats.multivariate_normal(np.zeros(M1), np.eye(M1)).logpdf(draws)
    kl_mc = np.mean(log_q - log_p)
    assert kl >= kl_mc - 4 * np.std(log_q - log_p) / np.sqrt(draws.shape[0])


@pytest.mark.parametrize("K, full", [(1, False), (1, True), (3, False), (2, True)])
def test_kl_unary_gradient(K, full):
    rng = np.random.default_rng(6)
    params = _random_params(rng, K, full)
    layout = ParameterLayout(K, V, M, full, 0)
    x0 = layout.pack(params)
    _, grads = kl_unary(params)
    grad = layout.pack_gradient(params, grads)

    def value(x):
        return kl_unary(layout.unpack(x)[0])[0]

    direction = rng.normal(size=x0.shape)
    h = 1e-6
    finite_diff = (value(x0 + h * direction) - value(x0 - h * direction)) / (2 * h)
    np.testing.assert_allclose(grad @ direction, finite_diff, rtol=1e-6)


def test_kl_unary_diagonal_packed_matches_kl_unary():
    # The packed shortcut of one diagonal component against kl_unary chained
    # through pack_gradient (itself checked by finite differences above).
    rng = np.random.default_rng(16)
    params = _random_params(rng, 1, False)
    layout = ParameterLayout(1, V, M, False, 0)
    vector = layout.pack(params)
    kl, grads = kl_unary(params)
    expected = -layout.pack_gradient(params, grads)
    out = np.full(layout.size, np.nan)
    value = kl_unary_diagonal_packed(
        params.q_mu, params.q_sqrt, vector[layout.slices["q_sqrt"]],
        out_mu=out[layout.slices["q_mu"]], out_log_sqrt=out[layout.slices["q_sqrt"]],
    )
    np.testing.assert_allclose(value, kl, rtol=1e-12)
    part = slice(0, layout.tail_start)
    np.testing.assert_allclose(out[part], expected[part], rtol=1e-12, atol=1e-14)


def test_support_gradient_is_the_packed_gradient_on_its_indices():
    # A compact chunk's gradient, given on its support, scatters to the
    # packed gradient of the same arrays written at full size.
    rng = np.random.default_rng(17)
    K, M_ = 1, 9
    params = _random_params(rng, K, False, M=M_)
    layout = ParameterLayout(K, V, M_, False, 2, learn_pairwise_prior=True)
    support = np.array([1, 4, 5, 8])
    grad_mu = rng.normal(size=(K, V, support.size))
    grad_sqrt = rng.normal(size=(K, V, support.size))
    full_mu, full_sqrt = np.zeros((K, V, M_)), np.zeros((K, V, M_))
    full_mu[:, :, support], full_sqrt[:, :, support] = grad_mu, grad_sqrt
    small = dict(weights=np.zeros(K), pairwise_mean=rng.normal(size=(V, V)),
                 pairwise_std=rng.normal(size=(V, V)))
    theta_grad, prior_grad = np.array([0.3, -1.2]), 0.7
    expected = layout.pack_gradient(
        params, VariationalParameters(full_mu, full_sqrt, **small), theta_grad,
        prior_grad,
    )
    indices = layout.support_indices(support)
    values = layout.pack_support_gradient(
        params, support, grad_mu, grad_sqrt,
        VariationalParameters(None, None, **small), theta_grad, prior_grad,
    )
    assert indices.shape == values.shape
    assert np.unique(indices).size == indices.size
    scattered = np.zeros(layout.size)
    scattered[indices] = values
    np.testing.assert_array_equal(scattered, expected)
    # Every coordinate outside the indices is a q_mu or q_sqrt entry of an
    # inducing variable outside the support.
    outside = np.setdiff1d(np.arange(layout.size), indices)
    assert outside.size == 2 * K * V * (M_ - support.size)
    assert outside.max() < layout.tail_start


def test_kl_pairwise_closed_form_and_gradient():
    rng = np.random.default_rng(7)
    mean, std = rng.normal(size=(V, V)), rng.uniform(0.2, 2, size=(V, V))
    kl, g_mean, g_std, g_log_prior = kl_pairwise(mean, std, 2.5)
    expected = _kl_gaussians(
        mean.ravel(), np.diag(std.ravel() ** 2), np.zeros(V * V), 2.5 * np.eye(V * V)
    )
    np.testing.assert_allclose(kl, expected, rtol=1e-12)
    h = 1e-6
    d = rng.normal(size=(V, V))
    fd_mean = (kl_pairwise(mean + h * d, std, 2.5)[0]
               - kl_pairwise(mean - h * d, std, 2.5)[0]) / (2 * h)
    fd_std = (kl_pairwise(mean, std + h * d, 2.5)[0]
              - kl_pairwise(mean, std - h * d, 2.5)[0]) / (2 * h)
    fd_prior = (kl_pairwise(mean, std, 2.5 * np.exp(h))[0]
                - kl_pairwise(mean, std, 2.5 * np.exp(-h))[0]) / (2 * h)
    np.testing.assert_allclose(np.sum(g_mean * d), fd_mean, rtol=1e-6)
    np.testing.assert_allclose(np.sum(g_std * d), fd_std, rtol=1e-6)
    np.testing.assert_allclose(g_log_prior, fd_prior, rtol=1e-6)


def test_parameter_layout_round_trip():
    rng = np.random.default_rng(8)
    for K, full in [(1, False), (2, True)]:
        params = _random_params(rng, K, full)
        layout = ParameterLayout(K, V, M, full, 2)
        vector = layout.pack(params, np.array([0.1, -0.2]))
        back, theta = layout.unpack(vector)
        for a, b in zip(params.astuple(), back.astuple(), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12)
        np.testing.assert_allclose(theta, [0.1, -0.2])
        np.testing.assert_allclose(layout.pack(back, theta), vector, rtol=1e-12)


# ---------------------------------------------------------------------- #
# Monte Carlo ELL against enumeration
def test_monte_carlo_ell_matches_enumeration():
    objective, layout, x0 = _problem("rbf", K=2, full=True, S=4000)
    params, theta = layout.unpack(x0)
    kernel = objective.kernel_at(theta)
    with Parallel(n_jobs=1) as parallel:
        ell = objective.evaluate(x0, parallel).ell
    # Independent estimate: draw f from the reference marginal of every
    # sequence, score each labelling by enumerating all V**T paths.
    rng = np.random.default_rng(11)
    S = 4000
    cov = params.q_cov()
    total, variance = 0.0, 0.0
    for chunk in objective.chunks:
        for n in range(chunk.n_sequences):
            t0, t1 = chunk.offsets[n], chunk.offsets[n + 1]
            y_n = chunk.labels[t0:t1]
            for k in range(params.weights.shape[0]):
                f = np.empty((S, t1 - t0, V))
                for j in range(V):
                    mean, sigma = _reference_marginal(
                        kernel, objective.inducing.Z, chunk.X[t0:t1], params.q_mu[k, j],
                        cov[k, j], objective.residual_floor,
                    )
                    f[:, :, j] = rng.multivariate_normal(mean, sigma, size=S)
                pair = params.pairwise_mean + params.pairwise_std * rng.normal(
                    size=(S, V, V)
                )
                values = np.empty(S)
                for s in range(S):
                    log_z = enumerate_one(f[s], pair[s])[0]
                    score = f[s, np.arange(t1 - t0), y_n].sum() + pair[
                        s, y_n[:-1], y_n[1:]
                    ].sum()
                    values[s] = score - log_z
                total += params.weights[k] * values.mean()
                variance += params.weights[k] ** 2 * values.var() / S
    # Both are Monte Carlo estimates with about the same variance.
    assert abs(ell - total) < 4 * np.sqrt(2 * variance)


# ---------------------------------------------------------------------- #
# lone features collapsed (CollapsedFeatures)
def _lone_feature_case():
    """9 tokens over 14 features and a grouped linear kernel: features 0-3
    active at several tokens, 4-11 each at one token (three of them at token
    0, two at token 4), 12 nowhere and 13 only as an explicitly stored zero."""
    rng = np.random.default_rng(7)
    dense = np.zeros((9, 14))
    dense[:, 0] = 1.0
    dense[[1, 3, 8], 1] = rng.normal(size=3)
    dense[[0, 5], 2] = [0.5, -1.5]
    dense[[2, 3, 7], 3] = 1.0
    for j, t in zip(range(4, 12), [0, 0, 0, 2, 4, 4, 6, 8], strict=True):
        dense[t, j] = rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 2.0)
    rows, cols = dense.nonzero()
    X = sp.csr_matrix(
        (np.append(dense[rows, cols], 0.0), (np.append(rows, 1), np.append(cols, 13))),
        shape=dense.shape,
    )
    assert X.nnz == rows.size + 1  # the zero is stored
    kernel = GroupedLinearKernel(
        groups=np.arange(14) % 3, variance=[1.3, 0.4, 2.0], bias=0.7
    )
    return X, dense, kernel


def _structured_posterior(dense, kernel, mu, sd):
    """Mean and covariance of the original white weights (and bias) under
    ``q(g) p(u | g)``, built here from the definition: every token's lone
    weights given their sum ``g = sum_j x_j c_j u_j`` under the prior
    N(0, I), with ``g / sigma ~ N(mu_p, sd_p^2)``; kept weights and bias
    independent with their own mean and sd; the rest at the prior."""
    n_tokens, n_features = dense.shape
    c = kernel.feature_scales(n_features)
    active = dense != 0
    counts = active.sum(axis=0)
    kept = np.flatnonzero(counts >= 2)
    mean, cov = np.zeros(n_features + 1), np.eye(n_features + 1)
    mean[kept], cov[kept, kept] = mu[: kept.size], sd[: kept.size] ** 2
    mean[-1], cov[-1, -1] = mu[-1], sd[-1] ** 2
    p = kept.size
    for t in range(n_tokens):
        lone = np.flatnonzero(active[t] & (counts == 1))
        if lone.size == 0:
            continue
        b = dense[t, lone] * c[lone]
        sigma = np.sqrt(b @ b)
        a = b / sigma  # u_lone | g: mean a g / sigma, covariance I - a a^T
        mean[lone] = a * mu[p]
        cov[np.ix_(lone, lone)] = np.eye(lone.size) - np.outer(a, a) * (1 - sd[p] ** 2)
        p += 1
    assert p == mu.size - 1
    return mean, cov


def test_collapsed_features_sort_the_features_by_their_training_tokens():
    X, _, _ = _lone_feature_case()
    collapsed = CollapsedFeatures.of(X)
    np.testing.assert_array_equal(collapsed.kept, [0, 1, 2, 3])
    np.testing.assert_array_equal(collapsed.lone, np.arange(4, 12))
    np.testing.assert_array_equal(collapsed.tokens, [0, 2, 4, 6, 8])
    assert collapsed.n_inducing == 4 + 5 + 1
    design = collapsed.transform(X).toarray()
    np.testing.assert_array_equal(design[:, :4], X.toarray()[:, :4])
    indicator = np.zeros((9, 5))
    indicator[[0, 2, 4, 6, 8], np.arange(5)] = 1.0
    np.testing.assert_array_equal(design[:, 4:], indicator)


def test_collapsed_features_equal_only_for_the_same_lone_features():
    # What a warm start relies on to continue a collapsed posterior as is.
    X, dense, _ = _lone_feature_case()
    collapsed = CollapsedFeatures.of(X)
    assert collapsed == CollapsedFeatures.of(X)
    assert collapsed == CollapsedFeatures.of(dense)  # the stored zero is inactive
    rescaled = X.copy()
    rescaled[0, 4] *= 2.0  # another value of a lone feature
    moved = dense.copy()
    moved[[2, 3], 7] = moved[[3, 2], 7]  # feature 7 at another token
    for other in (rescaled, moved):
        assert collapsed != CollapsedFeatures.of(other)
    assert collapsed != "collapsed"
    with pytest.raises(TypeError, match="unhashable"):
        hash(collapsed)


def test_collapsed_posterior_is_the_conditional_one_on_the_sums():
    # The collapsed model's potentials and KL divergence are those of the
    # posterior q(g) p(u | g) over the original weights, built explicitly;
    # expand gives that posterior's marginals.
    X, dense, kernel = _lone_feature_case()
    collapsed = CollapsedFeatures.of(X)
    rng = np.random.default_rng(0)
    M = collapsed.n_inducing
    mu, sd = rng.normal(size=M), rng.uniform(0.3, 1.5, size=M)
    mean, cov = _structured_posterior(dense, kernel, mu, sd)

    # Potentials of all 9 tokens: phi(x) = scales * [x, 1] in both spaces.
    design = sp.hstack([collapsed.transform(X), np.ones((9, 1))]).toarray()
    phi_collapsed = design * collapsed.prepare(kernel)
    phi = np.hstack([dense, np.ones((9, 1))]) * kernel.feature_scales(14)
    np.testing.assert_allclose(phi_collapsed @ mu, phi @ mean, atol=1e-12)
    np.testing.assert_allclose(
        phi_collapsed @ np.diag(sd**2) @ phi_collapsed.T, phi @ cov @ phi.T,
        atol=1e-12,
    )

    # KL divergence from the prior (the features active nowhere add zero).
    params = VariationalParameters(
        mu[None, None], sd[None, None], np.ones(1), np.zeros((1, 1)), np.ones((1, 1))
    )
    kl, _ = kl_unary(params)
    expected = _kl_gaussians(mean, cov, np.zeros(15), np.eye(15))
    np.testing.assert_allclose(kl, expected, rtol=1e-12)

    q_mu, q_sqrt = collapsed.expand(mu[None, None], sd[None, None], kernel)
    np.testing.assert_allclose(q_mu[0, 0], mean, atol=1e-14)
    np.testing.assert_allclose(q_sqrt[0, 0], np.sqrt(np.diag(cov)), atol=1e-14)
    assert q_mu[0, 0, 12] == q_mu[0, 0, 13] == 0.0
    assert q_sqrt[0, 0, 12] == q_sqrt[0, 0, 13] == 1.0


def test_collapse_keeps_the_distribution_of_every_sum():
    # From a diagonal posterior over the original weights, the collapsed
    # variable of a token has the mean and variance of sum_j a_j u_j.
    X, dense, kernel = _lone_feature_case()
    collapsed = CollapsedFeatures.of(X)
    rng = np.random.default_rng(1)
    K, V = 2, 3
    mu, sd = rng.normal(size=(K, V, 15)), rng.uniform(0.3, 1.5, size=(K, V, 15))
    out_mu, out_sd = collapsed.collapse(mu, sd, kernel)
    assert out_mu.shape == out_sd.shape == (K, V, collapsed.n_inducing)
    np.testing.assert_array_equal(out_mu[..., :4], mu[..., :4])
    np.testing.assert_array_equal(out_sd[..., -1], sd[..., -1])
    c = kernel.feature_scales(14)
    for p, t in enumerate(collapsed.tokens):
        lone = np.flatnonzero((dense[t] != 0) & ((dense != 0).sum(axis=0) == 1))
        b = dense[t, lone] * c[lone]
        a = b / np.sqrt(b @ b)
        np.testing.assert_allclose(out_mu[..., 4 + p], mu[..., lone] @ a, rtol=1e-12)
        np.testing.assert_allclose(
            out_sd[..., 4 + p] ** 2, sd[..., lone] ** 2 @ a**2, rtol=1e-12
        )
    # Means survive expand after collapse; a token with one lone feature
    # (a = +-1) keeps its standard deviation too.
    back_mu, back_sd = collapsed.expand(out_mu, out_sd, kernel)
    again_mu, _ = collapsed.collapse(back_mu, back_sd, kernel)
    np.testing.assert_allclose(again_mu, out_mu, atol=1e-12)
    np.testing.assert_allclose(back_sd[..., 7], sd[..., 7], rtol=1e-12)


def _sampling_design_by_sparse_algebra(collapsed, X, posterior):
    """The sampling design as sparse algebra, term by term in the order
    :meth:`CollapsedFeatures.sampling_design` sums them: ``a . v`` of every
    token and variable, ``X - (a . v) a / c`` on the lone columns, then
    ``(a . v) / sigma`` in the variables' columns."""
    X = sp.csr_matrix(X, copy=True)
    X.sum_duplicates()
    lone = collapsed.lone
    X_v = X[:, lone] @ sp.diags(posterior.lone_scales)  # x_j c_j
    X_v.sort_indices()  # (a product's rows come unsorted: summed in order)
    a_dot_v = X_v @ posterior.loadings.T
    shift = (a_dot_v @ posterior.loadings) @ sp.diags(posterior.inverse_lone_scales)
    to_original = sp.csr_matrix(
        (np.ones(lone.size), (np.arange(lone.size), lone)),
        shape=(lone.size, X.shape[1]),
    )
    return sp.hstack(
        [X - shift @ to_original, a_dot_v @ sp.diags(posterior.inverse_sigma)],
        format="csr",
    )


def _random_sampling_posterior(collapsed, kernel, rng, lookup):
    """The sampling posterior of a random fitted posterior (two components,
    three labels), without its lookup table unless ``lookup``."""
    K, V, M = 2, 3, collapsed.n_inducing
    fitted = rng.normal(size=(K, V, M)), rng.uniform(0.3, 1.5, size=(K, V, M))
    expanded = collapsed.expand(*fitted, kernel)
    scales = collapsed.original.prepare(kernel)
    posterior = collapsed.sampling_posterior(scales, kernel, expanded, fitted)
    if not lookup:
        posterior = dataclasses.replace(posterior, lone_positions=None)
    return posterior


@pytest.mark.parametrize("lookup", [True, False])
def test_collapsed_sampling_design_is_the_sparse_algebra(lookup):
    # Written on the CSR arrays: the same matrix, entry for entry, as the
    # sparse products, with test tokens holding two lone features of one
    # training token, lone features of two, one exactly cancelled (feature
    # 7, the only lone feature of its token: a = +-1, its shift is x), kept
    # features only, nothing, a stored zero and entries given twice; then
    # tokens with three lone features of one training token, whose a . v
    # depends on the order of its terms.
    # (the lone columns in reverse order: a token's variables then run
    # against their features' columns)
    order = np.r_[0:4, 11:3:-1, 12:14]
    X, _, kernel = _lone_feature_case()
    collapsed = CollapsedFeatures.of(X[:, order])
    rng = np.random.default_rng(3)
    posterior = _random_sampling_posterior(collapsed, kernel, rng, lookup)
    entries = [
        [(0, 1.0), (4, 0.7), (5, -1.2), (12, 2.0)],  # token 0's: 4 and 5
        [(7, 1.3)],  # cancelled
        [(1, 0.5), (8, 2.0), (10, -0.4), (11, 1.1)],  # tokens 4, 6 and 8's
        [(2, 1.0), (3, -1.0)],  # kept features only
        [],
        [(6, 0.0), (9, 1.5)],  # a stored zero at a lone feature
        [(5, 0.25), (5, 0.5), (13, 1.0)],  # feature 5 given twice
    ]
    indptr = np.cumsum([0] + [len(e) for e in entries])
    X_test = sp.csr_matrix(
        ([v for e in entries for _, v in e], [j for e in entries for j, _ in e],
         indptr),
        shape=(len(entries), 14),
    )[:, order]
    expected = _sampling_design_by_sparse_algebra(collapsed, X_test, posterior)
    X_s = collapsed.sampling_design(X_test, posterior)
    assert X_s.shape == expected.shape == (7, 14 + collapsed.n_collapsed)
    np.testing.assert_array_equal(X_s.toarray(), expected.toarray())
    # canonical, and no stored zero: the cancelled entry is gone
    assert X_s.has_canonical_format and X_s.data.all() and X_s.nnz == expected.nnz
    assert X_test[1].nnz == 1 and X_s[1].indices.tolist() == [14 + 1]
    copy = X_s.copy()
    copy.has_canonical_format = False
    copy.sum_duplicates()
    np.testing.assert_array_equal(copy.indices, X_s.indices)
    # a dense X is its sparse form
    dense = collapsed.sampling_design(X_test.toarray(), posterior)
    np.testing.assert_array_equal(dense.toarray(), X_s.toarray())
    # token 0's lone features 4, 5 and 6 at magnitudes where rounding shows
    values = rng.choice([-1.0, 1.0], size=(200, 3)) * 10.0 ** rng.uniform(
        -3, 8, size=(200, 3)
    )
    X_three = sp.csr_matrix(
        (values.ravel(), np.tile([4, 5, 6], 200), np.arange(0, 601, 3)),
        shape=(200, 14),
    )[:, order]
    np.testing.assert_array_equal(
        collapsed.sampling_design(X_three, posterior).toarray(),
        _sampling_design_by_sparse_algebra(collapsed, X_three, posterior).toarray(),
    )


@pytest.mark.parametrize("lookup", [True, False])
def test_collapsed_sampling_design_of_random_tokens_is_the_sparse_algebra(lookup):
    # 60 training tokens, each with two shared features and three to six
    # lone ones; 400 test tokens drawing on all of them at random (several
    # training tokens' lone features in one token, values over eleven
    # decades): the compiled design, entry for entry, is the sparse algebra.
    rng = np.random.default_rng(22)
    shared, n_train = 5, 60
    blocks = [rng.integers(3, 7) for _ in range(n_train)]
    n_features = shared + sum(blocks)
    X_train = np.zeros((n_train, n_features))
    start = shared
    for t, b in enumerate(blocks):
        X_train[t, rng.choice(shared, 2, replace=False)] = 1.0
        X_train[t, start : start + b] = rng.uniform(0.5, 2.0, b)
        start += b
    collapsed = CollapsedFeatures.of(sp.csr_matrix(X_train))
    assert collapsed.n_collapsed == n_train
    kernel = GroupedLinearKernel(
        groups=np.arange(n_features) % 3, variance=[1.3, 0.4, 2.0], bias=0.7
    )
    posterior = _random_sampling_posterior(collapsed, kernel, rng, lookup)
    mask = rng.random((400, n_features)) < 0.08
    values = rng.choice([-1.0, 1.0], size=mask.shape) * 10.0 ** rng.uniform(
        -3, 8, size=mask.shape
    )
    X_test = sp.csr_matrix(np.where(mask, values, 0.0))
    expected = _sampling_design_by_sparse_algebra(collapsed, X_test, posterior)
    X_s = collapsed.sampling_design(X_test, posterior)
    assert X_s.has_canonical_format and X_s.data.all()
    assert X_s.nnz == expected.nnz > X_test.nnz
    np.testing.assert_array_equal(X_s.toarray(), expected.toarray())


def test_nothing_to_collapse():
    # Every feature active at two tokens or more (dense, with a stored zero),
    # or one lone feature per token and none inactive: no fewer variables.
    everywhere = np.arange(1.0, 13.0).reshape(4, 3)
    assert CollapsedFeatures.of(everywhere) is None
    stored_zero = sp.csr_matrix(everywhere)
    stored_zero.data[0] = 0.0
    assert CollapsedFeatures.of(stored_zero) is None
    one_each = np.hstack([np.ones((4, 1)), np.eye(4)])
    assert CollapsedFeatures.of(one_each) is None
    assert CollapsedFeatures.of(sp.csr_matrix(one_each)) is None
    # A feature active nowhere is worth collapsing (it leaves the fit).
    inactive = np.hstack([one_each, np.zeros((4, 1))])
    collapsed = CollapsedFeatures.of(inactive)
    assert collapsed.n_inducing == 1 + 4 + 1
    assert CollapsedFeatures.of(sp.csr_matrix(inactive)).n_inducing == 6


def test_kl_pairwise_at_a_zero_or_infinite_std_is_not_finite_without_warnings():
    # A line search's trial step can make exp(log std) 0 or inf; the KL is
    # then not finite (the trial is rejected), with no RuntimeWarning.
    from skgpstruct.inference.posterior import kl_pairwise

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for std in (np.array([[0.0, 1.0]]), np.array([[np.inf, 1.0]])):
            kl, _, _, _ = kl_pairwise(np.zeros((1, 2)), std, 1.0)
            assert not np.isfinite(kl)


def test_distinct_rows_compares_sparse_rows_by_value():
    # A row stored with an explicit zero, with its entries given twice
    # (summed) or unsorted is the same token as its canonical form (they
    # counted as distinct tokens: repeated inducing inputs, a singular K_zz).
    from skgpstruct.inference.inducing import distinct_rows

    canonical = sp.csr_matrix(np.array([[1.0, 0.0, 2.0], [0.0, 1.0, 0.0]]))
    variants = sp.csr_matrix(
        (np.array([1.0, 0.0, 2.0, 0.5, 0.5, 1.5, 1.0]),
         np.array([0, 1, 2, 1, 1, 2, 0]), np.array([0, 3, 5, 7])),
        shape=(3, 3),
    )  # rows: with a stored zero; 1 given twice; unsorted (1.5, 1.0)
    assert not variants.has_canonical_format
    rows = sp.vstack([canonical, variants], format="csr")
    assert rows.nnz == 10  # every stored entry kept
    dense = rows.toarray()
    np.testing.assert_array_equal(distinct_rows(rows), distinct_rows(dense))
    np.testing.assert_array_equal(distinct_rows(rows), [0, 1, 4])


@pytest.mark.parametrize("points", [False, True])
def test_per_row_samples_in_pairs_mirror_the_mean(points):
    # sample_unary (one draw per inducing variable, then the residual, which
    # inducing points have) in antithetic pairs: the second of each pair is
    # the first reflected about the closed-form mean B_n^T q_mu of every
    # sequence. Pairs are never taken from the fit's cache of base samples.
    X, X_chunk, offsets, kernel = _stacked_problem(False, np.random.default_rng(6))
    if points:
        inducing = InducingPoints(X[distinct_rows(X)[:4]])
    else:
        inducing = InducingFeatures(X.shape[1])
    state = inducing.prepare(kernel)
    params = _random_params(np.random.default_rng(7), 2, False, M=inducing.n_inducing)
    projection = inducing.project(kernel, state, X_chunk, offsets)
    residual_sd = np.sqrt(projection.residual)
    assert (residual_sd.max() > 0.1) == points
    f, _, _ = sample_unary(
        params, projection, residual_sd, 6, np.random.default_rng(8),
        antithetic=True,
    )
    assert f.shape == (2, 6, offsets[-1], V)
    for n, (rows, B_n) in enumerate(zip(projection.rows, projection.B, strict=True)):
        t0, t1 = offsets[n], offsets[n + 1]
        if t1 == t0:
            continue
        q_mu = params.q_mu if rows is None else params.q_mu[:, :, rows]
        mean = np.einsum("rt,kvr->ktv", B_n, q_mu)
        np.testing.assert_allclose(
            f[:, 1::2, t0:t1], 2 * mean[:, None] - f[:, ::2, t0:t1], atol=1e-10
        )
        assert np.abs(f[:, ::2, t0:t1] - mean[:, None]).max() > 1e-2
    with pytest.raises(ValueError, match="antithetic samples are not cached"):
        sample_unary(params, projection, residual_sd, 6, np.random.default_rng(8),
                     cache={}, antithetic=True)


def _lone_dense(U, rows, n_inducing):
    """(T, n_inducing) dense matrix of the lone rows (active at one token) of
    U (rows x tokens): the independent reference of the kernels' split."""
    counts = np.count_nonzero(U, axis=1)
    lone = np.zeros((U.shape[1], n_inducing))
    for r in np.flatnonzero(counts == 1):
        lone[:, rows[r]] += U[r]
    return lone


# Mutant S11 (_stacked.pyx:85, token_sd's `w`, `spread` in the input
# precision instead of double). Goes into tests/test_inference.py, next to
# test_stacked_kernels_against_dense_products.
@pytest.mark.parametrize("stacked_kernels", compiled_builds("_stacked"))
def test_single_precision_token_sd_does_not_overflow_where_the_spread_fits(
    stacked_kernels,
):
    # The docstring of token_sd: the squares are summed in double precision,
    # since (u c sd)^2 overflows float32 once u c sd passes 1.8e19 while the
    # spread itself (up to 3.4e38) fits. Spreads of about 1e20 here.
    U = np.array([
        [1.0, 0.0, 0.0, 0.0],   # lone at token 0
        [0.0, 0.5, 0.0, 0.0],   # lone at token 1
        [0.0, 0.0, 2.0, 0.0],   # lone at token 2
        [1.0, 1.0, 0.0, 1.0],   # drawn (several tokens)
        [0.0, 0.0, -1.5, 0.0],  # lone at token 2
    ])
    rows = np.array([0, 1, 2, 3, 1])
    M, KV, floor = 4, 3, 1e-6
    split = RowSplit.of(sp.csr_matrix(U), rows, M)
    c = np.array([1e10, 3e9, 2e10, 1e10], dtype=np.float32)
    sd = np.full((M, KV), 1e10, dtype=np.float32)
    sd[:, 1] = 2.0  # and ordinary spreads beside them
    lone = _lone_dense(U, rows, M)
    c64, sd64 = c.astype(np.float64), sd.astype(np.float64)
    expected = np.sqrt(lone**2 @ (c64[:, None] * sd64) ** 2 + floor)
    assert np.all(expected < np.finfo(np.float32).max)
    assert expected.max() > 2e19  # so (u c sd)^2 > float32 max
    by_token, _ = split.entries(np.float32)
    out = np.empty((U.shape[1], KV), dtype=np.float32)
    stacked_kernels.token_sd(*by_token, split.entry_drawn, c, sd, floor, out)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, expected, rtol=1e-6)


# Mutant P04 (terms.py:512, sample_unary_stacked with a residual floor:
# prediction samples of inducing features are exact, no residual).
# Goes into tests/test_inference.py, next to
# test_prediction_samples_have_each_sequence_s_gaussian.
def test_prediction_samples_with_a_zero_posterior_spread_are_the_mean():

    rng = np.random.default_rng(0)
    n_features, K, V, S = 6, 2, 3, 4
    lengths = [3, 1, 4]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    T = int(offsets[-1])
    active = rng.random((T, n_features)) < 0.4
    X = rng.uniform(0.5, 2.0, size=(T, n_features)) * active
    kernel = GroupedLinearKernel(
        groups=np.arange(n_features) % 2, variance=[1.3, 0.4], bias=0.7
    )
    inducing = InducingFeatures(n_features)
    M = inducing.n_inducing
    scales = inducing.prepare(kernel)
    layout = inducing.chunk_layout(sp.csr_matrix(X), offsets)
    stacked = inducing.stacked_projection(scales, layout)
    q_mu = rng.normal(size=(K, V, M))
    params = VariationalParameters(
        q_mu, np.zeros((K, V, M)), np.full(K, 1.0 / K), np.zeros((V, V)),
        np.ones((V, V)),
    )
    rngs = [np.random.default_rng(n) for n in range(len(lengths))]
    f = sample_unary_stacked(params, stacked, layout.row_starts, offsets, S, rngs)
    # Reference: the mean B^T q_mu, B the scaled features and the bias.
    design = np.hstack([X, np.ones((T, 1))]) * np.asarray(scales)[None, :]
    mean = np.einsum("tm,kvm->ktv", design, q_mu)
    np.testing.assert_allclose(
        f, np.broadcast_to(mean[:, None], f.shape), rtol=1e-5, atol=1e-5
    )


# Mutant P11 (terms.py:620, expand_local's check of xi's shape removed: a
# token noise of another shape reaches the compiled backward pass, which
# trusts its caller for shapes). Goes into tests/test_stochastic.py next to
# test_local_gradient_of_another_chunk_is_refused (which only tries a bad
# eps), or tests/test_inference.py.
def _small_stacked_chunk(sample_dtype=np.float64):

    rng = np.random.default_rng(0)
    n_features, K, V, S = 6, 2, 3, 4
    offsets = np.array([0, 3, 4, 8], dtype=np.int64)
    T = int(offsets[-1])
    X = sp.csr_matrix(
        rng.uniform(0.5, 2.0, size=(T, n_features))
        * (rng.random((T, n_features)) < 0.4)
    )
    kernel = GroupedLinearKernel(
        groups=np.arange(n_features) % 2, variance=[1.3, 0.4], bias=0.7
    )
    inducing = InducingFeatures(n_features)
    M = inducing.n_inducing
    params = VariationalParameters(
        rng.normal(size=(K, V, M)), rng.uniform(0.3, 1.0, (K, V, M)), np.full(K, 0.5),
        np.zeros((V, V)), np.ones((V, V)),
    )
    shared = SharedState(
        inducing, inducing.prepare(kernel), kernel, params,
        rng.standard_normal((S, V, V)), ChainCRF(), S, "pathwise",
        need_kernel_gradient=False, residual_floor=1e-8, sample_dtype=sample_dtype,
    )
    chunk = Chunk(X, offsets, rng.integers(V, size=T), np.random.SeedSequence(1),
                  layout=inducing.chunk_layout(X, offsets))
    return chunk, shared


def test_expand_local_refuses_a_token_noise_of_another_shape():

    chunk, shared = _small_stacked_chunk()
    out = chunk_terms(chunk, shared, local=True)
    eps, xi = out["noise"]
    q_mu, q_sqrt = expand_local(chunk, shared, out["local"], 0, noise=(eps, xi))
    np.testing.assert_allclose(q_mu, out["q_mu"], rtol=1e-12)  # (sanity)
    # (contiguous, as the kernels take them: a wrong shape must be refused by
    # the check, not by the buffer protocol's contiguity test)
    for bad in (np.ascontiguousarray(xi[:, :, :-1]), np.ascontiguousarray(xi[:, :-1])):
        with pytest.raises(ValueError, match="noise must be"):
            expand_local(chunk, shared, out["local"], 0, noise=(eps, bad))


# Mutant P10 (terms.py:627, expand_local's stacked branch without the
# residual floor: the spread of a token's lone rows, through which the
# q_sqrt gradient of a lone feature goes, is then not the one sampled).
# Goes into tests/test_inference.py (or tests/test_stochastic.py). The
# reference is central finite differences of the chunk's ELL in double
# precision with fixed base samples (iteration key 0: the same draws at
# every evaluation). A large floor makes its share visible.
def test_expand_local_is_the_q_sqrt_gradient_at_the_residual_floor():


    chunk, shared = _small_stacked_chunk(np.float64)
    shared = dataclasses.replace(shared, residual_floor=0.5)
    q_sqrt = shared.params.q_sqrt
    out = chunk_terms(chunk, shared, local=True)
    _, grad_sqrt = expand_local(chunk, shared, out["local"], 0)
    h = 1e-6
    M = q_sqrt.shape[2]
    checked = 0
    for k, v, m in [(0, 0, m) for m in range(M)] + [(1, 2, m) for m in range(M)]:
        up, down = q_sqrt.copy(), q_sqrt.copy()
        up[k, v, m] += h
        down[k, v, m] -= h
        ell = []
        for value in (up, down):
            params = dataclasses.replace(shared.params, q_sqrt=value)
            chunk.noise_cache.clear()
            moved = dataclasses.replace(shared, params=params)
            ell.append(chunk_terms(chunk, moved)["ell"])
        numeric = (ell[0] - ell[1]) / (2 * h)
        assert grad_sqrt[k, v, m] == pytest.approx(numeric, rel=1e-5, abs=1e-8)
        checked += numeric != 0
    assert checked > 4  # not vacuous
