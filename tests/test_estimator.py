"""GPStructClassifier: scikit-learn conventions and input handling.

Every test fits on small synthetic data (``make_sequences`` with short
sequences and low noise) with parameters under which L-BFGS converges in a
few dozen iterations, so that ``filterwarnings = error`` holds without
silencing ``ConvergenceWarning``. Expected values come from outside the
estimator: label counts, ``KFold`` splits computed here, the training rows.
"""

import copy
import pickle
import re
import warnings

import joblib
import numpy as np
import pytest
import scipy.sparse as sp
from _chain_reference import enumerate_one
from scipy.special import logsumexp
from sklearn.base import clone, is_classifier
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.gaussian_process.kernels import RBF, ConstantKernel
from sklearn.model_selection import GridSearchCV, KFold, cross_val_score
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import FunctionTransformer
from sklearn.utils.estimator_checks import (
    check_no_attributes_set_in_init,
    check_parameters_default_constructible,
)

import skgpstruct._estimator as estimator_module
from skgpstruct import GPStructClassifier, SequenceDictVectorizer, chain
from skgpstruct._sequences import (
    FEW_MATRICES,
    check_sequence_features,
    chunk_slices,
    hstack_csr,
    sorted_unique,
    stack_sequences,
)
from skgpstruct.datasets import make_sequences
from skgpstruct.inference.inducing import InducingFeatures
from skgpstruct.kernels import Kernel, LinearKernel, RBFKernel
from skgpstruct.likelihoods import Likelihood
from skgpstruct.metrics import SCORERS, sequence_accuracy, token_accuracy

#: Converges (relative ELBO change < 1e-2) in about 20 iterations on DATA.
FAST = {"n_inducing": 20, "max_iter": 100, "tol": 1e-2, "random_state": 0}
N_FEATURES = 8
N_CLASSES = 3
LETTERS = np.array(["b-np", "i-np", "o"])  # sorted, like classes_ must be


def split(n_sequences=40, n_train=30, *, noise=0.5, sparse=False, seed=0):
    """(X_train, y_train, X_test, y_test) of easy synthetic sequences."""
    X, y = make_sequences(
        n_sequences=n_sequences, n_classes=N_CLASSES, n_features=N_FEATURES,
        length_range=(2, 8), noise=noise, sparse=sparse, random_state=seed,
    )
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


def majority_rate(y):
    """Share of the most frequent label among all tokens of ``y``."""
    _, counts = np.unique(np.concatenate(y), return_counts=True)
    return counts.max() / counts.sum()


def flat_accuracy(y_true, y_pred):
    """Token accuracy computed here, without the library's metrics."""
    return float(np.mean(np.concatenate(y_true) == np.concatenate(y_pred)))


def assert_clearly_better_than_chance(y_true, y_pred):
    accuracy = flat_accuracy(y_true, y_pred)
    majority = majority_rate(y_true)
    assert accuracy > 0.8, accuracy
    assert accuracy > majority + 0.3, (accuracy, majority)


def token_dicts(X):
    """crfsuite-style token dicts (numbers and a categorical) from features."""
    return [
        [
            {f"x{j}": float(v) for j, v in enumerate(row)}
            | {"sign0": "pos" if row[0] > 0 else "neg"}
            for row in seq
        ]
        for seq in X
    ]


def double_features(X):
    """A stateless list-to-list transformer for FunctionTransformer."""
    return [2.0 * np.asarray(x) for x in X]


def take(items, indices):
    return [items[i] for i in indices]


class UnaryOnlyLikelihood(Likelihood):
    """Independent softmax per token; provides log p(y | f) only."""

    def _log_prob(self, unary, pairwise, offsets, labels):
        log_softmax = unary - logsumexp(unary, axis=2, keepdims=True)
        n_samples, n_tokens, _ = unary.shape
        per_token = log_softmax[:, np.arange(n_tokens), labels]
        cumulative = np.zeros((n_samples, n_tokens + 1))
        np.cumsum(per_token, axis=1, out=cumulative[:, 1:])
        return cumulative[:, offsets[1:]] - cumulative[:, offsets[:-1]]


@pytest.fixture(scope="module")
def data():
    return split()


@pytest.fixture(scope="module")
def fitted(data):
    """A model fitted on dense ``data``; tests must not modify it."""
    X, y, _, _ = data
    return GPStructClassifier(**FAST).fit(X, y)


def fitted_attributes(model):
    return (
        model.q_mu_, model.q_sqrt_, model.weights_, model.pairwise_mean_,
        model.pairwise_std_, model.kernel_.theta,
    )


def assert_same_fit(a, b):
    for left, right in zip(fitted_attributes(a), fitted_attributes(b), strict=True):
        np.testing.assert_array_equal(left, right)
    assert a.elbo_history_ == b.elbo_history_
    assert a.n_iter_ == b.n_iter_


# --------------------------------------------------------------------------- #
# parameters: __init__, get_params / set_params, clone


def test_sklearn_init_checks():
    check_no_attributes_set_in_init("GPStructClassifier", GPStructClassifier())
    check_parameters_default_constructible(
        "GPStructClassifier", GPStructClassifier()
    )


def test_init_stores_parameters_unchanged():
    kernel, likelihood = RBFKernel(length_scale=2.0), UnaryOnlyLikelihood()
    given = {
        "kernel": kernel, "n_inducing": 7, "n_components": 2,
        "covariance": "full", "likelihood": likelihood, "gradient": "score",
        "optimizer": "lbfgs",
        "n_samples": 3, "max_iter": 11, "tol": 0.5, "decode": "marginal",
        "learn_hyperparameters": False, "pairwise_prior_variance": 2.5,
        "inducing": "random", "n_predict_samples": 5, "n_jobs": 2,
        "random_state": 42, "verbose": 1, "warm_start": True,
        "inference": "ess", "ess_n_iter": 12, "ess_burn_in": 3, "ess_thin": 2,
        "ess_memory_limit": 10**6, "feature_groups": None, "batch_size": 4,
        "learning_rate": 0.3, "n_iter_no_change": 7, "early_stopping": True,
        "validation_fraction": 0.25, "pairwise_uncertainty": True,
        "collapse_lone_features": False, "hyperprior_scale": 1.5,
    }
    params = GPStructClassifier(**given).get_params(deep=False)
    assert params.keys() == given.keys()
    for name, value in given.items():
        assert params[name] is value, name
    # Invalid values are stored too: validation belongs to fit.
    assert GPStructClassifier(covariance="foo", n_inducing=-1).n_inducing == -1


def test_get_params_set_params_round_trip():
    source = GPStructClassifier(
        "rbf", n_inducing=7, covariance="full", random_state=3, decode="marginal"
    )
    target = GPStructClassifier().set_params(**source.get_params())
    assert target.get_params() == source.get_params()
    # Nested kernel parameters go through the kernel's own get/set_params.
    model = GPStructClassifier(RBFKernel(length_scale=2.0))
    assert model.get_params()["kernel__length_scale"] == 2.0
    model.set_params(kernel__length_scale=5.0)
    assert model.kernel.get_params()["length_scale"] == 5.0
    with pytest.raises(ValueError, match="n_inducingg"):
        model.set_params(n_inducingg=3)


def test_clone_copies_parameters_not_fitted_state(fitted):
    model = GPStructClassifier(
        RBFKernel(length_scale=2.0), n_inducing=9, random_state=1
    )
    twin = clone(model)
    assert twin is not model and twin.kernel is not model.kernel
    assert repr(twin.kernel) == repr(model.kernel)
    assert twin.get_params(deep=False).keys() == model.get_params(deep=False).keys()
    assert twin.n_inducing == 9 and twin.random_state == 1
    fresh = clone(fitted)
    assert fresh.get_params() == fitted.get_params()
    for name in ("classes_", "q_mu_", "kernel_", "elbo_history_"):
        assert not hasattr(fresh, name), name


@pytest.mark.parametrize(
    "make_kernel",
    [lambda: RBFKernel(length_scale=2.0), lambda: RBF() * ConstantKernel()],
    ids=["skgpstruct", "sklearn"],
)
def test_fit_never_modifies_the_kernel_parameter(data, make_kernel):
    X, y, _, _ = data
    kernel = make_kernel()
    before = (repr(kernel), kernel.theta.copy())
    model = GPStructClassifier(kernel, **FAST).fit(X, y)
    assert model.kernel is kernel
    assert (repr(kernel), list(kernel.theta)) == (before[0], list(before[1]))
    assert model.kernel_ is not kernel
    # The hyperparameters were learned, on the copy.
    assert not np.allclose(model.kernel_.theta[: len(before[1])], before[1])


def test_not_tagged_as_classifier():
    # Integer cv must give KFold (stratification is undefined on sequences).
    assert not is_classifier(GPStructClassifier())
    assert not is_classifier(make_pipeline(SequenceDictVectorizer(),
                                           GPStructClassifier()))


# --------------------------------------------------------------------------- #
# model selection and pipelines


def test_grid_search_cv2_over_dict_pipeline_matches_manual_kfold():
    X, y, _, _ = split(n_sequences=30, noise=1.5, seed=1)
    labels = [LETTERS[s] for s in y]
    D = token_dicts(X)
    pipe = Pipeline([
        ("vec", SequenceDictVectorizer()),
        ("gp", GPStructClassifier(inducing="kmeans++", **FAST)),
    ])
    grid = {"gp__n_inducing": [5, 20]}
    search = GridSearchCV(
        pipe, grid, cv=2, scoring=SCORERS["token_accuracy"], error_score="raise"
    ).fit(D, labels)

    folds = list(KFold(n_splits=2).split(D))
    for i, n_inducing in enumerate(grid["gp__n_inducing"]):
        assert search.cv_results_["params"][i] == {"gp__n_inducing": n_inducing}
        for k, (train, test) in enumerate(folds):
            model = clone(pipe).set_params(gp__n_inducing=n_inducing)
            model.fit(take(D, train), take(labels, train))
            expected = flat_accuracy(take(labels, test), model.predict(take(D, test)))
            assert search.cv_results_[f"split{k}_test_score"][i] == pytest.approx(
                expected, abs=1e-12
            )
    best = search.best_estimator_
    assert best.named_steps["gp"].n_inducing == search.best_params_["gp__n_inducing"]
    assert list(best.named_steps["gp"].classes_) == list(LETTERS)
    predictions = best.predict(D[:3])
    assert all(set(p) <= set(LETTERS) for p in predictions)
    assert [len(p) for p in predictions] == [len(s) for s in D[:3]]


def test_grid_search_over_kernel_with_string_labels(data):
    X, y, X_test, y_test = data
    labels = [LETTERS[s] for s in y]
    search = GridSearchCV(
        GPStructClassifier(**FAST), {"kernel": ["linear", "rbf"]}, cv=2,
        scoring=SCORERS["sequence_accuracy"], error_score="raise",
    ).fit(X, labels)
    assert search.best_params_["kernel"] in ("linear", "rbf")
    assert search.best_estimator_.kernel == search.best_params_["kernel"]
    assert np.all(np.isfinite(search.cv_results_["mean_test_score"]))
    predictions = search.predict(X_test)
    assert_clearly_better_than_chance([LETTERS[s] for s in y_test], predictions)


@pytest.mark.parametrize("scoring", [None, "sequence_accuracy"])
def test_cross_val_score_over_sequence_lists_is_kfold(data, scoring):
    X, y, _, _ = data
    model = make_pipeline(
        FunctionTransformer(double_features), GPStructClassifier(**FAST)
    )
    scores = cross_val_score(
        model, X, y, cv=2, error_score="raise",
        scoring=None if scoring is None else SCORERS[scoring],
    )
    metric = token_accuracy if scoring is None else sequence_accuracy
    expected = []
    for train, test in KFold(n_splits=2).split(X):
        fold = clone(model).fit(take(X, train), take(y, train))
        expected.append(metric(take(y, test), fold.predict(take(X, test))))
    np.testing.assert_allclose(scores, expected, rtol=0, atol=1e-12)
    assert np.all(scores > 0.5)


# --------------------------------------------------------------------------- #
# pickling and fitted state


@pytest.mark.parametrize("inducing", ["auto", "kmeans++"])
def test_pickle_round_trip_gives_identical_predictions(data, fitted, inducing):
    X, y, X_test, _ = data
    if inducing != "auto":
        fitted = GPStructClassifier(inducing=inducing, **FAST).fit(X, y)
    restored = pickle.loads(pickle.dumps(fitted))
    for a, b in zip(fitted.predict(X_test), restored.predict(X_test), strict=True):
        np.testing.assert_array_equal(a, b)
    marginals = fitted.predict_marginals(X_test)
    for a, b in zip(marginals, restored.predict_marginals(X_test), strict=True):
        np.testing.assert_array_equal(a, b)
    assert_same_fit(fitted, restored)


@pytest.mark.parametrize("method", ["predict", "predict_marginals", "score"])
def test_not_fitted_error(data, method):
    X, y, _, _ = data
    args = (X, y) if method == "score" else (X,)
    with pytest.raises(NotFittedError):
        getattr(GPStructClassifier(), method)(*args)


@pytest.mark.parametrize(
    ("covariance", "n_components", "sparse", "inducing"),
    [
        ("diag", 1, False, "auto"),  # linear + diag: "features"
        ("diag", 2, True, "features"),
        ("full", 1, True, "auto"),  # "kmeans++"
        ("full", 2, False, "random"),
        ("diag", 2, True, "kmeans++"),
    ],
)
def test_fitted_attributes_have_documented_shapes(
    covariance, n_components, sparse, inducing
):
    X, y, _, _ = split(sparse=sparse)
    model = GPStructClassifier(
        covariance=covariance, n_components=n_components, inducing=inducing,
        **FAST,
    ).fit(X, y)
    X_all = sp.vstack(X).toarray() if sparse else np.vstack(X)
    n_features = X_all.shape[1]
    K, V = n_components, N_CLASSES

    np.testing.assert_array_equal(model.classes_, np.arange(V))
    assert model.n_features_in_ == n_features
    Z = model.inducing_points_
    if inducing in ("auto", "features") and covariance == "diag":
        # One inducing variable per feature weight, plus the bias.
        assert Z is None
        M = n_features + 1
    else:
        assert sp.issparse(Z) == sparse
        M = Z.shape[0]
        assert Z.shape == (M, n_features) and 1 <= M <= FAST["n_inducing"]
        Z = Z.toarray() if sparse else Z
        if model.feature_mean_ is not None:  # centred (dense, or the sparse
            # columns active at most tokens)
            assert sparse or np.all(model.feature_mean_ != 0)
            X_all = X_all - model.feature_mean_
        for row in Z:  # every inducing input is a training token
            assert np.any(np.all(X_all == row, axis=1))
        assert len(np.unique(Z, axis=0)) == M  # distinct tokens
    assert isinstance(model.kernel_, Kernel)
    assert model.q_mu_.shape == (K, V, M)
    if covariance == "full":
        assert model.q_sqrt_.shape == (K, V, M, M)
        np.testing.assert_array_equal(np.triu(model.q_sqrt_, 1), 0.0)
    else:
        assert model.q_sqrt_.shape == (K, V, M)
        assert np.all(model.q_sqrt_ > 0)
    assert model.weights_.shape == (K,)
    assert np.all(model.weights_ >= 0)
    assert model.weights_.sum() == pytest.approx(1.0, abs=1e-12)
    assert model.pairwise_mean_.shape == (V, V)
    assert model.pairwise_std_.shape == (V, V)
    assert np.all(model.pairwise_std_ > 0)
    assert isinstance(model.n_iter_, int) and model.n_iter_ >= 1
    assert isinstance(model.elbo_history_, list)
    assert len(model.elbo_history_) == model.n_iter_
    assert all(isinstance(v, float) and np.isfinite(v) for v in model.elbo_history_)
    # L-BFGS never accepts a worse point on the fixed-sample objective.
    assert model.elbo_history_[-1] >= model.elbo_history_[0]


def test_n_inducing_is_capped_at_the_distinct_training_tokens():
    # Two binary features: at most 2**2 distinct tokens.
    X, y, _, _ = split(sparse=True)
    X = [x[:, :2] for x in X]
    n_distinct = len(np.unique(sp.vstack(X).toarray(), axis=0))
    model = GPStructClassifier(
        inducing="kmeans++", **{**FAST, "n_inducing": 50}
    ).fit(X, y)
    assert model.inducing_points_.shape == (n_distinct, 2)
    assert model.q_mu_.shape == (1, N_CLASSES, n_distinct)


def test_learn_hyperparameters_false_keeps_the_kernel(data):
    X, y, _, _ = data
    kernel = RBFKernel(length_scale=2.0)
    model = GPStructClassifier(kernel, learn_hyperparameters=False, **FAST)
    np.testing.assert_array_equal(model.fit(X, y).kernel_.theta, kernel.theta)
    # "linear" starts at a prior sd of 1 for a training token's potential
    # (dense features: centred on their mean, the coordinates it acts on).
    linear = GPStructClassifier(learn_hyperparameters=False, **FAST).fit(X, y)
    centred = np.vstack(X) - linear.feature_mean_
    assert np.mean(linear.kernel_.diag(centred)) == pytest.approx(1.0)


def _initial_theta(X, y, kernel="linear"):
    frozen = GPStructClassifier(kernel, learn_hyperparameters=False, **FAST)
    return frozen.fit(X, y).kernel_.theta


# SAGA's epochs under so steep a prior may run to max_iter: theta is checked.
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize(
    "optimizer, gradient",
    [("lbfgs", "pathwise"), ("lbfgs", "score"), ("stochastic", "pathwise")],
)
def test_a_narrow_hyperprior_holds_the_hyperparameters_at_their_start(
    data, optimizer, gradient
):
    # The prior's pull is added to the objective of every optimiser and
    # estimator (the stochastic optimiser takes it with the exact KL terms).
    X, y, X_test, y_test = data
    # Adam's steps are scale-free: SAGA's first ones move theta by about the
    # step size before so steep a prior pulls it back, so the stochastic
    # fits run their 30 epochs rather than stop on tol.
    params = {**FAST, "optimizer": optimizer, "gradient": gradient,
              "batch_size": 10, "max_iter": 30, "n_iter_no_change": 30}
    start = _initial_theta(X, y)
    free = GPStructClassifier(hyperprior_scale=None, **params).fit(X, y)
    held = GPStructClassifier(hyperprior_scale=1e-4, **params).fit(X, y)
    assert np.max(np.abs(free.kernel_.theta - start)) > 0.1
    np.testing.assert_allclose(held.kernel_.theta, start, atol=1e-3)
    # The rest of the posterior is still fitted: so stiff a prior once
    # stopped L-BFGS after one tiny step (see _PriorUnits).
    assert held.n_iter_ > 1
    assert_clearly_better_than_chance(y_test, held.predict(X_test))
    # The pairwise prior variance has no hyperprior: it moves either way.
    assert held.pairwise_prior_variance_ != 1.0


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_hyperprior_centre_is_the_first_fit_s_through_partial_fit(data):
    # "linear" starts at a variance set by the data; a second batch of
    # larger features would start elsewhere, but the prior is the model's.
    X, y, _, _ = data
    first = _initial_theta(X[:15], y[:15])
    larger = [3.0 * x for x in X[15:]]
    assert np.max(np.abs(_initial_theta(larger, y[15:]) - first)) > 1.0
    model = GPStructClassifier(
        hyperprior_scale=1e-4, optimizer="stochastic", batch_size=5, **{
            k: v for k, v in FAST.items() if k != "max_iter"
        }
    )
    model.partial_fit(X[:15], y[:15], classes=[0, 1, 2])
    model.partial_fit(larger, y[15:])
    np.testing.assert_allclose(model.kernel_.theta, first, atol=1e-3)


def test_prior_units_map_theta_and_its_gradient():
    sl, centre, scale = slice(1, 3), np.array([0.5, -2.0]), 1e-3
    units = estimator_module._PriorUnits(sl, centre, scale)
    x = np.array([3.0, 0.6, -2.1, 7.0])
    z = units.to_units(x)
    np.testing.assert_allclose(z, [3.0, 100.0, -100.0, 7.0])
    np.testing.assert_allclose(units.from_units(z), x)
    bounds = np.array([[-np.inf, np.inf], [0.0, 1.0], [-3.0, np.inf], [0, 1]])
    np.testing.assert_allclose(
        units.bounds(bounds),
        [[-np.inf, np.inf], [-500.0, 500.0], [-1000.0, np.inf], [0, 1]],
    )

    def value_and_grad(x):  # a smooth function of every coordinate
        return float(np.sin(x) @ np.arange(1, 5)), np.cos(x) * np.arange(1, 5)

    wrapped = units.wrap(value_and_grad)
    rng = np.random.default_rng(0)
    direction = rng.normal(size=4)
    h = 1e-4
    finite = (wrapped(z + h * direction)[0] - wrapped(z - h * direction)[0]) / (2 * h)
    np.testing.assert_allclose(wrapped(z)[1] @ direction, finite, rtol=1e-6)
    assert wrapped(z)[0] == value_and_grad(x)[0]
    # No prior, or one of scale 1 or more: nothing to do.
    assert estimator_module._PriorUnits.of(
        type("Objective", (), {"hyperprior_scale": 3.0, "hyperprior_center": centre}),
        None,
    ) is None


def test_hyperprior_stays_at_the_initial_hyperparameters_on_a_warm_start(data):
    X, y, _, _ = data
    start = _initial_theta(X, y)
    model = GPStructClassifier(hyperprior_scale=None, **FAST).fit(X, y)
    learned = model.kernel_.theta
    assert np.max(np.abs(learned - start)) > 0.1
    # Continued from the learned values, the prior still pulls to the start.
    model.set_params(warm_start=True, hyperprior_scale=1e-4).fit(X, y)
    np.testing.assert_allclose(model.kernel_.theta, start, atol=1e-3)


# --------------------------------------------------------------------------- #
# labels and feature formats


def test_string_labels(data):
    X, y, X_test, y_test = data
    labels = [LETTERS[s] for s in y]
    model = GPStructClassifier(**FAST).fit(X, labels)
    np.testing.assert_array_equal(model.classes_, np.unique(np.concatenate(labels)))
    assert model.classes_.dtype.kind == "U"
    assert list(model.classes_) == sorted(model.classes_)
    predictions = model.predict(X_test)
    assert all(p.dtype.kind == "U" and set(p) <= set(LETTERS) for p in predictions)
    expected = [LETTERS[s] for s in y_test]
    assert_clearly_better_than_chance(expected, predictions)
    assert model.score(X_test, expected) == pytest.approx(
        flat_accuracy(expected, predictions)
    )


def test_integer_labels_with_gaps(data):
    X, y, X_test, y_test = data
    model = GPStructClassifier(**FAST).fit(X, [10 * s - 7 for s in y])
    np.testing.assert_array_equal(model.classes_, [-7, 3, 13])
    assert model.classes_.dtype.kind == "i"
    predictions = model.predict(X_test)
    assert all(p.dtype.kind == "i" and set(p) <= {-7, 3, 13} for p in predictions)
    assert_clearly_better_than_chance([10 * s - 7 for s in y_test], predictions)


@pytest.mark.parametrize(
    "empty", [lambda: np.zeros((0, N_FEATURES)), lambda: [],
              lambda: sp.csr_matrix((0, 0))],
    ids=["zeros(0,F)", "[]", "sparse (0, 0)"],
)
def test_zero_length_training_sequence_keeps_integer_labels(data, empty):
    # An empty sequence has no labels to add: classes_ must be the same, with
    # the same dtype, as without it (``[]`` must not turn labels into floats),
    # whatever width the empty sequence is given with.
    X, y, X_test, _ = data
    if sp.issparse(empty()):
        X, X_test = [sp.csr_matrix(x) for x in X], [sp.csr_matrix(x) for x in X_test]
    model = GPStructClassifier(**FAST).fit([empty()] + X + [empty()], [[]] + y + [[]])
    np.testing.assert_array_equal(model.classes_, np.arange(N_CLASSES))
    assert model.classes_.dtype.kind == "i", model.classes_
    assert all(p.dtype.kind == "i" for p in model.predict(X_test))


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
@pytest.mark.parametrize("kernel", ["linear", "rbf"])
def test_accuracy_on_easy_data(sparse, kernel):
    X, y, X_test, y_test = split(sparse=sparse)
    assert all(sp.isspmatrix_csr(x) for x in X) == sparse
    model = GPStructClassifier(kernel, **FAST).fit(X, y)
    predictions = model.predict(X_test)
    assert [len(p) for p in predictions] == [len(t) for t in y_test]
    assert_clearly_better_than_chance(y_test, predictions)


def test_sklearn_kernel_on_dense_and_refused_on_sparse(data):
    X, y, X_test, y_test = data
    model = GPStructClassifier(RBF() * ConstantKernel(), **FAST).fit(X, y)
    assert_clearly_better_than_chance(y_test, model.predict(X_test))
    X_sparse = [sp.csr_matrix(x) for x in X]
    with pytest.raises(ValueError, match=r"scikit-learn kernel.*X is sparse"):
        GPStructClassifier(RBF() * ConstantKernel(), **FAST).fit(X_sparse, y)


def test_score_gradient_fits_and_predicts(data):
    X, y, X_test, y_test = data
    with warnings.catch_warnings():
        # L-BFGS may stop on the noisy score-function gradient.
        warnings.simplefilter("ignore", ConvergenceWarning)
        # The score estimator needs more samples than the pathwise one.
        model = GPStructClassifier(gradient="score", n_samples=16, **FAST).fit(X, y)
    assert_clearly_better_than_chance(y_test, model.predict(X_test))


def test_likelihood_without_gradient_with_score_estimator(data):
    # The score estimator's L-BFGS rounds occasionally stall on this tiny
    # problem (1 random_state in 20 below 0.8 accuracy, 3 in 20 with the
    # previous optimiser): the typical fit, the median of three seeds, must be
    # clearly better than chance.
    X, y, X_test, y_test = data
    accuracies = []
    for random_state in range(3):
        with warnings.catch_warnings():
            # L-BFGS may stop on the noisy score-function gradient.
            warnings.simplefilter("ignore", ConvergenceWarning)
            model = GPStructClassifier(
                likelihood=UnaryOnlyLikelihood(), gradient="score", n_samples=16,
                **{**FAST, "random_state": random_state},
            ).fit(X, y)
        accuracies.append(
            np.mean(np.concatenate(model.predict(X_test)) == np.concatenate(y_test))
        )
    assert np.median(accuracies) > 0.8, accuracies


# --------------------------------------------------------------------------- #
# predict_marginals and zero-length sequences


@pytest.mark.parametrize("n_components", [1, 2])
def test_predict_marginals_are_distributions(data, fitted, n_components):
    X, y, X_test, y_test = data
    model = fitted if n_components == 1 else GPStructClassifier(
        n_components=n_components, **FAST
    ).fit(X, y)
    marginals = model.predict_marginals(X_test)
    assert isinstance(marginals, list) and len(marginals) == len(X_test)
    for m, x in zip(marginals, X_test, strict=True):
        assert m.shape == (x.shape[0], N_CLASSES)
        assert np.all(m >= 0)
        np.testing.assert_allclose(m.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    # The most probable label is right most of the time on easy data.
    argmax = [model.classes_[m.argmax(axis=1)] for m in marginals]
    assert_clearly_better_than_chance(y_test, argmax)
    # predict_proba is predict_marginals, columns in the order of classes_,
    # in a Pipeline too.
    for a, b in zip(model.predict_proba(X_test), marginals, strict=True):
        np.testing.assert_array_equal(a, b)
    pipeline = make_pipeline(FunctionTransformer(lambda X: X), model)
    for a, b in zip(pipeline.predict_proba(X_test), marginals, strict=True):
        np.testing.assert_array_equal(a, b)


def test_stacked_prediction_samples_agree_with_the_per_row_draws(
    data, fitted, monkeypatch
):
    # Inducing features with diagonal covariances sample predict_marginals
    # in the stacked form (a token's lone features in one draw); without a
    # stacked projection every inducing variable is drawn on its own. Same
    # distribution, different random numbers: with 4,000 samples the two
    # estimates of every marginal agree to Monte Carlo error (a marginal's
    # standard error is at most 0.5 / sqrt(4000) = 0.008 per estimate).
    _, _, X_test, _ = data
    model = copy.deepcopy(fitted).set_params(n_predict_samples=4000)
    X = X_test[:3]
    stacked = model.predict_marginals(X)
    called = []

    def no_stacked_form(state, layout):
        called.append(layout)
        return None

    monkeypatch.setattr(model.inducing_, "stacked_projection", no_stacked_form)
    per_row = model.predict_marginals(X)
    assert len(called) == 1
    difference = max(np.abs(a - b).max() for a, b in zip(stacked, per_row, strict=True))
    assert 0 < difference < 0.04


def test_predict_marginals_in_halves_under_a_noise_budget(data, fitted, monkeypatch):
    # A chunk whose stacked samples need more random numbers than
    # PREDICT_NOISE_BYTES is sampled in halves, down to one sequence: every
    # sequence's samples come from its own generator, so the marginals do
    # not change.
    _, _, X_test, _ = data
    X = list(X_test[:6])
    whole = fitted.predict_marginals(X)
    calls = []
    original = GPStructClassifier._unary_samples

    def counted(self, params, X_c, offsets, S, rngs, *args):
        calls.append(len(offsets) - 1)
        return original(self, params, X_c, offsets, S, rngs, *args)

    monkeypatch.setattr(GPStructClassifier, "_unary_samples", counted)
    monkeypatch.setattr(estimator_module, "PREDICT_NOISE_BYTES", 1)
    halves = fitted.predict_marginals(X)
    assert calls[0] == 6 and sorted(calls).count(1) == 6
    for a, b in zip(whole, halves, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-12)


def test_predict_marginals_sample_the_collapsed_posterior_that_was_fitted():
    # With the lone features collapsed, prediction read the per-feature
    # marginals as independent: at a training token with several lone
    # features its potentials' variance was sigma^2 (1 - (1 - s^2) sum a^4),
    # wider than the fitted sigma^2 s^2.
    from skgpstruct.kernels import LinearKernel

    rng = np.random.default_rng(0)
    n_seq, length, per_token = 6, 4, 3
    n_tokens = n_seq * length
    rows = np.repeat(np.arange(n_tokens), per_token)
    columns = np.arange(n_tokens * per_token)  # every feature at one token
    values = rng.uniform(0.5, 2.0, size=columns.size)
    X_all = sp.csr_matrix((values, (rows, columns)))
    X = [X_all[i * length : (i + 1) * length] for i in range(n_seq)]
    y = [rng.integers(2, size=length) for _ in range(n_seq)]
    model = GPStructClassifier(
        kernel=LinearKernel(), learn_hyperparameters=False, max_iter=30,
        random_state=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
    features, q_mu_c, q_sqrt_c = model._collapsed
    assert features.n_collapsed == n_tokens and features.kept.size == 0
    scales = model._inducing_state
    sigma = features._spread(scales[:-1])  # per training token, in order
    s2 = q_sqrt_c[0, :, :n_tokens].T ** 2  # (tokens, labels)
    bias_var = (scales[-1] * q_sqrt_c[0, :, -1]) ** 2
    exact = sigma[:, None] ** 2 * s2 + bias_var
    a = features._loadings(model.kernel_).reshape(n_tokens, per_token)
    marginal = sigma[:, None] ** 2 * (
        1 - (1 - s2) * np.sum(a**4, axis=1)[:, None]
    ) + bias_var
    apart = marginal > 1.15 * exact  # where the test can tell them apart
    assert apart.sum() >= 10
    X_c, offsets = stack_sequences(X)
    params, X_s, inducing, state, prior = model._sampling_design(
        model._sampling_posterior(model._params()), X_c
    )
    assert prior is None  # (the training tokens: no column without a variable)
    S = 20000
    rngs = [np.random.default_rng(i) for i in range(n_seq)]
    unary = model._unary_samples(params, X_s, offsets, S, rngs, inducing, state)
    variance = unary[0].var(axis=0)
    np.testing.assert_allclose(variance, exact, rtol=0.05)
    assert np.all(variance[apart] < 0.95 * marginal[apart])
    mean = sigma[:, None] * q_mu_c[0, :, :n_tokens].T + scales[-1] * q_mu_c[0, :, -1]
    np.testing.assert_allclose(
        unary[0].mean(axis=0), mean, atol=4 * np.sqrt(exact.max() / S)
    )


@pytest.mark.parametrize("n", [0, 1, 2, 7, 500])
def test_sorted_unique_is_numpy_s_unique(n):
    # Empty, one value, repeats, int32 and int64.
    rng = np.random.default_rng(n)
    for dtype in (np.int32, np.int64):
        values = rng.integers(-5, 40, n).astype(dtype)
        got = sorted_unique(values)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, np.unique(values))


def test_hstack_csr_is_scipy_s_hstack():
    # Side by side from their arrays (scipy's hstack goes through COO): the
    # same matrix, canonical, with empty rows, an empty block, zero-width
    # blocks, stored zeros kept, int32 and int64 indices.
    rng = np.random.default_rng(1)
    blocks = [sp.random(5, n, density=0.4, format="csr", random_state=rng)
              for n in (4, 0, 7, 3)]
    blocks[2] = sp.csr_matrix((5, 7))  # no entries
    blocks[3].indptr = blocks[3].indptr.astype(np.int64)
    blocks[3].indices = blocks[3].indices.astype(np.int64)
    blocks[0].data[0] = 0.0  # a stored zero
    out = hstack_csr(blocks)
    expected = sp.hstack(blocks, format="csr")
    assert out.shape == (5, 14) and out.has_canonical_format
    np.testing.assert_array_equal(out.toarray(), expected.toarray())
    np.testing.assert_array_equal(out.indptr, expected.indptr)
    np.testing.assert_array_equal(out.indices, expected.indices)
    np.testing.assert_array_equal(out.data, expected.data)
    for r in range(5):  # canonical: columns increasing within every row
        assert np.all(np.diff(out.indices[out.indptr[r] : out.indptr[r + 1]]) > 0)
    with pytest.raises(ValueError, match=r"the same number of rows, got \[5, 2\]"):
        hstack_csr([blocks[0], sp.csr_matrix((2, 3))])


def test_stacked_csr_sequences_are_scipy_s_vstack():
    # Stacked from their arrays (scipy's vstack costs tens of microseconds
    # a piece): the same matrix, canonical when the pieces are, with empty
    # pieces, int32 and int64 indices, and other sparse types falling back.
    rng = np.random.default_rng(0)
    pieces = [sp.random(n, 6, density=0.4, format="csr", random_state=rng)
              for n in (3, 0, 1, 4)]
    pieces[1] = sp.csr_matrix((0, 6))
    pieces[2].indptr = pieces[2].indptr.astype(np.int64)
    pieces[2].indices = pieces[2].indices.astype(np.int64)
    expected = sp.vstack(pieces, format="csr")
    for given in (pieces, [sp.csr_array(p) for p in pieces]):
        stacked, offsets = stack_sequences(given)
        assert sp.issparse(stacked) and stacked.format == "csr"
        assert stacked.dtype == np.float64 and stacked.shape == (8, 6)
        np.testing.assert_array_equal(stacked.toarray(), expected.toarray())
        np.testing.assert_array_equal(offsets, [0, 3, 3, 4, 8])
        assert stacked.has_canonical_format
    unsorted = sp.csr_matrix(
        ([1.0, 2.0], [3, 1], [0, 2]), shape=(1, 6)
    )  # columns out of order
    stacked, _ = stack_sequences([pieces[0], unsorted])
    np.testing.assert_array_equal(
        stacked.toarray(), sp.vstack([pieces[0], unsorted]).toarray()
    )
    assert not stacked.has_canonical_format  # not claimed for unsorted pieces


def test_sample_blocks_cover_every_sequence_once(monkeypatch):
    # Runs in order, every sequence in exactly one; a sequence whose samples
    # exceed the budget alone, in blocks sized by its length alone
    # (budget 4,800 bytes: 480 bytes per token with K=2, S=10, V=3), an
    # even number of samples per block and at least two (antithetic pairs
    # are drawn together), even above the budget.
    monkeypatch.setattr(estimator_module, "PREDICT_SAMPLE_BYTES", 8 * 2 * 3 * 100)
    lengths = [5, 0, 40, 7, 300, 2, 2000]
    runs = list(estimator_module._sample_blocks(lengths, 2, 10, 3))
    assert runs == [(0, 2, 10), (2, 3, 2), (3, 4, 10), (4, 5, 2), (5, 6, 10),
                    (6, 7, 2)]
    # 14 tokens: 7.1 samples fit the budget, a block takes 6
    assert list(estimator_module._sample_blocks([14], 2, 10, 3)) == [(0, 1, 6)]
    assert list(estimator_module._sample_blocks([40, 40], 2, 10, 3)) == [
        (0, 1, 2), (1, 2, 2)
    ]
    # Short sequences share a run while their samples fit the budget.
    assert list(estimator_module._sample_blocks([4, 4, 4, 6, 6], 2, 10, 3)) == [
        (0, 2, 10), (2, 4, 10), (4, 5, 10)
    ]
    assert list(estimator_module._sample_blocks([10, 0, 0], 2, 10, 3)) == [
        (0, 3, 10)
    ]
    assert list(estimator_module._sample_blocks([], 2, 10, 3)) == []


def test_predict_marginals_of_long_sequences_in_blocks_of_samples(
    data, fitted, monkeypatch
):
    # A sequence whose samples exceed PREDICT_SAMPLE_BYTES is sampled and
    # decoded a block of samples at a time. Its marginals average all the
    # blocks: with 2,000 samples in blocks of at most 7 they agree with
    # 4,000 samples drawn at once to Monte Carlo error (a marginal's
    # standard error is at most 0.5 * sqrt(1/2000 + 1/4000) = 0.014; 7
    # samples alone miss by 0.04 here).
    _, _, X_test, _ = data
    X = list(X_test[:3])
    reference = copy.deepcopy(fitted).set_params(n_predict_samples=4000)
    reference = reference.predict_marginals(X)
    model = copy.deepcopy(fitted).set_params(n_predict_samples=2000)
    V = len(model.classes_)
    budget = 8 * V * min(len(x) for x in X) * 7
    monkeypatch.setattr(estimator_module, "PREDICT_SAMPLE_BYTES", budget)
    blocks = []
    original = GPStructClassifier._unary_samples

    def counted(self, params, X_c, offsets, S, rngs, *args):
        blocks.append((len(offsets) - 1, S))
        return original(self, params, X_c, offsets, S, rngs, *args)

    monkeypatch.setattr(GPStructClassifier, "_unary_samples", counted)
    blocked = model.predict_marginals(X)
    assert {n for n, _ in blocks} == {1} and max(S for _, S in blocks) <= 7
    # (an even number per block: antithetic pairs are drawn together)
    assert all(S % 2 == 0 for _, S in blocks)
    assert sum(S for _, S in blocks) == 3 * 2000
    for b, r in zip(blocked, reference, strict=True):
        np.testing.assert_allclose(b.sum(axis=1), 1.0)
        assert np.abs(b - r).max() < 0.02
    # A long sequence's draws are its own: the same marginals amid short
    # and empty sequences, in threads.
    monkeypatch.setattr(GPStructClassifier, "_unary_samples", original)
    monkeypatch.setattr(
        estimator_module, "PREDICT_SAMPLE_BYTES", 8 * V * len(X[2]) * 2000 - 1
    )
    alone = model.predict_marginals([X[2]])[0]
    mixed = copy.deepcopy(model).set_params(n_jobs=2).predict_marginals(
        [X[0], X[2], X[1][:0], X[1]]
    )
    np.testing.assert_array_equal(mixed[1], alone)
    assert mixed[2].shape == (0, V)
    np.testing.assert_array_equal(mixed[0], model.predict_marginals([X[0]])[0])


def test_predict_marginals_memory_is_bounded_on_a_long_sequence(monkeypatch):
    # Drawn at once, 32 samples of a 20,000-token sequence's potentials over
    # 10 labels take 51 MB (K x S x T x V doubles), and forward-backward
    # holds more of that size. Under a 1 MiB budget for the samples the
    # whole call stays below half that one array (the rest is the
    # sequence's features and its projection, which do not grow with the
    # samples; blocks hold at least a pair of samples, 3.2 MB here).
    import tracemalloc

    X, y = make_sequences(
        n_sequences=30, n_classes=10, n_features=4, length_range=(5, 10),
        random_state=0,
    )
    model = GPStructClassifier(
        n_inducing=10, max_iter=5, n_predict_samples=32, random_state=0
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
    long_x = np.tile(np.concatenate(X), (100, 1))[:20000]
    samples_bytes = 8 * 32 * long_x.shape[0] * 10
    monkeypatch.setattr(estimator_module, "PREDICT_SAMPLE_BYTES", 2**20)
    tracemalloc.start()
    try:
        marginals = model.predict_marginals([long_x])[0]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert marginals.shape == (20000, 10)
    np.testing.assert_allclose(marginals.sum(axis=1), 1.0)
    assert peak < samples_bytes / 2, (peak, samples_bytes)


def test_predict_marginals_do_not_depend_on_n_jobs(data, fitted, monkeypatch):
    # With n_jobs, predict_marginals samples its chunks in threads; every
    # sequence's draws are its own, so the marginals are bit-identical.
    _, _, X_test, _ = data
    monkeypatch.setattr(estimator_module, "CHUNK_TOKENS", 10)
    X = list(X_test[:8])
    assert len(chunk_slices([len(x) for x in X], 10)) > 2
    one = fitted.predict_marginals(X)
    for n_jobs in (2, -1):
        model = copy.deepcopy(fitted).set_params(n_jobs=n_jobs)
        for a, b in zip(one, model.predict_marginals(X), strict=True):
            np.testing.assert_array_equal(b, a)


def test_stored_zeros_do_not_change_the_model():
    # The same values stored with explicit zeros (a BSR matrix's blocks, a
    # zero written into a CSR) are the same features: the same fit, the
    # same marginals, and the caller's matrices keep their zeros.
    X, y = make_sequences(
        n_sequences=12, length_range=(4, 8), sparse=True, random_state=0
    )
    X = [sp.csr_matrix(x) for x in X]
    with_zeros = []
    for x in X:
        z = x.copy()
        z.data[::3] = 0.0  # some entries become stored zeros ...
        with_zeros.append(z)
    X = [z.copy() for z in with_zeros]
    for x in X:
        x.eliminate_zeros()  # ... and the same values without them
    bsr = [sp.bsr_matrix(x.toarray(), blocksize=(1, 2)) for x in X]
    assert any(not b.data.all() for b in bsr)
    nnz = [z.nnz for z in with_zeros]
    params = {**FAST, "max_iter": 10}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        fits = [GPStructClassifier(**params).fit(Xs, y) for Xs in (X, with_zeros, bsr)]
    for other in fits[1:]:
        assert_same_fit(fits[0], other)
    reference = fits[0].predict_marginals(X)
    for Xs in (with_zeros, bsr):
        for a, b in zip(fits[0].predict_marginals(Xs), reference, strict=True):
            np.testing.assert_array_equal(a, b)
    assert [z.nnz for z in with_zeros] == nnz


def test_unsorted_sparse_input_is_left_as_given(data, fitted):
    # A CSR sequence whose column indices are not sorted: its predictions
    # are those of the sorted matrix (the same sequence), and neither
    # prediction nor fit changes the caller's matrix (predict_marginals may
    # read it from several threads).
    _, _, X_test, y_test = data
    x = sp.csr_matrix(X_test[0])
    reversed_rows = [
        (x.indices[a:b][::-1], x.data[a:b][::-1])
        for a, b in zip(x.indptr[:-1], x.indptr[1:], strict=True)
    ]
    unsorted = sp.csr_matrix(
        (np.concatenate([d for _, d in reversed_rows]),
         np.concatenate([i for i, _ in reversed_rows]), x.indptr.copy()),
        shape=x.shape,
    )
    assert not unsorted.has_sorted_indices
    indices = unsorted.indices.copy()
    expected = fitted.predict_marginals([x])[0]
    np.testing.assert_array_equal(fitted.predict_marginals([unsorted])[0], expected)
    np.testing.assert_array_equal(fitted.predict([unsorted])[0], fitted.predict([x])[0])
    np.testing.assert_array_equal(unsorted.indices, indices)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        GPStructClassifier(**{**FAST, "max_iter": 2}).fit(
            [unsorted, *map(sp.csr_matrix, X_test[1:4])], y_test[:4]
        )
    np.testing.assert_array_equal(unsorted.indices, indices)


def test_decode_marginal_is_argmax_of_predict_marginals(data, fitted):
    _, _, X_test, _ = data
    model = copy.deepcopy(fitted).set_params(decode="marginal")
    marginals = model.predict_marginals(X_test)
    for p, m in zip(model.predict(X_test), marginals, strict=True):
        np.testing.assert_array_equal(p, model.classes_[np.argmax(m, axis=1)])


def test_pairwise_uncertainty_in_predict_marginals(data, fitted):
    # With no spread in the unaries, the default marginals are those of the
    # chain at the posterior mean potentials (brute force over labellings);
    # with pairwise_uncertainty=True they average over transition draws.
    _, _, X_test, _ = data
    # Tokens at the training mean (zero once centred): the unaries are the
    # label offsets only, so the transitions (and their spread) decide the
    # marginals.
    x = [np.tile(fitted.feature_mean_, (4, 1))]
    model = copy.deepcopy(fitted)
    model.q_sqrt_ = np.zeros_like(fitted.q_sqrt_)
    assert np.all(model.pairwise_std_ > 0)
    unary = model._mean_potentials(stack_sequences(x)[0] - model.feature_mean_)
    expected = enumerate_one(unary, model.pairwise_mean_)[1]
    np.testing.assert_allclose(model.predict_marginals(x)[0], expected, atol=1e-4)
    model.set_params(pairwise_uncertainty=True)
    averaged = model.predict_marginals(x)[0]
    assert np.abs(averaged - expected).max() > 1e-3
    # Without a transition spread the two agree exactly.
    model.pairwise_std_ = np.zeros_like(model.pairwise_std_)
    np.testing.assert_array_equal(
        model.predict_marginals(x)[0],
        model.set_params(pairwise_uncertainty=False).predict_marginals(x)[0],
    )
    # A prediction-time parameter: Viterbi's labels do not depend on it.
    for a, b in zip(
        fitted.predict(X_test),
        copy.deepcopy(fitted).set_params(pairwise_uncertainty=True).predict(X_test),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="pairwise_uncertainty must be True or False"):
        copy.deepcopy(fitted).set_params(pairwise_uncertainty="yes").predict_marginals(x)


EMPTY_POSITIONS = {
    "first": [0],
    "middle": [2],
    "last": [5],
    "several": [0, 2, 4, 7],
}


@pytest.mark.parametrize("chunk_tokens", [2000, 3], ids=["one-chunk", "tiny-chunks"])
@pytest.mark.parametrize("positions", EMPTY_POSITIONS.values(),
                         ids=EMPTY_POSITIONS.keys())
@pytest.mark.parametrize("empty", [
    lambda: np.zeros((0, N_FEATURES)), lambda: [],
], ids=["zeros(0,F)", "[]"])
def test_zero_length_sequences_at_predict(
    data, fitted, monkeypatch, chunk_tokens, positions, empty
):
    _, _, X_test, _ = data
    monkeypatch.setattr(estimator_module, "CHUNK_TOKENS", chunk_tokens)
    X = list(X_test[:4])
    for position in positions:
        X.insert(position, empty())
    is_empty = [len(x) == 0 for x in X]
    predictions = fitted.predict(X)
    marginals = fitted.predict_marginals(X)
    assert len(predictions) == len(marginals) == len(X)
    for p, m, x, e in zip(predictions, marginals, X, is_empty, strict=True):
        if e:
            assert p.shape == (0,) and p.dtype == fitted.classes_.dtype
            assert m.shape == (0, N_CLASSES)
        else:
            assert p.shape == (x.shape[0],) and m.shape == (x.shape[0], N_CLASSES)
    # Viterbi on the mean potentials does not depend on the other sequences.
    expected = fitted.predict(X_test[:4])
    non_empty = [p for p, e in zip(predictions, is_empty, strict=True) if not e]
    for a, b in zip(non_empty, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    # Only zero-length sequences.
    assert [p.shape for p in fitted.predict([empty(), empty()])] == [(0,), (0,)]
    assert [m.shape for m in fitted.predict_marginals([empty()])] == [
        (0, N_CLASSES)
    ]
    assert fitted.predict([]).shape == (0,) and fitted.predict_marginals([]) == []


BATCHES = {
    "empty-inserted": lambda X: ([np.zeros((0, N_FEATURES))] + X, slice(1, None)),
    "reversed": lambda X: (X[::-1], slice(None, None, -1)),
    "other-sequences-added": lambda X: (X + X, slice(None, len(X))),
}


@pytest.mark.parametrize("batch", BATCHES.values(), ids=BATCHES.keys())
def test_predict_marginals_do_not_depend_on_the_rest_of_the_batch(
    data, fitted, batch
):
    # A sequence's marginals (like predict_proba of a sample, see sklearn's
    # check_methods_subset_invariance / check_methods_sample_order_invariance)
    # must not change with its position or with the other sequences passed.
    _, _, X_test, _ = data
    X = list(X_test[:5])
    reference = fitted.predict_marginals(X)
    X_batch, back = batch(X)
    in_batch = fitted.predict_marginals(X_batch)[back]
    for a, b in zip(reference, in_batch, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-12)


def test_chunk_digests_are_the_sequences_digests():
    # Taken from slices of the stacked chunk (no matrix per sequence: many
    # short sequences took seconds), the same digests as sequence by
    # sequence, and as blake2b of the canonical CSR arrays written out here.
    import hashlib

    from skgpstruct._estimator import _chunk_digests, _sequence_digest

    X, _ = make_sequences(n_sequences=6, length_range=(1, 4), random_state=0)
    X.insert(2, np.zeros((0, X[0].shape[1])))
    for pieces in (X, [sp.csr_matrix(x) for x in X]):
        X_c, offsets = stack_sequences(pieces)
        for size, key in ((8, b""), (32, b"12345678")):
            assert _chunk_digests(X_c, offsets, size, key) == [
                _sequence_digest(x, size, key) for x in pieces
            ]
    x = np.array([[0.0, 1.5], [2.0, 0.0]])
    digest = hashlib.blake2b(digest_size=32, key=b"k")
    for part in ([0, 1, 2], [1, 0]):
        digest.update(np.array(part, dtype=np.int64).tobytes())
    digest.update(np.array([1.5, 2.0]).tobytes())
    digest.update(b"(2, 2)")
    assert _sequence_digest(x, 32, b"k") == digest.digest()
    assert _sequence_digest(sp.coo_matrix(x), 32, b"k") == digest.digest()


def test_sequence_generators_are_pcg64_seeded_by_the_digest():
    # A generator per sequence from its keyed digest's words (PCG64's
    # state and increment): different seeds or features give other
    # streams; the same, the same stream.
    from skgpstruct._estimator import (
        _chunk_digests,
        _DigestSeed,
        _sequence_generators,
    )

    X = [np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]]), np.array([[1.0, 0.0]])]
    X_c, offsets = stack_sequences(X)
    draws = [g.standard_normal(4) for g in _sequence_generators(X_c, offsets, 7)]
    np.testing.assert_array_equal(draws[0], draws[2])
    assert not np.allclose(draws[0], draws[1])
    other = _sequence_generators(X_c, offsets, 8)[0].standard_normal(4)
    assert not np.allclose(other, draws[0])
    digest = _chunk_digests(X_c, offsets, 32, (7).to_bytes(8, "little"))[0]
    words = np.frombuffer(digest, dtype="<u8")
    # PCG's seeding from (initstate, initseq), written out: inc is
    # 2 initseq + 1, the state two steps of the LCG, initstate added between
    initstate = int(words[0]) << 64 | int(words[1])
    initseq = int(words[2]) << 64 | int(words[3])
    inc = (initseq << 1 | 1) % 2**128
    multiplier = 0x2360ED051FC65DA44385DF649FCCF645
    state = np.random.PCG64(_DigestSeed(digest)).state["state"]
    assert state["inc"] == inc
    assert state["state"] == ((inc + initstate) * multiplier + inc) % 2**128
    with pytest.raises(ValueError, match="holds 4 words"):
        _DigestSeed(digest).generate_state(5, np.uint64)
    np.testing.assert_array_equal(
        _DigestSeed(digest).generate_state(8), np.frombuffer(digest, dtype="<u4")
    )
    with pytest.raises(ValueError, match="only uint32 and uint64"):
        _DigestSeed(digest).generate_state(2, np.int64)


@pytest.mark.parametrize("train_sparse", [False, True], ids=["dense fit", "CSR fit"])
def test_predict_marginals_do_not_depend_on_the_storage_of_the_features(train_sparse):
    # The draws of a sequence are seeded by its values: a CSR-trained model
    # gave marginals 0.18 apart for the same values passed dense (the seed
    # hashed the dense bytes or the CSR arrays).
    # (make_sequences' sparse features have columns active at most tokens:
    # the CSR fit centres them, sparse input by chunk, dense input sequence by
    # sequence.)
    X, y, X_test, _ = split(sparse=train_sparse)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = GPStructClassifier(**{**FAST, "max_iter": 5}).fit(X, y)
    assert model.feature_mean_ is not None
    dense = [x.toarray() if sp.issparse(x) else np.asarray(x) for x in X_test[:4]]
    with_zero = sp.csr_matrix(dense[0])
    row, column = with_zero.nonzero()[0][0], with_zero.nonzero()[1][0]
    with_zero.data[0] = 0.0  # a stored zero; the same values dense:
    zeroed = dense[0].copy()
    zeroed[row, column] = 0.0
    storages = {
        "dense": dense,
        "lists": [x.tolist() for x in dense],
        "Fortran": [np.asfortranarray(x) for x in dense],
        "CSR": [sp.csr_matrix(x) for x in dense],
        "CSC": [sp.csc_matrix(x) for x in dense],
        "COO": [sp.coo_matrix(x) for x in dense],
    }
    reference = model.predict_marginals(dense)
    for name, X_stored in storages.items():
        for a, b in zip(model.predict_marginals(X_stored), reference, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=name)
    np.testing.assert_array_equal(
        model.predict_marginals([with_zero])[0], model.predict_marginals([zeroed])[0]
    )


# --------------------------------------------------------------------------- #
# bad input


def _bad_fit_inputs():
    X, y, _, _ = split()
    nan = [x.copy() for x in X]
    nan[3][1, 2] = np.nan
    inf = [x.copy() for x in X]
    inf[0][0, 0] = -np.inf
    short_labels = list(y)
    short_labels[1] = short_labels[1][:-1]
    # Labels NumPy would merge or keep as a class: NaN among objects or
    # strings, integers beside strings (turned into strings).
    nan_object = [s.astype(object) for s in y]
    nan_object[2][0] = np.nan
    nan_in_strings = [[str(v) for v in s] for s in y]
    nan_in_strings[0][0] = float("nan")
    int_beside_str = [np.array([str(v) for v in s]) for s in y]
    int_beside_str[4] = y[4]
    int_among_str = [[str(v) for v in s] for s in y]
    int_among_str[0][0] = int(int_among_str[0][0])
    return {
        "len(X) != len(y)": (X, y[:-1], r"different numbers of sequences: 30 and 29"),
        "no sequences": ([], [], r"X contains no sequences"),
        "label count": (X, short_labels, r"sequence 1 has \d+ tokens in X but \d+"),
        "NaN": (nan, y, r"X\[3\] contains NaN or infinite"),
        "inf": (inf, y, r"X\[0\] contains NaN or infinite"),
        "one 2-D array": (X[0], y[0], r"list of per-sequence feature matrices"),
        "only empty": ([np.zeros((0, N_FEATURES))], [[]], r"no tokens"),
        "mixed dense and sparse": (
            [sp.csr_matrix(X[0])] + X[1:], y, r"mixes dense and sparse"
        ),
        "labels a string": (X[:1], ["ab"], r"y\[0\] is a single string"),
        "NaN object label": (X, nan_object, r"y\[2\] contains NaN or infinite"),
        "NaN among strings": (
            X, nan_in_strings,
            r"y mixes label types \(number, string\), first in y\[0\]",
        ),
        "int array beside strings": (
            X, int_beside_str,
            r"y mixes label types \(number, string\), first in y\[4\]",
        ),
        "int among strings": (
            X, int_among_str, r"y mixes label types \(number, string\)"
        ),
        "complex features": (
            [x.astype(complex) for x in X], y, r"X\[0\] must hold real numbers"
        ),
        "string features": (
            [x.astype(str) for x in X], y, r"X\[0\] must hold real numbers"
        ),
        "sparse complex features": (
            [sp.csr_matrix(x.astype(complex)) for x in X], y,
            r"X\[0\] must hold real numbers",
        ),
        "no features": (
            [np.zeros((len(x), 0)) for x in X], y, r"X has 0 features per token"
        ),
        # beyond single precision, in which the fit samples: flushed to inf
        # or to zero there (1e-170: a fit that ignored the features)
        "huge values": (
            [1e300 * x for x in X], y,
            r"X's largest magnitude must lie within 1e-32 and 1e\+32, got ",
        ),
        "tiny values": (
            [1e-170 * x for x in X], y,
            r"X's largest magnitude must lie within 1e-32 and 1e\+32, got ",
        ),
    }


BAD_FIT_INPUTS = _bad_fit_inputs()


@pytest.mark.parametrize("case", BAD_FIT_INPUTS.values(), ids=BAD_FIT_INPUTS.keys())
def test_bad_fit_input(case):
    X, y, message = case
    with pytest.raises(ValueError, match=message):
        GPStructClassifier(**FAST).fit(X, y)


@pytest.mark.parametrize("method", ["predict", "predict_marginals", "score"])
@pytest.mark.parametrize(
    ("X", "message"),
    [
        ([np.zeros((3, N_FEATURES + 1))],
         rf"{N_FEATURES + 1} features per token.*fitted with {N_FEATURES}"),
        ([np.full((3, N_FEATURES), np.nan)], r"X\[0\] contains NaN or infinite"),
        ([np.full((3, N_FEATURES), np.inf)], r"X\[0\] contains NaN or infinite"),
        (np.zeros((3, N_FEATURES)), r"list of per-sequence feature matrices"),
    ],
    ids=["n_features", "NaN", "inf", "one 2-D array"],
)
def test_bad_predict_input(fitted, method, X, message):
    args = (X, [np.zeros(3, dtype=int)]) if method == "score" else (X,)
    with pytest.raises(ValueError, match=message):
        getattr(fitted, method)(*args)


def _one_entry(fmt):
    """A 1 x N_FEATURES sparse matrix of format ``fmt`` with one entry."""
    matrix = sp.coo_matrix(([1.0], ([0], [0])), shape=(1, N_FEATURES))
    return matrix.asformat(fmt)


def _malformed(kind):
    matrix = _one_entry(kind.split()[0])
    if kind == "csr column":
        matrix.indices[0] = 10**8  # scipy's products read far out of bounds
    elif kind == "csr negative column":
        matrix.indices[0] = -1
    elif kind == "csr column at the width":
        matrix.indices[0] = N_FEATURES  # one past the last column
    elif kind == "csr row pointers":
        matrix.indptr[:] = [1, 0]
    elif kind == "csr decreasing row pointers":
        matrix = sp.csr_matrix(np.ones((3, N_FEATURES)))
        matrix.indptr[:] = [0, 2 * N_FEATURES, N_FEATURES, 3 * N_FEATURES]
    elif kind == "csr short row pointers":
        matrix.indptr = np.array([0], dtype=matrix.indptr.dtype)
    elif kind == "csr pointers past the entries":
        matrix.indptr[-1] = 5  # one entry stored
    elif kind == "csc row":
        matrix.indices[0] = 5  # converting to CSR would write out of bounds
    elif kind == "coo column":
        matrix.col[0] = N_FEATURES
    return matrix


MALFORMED = ["csr column", "csr negative column", "csr column at the width",
             "csr row pointers",
             "csr decreasing row pointers", "csr short row pointers",
             "csr pointers past the entries", "csc row", "coo column"]


@pytest.mark.parametrize("kind", MALFORMED)
@pytest.mark.parametrize("method", ["fit", "predict", "predict_marginals"])
def test_malformed_sparse_input_is_refused(data, kind, method):
    # Refused with the sequence named, before any compiled code or scipy
    # product reads the indices (these crashed the interpreter).
    X, y, _, _ = data
    X = [sp.csr_matrix(x) for x in X]
    bad = _malformed(kind)
    before = bad.data.copy()
    model = GPStructClassifier(**{**FAST, "max_iter": 2})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        if method == "fit":
            args = (X[:3] + [bad], y[:3] + [np.zeros(bad.shape[0], dtype=int)])
        else:
            model.fit(X, y)
            args = (X[:3] + [bad],)
        with pytest.raises(ValueError, match=r"X\[3\] is not a valid sparse matrix"):
            getattr(model, method)(*args)
    np.testing.assert_array_equal(bad.data, before)  # the caller's matrix kept
    # The same entry well formed is accepted, in every format.
    good = _one_entry(kind.split()[0])
    if method != "fit":
        assert len(getattr(model, method)([good])[0]) == 1



@pytest.mark.parametrize("kind", MALFORMED)
@pytest.mark.parametrize(
    "n_sequences", [FEW_MATRICES, FEW_MATRICES + 1, 3 * FEW_MATRICES]
)
def test_malformed_sparse_sequence_is_named_among_many(kind, n_sequences):
    # Up to FEW_MATRICES sequences are checked one by one, more all at once:
    # either way the malformed one is refused and named, wherever it is.
    good = [
        sp.random(4, N_FEATURES, density=0.5, format="csr", random_state=i)
        for i in range(n_sequences - 1)
    ]
    for position in (0, n_sequences // 2, n_sequences - 1):
        X = good[:position] + [_malformed(kind)] + good[position:]
        with pytest.raises(
            ValueError, match=rf"X\[{position}\] is not a valid sparse matrix"
        ):
            check_sequence_features(X)
    checked, is_sparse = check_sequence_features(good)
    assert is_sparse and len(checked) == n_sequences - 1

BAD_PARAMS = [
    ({"covariance": "foo"}, r"covariance must be one of \['full', 'diag'\]"),
    ({"gradient": "foo"}, r"gradient must be one of \['pathwise', 'score'\]"),
    ({"decode": "foo"}, r"decode must be one of \['viterbi', 'marginal'\]"),
    ({"optimizer": "adam"}, r"optimizer must be one of \['lbfgs', 'stochastic'\]"),
    ({"inducing": "foo"}, r"inducing must be one of \[.*'kmeans\+\+'.*got 'foo'"),
    ({"inducing": "features", "kernel": "rbf"},
     r"inducing='features' needs a linear kernel"),
    ({"covariance": None}, r"covariance must be one of"),
    ({"kernel": "foo"}, r"unknown kernel 'foo'"),
    ({"likelihood": "foo"}, r"likelihood must be one of \['crf', 'pseudo'\]"),
    ({"n_inducing": 0}, r"n_inducing must be an integer >= 1, got 0"),
    ({"n_inducing": -3}, r"n_inducing must be an integer >= 1"),
    ({"n_inducing": 2.5}, r"n_inducing must be an integer >= 1"),
    ({"n_components": 0}, r"n_components must be an integer >= 1"),
    ({"n_samples": 0}, r"n_samples must be an integer >= 1"),
    # one sample: the score estimator's baseline cancels the data's gradient
    # (a fit learned nothing and "converged")
    ({"gradient": "score", "n_samples": 1},
     r"gradient='score' needs n_samples >= 2 \(16 or more recommended\)"),
    ({"max_iter": 0}, r"max_iter must be an integer >= 1"),
    ({"max_iter": True}, r"max_iter must be an integer >= 1"),
    ({"n_predict_samples": -1}, r"n_predict_samples must be an integer >= 1"),
    ({"tol": 0.0}, r"tol must be a positive finite number"),
    ({"tol": np.nan}, r"tol must be a positive finite number"),
    *(
        ({name: value}, rf"{name} must be a positive finite number")
        for name in ("tol", "pairwise_prior_variance", "learning_rate")
        for value in (np.inf, True)
    ),
    ({"pairwise_prior_variance": -1.0}, r"pairwise_prior_variance must be a posit"),
    *(
        ({"random_state": value}, r"random_state must be None, a non-negative int")
        for value in ("seed", -1, True)
    ),
    # Were refused by joblib, after the data were checked and chunked.
    *(
        ({"n_jobs": value},
         r"n_jobs must be None or a non-zero integer \(-1 for all cores\)")
        for value in (0, "two", 1.5, True)
    ),
    ({"verbose": 1.5}, r"verbose must be an integer >= 0, got 1.5"),
    ({"verbose": -1}, r"verbose must be an integer >= 0"),
    (
        {"likelihood": UnaryOnlyLikelihood(), "gradient": "pathwise"},
        r"gradient='pathwise' needs a likelihood with a gradient.*"
        r"use gradient='score'",
    ),
    ({"learn_hyperparameters": "no"}, r"learn_hyperparameters"),
    ({"warm_start": "no"}, r"warm_start"),
    ({"pairwise_uncertainty": 1}, r"pairwise_uncertainty must be True or False"),
    (
        {"collapse_lone_features": "yes"},
        r"collapse_lone_features must be True or False",
    ),
    *(
        ({"hyperprior_scale": value}, r"hyperprior_scale must be None or a posi")
        # 1e-320: 1 / scale**2 overflowed (a RuntimeWarning, then a fit)
        for value in (0.0, -1.0, np.inf, np.nan, True, "3", 1e-320)
    ),
]


def test_random_state_generator_is_drawn_from_at_every_fit(data):
    # A Generator, as a RandomState: the same seed gives the same fit, and
    # a refit with the same object draws on.
    X, y, _, _ = data
    first = GPStructClassifier(**{**FAST, "random_state": np.random.default_rng(5)})
    second = GPStructClassifier(**{**FAST, "random_state": np.random.default_rng(5)})
    a, b = (_fit_without_user_warnings(m, X, y).q_mu_ for m in (first, second))
    np.testing.assert_array_equal(a, b)
    again = _fit_without_user_warnings(first, X, y).q_mu_
    assert not np.array_equal(a, again)


@pytest.mark.parametrize(
    ("params", "message"), BAD_PARAMS,
    ids=[re.sub(r"\W+", "-", repr(p)).strip("-") for p, _ in BAD_PARAMS],
)
def test_bad_parameters_refused_at_fit(data, params, message):
    X, y, _, _ = data
    with pytest.raises(ValueError, match=message):
        GPStructClassifier(**{**FAST, **params}).fit(X, y)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"n_predict_samples": 0}, r"n_predict_samples must be an integer >= 1"),
        ({"n_predict_samples": 1.5}, r"n_predict_samples must be an integer >= 1"),
        ({"n_predict_samples": True}, r"n_predict_samples must be an integer >= 1"),
        ({"decode": "foo"}, r"decode must be one of \['viterbi', 'marginal'\]"),
        ({"pairwise_uncertainty": "yes"}, r"pairwise_uncertainty must be True or"),
    ],
    ids=["n_predict_samples=0", "n_predict_samples=1.5", "n_predict_samples=True",
         "decode", "pairwise_uncertainty"],
)
@pytest.mark.parametrize("method", ["predict", "predict_marginals", "predict_proba"])
def test_prediction_parameters_set_after_fit_are_checked(
    data, fitted, params, message, method
):
    # Prediction reads these after fit: set then, they are checked then (a
    # zero n_predict_samples gave NaN marginals, an unknown decode Viterbi).
    _, _, X_test, _ = data
    model = copy.deepcopy(fitted).set_params(**params)
    with pytest.raises(ValueError, match=message):
        getattr(model, method)(X_test[:2])


def test_later_partial_fit_pieces_may_lack_labels(data):
    X, y, X_test, y_test = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = GPStructClassifier(**FAST).partial_fit(X, y, classes=np.arange(3))
        # No label 2 in this piece: classes_ is kept, the piece is learnt.
        piece = [np.where(labels == 2, 0, labels) for labels in y]
        model.partial_fit(X, piece)
        np.testing.assert_array_equal(model.classes_, np.arange(3))
        assert model.predict_marginals(X_test[:1])[0].shape[1] == 3
        with pytest.raises(ValueError, match=r"y has labels not in classes: \[5\]"):
            model.partial_fit(X[:2], [np.full(len(x), 5) for x in X[:2]])


@pytest.mark.parametrize("classes", [[], [[0, 1], [2, 3]]], ids=["empty", "2-D"])
def test_partial_fit_refuses_malformed_classes(data, classes):
    X, y, _, _ = data
    with pytest.raises(ValueError, match="classes must be a non-empty 1-D array"):
        GPStructClassifier(**FAST).partial_fit(X, y, classes=classes)


@pytest.mark.parametrize("optimizer", ["lbfgs", "stochastic"])
def test_partial_fit_refuses_the_score_estimator_whatever_the_optimizer(
    data, optimizer
):
    # It advised optimizer='lbfgs', which partial_fit never runs.
    X, y, _, _ = data
    model = GPStructClassifier(gradient="score", optimizer=optimizer, **FAST)
    with pytest.raises(ValueError, match=r"partial_fit runs SAGA .* available "
                       r"with fit and optimizer='lbfgs' only"):
        model.partial_fit(X, y, classes=[0, 1, 2])


@pytest.mark.parametrize(
    ("classes", "kinds"),
    [([0, 1, "2"], "number, string labels in classes"),
     (["0", "1", "2"], "string labels in classes and number labels in y")],
    ids=["mixed", "strings for numbers"],
)
def test_partial_fit_refuses_classes_of_other_label_types(data, classes, kinds):
    # NumPy would turn [0, 1, "2"] into strings; "0" never equals 0.
    X, y, _, _ = data
    with pytest.raises(ValueError, match=f"classes and y must hold labels of one "
                                         f"type; got {kinds}"):
        GPStructClassifier(**FAST).partial_fit(X, y, classes=classes)


def test_score_refuses_sample_weight_and_label_mismatch(data, fitted):
    _, _, X_test, y_test = data
    with pytest.raises(ValueError, match="sample_weight is not supported"):
        fitted.score(X_test, y_test, sample_weight=np.ones(len(X_test)))
    with pytest.raises(ValueError, match="different numbers of sequences"):
        fitted.score(X_test, y_test[:-1])
    # The right labels as strings (the model has integer classes): the
    # score was 0, silently, in a model selection's default scoring.
    as_text = [np.asarray(seq).astype(str) for seq in y_test]
    with pytest.raises(ValueError, match="mix label types"):
        fitted.score(X_test, as_text)


def test_cross_val_predict_gives_one_label_array_per_sequence(data, fitted):
    # predict returned a list of ragged arrays, which cross_val_predict
    # could not join (and equal-length sequences made a 2-D array).
    from sklearn.model_selection import cross_val_predict

    X, y, X_test, _ = data
    model = GPStructClassifier(**{**FAST, "max_iter": 5})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        predicted = cross_val_predict(model, X[:12], y[:12], cv=3)
    assert predicted.shape == (12,) and predicted.dtype == object
    assert [len(p) for p in predicted] == [len(t) for t in y[:12]]
    same_length = [x[:2] for x in X_test]
    out = fitted.predict(same_length)
    assert out.shape == (len(X_test),) and all(p.shape == (2,) for p in out)


def test_crfsuite_inputs_name_the_transformer_they_need():
    # Token dicts or text rows given to the estimator itself.
    y = [["B-NP", "O"]]
    with pytest.raises(ValueError, match=r"X\[0\] holds token feature dicts; .*"
                       r"make_pipeline\(SequenceDictVectorizer\(\), "):
        GPStructClassifier().fit([[{"w": "the"}, {"w": "cat"}]], y)
    with pytest.raises(ValueError, match="put a CRFppTemplateVectorizer before"):
        GPStructClassifier().fit([[["the", "DT"], ["cat", "NN"]]], y)
    # Ragged rows: NumPy's error came unwrapped, naming no argument.
    with pytest.raises(ValueError, match=r"X\[0\] could not be converted .*lists "
                       "of feature names put a SequenceDictVectorizer"):
        GPStructClassifier().fit([[["w=the", "pos=DT"], ["w=cat"]]], y)
    with pytest.raises(ValueError, match=r"X\[0\] could not be converted to a "
                       r"float array: [^;]*$"):
        GPStructClassifier().fit([[[1.0, 2.0], [3.0]]], y)


# --------------------------------------------------------------------------- #
# determinism and parallelism


@pytest.mark.parametrize("inducing", ["auto", "kmeans++"])
def test_same_random_state_gives_identical_models(data, inducing):
    X, y, X_test, _ = data
    a = GPStructClassifier(inducing=inducing, **FAST).fit(X, y)
    b = GPStructClassifier(inducing=inducing, **FAST).fit(X, y)
    assert_same_fit(a, b)
    for p, q in zip(a.predict(X_test), b.predict(X_test), strict=True):
        np.testing.assert_array_equal(p, q)
    for p, q in zip(a.predict_marginals(X_test), b.predict_marginals(X_test),
                    strict=True):
        np.testing.assert_array_equal(p, q)
    # Refitting the same object gives the same model again (fit is idempotent).
    history = list(a.elbo_history_)
    a.fit(X, y)
    assert a.elbo_history_ == history
    np.testing.assert_array_equal(a.q_mu_, b.q_mu_)
    # The seed is used: another one gives another model.
    c = GPStructClassifier(inducing=inducing, **{**FAST, "random_state": 1})
    c.fit(X, y)
    assert not np.array_equal(a.elbo_history_[:3], c.elbo_history_[:3])


@pytest.mark.parametrize("inducing", ["auto", "kmeans++"])
def test_n_jobs_and_backend_do_not_change_the_fit(data, monkeypatch, inducing):
    X, y, _, _ = data
    # Small chunks so that the workers really share the sequences.
    monkeypatch.setattr(estimator_module, "CHUNK_TOKENS", 25)
    assert len(chunk_slices([len(x) for x in X], 25)) >= 4
    serial = GPStructClassifier(n_jobs=1, inducing=inducing, **FAST).fit(X, y)
    loky = GPStructClassifier(n_jobs=2, inducing=inducing, **FAST).fit(X, y)
    assert_same_fit(serial, loky)
    with joblib.parallel_config(backend="threading", n_jobs=2):
        threads = GPStructClassifier(inducing=inducing, **FAST).fit(X, y)
    assert_same_fit(serial, threads)


# --------------------------------------------------------------------------- #
# warm start, verbosity, convergence


@pytest.mark.parametrize("inducing", ["auto", "kmeans++"])
def test_warm_start_continues_from_the_previous_solution(data, inducing):
    X, y, _, _ = data
    model = GPStructClassifier(
        inducing=inducing, warm_start=True, **{**FAST, "max_iter": 5}
    )
    with pytest.warns(ConvergenceWarning):
        model.fit(X, y)
    first, inducing_ = list(model.elbo_history_), model.inducing_
    Z = None if model.inducing_points_ is None else model.inducing_points_.copy()
    assert len(first) == 5
    model.set_params(max_iter=100)
    model.fit(X, y)
    assert model.elbo_history_[: len(first)] == first
    second = model.elbo_history_[len(first):]
    assert len(second) == model.n_iter_ >= 1
    # A cold start is far below; a warm one starts near the last ELBO (the
    # Monte Carlo draws differ between fits, hence the small slack).
    assert second[0] >= first[-1] - 0.02 * abs(first[-1])
    assert second[0] > first[0]
    assert model.inducing_ is inducing_  # kept, not drawn again
    if Z is not None:
        np.testing.assert_array_equal(model.inducing_points_, Z)


@pytest.mark.parametrize(
    "change",
    [
        lambda X, y: (X, [np.where(s == 2, 3, s) for s in y], {}),
        lambda X, y: ([x[:, :-1] for x in X], y, {}),
        lambda X, y: (X, y, {"covariance": "full"}),
        lambda X, y: (X, y, {"n_components": 2}),
    ],
    ids=["classes", "number of features", "covariance", "n_components"],
)
def test_warm_start_refuses_a_different_problem(data, change, request):
    X, y, _, _ = data
    model = GPStructClassifier(warm_start=True, **FAST).fit(X, y)
    X2, y2, params = change(X, y)
    model.set_params(**params)
    # The message names what changed.
    what = request.node.callspec.id
    with pytest.raises(
        ValueError, match=f"warm_start=True needs the same classes.*got {what} "
    ):
        model.fit(X2, y2)


def test_partial_fit_refuses_other_features(data):
    X, y, _, _ = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = GPStructClassifier(**FAST).partial_fit(X, y, classes=np.arange(3))
    with pytest.raises(
        ValueError, match=r"partial_fit needs .* got number of features 7 \(was 8\)"
    ):
        model.partial_fit([x[:, :-1] for x in X], y)


def test_a_silent_fit_gives_its_optimiser_no_callback(data, monkeypatch):
    # L-BFGS mapped every iterate into the box for a callback that ignored it.
    import skgpstruct._estimator as estimator_module

    seen = []
    original = estimator_module.minimize_lbfgs

    def recording(*args, callback=None, **kwargs):
        seen.append(callback)
        return original(*args, callback=callback, **kwargs)

    monkeypatch.setattr(estimator_module, "minimize_lbfgs", recording)
    X, y, _, _ = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        GPStructClassifier(**{**FAST, "max_iter": 3}).fit(X, y)
        GPStructClassifier(verbose=1, **{**FAST, "max_iter": 3}).fit(X, y)
    assert seen[0] is None and callable(seen[1])


@pytest.mark.parametrize(
    "mode",
    [{}, {"gradient": "score", "n_samples": 16}, {"optimizer": "stochastic"}],
    ids=["lbfgs", "score rounds", "stochastic"],
)
def test_verbose_prints_iteration_elbo_and_seconds(data, capsys, mode):
    X, y, _, _ = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = GPStructClassifier(verbose=1, **{**FAST, **mode}).fit(X, y)
    lines = capsys.readouterr().out.strip().splitlines()
    pattern = re.compile(
        r"iteration\s+(\d+)\s+ELBO\s+(-?\d+\.\d+)\s+(\d+\.\d+) s$"
    )
    matches = [pattern.search(line) for line in lines]
    assert all(matches), lines
    assert [int(m.group(1)) for m in matches] == list(range(1, model.n_iter_ + 1))
    np.testing.assert_allclose(
        [float(m.group(2)) for m in matches], model.elbo_history_, atol=1e-4
    )
    seconds = [float(m.group(3)) for m in matches]
    assert seconds == sorted(seconds) and seconds[0] >= 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        GPStructClassifier(verbose=0, **{**FAST, **mode}).fit(X, y)
    assert capsys.readouterr().out == ""


def test_verbose_true_and_false_as_scikit_learn_users_write_them(data, capsys):
    # verbose=True prints what verbose=1 prints; False what 0 prints.
    X, y, _, _ = data
    outputs = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for verbose in (1, True, 0, False):
            GPStructClassifier(verbose=verbose, **{**FAST, "max_iter": 3}).fit(X, y)
            outputs[verbose] = capsys.readouterr().out
    strip = re.compile(r"\d+\.\d+ s$", re.M)  # the seconds differ between fits
    assert outputs[1].count("iteration") == 3
    assert strip.sub("", outputs[True]) == strip.sub("", outputs[1])
    assert outputs[False] == outputs[0] == ""
    with pytest.raises(ValueError, match="verbose must be an integer >= 0"):
        GPStructClassifier(verbose=-1).fit(X, y)


@pytest.mark.parametrize("labels", [[0], ["O"]], ids=["int", "str"])
def test_a_single_label_is_refused(data, labels):
    # A tagger fitted to one label would give it probability 1 everywhere:
    # most likely the labels were read from the wrong column.
    X, y, _, _ = data
    single = [np.full(len(t), labels[0]) for t in y]
    with pytest.raises(ValueError, match=r"y holds a single label \((0|'O')\)"):
        GPStructClassifier(**FAST).fit(X, single)
    with pytest.raises(ValueError, match="y and classes hold a single label"):
        GPStructClassifier(**FAST).partial_fit(X, single, classes=labels)
    # A piece that shows one label of several is a normal piece.
    classes = [0, 1, 2] if labels == [0] else ["B", "I", "O"]
    model = GPStructClassifier(**FAST).partial_fit(X, single, classes=classes)
    assert model.classes_.tolist() == classes


def test_score_fit_with_an_empty_sequence_is_silent_and_unchanged(data):
    # A zero-length training sequence took the mean of an empty diagonal in
    # the score estimator's per-sequence Gaussian: NumPy's RuntimeWarnings
    # at every evaluation, though the fit was the one without it.
    X, y, _, _ = data
    X_empty = [*X[:10], np.zeros((0, X[0].shape[1]))]
    y_empty = [*y[:10], np.zeros(0, dtype=y[0].dtype)]
    params = {**FAST, "gradient": "score", "n_samples": 4, "max_iter": 3}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("error", RuntimeWarning)
        with_empty = GPStructClassifier(**params).fit(X_empty, y_empty)
        without = GPStructClassifier(**params).fit(X[:10], y[:10])
    assert with_empty.elbo_history_ == without.elbo_history_


@pytest.mark.parametrize("fitted_with, set_to", [("crf", "pseudo"), ("pseudo", "crf")])
def test_prediction_uses_the_fitted_likelihood(data, fitted_with, set_to):
    # The likelihood decides the transitions the chain decodes with; it was
    # read from the parameter at prediction time, so set_params without a
    # refit changed a fitted model's predictions (a probing session: 111 of
    # 283 tokens).
    X, y, X_test, _ = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = GPStructClassifier(likelihood=fitted_with, **FAST).fit(X, y)
    before = model.predict(X_test), model.predict_marginals(X_test)
    model.set_params(likelihood=set_to)
    after = model.predict(X_test), model.predict_marginals(X_test)
    for old, new in zip(before, after, strict=True):
        for a, b in zip(old, new, strict=True):
            np.testing.assert_array_equal(a, b)
    # ... and a refit takes the new one: the model of a fresh fit with it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
        fresh = GPStructClassifier(likelihood=set_to, **FAST).fit(X, y)
    assert type(model._fitted_likelihood).__name__ == (
        "ChainCRF" if set_to == "crf" else "PiecewisePseudoLikelihood"
    )
    for a, b in zip(model.predict_marginals(X_test), fresh.predict_marginals(X_test),
                    strict=True):
        np.testing.assert_array_equal(a, b)


def test_convergence_warning_when_max_iter_is_tiny(data):
    X, y, _, _ = data
    with pytest.warns(ConvergenceWarning, match="did not converge in 1 iter"):
        model = GPStructClassifier(**{**FAST, "max_iter": 1}).fit(X, y)
    assert model.n_iter_ == 1 and len(model.elbo_history_) == 1


# --------------------------------------------------------------------------- #
# lone features collapsed


def with_lone_features(X_train, X_test):
    """Sparse sequences with extra columns active at one token each: every
    training token gets one of its own (value 1), every other one a second
    (value 0.5); the test tokens get columns no training token has."""
    n_train = sum(x.shape[0] for x in X_train)
    n_test = sum(x.shape[0] for x in X_test)
    n_extra = 2 * n_train + n_test

    def extend(X, first_column, second):
        out, t = [], 0
        for x in X:
            own = sp.lil_matrix((x.shape[0], n_extra))
            for i in range(x.shape[0]):
                own[i, first_column + t] = 1.0
                if second and t % 2 == 0:
                    own[i, n_train + t] = 0.5
                t += 1
            out.append(sp.hstack([sp.csr_matrix(x), own.tocsr()], format="csr"))
        return out

    return extend(X_train, 0, True), extend(X_test, 2 * n_train, False)


@pytest.fixture(scope="module")
def lone_data():
    X, y, X_test, y_test = split(sparse=True)
    X, X_test = with_lone_features(X, X_test)
    return X, y, X_test, y_test


def count_expansions(monkeypatch):
    """Count the calls of CollapsedFeatures.expand (one per collapsed fit)."""
    calls = []
    original = estimator_module.CollapsedFeatures.expand

    def expand(self, *args):
        calls.append(self.n_inducing)
        return original(self, *args)

    monkeypatch.setattr(estimator_module.CollapsedFeatures, "expand", expand)
    return calls


def test_collapsed_fit_gives_every_feature_a_posterior(lone_data, monkeypatch):
    X, y, X_test, y_test = lone_data
    calls = count_expansions(monkeypatch)
    n_features = X[0].shape[1]
    n_train = sum(x.shape[0] for x in X)
    n_shared = n_features - 2 * n_train - sum(x.shape[0] for x in X_test)
    collapsed = GPStructClassifier(**FAST).fit(X, y)
    # The shared columns, one variable per training token and the bias,
    # instead of one per column.
    assert calls == [n_shared + n_train + 1]
    per_feature = GPStructClassifier(collapse_lone_features=False, **FAST).fit(X, y)
    assert len(calls) == 1
    # Columns active at no training token (the test tokens' own, half of the
    # second ones) have no variable: their weights keep the prior.
    seen = np.flatnonzero(sp.vstack(X).getnnz(axis=0))
    assert seen.size < n_shared + 2 * n_train
    for model in (collapsed, per_feature):
        shape = (1, N_CLASSES, seen.size + 1)
        assert model.q_mu_.shape == model.q_sqrt_.shape == shape
        np.testing.assert_array_equal(model.inducing_.columns, seen)
        assert_clearly_better_than_chance(y_test, model.predict(X_test))
    # The training tokens' own columns have left the prior mean.
    assert np.any(collapsed.q_mu_[..., n_shared : n_shared + n_train] != 0.0)


def spread_columns(X, n_design, seed=0):
    """``X`` (CSR sequences) in a design of ``n_design`` columns, its own
    columns in their order at random places (the same for the same seed),
    the others active nowhere; returns (sequences, places)."""
    n = X[0].shape[1]
    place = np.sort(np.random.default_rng(seed).choice(n_design, n, replace=False))
    out = []
    for x in X:
        x = sp.csr_matrix(x)
        out.append(sp.csr_matrix(
            (x.data, place[x.indices], x.indptr), shape=(x.shape[0], n_design)
        ))
    return out, place


def test_columns_no_training_token_has_cost_nothing():
    # Hashed features (FeatureHasher's 2**20 columns) leave most columns
    # empty: the model has variables for the active ones only, and fits and
    # predicts as on the design without the empty columns.
    X, y, X_test, _ = split(sparse=True)
    X_wide, place = spread_columns(X, 5000)
    X_test_wide, test_place = spread_columns(X_test, 5000)
    np.testing.assert_array_equal(test_place, place)
    narrow = GPStructClassifier(**FAST).fit(X, y)
    wide = GPStructClassifier(**FAST).fit(X_wide, y)
    assert narrow.inducing_.columns is None
    np.testing.assert_array_equal(wide.inducing_.columns, place)
    assert wide.n_features_in_ == 5000
    assert wide.q_mu_.shape == narrow.q_mu_.shape == (1, N_CLASSES, place.size + 1)
    np.testing.assert_allclose(wide.elbo_history_, narrow.elbo_history_, rtol=1e-9)
    np.testing.assert_allclose(wide.q_mu_, narrow.q_mu_, rtol=1e-6, atol=1e-9)
    for a, b in zip(wide.predict(X_test_wide), narrow.predict(X_test), strict=True):
        np.testing.assert_array_equal(a, b)


def side_by_side(X):
    """``(first, second)``: the sequences ``X`` with twice their columns,
    their features in the first half, or in the second half."""
    X = [sp.csr_matrix(x) for x in X]
    return (
        [sp.hstack([x, sp.csr_matrix(x.shape)], format="csr") for x in X],
        [sp.hstack([sp.csr_matrix(x.shape), x], format="csr") for x in X],
    )


def _full_width_reference(model):
    """``model`` with a variable for every column, those it had none for at
    the prior: the model as it was before variables were restricted to the
    active columns (no collapsed posterior: the tokens it is used on have no
    lone training feature, so their samples do not need it)."""
    reference = copy.deepcopy(model)
    columns = np.append(model.inducing_.columns, model.n_features_in_)
    K, V, _ = model.q_mu_.shape
    M = model.n_features_in_ + 1
    reference.q_mu_ = np.zeros((K, V, M))
    reference.q_mu_[..., columns] = model.q_mu_
    if model.q_sqrt_.ndim == 3:
        reference.q_sqrt_ = np.ones((K, V, M))
        reference.q_sqrt_[..., columns] = model.q_sqrt_
    else:
        covariance = model.q_sqrt_ @ np.swapaxes(model.q_sqrt_, -1, -2)
        full = np.broadcast_to(np.eye(M), (K, V, M, M)).copy()
        full[..., columns[:, None], columns[None, :]] = covariance
        reference.q_sqrt_ = np.linalg.cholesky(full)
    reference.inducing_ = InducingFeatures(model.n_features_in_)
    reference._inducing_state = reference.inducing_.prepare(model.kernel_)
    reference.__dict__.pop("_collapsed", None)
    return reference


@pytest.mark.parametrize("covariance", ["diag", "full"])
def test_columns_without_a_variable_are_sampled_at_their_prior(covariance, lone_data):
    # A test token's columns that no training token had keep their prior
    # weights: predict_marginals samples them, as the model with a variable
    # for every column (at its prior) does, and does not ignore them.
    X, y, X_test, _ = lone_data
    options = dict(FAST, n_predict_samples=4000)
    if covariance == "full":
        # (fewer columns: the test tokens' own, not the training ones')
        X = [x[:, : N_FEATURES] for x in X]
        X_test = [x[:, : N_FEATURES] for x in X_test]
        X, _ = spread_columns(X, 40)
        X_test, _ = spread_columns(X_test, 40)  # (the same places)
        options.update(covariance="full", inducing="features")
    model = GPStructClassifier(**options).fit(X, y)
    assert model.inducing_.columns is not None
    if covariance == "diag":
        assert hasattr(model, "_collapsed")
    unseen = np.setdiff1d(np.arange(model.n_features_in_), model.inducing_.columns)
    # One unseen column at every test token, whose prior sd of the potentials
    # is 5 (the scale of its weight times its value).
    column = unseen[0]
    value = 5.0 / model.inducing_.design_scales(model.kernel_)[column]
    X_new = []
    for x in X_test:
        x = sp.lil_matrix(x)
        x[:, column] = value
        X_new.append(x.tocsr())
    marginals = np.concatenate(model.predict_marginals(X_new))
    expected = np.concatenate(_full_width_reference(model).predict_marginals(X_new))
    without = np.concatenate(model.predict_marginals(X_test))  # the column unset
    assert np.abs(marginals - expected).mean() < 0.01
    assert np.abs(without - expected).mean() > 0.03


def centred_as_fitted(model, sequences):
    """The sequences stacked and centred by the model's training mean, as its
    fits see them."""
    return estimator_module._centred(sp.vstack(sequences), model.feature_mean_)


def active_once_centred(model, sequences):
    """The columns some token of ``sequences`` has once centred (a column of
    the same value at every training token is its mean: centred, none)."""
    return np.flatnonzero(centred_as_fitted(model, sequences).getnnz(axis=0))


@pytest.mark.parametrize("covariance", ["diag", "full"])
def test_continued_fits_add_the_columns_new_data_activates(covariance):
    # A warm start on data with columns the first fit never saw gives them
    # variables at their prior (the posterior the model implied), keeps the
    # others', and learns them.
    X, y, X_test, y_test = split(sparse=True, noise=0.2)
    # Second data: the same tokens with their features in the new columns.
    wide, moved = side_by_side(X)
    options = dict(FAST, covariance=covariance, inducing="features")
    model = GPStructClassifier(**options).fit(wide, y)

    assert active_once_centred(model, wide).size < np.count_nonzero(
        sp.vstack(wide).getnnz(axis=0)
    )
    np.testing.assert_array_equal(
        model.inducing_.columns, active_once_centred(model, wide)
    )
    inducing, q_mu, q_sqrt = estimator_module._with_new_columns(
        model.inducing_, centred_as_fitted(model, moved), model.q_mu_, model.q_sqrt_
    )
    both = np.union1d(
        active_once_centred(model, wide), active_once_centred(model, moved)
    )
    np.testing.assert_array_equal(inducing.columns, both)
    # The implied posterior of every variable, old and new, is unchanged:
    # compared as covariances in the full-width coordinates.
    reference = _full_width_reference(model)
    grown = copy.deepcopy(model)
    grown.inducing_, grown.q_mu_, grown.q_sqrt_ = inducing, q_mu, q_sqrt
    grown = _full_width_reference(grown)
    np.testing.assert_array_equal(grown.q_mu_, reference.q_mu_)
    if covariance == "full":
        def cov(L):
            return L @ np.swapaxes(L, -1, -2)
        np.testing.assert_allclose(cov(grown.q_sqrt_), cov(reference.q_sqrt_))
    else:
        np.testing.assert_array_equal(grown.q_sqrt_, reference.q_sqrt_)
    _, X_test_moved = side_by_side(X_test)
    before = token_accuracy(y_test, model.predict(X_test_moved))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.set_params(warm_start=True).fit(moved, y)
    np.testing.assert_array_equal(model.inducing_.columns, both)
    after = token_accuracy(y_test, model.predict(X_test_moved))
    assert after > before + 0.2
    assert_clearly_better_than_chance(y_test, model.predict(X_test_moved))


def test_continued_full_covariance_fits_refuse_too_many_new_columns(monkeypatch):
    X, y, _, _ = split(sparse=True)
    wide, moved = side_by_side(X)
    model = GPStructClassifier(
        covariance="full", inducing="features", warm_start=True, **FAST
    ).fit(wide, y)
    # The limit on the factor's size, lowered to what the first fit has.
    monkeypatch.setattr(
        estimator_module, "_MAX_FULL_FEATURES", model.q_mu_.shape[-1]
    )
    with pytest.raises(ValueError, match=r"activates \d+ features the model has "
                       r"no variable for.*covariance='diag'"):
        model.fit(moved, y)


@pytest.mark.parametrize("covariance", ["diag", "full"])
def test_training_tokens_without_features_give_the_bias_alone(covariance):
    # No column active at a training token: only the bias has a variable
    # (a variable per column asked 8 TiB for the full factor over 2**20).
    y = [np.array([0, 1, 0, 1, 1])] * 4
    X = [sp.csr_matrix((5, 2**20))] * 4
    model = GPStructClassifier(
        covariance=covariance, inducing="features", max_iter=5, random_state=0
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
    assert model.q_mu_.shape == (1, 2, 1) and model.inducing_.columns.size == 0
    marginals = model.predict_marginals([sp.csr_matrix(np.eye(3, 2**20))])
    np.testing.assert_allclose(marginals[0].sum(axis=1), 1.0)


def test_partial_fit_adds_the_columns_of_later_pieces():
    X, y, X_test, y_test = split(sparse=True, noise=0.2)
    first, second = side_by_side(X)
    model = GPStructClassifier(optimizer="stochastic", batch_size=5, **FAST)
    model.partial_fit(first, y, classes=np.arange(N_CLASSES))
    active = active_once_centred(model, first)
    np.testing.assert_array_equal(model.inducing_.columns, active)
    for _ in range(10):
        model.partial_fit(second, y)
    grown = np.union1d(active, active_once_centred(model, second))
    assert grown.size > active.size
    np.testing.assert_array_equal(model.inducing_.columns, grown)
    _, X_test_second = side_by_side(X_test)
    assert_clearly_better_than_chance(y_test, model.predict(X_test_second))


def test_centred_columns_are_found_once_per_fit_and_pickled_compactly():
    # predict finds the centred columns of feature_mean_ once per model (5 ms
    # over 2**20 hashed columns), and a refit does not keep them (a probe
    # saw a refit pickle the previous fit's 8 MB mean with them). A pickle
    # holds the mean's nonzero entries only: a hashed design's dense mean
    # was 8 MB of a 9.6 MB pickle.
    X, y, _, _ = split(sparse=True)
    wide = [sp.hstack([x, sp.csr_matrix((x.shape[0], 2**18))], format="csr")
            for x in X]
    model = GPStructClassifier(**FAST).fit(wide, y)
    predicted = model.predict(wide)
    columns = model._centred_columns(model.feature_mean_)
    assert columns.size and model._centred_columns(model.feature_mean_) is columns
    np.testing.assert_array_equal(columns, np.flatnonzero(model.feature_mean_))
    pickled = pickle.dumps(model)
    assert len(pickled) < model.feature_mean_.nbytes / 4
    loaded = pickle.loads(pickled)
    assert isinstance(model.feature_mean_, np.ndarray)  # the live model's as it was
    assert loaded.feature_mean_.dtype == np.float64
    np.testing.assert_array_equal(loaded.feature_mean_, model.feature_mean_)
    np.testing.assert_array_equal(
        loaded._centred_columns(loaded.feature_mean_), columns
    )
    np.testing.assert_array_equal(
        np.concatenate(loaded.predict(wide)), np.concatenate(predicted)
    )
    # Dense features: every column centred, the mean pickled as it is.
    dense = GPStructClassifier(**FAST).fit([x.toarray() for x in X], y)
    state = dense.__getstate__()
    assert state["feature_mean_"] is dense.feature_mean_
    model.fit(X[:20], y[:20])
    assert "_centred_columns_of" not in vars(model)


def test_prediction_keeps_what_depends_on_the_posterior_alone(lone_data,
                                                             monkeypatch):
    # The collapsed posterior predict_marginals samples and the weights of
    # predict's mean cost in proportion to the parameters: computed once
    # per fitted posterior (a call on one sentence took 45 times crfsuite's),
    # not pickled, and never a previous fit's.
    from skgpstruct.inference import inducing as inducing_module

    X, y, X_test, _ = lone_data
    model = GPStructClassifier(**FAST).fit(X, y)
    assert getattr(model, "_collapsed", None) is not None
    counts = {"sampling_posterior": 0, "mean_state": 0}
    for cls, name in ((inducing_module.CollapsedFeatures, "sampling_posterior"),
                      (inducing_module.InducingFeatures, "mean_state")):
        real = getattr(cls, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            counts[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(cls, name, staticmethod(counted)
                            if name == "mean_state" else counted)
    first = [model.predict_marginals(X_test), model.predict(X_test)]
    again = [model.predict_marginals(X_test[:3]), model.predict(X_test[:3])]
    assert counts == {"sampling_posterior": 1, "mean_state": 1}
    for a, b in zip(again[0], first[0][:3], strict=False):
        np.testing.assert_array_equal(a, b)
    loaded = pickle.loads(pickle.dumps(model))
    assert "_sampling_posterior_of" in vars(model) and "_mean_state_of" in vars(model)
    assert not {"_sampling_posterior_of", "_mean_state_of"} & set(vars(loaded))
    np.testing.assert_array_equal(np.concatenate(loaded.predict_marginals(X_test)),
                                  np.concatenate(first[0]))
    # A fitted attribute replaced is seen (the mixture weights too, which
    # the sampled posterior carries): as a model that never predicted.
    two = GPStructClassifier(**FAST, n_components=2).fit(X, y)
    two.predict_marginals(X_test)  # (keeps the sampled posterior)
    assert "_sampling_posterior_of" in vars(two)
    untouched = copy.deepcopy(two)  # (without the caches, as pickled)
    assert "_sampling_posterior_of" not in vars(untouched)
    two.weights_ = np.array([0.9, 0.1])
    untouched.weights_ = np.array([0.9, 0.1])
    np.testing.assert_array_equal(np.concatenate(two.predict_marginals(X_test)),
                                  np.concatenate(untouched.predict_marginals(X_test)))
    # A refit on other data predicts as a fresh model of that data.
    model.fit(X[:20], y[:20])
    fresh = GPStructClassifier(**FAST).fit(X[:20], y[:20])
    np.testing.assert_array_equal(np.concatenate(model.predict_marginals(X_test)),
                                  np.concatenate(fresh.predict_marginals(X_test)))
    np.testing.assert_array_equal(np.concatenate(model.predict(X_test)),
                                  np.concatenate(fresh.predict(X_test)))



def _label_shift(model, label, size):
    """A shift of ``q_mu_[k]``'s shape: ``size`` on every inducing variable
    of ``label``, 0 elsewhere."""
    shift = np.zeros(model.q_mu_.shape[1:])
    shift[label] = size
    return shift


def _with_components(model, shifts, weights):
    """A copy of a one-component model as a mixture of ``len(weights)``:
    component ``k`` has the model's means plus ``shifts[k]`` and its
    spreads."""
    mixture = copy.deepcopy(model).set_params(n_components=len(weights))
    mixture.q_mu_ = np.stack([model.q_mu_[0] + shift for shift in shifts])
    mixture.q_sqrt_ = np.repeat(model.q_sqrt_, len(weights), axis=0)
    mixture.weights_ = np.asarray(weights, dtype=np.float64)
    return mixture


def test_a_mixture_decodes_at_its_mean(fitted, data):
    # predict decodes the posterior mean potentials: for a mixture, those of
    # the weighted mean of its components' means. Components far apart
    # whose weighted mean is the model's own means decode as the model.
    _, _, X_test, _ = data
    shift = _label_shift(fitted, 0, 3.0)
    mixture = _with_components(fitted, [9.0 * shift, -shift], [0.1, 0.9])
    expected = fitted.predict(X_test)
    for a, b in zip(mixture.predict(X_test), expected, strict=True):
        np.testing.assert_array_equal(a, b)
    # Either component alone decodes otherwise: the check can fail.
    first = _with_components(fitted, [9.0 * shift, -shift], [1.0, 0.0])
    assert not np.array_equal(
        np.concatenate(first.predict(X_test)), np.concatenate(expected)
    )


def test_a_mixture_marginals_weigh_its_components(fitted, data):
    # predict_marginals of a mixture: its components' marginals averaged
    # with the mixture weights (Monte Carlo estimates on both sides, so
    # compared on their mean absolute difference).
    _, _, X_test, _ = data
    shift = _label_shift(fitted, 0, 2.0)
    weights = [0.8, 0.2]
    S = 256
    mixture = _with_components(fitted, [shift, -shift], weights)
    mixture.set_params(n_predict_samples=S)
    per_component = []
    for sign in (1.0, -1.0):
        single = copy.deepcopy(fitted).set_params(n_predict_samples=S)
        single.q_mu_ = fitted.q_mu_ + sign * shift
        per_component.append(np.concatenate(single.predict_marginals(X_test)))
    expected = weights[0] * per_component[0] + weights[1] * per_component[1]
    got = np.concatenate(mixture.predict_marginals(X_test))
    assert np.mean(np.abs(got - expected)) < 0.015  # 0.0056 when written
    # Equal weights would be told apart: the components differ enough.
    unweighted = 0.5 * (per_component[0] + per_component[1])
    assert np.mean(np.abs(unweighted - expected)) > 0.05


def test_marginals_average_over_the_transitions_spread(fitted, data):
    # pairwise_uncertainty=True: the marginals averaged over transitions
    # drawn from N(pairwise_mean_, pairwise_std_^2). Against the chain's
    # forward-backward at the mean unaries, averaged here over 20,000 such
    # draws, with the unaries' spread 1e-8 (weak unaries, so that the
    # transitions count; a spread of 1.5, where its square would differ).
    _, _, X_test, _ = data
    model = copy.deepcopy(fitted)
    model.q_mu_ = 0.05 * fitted.q_mu_
    model.q_sqrt_ = np.full_like(fitted.q_sqrt_, 1e-8)
    sd = 1.5
    model.pairwise_std_ = np.full_like(fitted.pairwise_std_, sd)
    model.set_params(pairwise_uncertainty=True, n_predict_samples=4096)
    got = np.concatenate(model.predict_marginals(X_test))
    X_c, offsets = stack_sequences(model._check_predict_input(X_test))
    unary = model._mean_potentials(X_c)
    rng = np.random.default_rng(0)

    def averaged(scale, n_draws=20_000):
        V = unary.shape[1]
        draws = model.pairwise_mean_ + scale * rng.standard_normal((n_draws, V, V))
        total = 0.0
        for block in np.array_split(draws, 20):
            stacked = np.broadcast_to(unary, (len(block),) + unary.shape)
            total = total + chain.forward_backward(stacked, block, offsets)[1].sum(0)
        return total / n_draws

    expected = averaged(sd)
    assert np.mean(np.abs(got - expected)) < 0.01  # 0.0023 when written
    # The check can fail: other spreads give other marginals.
    for other in (sd**2, 1.0):
        assert np.mean(np.abs(averaged(other) - expected)) > 0.02


def test_marginals_far_from_the_data_are_the_priors(data):
    # With inducing points, a token far from all of them (RBF kernel) has
    # its prior: every label's potential N(0, variance), independently.
    # Against forward-backward averaged here over 20,000 such draws, with
    # the fitted transitions; a variance of 4, whose square root and
    # itself would differ as spreads.
    X, y, X_test, _ = data
    variance = 4.0
    kernel = RBFKernel(
        variance=variance, length_scale=1.0, variance_bounds="fixed",
        length_scale_bounds="fixed",
    )
    model = GPStructClassifier(
        **{**FAST, "n_inducing": 10}, kernel=kernel, n_predict_samples=4096
    ).fit(X, y)
    far = [x + 1e3 for x in X_test[:3]]
    got = np.concatenate(model.predict_marginals(far))
    lengths = [len(x) for x in far]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    pairwise = model._decoding_pairwise(model.pairwise_mean_)
    rng = np.random.default_rng(0)

    def averaged(sd, n_draws=20_000):
        shape = (n_draws, offsets[-1], pairwise.shape[0])
        unary = sd * rng.standard_normal(shape)
        pairs = np.broadcast_to(pairwise, (n_draws,) + pairwise.shape)
        return chain.forward_backward(unary, pairs, offsets)[1].mean(axis=0)

    expected = averaged(np.sqrt(variance))
    assert np.mean(np.abs(got - expected)) < 0.01  # 0.0035 when written
    # The check can fail: other spreads give other marginals.
    for other in (variance, 1.0):
        assert np.mean(np.abs(averaged(other) - expected)) > 0.02


def test_mean_potentials_of_inducing_features_are_the_linear_model(data):
    # With inducing features the posterior mean potentials are a linear
    # model: f(x) = sum_j c_j m_j x_j + c_b m_b, with the kernel's feature
    # scales c (k(x, x') = 0.5 (x.x' + 8): sqrt(0.5) per column, 2 for the
    # bias) and the means m of the weights; predict is Viterbi on them.
    X, y, X_test, _ = data
    model = GPStructClassifier(
        **FAST, kernel=LinearKernel(variance=0.5, bias=8.0),
        learn_hyperparameters=False, inducing="features",
    ).fit(X, y)
    c = np.r_[np.full(N_FEATURES, np.sqrt(0.5)), 2.0]
    np.testing.assert_allclose(model.kernel_.feature_scales(N_FEATURES), c)
    m = np.einsum("k,kvm->vm", model.weights_, model.q_mu_)
    assert m.shape == (N_CLASSES, N_FEATURES + 1)
    # (features as given unless the model centres them)
    mean = getattr(model, "feature_mean_", None)
    X_c, offsets = stack_sequences(
        [x if mean is None else x - mean for x in X_test]
    )
    expected = X_c @ (c[:-1, None] * m[:, :-1].T) + c[-1] * m[:, -1]
    np.testing.assert_allclose(
        model._mean_potentials(X_c), expected, rtol=1e-10, atol=1e-12
    )
    labels, _ = chain.viterbi(expected, model.pairwise_mean_, offsets)
    np.testing.assert_array_equal(
        np.concatenate(model.predict(X_test)), model.classes_[labels]
    )


def test_sparse_columns_are_centred_when_active_at_more_than_half():
    # Of sparse features, the columns active at more than half of the
    # training tokens are centred: at 5 tokens of 10, not; at 6, yes.
    rng = np.random.default_rng(0)
    y = [rng.integers(0, 2, 5) for _ in range(2)]
    dense = np.zeros((10, 3))
    dense[:5, 0] = 1.0  # half of the tokens
    dense[:6, 1] = 2.0  # more than half
    dense[:, 2] = rng.normal(size=10)  # every token
    X = [sp.csr_matrix(dense[:5]), sp.csr_matrix(dense[5:])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = GPStructClassifier(**{**FAST, "max_iter": 2}).fit(X, y)
    np.testing.assert_allclose(
        model.feature_mean_, [0.0, 1.2, dense[:, 2].mean()], rtol=1e-12
    )


def test_partial_fit_takes_classes_in_any_order(data):
    # classes are a set: permuted or repeated, the model of the sorted ones.
    X, y, X_test, _ = data
    expected = GPStructClassifier(**FAST).partial_fit(X, y, classes=[0, 1, 2])
    for classes in ([2, 0, 1], [1, 2, 0, 2]):
        model = GPStructClassifier(**FAST).partial_fit(X, y, classes=classes)
        np.testing.assert_array_equal(model.classes_, [0, 1, 2])
        np.testing.assert_array_equal(model.q_mu_, expected.q_mu_)
        for a, b in zip(model.predict(X_test), expected.predict(X_test), strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("early_stopping", [False, True])
@pytest.mark.parametrize("fraction", [0, 0.0, 1])
def test_validation_fraction_is_checked_whatever_the_optimizer(
    data, fraction, early_stopping
):
    # Checked as documented, in (0, 1), even where no split is made.
    X, y, _, _ = data
    with pytest.raises(ValueError, match=r"validation_fraction must be a number in"):
        GPStructClassifier(
            validation_fraction=fraction, early_stopping=early_stopping
        ).fit(X, y)


def test_a_lone_feature_predicts_with_its_marginal_posterior():
    # Lone features (one training token each) are collapsed in the fit;
    # q_mu_ and q_sqrt_ hold every original feature's marginal posterior. A
    # test token holding only lone feature j has independent Gaussian
    # unaries f_v = c_j u_vj + c_b u_vb, and one token's marginals are
    # E[softmax(f)]: against 200,000 draws of that Gaussian here.
    rng = np.random.default_rng(0)
    n_seq, T, n_shared = 40, 5, 4
    n_columns = n_shared + 2 * n_seq * T
    X, y, column = [], [], n_shared
    for _ in range(n_seq):
        dense = np.zeros((T, n_columns))
        for t in range(T):
            dense[t, rng.integers(n_shared)] = 1.0
            dense[t, column : column + 2] = 1.0  # two lone features a token
            column += 2
        X.append(sp.csr_matrix(dense))
        y.append(rng.integers(2, size=T))
    model = GPStructClassifier(
        kernel=LinearKernel(variance=4.0, bias=0.25), learn_hyperparameters=False,
        max_iter=200, random_state=0, n_predict_samples=8192,
    ).fit(X, y)
    j = n_shared  # a lone feature of the first training token
    c = model.kernel_.feature_scales(n_columns)
    mean = c[j] * model.q_mu_[0, :, j] + c[-1] * model.q_mu_[0, :, -1]
    sd = np.hypot(c[j] * model.q_sqrt_[0, :, j], c[-1] * model.q_sqrt_[0, :, -1])
    f = mean + sd * np.random.default_rng(1).standard_normal((200_000, mean.size))
    expected = np.exp(f - logsumexp(f, axis=1, keepdims=True)).mean(axis=0)
    x = sp.csr_matrix(([1.0], ([0], [j])), shape=(1, n_columns))
    np.testing.assert_allclose(model.predict_marginals([x])[0][0], expected, atol=0.01)


def test_models_pickled_before_inducing_columns_predict():
    # Inducing features pickled before they had columns cover every column.
    X, y, X_test, _ = split(sparse=True)
    model = GPStructClassifier(**FAST).fit(X, y)
    old = copy.deepcopy(model)
    del old.inducing_.__dict__["columns"]
    old = pickle.loads(pickle.dumps(old))
    assert old.inducing_.columns is None
    assert old.inducing_.n_design_features == X[0].shape[1]
    for a, b in zip(old.predict(X_test), model.predict(X_test), strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(old.predict_marginals(X_test), model.predict_marginals(X_test),
                    strict=True):
        np.testing.assert_array_equal(a, b)


def test_no_collapse_without_lone_features(data, fitted, monkeypatch):
    # Dense synthetic features are active everywhere: nothing to collapse,
    # the same fit as with collapse_lone_features=False.
    X, y, _, _ = data
    calls = count_expansions(monkeypatch)
    assert_same_fit(
        fitted, GPStructClassifier(collapse_lone_features=False, **FAST).fit(X, y)
    )
    assert_same_fit(fitted, GPStructClassifier(**FAST).fit(X, y))
    assert calls == []


def test_stochastic_continuations_keep_one_variable_per_feature(
    lone_data, monkeypatch
):
    X, y, _, _ = lone_data
    calls = count_expansions(monkeypatch)
    model = GPStructClassifier(optimizer="stochastic", batch_size=5, **FAST)
    model.partial_fit(X, y, classes=np.arange(N_CLASSES))
    model.partial_fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.set_params(warm_start=True, max_iter=2).fit(X, y)
        assert calls == []
        # A cold stochastic fit collapses.
        GPStructClassifier(
            optimizer="stochastic", batch_size=5, **{**FAST, "max_iter": 2}
        ).fit(X, y)
    assert len(calls) == 1


def test_collapsed_warm_start_continues(lone_data):
    X, y, _, _ = lone_data
    model = GPStructClassifier(warm_start=True, **{**FAST, "max_iter": 5})
    with pytest.warns(ConvergenceWarning):
        model.fit(X, y)
    first = list(model.elbo_history_)
    model.set_params(max_iter=100).fit(X, y)
    second = model.elbo_history_[len(first):]
    assert len(second) == model.n_iter_ >= 1
    assert second[0] >= first[-1] - 0.02 * abs(first[-1])
    assert second[0] > first[0]


def test_collapsed_warm_start_resumes_the_fitted_posterior(lone_data, monkeypatch):
    # A refit on the same data starts where the previous fit ended (the same
    # random_state, the same Monte Carlo samples): from the collapsed
    # posterior itself, not from one rebuilt from its expanded marginals
    # (24 iterations where one was enough, and a lower ELBO at the start).
    X, y, _, _ = lone_data
    runs = []
    run = estimator_module.minimize_lbfgs

    def spy(value_and_grad, x0, **kwargs):
        result = run(value_and_grad, x0, **kwargs)
        runs.append((x0.copy(), value_and_grad(x0)[0], result.x, result.value))
        return result

    monkeypatch.setattr(estimator_module, "minimize_lbfgs", spy)
    model = GPStructClassifier(warm_start=True, **{**FAST, "max_iter": 300})
    model.fit(X, y)
    model.fit(X, y)
    (_, _, end, end_value), (start, start_value, _, _) = runs
    np.testing.assert_allclose(start, end, rtol=0, atol=1e-12)
    # (Not to the last digit: the residual variance's floor follows the
    # kernel the fit starts with, the initial one, then the learned one.)
    assert start_value == pytest.approx(end_value, rel=1e-7)


def test_collapsed_fit_is_the_same_for_any_n_jobs(lone_data, monkeypatch):
    X, y, _, _ = lone_data
    monkeypatch.setattr(estimator_module, "CHUNK_TOKENS", 25)
    serial = GPStructClassifier(n_jobs=1, **FAST).fit(X, y)
    assert_same_fit(serial, GPStructClassifier(n_jobs=2, **FAST).fit(X, y))


def test_collapsed_fit_is_the_same_for_dense_and_sparse_input(lone_data):
    # With a kernel object the features are used as given, dense or sparse
    # (the kernel "linear" by name centres dense features: see below).
    X, y, _, _ = lone_data
    dense = [x.toarray() for x in X]
    params = {**FAST, "kernel": LinearKernel(variance=0.1)}
    sparse_fit = GPStructClassifier(**params).fit(X, y)
    dense_fit = GPStructClassifier(**params).fit(dense, y)
    assert dense_fit.feature_mean_ is None and sparse_fit.feature_mean_ is None
    assert_same_fit(sparse_fit, dense_fit)


def test_continued_fits_keep_the_feature_mean_they_started_with():
    # partial_fit pieces and warm-started fits continue in the coordinates
    # of the fit they continue: the mean of the first piece, not of the new
    # data (the posterior would otherwise be read on other features).
    X, y = make_sequences(40, n_classes=3, random_state=0)
    shifted = [x + 5.0 for x in X]
    model = GPStructClassifier(max_iter=5, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.partial_fit(shifted[:20], y[:20], classes=[0, 1, 2])
        first = model.feature_mean_.copy()
        np.testing.assert_allclose(first, np.vstack(shifted[:20]).mean(axis=0))
        model.partial_fit(shifted[20:], y[20:])
        np.testing.assert_array_equal(model.feature_mean_, first)
        warm = GPStructClassifier(max_iter=5, warm_start=True, random_state=0)
        warm.fit(shifted[:20], y[:20])
        kept = warm.feature_mean_.copy()
        warm.fit(shifted[20:], y[20:])
        np.testing.assert_array_equal(warm.feature_mean_, kept)
        fresh = GPStructClassifier(max_iter=5, random_state=0).fit(shifted[20:], y[20:])
    np.testing.assert_allclose(
        fresh.feature_mean_, np.vstack(shifted[20:]).mean(axis=0)
    )
    assert model.score(shifted, y) > 0.8


def _fit_without_user_warnings(model, X, y):
    """``model.fit(X, y)`` with every UserWarning but ConvergenceWarning an
    error (ConvergenceWarning is a UserWarning: its filter comes first)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.simplefilter("ignore", ConvergenceWarning)
        return model.fit(X, y)


def test_linear_kernel_object_warns_of_features_it_does_not_suit():
    # A LinearKernel object uses dense features as given: moved by 10, the
    # fit predicted one label (0.332) with no word; it now warns, naming
    # the remedies. No warning as given, by name (centred) or sparse.
    X, y = make_sequences(n_sequences=20, random_state=0)
    moved = [x + 10 for x in X]
    params = {"max_iter": 3, "random_state": 0}
    with pytest.warns(UserWarning, match=r"X's dense features share an offset "
                      r"\(the mean token's squared norm, .* kernel='linear', "
                      "which centres dense features"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            GPStructClassifier(kernel=LinearKernel(), **params).fit(moved, y)
    # Features scaled by 0.01 start the kernel object's potentials with a
    # prior sd of 0.02: that fit ignored the features too (0.332).
    with pytest.warns(UserWarning, match=r"X's dense features are small for the "
                      r"linear kernel given as an object: .* prior standard "
                      r"deviation of 0\.02"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            GPStructClassifier(kernel=LinearKernel(), **params).fit(
                [0.01 * x for x in X], y
            )
    # Sparse features are never centred: the same warning, with a remedy
    # for them, pointing at the caller's line (for ESS too, whose kernel
    # object is used as given without learning; it said nothing).
    sparse_moved = [sp.csr_matrix(x) for x in moved]
    for extra in ({}, {"inference": "ess", "learn_hyperparameters": False,
                       "ess_n_iter": 4, "ess_burn_in": 0, "ess_thin": 1}):
        with pytest.warns(UserWarning, match=r"X's sparse features share an "
                          r"offset .* scale down the columns shared by most "
                          r"tokens \(column \d+ contributes most") as record:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                GPStructClassifier(kernel=LinearKernel(), **params, **extra).fit(
                    sparse_moved, y
                )
        assert {w.filename for w in record} == {__file__}
    for kernel, data in (
        (LinearKernel(), X), ("linear", moved), ("linear", [0.01 * x for x in X]),
        (LinearKernel(), [0.03 * x for x in X]), ("linear", sparse_moved),
        (LinearKernel(), [sp.csr_matrix(x) for x in X]),
    ):
        _fit_without_user_warnings(GPStructClassifier(kernel=kernel, **params), data, y)


def test_sparse_columns_active_at_most_tokens_are_centred():
    # Sparse indicators beside a column of 100 at every token: uncentred,
    # kernel="linear" learned to ignore the features and predicted one
    # label (training accuracy 0.346; 0.971 dense, centred), and a start of
    # the variance from the tokens' spread only helped up to a column of
    # about 300. The columns active at more than half of the tokens are
    # centred now, the others left as they are (sparse).
    X, y = make_sequences(
        n_sequences=20, length_range=(5, 20), sparse=True, random_state=0
    )
    rare = np.zeros((sum(len(s) for s in y), 1))
    rare[::3] = 5.0  # at a third of the tokens: not centred
    pieces = np.cumsum([0] + [len(s) for s in y])
    for value in (100.0, 1e5, 1.7e9):
        data = [
            sp.hstack([x, np.full((x.shape[0], 1), value), rare[t0:t1]],
                      format="csr")
            for x, t0, t1 in zip(X, pieces[:-1], pieces[1:], strict=True)
        ]
        model = _fit_without_user_warnings(GPStructClassifier(random_state=0), data, y)
        stacked = sp.vstack(data).tocsc()
        expected = np.asarray(stacked.mean(axis=0)).ravel()
        expected[np.diff(stacked.indptr) <= stacked.shape[0] / 2] = 0.0
        assert expected[-2] == pytest.approx(value) and expected[-1] == 0.0
        np.testing.assert_allclose(model.feature_mean_, expected, rtol=1e-12)
        # The constant column's mean is its value (a sum over the count;
        # scipy's mean scales first and was off by some ulps), so centred
        # it is no column at all: no training token has it, no variable.
        assert model.feature_mean_[-2] == value
        constant = data[0].shape[1] - 2
        assert constant not in model.inducing_.columns
        assert token_accuracy(y, model.predict(data)) > 0.9
    # Without such columns nothing is centred (the CRF++ features of the
    # benchmarks have none: their densest column is active at 24 % of the
    # tokens).
    indicators = sp.csr_matrix(np.eye(4)[np.arange(40) % 4])
    assert GPStructClassifier()._feature_mean(indicators, True, False) is None


def test_rbf_kernel_object_warns_of_a_length_scale_far_from_the_data():
    # RBFKernel(length_scale=1e-2) on make_sequences' features (median
    # distance between tokens about 3): the fit predicted the majority label
    # with no word. By name, or near the median distance: no warning.
    from skgpstruct.kernels import RBFKernel

    X, y = make_sequences(n_sequences=20, random_state=0)
    params = {"max_iter": 3, "n_inducing": 20, "random_state": 0}
    for length_scale, side in ((1e-2, "below"), (1e3, "above")):
        with pytest.warns(UserWarning, match=r"RBF kernel given as an object has "
                          rf"length_scale .*times {side} the median distance"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                GPStructClassifier(kernel=RBFKernel(length_scale=length_scale),
                                   **params).fit(X, y)
    for kernel in ("rbf", RBFKernel(length_scale=1.0), RBFKernel(length_scale=30.0)):
        _fit_without_user_warnings(GPStructClassifier(kernel=kernel, **params), X, y)
    # Per-feature length scales (ARD): the median distance in length scales
    # (no warning: they fitted at the majority label in silence).
    n_features = X[0].shape[1]
    for length_scale, side in ((1e-3, "apart"), (1e4, "alike")):
        kernel = RBFKernel(length_scale=[length_scale] * n_features)
        with pytest.warns(UserWarning, match=r"per-feature length scales under "
                          rf"which .* length scales: the kernel sees the tokens "
                          rf"all {side}"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                GPStructClassifier(kernel=kernel, **params).fit(X, y)
    spread = np.concatenate(X).std(axis=0)
    _fit_without_user_warnings(
        GPStructClassifier(kernel=RBFKernel(length_scale=spread), **params), X, y
    )


def _random_csr_matrices(seed, max_columns, min_density):
    """50 random CSR matrices of 1 to 19 rows and 2 to ``max_columns``
    columns, with the generator that drew them."""
    rng = np.random.default_rng(seed)
    for _ in range(50):
        n, d = rng.integers(1, 20), rng.integers(2, max_columns)
        yield rng, sp.random(
            n, d, density=rng.uniform(min_density, 0.9), format="csr",
            random_state=rng,
        )


def test_centred_sparse_columns_are_the_dense_difference():
    from skgpstruct._estimator import _centred

    for rng, X in _random_csr_matrices(0, 10, 0.1):
        d = X.shape[1]
        mean = np.where(rng.random(d) < 0.5, rng.normal(size=d), 0.0)
        mean[0] = X[0, 0] or mean[0]  # a column whose mean is one of its values
        expected = X.toarray() - mean
        # the centred columns found here, or given (as predict does)
        for centred in (_centred(X, mean), _centred(X, mean, np.flatnonzero(mean))):
            if mean.all():  # every column: dense
                np.testing.assert_array_equal(centred, expected)
            else:
                assert sp.issparse(centred) and centred.has_canonical_format
                assert centred.data.all()  # no stored zeros
                np.testing.assert_array_equal(centred.toarray(), expected)


def test_selected_sparse_columns_are_the_dense_ones():
    # Inducing features over a design's active columns read them from CSR
    # in time linear in the stored entries (2**20 hashed columns): the
    # dense array's columns, in canonical CSR.
    # The same through a lookup table of the columns (column_positions:
    # what InducingFeatures keeps for its predictions, keep_lookup=True),
    # which a pickle leaves out, and without it above its size limit.
    from skgpstruct._sequences import column_positions, select_columns
    from skgpstruct.inference import inducing as inducing_module

    for rng, X in _random_csr_matrices(1, 30, 0.0):
        columns = np.flatnonzero(rng.random(X.shape[1]) < rng.uniform(0.0, 1.0))
        inducing = inducing_module.InducingFeatures(X.shape[1], columns=columns)
        small = inducing_module.InducingFeatures(X.shape[1], columns=columns)
        unpickled = pickle.loads(pickle.dumps(inducing))
        selections = [
            select_columns(X, columns),
            select_columns(X, columns, column_positions(columns, X.shape[1])),
            inducing.select(X),
        ]
        assert "_positions" not in vars(inducing)  # the fit's single select
        selections += [
            inducing.select(X, keep_lookup=True),
            inducing.select(X, keep_lookup=True),  # the kept table
            unpickled.select(X, keep_lookup=True),
        ]
        assert "_positions" in vars(inducing)
        assert "_positions" not in vars(pickle.loads(pickle.dumps(inducing)))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(inducing_module, "COLUMN_LOOKUP_BYTES", 4 * X.shape[1] - 1)
            selections.append(small.select(X, keep_lookup=True))
        assert "_positions" not in vars(small)
        for selected in selections:
            assert selected.shape == (X.shape[0], columns.size)
            assert selected.has_canonical_format
            np.testing.assert_array_equal(selected.toarray(), X.toarray()[:, columns])
        # a design of another width is refused, naming both widths
        wider = sp.hstack([X, sp.csr_matrix((X.shape[0], 1))], format="csr")
        with pytest.raises(ValueError, match=f"X has {X.shape[1] + 1} features"):
            inducing.select(wider, keep_lookup=True)


def test_rbf_centres_sparse_features_far_from_the_origin():
    # Uncentred, distances from inner products lose the tokens' differences
    # far from the origin: moved by 1e7 (as CSR) the fit failed in a
    # Cholesky factor with advice about the hyperparameters, a column of
    # 1.7e9 at every token fitted one label silently (so did an RBFKernel
    # object on dense features moved by 1e7). The columns active at most
    # tokens are centred: the same model, precise distances.
    from skgpstruct.kernels import RBFKernel

    X, y = make_sequences(n_sequences=10, random_state=0)
    column = [
        sp.hstack([sp.csr_matrix(x), np.full((len(x), 1), 1.7e9)], format="csr")
        for x in X
    ]
    moved = [sp.csr_matrix(x + 1e7) for x in X]
    params = {"max_iter": 30, "n_inducing": 20, "random_state": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        reference = GPStructClassifier(kernel="rbf", **params).fit(X, y)
        floor = token_accuracy(y, reference.predict(X)) - 0.05
        for data in (column, moved, [x.toarray() for x in moved]):
            for kernel in ("rbf", RBFKernel()):
                model = GPStructClassifier(kernel=kernel, **params).fit(data, y)
                assert model.feature_mean_ is not None
                assert token_accuracy(y, model.predict(data)) > floor


def test_rbf_refuses_a_continued_fit_far_from_the_first():
    # A continued fit centres new data by the first fit's mean: a later
    # piece far from it was used without a word, and predicted one label.
    X, y = make_sequences(n_sequences=20, random_state=0)
    far = [x + 1e7 for x in X]
    message = (r"X's features lie too far from the origin for an RBF kernel: .* "
               r"these features lie far from that fit's: give features near "
               r"its own, or fit a new model on them")
    model = GPStructClassifier(kernel="rbf", n_inducing=10, random_state=0)
    model.partial_fit(X[:10], y[:10], classes=[0, 1, 2])
    with pytest.raises(ValueError, match=message):
        model.partial_fit(far[10:], y[10:])
    model.partial_fit(X[10:], y[10:])  # near the first piece: accepted
    warm = GPStructClassifier(
        kernel="rbf", n_inducing=10, max_iter=2, warm_start=True, random_state=0
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warm.fit(X, y)
        with pytest.raises(ValueError, match=message):
            warm.fit(far, y)
    # A large value at a few tokens only is no reason to refuse.
    rare = [x.copy() for x in X]
    rare[0][0, 0] = 1e9
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        GPStructClassifier(kernel="rbf", n_inducing=10, max_iter=2).fit(rare, y)


def test_convergence_warnings_point_at_the_caller():
    # They pointed inside the estimator (fixed stacklevels).
    X, y = make_sequences(n_sequences=10, random_state=0)
    with pytest.warns(ConvergenceWarning, match="did not converge") as record:
        GPStructClassifier(max_iter=1).fit(X, y)
    narrow = LinearKernel(variance=1.0, variance_bounds=(1.0, 1.0 + 1e-9))
    with warnings.catch_warnings(record=True) as more:
        warnings.simplefilter("always", ConvergenceWarning)
        GPStructClassifier(kernel=narrow, max_iter=5, tol=1e-2).fit(X, y)
    assert any("ended at a bound" in str(w.message) for w in more)
    assert {w.filename for w in [*record, *more]} == {__file__}


def test_offset_and_spread_keep_the_spread_far_from_the_origin():
    # The spread as mean squared norm minus offset cancelled to noise.
    from skgpstruct._estimator import _offset_and_spread

    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 4))
    X[:, 2] = 0.0
    X[::3, 2] = 1.0  # a column with absent entries once sparse
    expected = np.mean(np.sum((X - X.mean(axis=0)) ** 2, axis=1))
    for shift in (0.0, 1e9):
        moved = X + np.array([shift, 0.0, 0.0, 0.0])
        for data in (moved, sp.csr_matrix(moved)):
            offset, spread, column = _offset_and_spread(data)
            # (moved by 1e9, the features themselves are rounded to 1e-7;
            # mean squared norm minus offset was off by about 100)
            np.testing.assert_allclose(spread, expected, rtol=1e-6)
            np.testing.assert_allclose(
                offset, np.sum(moved.mean(axis=0) ** 2), rtol=1e-12
            )
            assert column == (0 if shift else int(np.argmax(X.mean(axis=0) ** 2)))


def test_linear_kernel_by_name_moves_its_range_with_large_features():
    # From features of 1e5 (mean squared norm 1e10) the start 1 / (mean_sq + 1)
    # fell below the default range (1e-5, 1e5): clipped, silently, and the
    # fit ended at the bound. The range now moves with the start.
    X, y = make_sequences(n_sequences=20, random_state=0)
    model = _fit_without_user_warnings(
        GPStructClassifier(max_iter=20, random_state=0), [1e5 * x for x in X], y
    )
    low, high = model.kernel_.variance_bounds
    assert low < model.kernel_.variance < high and high < 1e-5
    assert model.score([1e5 * x for x in X], y) > 0.9


@pytest.mark.parametrize("groups", [None, [0, 1, 2]])
def test_linear_kernel_by_name_keeps_the_offsets_of_large_features(groups):
    # With the variances' range moved (above), the offsets' prior variance
    # (LinearKernel: variance * bias) started at 1 / mean_sq and its
    # gradient vanished: features independent of the labels, one-token
    # sequences of 85 % one label, predicted at p = 0.5 from a scale of
    # about 100 (mean squared norm 3e4). From LARGE_MEAN_SQ the fit is now
    # the same model at any scale, as below a mean squared norm of 1 (30:
    # 2.5e3, where the variance had still ended on its lower bound).
    rng = np.random.default_rng(0)
    X = [rng.normal(size=(1, 3)) for _ in range(300)]
    y = [["a"] if rng.random() < 0.85 else ["b"] for _ in range(300)]
    share = np.mean([s[0] == "a" for s in y])
    learned = {}
    for scale in (30.0, 1e3, 1e6):
        model = GPStructClassifier(random_state=0, feature_groups=groups)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model.fit([x * scale for x in X], y)
        p_a = np.concatenate(model.predict_marginals([x * scale for x in X]))[:, 0]
        assert abs(p_a.mean() - share) < 0.02
        kernel = model.kernel_
        offset = kernel.bias * (kernel.variance if groups is None else 1.0)
        learned[scale] = (np.atleast_1d(kernel.variance) * scale**2, offset)
    # The same prior at both scales (to the fits' rounding): the weights'
    # variances scaled by the squares, the offsets' the same.
    for scale in (30.0, 1e6):
        for a, b in zip(learned[1e3], learned[scale], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4)


def test_bool_labels_in_any_container_are_one_type():
    # np.bool_ is no numbers.Number: lists of NumPy booleans beside bool
    # arrays were refused as "mixed types (bool, number)".
    X, y = make_sequences(12, n_classes=2, random_state=0)
    as_bool = [np.asarray(s, dtype=bool) for s in y]
    mixed = [s if i % 2 else list(s) for i, s in enumerate(as_bool)]
    mixed[1] = [np.True_, False, *as_bool[1][2:]]
    params = {**FAST, "max_iter": 3}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = GPStructClassifier(**params).fit(X, mixed)
        assert model.classes_.dtype == bool
        GPStructClassifier(**params).partial_fit(
            X, as_bool, classes=[np.False_, np.True_]
        )


@pytest.mark.parametrize("empty", [lambda: [], lambda: np.zeros((0, N_FEATURES))],
                         ids=["[]", "zeros(0,F)"])
def test_zero_length_sequences_take_the_format_of_sparse_data(data, empty):
    # They were "dense" and refused beside sparse sequences ("X mixes dense
    # and sparse sequences"), in fit and in predict.
    X, y, X_test, y_test = data
    X = [sp.csr_matrix(x) for x in X]
    model = GPStructClassifier(**FAST).fit([empty()] + X, [[]] + y)
    predicted = model.predict([empty()] + [sp.csr_matrix(x) for x in X_test])
    assert predicted[0].shape == (0,)
    assert_clearly_better_than_chance(y_test, predicted[1:])


def test_median_distance_against_pdist():
    # The length-scale start of "rbf": the median distance between distinct
    # tokens (scipy's pdist here), the same for sparse rows, 1 when every
    # token is the same; past MEDIAN_DISTANCE_TOKENS evenly spaced tokens.
    from scipy.spatial.distance import pdist

    rng = np.random.default_rng(0)
    Z = rng.standard_normal((50, 4)) * (rng.random((50, 4)) < 0.6)
    Z[10] = Z[11]  # a repeated token: counted once
    expected = np.median(pdist(np.unique(Z, axis=0)))
    assert estimator_module._median_distance(Z) == pytest.approx(expected)
    assert estimator_module._median_distance(sp.csr_matrix(Z)) == pytest.approx(
        expected
    )
    assert estimator_module._median_distance(np.ones((5, 3))) == 1.0
    # A token repeated over most of the data: the distances between its
    # copies, computed from inner products, are rounding noise (about 1e-8,
    # not 0), which made them the median (4.2e-08 instead of 18.5 here).
    points = np.random.default_rng(0).standard_normal((3, 20)) * 3 + 5
    repeated = np.repeat(points, [800, 50, 50], axis=0)
    repeated = repeated - repeated.mean(axis=0)  # centred, as the estimator does
    assert estimator_module._median_distance(repeated) == pytest.approx(
        np.median(pdist(np.unique(repeated, axis=0)))
    )
    big = rng.standard_normal((2500, 2))
    rows = np.unique(np.linspace(0, 2499, 1000).astype(int))
    assert estimator_module._median_distance(big) == pytest.approx(
        np.median(pdist(big[rows]))
    )


def test_rbf_by_name_fits_features_at_any_scale():
    # From a length scale of 1, features scaled by 1e-4 or 1e3 gave a kernel
    # that saw every token alike (or apart) and a fit at chance level
    # (0.207 on this data). "rbf" starts at the median distance between
    # training tokens, its bounds moved with it, and centres dense features.
    from scipy.spatial.distance import pdist

    X, y = make_sequences(80, n_classes=5, n_features=10, random_state=0)
    X_train, y_train, X_test, y_test = X[:55], y[:55], X[55:], y[55:]
    tokens = np.vstack(X_train)
    assert len(np.unique(tokens, axis=0)) <= estimator_module.MEDIAN_DISTANCE_TOKENS
    starts = {}
    for scale, shift in ((1.0, 0.0), (1e-4, 0.0), (1e3, 0.0), (1.0, 1e4)):
        A = [scale * x + shift for x in X_train]
        start = GPStructClassifier(
            kernel="rbf", learn_hyperparameters=False, max_iter=1, random_state=0
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            start.fit(A, y_train)
        # Every pair of distinct training tokens (fewer than the cap here).
        median = scale * np.median(pdist(np.unique(tokens, axis=0)))
        starts[scale, shift] = start.kernel_.length_scale
        assert starts[scale, shift] == pytest.approx(median, rel=1e-6)
        np.testing.assert_allclose(
            start.kernel_.length_scale_bounds, (1e-5 * median, 1e5 * median),
            rtol=1e-6,
        )
        model = GPStructClassifier(kernel="rbf", n_inducing=40, random_state=0)
        model.fit(A, y_train)
        assert model.score([scale * x + shift for x in X_test], y_test) > 0.9
    unit = starts[1.0, 0.0]
    assert starts[1e-4, 0.0] == pytest.approx(1e-4 * unit)
    assert starts[1e3, 0.0] == pytest.approx(1e3 * unit)
    assert starts[1.0, 1e4] == pytest.approx(unit)


def test_linear_by_name_centres_dense_features():
    # A shared offset in dense features tied every weight to it under the
    # diagonal posterior: on features moved by 10 the fit ignored them and
    # predicted one label (accuracy 0.39 against 0.98). The kernel "linear"
    # centres dense features on their training mean, so a move of the
    # features moves nothing: the same fit, to rounding, at any offset.
    X, y = make_sequences(60, n_classes=3, n_features=8, random_state=0)
    X_train, y_train, X_test, y_test = X[:40], y[:40], X[40:], y[40:]
    fits = {}
    for shift in (0.0, 10.0, 1000.0):
        model = GPStructClassifier(random_state=0)
        fits[shift] = model.fit([x + shift for x in X_train], y_train)
        np.testing.assert_allclose(
            model.feature_mean_, np.vstack(X_train).mean(axis=0) + shift
        )
    for shift in (10.0, 1000.0):
        np.testing.assert_allclose(
            fits[shift].kernel_.theta, fits[0.0].kernel_.theta, rtol=1e-6
        )
        np.testing.assert_allclose(fits[shift].q_mu_, fits[0.0].q_mu_, atol=1e-6)
        predicted = fits[shift].predict([x + shift for x in X_test])
        for a, b in zip(predicted, fits[0.0].predict(X_test), strict=True):
            np.testing.assert_array_equal(a, b)
        accuracy = fits[shift].score([x + shift for x in X_test], y_test)
        assert accuracy > 0.9
    # The same features as CSR are active at every token: centred too (of
    # sparse features, the columns active at most tokens are; see
    # test_sparse_columns_active_at_most_tokens_are_centred).
    sparse_fit = GPStructClassifier(max_iter=3, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        sparse_fit.fit([sp.csr_matrix(x) for x in X_train], y_train)
    np.testing.assert_allclose(
        sparse_fit.feature_mean_, np.vstack(X_train).mean(axis=0)
    )


def test_collapse_when_every_feature_is_lone(monkeypatch):
    # No feature active at two tokens: the fit has the bias and one
    # variable per token only, and still gives every feature a posterior.
    calls = count_expansions(monkeypatch)
    X = [
        sp.csr_matrix(np.hstack([np.eye(5), 0.5 * np.eye(5), np.zeros((5, 10))])),
        sp.csr_matrix(np.hstack([np.zeros((5, 10)), np.eye(5), -np.eye(5)])),
    ]
    y = [np.array([0, 1, 0, 1, 0]), np.array([1, 1, 0, 0, 1])]
    model = GPStructClassifier(**FAST).fit(X, y)
    assert calls == [10 + 1]
    assert model.q_mu_.shape == (1, 2, 21)
    assert np.all(np.isfinite(model.q_mu_)) and np.all(model.q_sqrt_ > 0)
    # The features of one token share its variable: a token's two features
    # get means in the ratio of their values (a_j = x_j c_j / sigma_t, one
    # prior variance here).
    np.testing.assert_allclose(
        model.q_mu_[..., 5:10], 0.5 * model.q_mu_[..., 0:5], rtol=1e-12
    )


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"n_sequences": 0}, r"n_sequences must be an integer >= 1"),
        ({"n_sequences": True}, r"n_sequences must be an integer >= 1"),
        ({"n_classes": 1}, r"n_classes must be an integer >= 2"),
        ({"length_range": (5, 2)}, r"length_range must be two integers"),
        ({"length_range": 5}, r"length_range must be two integers"),
        ({"length_range": (True, True)}, r"length_range must be two integers"),
        ({"stickiness": 1.0}, r"stickiness must be in \[0, 1\)"),
        ({"stickiness": None}, r"stickiness must be in \[0, 1\)"),
        ({"noise": np.nan}, r"noise must be a finite number >= 0"),
        ({"noise": -1.0}, r"noise must be a finite number >= 0"),
        ({"noise": "a"}, r"noise must be a finite number >= 0"),
        # Dense features for sparse="no"; NumPy's messages, one a TypeError.
        ({"sparse": "no"}, r"sparse must be True or False, got 'no'"),
        ({"random_state": -1}, r"random_state must be None, a non-negative int"),
        ({"random_state": "seed"}, r"random_state must be None, a non-negative"),
    ],
    ids=lambda v: re.sub(r"\W+", "-", repr(v)).strip("-"),
)
def test_make_sequences_checks_its_arguments(params, message):
    # NaN or negative noise gave NaN features; the others raised TypeErrors.
    with pytest.raises(ValueError, match=message):
        make_sequences(**{"n_sequences": 3, **params})


def test_fit_refuses_features_beyond_single_precision_before_it_starts(data):
    # Features so large that the single-precision samples overflow: the
    # optimiser said "not finite at x0" (later explained as "X's values may
    # be too large"); now refused before the fit, naming X.
    X, y, _, _ = data
    with pytest.raises(ValueError, match=r"X's largest magnitude must lie within "
                       r"1e-32 and 1e\+32, got 1e\+100 \(the fit samples in "
                       r"single precision\)"):
        GPStructClassifier(**FAST).fit([1e100 * x for x in X], y)


def test_prediction_of_features_far_off_the_training_scale_names_x(data):
    # predict gave the chain's "unary and pairwise are too large" (arrays
    # the user never saw); predict_marginals names X too.
    X, y, _, _ = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = GPStructClassifier(**FAST).fit(X, y)
    # The fit's bound, for both decoders: Viterbi took up to about 1e200
    # (float64 mean potentials), the marginals refused from 1e40.
    for scale in (1e300, 1e40):
        for predict in (model.predict, model.predict_marginals):
            with pytest.raises(ValueError, match=r"X's largest magnitude must be "
                               r"at most 1e\+32, as in fit, got [0-9.]+e\+"):
                predict([scale * x for x in X[:2]])
    # Marginals are probabilities: normalising the average can give 1 + ulp.
    marginals = np.concatenate(model.predict_marginals(X))
    assert marginals.max() <= 1.0 and marginals.min() >= 0.0
    # Below that bound, potentials the chain cannot take (a kernel of huge
    # variance) are refused naming X, not the chain's arrays.
    offsets = np.array([0, 2])
    X_c = np.array([[1e30], [2.0]])
    for unary, kind in ((np.array([[1e301, 0.0], [0.0, 0.0]]), "mean"),
                        (np.array([[np.inf, 0.0], [0.0, 0.0]]), "sampled")):
        with pytest.raises(ValueError, match=rf"X's values are too large for the "
                           rf"fitted model: its {kind} potentials overflow "
                           r"\(largest \|x\| in this part of X = 1e\+30\)"):
            estimator_module._check_potentials(unary, np.zeros((2, 2)), offsets,
                                               X_c, kind)


def test_hyperparameters_that_end_at_a_bound_are_reported():
    # Features 1e15 times too large drove the variance to its lower bound in
    # silence (the predictions survive; a smaller scale would not).
    from skgpstruct._estimator import _warn_at_bounds
    from skgpstruct.kernels import LinearKernel

    with pytest.warns(ConvergenceWarning, match=r"ended at a bound of their range: "
                      r"variance = 1e-05 \(its lower bound\)"):
        _warn_at_bounds(LinearKernel(variance=1e-5, bias=1.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_at_bounds(LinearKernel(variance=1e-3, bias=1.0))
        _warn_at_bounds(LinearKernel(variance_bounds="fixed", bias_bounds="fixed"))
        _warn_at_bounds(None, 1e-3)
    # The learned pairwise prior variance too (it ended at 1e-4 silently),
    # with its own advice (its range is fixed).
    with pytest.warns(ConvergenceWarning, match=r"pairwise_prior_variance = 0.0001 "
                      r"\(its lower bound\)\. The pairwise prior variance's range "
                      r"is fixed \(give it with learn_hyperparameters=False"):
        _warn_at_bounds(None, 1e-4)


@pytest.mark.parametrize("start", [1e-6, 0.99e-4, 1.01e4, 1e6])
def test_a_learned_pairwise_prior_variance_starts_inside_its_range(start):
    # Outside [1e-4, 1e4] it was clipped in silence and ended on the bound.
    X, y = make_sequences(n_sequences=5, random_state=0)
    model = GPStructClassifier(pairwise_prior_variance=start, max_iter=2)
    with pytest.raises(ValueError, match=r"pairwise_prior_variance must lie in "
                       r"\[0.0001, 10000\].*learn_hyperparameters=True; got"):
        model.fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.set_params(learn_hyperparameters=False).fit(X, y)
        assert model.pairwise_prior_variance_ == start
        # Unused by a warm start (which continues from the fitted value).
        model.set_params(learn_hyperparameters=True, warm_start=True).fit(X, y)


def test_a_pairwise_prior_variance_learned_on_its_bound_is_given_back():
    # Transitions carry every label (they alternate; the features say
    # nothing): the variance ends on its upper bound, which the smooth box
    # approaches without reaching (the fit stops on its tol within 1e-3 of
    # it), or, given back, 1e4 or by rounding just above it
    # (exp(log(1e4))), which the range check refused, as the ESS error and
    # the user guide advise. A warm start
    # from that bound continues there (a margin moved it inside and the
    # ELBO fell), a fresh fit from it starts inside and comes back.
    rng = np.random.default_rng(0)
    X = [rng.standard_normal((12, 3)) for _ in range(30)]
    y = [np.arange(12) % 2 for _ in range(30)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = GPStructClassifier(random_state=0, max_iter=200).fit(X, y)
        learned = model.pairwise_prior_variance_
        assert learned == pytest.approx(1e4, rel=1e-3)
        model.set_params(warm_start=True, max_iter=1).fit(X, y)
        assert model.elbo_history_[-1] >= model.elbo_history_[-2] - 1e-9
        for given in (learned, 1e4 * (1 + 1e-15), 1e-4):
            again = GPStructClassifier(
                random_state=0, max_iter=200, pairwise_prior_variance=given,
            ).fit(X, y)
            if given > 1.0:
                assert again.pairwise_prior_variance_ == pytest.approx(1e4, rel=1e-3)
            else:  # off the bound it started on (another optimum: 1.2e-4)
                assert again.pairwise_prior_variance_ > 1e-4 * np.exp(0.1)


def test_a_hyperparameter_started_on_its_bound_is_learned():
    # The smooth box moved a start on a bound 1e-8 inside, where its slope
    # is 1e-8: the variance stayed at 0.5 (and the bound warning blamed the
    # features); from 0.6 the fit learned 2.43.
    from skgpstruct.kernels import LinearKernel

    X, y = make_sequences(n_sequences=20, n_features=4, length_range=(5, 12),
                          random_state=0)
    learned = {}
    for start in (0.5, 0.6):
        kernel = LinearKernel(variance=start, variance_bounds=(0.5, 100.0))
        model = GPStructClassifier(kernel=kernel, max_iter=100, random_state=0,
                                   hyperprior_scale=None)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ConvergenceWarning)
            model.fit(X, y)
        learned[start] = model.kernel_.variance
    assert learned[0.5] > 1.0 and learned[0.6] > 1.0


def test_linear_fit_of_small_features_does_not_depend_on_their_scale():
    # Features 1e-4 times smaller gave a fit that predicts one label (the
    # kernel started with ~1e-8 of its prior variance on them, its bounds
    # absolute). Below a mean squared norm of 1 the start and the bounds
    # now move with the scale: the fit is the same model at any scale.
    X, y = make_sequences(n_sequences=20, random_state=0)
    models = {}
    for scale in (1e-2, 1e-6):
        Xs = [x * scale for x in X]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            models[scale] = GPStructClassifier(random_state=0).fit(Xs, y)
        assert models[scale].score(Xs, y) > 0.95
    small, smaller = models[1e-2], models[1e-6]
    np.testing.assert_allclose(small.kernel_.variance * 1e-4,
                               smaller.kernel_.variance * 1e-12, rtol=1e-5)
    predicted = [
        model.predict([x * scale for x in X[:5]]) for scale, model in models.items()
    ]
    for a, b in zip(*predicted, strict=True):
        np.testing.assert_array_equal(a, b)


def record_decoded_potentials(monkeypatch):
    """A list that receives the (unary, pairwise) samples of every
    forward-backward call of predict_marginals, in call order."""
    decoded = []
    forward_backward = estimator_module.chain._forward_backward

    def recorded(unary, pairwise, offsets, with_marginals, with_pairs=True):
        decoded.append((unary.copy(), pairwise.copy()))
        return forward_backward(unary, pairwise, offsets, with_marginals, with_pairs)

    monkeypatch.setattr(estimator_module.chain, "_forward_backward", recorded)
    return decoded


@pytest.mark.parametrize("design", ["stacked", "per-row", "full"])
def test_predict_marginals_draws_antithetic_pairs_about_the_mean(
    design, lone_data, monkeypatch
):
    # predict_marginals averages its samples in antithetic pairs: samples
    # 2i and 2i + 1 of a sequence mirror each other about the posterior
    # mean of the potentials, which predict computes by its own sparse
    # product (_mean_potentials). Every noise source is negated in a pair's
    # second sample: the stacked rows and lone features (stacked), the
    # inducing draws (per-row), weights at their prior (a column no training
    # token had: inserted into the design with diagonal covariances, drawn
    # apart with full ones), and with pairwise_uncertainty the transitions.
    X, y, X_test, _ = lone_data
    options = dict(FAST, n_predict_samples=6, pairwise_uncertainty=True)
    if design == "full":
        X = [x[:, :N_FEATURES] for x in X]
        X_test = [x[:, :N_FEATURES] for x in X_test]
        X, _ = spread_columns(X, 40)
        X_test, _ = spread_columns(X_test, 40)
        options.update(covariance="full", inducing="features")
    model = GPStructClassifier(**options).fit(X, y)
    unseen = np.setdiff1d(np.arange(model.n_features_in_), model.inducing_.columns)
    X_new = []
    for x in X_test[:4]:
        x = sp.lil_matrix(x)
        x[:, unseen[0]] = 1.0
        X_new.append(x.tocsr())
    if design == "per-row":  # (the sampling design is a new InducingFeatures)
        monkeypatch.setattr(
            InducingFeatures, "stacked_projection", lambda self, state, layout: None
        )
    decoded = record_decoded_potentials(monkeypatch)
    model.predict_marginals(X_new)
    assert len(decoded) == 1  # one chunk, one component, all samples at once
    unary, pairwise = decoded[0]
    mean = model._mean_potentials(centred_as_fitted(model, X_new))
    assert unary.shape == (6,) + mean.shape
    tolerance = 1e-4 * (1 + np.abs(unary).max())  # (stacked: single precision)
    np.testing.assert_allclose(
        unary[1::2], 2 * mean - unary[::2], rtol=0, atol=tolerance
    )
    # the pairs are draws, not the mean itself
    assert np.abs(unary[::2] - mean).max() > 100 * tolerance
    np.testing.assert_allclose(
        pairwise[1::2], 2 * model.pairwise_mean_ - pairwise[::2], atol=1e-12
    )
    assert np.abs(pairwise[::2] - model.pairwise_mean_).max() > 1e-3


def test_blocks_of_samples_keep_the_unary_and_transition_pairs_together(
    data, fitted, monkeypatch
):
    # A sequence sampled in blocks draws its unary pairs block by block,
    # and the transitions' pairs come from one draw of all the samples:
    # every block starts at an even sample, so a pair of unary samples is
    # decoded with a pair of transitions (5 samples: blocks of 2, 2 and 1,
    # the last unpaired).
    _, _, X_test, _ = data
    model = copy.deepcopy(fitted).set_params(
        n_predict_samples=5, pairwise_uncertainty=True
    )
    X = list(X_test[:2])
    V = len(model.classes_)
    budget = 8 * V * min(len(x) for x in X) * 3  # 3 samples: blocks of 2
    monkeypatch.setattr(estimator_module, "PREDICT_SAMPLE_BYTES", budget)
    decoded = record_decoded_potentials(monkeypatch)
    model.predict_marginals(X)
    assert [len(u) for u, _ in decoded] == [2, 2, 1, 2, 2, 1]
    pairwise_mean = model.pairwise_mean_
    for sequence in (decoded[:3], decoded[3:]):
        # a pair's sum is twice the mean: the same for every pair
        sums = [u[0] + u[1] for u, _ in sequence[:2]]
        np.testing.assert_allclose(sums[0], sums[1], rtol=0, atol=1e-4)
        assert np.abs(sequence[0][0][0] - sequence[1][0][0]).max() > 1e-2
        for _, pairwise in sequence[:2]:
            np.testing.assert_allclose(
                pairwise[0] + pairwise[1], 2 * pairwise_mean, atol=1e-12
            )


def test_prediction_leaves_the_callers_sequences_unchanged(lone_data):
    # A chunk of one sequence is that sequence's own matrix (not stacked, not
    # sliced): nothing downstream may write into it. Dense, canonical CSR and
    # CSR with unsorted columns and duplicates, one per call and in a batch.
    X, y, X_test, y_test = lone_data
    model = GPStructClassifier(**FAST).fit(X, y)
    assert hasattr(model, "_collapsed")
    x = X_test[0].tocsr()
    messy = sp.csr_matrix(
        (np.r_[x.data, 0.5], np.r_[x.indices[::-1], x.indices[0]],
         np.r_[x.indptr[:-1], x.indptr[-1] + 1]), shape=x.shape,
    )  # (every row's columns reversed, the last row with a duplicate)
    assert not messy.has_canonical_format
    for given in (x, messy, x.toarray()):
        before = given.copy()
        other = X_test[1] if sp.issparse(given) else X_test[1].toarray()
        for batch in ([given], [given, other]):
            model.predict(batch)
            model.predict_marginals(batch)
            model.score(batch, [y_test[0], y_test[1]][: len(batch)])
        if sp.issparse(given):
            for name in ("data", "indices", "indptr"):
                np.testing.assert_array_equal(
                    getattr(given, name), getattr(before, name)
                )
        else:
            np.testing.assert_array_equal(given, before)


def test_collapsed_sampling_design_without_its_lookup_table(lone_data, monkeypatch):
    # predict_marginals picks the lone columns of a chunk through a lookup
    # table built once per fitted posterior, unless it would exceed
    # COLUMN_LOOKUP_BYTES: then through a binary search, with the same
    # marginals.
    from skgpstruct.inference import inducing as inducing_module

    X, y, X_test, _ = lone_data
    model = GPStructClassifier(**FAST).fit(X, y)
    assert hasattr(model, "_collapsed")
    posterior = model._sampling_posterior(model._params())[2]
    assert posterior.lone_positions is not None
    expected = model.predict_marginals(X_test)
    monkeypatch.setattr(inducing_module, "COLUMN_LOOKUP_BYTES", 0)
    model.__dict__.pop("_sampling_posterior_of")  # (kept per fitted posterior)
    posterior = model._sampling_posterior(model._params())[2]
    assert posterior.lone_positions is None
    for a, b in zip(model.predict_marginals(X_test), expected, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("n_jobs", [0, "2", 2.5])
def test_prediction_checks_n_jobs(data, n_jobs):
    # fit refused these; set after it, "2" and 2.5 were taken by prediction,
    # and 0 failed in joblib from 2,000 tokens on.
    X, y, X_test, _ = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = GPStructClassifier(**FAST).fit(X, y)
    model.set_params(n_jobs=n_jobs)
    for predict in (model.predict, model.predict_marginals):
        with pytest.raises(ValueError, match="n_jobs must be None or a non-zero "
                           "integer"):
            predict(X_test)


def test_make_sequences_has_its_documented_properties():
    X, y = make_sequences(
        n_sequences=400, n_classes=3, n_features=4, length_range=(2, 4),
        stickiness=0.8, random_state=0,
    )
    lengths = [len(labels) for labels in y]
    assert set(lengths) == {2, 3, 4}  # the range is inclusive
    assert all(x.shape == (len(labels), 4) for x, labels in zip(X, y, strict=True))
    # The first labels take every class; a label repeats with probability
    # stickiness + (1 - stickiness) / n_classes = 0.8667.
    assert {labels[0] for labels in y} == {0, 1, 2}
    pairs = np.concatenate([labels[1:] == labels[:-1] for labels in y])
    assert abs(pairs.mean() - (0.8 + 0.2 / 3)) < 0.03
    assert {len(labels) for labels in make_sequences(
        n_sequences=5, length_range=(3, 3), random_state=0)[1]} == {3}
    # Without noise a token's features are its label's: one row per label
    # (to rounding: the product with the rotation may round by the block).
    X, y = make_sequences(n_sequences=50, noise=0.0, stickiness=0.0, random_state=1)
    assert len(np.unique(np.round(np.vstack(X), 10), axis=0)) == 3
    # Sparse: one of each feature's two sign columns at every token, the
    # sign of the dense feature of the same seed.
    dense, _ = make_sequences(n_sequences=20, n_features=5, random_state=2)
    sparse, _ = make_sequences(
        n_sequences=20, n_features=5, sparse=True, random_state=2
    )
    for d, s in zip(dense, sparse, strict=True):
        indicators = s.toarray()
        np.testing.assert_array_equal(indicators[:, :5], d > 0)
        np.testing.assert_array_equal(indicators[:, 5:], ~(d > 0))
