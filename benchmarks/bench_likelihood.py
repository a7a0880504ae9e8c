"""Exact chain likelihood against the piecewise pseudo-likelihood: time.

Section 6.1.1 of the gray-box paper replaces the exact linear-chain
likelihood (forward-backward, quadratic in the number of labels V) by the
piecewise pseudo-likelihood (linear in V per token) and reports every
stochastic optimisation step "roughly twice as fast". This script measures,
on a basenp-sized batch (3,700 tokens in sequences of about 25, S = 8
samples) for V in {3, 17}:

1. one likelihood evaluation with its gradient
   (``ChainCRF.log_prob_and_gradient`` against
   ``PiecewisePseudoLikelihood.log_prob_and_gradient``) and without it
   (``log_prob``), and their ratio;
2. the wall time per L-BFGS iteration of a whole fit through the public
   estimator, ``GPStructClassifier(likelihood="crf")`` against
   ``likelihood="pseudo"`` (set-up excluded: the time of a one-iteration
   fit is subtracted), on synthetic sequences of the same size, with
   the pathwise and the score estimator; and per likelihood call, which
   is proportional to the time per ELBO evaluation (an iteration may take
   a different number of evaluations under each likelihood).

Times are medians over repeats, one thread; only the ratios carry over to
other machines. Run from the repository root::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_likelihood.py [--quick]
"""

import argparse
import time
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from skgpstruct import GPStructClassifier
from skgpstruct.datasets import make_sequences
from skgpstruct.likelihoods import (
    ChainCRF,
    Likelihood,
    PiecewisePseudoLikelihood,
    get_likelihood,
)

LABELS = (3, 17)
N_TOKENS = 3700  # basenp's N in Table 1
MEAN_LENGTH = 25
N_SAMPLES = 8


def _median_time(func, min_time, repeats=7):
    """Median seconds per call over ``repeats`` blocks of ~min_time/repeats."""
    func()
    start = time.perf_counter()
    func()
    once = max(time.perf_counter() - start, 1e-7)
    calls = max(1, int(min_time / repeats / once))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            func()
        times.append((time.perf_counter() - start) / calls)
    return float(np.median(times))


def _batch(rng, n_labels):
    """Potentials of S samples of ~3,700 tokens in sequences of 20..30."""
    lengths = []
    while sum(lengths) < N_TOKENS:
        lengths.append(int(rng.integers(MEAN_LENGTH - 5, MEAN_LENGTH + 6)))
    lengths[-1] -= sum(lengths) - N_TOKENS
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    unary = rng.standard_normal((N_SAMPLES, N_TOKENS, n_labels))
    pairwise = rng.standard_normal((N_SAMPLES, n_labels, n_labels))
    labels = rng.integers(0, n_labels, N_TOKENS)
    return unary, pairwise, offsets, labels


def likelihood_times(n_labels, min_time):
    rng = np.random.default_rng(0)
    args = _batch(rng, n_labels)
    row = {}
    for name, likelihood in (("crf", ChainCRF()),
                             ("pseudo", PiecewisePseudoLikelihood())):
        row[name, "grad"] = _median_time(
            lambda lik=likelihood: lik.log_prob_and_gradient(*args), min_time
        )
        row[name, "value"] = _median_time(
            lambda lik=likelihood: lik.log_prob(*args), min_time
        )
    return row, len(args[2]) - 1


class _Counting(Likelihood):
    """Delegates to a likelihood and counts the calls (one per chunk)."""

    def __init__(self, inner):
        self.inner = inner
        self.has_gradient = inner.has_gradient
        self.calls = 0

    def _log_prob(self, *args):
        self.calls += 1
        return self.inner.log_prob(*args)

    def _log_prob_and_gradient(self, *args):
        self.calls += 1
        return self.inner.log_prob_and_gradient(*args)


def _fit(X, y, likelihood, gradient, max_iter):
    counting = _Counting(get_likelihood(likelihood))
    model = GPStructClassifier(
        likelihood=counting, gradient=gradient, max_iter=max_iter,
        tol=1e-12, n_samples=N_SAMPLES if gradient == "pathwise" else 16,
        random_state=0,
    )
    with warnings.catch_warnings():
        # a fixed number of iterations is the point: no convergence wanted
        warnings.simplefilter("ignore", ConvergenceWarning)
        start = time.perf_counter()
        model.fit(X, y)
        elapsed = time.perf_counter() - start
    return elapsed, model.n_iter_, counting.calls


def fit_times(n_labels, likelihood, gradient, max_iter):
    """Seconds per L-BFGS iteration and per likelihood call, set-up excluded.

    Differences between a fit of ``max_iter`` iterations and one of a
    single iteration: what is left is the ELBO evaluations and the
    optimiser's bookkeeping. An iteration may take several ELBO evaluations
    (line search), and their number differs between likelihoods; every
    evaluation calls the likelihood a fixed number of times (once per chunk
    of sequences, twice with the score estimator), so the time per call is
    proportional to the time per ELBO evaluation.
    """
    X, y = make_sequences(
        n_sequences=N_TOKENS // MEAN_LENGTH, n_classes=n_labels,
        length_range=(MEAN_LENGTH - 5, MEAN_LENGTH + 5), random_state=0,
    )
    short, n_short, calls_short = _fit(X, y, likelihood, gradient, 1)
    long, n_long, calls_long = _fit(X, y, likelihood, gradient, max_iter)
    n_tokens = sum(len(labels) for labels in y)
    return {
        "iteration": (long - short) / max(n_long - n_short, 1),
        "call": (long - short) / max(calls_long - calls_short, 1),
        "iterations": n_long,
        "calls": calls_long,
        "tokens": n_tokens,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="short timings and fits (a smoke run)")
    args = parser.parse_args(argv)
    min_time = 0.3 if args.quick else 2.0
    iters = {"pathwise": 5 if args.quick else 20, "score": 3 if args.quick else 10}
    start = time.perf_counter()

    print(f"1. One evaluation: S={N_SAMPLES}, {N_TOKENS} tokens, sequences of "
          f"{MEAN_LENGTH - 5}..{MEAN_LENGTH + 5}; median ms per call")
    header = (f"{'V':>3} {'n_seq':>5} | {'crf+grad':>9} {'pseudo+grad':>11} "
              f"{'ratio':>6} | {'crf':>8} {'pseudo':>8} {'ratio':>6}")
    print(header)
    print("-" * len(header))
    for n_labels in LABELS:
        row, n_seq = likelihood_times(n_labels, min_time)
        g = row["crf", "grad"] / row["pseudo", "grad"]
        v = row["crf", "value"] / row["pseudo", "value"]
        print(f"{n_labels:>3} {n_seq:>5} | {1e3 * row['crf', 'grad']:>9.2f} "
              f"{1e3 * row['pseudo', 'grad']:>11.2f} {g:>5.1f}x | "
              f"{1e3 * row['crf', 'value']:>8.2f} "
              f"{1e3 * row['pseudo', 'value']:>8.2f} {v:>5.1f}x")
    print("ratio = exact chain time / pseudo-likelihood time")
    print()

    print("2. Whole fit (GPStructClassifier defaults otherwise, make_sequences "
          "data), set-up excluded:\n   seconds per L-BFGS iteration, and per "
          "likelihood call (~ per ELBO evaluation)")
    header = (f"{'V':>3} {'gradient':>8} {'tokens':>6} | {'iters':>5} "
              f"{'calls':>7} | {'crf/iter':>8} {'pseudo':>8} {'ratio':>6} | "
              f"{'crf/call':>8} {'pseudo':>8} {'ratio':>6}")
    print(header)
    print("-" * len(header))
    for gradient in ("pathwise", "score"):
        for n_labels in LABELS:
            crf = fit_times(n_labels, "crf", gradient, iters[gradient])
            pseudo = fit_times(n_labels, "pseudo", gradient, iters[gradient])
            print(f"{n_labels:>3} {gradient:>8} {crf['tokens']:>6} | "
                  f"{crf['iterations']:>2}/{pseudo['iterations']:<2} "
                  f"{crf['calls']:>3}/{pseudo['calls']:<3} | "
                  f"{crf['iteration']:>8.3f} {pseudo['iteration']:>8.3f} "
                  f"{crf['iteration'] / pseudo['iteration']:>5.2f}x | "
                  f"{crf['call']:>8.4f} {pseudo['call']:>8.4f} "
                  f"{crf['call'] / pseudo['call']:>5.2f}x", flush=True)
    print("iters, calls = L-BFGS iterations and likelihood calls of the crf / "
          "pseudo fits\n(tol=1e-12: max_iter unless L-BFGS stops early)")
    print(f"total time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
