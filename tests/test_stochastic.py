"""Stochastic optimisation (SAGA) and partial_fit."""

import dataclasses
import itertools
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from joblib import Parallel
from sklearn.exceptions import ConvergenceWarning

import skgpstruct._estimator as estimator_module
from skgpstruct import GPStructClassifier
from skgpstruct._vectors import adam_ascent_step
from skgpstruct.datasets import make_sequences
from skgpstruct.inference.elbo import LocalGradient
from skgpstruct.optim.saga import SparseGradient, maximize_saga


class _Residual:
    """A least-squares item's gradient in its local form: item and residual."""

    def __init__(self, i, r):
        self.i, self.r = i, r

    @property
    def nbytes(self):
        return self.r.nbytes


def test_saga_solves_a_least_squares_sum_to_the_exact_optimum():
    # F(x) = -sum_i |A_i x - b_i|^2 / 2 - |x|^2 / 2: closed-form optimum.
    # Items store their 3-dim residual (local form), expanded through A_i.
    rng = np.random.default_rng(0)
    A = [rng.normal(size=(3, 4)) for _ in range(6)]
    b = [rng.normal(size=3) for _ in range(6)]

    def item(i, step, x):
        r = A[i] @ x - b[i]
        return -0.5 * r @ r, _Residual(i, r), -A[i].T @ r

    def expand(record, x):
        return -A[record.i].T @ record.r

    def exact(x):
        return -0.5 * x @ x, -x

    result = maximize_saga(
        item, expand, exact, np.zeros(4), 6, step_size=0.05, max_epochs=400,
        tol=0.0, n_iter_no_change=10**6, rng=np.random.default_rng(1),
    )
    H = sum(a.T @ a for a in A) + np.eye(4)
    optimum = np.linalg.solve(H, sum(a.T @ bb for a, bb in zip(A, b, strict=True)))
    np.testing.assert_allclose(result.x, optimum, atol=2e-3)
    # The stored gradients and their running sum agree; memory is local.
    stored = sum(expand(record, None) for record in result.state["stored"])
    np.testing.assert_allclose(result.state["total"], stored, atol=1e-10)
    assert result.stored_bytes == 6 * 3 * 8


def test_a_continued_saga_state_restarts_the_schedule_and_counts_its_steps(
    monkeypatch,
):
    # Every call steps with step_size / sqrt(e) for its own e-th epoch, a
    # call continuing a state too (it starts from the previous call's
    # averaged point: resuming the decayed steps there ended lower, review
    # h29c), while Adam's step count goes on; n_steps counts the call's own
    # steps (a warm fit's warning reported the running total).
    import skgpstruct.optim.saga as saga_module

    rates, ts, adam = [], [], saga_module.adam_ascent_step

    def recording(x, m, v, d, rate, beta1, beta2, eps, t, *args):
        rates.append(float(rate[0]))
        ts.append(t)
        return adam(x, m, v, d, rate, beta1, beta2, eps, t, *args)

    monkeypatch.setattr(saga_module, "adam_ascent_step", recording)
    rng = np.random.default_rng(5)
    A, b = rng.normal(size=(5, 3)), rng.normal(size=5)

    def item(i, step, x):
        g = A[i] * (b[i] - A[i] @ x)
        return -0.5 * (b[i] - A[i] @ x) ** 2, g, g.copy()

    def run(state=None):
        return maximize_saga(
            item, lambda record, x: record, lambda x: (-0.5 * x @ x, -x),
            np.zeros(3), 5, step_size=0.3, max_epochs=2, tol=0.0,
            n_iter_no_change=100, rng=np.random.default_rng(0), state=state,
        )

    first = run()
    second = run(state=first.state)
    np.testing.assert_allclose(rates, np.repeat([0.3, 0.3 / np.sqrt(2)] * 2, 5),
                               rtol=1e-15)
    assert ts == list(range(1, 21))
    assert (first.n_steps, second.n_steps) == (10, 10)
    assert (first.state["t"], second.state["t"]) == (10, 20)


class _FirstDirection(Exception):
    """Raised by a recording Adam step: the first step's direction."""


def test_saga_direction_is_unbiased_from_a_continued_state(monkeypatch):
    # SAGA's direction for item i at x: the stored gradients re-read at x,
    # plus the exact part, plus n (g_i(x) - stored_i(x)). Averaged over the
    # items, each the first step from the same state, it is the full
    # gradient at x. The state is a previous call's, whose stored records
    # were taken at other points and map to the current x through exp(x),
    # as the variational spreads' log parametrisation does: a continued
    # call must re-read them at its start.
    import skgpstruct.optim.saga as saga_module

    rng = np.random.default_rng(0)
    A = [rng.normal(size=(3, 4)) for _ in range(6)]
    b = [rng.normal(size=3) for _ in range(6)]

    def item(i, step, x):
        r = A[i] @ np.exp(x) - b[i]
        return -0.5 * r @ r, _Residual(i, r), -(A[i].T @ r) * np.exp(x)

    def expand(record, x):
        return -(A[record.i].T @ record.r) * np.exp(x)

    def exact(x):
        return -0.5 * x @ x, -x

    first = maximize_saga(
        item, expand, exact, np.zeros(4), 6, step_size=0.05, max_epochs=2,
        tol=0.0, n_iter_no_change=10**6, rng=np.random.default_rng(1),
    )
    x = first.x
    full = sum(item(i, 0, x)[2] for i in range(6)) + exact(x)[1]

    def recording(x, m, v, direction, *args):
        raise _FirstDirection(direction.copy())

    monkeypatch.setattr(saga_module, "adam_ascent_step", recording)
    directions, order = {}, []

    def spy(i, step, x):
        order.append(i)
        return item(i, step, x)

    for seed in range(200):  # until every item has been drawn first
        order.clear()
        with pytest.raises(_FirstDirection) as raised:
            maximize_saga(
                spy, expand, exact, x, 6, step_size=0.05, max_epochs=1,
                rng=np.random.default_rng(seed), state=first.state,
            )
        directions.setdefault(order[0], raised.value.args[0])
        if len(directions) == 6:
            break
    assert len(directions) == 6
    mean = np.mean([directions[i] for i in range(6)], axis=0)
    np.testing.assert_allclose(mean, full, rtol=1e-12, atol=1e-12)

def _sparse_least_squares(n_items=6, n=10, seed=0):
    """Items whose residual reaches only a few coordinates each."""
    rng = np.random.default_rng(seed)
    supports = [np.sort(rng.choice(n, size=3, replace=False)) for _ in range(n_items)]
    A = [rng.normal(size=(4, 3)) for _ in range(n_items)]
    b = [rng.normal(size=4) for _ in range(n_items)]
    return supports, A, b


@pytest.mark.parametrize("stored_sparse", [True, False])
def test_saga_with_sparse_gradients_takes_the_dense_steps(stored_sparse):
    # The same items, their gradients given on their own coordinates or as
    # dense vectors: the same steps, to the last bit, and the exact optimum.
    supports, A, b = _sparse_least_squares()
    n = 10

    def residual(i, x):
        return A[i] @ x[supports[i]] - b[i]

    def gradient(i, r, sparse):
        values = -A[i].T @ r
        if sparse:
            return SparseGradient(supports[i], values)
        out = np.zeros(n)
        out[supports[i]] = values
        return out

    def run(sparse, expand_sparse):
        def item(i, step, x):
            r = residual(i, x)
            return -0.5 * r @ r, _Residual(i, r), gradient(i, r, sparse)

        def expand(record, x):
            return gradient(record.i, record.r, expand_sparse)

        def exact(x):
            return -0.5 * x @ x, -x

        return maximize_saga(
            item, expand, exact, np.zeros(n), len(A), step_size=0.05,
            max_epochs=300, tol=0.0, n_iter_no_change=10**6,
            rng=np.random.default_rng(1),
        )

    dense = run(False, False)
    sparse = run(True, stored_sparse)
    np.testing.assert_array_equal(sparse.x, dense.x)
    np.testing.assert_array_equal(sparse.state["total"], dense.state["total"])
    H, rhs = np.eye(n), np.zeros(n)
    for s_, a, bb in zip(supports, A, b, strict=True):
        H[np.ix_(s_, s_)] += a.T @ a
        rhs[s_] += a.T @ bb
    np.testing.assert_allclose(sparse.x, np.linalg.solve(H, rhs), atol=2e-3)


def test_sparse_gradient_differences_on_other_coordinates():
    # A new gradient and a stored one on different coordinates (or one of
    # them dense) subtract as the dense vectors do.
    from skgpstruct.optim.saga import _difference

    a = SparseGradient(np.array([0, 3]), np.array([1.0, 2.0]))
    b = SparseGradient(np.array([3, 4]), np.array([0.5, 4.0]))
    expected = a.toarray(6) - b.toarray(6)
    for new, old in [(a, b), (a, b.toarray(6)), (a.toarray(6), b)]:
        result = _difference(new, old, 6)
        if isinstance(result, SparseGradient):
            result = result.toarray(6)
        np.testing.assert_array_equal(result, expected)
    same = _difference(a, SparseGradient(a.indices, np.array([1.0, 1.0])), 6)
    assert isinstance(same, SparseGradient) and same.indices is a.indices
    np.testing.assert_array_equal(same.values, [0.0, 1.0])


def _adam_reference(x, m, v, d, rate, beta1, beta2, eps, t, low, high):
    """Adam's ascent step written with NumPy, on copies."""
    m = beta1 * m + (1 - beta1) * d
    v = beta2 * v + (1 - beta2) * d**2
    m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
    x = x + rate * m_hat / (np.sqrt(v_hat) + eps)
    if low is not None:
        x = np.clip(x, low, high)
    return x, m, v


@pytest.mark.parametrize("bounded", [False, True])
@pytest.mark.parametrize("t", [1, 2, 37])
def test_compiled_adam_step_is_the_adam_formula(bounded, t):
    rng = np.random.default_rng(t)
    n = 1001  # odd: the vectorised loop's remainder too
    x, d = rng.normal(size=(2, n))
    m, v = rng.normal(size=n), rng.uniform(0.0, 2.0, size=n)
    v[:5] = 0.0  # sqrt(0) + eps
    rate = rng.uniform(0.01, 0.1, size=n)
    low = high = None
    if bounded:
        low, high = np.full(n, -np.inf), np.full(n, np.inf)
        low[::3], high[1::3] = -0.01, 0.01  # some coordinates end on a bound
    expected = _adam_reference(x, m, v, d, rate, 0.9, 0.999, 1e-8, t, low, high)
    adam_ascent_step(x, m, v, d, rate, 0.9, 0.999, 1e-8, t, low, high)
    for got, want in zip((x, m, v), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
    if bounded:
        assert np.all(x[::3] >= -0.01) and np.all(x[1::3] <= 0.01)
        assert np.any(x[::3] == -0.01) and np.any(x[1::3] == 0.01)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"m": np.zeros(4)}, "same length"),
        ({"rate": np.ones(6)}, "same length"),
        ({"low": np.zeros(5)}, "both low and high"),
        ({"low": np.zeros(4), "high": np.ones(4)}, "length of x"),
        ({"t": 0}, "t must be >= 1"),
        ({"direction": "x"}, "not share memory"),
        ({"rate": "m"}, "not share memory"),
    ],
)
def test_compiled_adam_step_refuses_mismatched_arguments(change, match):
    args = {name: np.zeros(5) for name in ("x", "m", "v", "direction", "rate")}
    # A string names another argument: the two share their array.
    change = {k: args[c] if isinstance(c, str) else c for k, c in change.items()}
    args.update(beta1=0.9, beta2=0.999, eps=1e-8, t=1, low=None, high=None)
    args.update(change)
    with pytest.raises(ValueError, match=match):
        adam_ascent_step(**args)


def test_saga_returns_the_best_point_on_the_held_out_score():
    # The held-out score peaks at epoch 3: the fit stops n_iter_no_change
    # epochs later and returns the point it had after epoch 3.
    scores = iter([1.0, 2.0, 3.0, 2.0, 2.5, 2.9, 9.0])
    seen = []

    def item(i, step, x):
        return 0.0, np.ones(1), np.ones(1)

    def validation(x):
        seen.append(x.copy())
        return next(scores)

    result = maximize_saga(
        item, lambda record, x: record, lambda x: (0.0, np.zeros(1)),
        np.zeros(1), 2, step_size=0.1, max_epochs=10, tol=0.0,
        n_iter_no_change=3, rng=np.random.default_rng(0), validation=validation,
    )
    assert result.validation_history == [1.0, 2.0, 3.0, 2.0, 2.5, 2.9]
    assert result.converged and result.best_epoch == 3
    np.testing.assert_array_equal(result.x, seen[2])
    assert not np.array_equal(result.x, seen[-1])


@pytest.fixture(scope="module")
def data():
    X, y = make_sequences(90, random_state=2, noise=0.7)
    return X[:60], y[:60], X[60:], y[60:]


def _majority(y):
    return np.bincount(np.concatenate(y)).max() / sum(map(len, y))


def test_stochastic_fit_reaches_batch_accuracy(data):
    X, y, X_test, y_test = data
    common = dict(kernel="rbf", n_inducing=40, random_state=0)
    batch = GPStructClassifier(max_iter=300, tol=1e-4, **common).fit(X, y)
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


def test_stochastic_refuses_score_estimator(data, monkeypatch):
    # With the other parameters, before any work on the data (the refusal
    # came after inducing-point selection and chunking), and alike for fit
    # and partial_fit.
    X, y, _, _ = data

    def no_work(*args, **kwargs):
        raise AssertionError("work done before the parameters were checked")

    monkeypatch.setattr(GPStructClassifier, "_make_inducing", no_work)
    expected = ("runs SAGA with the pathwise estimator: gradient='score' is "
                "available with fit and optimizer='lbfgs' only")
    with pytest.raises(ValueError, match="optimizer='stochastic' " + expected):
        GPStructClassifier(optimizer="stochastic", gradient="score").fit(X, y)
    with pytest.raises(ValueError, match="partial_fit " + expected):
        GPStructClassifier(gradient="score").partial_fit(X, y, classes=[0, 1, 2])


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


@pytest.mark.parametrize("shuffle", [False, True])
def test_saga_epochs_draw_items_with_or_without_replacement(shuffle):
    drawn = []

    def item(i, step, x):
        drawn.append(i)
        return 0.0, np.zeros(1), np.zeros(1)

    maximize_saga(
        item, lambda record, x: record, lambda x: (0.0, np.zeros(1)), np.zeros(1),
        20, step_size=0.1, max_epochs=3, tol=0.0, n_iter_no_change=5,
        rng=np.random.default_rng(0), shuffle=shuffle,
    )
    epochs = np.reshape(drawn, (3, 20))
    once_each = [sorted(epoch) == list(range(20)) for epoch in epochs]
    # With replacement, 20 draws of 20 items all differ with probability
    # 20! / 20**20 < 1e-7.
    assert all(once_each) if shuffle else not any(once_each)
    if shuffle:  # in a fresh order every epoch
        assert not np.array_equal(epochs[0], epochs[1])


def test_one_partial_fit_call_steps_on_every_mini_batch_once(monkeypatch):
    X, y = make_sequences(40, random_state=6)
    steps = []
    run = estimator_module.maximize_saga

    def spy(item, *args, **kwargs):
        def recorded(i, step, x):
            steps.append(i)
            return item(i, step, x)

        return run(recorded, *args, **kwargs)

    monkeypatch.setattr(estimator_module, "maximize_saga", spy)
    model = GPStructClassifier(batch_size=3, random_state=0)
    model.partial_fit(X[:30], y[:30], classes=[0, 1, 2])
    assert sorted(steps) == list(range(10))
    model.partial_fit(X[30:], y[30:])
    assert sorted(steps[10:]) == list(range(4))  # 10 sequences, batches of 3


def test_saga_stops_after_n_epochs_without_beating_the_best():
    # Item values fall after the third epoch: the fit must stop exactly
    # n_iter_no_change epochs after the best one, not at the first dip.
    values = iter([1.0, 2.0, 3.0, 2.5, 2.9, 2.8, 2.7, 5.0])

    def item(i, step, x):
        return next(values), np.zeros(1), np.zeros(1)

    def exact(x):
        return 0.0, np.zeros(1)

    result = maximize_saga(
        item, lambda record, x: record, exact, np.zeros(1), 1, step_size=0.1,
        max_epochs=8, tol=0.0, n_iter_no_change=4, rng=np.random.default_rng(0),
    )
    assert result.history == [1.0, 2.0, 3.0, 2.5, 2.9, 2.8, 2.7]
    assert result.converged


def test_saga_history_sums_the_last_value_of_every_item():
    # Items of very different sizes, drawn with replacement: the epoch's
    # estimate is the sum of every item's last value (scaled up from the
    # items seen while some are not) plus the exact term, whichever items
    # the epoch happened to draw; the mean of the per-step estimates would
    # follow the draws.
    base = np.array([1.0, 10.0, 100.0, 1000.0])
    calls = np.zeros(4)
    expected, n_seen = [], []

    def item(i, step, x):
        calls[i] += 1
        return base[i] + calls[i], np.zeros(1), np.zeros(1)

    def callback(epoch, value, seconds):
        seen = calls > 0
        n_seen.append(int(seen.sum()))
        last = base[seen] + calls[seen]
        expected.append(4 * last.mean() + 0.5)

    result = maximize_saga(
        item, lambda record, x: record, lambda x: (0.5, np.zeros(1)),
        np.zeros(1), 4, step_size=0.1, max_epochs=6, tol=0.0,
        n_iter_no_change=100, rng=np.random.default_rng(1), callback=callback,
    )
    assert len(result.history) == 6
    np.testing.assert_allclose(result.history, expected, rtol=1e-12)
    # The first epoch's draws skipped an item (its estimate is scaled up);
    # later ones saw every item, some more often than others.
    assert n_seen[0] < 4 and n_seen[-1] == 4 and np.unique(calls).size > 1


def test_saga_history_keeps_a_non_finite_item_value():
    # An item whose value is NaN or -inf makes the estimate so; it is not
    # taken for an item not drawn yet.
    for bad in (np.nan, -np.inf):
        def item(i, step, x, bad=bad):
            return (bad if i == 0 else 1.0), np.zeros(1), np.zeros(1)

        result = maximize_saga(
            item, lambda record, x: record, lambda x: (0.0, np.zeros(1)),
            np.zeros(1), 2, step_size=0.1, max_epochs=4, tol=0.0,
            n_iter_no_change=100, rng=np.random.default_rng(0),
        )
        assert not np.isfinite(result.history[-1])
        if bad == -np.inf:
            assert result.history[-1] == -np.inf


def test_saga_returns_the_average_of_the_epochs_end_points():
    # A noisy least-squares problem: E epochs return the exponential average
    # of the end points of epochs 1..E. The end point of epoch e is read off
    # a longer run with the same generator (the x of epoch e + 1's first
    # step): the fit is the same up to there.
    from skgpstruct.optim.saga import AVERAGE_EPOCHS

    rng = np.random.default_rng(3)
    A, b = rng.normal(size=(6, 2)), rng.normal(size=6)
    n_epochs = AVERAGE_EPOCHS + 4

    def run(max_epochs, seen):
        def item(i, step, x):
            seen.append(x.copy())
            g = A[i] * (b[i] - A[i] @ x) + 0.3 * np.sin(step)  # step noise
            return -0.5 * (b[i] - A[i] @ x) ** 2, g, g.copy()

        return maximize_saga(
            item, lambda record, x: record, lambda x: (0.0, np.zeros(2)),
            np.zeros(2), 6, step_size=0.2, max_epochs=max_epochs, tol=0.0,
            n_iter_no_change=100, rng=np.random.default_rng(0),
        )

    result = run(n_epochs, [])
    longer = []
    run(n_epochs + 1, longer)
    ends = [longer[6 * e] for e in range(1, n_epochs + 1)]
    expected = ends[0].copy()
    for e, end in enumerate(ends[1:], start=2):
        expected += (end - expected) / min(e, AVERAGE_EPOCHS)
    np.testing.assert_allclose(result.x, expected, rtol=1e-12)
    # Not the last iterate: the average is another point.
    assert not np.allclose(result.x, ends[-1])


def _stochastic_objective(model_params, X, y):
    """The SparseELBO a stochastic fit builds (captured through evaluate_local)."""
    from skgpstruct.inference.elbo import SparseELBO

    captured = {}
    original = SparseELBO.evaluate_local

    def spy(self, vector, chunk_index, iteration_key, **kw):
        captured.setdefault("objective", self)
        captured.setdefault("vector", vector.copy())
        return original(self, vector, chunk_index, iteration_key, **kw)

    SparseELBO.evaluate_local = spy
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            GPStructClassifier(optimizer="stochastic", max_iter=1, **model_params).fit(
                X, y
            )
    finally:
        SparseELBO.evaluate_local = original
    return captured["objective"], captured["vector"]


@pytest.mark.parametrize(
    "model_params",
    [
        dict(kernel="rbf", n_inducing=15, random_state=0),
        dict(kernel="linear", random_state=1),  # inducing features, grouped rows
        dict(kernel="rbf", n_inducing=10, covariance="full", n_components=2,
             random_state=2),
    ],
)
def test_local_gradient_expands_to_the_full_gradient(data, model_params):
    # A stored local gradient read back through expand_local is the packed
    # gradient the full evaluation of the same chunk and samples gives.
    X, y, _, _ = data
    X = X[:20]
    compact = model_params["kernel"] == "linear"
    if compact:
        # Two more features, each active in one sequence only, so that no
        # chunk holds every feature: the layouts are compact.
        X = [np.hstack([x, np.zeros((len(x), 2))]) for x in X]
        X[0][:, -2] = X[-1][:, -1] = 1.0
        # Sparse: "linear" centres dense features, which would fill them in.
        X = [sp.csr_matrix(x) for x in X]
    objective, x = _stochastic_objective(model_params, X, y[:20])
    x = x + 0.05 * np.random.default_rng(3).standard_normal(x.size)
    with Parallel(n_jobs=1) as parallel:
        for chunk_index, key in ((0, 7), (1, 11)):
            layout = objective.chunks[chunk_index].layout
            assert (objective.inducing.support(layout) is not None) == compact
            reference = objective.evaluate(
                x, parallel, chunks=[objective.chunks[chunk_index]],
                iteration_key=key, include_kl=False,
            )
            ell, record, gradient = objective.evaluate_local(x, chunk_index, key)
            assert isinstance(record, LocalGradient)
            expanded = objective.expand_local(x, record)
            # Compact layouts (inducing features) give gradients on the
            # chunk's own coordinates, the others dense ones.
            assert isinstance(gradient, SparseGradient) == compact
            assert isinstance(expanded, SparseGradient) == compact
            if compact:
                np.testing.assert_array_equal(expanded.indices, gradient.indices)
                indices = gradient.indices
                assert np.unique(indices).size == indices.size <= x.size
                gradient = gradient.toarray(x.size)
                expanded = expanded.toarray(x.size)
            np.testing.assert_allclose(ell, reference.ell, rtol=1e-12)
            np.testing.assert_allclose(gradient, reference.gradient, rtol=1e-10,
                                       atol=1e-12)
            # The token-space part is stored in single precision.
            assert record.unary.dtype == np.float32
            scale = np.abs(reference.gradient).max()
            np.testing.assert_allclose(
                expanded, reference.gradient, rtol=1e-5, atol=1e-6 * scale,
            )
            # A record that keeps its base samples (stacked form: inducing
            # features) reads back to the same numbers without drawing them.
            _, kept, _ = objective.evaluate_local(x, chunk_index, key, keep_noise=True)
            assert record.noise is None
            assert (kept.noise is not None) == compact
            assert kept.nbytes == record.nbytes + kept.noise_nbytes
            again = objective.expand_local(x, kept)
            if compact:
                np.testing.assert_array_equal(again.indices, indices)
                again = again.toarray(x.size)
            np.testing.assert_array_equal(again, expanded)


def test_stochastic_steps_draw_their_own_transition_samples(data):
    # A step's draws of the transitions come from its own key: the batch
    # mode's fixed draws are not read (they were, so SAGA fitted the
    # transitions' posterior to S fixed draws), the same key gives the same
    # draws, another key others.
    X, y, _, _ = data
    objective, x = _stochastic_objective(
        dict(kernel="linear", random_state=1), X[:20], y[:20]
    )
    chunk = objective.chunks[0]
    x[objective.layout.slices["pairwise_log_std"]] = 0.0  # posterior sd 1
    ell, record, _ = objective.evaluate_local(x, 0, 5)
    with Parallel(n_jobs=1) as parallel:
        batch = objective.evaluate(x, parallel, chunks=[chunk], include_kl=False)
        objective.pairwise_noise = np.random.default_rng(9).standard_normal(
            objective.pairwise_noise.shape
        )
        moved = objective.evaluate(x, parallel, chunks=[chunk], include_kl=False)
    assert abs(moved.ell - batch.ell) > 1e-3  # the batch mode reads them
    again, record_again, _ = objective.evaluate_local(x, 0, 5)
    assert again == ell
    np.testing.assert_array_equal(record_again.pairwise_std, record.pairwise_std)
    _, other, _ = objective.evaluate_local(x, 0, 6)
    assert not np.allclose(other.pairwise_std, record.pairwise_std)


def test_local_gradient_of_another_chunk_is_refused():
    # Chunks of 2 sequences of different lengths: a record read back
    # against another chunk (or with another chunk's noise) is an error,
    # not a read past the end of its arrays.
    X, y = make_sequences(8, random_state=5, length_range=(3, 12))
    objective, x = _stochastic_objective(
        dict(kernel="linear", batch_size=2, random_state=0), X, y
    )
    sizes = [chunk.n_tokens for chunk in objective.chunks]
    other = next(i for i in range(1, len(sizes)) if sizes[i] != sizes[0])
    _, record, _ = objective.evaluate_local(x, 0, 3, keep_noise=True)
    with pytest.raises(ValueError, match="local must have shape"):
        objective.expand_local(x, dataclasses.replace(record, chunk_index=other))
    eps, xi = record.noise
    with pytest.raises(ValueError, match="noise must be"):
        objective.expand_local(
            x, dataclasses.replace(record, noise=(eps[:, :, :1], xi))
        )


def test_noise_budget_keeps_the_latest_record_of_each_item():
    budget = estimator_module._NoiseBudget(100)
    assert budget.admit(0, 60)
    assert not budget.admit(1, 60)  # 120 > 100
    assert budget.admit(0, 30)  # replaces item 0's 60 bytes
    assert budget.admit(1, 70)  # 30 + 70
    assert not budget.admit(2, 1)
    assert not budget.admit(1, 80)  # item 1's record is replaced by none
    assert budget.total == 30 and budget.kept == {0: 30}
    assert budget.admit(2, 70)


@pytest.mark.parametrize("records", [0, 3])
def test_kept_noise_gives_the_same_fit(monkeypatch, records):
    # The budget of kept base samples changes the memory and the speed of a
    # stochastic fit, not the fit: no noise kept, some, or all of it.
    X, y = make_sequences(24, random_state=4)
    params = dict(optimizer="stochastic", batch_size=2, max_iter=3,
                  n_iter_no_change=10, random_state=0)
    admitted, sizes = [], []
    admit = estimator_module._NoiseBudget.admit

    def spy(self, item, nbytes):
        answer = admit(self, item, nbytes)
        admitted.append(answer)
        sizes.append(nbytes)
        return answer

    monkeypatch.setattr(estimator_module._NoiseBudget, "admit", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        every = GPStructClassifier(**params).fit(X, y)
        assert admitted and all(admitted)
        admitted.clear()
        # Room for the noise of about `records` of the 12 mini-batches.
        limit = records * max(sizes)
        monkeypatch.setattr(estimator_module, "SAGA_NOISE_BYTES", limit)
        fewer = GPStructClassifier(**params).fit(X, y)
    assert any(admitted) == (records > 0) and not all(admitted)
    for name in ("q_mu_", "q_sqrt_", "pairwise_mean_", "pairwise_std_"):
        np.testing.assert_array_equal(getattr(every, name), getattr(fewer, name))
    assert every.elbo_history_ == fewer.elbo_history_
    assert every.saga_memory_bytes_ > fewer.saga_memory_bytes_
    # Without warm_start the model keeps no SAGA state after the fit.
    assert not hasattr(every, "_saga_state")


def test_warm_stochastic_fit_continues_saga_only_on_the_same_items(monkeypatch):
    # Two data sets of as many mini-batches: a warm fit on the second starts
    # SAGA afresh (the first one's stored gradients have other shapes; it
    # used to read past their end), on the first continues it.
    X, y = make_sequences(40, random_state=6)
    states = []
    run = estimator_module.maximize_saga

    def spy(*args, **kwargs):
        states.append(kwargs["state"])
        return run(*args, **kwargs)

    monkeypatch.setattr(estimator_module, "maximize_saga", spy)
    model = GPStructClassifier(
        optimizer="stochastic", warm_start=True, batch_size=2, max_iter=2,
        random_state=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X[:20], y[:20])
        first = model._saga_state
        first_steps = first["t"]
        model.fit(X[:20], y[:20])
        assert len(states) == 2 and states[0] is None and states[1] is first
        # Continued (its step count goes on), on a copy: the state read is
        # left as it was.
        assert model._saga_state["t"] == first_steps + 10 * model.n_iter_
        assert first["t"] == first_steps and model._saga_state is not first
        model.fit(X[20:], y[20:])
    assert states[2] is None
    assert model._saga_state["n_items"] == 10
    assert np.all(np.isfinite(model.q_mu_))
    # The state kept for the next fit holds the gradients alone, not the
    # base samples they kept during the fit.
    stored = [r for r in model._saga_state["stored"] if r is not None]
    assert stored and all(r.noise is None for r in stored)
    # Without warm_start nothing is kept.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.set_params(warm_start=False).fit(X[:20], y[:20])
    assert states[3] is None
    assert not hasattr(model, "_saga_state") and not hasattr(model, "_saga_items")


def test_saga_memory_grows_with_tokens_not_inducing_points(data):
    X, y, _, _ = data

    def fit(n_inducing):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            # warm_start keeps SAGA's state after the fit, to be read here.
            return GPStructClassifier(
                kernel="rbf", n_inducing=n_inducing, optimizer="stochastic",
                max_iter=6, n_iter_no_change=10, batch_size=5, n_samples=2,
                random_state=0, warm_start=True,
            ).fit(X[:30], y[:30])

    K, S, V = 1, 2, 3
    n_items, n_tokens = 6, sum(len(s) for s in y[:30])
    for n_inducing in (10, 40):
        model = fit(n_inducing)
        assert all(r is not None for r in model._saga_state["stored"])
        n_theta = len(model.kernel_.theta)
        # Per token K * S * V single-precision floats; per mini-batch the
        # small dense parts in double precision.
        expected = 4 * K * S * V * n_tokens + 8 * n_items * (K + 2 * V * V + n_theta)
        assert model.saga_memory_bytes_ == expected


def test_early_stopping_keeps_the_best_held_out_epoch(data):
    X, y, X_test, y_test = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = GPStructClassifier(
            kernel="rbf", n_inducing=30, optimizer="stochastic", batch_size=5,
            early_stopping=True, validation_fraction=0.2, n_iter_no_change=2,
            tol=1e-3, max_iter=30, random_state=0,
        ).fit(X, y)
    history = model.validation_score_history_
    assert len(history) == model.n_iter_ == len(model.elbo_history_)
    assert np.all(np.isfinite(history)) and max(history) < 0
    # Stopped because the held-out score did not improve for two epochs.
    assert model.n_iter_ < 30
    # Each of the last two epochs failed to beat the best before it by tol.
    for e in (len(history) - 2, len(history) - 1):
        best_before = max(history[:e])
        assert history[e] <= best_before + 1e-3 * max(abs(best_before), 1.0)
    assert model.score(X_test, y_test) > _majority(y_test) + 0.3
    # A later batch fit of the same estimator drops the stochastic attributes.
    model.set_params(optimizer="lbfgs", max_iter=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
    assert not hasattr(model, "validation_score_history_")
    assert not hasattr(model, "saga_memory_bytes_")


def test_warm_early_stopping_appends_its_scores_as_its_objectives(data):
    X, y, _, _ = data
    model = GPStructClassifier(
        optimizer="stochastic", batch_size=5, max_iter=3, warm_start=True,
        random_state=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)  # nothing held out
        model.set_params(early_stopping=True, validation_fraction=0.2).fit(X, y)
        assert len(model.validation_score_history_) == model.n_iter_ == 3
        assert len(model.elbo_history_) == 6
        first = list(model.validation_score_history_)
        model.fit(X, y)
    assert model.validation_score_history_[:3] == first
    assert len(model.validation_score_history_) == 6
    assert len(model.elbo_history_) == 9


@pytest.mark.parametrize("fraction", [0, 1, 1.5, "0.1"])
def test_validation_fraction_is_checked(data, fraction):
    X, y, _, _ = data
    with pytest.raises(ValueError, match="validation_fraction"):
        GPStructClassifier(
            optimizer="stochastic", early_stopping=True,
            validation_fraction=fraction,
        ).fit(X, y)


def test_early_stopping_needs_sequences_left_to_fit(data):
    X, y, _, _ = data
    with pytest.raises(ValueError, match="leaves none to fit"):
        GPStructClassifier(
            optimizer="stochastic", early_stopping=True, validation_fraction=0.5,
        ).fit(X[:1], y[:1])


@pytest.mark.parametrize("fit", ["fit", "partial_fit"])
def test_diverging_steps_name_the_learning_rate(data, fit):
    # learning_rate=100 ran the parameters into NaN, and the fit failed
    # inside the kernel ("theta must be finite, got [nan nan]"); larger
    # rates overflowed exp(log std) and failed in the chain ("pairwise
    # contains NaN or infinite values").
    X, y, _, _ = data
    args = (X, y) if fit == "fit" else (X, y, [0, 1, 2])
    # Full covariances failed the same way ("unary contains NaN or infinite
    # values").
    cases = [(1000.0, "evaluating the objective", "diag"),
             (1000.0, "evaluating the objective", "full")]
    if fit == "fit":  # (one partial_fit epoch, each mini-batch once, survives 100)
        cases.append((100.0, "the stochastic gradient is not finite", "diag"))
    for rate, cause, covariance in cases:
        model = GPStructClassifier(
            optimizer="stochastic", learning_rate=rate, max_iter=5, random_state=0,
            covariance=covariance, n_inducing=20,
        )
        with pytest.raises(ValueError, match=rf"optimizer='stochastic' diverged "
                           rf"\({cause} at step \d+ \(epoch 1\).*"
                           rf"learning_rate={rate} is too large"):
            getattr(model, fit)(*args)


def test_maximize_saga_refuses_a_non_finite_direction():
    from skgpstruct.optim.saga import SAGADiverged, maximize_saga

    def item(i, step, x):
        grad = np.full(x.size, np.inf if step == 3 else 1.0)
        return 0.0, grad.copy(), grad

    with pytest.raises(SAGADiverged, match="not finite at step 3") as error:
        maximize_saga(
            item, lambda record, x: record, lambda x: (0.0, np.zeros(x.size)),
            np.zeros(2), 2, step_size=0.1, max_epochs=5,
            rng=np.random.default_rng(0),
        )
    assert error.value.steps_taken == 2


def test_stochastic_fit_failing_at_its_start_does_not_blame_the_steps():
    # A gradient that overflows at the first step was reported as steps
    # diverging, "learning_rate=0.1 is too large", before any step was taken.
    from skgpstruct.likelihoods import ChainCRF

    class Huge(ChainCRF):
        def _log_prob_and_gradient(self, unary, pairwise, offsets, labels):
            log_p, d_unary, d_pairwise = super()._log_prob_and_gradient(
                unary, pairwise, offsets, labels
            )
            return log_p, np.full_like(d_unary, 1e308), d_pairwise

    X, y = make_sequences(10, random_state=0)
    with pytest.raises(ValueError, match=r"the ELBO cannot be evaluated where the "
                       r"fit starts \(evaluating the objective at step 1 "
                       r"\(epoch 1\) hit overflow"):
        GPStructClassifier(optimizer="stochastic", likelihood=Huge(),
                           max_iter=2, random_state=0).fit(X, y)


def test_saga_state_is_kept_only_for_a_stochastic_fit_that_continues_it():
    # A later cold L-BFGS fit kept (and pickled) the state, a still later
    # warm stochastic fit resumed it; a warm fit with another likelihood
    # continued the old likelihood's stored values (and stopped early).
    X, y = make_sequences(n_sequences=24, length_range=(5, 12), random_state=0)
    model = GPStructClassifier(optimizer="stochastic", batch_size=2, max_iter=2,
                               random_state=0, warm_start=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
        assert hasattr(model, "_saga_state")
        items = model._saga_items
        model.set_params(optimizer="lbfgs", warm_start=False, max_iter=2).fit(X, y)
        assert not hasattr(model, "_saga_state")
        model.set_params(optimizer="stochastic", warm_start=True).fit(X, y)
        assert model._saga_state["t"] == 2 * 12  # started afresh: 2 epochs
        model.set_params(likelihood="pseudo").fit(X, y)
    assert model._saga_items != items  # the likelihood is part of the key
    assert model._saga_state["t"] == 2 * 12


def test_early_stopping_refuses_a_training_part_without_tokens():
    # The held-out sequences held every token: the fit ran on the prior alone.
    X, y = make_sequences(n_sequences=4, random_state=0)
    X = [X[0], *[x[:0] for x in X[1:]]]
    y = [y[0], *[s[:0] for s in y[1:]]]
    model = GPStructClassifier(optimizer="stochastic", early_stopping=True,
                               validation_fraction=0.25, random_state=8)
    # (random_state=8 holds out the one non-empty sequence)
    with pytest.raises(ValueError, match="the sequences left to fit are all empty"):
        model.fit(X, y)


def test_partial_fit_keeps_the_type_of_its_first_classes():
    # classes=[0., 1., 2.] after integer classes: equal, but classes_ became
    # float and predict returned floats.
    X, y = make_sequences(n_sequences=12, random_state=0)
    model = GPStructClassifier(random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.partial_fit(X[:6], y[:6], classes=[0, 1, 2])
        model.partial_fit(X[6:], y[6:], classes=[0.0, 1.0, 2.0])
    assert model.classes_.dtype.kind == "i"
    assert model.predict(X[:1])[0].dtype.kind == "i"


def _state_bytes(model):
    # Every attribute, by value (a failed fit that changed an array in place
    # would show here), but the prediction caches, found again when needed.
    import pickle

    return pickle.dumps(
        {k: v for k, v in vars(model).items() if k not in estimator_module._CACHES}
    )


def test_a_failed_refit_leaves_the_previous_model_whole(data):
    # A refit that diverged popped saga_memory_bytes_ and
    # validation_score_history_ before SAGA ran and left the old model
    # predicting without them; the steps it took before diverging advanced
    # SAGA's stored state in place, which the next warm fit continued.
    import pickle

    X, y, X_test, _ = data
    model = GPStructClassifier(
        optimizer="stochastic", early_stopping=True, warm_start=True,
        batch_size=5, max_iter=3, random_state=0, n_inducing=20,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
    marginals = model.predict_marginals(X_test)
    before = _state_bytes(model)
    never_failed = pickle.loads(pickle.dumps(model))
    assert model.saga_memory_bytes_ > 0 and model.validation_score_history_

    # Refused before any step (bad data).
    bad = [x.copy() for x in X]
    bad[3][0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        model.fit(bad, y)
    assert _state_bytes(model) == before

    # Diverged after some steps.
    model.set_params(learning_rate=1000.0)
    with pytest.raises(ValueError, match="diverged"):
        model.fit(X, y)
    model.set_params(learning_rate=0.1)
    assert _state_bytes(model) == before
    for got, expected in zip(model.predict_marginals(X_test), marginals, strict=True):
        np.testing.assert_array_equal(got, expected)

    # The next warm fit continues as if the failed one had not been made.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
        never_failed.fit(X, y)
    assert model._saga_state["t"] == never_failed._saga_state["t"] > 0
    np.testing.assert_array_equal(model.q_mu_, never_failed.q_mu_)
    np.testing.assert_array_equal(model.q_sqrt_, never_failed.q_sqrt_)
    assert model.validation_score_history_ == never_failed.validation_score_history_


def test_an_interrupted_fit_leaves_the_previous_model_whole(data, monkeypatch):
    X, y, X_test, y_test = data
    model = GPStructClassifier(
        optimizer="stochastic", early_stopping=True, batch_size=5, max_iter=2,
        random_state=0, n_inducing=20,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
    before = _state_bytes(model)
    assert model.saga_memory_bytes_ > 0 and model.validation_score_history_

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(estimator_module, "maximize_saga", interrupted)
    for refit in (lambda: model.fit(X_test, y_test),
                  lambda: model.partial_fit(X[:10], y[:10])):
        with pytest.raises(KeyboardInterrupt):
            refit()
        assert _state_bytes(model) == before


@pytest.mark.parametrize("setting", [
    {"kernel": "rbf", "n_inducing": 20},
    {"inducing": "kmeans++", "n_inducing": 20},
])
def test_warm_stochastic_fit_with_inducing_points_continues_saga(data, setting):
    # Choosing inducing points drew from random_state's stream in the first
    # fit only: the warm fit's mini-batches and held-out split came out
    # different, and SAGA's stored gradients were silently dropped.
    X, y, _, _ = data
    model = GPStructClassifier(
        optimizer="stochastic", warm_start=True, early_stopping=True,
        batch_size=6, max_iter=2, random_state=0, **setting,
    )
    held_out = []
    split = model._validation_split

    def spy(order, lengths):
        kept, validation = split(order, lengths)
        held_out.append(sorted(np.concatenate(validation).tolist()))
        return kept, validation

    model._validation_split = spy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
        steps = model._saga_state["t"]
        n_items = model._saga_state["n_items"]
        model.fit(X, y)
    assert held_out[0] == held_out[1]
    assert model._saga_state["t"] == steps + n_items * model.n_iter_


def test_partial_fit_calls_draw_fresh_samples_with_an_integer_seed(monkeypatch):
    # Every call re-seeded from the integer random_state, and SAGA's steps,
    # which key the samples, restart per call: passes over the same pieces
    # drew the same samples every time.
    X, y = make_sequences(20, random_state=6)
    entropies = []
    make_chunks = estimator_module._make_chunks

    def spy(sequences, offsets, label_index, groups, seeds):
        entropies.append(tuple(seed.entropy for seed in seeds))
        return make_chunks(sequences, offsets, label_index, groups, seeds)

    monkeypatch.setattr(estimator_module, "_make_chunks", spy)

    def stream():
        model = GPStructClassifier(random_state=0, batch_size=5)
        for piece in (slice(0, 10), slice(10, 20), slice(0, 10)):
            model.partial_fit(X[piece], y[piece], classes=[0, 1, 2])
        return model

    first = stream()
    calls = entropies[:]
    assert len(set(calls)) == 3  # every call its own samples
    second = stream()  # and still reproducible
    assert entropies[3:] == calls
    np.testing.assert_array_equal(first.q_mu_, second.q_mu_)


_ADAM_NAMES = ("x", "m", "v", "direction", "rate")


def _adam_args(n, rng):
    x, m, d = rng.normal(size=(3, n))
    return {
        "x": x, "m": m, "v": rng.uniform(0.1, 2.0, n), "direction": d,
        "rate": rng.uniform(0.01, 0.1, n), "beta1": 0.9, "beta2": 0.999,
        "eps": 1e-8, "t": 3,
    }


@pytest.mark.parametrize("first, second", list(itertools.combinations(range(5), 2)))
def test_compiled_adam_step_refuses_every_pair_of_overlapping_arguments(first, second):
    # Catches V12 (the overlap loop "for b in range(a)" -> "range(a - 1)":
    # x/m, m/v, v/direction and direction/rate never compared; the existing
    # test only shares direction with x and rate with m) and V13 (the
    # overlap measured in doubles, not bytes: views offset by one entry are
    # not seen to overlap). Overlapping arrays then reach the C loop,
    # declared restrict: undefined behaviour, and no ValueError.
    n = 6
    rng = np.random.default_rng(0)
    for shift in (0, 1, n - 1):  # the same array, then partial overlaps
        buffer = rng.normal(size=2 * n)
        args = _adam_args(n, rng)
        args[_ADAM_NAMES[first]] = buffer[:n]
        args[_ADAM_NAMES[second]] = buffer[shift:shift + n]
        with pytest.raises(ValueError, match="not share memory"):
            adam_ascent_step(**args)


def test_compiled_adam_step_refuses_bounds_of_the_wrong_length():
    # Catches V19 (only low's length compared with x's): the existing test
    # gives low and high the same wrong length. A short high is read past
    # its end by the C clip loop.
    rng = np.random.default_rng(2)
    args = _adam_args(5, rng)
    for low, high in [(np.zeros(5), np.ones(4)), (np.zeros(4), np.ones(5)),
                      (np.zeros(5), np.ones(6))]:
        with pytest.raises(ValueError, match="length of x"):
            adam_ascent_step(**args, low=low, high=high)
