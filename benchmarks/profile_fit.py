"""Where a fit's time goes: ``cProfile`` of one Table 1 fold's fit.

Fits ``GPStructClassifier(random_state=0)`` (plus any ``--setting``
parameters, as in ``dev_splits.py``) on the training part of one Table 1
fold with the CRF++ template features, under ``cProfile``, and prints the
functions with the most time of their own, then the milliseconds per
iteration of the main parts of an iteration: the ELBO evaluations (and,
inside them, the stacked potentials, forward-backward, the likelihood's
checks of its inputs and the rest) and the L-BFGS direction and memory
update, and how many ELBO evaluations the line searches made. cProfile
adds its own overhead to every Python call, so read the split, not the
total. It also prints how many features are active at one training token
only, and the number of inducing variables of the fit with them collapsed
(``collapse_lone_features``).

Run from the repository root::

    OPENBLAS_NUM_THREADS=1 python benchmarks/profile_fit.py --dataset JapaneseNE
"""

import argparse
import cProfile
import pstats
import warnings

import numpy as np
from _common import DATASETS, DEFAULT_DATA_DIR, table1_training_set
from dev_splits import parse_setting

from skgpstruct import GPStructClassifier
from skgpstruct._sequences import stack_sequences
from skgpstruct.inference.inducing import CollapsedFeatures

#: (label, function name as cProfile reports it): cumulative time per iteration.
PARTS = (
    ("ELBO evaluations", "evaluate"),
    ("  stacked samples", "_stacked_unary"),
    ("  stacked gradients", "_stacked_backward"),
    ("  forward-backward", "_forward_backward"),
    ("  likelihood input checks", "_checked_inputs"),
    ("L-BFGS direction", "inverse_hessian_times"),
    ("L-BFGS memory update", "push"),
)


def _entries(stats, name):
    """pstats' ``(primitive calls, calls, own time, cumulative time,
    callers)`` of every function called ``name`` (all files)."""
    return [
        entry for (_, _, function), entry in stats.stats.items() if function == name
    ]


def cumulative_seconds(stats, name):
    """Cumulative seconds of the functions called ``name`` (all files)."""
    return sum(entry[3] for entry in _entries(stats, name))


def call_count(stats, name):
    """Calls of the functions called ``name`` (all files; every call, the
    recursive ones included)."""
    return sum(entry[1] for entry in _entries(stats, name))


def lone_feature_line(X):
    """One line: the features, those active at one training token, and the
    inducing variables before and after collapsing them."""
    X_all, _ = stack_sequences(list(X))
    n_features = X_all.shape[1]
    n_lone = int(np.count_nonzero(np.diff(X_all.tocsc().indptr) == 1))
    collapsed = CollapsedFeatures.of(X_all)
    after = n_features + 1 if collapsed is None else collapsed.n_inducing
    return (
        f"{n_features} features, {n_lone} ({100 * n_lone / n_features:.0f} %) "
        f"active at one training token; inducing variables {n_features + 1}, "
        f"{after} with the lone features collapsed"
    )


def estimator_settings(settings):
    """The estimator's parameters: ``random_state=0`` and every ``--setting``
    merged in order (a later one overrides an earlier one's names)."""
    merged = {"random_state": 0}
    for setting in settings:
        merged.update(setting)
    return merged


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=list(DATASETS), default="JapaneseNE")
    parser.add_argument("--fold", type=int, default=0)
    parser.add_argument("--setting", action="append", default=[], type=parse_setting,
                        help="estimator parameters, name=value ... (repeatable: "
                             "the settings are merged)")
    parser.add_argument("--data", default=str(DEFAULT_DATA_DIR), metavar="DIR")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    X, y = table1_training_set(args.data, DATASETS[args.dataset], args.fold)
    model = GPStructClassifier(**estimator_settings(args.setting))
    profile = cProfile.Profile()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        profile.runcall(model.fit, X, y)
    stats = pstats.Stats(profile)
    stats.sort_stats("tottime").print_stats(args.top)
    n_iter = model.n_iter_
    print(f"{args.dataset} fold {args.fold}: {sum(map(len, y))} training tokens, "
          f"{n_iter} iterations, {stats.total_tt:.2f} s under cProfile")
    print(lone_feature_line(X))
    n_evaluations = call_count(stats, "evaluate")
    print(f"{n_evaluations} ELBO evaluations ({n_evaluations / n_iter:.2f} per "
          f"iteration); scipy's line search zoomed {call_count(stats, '_zoom')} "
          "times")
    print("milliseconds per iteration (cumulative, under cProfile):")
    for label, name in PARTS:
        print(f"  {label:26s} {1e3 * cumulative_seconds(stats, name) / n_iter:7.2f}")


if __name__ == "__main__":
    main()
