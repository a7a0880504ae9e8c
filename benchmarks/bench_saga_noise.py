"""SAGA with its stored gradients' base samples kept, against drawn again.

A stochastic fit's stored gradients keep the Monte Carlo base samples they
were computed with (inducing features, up to
``skgpstruct._estimator.SAGA_NOISE_BYTES``), so that reading one back
draws nothing (doc/design.rst, "Stochastic mode"). For Table 1's fold 0 of
each data set, with the CRF++ template features and the Table 1
stochastic protocol (``batch_size=2, max_iter=60, tol=1e-3,
n_iter_no_change=15, random_state=0``; ``--likelihood pseudo`` for the
pseudo-likelihood), this script fits in one process, alternating
``--rounds`` times (default 3), once as the library does and once with
``SAGA_NOISE_BYTES = 0`` (every stored gradient draws its samples again,
as before 174f857). It checks that both fits are the same model (the
samples are the same numbers either way) and prints per data set the
median fit time of each, their ratio, the epochs and the store at the end
of the fit (``saga_memory_bytes_``) of each.

Run from the repository root::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_saga_noise.py \
        [--likelihood pseudo] [--rounds N] [--datasets NAME ...] [--out FILE]
"""

import argparse
import time
import warnings

import numpy as np
from _common import (
    DATASETS,
    DEFAULT_DATA_DIR,
    check_data_dir,
    markdown_table,
    table1_training_set,
    write_json,
)

import skgpstruct._estimator as estimator_module
from skgpstruct import GPStructClassifier

PROTOCOL = dict(
    optimizer="stochastic", batch_size=2, max_iter=60, tol=1e-3,
    n_iter_no_change=15, random_state=0,
)
COLUMNS = ("data set", "epochs", "fit s (kept)", "fit s (drawn again)",
           "kept / drawn again", "store MiB (kept)", "store MiB (drawn again)")


def fit(X, y, likelihood, budget, protocol=PROTOCOL):
    """One fit with ``SAGA_NOISE_BYTES = budget``: (seconds, model)."""
    default = estimator_module.SAGA_NOISE_BYTES
    estimator_module.SAGA_NOISE_BYTES = budget
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ConvergenceWarning at max_iter
            start = time.perf_counter()
            model = GPStructClassifier(likelihood=likelihood, **protocol).fit(X, y)
            return time.perf_counter() - start, model
    finally:
        estimator_module.SAGA_NOISE_BYTES = default


def same_model(a, b):
    names = ("q_mu_", "q_sqrt_", "pairwise_mean_", "pairwise_std_")
    return all(np.array_equal(getattr(a, n), getattr(b, n)) for n in names) and (
        a.elbo_history_ == b.elbo_history_
    )


def measure(name, data_dir, likelihood, rounds, protocol=PROTOCOL):
    """Both fits of one data set, alternated ``rounds`` times; raises if
    they are not the same model."""
    X, y = table1_training_set(data_dir, DATASETS[name])
    budgets = {"kept": estimator_module.SAGA_NOISE_BYTES, "drawn again": 0}
    times = {label: [] for label in budgets}
    models = {}
    for _ in range(rounds):
        for label, budget in budgets.items():
            seconds, models[label] = fit(X, y, likelihood, budget, protocol)
            times[label].append(seconds)
    kept, drawn = models["kept"], models["drawn again"]
    if not same_model(kept, drawn):
        raise RuntimeError(f"{name}: the two fits differ")
    ratio = float(np.median(np.divide(times["kept"], times["drawn again"])))
    return {
        "dataset": name,
        "epochs": kept.n_iter_,
        "seconds": times,
        "ratio": ratio,
        "store_bytes": {"kept": kept.saga_memory_bytes_,
                        "drawn again": drawn.saga_memory_bytes_},
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--likelihood", choices=("crf", "pseudo"), default="crf")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--datasets", nargs="+", choices=sorted(DATASETS),
                        default=list(DATASETS))
    parser.add_argument("--data", default=str(DEFAULT_DATA_DIR), metavar="DIR")
    parser.add_argument("--out", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    check_data_dir(args.data)
    results, rows = [], []
    for name in args.datasets:
        r = measure(name, args.data, args.likelihood, args.rounds)
        results.append(r)
        mib = {k: v / 2**20 for k, v in r["store_bytes"].items()}
        rows.append([
            name, str(r["epochs"]),
            f"{np.median(r['seconds']['kept']):.2f}",
            f"{np.median(r['seconds']['drawn again']):.2f}",
            f"{r['ratio']:.2f}", f"{mib['kept']:.2f}", f"{mib['drawn again']:.2f}",
        ])
        print(f"{name}: done", flush=True)
    print(f"\nlikelihood={args.likelihood}, {args.rounds} rounds, Table 1 fold 0; "
          "the two fits are the same model on every set\n")
    print(markdown_table(COLUMNS, rows))
    if args.out:
        write_json(args.out, {"likelihood": args.likelihood, "results": results})


if __name__ == "__main__":
    main()
