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

``--timer wall`` times the same parts without cProfile: each is wrapped in
a wall-clock timer for the fit (a few microseconds per call), so the split
and the total are those of an ordinary fit; the line search and the loop
around it are the L-BFGS run's time minus the ELBO evaluations and the
direction and update, and the set-up the fit's time outside the run (all
per iteration). cProfile's split inflates the parts made of many Python
calls.

Run from the repository root::

    OPENBLAS_NUM_THREADS=1 python benchmarks/profile_fit.py --dataset JapaneseNE
    OPENBLAS_NUM_THREADS=1 python benchmarks/profile_fit.py --dataset JapaneseNE \
        --timer wall
"""

import argparse
import cProfile
import functools
import pstats
import time
import warnings

import numpy as np
from _common import DATASETS, DEFAULT_DATA_DIR, table1_training_set
from dev_splits import parse_setting

from skgpstruct import GPStructClassifier, chain
from skgpstruct import _estimator as estimator_module
from skgpstruct._sequences import stack_sequences
from skgpstruct.inference import elbo, terms
from skgpstruct.inference.inducing import CollapsedFeatures
from skgpstruct.likelihoods import base as likelihood_base
from skgpstruct.optim import lbfgs

#: (label, owner, attribute) of the parts of an iteration: cProfile reports
#: each under the attribute's name; ``--timer wall`` replaces the attribute
#: by a timer (the code calls it through that name).
PARTS = (
    ("ELBO evaluations", elbo.SparseELBO, "evaluate"),
    ("  stacked samples", terms, "_stacked_unary"),
    ("  stacked gradients", terms, "_stacked_backward"),
    ("  forward-backward", chain, "_forward_backward"),
    ("  likelihood input checks", likelihood_base, "_checked_inputs"),
    ("L-BFGS direction", lbfgs._LBFGSMemory, "inverse_hessian_times"),
    ("L-BFGS memory update", lbfgs._LBFGSMemory, "push"),
)
#: What ``--timer wall`` times: the whole L-BFGS run too.
WALL_PARTS = (("L-BFGS run", estimator_module, "minimize_lbfgs"), *PARTS)
#: The parts of an L-BFGS run whose sum, taken from the run's time, leaves
#: the line search and the loop around it.
WALL_IN_RUN = ("ELBO evaluations", "L-BFGS direction", "L-BFGS memory update")


class WallClock:
    """Wall-clock seconds and calls of functions, replaced by timers while
    the context is open and put back when it closes.

    ``parts`` is a sequence of ``(label, owner, attribute)``; a call made
    while the same part is already being timed (recursion) is not counted
    twice.
    """

    def __init__(self, parts):
        self.parts = parts
        self.seconds = dict.fromkeys([label for label, _, _ in parts], 0.0)
        self.calls = dict.fromkeys(self.seconds, 0)
        self._saved = []

    def _timer(self, label, function):
        depth = [0]

        @functools.wraps(function)
        def timed(*args, **kwargs):
            if depth[0]:
                return function(*args, **kwargs)
            depth[0] += 1
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - start
                self.calls[label] += 1
                depth[0] -= 1

        return timed

    def __enter__(self):
        for label, owner, attribute in self.parts:
            function = getattr(owner, attribute)
            self._saved.append((owner, attribute, function))
            setattr(owner, attribute, self._timer(label, function))
        return self

    def __exit__(self, *exc_info):
        for owner, attribute, function in reversed(self._saved):
            setattr(owner, attribute, function)
        self._saved = []
        return False


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
    parser.add_argument("--timer", choices=["cprofile", "wall"], default="cprofile",
                        help="cProfile (the default), or wall-clock timers "
                             "around the parts only")
    args = parser.parse_args(argv)
    X, y = table1_training_set(args.data, DATASETS[args.dataset], args.fold)
    model = GPStructClassifier(**estimator_settings(args.setting))
    if args.timer == "wall":
        with warnings.catch_warnings(), WallClock(WALL_PARTS) as clock:
            warnings.simplefilter("ignore")
            start = time.perf_counter()
            model.fit(X, y)
            total = time.perf_counter() - start
        n_iter = model.n_iter_
        n_evaluations = clock.calls["ELBO evaluations"]
        print(f"{args.dataset} fold {args.fold}: {sum(map(len, y))} training tokens, "
              f"{n_iter} iterations, {total:.2f} s, {n_evaluations} ELBO "
              f"evaluations ({n_evaluations / n_iter:.2f} per iteration)")
        run = clock.seconds["L-BFGS run"]
        rows = [(label, clock.seconds[label]) for label, _, _ in PARTS]
        rows += [
            ("line search and loop",
             run - sum(clock.seconds[label] for label in WALL_IN_RUN)),
            ("set-up outside the run", total - run),
            ("whole fit", total),
        ]
        print("milliseconds per iteration (wall clock):")
        for label, seconds in rows:
            print(f"  {label:26s} {1e3 * seconds / n_iter:7.2f}")
        return
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
    for label, _, name in PARTS:
        print(f"  {label:26s} {1e3 * cumulative_seconds(stats, name) / n_iter:7.2f}")


if __name__ == "__main__":
    main()
