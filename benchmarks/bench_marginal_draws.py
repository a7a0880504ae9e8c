"""Monte Carlo error of ``predict_marginals``: antithetic pairs against
independent draws.

``predict_marginals`` averages forward-backward marginals over
``n_predict_samples`` posterior draws of the unary potentials, drawn in
antithetic pairs (a draw and its reflection about the posterior mean). In
a pair's average the odd part of the marginals as a function of the draw
cancels, so pairs estimate the posterior average better than as many
independent draws. This script measures by how much, on the Table 1
folds. (What the draws cost is measured by ``bench_table1.py`` and
``bench_predict.py``, against the CRF's forward-backward.)

For each data set and fold: a batch GP (``random_state=0``) fitted on the
fold's training sequences, and on its test sequences

* a reference: ``predict_marginals`` with ``--reference`` draws (2,048);
* for each of ``--seeds`` prediction seeds, one call drawing 64 samples,
  whose per-sample forward-backward marginals are recorded in draw order
  (``skgpstruct.chain.forward_backward`` wrapped for the call). The first
  S of them are the library's estimate with S draws (S/2 pairs); the
  first of every pair are independent draws, and the first S of those
  are the estimate of S independent draws, from the same call;
* the root mean square difference of each estimate from the reference,
  over every token and label, and the mean negative log-probability of
  the true label (NLL) and the expected calibration error (ECE, 10 bins)
  of the estimates and of the reference.

The prediction seed is the fitted model's private ``_predict_seed`` (set
from ``random_state`` at fit time), replaced on a copy of the model to
draw other samples of the same fit.

Run from the repository root::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_marginal_draws.py \\
        [--datasets NAME ...] [--folds K ...] [--seeds N] [--reference S]
"""

import argparse
import copy
import sys
import warnings

import numpy as np
from _common import (
    DATASETS,
    DEFAULT_DATA_DIR,
    calibration,
    check_data_dir,
    command_line,
    environment,
    fold_split,
    load_pool,
    markdown_table,
    read_folds,
    take,
    template_features,
    write_json,
)

import skgpstruct.chain
from skgpstruct import GPStructClassifier

SAMPLES = (8, 16, 32)
RECORDED = 2 * max(SAMPLES)  # 32 pairs: their first draws are 32 independent


def recorded_samples(model, X):
    """Per-sample forward-backward marginals (n_predict_samples, n_tokens, V)
    of one ``predict_marginals`` call, the samples in draw order."""
    pieces = []
    forward_backward = skgpstruct.chain.forward_backward

    def record(unary, pairwise, offsets):
        result = forward_backward(unary, pairwise, offsets)
        pieces.append(result[1])
        return result

    skgpstruct.chain.forward_backward = record
    try:
        model.predict_marginals(X)
    finally:
        skgpstruct.chain.forward_backward = forward_backward
    samples = np.concatenate(pieces, axis=1)  # chunks and runs, in order
    if samples.shape[:2] != (model.n_predict_samples, sum(x.shape[0] for x in X)):
        raise RuntimeError("predict_marginals drew its samples in blocks; "
                           f"recorded {samples.shape}")
    return samples


def estimate(samples, S, antithetic):
    """The marginals of S draws: the first S (pairs), or the first draw of
    each of the first S pairs (independent draws)."""
    drawn = samples[:S] if antithetic else samples[0 : 2 * S : 2]
    marginals = drawn.mean(axis=0)
    return marginals / marginals.sum(axis=1, keepdims=True)


def split(marginals, y):
    return np.split(marginals, np.cumsum([len(s) for s in y])[:-1])


def measure_fold(data_dir, dataset, fold, n_seeds, n_reference):
    tokens, labels, template = load_pool(data_dir, dataset)
    train, test = fold_split(read_folds(data_dir, dataset), fold, dataset.n_train)
    X_train, X_test, _, _ = template_features(
        template, take(tokens, train), take(tokens, test)
    )
    y_train, y_test = take(labels, train), take(labels, test)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = GPStructClassifier(random_state=0).fit(X_train, y_train)
    if model.n_components != 1:  # (one forward-backward per component)
        raise ValueError("the recorded samples assume one mixture component")
    classes = model.classes_
    reference = np.concatenate(
        copy.deepcopy(model).set_params(n_predict_samples=n_reference)
        .predict_marginals(X_test)
    )
    row = {"reference": calibration(y_test, split(reference, y_test), classes)}
    errors = {(S, a): [] for S in SAMPLES for a in (False, True)}
    scores = {(S, a): [] for S in SAMPLES for a in (False, True)}
    for seed in range(n_seeds):
        other = copy.deepcopy(model).set_params(n_predict_samples=RECORDED)
        other._predict_seed = 1000 + seed
        samples = recorded_samples(other, X_test)
        for S, antithetic in errors:
            m = estimate(samples, S, antithetic)
            errors[S, antithetic].append(np.sqrt(np.mean((m - reference) ** 2)))
            scores[S, antithetic].append(
                calibration(y_test, split(m, y_test), classes)
            )
    for (S, antithetic), values in errors.items():
        key = f"{S} {'antithetic' if antithetic else 'independent'}"
        row[key] = {
            "rms": float(np.mean(values)),
            "nll": float(np.mean([c["nll"] for c in scores[S, antithetic]])),
            "ece": float(np.mean([c["ece"] for c in scores[S, antithetic]])),
        }
    return row


def summary_rows(name, rows):
    """One data set's lines of the two tables: means over its folds."""
    def mean(key, field):
        return float(np.mean([r[key][field] for r in rows]))

    errors = [name] + [
        f"{mean(f'{S} independent', 'rms'):.4f} / "
        f"{mean(f'{S} antithetic', 'rms'):.4f}"
        for S in SAMPLES
    ]
    calib = [
        name,
        f"{mean('32 independent', 'nll'):.4f} / {mean('32 independent', 'ece'):.4f}",
        f"{mean('16 antithetic', 'nll'):.4f} / {mean('16 antithetic', 'ece'):.4f}",
        f"{mean('32 antithetic', 'nll'):.4f} / {mean('32 antithetic', 'ece'):.4f}",
        f"{mean('reference', 'nll'):.4f} / {mean('reference', 'ece'):.4f}",
    ]
    return errors, calib


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", choices=list(DATASETS),
                        default=list(DATASETS), metavar="NAME")
    parser.add_argument("--folds", nargs="+", type=int, default=[0, 1, 2, 3, 4],
                        metavar="K")
    parser.add_argument("--seeds", type=int, default=5,
                        help="prediction seeds per fold (default 5)")
    parser.add_argument("--reference", type=int, default=2048, metavar="S",
                        help="draws of the reference marginals (default 2048)")
    parser.add_argument("--data", default=str(DEFAULT_DATA_DIR), metavar="DIR")
    parser.add_argument("--out", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    data_dir = check_data_dir(args.data)
    print(f"command: {command_line()}")
    results, error_rows, calibration_rows = {}, [], []
    for name in args.datasets:
        rows = []
        for fold in args.folds:
            rows.append(measure_fold(
                data_dir, DATASETS[name], fold, args.seeds, args.reference
            ))
            r = rows[-1]
            print(f"  {name} fold {fold}: RMS error 32 independent "
                  f"{r['32 independent']['rms']:.4f}, 16 antithetic "
                  f"{r['16 antithetic']['rms']:.4f}", flush=True)
        results[name] = rows
        errors, calib = summary_rows(name, rows)
        error_rows.append(errors)
        calibration_rows.append(calib)
    print()
    print("RMS difference from the reference marginals, independent / "
          "antithetic draws (mean over folds and seeds):")
    print(markdown_table(["data set"] + [f"S={S}" for S in SAMPLES], error_rows))
    print()
    print("NLL / ECE of the test marginals (mean over folds and seeds):")
    print(markdown_table(
        ["data set", "32 independent", "16 antithetic", "32 antithetic",
         f"reference ({args.reference})"],
        calibration_rows,
    ))
    print(f"command: {command_line()}")
    if args.out:
        write_json(args.out, {"command": command_line(),
                              "environment": environment(), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
