"""Tests of the GPstruct elliptical slice sampler (skgpstruct.inference.ess).

Invariance is checked against answers computed without the sampler: the
exact posterior of a Gaussian likelihood for the bare ESS update, and
self-normalised importance sampling from the prior for the chain
likelihood. Monte Carlo tolerances are stated in standard errors: the
sampler's from batch means of the chain, the reference's from its own
estimator.
"""

import math
import warnings

import _chain_reference as chain_reference
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.exceptions import ConvergenceWarning

from skgpstruct import chain
from skgpstruct._sequences import stack_sequences
from skgpstruct.datasets import make_sequences
from skgpstruct.inference import ess
from skgpstruct.inference.ess import (
    ESSPosterior,
    elliptical_slice,
    ess_memory_bytes,
    sample_posterior,
)
from skgpstruct.kernels import GroupedLinearKernel, LinearKernel, RBFKernel

# A tolerance of Z_TOL combined standard errors. With a few dozen compared
# quantities, a correct sampler exceeds it with probability below 1e-4; a
# sampler that ignored the likelihood misses by far more (checked below).
Z_TOL = 5.0


def batch_means_se(draws, n_batches=50):
    """Standard error of the mean of a correlated chain (batch means)."""
    draws = np.asarray(draws)
    n = (draws.shape[0] // n_batches) * n_batches
    means = draws[:n].reshape(n_batches, -1, *draws.shape[1:]).mean(axis=1)
    return means.std(axis=0, ddof=1) / math.sqrt(n_batches)


def tiny_problem():
    """Two sequences of two tokens, two labels, 1-D inputs, RBF kernel."""
    X = np.array([[-1.0], [-0.4], [0.3], [1.1]])
    offsets = np.array([0, 2, 4], dtype=np.int64)
    labels = np.array([0, 0, 1, 0], dtype=np.int64)
    kernel = RBFKernel(variance=1.0, length_scale=1.0)
    return X, offsets, labels, kernel


# --------------------------------------------------------------------------
# invariance


def test_elliptical_slice_matches_gaussian_posterior():
    # Prior N(0, Sigma), likelihood N(y; f, R): the posterior is Gaussian
    # with known mean and covariance.
    sigma = np.array([[1.0, 0.8], [0.8, 1.0]])
    noise = np.array([0.3, 2.0])
    y = np.array([1.0, -0.5])
    post_cov = np.linalg.inv(np.linalg.inv(sigma) + np.diag(1.0 / noise))
    post_mean = post_cov @ (y / noise)

    def log_likelihood(f):
        return -0.5 * float(np.sum((y - f) ** 2 / noise))

    rng = np.random.default_rng(0)
    root = np.linalg.cholesky(sigma)
    f = np.zeros(2)
    current = log_likelihood(f)
    n_iter, burn_in = 20000, 500
    draws = np.empty((n_iter, 2))
    for i in range(n_iter):
        f, current, _ = elliptical_slice(
            f, root @ rng.standard_normal(2), log_likelihood, current, rng
        )
        assert current == log_likelihood(f)
        draws[i] = f
    draws = draws[burn_in:]
    centred = draws - post_mean
    products = np.stack(
        [centred[:, 0] ** 2, centred[:, 1] ** 2, centred[:, 0] * centred[:, 1]],
        axis=1,
    )
    exact_cov = np.array([post_cov[0, 0], post_cov[1, 1], post_cov[0, 1]])
    np.testing.assert_array_less(
        np.abs(draws.mean(axis=0) - post_mean), Z_TOL * batch_means_se(draws)
    )
    np.testing.assert_array_less(
        np.abs(products.mean(axis=0) - exact_cov), Z_TOL * batch_means_se(products)
    )


def importance_sampling_reference(X, offsets, labels, kernel, sigma2, n_draws, seed):
    """Posterior moments of (unary, pairwise) by importance sampling from the
    prior: weights p(y | f), self-normalised; returns means and standard
    errors of the first and second moments, flattened."""
    rng = np.random.default_rng(seed)
    N, V = X.shape[0], 2
    K = kernel(X)
    unary = rng.multivariate_normal(np.zeros(N), K, size=(n_draws, V))
    unary = unary.transpose(0, 2, 1)  # (draws, N, V)
    pairwise = math.sqrt(sigma2) * rng.standard_normal((n_draws, V, V))
    loglik = chain.log_likelihood(unary, pairwise, offsets, labels).sum(axis=1)
    w = np.exp(loglik - loglik.max())
    w /= w.sum()
    theta = np.concatenate(
        [unary.reshape(n_draws, -1), pairwise.reshape(n_draws, -1)], axis=1
    )
    stats = np.concatenate([theta, theta**2], axis=1)
    mean = w @ stats
    # Delta-method variance of a self-normalised importance sampling estimate.
    se = np.sqrt((w**2) @ (stats - mean) ** 2)
    return mean, se, 1.0 / np.sum(w**2)


def linear_problem():
    """Two sequences of two tokens, two labels, binary features (one of them
    lone: active at one token only), a grouped linear kernel."""
    X = sp.csr_matrix(np.array([[1.0, 1.0, 0.0, 0.0],
                                [1.0, 0.0, 1.0, 0.0],
                                [0.0, 0.0, 1.0, 1.0],
                                [1.0, 0.0, 0.0, 1.0]]))
    offsets = np.array([0, 2, 4], dtype=np.int64)
    labels = np.array([0, 0, 1, 0], dtype=np.int64)
    kernel = GroupedLinearKernel([0, 1, 0, 1], variance=[0.8, 2.0], bias=0.5)
    return X, offsets, labels, kernel


@pytest.fixture
def feature_map_always(monkeypatch):
    """Prior draws through the feature map whatever its size (the tests'
    problems are too small for it to be the cheaper)."""
    monkeypatch.setattr(ess, "_FEATURE_MAP_BREAK_EVEN", 0)


@pytest.mark.parametrize("problem", ["rbf", "linear"])
def test_ess_leaves_chain_posterior_invariant(problem, feature_map_always):
    make = tiny_problem if problem == "rbf" else linear_problem
    X, offsets, labels, kernel = make()
    # The linear kernel's prior draws go through its feature map.
    assert (ess.prior_feature_map(X, kernel) is None) == (problem == "rbf")
    sigma2 = 1.0
    ref_mean, ref_se, n_effective = importance_sampling_reference(
        X, offsets, labels, kernel, sigma2, n_draws=200_000, seed=1
    )
    assert n_effective > 10_000  # the reference itself is precise

    posterior = sample_posterior(
        X, offsets, labels, kernel, 2, pairwise_prior_variance=sigma2,
        n_iter=30_000, burn_in=1000, thin=1, random_state=2,
    )
    S = posterior.n_samples
    theta = np.concatenate(
        [posterior.unary_samples.reshape(S, -1),
         posterior.pairwise_samples.reshape(S, -1)], axis=1,
    )
    stats = np.concatenate([theta, theta**2], axis=1)
    se = np.sqrt(batch_means_se(stats) ** 2 + ref_se**2)
    np.testing.assert_array_less(np.abs(stats.mean(axis=0) - ref_mean), Z_TOL * se)

    # The check has power: the posterior is far from the prior (mean 0,
    # second moment 1 for every coordinate) in units of the tolerance.
    n_theta = theta.shape[1]
    prior = np.concatenate([np.zeros(n_theta), np.ones(n_theta)])
    assert np.max(np.abs(ref_mean - prior) / se) > 4 * Z_TOL


# --------------------------------------------------------------------------
# reproducibility


def run_small(seed, **kwargs):
    X, offsets, labels, kernel = tiny_problem()
    params = dict(n_iter=300, burn_in=100, thin=5, random_state=seed)
    params.update(kwargs)
    return sample_posterior(X, offsets, labels, kernel, 2, **params)


def test_same_seed_same_chain_and_different_seed_different_chain():
    a, b, c = run_small(0), run_small(0), run_small(1)
    np.testing.assert_array_equal(a.unary_samples, b.unary_samples)
    np.testing.assert_array_equal(a.pairwise_samples, b.pairwise_samples)
    np.testing.assert_array_equal(a.log_likelihood_trace, b.log_likelihood_trace)
    assert not np.array_equal(a.unary_samples, c.unary_samples)
    # A Generator seed works too and gives the chain of its integer seed.
    d = run_small(np.random.default_rng(0))
    np.testing.assert_array_equal(a.unary_samples, d.unary_samples)


@pytest.mark.parametrize("draws", ["factor", "feature map", "feature map, jitter"])
def test_chain_does_not_depend_on_draw_block_size(draws, monkeypatch):
    # Blocks of prior draws consume the same random numbers whatever their
    # size. The triangular product may round differently with the number of
    # columns (OpenBLAS picks its kernels by size: 4e-16 seen on one
    # machine), so the chains agree to rounding, not bit for bit.
    if draws == "factor":
        problem = tiny_problem()
    else:
        monkeypatch.setattr(ess, "_FEATURE_MAP_BREAK_EVEN", 0)
        problem = linear_problem()
        if draws.endswith("jitter"):  # as if the factorisation had needed 0.1
            monkeypatch.setattr(ess, "jitter_cholesky", lambda K, name: (
                np.linalg.cholesky(K + 0.1 * np.eye(len(K))), 0.1))

    def run():
        X, offsets, labels, kernel = problem
        return sample_posterior(X, offsets, labels, kernel, 2, n_iter=300,
                                burn_in=100, thin=5, random_state=3)

    reference = run()
    monkeypatch.setattr(ess, "_DRAW_BLOCK", 7)
    np.testing.assert_allclose(
        run().unary_samples, reference.unary_samples, rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize(
    "kernel",
    [LinearKernel(variance=0.7, bias=0.3),
     GroupedLinearKernel([0, 1, 0, 1, 1], variance=[0.8, 2.0], bias=0.5)],
)
@pytest.mark.parametrize("lone", [True, False])
def test_prior_feature_map_reproduces_the_gram_matrix(kernel, lone):
    X = np.array([[1.0, 1.5, 0.0, 1.0, 2.0],
                  [1.0, 0.5, 1.0, 1.0, 0.0],
                  [1.0, 0.0, 2.0, 0.0, 0.0],
                  [1.0, 0.0, 0.0, 1.0, 3.0]])
    if lone:  # features 1 and 4 active at token 0 only: one column
        X[1:, [1, 4]] = 0.0
    X = sp.csr_matrix(X)
    phi = ess.prior_feature_map(X, kernel, always=True)
    assert sp.issparse(phi)
    np.testing.assert_allclose((phi @ phi.T).toarray(), kernel(X), rtol=1e-12,
                               atol=1e-14)
    # Three shared features, the collapsed token and the bias; or all five
    # features and the bias.
    assert phi.shape == ((4, 5) if lone else (4, 6))


def test_prior_feature_map_only_where_cheaper():
    X, _, _, kernel = linear_problem()
    # Four tokens: 16 / 600 columns at most, so the Cholesky factor draws.
    assert ess.prior_feature_map(X, kernel) is None
    assert ess.prior_feature_map(X, kernel, always=True).shape == (4, 5)
    # 200 tokens of 50 shared binary features: 51 columns, under 200^2 / 600.
    rng = np.random.default_rng(1)
    wide = (rng.random((200, 50)) < 0.3).astype(float)
    wide[:, 0] = 1.0
    wide = sp.csr_matrix(wide)
    phi = ess.prior_feature_map(wide, kernel=LinearKernel())
    assert phi is not None and phi.shape == (200, 51)
    # Kernels without a feature map draw through the factor.
    assert ess.prior_feature_map(wide.toarray(), RBFKernel()) is None


@pytest.mark.parametrize("through", ["factor", "feature map"])
@pytest.mark.parametrize("jitter", [0.0, 0.3])
def test_prior_draws_have_the_prior_covariance(jitter, through):
    # The prior is N(0, K + jitter I): the jitter the factorisation of K
    # needed is part of it, with either way of drawing.
    X, _, _, kernel = linear_problem()
    K = kernel(X)
    factor = np.linalg.cholesky(K + jitter * np.eye(len(K)))
    # The scaled features and bias column: group variances 0.8 and 2.0, bias 0.5.
    scales = np.sqrt([0.8, 2.0, 0.8, 2.0, 0.5])
    phi = sp.csr_matrix(np.hstack([X.toarray(), np.ones((len(K), 1))]) * scales)
    np.testing.assert_allclose((phi @ phi.T).toarray(), K, atol=1e-12)
    if through == "factor":
        phi = None
    draws = ess._PriorDraws(factor, jitter, phi, 2, np.random.default_rng(0))
    n = 20_000
    nu = draws.block(n)  # (N, n, V)
    samples = nu.transpose(1, 2, 0).reshape(-1, len(K))  # every label a draw
    covariance = samples.T @ samples / samples.shape[0]
    target = K + jitter * np.eye(len(K))
    # Standard error of a second moment of a Gaussian: sqrt((Kii Kjj + Kij^2) / n).
    d = np.diag(target)
    se = np.sqrt((np.outer(d, d) + target**2) / samples.shape[0])
    np.testing.assert_array_less(np.abs(covariance - target), Z_TOL * se)


# --------------------------------------------------------------------------
# memory guard, parameters


class ForbiddenKernel(RBFKernel):
    """A kernel that fails the test if a Gram matrix is requested."""

    def _call(self, X, Y):
        raise AssertionError("the Gram matrix was built before the memory check")


def test_memory_guard_refuses_before_allocating():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((500, 3))
    offsets = np.array([0, 250, 500], dtype=np.int64)
    labels = rng.integers(0, 2, 500)
    gram, other = ess_memory_bytes(500, 2, 10)
    assert gram == 2 * 8 * 500**2
    with pytest.raises(ValueError) as info:
        sample_posterior(
            X, offsets, labels, ForbiddenKernel(), 2, n_iter=20, burn_in=10,
            memory_limit=gram + other - 1,
        )
    message = str(info.value)
    assert "N = 500" in message
    assert "inference='variational'" in message
    assert "MiB" in message
    # At the limit it runs (and then needs the kernel).
    with pytest.raises(AssertionError, match="before the memory check"):
        sample_posterior(
            X, offsets, labels, ForbiddenKernel(), 2, n_iter=20, burn_in=10,
            memory_limit=gram + other,
        )


def test_memory_estimate_covers_the_kept_samples():
    # Few tokens and many labels, where the kept transitions (V^2 each)
    # outweigh the kept unaries (N V): the estimate of the memory beside
    # the Gram matrix covers what the kept samples really take.
    rng = np.random.default_rng(0)
    N, V, n_iter = 6, 60, 400
    X = rng.normal(size=(N, 2))
    labels = np.arange(N) % V
    offsets = np.array([0, 3, 6], dtype=np.int64)
    posterior = sample_posterior(
        X, offsets, labels, LinearKernel(), V, n_iter=n_iter, burn_in=0,
        random_state=0,
    )
    kept = posterior.unary_samples.nbytes + posterior.pairwise_samples.nbytes
    assert kept == 8 * n_iter * (N * V + V * V)
    assert ess_memory_bytes(N, V, posterior.n_samples)[1] >= kept

def test_default_limit_refuses_a_large_training_set():
    # 30,000 tokens: 14.4 GB of Gram matrix and factor, over 4 GiB.
    X = np.zeros((30_000, 1))
    offsets = np.array([0, 30_000], dtype=np.int64)
    with pytest.raises(ValueError, match="N = 30000"):
        sample_posterior(X, offsets, np.zeros(30_000, dtype=np.int64),
                         ForbiddenKernel(), 3)


@pytest.mark.parametrize(
    "n_iter, burn_in, thin, expected",
    [(50, 10, 3, list(range(13, 50, 3))), (10, None, 1, [6, 7, 8, 9, 10]),
     (10, 0, 10, [10]), (7, 6, 1, [7])],
)
def test_burn_in_and_thinning_keep_the_right_samples(n_iter, burn_in, thin, expected):
    posterior = run_small(0, n_iter=n_iter, burn_in=burn_in, thin=thin)
    np.testing.assert_array_equal(posterior.sample_iterations, expected)
    assert posterior.n_samples == len(expected)
    assert posterior.unary_samples.shape == (len(expected), 4, 2)
    assert posterior.pairwise_samples.shape == (len(expected), 2, 2)
    assert posterior.log_likelihood_trace.shape == (n_iter,)
    # The trace records the log-likelihood of the kept states.
    X, offsets, labels, _ = tiny_problem()
    loglik = chain.log_likelihood(
        posterior.unary_samples, posterior.pairwise_samples, offsets, labels
    ).sum(axis=1)
    np.testing.assert_allclose(
        loglik, posterior.log_likelihood_trace[posterior.sample_iterations - 1]
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_iter=0), "n_iter must be an integer >= 1"),
        (dict(n_iter=10, burn_in=10), "no sample would be kept"),
        (dict(n_iter=10, burn_in=5, thin=6), "no sample would be kept"),
        (dict(thin=0), "thin must be"),
        (dict(n_iter=2.5), "n_iter must be an integer"),
        (dict(pairwise_prior_variance=0.0), "pairwise_prior_variance"),
    ],
)
def test_invalid_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        run_small(0, **kwargs)


def test_invalid_labels_and_offsets():
    X, offsets, labels, kernel = tiny_problem()
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        sample_posterior(X, offsets, labels + 1, kernel, 2, n_iter=4)
    with pytest.raises(ValueError, match="offsets"):
        sample_posterior(X, np.array([0, 3]), labels, kernel, 2, n_iter=4)
    # Not integers: they were cast (1.9 to 1, an offset 2.5 to 2) and the
    # chain ran on other data.
    with pytest.raises(ValueError, match="labels must be an array of integers"):
        sample_posterior(X, offsets, labels + 0.9, kernel, 2, n_iter=4)
    with pytest.raises(ValueError, match="offsets must be an array of integers"):
        sample_posterior(X, offsets + 0.5 * (offsets % 2), labels, kernel, 2, n_iter=4)


def test_features_are_validated_and_lists_read_as_arrays():
    X, offsets, labels, kernel = tiny_problem()
    X = X.toarray() if sp.issparse(X) else np.asarray(X)
    expected = sample_posterior(X, offsets, labels, kernel, 2, n_iter=4,
                                random_state=0)
    # Lists gave an AttributeError ('list' object has no attribute 'ndim').
    got = sample_posterior(X.tolist(), offsets.tolist(), labels.tolist(), kernel, 2,
                           n_iter=4, random_state=0)
    np.testing.assert_array_equal(got.unary_samples, expected.unary_samples)
    for to_format in (sp.lil_matrix, sp.dok_matrix, sp.csc_matrix):
        # any sparse format, as before the check of the values
        got = sample_posterior(to_format(X), offsets, labels, kernel, 2, n_iter=4,
                               random_state=0)
        np.testing.assert_allclose(got.unary_samples, expected.unary_samples)
    bad = X.copy()
    bad[1, 0] = np.nan  # was a CholeskyError about the Gram matrix
    for features, match in [
        (bad, "X contains NaN or infinite values"),
        (X.astype(str), "X must hold real numbers, got dtype <U"),
        (X[0], r"X must be 2-D \(n_tokens, n_features\)"),
    ]:
        with pytest.raises(ValueError, match=match):
            sample_posterior(features, offsets, labels, kernel, 2, n_iter=4)


def test_verbose_prints_progress(capsys):
    run_small(0, n_iter=40, burn_in=0, verbose=1)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 20
    assert lines[-1].startswith("ESS iteration      40  log-likelihood")
    assert lines[-1].endswith(" s")
    run_small(0, n_iter=5, burn_in=0, verbose=2)
    assert len(capsys.readouterr().out.splitlines()) == 5


# --------------------------------------------------------------------------
# prediction


def test_prediction_shapes_and_consistency():
    X, offsets, labels, kernel = tiny_problem()
    posterior = run_small(0, n_iter=200, burn_in=100, thin=10)
    assert isinstance(posterior, ESSPosterior)
    S = posterior.n_samples
    X_test = np.array([[-0.9], [0.0], [0.2], [5.0], [6.0]])
    test_offsets = np.array([0, 3, 3, 5], dtype=np.int64)  # one empty sequence

    unary = posterior.predict_unary(X_test)
    assert unary.shape == (S, 5, 2)
    np.testing.assert_allclose(posterior.mean_unary(X_test), unary.mean(axis=0))
    # At the training tokens the conditional mean returns the samples.
    np.testing.assert_allclose(
        posterior.predict_unary(X), posterior.unary_samples, atol=1e-8
    )

    per_sample = posterior.sample_marginals(X_test, test_offsets)
    assert per_sample.shape == (S, 5, 2)
    # Every kept sample's marginals: the chain of its conditional mean
    # unaries and its transitions, by enumeration of the label sequences.
    expected = chain_reference.brute_force(
        unary, posterior.pairwise_samples, test_offsets
    )[1]
    np.testing.assert_allclose(per_sample, expected, rtol=1e-12, atol=1e-14)
    marginals = posterior.predict_marginals(X_test, test_offsets)
    assert marginals.shape == (5, 2)
    np.testing.assert_allclose(marginals.sum(axis=1), 1.0)
    np.testing.assert_allclose(marginals, per_sample.mean(axis=0))
    np.testing.assert_allclose(posterior.pairwise_mean,
                               posterior.pairwise_samples.mean(axis=0))

    with pytest.raises(ValueError, match="conditional must be"):
        posterior.predict_unary(X_test, conditional="median")
    with pytest.raises(ValueError, match="X must have shape"):
        posterior.predict_unary(np.zeros((2, 3)))


def test_prediction_in_blocks_of_sequences(monkeypatch):
    # Test tokens are predicted a block of whole sequences at a time: with
    # blocks of about 2 tokens, every kept sample's marginals are still the
    # chain of its conditional mean unaries over the given sequences, by
    # enumeration (zero-length sequences included).
    posterior = run_small(0, n_iter=200, burn_in=100, thin=10)
    X_test = np.linspace(-2.0, 2.0, 11)[:, None]
    offsets = np.array([0, 3, 3, 5, 9, 11], dtype=np.int64)
    unary = posterior.predict_unary(X_test)
    expected = chain_reference.brute_force(
        unary, posterior.pairwise_samples, offsets
    )[1]
    monkeypatch.setattr(ess, "_PREDICT_TOKENS", 2)
    np.testing.assert_allclose(
        posterior.sample_marginals(X_test, offsets), expected, rtol=1e-10,
        atol=1e-12,
    )
    np.testing.assert_allclose(
        posterior.predict_marginals(X_test, offsets), expected.mean(axis=0),
        rtol=1e-10, atol=1e-12,
    )


def test_transitions_without_a_transition_keep_their_prior():
    # Sequences of one token have no transition: the transitions' posterior
    # is their prior, N(0, pairwise_prior_variance) entry by entry, and so
    # is the spread of the kept samples (a chain's estimate: within 25 %).
    rng = np.random.default_rng(0)
    n_tokens, V = 8, 2
    X = rng.normal(size=(n_tokens, 1))
    labels = np.arange(n_tokens) % V
    offsets = np.arange(n_tokens + 1)
    for variance in (0.25, 4.0):
        posterior = sample_posterior(
            X, offsets, labels, RBFKernel(), V, pairwise_prior_variance=variance,
            n_iter=6000, burn_in=1000, random_state=1,
        )
        assert 0.75 < posterior.pairwise_samples.var() / variance < 1.25

def test_conditional_samples():
    X, offsets, labels, kernel = tiny_problem()
    posterior = run_small(0, n_iter=600, burn_in=100, thin=1)
    # At the training tokens the conditional variance is zero.
    drawn = posterior.predict_unary(X, conditional="sample", random_state=0)
    np.testing.assert_allclose(drawn, posterior.unary_samples, atol=1e-4)
    # Far from them (RBF), f_* | f is the prior N(0, 1), independent of f.
    far = np.array([[20.0], [20.5], [40.0]])
    far_offsets = np.array([0, 2, 3], dtype=np.int64)
    a = posterior.predict_unary(far, offsets=far_offsets, conditional="sample",
                                random_state=5)
    b = posterior.predict_unary(far, offsets=far_offsets, conditional="sample",
                                random_state=5)
    np.testing.assert_array_equal(a, b)
    n = a.shape[0] * a.shape[2]  # 1000 draws per token
    assert np.all(np.abs(a.mean(axis=(0, 2))) < 5 / math.sqrt(n))
    assert np.all(np.abs(a.var(axis=(0, 2)) - 1.0) < 5 * math.sqrt(2 / n))
    # Tokens of one sequence are drawn jointly: k(20, 20.5) = exp(-1/8).
    corr = np.corrcoef(a[:, 0].ravel(), a[:, 1].ravel())[0, 1]
    assert abs(corr - math.exp(-0.125)) < 0.05
    marginals = posterior.predict_marginals(
        far, far_offsets, conditional="sample", random_state=0
    )
    np.testing.assert_allclose(marginals.sum(axis=1), 1.0)


def test_conditional_samples_at_training_tokens_are_the_conditional_mean():
    # A test sequence equal to a training sequence (RBF, no jitter needed by
    # the Gram matrix): the conditional covariance is zero up to rounding,
    # which the Cholesky factor with its relative jitter refused
    # (CholeskyError); the draw is the conditional mean. (The length scale
    # keeps the Gram matrix's condition number near 1e10: at 3.0 it was
    # 3e17, its least eigenvalue -1e-15, and whether it needed jitter
    # depended on the machine's BLAS.)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 2))
    offsets = np.array([0, 10, 25, 40])
    labels = rng.integers(0, 3, 40)
    kernel = RBFKernel(length_scale=1.0)
    assert np.linalg.eigvalsh(kernel(X)).min() > 1e-9
    posterior = sample_posterior(X, offsets, labels, kernel, 3, n_iter=40,
                                 random_state=0)
    assert posterior.jitter == 0.0
    for test_offsets in (np.array([0, 10]), np.arange(11)):
        drawn = posterior.predict_unary(
            X[:10], offsets=test_offsets, conditional="sample", random_state=0
        )
        mean = posterior.predict_unary(X[:10], offsets=test_offsets)
        np.testing.assert_allclose(drawn, mean, atol=1e-6)
    marginals = posterior.predict_marginals(
        X, np.arange(41), conditional="sample", random_state=0
    )
    np.testing.assert_allclose(marginals.sum(axis=1), 1.0)


def test_sparse_features_with_linear_kernel():
    X, y = make_sequences(n_sequences=12, sparse=True, random_state=0)
    X_all, offsets = stack_sequences(X)
    labels = np.concatenate(y).astype(np.int64)
    kernel = LinearKernel(variance=0.1)
    posterior = sample_posterior(
        X_all, offsets, labels, kernel, 3, n_iter=50, random_state=0
    )
    marginals = posterior.predict_marginals(X_all, offsets)
    np.testing.assert_allclose(marginals.sum(axis=1), 1.0)


def test_predicts_well_above_chance_on_synthetic_data():
    X, y = make_sequences(n_sequences=60, random_state=0)
    X_train, offsets = stack_sequences(X[:40])
    X_test, test_offsets = stack_sequences(X[40:])
    labels = np.concatenate(y[:40]).astype(np.int64)
    truth = np.concatenate(y[40:])
    posterior = sample_posterior(
        X_train, offsets, labels, RBFKernel(), 3, n_iter=1000, burn_in=300,
        thin=10, random_state=0,
    )
    marginals = posterior.predict_marginals(X_test, test_offsets)
    accuracy = np.mean(np.argmax(marginals, axis=1) == truth)
    majority = np.max(np.bincount(truth)) / truth.size
    assert majority < 0.45
    assert accuracy > 0.85


# ---------------------------------------------------------------------- #
# Through the estimator: GPStructClassifier(inference="ess")
def test_estimator_ess_fits_predicts_and_is_reproducible():
    from skgpstruct import GPStructClassifier

    X, y = make_sequences(50, random_state=3, noise=0.5)
    params = dict(kernel="rbf", inference="ess", ess_n_iter=400, random_state=1,
                  learn_hyperparameters=False)
    first = GPStructClassifier(**params).fit(X[:35], y[:35])
    second = GPStructClassifier(**params).fit(X[:35], y[:35])
    np.testing.assert_array_equal(first.ess_.unary_samples, second.ess_.unary_samples)
    majority = np.bincount(np.concatenate(y[35:])).max() / sum(map(len, y[35:]))
    assert first.score(X[35:], y[35:]) > majority + 0.3
    marginals = first.predict_marginals(X[35:])
    for m, seq in zip(marginals, X[35:], strict=True):
        assert m.shape == (len(seq), 3)
        np.testing.assert_allclose(m.sum(axis=1), 1.0)
    first.set_params(decode="marginal")
    predicted = first.predict(X[35:])
    for m, p in zip(marginals, predicted, strict=True):
        np.testing.assert_array_equal(first.classes_[m.argmax(axis=1)], p)
    assert not hasattr(first, "q_mu_")


def test_estimator_ess_refit_drops_an_earlier_fits_attributes():
    # A refit with inference="ess" kept saga_memory_bytes_ and
    # validation_score_history_ of an earlier stochastic fit.
    from skgpstruct import GPStructClassifier

    X, y = make_sequences(30, random_state=3)
    model = GPStructClassifier(
        optimizer="stochastic", early_stopping=True, max_iter=2, random_state=0,
        ess_n_iter=20,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
    assert hasattr(model, "saga_memory_bytes_")
    assert hasattr(model, "validation_score_history_")
    model.set_params(inference="ess", learn_hyperparameters=False).fit(X, y)
    fresh = GPStructClassifier(**model.get_params()).fit(X, y)
    fitted = {name for name in vars(model) if name.endswith("_")}
    assert fitted == {name for name in vars(fresh) if name.endswith("_")}
    assert not hasattr(model, "saga_memory_bytes_")
    assert not hasattr(model, "_saga_state") and not hasattr(model, "_saga_items")


def test_estimator_ess_refuses_partial_fit_before_asking_for_classes():
    # It asked for classes first, then refused partial_fit altogether.
    from skgpstruct import GPStructClassifier

    X, y = make_sequences(10, random_state=3)
    model = GPStructClassifier(inference="ess")
    for classes in (None, [0, 1, 2]):
        with pytest.raises(ValueError, match="not available with inference='ess'"):
            model.partial_fit(X, y, classes=classes)


def test_estimator_ess_samples_at_the_hyperparameters_the_elbo_learns():
    # learn_hyperparameters=True (the default): the prior is that of the same
    # estimator fitted variationally; False: the initial values, as GPstruct.
    from skgpstruct import GPStructClassifier

    X, y = make_sequences(12, random_state=4)
    params = dict(ess_n_iter=60, random_state=2)
    learned = GPStructClassifier(inference="ess", **params).fit(X, y)
    variational = GPStructClassifier(**params).fit(X, y)
    np.testing.assert_array_equal(learned.kernel_.theta, variational.kernel_.theta)
    assert learned.pairwise_prior_variance_ == variational.pairwise_prior_variance_
    assert learned.pairwise_prior_variance_ != 1.0  # the parameter's value
    assert not hasattr(learned, "elbo_history_")
    assert learned.get_params()["inference"] == "ess"  # the clone did not leak

    fixed = GPStructClassifier(
        inference="ess", learn_hyperparameters=False, **params
    ).fit(X, y)
    frozen = GPStructClassifier(learn_hyperparameters=False, **params).fit(X, y)
    np.testing.assert_array_equal(fixed.kernel_.theta, frozen.kernel_.theta)
    assert np.abs(fixed.kernel_.theta - learned.kernel_.theta).max() > 0.1
    assert fixed.pairwise_prior_variance_ == 1.0


def test_estimator_ess_at_learned_hyperparameters_does_not_depend_on_n_jobs():
    # The variational fit that learns the prior runs its chunks on n_jobs
    # threads; the chain it leads to is the same.
    from skgpstruct import GPStructClassifier
    from skgpstruct._estimator import CHUNK_TOKENS

    X, y = make_sequences(40, random_state=5, length_range=(40, 80))
    assert sum(map(len, X)) > CHUNK_TOKENS  # more than one chunk to share out
    params = dict(inference="ess", ess_n_iter=30, random_state=6)
    one = GPStructClassifier(n_jobs=1, **params).fit(X, y)
    two = GPStructClassifier(n_jobs=2, **params).fit(X, y)
    np.testing.assert_array_equal(one.kernel_.theta, two.kernel_.theta)
    np.testing.assert_array_equal(one.ess_.unary_samples, two.ess_.unary_samples)


def test_estimator_ess_refuses_large_training_set_before_allocating(monkeypatch):
    import skgpstruct._estimator as estimator_module
    from skgpstruct import GPStructClassifier

    def no_fit(*args, **kwargs):
        raise AssertionError("the variational fit ran before the memory check")

    # Refused before the variational fit that would learn the hyperparameters.
    monkeypatch.setattr(estimator_module, "minimize_lbfgs", no_fit)
    X, y = make_sequences(20, random_state=0)
    model = GPStructClassifier(inference="ess", ess_memory_limit=1000)
    with pytest.raises(ValueError, match="variational"):
        model.fit(X, y)


def test_estimator_ess_takes_the_chain_likelihood_by_name_or_object():
    # A ChainCRF() object is the exact chain too (it was refused); the
    # pseudo-likelihood is not.
    from skgpstruct import GPStructClassifier
    from skgpstruct.likelihoods import ChainCRF

    X, y = make_sequences(8, random_state=0)
    params = dict(inference="ess", ess_n_iter=20, random_state=0,
                  learn_hyperparameters=False)
    by_name = GPStructClassifier(likelihood="crf", **params).fit(X, y)
    by_object = GPStructClassifier(likelihood=ChainCRF(), **params).fit(X, y)
    np.testing.assert_array_equal(
        by_name.ess_.unary_samples, by_object.ess_.unary_samples
    )
    with pytest.raises(ValueError, match="exact chain likelihood only"):
        GPStructClassifier(likelihood="pseudo", **params).fit(X, y)


def test_refits_switching_inference_keep_only_their_own_attributes():
    # ESS then variational then ESS on the same estimator: each fit leaves
    # the attributes of its own inference only, and predicts as a fresh one.
    from skgpstruct import GPStructClassifier

    X, y = make_sequences(8, random_state=0)
    ess_params = dict(inference="ess", ess_n_iter=20, random_state=0,
                      learn_hyperparameters=False)
    model = GPStructClassifier(**ess_params).fit(X, y)
    assert hasattr(model, "log_likelihood_history_")
    model.set_params(inference="variational", max_iter=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
    assert not hasattr(model, "log_likelihood_history_")
    assert not hasattr(model, "ess_") and hasattr(model, "elbo_history_")
    model.set_params(**ess_params).fit(X, y)
    assert not hasattr(model, "elbo_history_") and not hasattr(model, "q_mu_")
    # nor the variational fit's private state (the inducing variables'
    # scales or factor, pickled with the model otherwise)
    for name in ("_inducing_state", "_hyperprior_centre", "_predict_seed"):
        assert name not in vars(model), name
    fresh = GPStructClassifier(**ess_params).fit(X, y)
    np.testing.assert_array_equal(
        np.concatenate(model.predict_marginals(X)),
        np.concatenate(fresh.predict_marginals(X)),
    )


def test_estimator_ess_rejects_bad_burn_in():
    from skgpstruct import GPStructClassifier

    X, y = make_sequences(5, random_state=0)
    with pytest.raises(ValueError, match="ess_burn_in"):
        GPStructClassifier(inference="ess", ess_n_iter=10, ess_burn_in=10).fit(X, y)
    with pytest.raises(ValueError, match="ess_burn_in must be None or an integer"):
        GPStructClassifier(inference="ess", ess_burn_in=-1).fit(X, y)


@pytest.mark.parametrize("params, numbers", [
    (dict(ess_n_iter=5), r"ess_burn_in \(None: ess_n_iter // 2\) \+ ess_thin "
                         r"\(2 \+ 10\) must be at most ess_n_iter \(5\)"),
    (dict(ess_n_iter=100, ess_burn_in=95),
     r"ess_burn_in \+ ess_thin \(95 \+ 10\) must be at most ess_n_iter \(100\)"),
])
def test_estimator_ess_refuses_a_chain_keeping_nothing_before_any_work(params, numbers):
    # The rule is the sampler's (burn-in + thin <= iterations), named by the
    # estimator's parameters and checked with the others, before the data
    # (here malformed: the parameters are refused first).
    from skgpstruct import GPStructClassifier

    with pytest.raises(ValueError, match="no sample would be kept: " + numbers):
        GPStructClassifier(inference="ess", **params).fit([np.zeros((2, 2))], [[0]])
    # Only where the sampler runs: a variational fit ignores the ess_* ones.
    X, y = make_sequences(5, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        GPStructClassifier(max_iter=2, **params).fit(X, y)


@pytest.mark.parametrize("verbose", [True, np.True_])
def test_estimator_ess_takes_verbose_as_a_flag(verbose, capsys):
    # verbose is "int or bool" for every inference mode; the sampler had its
    # own integer check that refused True after the hyperparameters' fit.
    from skgpstruct import GPStructClassifier

    X, y = make_sequences(5, random_state=0)
    model = GPStructClassifier(inference="ess", ess_n_iter=20, verbose=verbose,
                               learn_hyperparameters=False, random_state=0)
    model.fit(X, y)
    assert "log-likelihood" in capsys.readouterr().out.lower()
    assert len(model.log_likelihood_history_) == 20


def test_the_sampler_s_log_likelihood_checks_once_and_matches_the_chain():
    # The first call validates (a bad label is refused there); later calls
    # skip the checks and give log_likelihood's numbers exactly.
    rng = np.random.default_rng(3)
    offsets = np.array([0, 4, 4, 9], dtype=np.int64)
    labels = rng.integers(3, size=9)
    target = ess._ChainLogLikelihood(offsets, labels, 9, 3)
    states = [rng.normal(scale=s, size=9 * 3 + 9) for s in (1.0, 5.0, 30.0)]
    for state in states:
        unary, pairwise = state[:27].reshape(1, 9, 3), state[27:].reshape(1, 3, 3)
        expected = chain.log_likelihood(unary, pairwise, offsets, labels).sum()
        value = target(state)
        assert value == expected
        # and the independent NumPy recursion of the tests
        reference = chain_reference.log_likelihood(unary, pairwise, offsets, labels)
        np.testing.assert_allclose(value, reference.sum(), rtol=1e-10)
    assert target.checked
    bad = ess._ChainLogLikelihood(offsets, np.full(9, 3), 9, 3)
    with pytest.raises(ValueError, match="labels"):
        bad(states[0])


def test_estimator_ess_refuses_warm_start_on_every_fit():
    # A fresh estimator accepted it and a refit refused it.
    from skgpstruct import GPStructClassifier

    X, y = make_sequences(10, random_state=3)
    model = GPStructClassifier(inference="ess", warm_start=True, ess_n_iter=20)
    for _ in range(2):
        with pytest.raises(ValueError, match="warm_start=True is not available "
                           "with inference='ess'"):
            model.fit(X, y)
        assert not hasattr(model, "classes_")
    model.set_params(warm_start=False).fit(X, y)
    with pytest.raises(ValueError, match="warm_start=True is not available"):
        model.set_params(warm_start=True).fit(X, y)
    assert hasattr(model, "ess_")


def test_estimator_does_not_continue_an_ess_fit_silently():
    # warm_start=True after an ESS fit started a variational fit from
    # scratch, without a word; partial_fit asked for classes.
    from skgpstruct import GPStructClassifier

    X, y = make_sequences(10, random_state=3)
    model = GPStructClassifier(
        inference="ess", ess_n_iter=20, learn_hyperparameters=False, max_iter=3,
        random_state=0,
    ).fit(X, y)
    marginals = model.predict_marginals(X)
    model.set_params(inference="variational", warm_start=True)
    with pytest.raises(ValueError, match=r"warm_start=True continues a variational "
                       r"fit, but the previous fit was inference='ess'.*kernel_"):
        model.fit(X, y)
    with pytest.raises(ValueError, match=r"partial_fit continues a variational "
                       r"fit, but the previous fit was inference='ess'.*clone"):
        model.partial_fit(X, y)
    for got, expected in zip(model.predict_marginals(X), marginals, strict=True):
        np.testing.assert_array_equal(got, expected)
    # The way the message gives: a fit from the ESS fit's hyperparameters.
    model.set_params(
        kernel=model.kernel_, pairwise_prior_variance=model.pairwise_prior_variance_,
        warm_start=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
    assert hasattr(model, "q_mu_") and not hasattr(model, "ess_")
