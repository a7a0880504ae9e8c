"""The compiled stacked potentials against their sparse-product reference.

For the first training chunk (``CHUNK_TOKENS`` tokens, as a fit cuts them)
of Table 1's fold 0 of every data set, with the CRF++ template features,
times one evaluation's work on the unary potentials with ``n_samples``
Monte Carlo samples (default 8): the lone rows' spread, the samples, and
their gradients, as ``skgpstruct._stacked`` computes them (the build the
estimator loads: AVX2 where the processor has it, ``SKGPSTRUCT_SIMD=baseline``
for the baseline build; ``kernel_build`` in the JSON) in single precision
(the estimator's) and in double precision, and as scipy's sparse
products do (``tests/_stacked_reference.py``, the library's code before
the compiled loops, in double precision). Prints the milliseconds of each,
the ratios to the single-precision kernels, and checks that all give the
same numbers (single precision to its rounding). Without
``../shared/data`` (or ``--synthetic``) it uses a synthetic chunk of the
same size.

Run from the repository root::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_stacked.py [--quick] [--out FILE]
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from skgpstruct._estimator import CHUNK_TOKENS
from skgpstruct._sequences import stack_sequences
from skgpstruct.inference.inducing import InducingFeatures
from skgpstruct.inference.terms import stacked_kernels as _stacked

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import _stacked_reference as reference  # noqa: E402
from _common import seconds_per_call  # noqa: E402

COLUMNS = ("data set", "tokens", "labels", "entries", "drawn entries",
           "compiled ms", "compiled double ms", "sparse ms",
           "double / compiled (median)", "sparse / compiled (median)")


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


def paired_timings(calls, min_time, rounds=11):
    """Best seconds per call of each, and the medians of the per-round
    ratios of the others to the first.

    The calls run in turn, ``rounds`` times each, so that a slow spell of
    the machine (a shared virtual machine here) hits all alike.
    """
    for call in calls:
        call()
    times = np.array([
        [seconds_per_call(call, min_time) for call in calls] for _ in range(rounds)
    ])
    ratios = np.median(times[:, 1:] / times[:, :1], axis=0)
    return times.min(axis=0).tolist(), ratios.tolist()


FLOOR = 1e-6


def chunk_problem(X, offsets, n_labels, n_samples, rng):
    """A chunk's stacked layout and random parameters, noise and output
    gradient for ``n_samples`` samples (values representable in single
    precision, so that every implementation sees the same)."""
    inducing = InducingFeatures(X.shape[1])
    split = inducing.chunk_layout(X, offsets).split
    M, KV, S, T = inducing.n_inducing, n_labels, n_samples, split.n_tokens
    c = rng.uniform(0.3, 2.0, size=M)
    mean, sd = rng.normal(size=(M, KV)), rng.uniform(0.1, 1.0, size=(M, KV))
    eps = rng.normal(size=(split.drawn.size, KV, S))
    xi, g = rng.normal(size=(2, 1, S, T, KV))
    c, mean, sd, eps, xi = (
        a.astype(np.float32).astype(np.float64) for a in (c, mean, sd, eps, xi)
    )
    return split, (c, mean, sd, eps, xi, g)


def compiled_call(kernels, split, problem, dtype):
    """One evaluation's token_sd, unary and backward through ``kernels`` (a
    build of ``skgpstruct._stacked``) in ``dtype``, as a function."""
    c, mean, sd, eps, xi, g = problem
    M, KV = mean.shape
    T = split.n_tokens
    by_token, by_row = split.entries(dtype)
    lone_by_row = split.lone_entries(dtype)
    c_, mean_, sd_, eps_, xi_ = (a.astype(dtype) for a in (c, mean, sd, eps, xi))

    def compiled():
        token_sd = np.empty((T, KV), dtype=dtype)
        kernels.token_sd(*by_token, split.entry_drawn, c_, sd_, FLOOR, token_sd)
        f = np.empty(xi.shape)
        kernels.unary(*by_token, *by_row, c_, mean_, sd_, token_sd, eps_, xi_, f)
        d_cm, d_cs = np.zeros((M, KV)), np.zeros((M, KV))
        kernels.backward(
            *lone_by_row, *by_row, c_, sd_, token_sd, eps_, xi_, g, d_cm, d_cs,
        )
        return f, d_cm, d_cs

    return compiled


def measure(name, X, offsets, n_labels, n_samples, min_time, rng):
    """One row of the table: both implementations' time on this chunk."""
    split, problem = chunk_problem(X, offsets, n_labels, n_samples, rng)
    c, mean, sd, eps, xi, g = problem
    M, T, floor = mean.shape[0], split.n_tokens, FLOOR

    def compiled_in(dtype):
        return compiled_call(_stacked, split, problem, dtype)

    sparse = reference.sparse_split(split, M)

    def with_sparse_products():
        token_sd = reference.token_sd(sparse, c, sd, floor)
        f = reference.unary(sparse, c, mean, sd, token_sd, eps, xi)
        return (f, *reference.backward(sparse, c, sd, token_sd, eps, xi, g))

    single, double = compiled_in(np.float32), compiled_in(np.float64)
    expected = with_sparse_products()
    for rtol, compiled in ((1e-5, single), (1e-10, double)):
        for a, b in zip(compiled(), expected, strict=True):
            np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * np.abs(b).max())
    (t_single, t_double, t_sparse), (r_double, r_sparse) = paired_timings(
        (single, double, with_sparse_products), min_time
    )
    n_drawn_entries = int(np.count_nonzero(split.entry_drawn >= 0))
    return (name, T, n_labels, int(split.value.size), n_drawn_entries,
            1e3 * t_single, 1e3 * t_double, 1e3 * t_sparse, r_double, r_sparse)


def markdown(rows):
    """The rows as a Markdown table."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        name, T, V, nnz, drawn, ms_c, ms_d, ms_s, r_double, r_sparse = row
        lines.append(
            f"| {name} | {T} | {V} | {nnz} | {drawn} | {ms_c:.2f} | {ms_d:.2f} "
            f"| {ms_s:.2f} | {r_double:.1f}x | {r_sparse:.1f}x |"
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
        "spread, samples and gradients. Compiled: single precision, as the\n"
        "estimator samples. Times: the best of 11 runs of each, in turn; "
        "ratios: the median of the 11 runs' ratios."
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
