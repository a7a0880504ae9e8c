"""Prediction at n_jobs=1 and 2 threads, beside sklearn-crfsuite's.

For each data set: a batch GP and a CRF (``c2=0.1``; the regularisation
does not change what a prediction costs) fitted on Table 1's fold 0, and
as test set every sequence of the data set's ``test.data`` outside the
Table 1 pool (all of it for seg, whose pool is ``train.data``: thousands
of tokens, several of the estimator's chunks; only times are measured
on them). ``predict`` and ``predict_marginals`` are timed in
alternating rounds: the GP with ``n_jobs=1`` and ``n_jobs=2`` (the
chunks of ``predict_marginals`` in threads; ``predict`` does not use
``n_jobs``), the CRF beside them. Each model starts from its own input,
built beforehand: the GP from its CSR template features, the CRF from
crfsuite's item sequences (``CRF.predict`` would build them from the
feature dicts on every call); the CRF's marginals are read from its tagger
straight into arrays. Then the same calls one sentence at a time, as a
tagging service makes them: each of the first 100 test sequences its own
call (microseconds per sentence, and the GP's over the CRF's). Printed per
data set: test tokens,
milliseconds per call (best of the rounds), the GP's times over the CRF's
and n_jobs=1 over n_jobs=2 (medians of the rounds' ratios), and whether
the marginals at both n_jobs are bit-identical.

Run from the repository root (sklearn-crfsuite from the ``bench`` extra)::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_predict.py [--rounds R]
"""

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
from _common import (
    CRF_MISSING,
    DATASETS,
    _fit_crf,
    add_timing_arguments,
    check_data_dir,
    command_line,
    crf_items,
    crf_marginals,
    crf_predict,
    crfsuite_available,
    environment,
    fold_split,
    load_pool,
    markdown_table,
    read_folds,
    seconds_per_call,
    take,
    template_features,
    to_crfsuite,
    write_json,
)

from skgpstruct import GPStructClassifier
from skgpstruct.io import read_conll

#: Sentences predicted one per call, for the one-sentence columns.
ONE_AT_A_TIME = 100

ONE_COLUMNS = [
    "sentences", "mean tokens", "GP predict us", "CRF predict us",
    "GP / CRF predict, one", "GP predict_marginals us",
    "CRF predict_marginals us", "GP / CRF marginals, one",
]

COLUMNS = [
    "data set", "test tokens", "GP predict ms", "CRF predict ms",
    "GP / CRF predict", "GP predict_marginals ms (n_jobs=1)",
    "GP predict_marginals ms (n_jobs=2)", "CRF predict_marginals ms",
    "GP (n_jobs=1) / CRF marginals", "n_jobs=1 / n_jobs=2 marginals",
    "identical",
]


def timing_pool(data_dir, dataset):
    """Token rows and labels of ``test.data``'s sequences after the Table 1
    pool (all of them when the pool is another file)."""
    tokens, labels = read_conll(
        Path(data_dir) / "crfpp" / dataset.name / "test.data",
        encoding=dataset.encoding,
    )
    start = dataset.n_data if dataset.pool_file == "test.data" else 0
    return tokens[start:], labels[start:]


def fold_and_pool(data_dir, dataset):
    """Fold 0's training features and labels, and the timing pool's features
    and labels (the vocabulary of the training fold)."""
    tokens, labels, template = load_pool(data_dir, dataset)
    train, _ = fold_split(read_folds(data_dir, dataset), 0, dataset.n_train)
    test_tokens, test_labels = timing_pool(data_dir, dataset)
    X_train, X_test, names, _ = template_features(
        template, take(tokens, train), test_tokens
    )
    return X_train, take(labels, train), X_test, test_labels, np.asarray(names)


def measure(name, data, rounds, min_time):
    """One data set's row (see the module docstring)."""
    X_train, y_train, X_test, y_test, names = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gp = GPStructClassifier(random_state=0).fit(X_train, y_train)
    crf = _fit_crf(to_crfsuite(X_train, names), y_train, 0.1)
    items = crf_items(to_crfsuite(X_test, names))
    one = gp.predict_marginals(X_test)
    two = gp.set_params(n_jobs=2).predict_marginals(X_test)
    identical = all(np.array_equal(a, b) for a, b in zip(one, two, strict=True))

    def marginals(n_jobs):
        return lambda: gp.set_params(n_jobs=n_jobs).predict_marginals(X_test)

    # One sentence per call, as a tagging service predicts: the first
    # ONE_AT_A_TIME test sequences, each its own call.
    singles = [[x] for x in X_test[:ONE_AT_A_TIME]]
    single_items = [[item] for item in items[:ONE_AT_A_TIME]]
    calls = {
        "gp predict": lambda: gp.predict(X_test),
        "crf predict": lambda: crf_predict(crf, items),
        "gp marginals 1": marginals(1),
        "gp marginals 2": marginals(2),
        "crf marginals": lambda: crf_marginals(crf, items),
        "gp predict one": lambda: [gp.predict(x) for x in singles],
        "crf predict one": lambda: [crf_predict(crf, i) for i in single_items],
        "gp marginals one": lambda: [gp.predict_marginals(x) for x in singles],
        "crf marginals one": lambda: [crf_marginals(crf, i) for i in single_items],
    }
    times = {key: [] for key in calls}
    for _ in range(rounds):
        for key, call in calls.items():
            times[key].append(seconds_per_call(call, min_time))

    def best_ms(key):
        return 1e3 * min(times[key])

    def best_us_per_sentence(key):
        return 1e6 * min(times[key]) / len(singles)

    def median_ratio(a, b):
        return float(np.median(np.divide(times[a], times[b])))

    return {
        "data set": name,
        "test tokens": int(sum(len(s) for s in y_test)),
        "GP predict ms": best_ms("gp predict"),
        "CRF predict ms": best_ms("crf predict"),
        "GP / CRF predict": median_ratio("gp predict", "crf predict"),
        "GP predict_marginals ms (n_jobs=1)": best_ms("gp marginals 1"),
        "GP predict_marginals ms (n_jobs=2)": best_ms("gp marginals 2"),
        "CRF predict_marginals ms": best_ms("crf marginals"),
        "GP (n_jobs=1) / CRF marginals": median_ratio("gp marginals 1",
                                                      "crf marginals"),
        "n_jobs=1 / n_jobs=2 marginals": median_ratio("gp marginals 1",
                                                      "gp marginals 2"),
        "identical": "yes" if identical else "NO",
        "sentences": len(singles),
        "mean tokens": float(np.mean([x.shape[0] for x in X_test[:ONE_AT_A_TIME]])),
        "GP predict us": best_us_per_sentence("gp predict one"),
        "CRF predict us": best_us_per_sentence("crf predict one"),
        "GP / CRF predict, one": median_ratio("gp predict one", "crf predict one"),
        "GP predict_marginals us": best_us_per_sentence("gp marginals one"),
        "CRF predict_marginals us": best_us_per_sentence("crf marginals one"),
        "GP / CRF marginals, one": median_ratio("gp marginals one",
                                                "crf marginals one"),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", choices=list(DATASETS),
                        default=list(DATASETS), metavar="NAME")
    args = add_timing_arguments(parser, rounds=3).parse_args(argv)
    data_dir = check_data_dir(args.data)
    if not crfsuite_available():
        print(CRF_MISSING)
        return 1
    print(f"command: {command_line()}")
    rows = []
    for name in args.datasets:
        data = fold_and_pool(data_dir, DATASETS[name])
        rows.append(measure(name, data, args.rounds, args.min_time))
        print(f"  {name}: done", flush=True)
    print()
    print(markdown_table(COLUMNS, [
        [row[c] if isinstance(row[c], str | int)
         else (f"{row[c]:.2f}x" if "/" in c else f"{row[c]:.1f}")
         for c in COLUMNS]
        for row in rows
    ]))
    print()
    print("One sentence per call (the first test sequences, each its own call):")
    print()
    print(markdown_table(["data set", *ONE_COLUMNS], [
        [row["data set"], *(
            f"{row[c]:.2f}x" if "/" in c else
            (str(row[c]) if isinstance(row[c], int) else f"{row[c]:.1f}")
            for c in ONE_COLUMNS
        )]
        for row in rows
    ]))
    print()
    print("Milliseconds, microseconds per sentence: best of the rounds (each "
          f"the mean over calls lasting at least {args.min_time:g} s); ratios: "
          "median of the rounds' ratios.")
    print(f"command: {command_line()}")
    if args.out:
        write_json(args.out, {"command": command_line(),
                              "environment": environment(), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
