"""The compiled stacked potentials against their sparse-product reference.

For the first training chunk (``CHUNK_TOKENS`` tokens, as a fit cuts them)
of Table 1's fold 0 of every data set, with the CRF++ template features,
times one evaluation's work on the unary potentials with ``n_samples``
Monte Carlo samples (default 8): the lone rows' spread, the samples, and
their gradients, as ``skgpstruct._stacked`` computes them and as scipy's
sparse products do (``tests/_stacked_reference.py``, the library's code
before the compiled loops). Prints the milliseconds of each, their ratio,
and checks that both give the same numbers. Without ``../shared/data``
(or ``--synthetic``) it uses a synthetic chunk of the same size.

Run from the repository root::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_stacked.py [--quick] [--out FILE]
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from skgpstruct import _stacked
from skgpstruct._estimator import CHUNK_TOKENS
from skgpstruct._sequences import stack_sequences
from skgpstruct.inference.inducing import InducingFeatures

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import _stacked_reference as reference  # noqa: E402
from _common import seconds_per_call  # noqa: E402

COLUMNS = ("data set", "tokens", "labels", "entries", "drawn entries",
           "compiled ms", "sparse ms", "sparse / compiled (median)")


def first_chunk(X, y):
    """Stacked X, offsets and number of labels of the first CHUNK_TOKENS tokens."""
    lengths = np.cumsum([len(s) for s in y])
    n = max(1, int(np.searchsorted(lengths, CHUNK_TOKENS, side="right")))
    X_chunk, offsets = stack_sequences(X[:n])
    n_labels = len({label for s in y for label in s})
    return sp.csr_matrix(X_chunk), offsets, n_labels


def table1_chunks(data_dir):
    """(name, X, offsets, n_labels) of fold 0's first chunk, per data set."""
    from _common import DATASETS, table1_training_set

    for dataset in DATASETS.values():
        X_train, y_train = table1_training_set(data_dir, dataset)
        yield (dataset.name, *first_chunk(X_train, y_train))


def synthetic_chunk(rng, n_tokens=CHUNK_TOKENS, n_features=20000, n_labels=17):
    """A chunk of binary features, 20 active per token, Zipf-like frequencies."""
    lengths = rng.integers(10, 40, size=n_tokens // 20)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    T = int(offsets[-1])
    columns = np.minimum(rng.zipf(1.3, size=(T, 20)) - 1, n_features - 1)
    X = sp.csr_matrix(
        (np.ones(columns.size), (np.repeat(np.arange(T), 20), columns.ravel())),
        shape=(T, n_features),
    )
    X.data[:] = 1.0  # repeated columns summed, then binary
    return "synthetic", X, offsets, n_labels


def paired_timings(first, second, min_time, rounds=11):
    """Best seconds per call of each and the median of their per-round ratio.

    The two run alternately, ``rounds`` times each, so that a slow spell of
    the machine (a shared virtual machine here) hits both alike.
    """
    first(), second()
    a, b = [], []
    for _ in range(rounds):
        a.append(seconds_per_call(first, min_time))
        b.append(seconds_per_call(second, min_time))
    ratios = np.array(b) / np.array(a)
    return min(a), min(b), float(np.median(ratios))


def measure(name, X, offsets, n_labels, n_samples, min_time, rng):
    """One row of the table: both implementations' time on this chunk."""
    inducing = InducingFeatures(X.shape[1])
    split = inducing.chunk_layout(X, offsets).split
    M, KV, S, T = inducing.n_inducing, n_labels, n_samples, split.n_tokens
    c = rng.uniform(0.3, 2.0, size=M)
    mean, sd = rng.normal(size=(M, KV)), rng.uniform(0.1, 1.0, size=(M, KV))
    eps = rng.normal(size=(split.drawn.size, KV, S))
    xi, g = rng.normal(size=(2, 1, S, T, KV))
    floor = 1e-6
    args = (*split.by_token, split.entry_drawn)
    drawn_rows = split.by_row

    def compiled():
        token_sd = np.empty((T, KV))
        _stacked.token_sd(*args, c, sd, floor, token_sd)
        f = np.empty(xi.shape)
        _stacked.unary(*split.by_token, *drawn_rows, c, mean, sd, token_sd, eps, xi, f)
        d_cm, d_cs = np.zeros((M, KV)), np.zeros((M, KV))
        _stacked.backward(
            *args, *drawn_rows, c, sd, token_sd, eps, xi, g, d_cm, d_cs
        )
        return f, d_cm, d_cs

    sparse = reference.sparse_split(split, M)

    def with_sparse_products():
        token_sd = reference.token_sd(sparse, c, sd, floor)
        f = reference.unary(sparse, c, mean, sd, token_sd, eps, xi)
        return (f, *reference.backward(sparse, c, sd, token_sd, eps, xi, g))

    for a, b in zip(compiled(), with_sparse_products(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)
    t_compiled, t_sparse, ratio = paired_timings(
        compiled, with_sparse_products, min_time
    )
    n_drawn_entries = int(np.count_nonzero(split.entry_drawn >= 0))
    return (name, T, n_labels, int(split.value.size), n_drawn_entries,
            1e3 * t_compiled, 1e3 * t_sparse, ratio)


def markdown(rows):
    """The rows as a Markdown table."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        name, T, V, nnz, drawn, ms_c, ms_s, ratio = row
        lines.append(
            f"| {name} | {T} | {V} | {nnz} | {drawn} | {ms_c:.2f} | {ms_s:.2f} "
            f"| {ratio:.1f}x |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from _common import DEFAULT_DATA_DIR

    parser.add_argument(
        "--data", default=str(DEFAULT_DATA_DIR), metavar="DIR",
        help="the shared data folder (default: ../shared/data beside the checkout)",
    )
    parser.add_argument("--synthetic", action="store_true",
                        help="a synthetic chunk instead of the CRF++ sets")
    parser.add_argument("--n-samples", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="short timings")
    parser.add_argument("--out", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    min_time = 0.01 if args.quick else 0.05
    if args.synthetic or not Path(args.data, "crfpp").is_dir():
        if not args.synthetic:
            print(f"{args.data}/crfpp not found: a synthetic chunk instead")
        chunks = [synthetic_chunk(rng)]
    else:
        chunks = table1_chunks(args.data)
    rows = [measure(*chunk, args.n_samples, min_time, rng) for chunk in chunks]
    print(markdown(rows))
    print(
        f"\nOne evaluation's work on the unary potentials of one chunk "
        f"({args.n_samples} samples, one mixture component, one thread): "
        "spread, samples and gradients. Times: the best of 11 runs of each,\n"
        "alternating; ratio: the median of the 11 runs' ratios."
    )
    if args.out:
        from _common import command_line, environment, write_json

        write_json(args.out, {
            "command": command_line(),
            "environment": environment(),
            "quick": args.quick,
            "rows": [dict(zip(COLUMNS, r, strict=True)) for r in rows],
        })


if __name__ == "__main__":
    main()
