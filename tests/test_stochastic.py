"""Stochastic optimisation (SAGA) and partial_fit."""

import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from skgpstruct import GPStructClassifier
from skgpstruct.datasets import make_sequences
from skgpstruct.optim.saga import maximize_saga


def test_saga_solves_a_least_squares_sum_to_the_exact_optimum():
    # F(x) = -sum_i |A_i x - b_i|^2 / 2 - |x|^2 / 2: closed-form optimum.
    rng = np.random.default_rng(0)
    A = [rng.normal(size=(3, 4)) for _ in range(6)]
    b = [rng.normal(size=3) for _ in range(6)]

    def item(i, step, x):
        r = A[i] @ x - b[i]
        return -0.5 * r @ r, -A[i].T @ r

    def exact(x):
        return -0.5 * x @ x, -x

    result = maximize_saga(
        item, exact, np.zeros(4), 6, step_size=0.05, max_epochs=400, tol=0.0,
        n_iter_no_change=10**6, rng=np.random.default_rng(1),
    )
    H = sum(a.T @ a for a in A) + np.eye(4)
    optimum = np.linalg.solve(H, sum(a.T @ bb for a, bb in zip(A, b, strict=True)))
    np.testing.assert_allclose(result.x, optimum, atol=2e-3)
    # The stored gradients and their running sum agree.
    stored = np.zeros(4)
    for idx, values in result.state["stored"]:
        stored[idx] += values
    np.testing.assert_allclose(result.state["total"], stored, atol=1e-10)


@pytest.fixture(scope="module")
def data():
    X, y = make_sequences(90, random_state=2, noise=0.7)
    return X[:60], y[:60], X[60:], y[60:]


def _majority(y):
    return np.bincount(np.concatenate(y)).max() / sum(map(len, y))


def test_stochastic_fit_reaches_batch_accuracy(data):
    X, y, X_test, y_test = data
    common = dict(kernel="rbf", n_inducing=40, random_state=0)
    batch = GPStructClassifier(max_iter=100, tol=1e-4, **common).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        stochastic = GPStructClassifier(
            optimizer="stochastic", max_iter=15, batch_size=5, **common
        ).fit(X, y)
    assert stochastic.score(X_test, y_test) > _majority(y_test) + 0.3
    assert stochastic.score(X_test, y_test) >= batch.score(X_test, y_test) - 0.05
    assert len(stochastic.elbo_history_) == stochastic.n_iter_
    # ELBO estimates rise over the epochs.
    assert np.mean(stochastic.elbo_history_[-3:]) > stochastic.elbo_history_[0]
    assert stochastic.saga_memory_bytes_ > 0


def test_stochastic_fit_is_reproducible(data):
    X, y, _, _ = data
    params = dict(
        kernel="rbf", n_inducing=20, optimizer="stochastic", max_iter=2,
        random_state=5,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        a = GPStructClassifier(**params).fit(X, y)
        b = GPStructClassifier(**params).fit(X, y)
    np.testing.assert_array_equal(a.q_mu_, b.q_mu_)


def test_stochastic_refuses_score_estimator(data):
    X, y, _, _ = data
    with pytest.raises(ValueError, match="pathwise"):
        GPStructClassifier(optimizer="stochastic", gradient="score").fit(X, y)


def test_partial_fit_learns_from_pieces(data):
    X, y, X_test, y_test = data
    model = GPStructClassifier(kernel="rbf", n_inducing=30, random_state=0)
    with pytest.raises(ValueError, match="classes must be given"):
        model.partial_fit(X[:20], y[:20])
    for _ in range(4):
        for start in range(0, 60, 20):
            piece = slice(start, start + 20)
            model.partial_fit(X[piece], y[piece], classes=[0, 1, 2])
    assert model.score(X_test, y_test) > _majority(y_test) + 0.3
    np.testing.assert_array_equal(model.classes_, [0, 1, 2])
    with pytest.raises(ValueError, match="not in classes"):
        model.partial_fit([X[0]], [np.full(len(y[0]), 7)], classes=[0, 1, 2])


def test_saga_stops_after_n_epochs_without_beating_the_best():
    # Item values fall after the third epoch: the fit must stop exactly
    # n_iter_no_change epochs after the best one, not at the first dip.
    values = iter([1.0, 2.0, 3.0, 2.5, 2.9, 2.8, 2.7, 5.0])

    def item(i, step, x):
        return next(values), np.zeros(1)

    def exact(x):
        return 0.0, np.zeros(1)

    result = maximize_saga(
        item, exact, np.zeros(1), 1, step_size=0.1, max_epochs=8, tol=0.0,
        n_iter_no_change=4, rng=np.random.default_rng(0),
    )
    assert result.history == [1.0, 2.0, 3.0, 2.5, 2.9, 2.8, 2.7]
    assert result.converged
