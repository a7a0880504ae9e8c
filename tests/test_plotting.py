"""The plotting displays: the numbers they compute and the artists they draw."""

import builtins
import importlib
import sys

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib", reason="needs matplotlib (plot extra)")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from sklearn.calibration import calibration_curve  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402

from skgpstruct import GPStructClassifier, SequenceDictVectorizer  # noqa: E402
from skgpstruct.datasets import make_sequences  # noqa: E402
from skgpstruct.plotting import (  # noqa: E402
    ELBOTraceDisplay,
    MarginalsDisplay,
    ReliabilityDisplay,
)


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def fitted():
    X, y = make_sequences(n_sequences=20, random_state=0)
    clf = GPStructClassifier(
        n_inducing=20, max_iter=200, tol=1e-3, random_state=0
    ).fit(X, y)
    return clf, X, y


def test_elbo_trace_from_estimator(fitted):
    clf, _, _ = fitted
    _, ax = plt.subplots()
    display = ELBOTraceDisplay.from_estimator(clf, ax=ax)
    assert display.ax_ is ax
    np.testing.assert_array_equal(display.line_.get_ydata(), clf.elbo_history_)
    np.testing.assert_array_equal(
        display.line_.get_xdata(), np.arange(1, len(clf.elbo_history_) + 1)
    )
    assert display.line_.get_label() == "GPStructClassifier"
    assert ax.get_ylabel() == "ELBO"


def test_elbo_trace_refuses_a_history_that_is_not_1d():
    # It failed in plot() with "too many values to unpack".
    with pytest.raises(ValueError, match=r"1-D sequence .* shape \(2, 2\)"):
        ELBOTraceDisplay([[1.0, 2.0], [3.0, 4.0]])


def test_elbo_trace_refuses_empty_or_non_finite_histories():
    # An empty history drew empty axes; NaN and inf were drawn as gaps.
    for bad, message in [([], "non-empty"), ([1.0, np.nan], "NaN or infinite"),
                         ([1.0, -np.inf], "NaN or infinite"),
                         (["a"], "sequence of numbers")]:
        with pytest.raises(ValueError, match=message):
            ELBOTraceDisplay(bad)


def test_elbo_trace_from_estimator_errors():
    from sklearn.exceptions import NotFittedError
    from sklearn.linear_model import LogisticRegression

    # scikit-learn's error for an unfitted estimator (it was a ValueError)
    with pytest.raises(NotFittedError):
        ELBOTraceDisplay.from_estimator(GPStructClassifier())
    # A fitted ESS model was told to "fit it first".
    X, y = make_sequences(n_sequences=6, random_state=0)
    ess = GPStructClassifier(inference="ess", ess_n_iter=20, ess_thin=1,
                             learn_hyperparameters=False, random_state=0).fit(X, y)
    with pytest.raises(ValueError, match="inference='ess' fit has no ELBO .*"
                       "log_likelihood_history_"):
        ELBOTraceDisplay.from_estimator(ess)
    other = LogisticRegression().fit(np.vstack(X), np.concatenate(y))
    with pytest.raises(ValueError, match="needs a fitted GPStructClassifier"):
        ELBOTraceDisplay.from_estimator(other)


def test_a_label_keyword_names_the_line():
    # plot(label=...) collided with the label the display sets (TypeError:
    # got multiple values for keyword argument 'label').
    display = ELBOTraceDisplay([1.0, 2.0], estimator_name="GP").plot(label="mine")
    assert display.line_.get_label() == "mine"
    display = ReliabilityDisplay([0.3, 0.7], [0.0, 1.0], [2, 2], 0.3).plot(
        label="mine"
    )
    assert display.line_.get_label() == "mine"
    # Everything after the data is keyword-only, as scikit-learn's displays.
    y, m = [np.array([0, 1])], [np.array([[0.6, 0.4], [0.2, 0.8]])]
    with pytest.raises(TypeError, match="positional"):
        ReliabilityDisplay.from_predictions(y, m, [0, 1], 5)


def test_marginals_from_estimator(fitted):
    clf, X, y = fitted
    tokens = [f"w{t}" for t in range(len(X[1]))]
    display = MarginalsDisplay.from_estimator(clf, X[1], tokens=tokens, y_true=y[1])
    expected = clf.predict_marginals([X[1]])[0]
    np.testing.assert_allclose(display.image_.get_array(), expected.T)
    ax = display.ax_
    assert [t.get_text() for t in ax.get_xticklabels()] == tokens
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        str(c) for c in clf.classes_
    ]
    # True labels are marked at their class row.
    rows = np.searchsorted(clf.classes_, y[1])
    np.testing.assert_array_equal(display.true_labels_.get_ydata(), rows)
    np.testing.assert_array_equal(
        display.true_labels_.get_xdata(), np.arange(len(rows))
    )
    assert display.colorbar_ is not None
    # Each cell's text is its probability, at (token, label).
    texts = {(round(t.get_position()[0]), round(t.get_position()[1])): t.get_text()
             for t in ax.texts}
    assert len(texts) == expected.size
    for (t, j), text in texts.items():
        p = expected[t, j]
        assert text == (f"{p:.2f}".lstrip("0") if p < 1 else "1"), (t, j)


def test_marginals_unknown_true_label_is_not_marked_with_a_warning():
    # A test sequence may hold a label the model never saw: the map is
    # drawn, that token has no marker, and the warning says so.
    with pytest.warns(UserWarning, match=r"1 token\(s\) with labels not in "
                      r"classes \(\['z'\]\): they have no row"):
        display = MarginalsDisplay(
            np.ones((3, 2)) / 2, ["a", "b"], y_true=["a", "z", "b"]
        ).plot()
    np.testing.assert_array_equal(display.true_labels_.get_ydata(), [0, np.nan, 1])


def test_unknown_label_warnings_point_at_the_caller(fitted):
    # from_estimator's pointed into plotting.py (the constructor it calls).
    clf, X, y = fitted
    unknown = np.r_[y[0][:-1], 99]
    half, ab = np.full((3, 2), 0.5), ["a", "b"]
    calls = [
        lambda: MarginalsDisplay(half, ab, y_true=["a", "z", "b"]),
        lambda: ReliabilityDisplay.from_predictions([["a", "z", "b"]], [half], ab),
        lambda: MarginalsDisplay.from_estimator(clf, X[0], y_true=unknown),
    ]
    for call in calls:
        with pytest.warns(UserWarning, match="labels not in classes") as record:
            call()
        assert [w.filename for w in record] == [__file__]


def test_marginals_through_pipeline():
    rng = np.random.default_rng(0)
    words = ["the", "cat", "sat", "on", "mat"]
    X = [[{"w": words[i]} for i in rng.integers(5, size=6)] for _ in range(12)]
    y = [["D" if tok["w"] == "the" else "N" for tok in seq] for seq in X]
    pipe = make_pipeline(
        SequenceDictVectorizer(),
        GPStructClassifier(max_iter=200, tol=1e-3, random_state=0),
    ).fit(X, y)
    display = MarginalsDisplay.from_estimator(pipe, X[0], colorbar=False)
    expected = pipe[-1].predict_marginals(pipe[:-1].transform([X[0]]))[0]
    np.testing.assert_allclose(display.image_.get_array(), expected.T)
    assert display.colorbar_ is None


def test_marginals_shape_checks():
    with pytest.raises(ValueError, match="column per class"):
        MarginalsDisplay(np.ones((3, 2)), ["a", "b", "c"])
    with pytest.raises(ValueError, match="tokens has 2 entries"):
        MarginalsDisplay(np.ones((3, 2)) / 2, ["a", "b"], tokens=["x", "y"])
    # Accepted before: NaN or out-of-range values drawn as colours, labels
    # outside classes drawn nowhere; a string of classes gave an IndexError.
    for bad in (np.full((3, 2), np.nan), np.full((3, 2), 1.5), -np.ones((3, 2))):
        with pytest.raises(ValueError, match=r"probabilities in \[0, 1\]"):
            MarginalsDisplay(bad, ["a", "b"])
    with pytest.raises(ValueError, match="no label of y_true is one of classes"):
        MarginalsDisplay(np.ones((3, 2)) / 2, ["a", "b"], y_true=[0, 1, 0])
    with pytest.raises(ValueError, match="1-D array of distinct labels"):
        MarginalsDisplay(np.ones((3, 1)), "A")
    # Were an IndexError, NumPy's 'inhomogeneous shape' and an empty map.
    with pytest.raises(ValueError, match="y_true must be a 1-D sequence"):
        MarginalsDisplay(np.array([[0.9, 0.1]]), ["A", "B"], y_true="A")
    with pytest.raises(ValueError, match="marginals must be a rectangular array"):
        MarginalsDisplay([[0.9, 0.1], [0.5]], ["A", "B"])
    with pytest.raises(ValueError, match="marginals has no tokens"):
        MarginalsDisplay(np.empty((0, 2)), ["A", "B"])
    with pytest.raises(ValueError, match="1-D array of distinct labels"):
        MarginalsDisplay(np.ones((2, 2)) / 2, ["a", None])  # was a TypeError


def _hand_reliability(y_true, marginals, classes, n_bins):
    """Plain-loop reference: bins, frequencies and ECE over (token, label)."""
    pairs = []
    for labels, probs in zip(y_true, marginals, strict=True):
        for t, label in enumerate(labels):
            for j, c in enumerate(classes):
                pairs.append((probs[t][j], 1.0 if label == c else 0.0))
    bins = [[] for _ in range(n_bins)]
    for p, o in pairs:
        b = 0
        while b < n_bins - 1 and p > (b + 1) / n_bins:
            b += 1
        bins[b].append((p, o))
    pred, true, counts, ece = [], [], [], 0.0
    for members in bins:
        if not members:
            continue
        mp = sum(p for p, _ in members) / len(members)
        mo = sum(o for _, o in members) / len(members)
        pred.append(mp)
        true.append(mo)
        counts.append(len(members))
        ece += len(members) / len(pairs) * abs(mo - mp)
    return pred, true, counts, ece


def test_reliability_against_hand_computation():
    rng = np.random.default_rng(1)
    classes = np.array(["B", "I", "O"])
    lengths = [4, 7, 1, 5]
    marginals = [rng.dirichlet(np.ones(3) * 0.7, size=n) for n in lengths]
    y_true = [rng.choice(classes, size=n) for n in lengths]
    display = ReliabilityDisplay.from_predictions(
        y_true, marginals, classes, n_bins=5, name="GP"
    )
    pred, true, counts, ece = _hand_reliability(y_true, marginals, classes, 5)
    np.testing.assert_allclose(display.prob_pred, pred)
    np.testing.assert_allclose(display.prob_true, true)
    np.testing.assert_array_equal(display.bin_counts, counts)
    assert display.ece == pytest.approx(ece)
    # The drawn curve is the computed one, and the legend carries the ECE.
    np.testing.assert_allclose(display.line_.get_xdata(), pred)
    np.testing.assert_allclose(display.line_.get_ydata(), true)
    assert display.line_.get_label() == f"GP (ECE = {ece:.3f})"
    # Same bins as scikit-learn's calibration_curve on the flattened pairs.
    flat_p = np.concatenate(marginals).ravel()
    flat_o = (np.concatenate(y_true)[:, None] == classes[None, :]).ravel()
    sk_true, sk_pred = calibration_curve(flat_o, flat_p, n_bins=5)
    np.testing.assert_allclose(display.prob_true, sk_true)
    np.testing.assert_allclose(display.prob_pred, sk_pred)


def test_reliability_perfect_and_flat_inputs():
    # One-hot marginals that are always right: two bins, zero error.
    y = np.array([0, 1, 1, 0])
    probs = np.eye(2)[y]
    display = ReliabilityDisplay.from_predictions(y, probs, classes=[0, 1])
    assert display.ece == 0.0
    np.testing.assert_array_equal(display.prob_true, [0.0, 1.0])
    np.testing.assert_array_equal(display.bin_counts, [4, 4])


def test_reliability_shares_axes():
    _, ax = plt.subplots()
    y = [np.array([0, 1])]
    m = [np.array([[0.6, 0.4], [0.2, 0.8]])]
    ReliabilityDisplay.from_predictions(y, m, [0, 1], ax=ax, name="a")
    ReliabilityDisplay.from_predictions(y, m, [0, 1], ax=ax, name="b")
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels.count("perfectly calibrated") == 1
    assert len(labels) == 3


def test_reliability_input_checks():
    with pytest.raises(ValueError, match="n_bins"):
        ReliabilityDisplay.from_predictions([[0]], [np.ones((1, 1))], [0], n_bins=0)
    with pytest.raises(ValueError, match="2 sequences"):
        ReliabilityDisplay.from_predictions([[0], [1]], [np.ones((1, 2)) / 2], [0, 1])
    with pytest.raises(ValueError, match="probabilities"):
        ReliabilityDisplay.from_predictions([[0]], [np.array([[1.5, -0.5]])], [0, 1])
    # A transposed sequence (its values were reshaped into other tokens'),
    # labels outside classes (counted as outcome 0) and repeated classes.
    marginals = np.array([[0.8, 0.2], [0.3, 0.7], [0.9, 0.1], [0.4, 0.6]])
    with pytest.raises(ValueError, match=r"marginals\[0\] must have shape .*"
                       r"\(4, 2\), got \(2, 4\)"):
        ReliabilityDisplay.from_predictions([[0, 1, 0, 1]], [marginals.T], [0, 1])
    # Labels outside classes (a label never seen in training, such as
    # chunking's B-CONJP) are outcomes of 0 in every column, with a warning
    # (refused, they made the display unusable on two of the CRF++ test
    # sets); none among classes is a mismatch of kinds.
    with pytest.warns(UserWarning, match=r"1 token\(s\) with labels not in "
                      r"classes \(\['Z'\]\): they are counted as outcomes of 0"):
        unknown = ReliabilityDisplay.from_predictions(
            [["Z", "a"]], [marginals[:2]], ["a", "b"], n_bins=10
        )
    flat_p = marginals[:2].ravel()
    flat_o = np.array([0, 0, 1, 0])  # Z: no column; a: column 0
    sk_true, sk_pred = calibration_curve(flat_o, flat_p, n_bins=10)
    np.testing.assert_allclose(unknown.prob_true, sk_true)
    np.testing.assert_allclose(unknown.prob_pred, sk_pred)
    with pytest.raises(ValueError, match="no label of y_true is one of classes"):
        ReliabilityDisplay.from_predictions([[0, 1]], [marginals[:2]], ["a", "b"])
    with pytest.raises(ValueError, match="distinct labels"):
        ReliabilityDisplay.from_predictions([[0, 1]], [marginals[:2]], [0, 0])
    with pytest.raises(ValueError, match="n_bins must be an integer"):
        ReliabilityDisplay.from_predictions([[0]], [np.ones((1, 1))], [0], n_bins=True)
    # Per-sequence marginals with flat labels ('zero-dimensional arrays
    # cannot be concatenated').
    with pytest.raises(ValueError, match=r"y_true\[0\] must be the labels of "
                       "sequence 0, got 'a'"):
        ReliabilityDisplay.from_predictions(
            ["a", "b"], [marginals[:1], marginals[1:2]], ["a", "b"]
        )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (([0.1, 0.5], [0.2], [1, 2], 0.1), "1-D arrays of one length"),
        (([[0.1]], [[0.2]], [[1]], 0.1), "1-D arrays of one length"),
        (([np.nan], [0.2], [1], 0.1), "prob_pred contains NaN"),
        (([0.1], [1.2], [1], 0.1), r"prob_true must hold probabilities in \[0, 1\]"),
        (([0.1], [0.2], [1.7], 0.1), "bin_counts must hold non-negative integers"),
        (([0.1], [0.2], [-1], 0.1), "bin_counts must hold non-negative integers"),
        (([0.1], [0.2], [1], np.nan), r"ece must be a number in \[0, 1\]"),
    ],
)
def test_reliability_constructor_checks_its_arrays(args, message):
    # It checked nothing: matplotlib's shape error, NaN legends, 1.7 -> 1.
    with pytest.raises(ValueError, match=message):
        ReliabilityDisplay(*args)


def test_marginals_from_estimator_takes_one_sequence(fitted):
    clf, X, _ = fitted
    # NumPy's 'inhomogeneous shape' named neither X_seq nor the slip.
    with pytest.raises(ValueError, match=r"X_seq must be one sequence, got a "
                       r"list of 2 matrices: pass X\[i\], not X\[i:j\]"):
        MarginalsDisplay.from_estimator(clf, X[:2])


def test_reliability_of_stacked_marginals_takes_per_sequence_labels():
    # One (n_tokens, n_classes) array with labels given per sequence, as
    # predict returns them: the labels are concatenated (the message said
    # "y_true has 4 tokens but marginals has 4"; ragged ones gave NumPy's
    # 'inhomogeneous shape').
    marginals = np.array([[0.8, 0.2], [0.3, 0.7], [0.9, 0.1], [0.4, 0.6]])
    flat = ReliabilityDisplay.from_predictions(["a", "b", "a", "b"], marginals,
                                               ["a", "b"])
    for nested in ([["a", "b"], ["a", "b"]], [["a", "b", "a"], ["b"]]):
        display = ReliabilityDisplay.from_predictions(nested, marginals, ["a", "b"])
        assert display.ece == flat.ece
    with pytest.raises(ValueError, match="y_true has 3 tokens but marginals has 4"):
        ReliabilityDisplay.from_predictions([["a", "b"], ["a"]], marginals,
                                            ["a", "b"])


def test_missing_matplotlib_message(monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    for name in [m for m in sys.modules if m.startswith("matplotlib")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(builtins, "__import__", fake_import)
    plotting = importlib.reload(importlib.import_module("skgpstruct.plotting"))
    with pytest.raises(ImportError, match=r"skgpstruct\[plot\]"):
        plotting.ELBOTraceDisplay([1.0, 2.0]).plot()
