"""L-BFGS's initial matrix: the diagonal against ``gamma I`` on Table 1 folds.

Fits ``GPStructClassifier(random_state=0)`` on the training part of Table 1
folds (CRF++ template features) once per fold and initial inverse Hessian,
in one process, in an order that alternates between folds, and prints per
fold and data set the L-BFGS iterations, the ELBO evaluations (the
objective's cost: one per line-search trial), the final ELBO and the fit
time, then per data set the totals and their ratios to ``scalar``. Every
fit optimises the same objective (the same Monte Carlo base samples) from
the same start; only the optimiser's path differs. The initial matrices
(``--initial``):

``diagonal``
    :func:`skgpstruct.optim.minimize_lbfgs`'s default: ``t diag(b)^-1/2``
    from its diagonal Hessian approximation ``b``, ``y^T H0 y = s^T y``.
``scalar``
    ``initial="scalar"``: the classical ``gamma I``.
``inverse-diagonal``
    ``diag(1 / b)``: the whole diagonal (a variant defined here).
``secant-inverse-diagonal``
    ``t diag(1 / b)`` with ``y^T H0 y = s^T y`` (a variant defined here).

All with the unit step first. Run from the repository root::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_lbfgs.py \
        [--initial NAME ...] [--datasets NAME ...] [--folds K ...] \
        [--data DIR] [--out FILE]
"""

import argparse
import contextlib
import functools
import time
import warnings

import numpy as np
from _common import (
    DATASETS,
    DEFAULT_DATA_DIR,
    check_data_dir,
    environment,
    markdown_table,
    table1_training_set,
    write_json,
)

from skgpstruct import GPStructClassifier
from skgpstruct import _estimator as estimator_module
from skgpstruct.inference import elbo
from skgpstruct.optim import lbfgs


class _InverseDiagonal(lbfgs._LBFGSMemory):
    """``H0 = diag(1 / b)`` (``secant=False``) or ``t diag(1 / b)`` with
    ``y^T H0 y = s^T y`` (``secant=True``), from the library's ``b``."""

    secant = False

    def push(self, s, y, gradient=None, previous_gradient=None):
        stored = super().push(s, y, gradient, previous_gradient)
        if stored:
            inverse = 1.0 / self.hessian_diagonal
            if self.secant:
                inverse *= float(s @ y) / float(y @ (inverse * y))
            self.initial_diagonal[:] = inverse
        return stored


class _SecantInverseDiagonal(_InverseDiagonal):
    secant = True


#: name: (minimize_lbfgs's initial, the memory class)
VARIANTS = {
    "diagonal": ("diagonal", lbfgs._LBFGSMemory),
    "scalar": ("scalar", lbfgs._LBFGSMemory),
    "inverse-diagonal": ("diagonal", _InverseDiagonal),
    "secant-inverse-diagonal": ("diagonal", _SecantInverseDiagonal),
}


@contextlib.contextmanager
def lbfgs_with(variant):
    """The estimator's L-BFGS with this initial matrix (a name of
    ``VARIANTS``), and a counter of its ELBO evaluations (a one-element
    list), while the context is open."""
    initial, memory = VARIANTS[variant]
    count = [0]
    evaluate = elbo.SparseELBO.evaluate

    @functools.wraps(evaluate)
    def counted(self, *args, **kwargs):
        count[0] += 1
        return evaluate(self, *args, **kwargs)

    original, original_memory = estimator_module.minimize_lbfgs, lbfgs._LBFGSMemory
    estimator_module.minimize_lbfgs = functools.partial(original, initial=initial)
    lbfgs._LBFGSMemory = memory
    elbo.SparseELBO.evaluate = counted
    try:
        yield count
    finally:
        estimator_module.minimize_lbfgs = original
        lbfgs._LBFGSMemory = original_memory
        elbo.SparseELBO.evaluate = evaluate


def fit(X, y, variant):
    """One fit: its iterations, ELBO evaluations, final ELBO and seconds."""
    with lbfgs_with(variant) as count, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        model = GPStructClassifier(random_state=0).fit(X, y)
        seconds = time.perf_counter() - start
    return {
        "n_iter": int(model.n_iter_), "evaluations": count[0],
        "elbo": float(model.elbo_history_[-1]), "seconds": seconds,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--initial", nargs="+", choices=list(VARIANTS),
                        default=["diagonal", "scalar"])
    parser.add_argument("--datasets", nargs="+", choices=sorted(DATASETS),
                        default=["basenp", "chunking", "seg", "JapaneseNE"])
    parser.add_argument("--folds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--data", type=check_data_dir, default=DEFAULT_DATA_DIR)
    parser.add_argument("--out", default=None, help="also write the records as JSON")
    args = parser.parse_args()
    variants = list(dict.fromkeys(["scalar", *args.initial]))  # the reference first

    records, rows = [], []
    for name in args.datasets:
        totals = {v: {"n_iter": 0, "evaluations": 0, "seconds": 0.0} for v in variants}
        gains = {v: [] for v in variants}
        for fold in args.folds:
            X, y = table1_training_set(args.data, DATASETS[name], fold)
            fit(X, y, "scalar")  # warm-up: first-call costs out of the timings
            order = variants if fold % 2 == 0 else variants[::-1]
            by_variant = {v: fit(X, y, v) for v in order}
            for v in variants:
                rec = by_variant[v]
                records.append({"dataset": name, "fold": fold, "initial": v, **rec})
                for key in totals[v]:
                    totals[v][key] += rec[key]
                gains[v].append(rec["elbo"] - by_variant["scalar"]["elbo"])
                print(f"{name:11s} fold {fold}  {v:24s} {rec['n_iter']:4d} "
                      f"iterations  {rec['evaluations']:4d} evaluations  ELBO "
                      f"{rec['elbo']:10.3f}  {rec['seconds']:6.2f} s", flush=True)
        reference = totals["scalar"]
        for v in variants:
            t = totals[v]
            rows.append([
                name, v, t["n_iter"], t["evaluations"],
                f"{t['evaluations'] / reference['evaluations']:.2f}",
                f"{np.min(gains[v]):+.3f} / {np.max(gains[v]):+.3f}",
                f"{t['seconds']:.2f} s", f"{t['seconds'] / reference['seconds']:.2f}",
            ])
    print()
    print(f"Totals over folds {', '.join(map(str, args.folds))}; ratios to scalar; "
          "ELBO gain over scalar, fold by fold (lowest / highest):")
    print(markdown_table(
        ["data set", "initial", "iterations", "ELBO evaluations", "ratio",
         "ELBO gain", "fit time", "ratio"],
        rows,
    ))
    if args.out:
        write_json(args.out, {"environment": environment(), "records": records})


if __name__ == "__main__":
    main()
