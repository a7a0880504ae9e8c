"""Hashed token features (FeatureHasher, 2**20 columns) beside a vocabulary.

sklearn-crfsuite-style token dicts (``_common.token_dicts``: the word
lowercased, its suffixes, case and digit flags, the part of speech, the
same of two neighbours on each side) of the Table 1 fold 0 training and
test sequences of the data sets with word and part-of-speech columns
(basenp, chunking), turned into
features by :class:`skgpstruct.SequenceDictVectorizer` around a
``DictVectorizer`` (the training fold's vocabulary) and around a
``FeatureHasher(n_features=2**20)`` (every column, most of which no token
has). The same GP (defaults, ``random_state=0``, and one prior variance
for all columns, ``feature_groups=None``: hashed columns have no key to
group them by) is fitted on both, in
alternating rounds; ``predict`` and ``predict_marginals`` on the test fold
are timed after each fit. Printed per data set: the design's columns and
the model's (columns with inducing variables), fit seconds, milliseconds
per call (best of the rounds), the size of the pickled model, token error
%, and the hashed run's over the vocabulary run's (medians of the rounds'
ratios).

Run from the repository root::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_hashed.py [--rounds R]
"""

import argparse
import pickle
import sys
import time
import warnings

import numpy as np
from _common import (
    DATASETS,
    add_timing_arguments,
    check_data_dir,
    command_line,
    environment,
    fold_split,
    load_pool,
    markdown_table,
    read_folds,
    seconds_per_call,
    take,
    token_dicts,
    token_error,
    write_json,
)
from sklearn.exceptions import ConvergenceWarning
from sklearn.feature_extraction import FeatureHasher

from skgpstruct import GPStructClassifier, SequenceDictVectorizer

#: Data sets whose rows are (word, part of speech).
WORD_POS_SETS = ("basenp", "chunking")
HASHED_COLUMNS = 2**20

COLUMNS = [
    "data set", "design", "columns", "model columns", "fit s", "predict ms",
    "predict_marginals ms", "pickle MB", "error %",
]
RATIO_COLUMNS = [
    "data set", "fit", "predict", "predict_marginals", "pickle",
]


def fold_zero(data_dir, name):
    """Token dicts and labels of the training and test sequences of fold 0."""
    dataset = DATASETS[name]
    tokens, labels, _ = load_pool(data_dir, dataset)
    train, test = fold_split(read_folds(data_dir, dataset), 0, dataset.n_train)
    return (
        token_dicts(take(tokens, train)), take(labels, train),
        token_dicts(take(tokens, test)), take(labels, test),
    )


def run_once(vectorizer, data, min_time):
    """One fit and the timed predictions of the GP on ``vectorizer``'s features."""
    dicts_train, y_train, dicts_test, y_test = data
    vectorizer = SequenceDictVectorizer(vectorizer)
    X_train = vectorizer.fit_transform(dicts_train)
    X_test = vectorizer.transform(dicts_test)
    model = GPStructClassifier(random_state=0, feature_groups=None)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X_train, y_train)
    fit = time.perf_counter() - start
    predict = seconds_per_call(lambda: model.predict(X_test), min_time)
    marginals = seconds_per_call(lambda: model.predict_marginals(X_test), min_time)
    return {
        "columns": X_train[0].shape[1],
        "model columns": model.q_mu_.shape[-1] - 1,
        "fit s": fit,
        "predict ms": 1e3 * predict,
        "predict_marginals ms": 1e3 * marginals,
        "pickle MB": len(pickle.dumps(model)) / 1e6,
        "error %": token_error(y_test, model.predict(X_test)),
    }


def measure(name, data, rounds, min_time):
    designs = {
        "vocabulary": lambda: None,
        "hashed": lambda: FeatureHasher(n_features=HASHED_COLUMNS),
    }
    runs = {design: [] for design in designs}
    for _ in range(rounds):
        for design, make in designs.items():
            runs[design].append(run_once(make(), data, min_time))
    rows = []
    for design, results in runs.items():
        row = {"data set": name, "design": design}
        for key in ("columns", "model columns", "pickle MB", "error %"):
            row[key] = results[0][key]  # the same every round
        for key in ("fit s", "predict ms", "predict_marginals ms"):
            row[key] = min(r[key] for r in results)
        rows.append(row)
    ratio = {"data set": name}
    for column, key in (("fit", "fit s"), ("predict", "predict ms"),
                        ("predict_marginals", "predict_marginals ms"),
                        ("pickle", "pickle MB")):
        ratio[column] = float(np.median([
            hashed[key] / vocabulary[key]
            for hashed, vocabulary in zip(runs["hashed"], runs["vocabulary"],
                                          strict=True)
        ]))
    return rows, ratio


def cell(column, value):
    if isinstance(value, str | int):
        return str(value)
    if column == "error %":
        return f"{value:.2f}"
    return f"{value:.2f}" if column in ("fit s", "pickle MB") else f"{value:.1f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", choices=WORD_POS_SETS,
                        default=list(WORD_POS_SETS), metavar="NAME")
    args = add_timing_arguments(parser, rounds=3).parse_args(argv)
    data_dir = check_data_dir(args.data)
    print(f"command: {command_line()}")
    rows, ratios = [], []
    for name in args.datasets:
        data_rows, ratio = measure(name, fold_zero(data_dir, name), args.rounds,
                                   args.min_time)
        rows += data_rows
        ratios.append(ratio)
        print(f"  {name}: done", flush=True)
    print()
    print(markdown_table(COLUMNS, [[cell(c, row[c]) for c in COLUMNS] for row in rows]))
    print()
    print("Hashed over vocabulary (median of the rounds' ratios):")
    print()
    print(markdown_table(RATIO_COLUMNS, [
        [r["data set"]] + [f"{r[c]:.2f}x" for c in RATIO_COLUMNS[1:]] for r in ratios
    ]))
    print()
    print(f"Times: best of {args.rounds} rounds (predictions: the mean over calls "
          f"lasting at least {args.min_time:g} s).")
    print(f"command: {command_line()}")
    if args.out:
        write_json(args.out, {"command": command_line(), "environment": environment(),
                              "rows": rows, "ratios": ratios})
    return 0


if __name__ == "__main__":
    sys.exit(main())
