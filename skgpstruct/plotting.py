"""Plots of a fitted tagger, in the manner of scikit-learn's ``Display`` objects.

Each display holds the numbers it draws (computed once, kept as attributes)
and a :meth:`plot` method that draws them on a Matplotlib axes; the class
methods ``from_estimator`` / ``from_predictions`` compute the numbers and
plot in one call. After plotting, ``ax_`` and ``figure_`` hold the axes and
figure, and the artists are kept (``line_``, ``image_``...) so that a test
or a user can read what was drawn.

:class:`ELBOTraceDisplay`
    The evidence lower bound after every optimiser iteration
    (``elbo_history_``).
:class:`MarginalsDisplay`
    A heat map of :meth:`~skgpstruct.GPStructClassifier.predict_marginals`
    for one sequence: tokens along the horizontal axis, classes along the
    vertical one.
:class:`ReliabilityDisplay`
    A reliability (calibration) diagram of per-token marginals over all
    tokens and all labels, with the expected calibration error.

Matplotlib is an optional dependency (the ``plot`` extra:
``pip install "skgpstruct[plot]"``); it is imported only when a plot is
drawn, so this module imports without it.
"""

import warnings

import numpy as np

from ._checks import check_integer, outside_stacklevel

__all__ = ["ELBOTraceDisplay", "MarginalsDisplay", "ReliabilityDisplay"]


def _pyplot():
    """Import and return ``matplotlib.pyplot``, or explain how to install it."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError(
            "skgpstruct.plotting needs matplotlib, which is not installed; "
            'install the plot extra: pip install "skgpstruct[plot]" (or pip '
            "install matplotlib)"
        ) from exc
    return plt


def _get_ax(ax):
    plt = _pyplot()
    if ax is None:
        _, ax = plt.subplots()
    return ax


def _estimator_name(estimator):
    last = estimator.steps[-1][1] if hasattr(estimator, "steps") else estimator
    return type(last).__name__


def _predict_marginals(estimator, X):
    """``predict_marginals`` of an estimator, or of a Pipeline ending in one.

    A scikit-learn Pipeline does not forward ``predict_marginals``: the
    sequences go through every step but the last, then to the last one.
    """
    if hasattr(estimator, "predict_marginals"):
        return estimator.predict_marginals(X)
    if hasattr(estimator, "steps"):
        last = estimator.steps[-1][1]
        if hasattr(last, "predict_marginals"):
            return last.predict_marginals(estimator[:-1].transform(X))
    raise TypeError(
        f"{type(estimator).__name__} has no predict_marginals method; pass a "
        "fitted GPStructClassifier or a Pipeline that ends with one"
    )


def _last_step(estimator):
    return estimator.steps[-1][1] if hasattr(estimator, "steps") else estimator


# ---------------------------------------------------------------------- #
class ELBOTraceDisplay:
    """The evidence lower bound after every iteration of a fit.

    Use :meth:`from_estimator` to build it from a fitted estimator; the
    constructor takes the numbers directly.

    Parameters
    ----------
    elbo_history : array-like of shape (n_iter,)
        ELBO after every iteration, as in ``elbo_history_``.
    estimator_name : str or None, default=None
        Used as the line's label.

    Attributes
    ----------
    line_ : matplotlib.lines.Line2D
        The ELBO trace (after :meth:`plot`).
    ax_ : matplotlib.axes.Axes
    figure_ : matplotlib.figure.Figure

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from skgpstruct.plotting import ELBOTraceDisplay
    >>> display = ELBOTraceDisplay([-50.0, -20.0, -12.0, -11.5]).plot()
    >>> display.line_.get_ydata().tolist()
    [-50.0, -20.0, -12.0, -11.5]
    """

    def __init__(self, elbo_history, *, estimator_name=None):
        try:
            history = np.asarray(elbo_history, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(
                "elbo_history must be a 1-D sequence of numbers (one per "
                f"iteration), got {elbo_history!r:.200}"
            ) from None
        if history.ndim != 1 or history.size == 0:
            raise ValueError(
                "elbo_history must be a non-empty 1-D sequence of values (one "
                f"per iteration), got an array of shape {history.shape}"
            )
        if not np.all(np.isfinite(history)):
            raise ValueError("elbo_history contains NaN or infinite values")
        self.elbo_history = history
        self.estimator_name = estimator_name

    def plot(self, ax=None, *, name=None, **kwargs):
        """Draw the ELBO against the iteration number.

        Parameters
        ----------
        ax : matplotlib.axes.Axes or None, default=None
            Axes to draw on; None creates a new figure.
        name : str or None, default=None
            Label of the line; defaults to ``estimator_name``.
        **kwargs : dict
            Passed to :meth:`matplotlib.axes.Axes.plot` (a ``label`` there
            overrides ``name``).

        Returns
        -------
        display : ELBOTraceDisplay
            This object, with ``line_``, ``ax_`` and ``figure_`` set.
        """
        ax = _get_ax(ax)
        name = self.estimator_name if name is None else name
        iterations = np.arange(1, self.elbo_history.shape[0] + 1)
        kwargs.setdefault("marker", "." if iterations.size <= 60 else None)
        kwargs.setdefault("label", name)
        (self.line_,) = ax.plot(iterations, self.elbo_history, **kwargs)
        ax.set_xlabel("iteration")
        ax.set_ylabel("ELBO")
        ax.set_title("Evidence lower bound during the fit")
        if kwargs["label"] is not None:
            ax.legend(loc="lower right")
        self.ax_ = ax
        self.figure_ = ax.figure
        return self

    @classmethod
    def from_estimator(cls, estimator, *, ax=None, name=None, **kwargs):
        """Plot the ELBO trace of a fitted estimator.

        Parameters
        ----------
        estimator : GPStructClassifier or Pipeline
            Fitted; a Pipeline is read through its last step.
        ax : matplotlib.axes.Axes or None, default=None
            Axes to draw on; None creates a new figure.
        name : str or None, default=None
            Label of the line; defaults to the estimator's class name.
        **kwargs : dict
            Passed to :meth:`matplotlib.axes.Axes.plot`.

        Returns
        -------
        display : ELBOTraceDisplay

        Examples
        --------
        >>> import matplotlib
        >>> matplotlib.use("Agg")
        >>> from skgpstruct import GPStructClassifier
        >>> from skgpstruct.datasets import make_sequences
        >>> from skgpstruct.plotting import ELBOTraceDisplay
        >>> X, y = make_sequences(n_sequences=20, random_state=0)
        >>> clf = GPStructClassifier(n_inducing=20, max_iter=200, tol=1e-3,
        ...                          random_state=0).fit(X, y)
        >>> display = ELBOTraceDisplay.from_estimator(clf)
        >>> len(display.line_.get_xdata()) == clf.n_iter_
        True
        """
        from sklearn.utils.validation import check_is_fitted

        last = _last_step(estimator)
        check_is_fitted(last)
        if not hasattr(last, "elbo_history_"):
            if getattr(last, "inference", None) == "ess":
                raise ValueError(
                    "an inference='ess' fit has no ELBO (it samples the "
                    "posterior); its trace is log_likelihood_history_"
                )
            raise ValueError(
                f"{type(last).__name__} has no elbo_history_: ELBOTraceDisplay "
                "needs a fitted GPStructClassifier (variational inference)"
            )
        display = cls(
            last.elbo_history_,
            estimator_name=_estimator_name(estimator) if name is None else name,
        )
        return display.plot(ax=ax, **kwargs)


# ---------------------------------------------------------------------- #
class MarginalsDisplay:
    """Heat map of the per-token label marginals of one sequence.

    Tokens run along the horizontal axis and classes along the vertical one;
    cell ``(j, t)`` shows ``p(y_t = classes[j] | x)``. Optionally the true
    labels are marked with hollow red circles.

    Parameters
    ----------
    marginals : array-like of shape (n_tokens, n_classes)
        One sequence's marginals, e.g. ``predict_marginals([X_seq])[0]``.
    classes : array-like of shape (n_classes,)
        Column labels of ``marginals`` (``classes_`` of the estimator).
    tokens : list of str or None, default=None
        Text of every token, for the tick labels; None numbers them.
    y_true : array-like of shape (n_tokens,) or None, default=None
        True labels, marked on the map when given.

    Attributes
    ----------
    image_ : matplotlib.image.AxesImage
        The heat map; ``image_.get_array()`` is ``marginals.T``.
    colorbar_ : matplotlib.colorbar.Colorbar or None
    true_labels_ : matplotlib.lines.Line2D or None
        Markers of the true labels, when ``y_true`` was given.
    ax_ : matplotlib.axes.Axes
    figure_ : matplotlib.figure.Figure

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import numpy as np
    >>> from skgpstruct.plotting import MarginalsDisplay
    >>> marginals = np.array([[0.9, 0.1], [0.3, 0.7], [0.2, 0.8]])
    >>> display = MarginalsDisplay(marginals, ["B-NP", "I-NP"],
    ...                            tokens=["the", "big", "cat"]).plot()
    >>> display.image_.get_array().shape
    (2, 3)
    """

    def __init__(self, marginals, classes, *, tokens=None, y_true=None):
        classes = _check_classes(classes)
        marginals = _float_array(marginals, "marginals")
        if marginals.ndim != 2 or marginals.shape[1] != classes.shape[0]:
            raise ValueError(
                "marginals must have shape (n_tokens, n_classes) with one "
                f"column per class ({classes.shape[0]} classes), got shape "
                f"{marginals.shape}"
            )
        if marginals.shape[0] == 0:
            raise ValueError("marginals has no tokens: there is nothing to draw")
        for name, value in (("tokens", tokens), ("y_true", y_true)):
            if value is not None and (isinstance(value, str) or np.ndim(value) != 1):
                raise ValueError(
                    f"{name} must be a 1-D sequence with one entry per token, "
                    f"got {value!r}"
                )
        if tokens is not None and len(tokens) != marginals.shape[0]:
            raise ValueError(
                f"tokens has {len(tokens)} entries but the sequence has "
                f"{marginals.shape[0]} tokens"
            )
        if y_true is not None and len(y_true) != marginals.shape[0]:
            raise ValueError(
                f"y_true has {len(y_true)} labels but the sequence has "
                f"{marginals.shape[0]} tokens"
            )
        _check_probabilities(marginals)
        if y_true is not None:
            _, unknown = _label_outcomes(np.asarray(y_true), classes)
            _check_unknown_labels(
                np.asarray(y_true), unknown, classes,
                "have no row on the map and are not marked",
            )
        self.marginals = marginals
        self.classes = classes
        self.tokens = tokens
        self.y_true = y_true

    def plot(self, ax=None, *, cmap="viridis", colorbar=True, annotate=None):
        """Draw the heat map.

        Parameters
        ----------
        ax : matplotlib.axes.Axes or None, default=None
            Axes to draw on; None creates a new figure sized to the sequence.
        cmap : str or matplotlib.colors.Colormap, default="viridis"
        colorbar : bool, default=True
            Whether to add a colour bar.
        annotate : bool or None, default=None
            Write the probability in every cell; None does so when the map
            has at most 200 cells.

        Returns
        -------
        display : MarginalsDisplay
            This object, with ``image_``, ``ax_`` and ``figure_`` set.
        """
        plt = _pyplot()
        n_tokens, n_classes = self.marginals.shape
        if ax is None:
            width = min(max(4.0, 0.45 * n_tokens + 2.0), 20.0)
            height = min(max(2.5, 0.35 * n_classes + 1.8), 12.0)
            _, ax = plt.subplots(figsize=(width, height))
        self.image_ = ax.imshow(
            self.marginals.T, aspect="auto", cmap=cmap, vmin=0.0, vmax=1.0,
            interpolation="nearest",
        )
        ax.set_yticks(np.arange(n_classes), [str(c) for c in self.classes])
        labels = (
            [str(t) for t in self.tokens] if self.tokens is not None
            else [str(t) for t in range(n_tokens)]
        )
        ax.set_xticks(np.arange(n_tokens), labels,
                      rotation=60 if self.tokens is not None else 0,
                      ha="right" if self.tokens is not None else "center")
        ax.set_xlabel("token")
        ax.set_ylabel("label")
        if annotate is None:
            annotate = n_tokens * n_classes <= 200
        if annotate:
            for t in range(n_tokens):
                for j in range(n_classes):
                    p = self.marginals[t, j]
                    ax.text(t, j, f"{p:.2f}".lstrip("0") if p < 1 else "1",
                            ha="center", va="center", fontsize=7,
                            color="black" if p > 0.6 else "white")
        self.true_labels_ = None
        if self.y_true is not None:
            index = {c: j for j, c in enumerate(self.classes.tolist())}
            rows = [index.get(label, np.nan) for label in np.asarray(self.y_true)
                    .tolist()]
            (self.true_labels_,) = ax.plot(
                np.arange(n_tokens), rows, linestyle="none", marker="o",
                markersize=9, markerfacecolor="none", markeredgecolor="red",
                markeredgewidth=1.5, label="true label",
            )
            ax.set_xlabel("token (red circles: true labels)")
        self.colorbar_ = (
            ax.figure.colorbar(self.image_, ax=ax, label="marginal probability")
            if colorbar else None
        )
        self.ax_ = ax
        self.figure_ = ax.figure
        return self

    @classmethod
    def from_estimator(cls, estimator, X_seq, *, tokens=None, ax=None,
                       y_true=None, **kwargs):
        """Plot ``predict_marginals`` of one sequence.

        Parameters
        ----------
        estimator : GPStructClassifier or Pipeline
            Fitted. For a Pipeline, ``X_seq`` is what its first step takes
            (e.g. one sequence of token rows) and the marginals come from
            its last step.
        X_seq : array-like, sparse matrix or list
            One sequence: what the estimator takes for one element of ``X``
            (a (T, n_features) matrix for a bare GPStructClassifier).
        tokens : list of str or None, default=None
            Text of every token, for the tick labels.
        ax : matplotlib.axes.Axes or None, default=None
        y_true : array-like of shape (T,) or None, default=None
            True labels, marked on the map.
        **kwargs : dict
            Passed to :meth:`plot`.

        Returns
        -------
        display : MarginalsDisplay

        Examples
        --------
        >>> import matplotlib
        >>> matplotlib.use("Agg")
        >>> from skgpstruct import GPStructClassifier
        >>> from skgpstruct.datasets import make_sequences
        >>> from skgpstruct.plotting import MarginalsDisplay
        >>> X, y = make_sequences(n_sequences=20, random_state=0)
        >>> clf = GPStructClassifier(n_inducing=20, max_iter=200, tol=1e-3,
        ...                          random_state=0).fit(X, y)
        >>> display = MarginalsDisplay.from_estimator(clf, X[0], y_true=y[0])
        >>> display.marginals.shape == (len(X[0]), len(clf.classes_))
        True
        """
        if isinstance(X_seq, list | tuple) and X_seq and all(
            _is_matrix(x) for x in X_seq
        ):
            raise ValueError(
                f"X_seq must be one sequence, got a list of {len(X_seq)} "
                "matrices: pass X[i], not X[i:j]"
            )
        marginals = _predict_marginals(estimator, [X_seq])[0]
        display = cls(marginals, _last_step(estimator).classes_, tokens=tokens,
                      y_true=y_true)
        return display.plot(ax=ax, **kwargs)


# ---------------------------------------------------------------------- #
def _is_matrix(x):
    """Whether ``x`` is a 2-D matrix (a sequence's features or token rows)."""
    if hasattr(x, "tocsr"):
        return True
    try:
        return np.ndim(x) == 2
    except ValueError:  # ragged rows
        return False


def _flatten_marginals(y_true, marginals, classes):
    """(probabilities, outcomes) over every token and label, both 1-D."""
    classes = _check_classes(classes)
    if isinstance(marginals, np.ndarray) and marginals.ndim == 2:
        probs = marginals
        labels = _token_labels(y_true)
    else:
        if len(y_true) != len(marginals):
            raise ValueError(
                f"y_true has {len(y_true)} sequences but marginals has "
                f"{len(marginals)}"
            )
        pieces = []
        for i, (m, s) in enumerate(zip(marginals, y_true, strict=True)):
            if isinstance(s, str) or np.ndim(s) != 1:
                raise ValueError(
                    f"y_true[{i}] must be the labels of sequence {i}, got "
                    f"{s!r}: with a list of per-sequence marginals, y_true is "
                    "a list of per-sequence label lists"
                )
            m = _float_array(m, f"marginals[{i}]")
            if m.shape != (np.size(s), classes.shape[0]):
                raise ValueError(
                    f"marginals[{i}] must have shape (T, n_classes) = "
                    f"({np.size(s)}, {classes.shape[0]}), got {m.shape}"
                )
            pieces.append(m)
        probs = (np.concatenate(pieces) if pieces
                 else np.empty((0, classes.shape[0])))
        label_pieces = [np.asarray(s) for s in y_true]
        labels = np.concatenate(label_pieces) if label_pieces else np.empty(0)
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2 or probs.shape[1] != classes.shape[0]:
        raise ValueError(
            f"marginals must have one column per class ({classes.shape[0]}), "
            f"got shape {probs.shape}"
        )
    if labels.shape != (probs.shape[0],):
        raise ValueError(
            f"y_true has {labels.size} tokens but marginals has {probs.shape[0]}"
        )
    if probs.shape[0] == 0:
        raise ValueError("y_true and marginals contain no tokens")
    _check_probabilities(probs)
    outcomes, unknown = _label_outcomes(labels, classes)
    _check_unknown_labels(
        labels, unknown, classes,
        "are counted as outcomes of 0 in every column (the marginals give them "
        "probability 0)",
    )
    return probs.ravel(), outcomes.ravel().astype(np.float64)


def _float_array(value, name):
    """``value`` as a float64 array, or a ValueError naming it (a ragged
    list gave NumPy's 'inhomogeneous shape')."""
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(
            f"{name} must be a rectangular array of probabilities, got "
            f"{value!r:.200}"
        ) from None


def _token_labels(y_true):
    """The labels of every token as a 1-D array: ``y_true`` as one array of
    labels, or as a list of per-sequence label lists (concatenated)."""
    if isinstance(y_true, str) or not hasattr(y_true, "__len__"):
        raise ValueError(f"y_true must be a sequence of labels, got {y_true!r}")
    items = list(y_true)
    if items and all(
        not isinstance(item, str) and np.ndim(item) == 1 for item in items
    ):
        return np.concatenate([np.asarray(item) for item in items])
    labels = np.asarray(items, dtype=object if not items else None)
    if labels.ndim != 1:
        raise ValueError(
            "y_true must be the labels of every token, or a list of "
            f"per-sequence label lists; got {y_true!r:.200}"
        )
    return labels


def _check_classes(classes):
    """``classes`` as a non-empty 1-D array of distinct labels."""
    classes = np.asarray(classes)
    try:
        distinct = classes.ndim == 1 and np.unique(classes).size == classes.size
    except TypeError:  # labels that do not compare, e.g. strings and None
        distinct = False
    if classes.size == 0 or not distinct:
        raise ValueError(
            f"classes must be a 1-D array of distinct labels, got {classes!r}"
        )
    return classes


def _check_probabilities(probs):
    if not np.all(np.isfinite(probs)) or np.any(probs < 0) or np.any(probs > 1):
        raise ValueError("marginals must be probabilities in [0, 1]")


def _label_outcomes(labels, classes):
    """The (n_tokens, n_classes) outcomes of ``labels``, and the mask of
    the tokens whose label is none of ``classes``."""
    outcomes = labels[:, None] == classes[None, :]
    return outcomes, ~outcomes.any(axis=1)


def _check_unknown_labels(labels, unknown, classes, consequence):
    """Refuse true labels none of which is a class (labels of another kind,
    such as indices beside strings); warn about some that are not (a label
    the model never saw), saying what becomes of them. The warning points
    at the first line outside this module (whichever constructor or
    method of a display the user called)."""
    if unknown.all():
        raise ValueError(
            f"no label of y_true is one of classes {classes.tolist()[:5]}: are "
            "they labels of the same kind (e.g. not indices beside strings)?"
        )
    if unknown.any():
        missing = sorted(set(labels[unknown].tolist()))
        warnings.warn(
            f"y_true has {int(unknown.sum())} token(s) with labels not in "
            f"classes ({missing[:5]}{', ...' if len(missing) > 5 else ''}): "
            f"they {consequence}",
            UserWarning, stacklevel=outside_stacklevel(),
        )


class ReliabilityDisplay:
    """Reliability (calibration) diagram of per-token label probabilities.

    Every (token, label) pair is one prediction: probability ``p[t, j]``
    of the event "token t has label ``classes[j]``", whose outcome is 1 or
    0. The pairs are put in ``n_bins`` equal-width bins of ``[0, 1]`` (as
    :func:`sklearn.calibration.calibration_curve` with
    ``strategy="uniform"`` bins them); for each non-empty bin the diagram
    shows the mean predicted probability against the observed frequency.
    A calibrated tagger lies on the diagonal.

    The expected calibration error is the bin-size weighted mean distance
    to the diagonal,

    .. math:: \\mathrm{ECE} = \\sum_b \\frac{n_b}{N}
              \\left| \\bar{o}_b - \\bar{p}_b \\right|,

    with ``N = n_tokens * n_classes`` pairs, ``n_b`` of them in bin ``b``,
    ``\\bar{p}_b`` their mean probability and ``\\bar{o}_b`` their mean
    outcome.

    Parameters
    ----------
    prob_pred : ndarray of shape (n_nonempty_bins,)
        Mean predicted probability in each non-empty bin.
    prob_true : ndarray of shape (n_nonempty_bins,)
        Observed frequency of the event in each non-empty bin.
    bin_counts : ndarray of int of shape (n_nonempty_bins,)
        Number of (token, label) pairs in each non-empty bin.
    ece : float
        Expected calibration error.
    estimator_name : str or None, default=None
        Used in the legend.

    Attributes
    ----------
    line_ : matplotlib.lines.Line2D
        The calibration curve (x: ``prob_pred``, y: ``prob_true``).
    ax_ : matplotlib.axes.Axes
    figure_ : matplotlib.figure.Figure

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import numpy as np
    >>> from skgpstruct.plotting import ReliabilityDisplay
    >>> y_true = [["A", "B"], ["B"]]
    >>> marginals = [np.array([[0.8, 0.2], [0.3, 0.7]]), np.array([[0.4, 0.6]])]
    >>> display = ReliabilityDisplay.from_predictions(
    ...     y_true, marginals, classes=["A", "B"], n_bins=2)
    >>> display.bin_counts.tolist(), display.prob_true.tolist()
    ([3, 3], [0.0, 1.0])
    >>> round(display.ece, 4)
    0.3
    """

    def __init__(self, prob_pred, prob_true, bin_counts, ece, *,
                 estimator_name=None):
        prob_pred = _float_array(prob_pred, "prob_pred")
        prob_true = _float_array(prob_true, "prob_true")
        counts = _float_array(bin_counts, "bin_counts")
        for name, values in (("prob_pred", prob_pred), ("prob_true", prob_true),
                             ("bin_counts", counts)):
            if values.ndim != 1 or values.shape != prob_pred.shape:
                raise ValueError(
                    "prob_pred, prob_true and bin_counts must be 1-D arrays of "
                    f"one length (one entry per non-empty bin); got shapes "
                    f"{prob_pred.shape}, {prob_true.shape} and {counts.shape}"
                )
            if not np.all(np.isfinite(values)):
                raise ValueError(f"{name} contains NaN or infinite values")
        for name, values in (("prob_pred", prob_pred), ("prob_true", prob_true)):
            if np.any(values < 0) or np.any(values > 1):
                raise ValueError(f"{name} must hold probabilities in [0, 1]")
        if np.any(counts < 0) or np.any(counts != np.round(counts)):
            raise ValueError("bin_counts must hold non-negative integers")
        ece = float(ece)
        if not (np.isfinite(ece) and 0 <= ece <= 1):
            raise ValueError(f"ece must be a number in [0, 1], got {ece!r}")
        self.prob_pred = prob_pred
        self.prob_true = prob_true
        self.bin_counts = counts.astype(np.int64)
        self.ece = ece
        self.estimator_name = estimator_name

    def plot(self, ax=None, *, name=None, ref_line=True, **kwargs):
        """Draw the calibration curve.

        Parameters
        ----------
        ax : matplotlib.axes.Axes or None, default=None
            Axes to draw on; None creates a new figure. Several displays can
            share one axes to compare taggers.
        name : str or None, default=None
            Legend label; defaults to ``estimator_name``. The ECE is
            appended to it.
        ref_line : bool, default=True
            Draw the diagonal of perfect calibration (once per axes).
        **kwargs : dict
            Passed to :meth:`matplotlib.axes.Axes.plot` (a ``label`` there
            overrides the one made of ``name`` and the ECE).

        Returns
        -------
        display : ReliabilityDisplay
            This object, with ``line_``, ``ax_`` and ``figure_`` set.
        """
        ax = _get_ax(ax)
        name = self.estimator_name if name is None else name
        label = f"ECE = {self.ece:.3f}" if name is None else (
            f"{name} (ECE = {self.ece:.3f})"
        )
        if ref_line and not any(
            line.get_label() == "perfectly calibrated" for line in ax.get_lines()
        ):
            ax.plot([0, 1], [0, 1], linestyle="--", color="grey",
                    label="perfectly calibrated")
        kwargs.setdefault("marker", "s")
        kwargs.setdefault("label", label)
        (self.line_,) = ax.plot(self.prob_pred, self.prob_true, **kwargs)
        ax.set_xlim(-0.02, 1.02)
        ax.set_ylim(-0.02, 1.02)
        ax.set_aspect("equal")
        ax.set_xlabel("predicted probability (mean in bin)")
        ax.set_ylabel("observed frequency")
        ax.set_title("Reliability of per-token marginals")
        ax.legend(loc="upper left", fontsize=8)
        self.ax_ = ax
        self.figure_ = ax.figure
        return self

    @classmethod
    def from_predictions(cls, y_true, marginals, classes, *, n_bins=10, ax=None,
                         name=None, **kwargs):
        """Compute the reliability diagram of marginals and plot it.

        Parameters
        ----------
        y_true : list of array-like of shape (T_n,), or array-like
            True labels of every sequence, or of all tokens as one flat
            array of shape (n_tokens,) (with stacked marginals only).
        marginals : list of ndarray of shape (T_n, n_classes), or ndarray
            Per-token probabilities as ``predict_marginals`` returns them
            (``y_true`` then per sequence too), or stacked in one array of
            shape (n_tokens, n_classes) (``y_true`` per sequence or flat);
            columns in the order of ``classes``.
        classes : array-like of shape (n_classes,)
            The label of every column of the marginals.
        n_bins : int, default=10
            Number of equal-width bins of [0, 1].
        ax : matplotlib.axes.Axes or None, default=None
        name : str or None, default=None
            Name of the tagger in the legend.
        **kwargs : dict
            Passed to :meth:`plot`.

        Returns
        -------
        display : ReliabilityDisplay

        Notes
        -----
        A true label that is not one of ``classes`` (a label the tagger
        never saw in training, such as CoNLL-2000's rare ``B-CONJP``) is an
        event the marginals give probability 0 in every column: it counts
        as an outcome of 0 for each of them, with a UserWarning naming it.

        Examples
        --------
        All tokens as one flat array of labels, the marginals stacked:

        >>> import matplotlib
        >>> matplotlib.use("Agg")
        >>> import numpy as np
        >>> from skgpstruct.plotting import ReliabilityDisplay
        >>> marginals = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
        >>> display = ReliabilityDisplay.from_predictions(
        ...     ["A", "B", "B"], marginals, ["A", "B"], n_bins=5, name="tagger")
        >>> display.line_.get_label()
        'tagger (ECE = 0.300)'
        """
        check_integer(n_bins, "n_bins", 1)
        probs, outcomes = _flatten_marginals(y_true, marginals, classes)
        edges = np.linspace(0.0, 1.0, n_bins + 1)
        # Same binning as sklearn.calibration.calibration_curve.
        bins = np.searchsorted(edges[1:-1], probs)
        counts = np.bincount(bins, minlength=n_bins)
        sum_pred = np.bincount(bins, weights=probs, minlength=n_bins)
        sum_true = np.bincount(bins, weights=outcomes, minlength=n_bins)
        nonempty = counts > 0
        prob_pred = sum_pred[nonempty] / counts[nonempty]
        prob_true = sum_true[nonempty] / counts[nonempty]
        ece = float(
            np.sum(counts[nonempty] * np.abs(prob_true - prob_pred)) / probs.size
        )
        display = cls(prob_pred, prob_true, counts[nonempty], ece,
                      estimator_name=name)
        return display.plot(ax=ax, **kwargs)
