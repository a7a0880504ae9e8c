"""
==========================================================
A likelihood of your own: a chain CRF that expects noisy labels
==========================================================

The inference engine of :class:`~skgpstruct.GPStructClassifier` never asks
which likelihood it runs ("gray box"): any function that returns
``log p(y | f)`` for the potentials of one sequence can replace the
built-in chain CRF, and the score-function gradient estimator
(``gradient="score"``) then fits the model with no derivative at all.

Here the training labels were corrupted: every label was replaced, with
probability ``eps``, by one of the other labels. A likelihood that knows
this treats the observed labels ``y`` as noisy copies of clean labels ``z``
that follow a chain CRF::

    p(y | f) = sum_z p_crf(z | f) prod_t p(y_t | z_t)
    p(y_t | z_t) = 1 - eps if y_t == z_t else eps / (V - 1)

The sum over all labellings ``z`` is one more forward-backward pass: the
noise term of token ``t`` is a unary potential ``log p(y_t | z)`` over
``z``, so ``log p(y | f) = log Z(unary + log N[:, y]) - log Z(unary)``,
two log-partition functions from :func:`skgpstruct.chain.forward_backward`.

We fit it on the noisy labels and compare the token accuracy on clean test
labels with the built-in ``"crf"`` likelihood fitted on the same noisy
labels. Last, the same model as a :class:`~skgpstruct.likelihoods.Likelihood`
subclass that also returns its gradient, so that the faster pathwise
estimator applies.

Run it as a script (about a minute on one core)::

    python examples/plot_custom_likelihood.py

With matplotlib installed (the ``plot`` extra) a bar chart of the
accuracies is written next to the script (or to ``--out DIR``); without it
the chart is skipped.
"""

# %%
# Imports and noisy data
# ----------------------
import argparse
import warnings
from pathlib import Path

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from skgpstruct import GPStructClassifier, chain
from skgpstruct.datasets import make_sequences
from skgpstruct.likelihoods import Likelihood
from skgpstruct.metrics import token_accuracy

EPS = 0.3  # probability that a training label was flipped
N_CLASSES = 3
N_TRAIN = 50
FIT = {"n_inducing": 50, "max_iter": 100, "random_state": 0}


def noisy_data(eps, random_state=0):
    """(X_train, y_train_clean, y_train_noisy, X_test, y_test_clean)."""
    X, y = make_sequences(
        n_sequences=N_TRAIN + 200, n_classes=N_CLASSES, n_features=8,
        length_range=(5, 20), noise=1.5, random_state=random_state,
    )
    rng = np.random.default_rng(random_state + 1)
    y_noisy = []
    for labels in y[:N_TRAIN]:
        flipped = rng.random(len(labels)) < eps
        labels = labels.copy()
        # move a flipped label to one of the other labels, uniformly
        shift = rng.integers(1, N_CLASSES, flipped.sum())
        labels[flipped] = (labels[flipped] + shift) % N_CLASSES
        y_noisy.append(labels)
    return X[:N_TRAIN], y[:N_TRAIN], y_noisy, X[N_TRAIN:], y[N_TRAIN:]


# %%
# The likelihood as a plain function
# ----------------------------------
# ``unary`` is (S, T, V) for the S Monte Carlo samples of one sequence of T
# tokens, ``pairwise`` (S, V, V), ``y`` the T label indices (columns of
# ``unary``, in the order of ``classes_``: here the labels are 0 .. V-1).


def log_noise_matrix(eps, n_classes):
    """``log p(observed = j | clean = i)`` at ``[i, j]``."""
    log_noise = np.full((n_classes, n_classes), np.log(eps / (n_classes - 1)))
    np.fill_diagonal(log_noise, np.log1p(-eps))
    return log_noise


LOG_NOISE = log_noise_matrix(EPS, N_CLASSES)


def noisy_crf_log_lik(unary, pairwise, y):
    """log p(y | f) of one sequence under the label-noise chain, per sample."""
    offsets = np.array([0, unary.shape[1]])
    log_z, _, _ = chain.forward_backward(unary, pairwise, offsets)
    # token t, clean label z: log p(y_t | z), added to the unary potentials
    noise_unary = LOG_NOISE[:, y].T[None]
    log_z_y, _, _ = chain.forward_backward(unary + noise_unary, pairwise, offsets)
    return (log_z_y - log_z)[:, 0]


# %%
# The same likelihood with its gradient
# -------------------------------------
# The gradient of a difference of two log-partition functions is the
# difference of their marginals, which forward-backward returns anyway. A
# :class:`Likelihood` subclass works on a whole ragged batch (sequences
# concatenated, delimited by ``offsets``) and, with ``has_gradient = True``,
# lets the estimator use the pathwise (reparameterisation) gradient.


class NoisyChainCRF(Likelihood):
    """Chain CRF observed through a symmetric label-noise channel."""

    has_gradient = True

    def __init__(self, eps):
        self.eps = eps

    def _log_prob(self, unary, pairwise, offsets, labels):
        return self._log_prob_and_gradient(unary, pairwise, offsets, labels)[0]

    def _log_prob_and_gradient(self, unary, pairwise, offsets, labels):
        log_noise = log_noise_matrix(self.eps, unary.shape[2])
        log_z, marg, pair = chain.forward_backward(unary, pairwise, offsets)
        log_z_y, marg_y, pair_y = chain.forward_backward(
            unary + log_noise[:, labels].T[None], pairwise, offsets
        )
        return log_z_y - log_z, marg_y - marg, pair_y - pair

    def __repr__(self):
        return f"NoisyChainCRF(eps={self.eps})"


# %%
# Fits and accuracies on clean test labels
# ----------------------------------------
# Each likelihood is compared with the built-in chain under the same
# gradient estimator. The score estimator sees only values of
# ``log p(y | f)`` and is much noisier than the pathwise one: when a
# likelihood can return its gradient, the pathwise route is the better fit.


def fit_and_score(X, y, X_test, y_test, **params):
    with warnings.catch_warnings():
        # 100 iterations suffice here; the score estimator's noisy gradient
        # may also stop L-BFGS before its tolerance is met.
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = GPStructClassifier(**FIT, **params).fit(X, y)
    return token_accuracy(y_test, model.predict(X_test))


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="a chain CRF likelihood that expects noisy labels, fitted "
        "with the score-function gradient, against the built-in one"
    )
    parser.add_argument("--out", default=Path(__file__).resolve().parent,
                        help="folder for the PNG file (default: next to "
                        "this script)")
    parser.add_argument("--no-plot", action="store_true",
                        help="do not write the bar chart")
    args = parser.parse_args(argv)

    X, y_clean, y_noisy, X_test, y_test = noisy_data(EPS)
    n_flipped = int(np.sum(np.concatenate(y_clean) != np.concatenate(y_noisy)))
    n_tokens = sum(len(labels) for labels in y_noisy)
    print(f"{n_tokens} training tokens, {n_flipped} labels flipped "
          f"({n_flipped / n_tokens:.0%}); clean test labels")

    runs = [
        ("built-in crf, score", {"likelihood": "crf", "gradient": "score",
                                 "n_samples": 16}),
        ("noisy-label callable, score", {"likelihood": noisy_crf_log_lik,
                                         "gradient": "score", "n_samples": 16}),
        ("built-in crf, pathwise", {"likelihood": "crf"}),
        ("NoisyChainCRF, pathwise", {"likelihood": NoisyChainCRF(EPS)}),
    ]
    accuracies = {}
    for name, params in runs:
        accuracies[name] = fit_and_score(X, y_noisy, X_test, y_test, **params)
        print(f"{name:30s} token accuracy {accuracies[name]:.4f}", flush=True)

    if args.no_plot:
        return
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: bar chart skipped")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = list(accuracies)
    ax.barh(names, [accuracies[n] for n in names],
            color=["C0", "C1", "C0", "C1"])
    ax.set_xlim(min(accuracies.values()) - 0.1, 1.0)
    ax.invert_yaxis()
    ax.set_xlabel(f"token accuracy on clean test labels (train flip rate {EPS})")
    fig.tight_layout()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "plot_custom_likelihood.png"
    fig.savefig(path, dpi=110)
    print(f"bar chart written to {path}")


if __name__ == "__main__":
    main()
