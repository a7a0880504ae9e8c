"""The compiled kernels' two builds against each other.

``skgpstruct._chain`` and ``skgpstruct._stacked`` are compiled for the
baseline instruction set and, on x86-64, as ``<module>_avx2`` with AVX2 and
FMA (``skgpstruct/_simd.py``). This times both builds on the same inputs,
in turn in one process, and prints each build's milliseconds per call
(best round) and the AVX2 build's time over the baseline's (median of the
rounds' ratios; below 1: the AVX2 build is faster):

* forward-backward (8 samples, the estimator's) on random batches, for 2
  to 45 labels;
* Viterbi on the same batches, both of its steps (row-wise and
  column-wise, ``by_columns``) in both builds, as times over the
  baseline build's row-wise step;
* one evaluation of the stacked potentials (spread, samples, gradients;
  single precision, 8 samples) on the first chunk of Table 1's fold 0 of
  every data set (``bench_stacked.py``'s problem; a synthetic chunk
  without ``../shared/data``).

It is what decided which build each kernel runs (``skgpstruct/chain.py``).

Run from the repository root::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_builds.py [--rounds R] [--quick]
"""

import argparse
import sys
from pathlib import Path

import numpy as np
from _common import (
    DEFAULT_DATA_DIR,
    command_line,
    environment,
    markdown_table,
    write_json,
)
from bench_stacked import (
    chunk_problem,
    compiled_call,
    paired_timings,
    synthetic_chunk,
    table1_chunks,
)

from skgpstruct._simd import avx2_modules, baseline_kernels

#: (labels, tokens per sequence, sequences): 2 (seg), 3 (basenp), 12
#: (chunking, JapaneseNE), 17 and 45 labels (BENCHMARK.md section 3's
#: sizes), and between.
SHAPES = ((2, 25, 50), (3, 25, 50), (5, 25, 50), (8, 25, 50), (10, 25, 50),
          (12, 25, 50), (17, 100, 20), (24, 100, 20), (45, 100, 10))
N_SAMPLES = 8
COLUMNS = ("labels", "tokens", "fb base ms", "fb avx2 ms", "fb avx2 / base",
           "viterbi rows base ms", "rows avx2 / rows base",
           "columns base / rows base", "columns avx2 / rows base")


STACKED_COLUMNS = ("data set", "tokens", "labels", "base ms", "avx2 ms",
                   "avx2 / base")


def builds(module="_chain"):
    """The two builds of ``module``, or exit with the reason the AVX2 one
    cannot run."""
    modules, reason = avx2_modules()
    if modules is None:
        sys.exit(f"bench_builds: {reason}")
    return baseline_kernels(module), modules[module]


def measure_stacked(base, avx2, chunk, rounds, min_time, rng):
    """One row: both builds' stacked potentials on one chunk."""
    name, X, offsets, n_labels = chunk
    split, problem = chunk_problem(X, offsets, n_labels, N_SAMPLES, rng)
    calls = [compiled_call(m, split, problem, np.float32) for m in (base, avx2)]
    for got, expected in zip(calls[1](), calls[0](), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-4,
                                   atol=1e-4 * np.abs(expected).max())
    times, (ratio,) = paired_timings(calls, min_time, rounds)
    return dict(zip(STACKED_COLUMNS, (name, split.n_tokens, n_labels,
                                      *(1e3 * t for t in times), ratio), strict=True))


def measure(base, avx2, n_labels, length, n_sequences, rounds, min_time, rng):
    """One row: both builds' forward-backward and Viterbi on one batch."""
    V, T, S = n_labels, length * n_sequences, N_SAMPLES
    offsets = np.arange(0, T + 1, length, dtype=np.int64)
    unary, pairwise = rng.normal(size=(S, T, V)), rng.normal(size=(S, V, V))
    out = {m: (np.empty((S, n_sequences)), np.empty((S, T, V)),
               np.zeros((S, n_sequences, V, V))) for m in (base, avx2)}
    def fb(m):
        return lambda: m.forward_backward(unary, pairwise, offsets, *out[m], True, True)

    def vit(m, by_columns):
        outputs = decoded[m, by_columns]
        return lambda: m.viterbi(unary[0], pairwise[0], offsets, *outputs, by_columns)

    decoded = {(m, c): (np.empty(T, np.int64), np.empty(n_sequences),
                        np.empty((length - 1, V), np.int32))
               for m in (base, avx2) for c in (False, True)}
    fb_times, (fb_ratio,) = paired_timings([fb(base), fb(avx2)], min_time, rounds)
    steps = [(m, c) for m in (base, avx2) for c in (False, True)]
    vit_times, vit_ratios = paired_timings([vit(*step) for step in steps], min_time,
                                           rounds)
    # the builds compute the same function (to rounding; Viterbi to the bit)
    np.testing.assert_allclose(out[avx2][1], out[base][1], rtol=1e-9, atol=1e-12)
    for step in steps[1:]:
        for got, expected in zip(decoded[step], decoded[steps[0]], strict=True):
            np.testing.assert_array_equal(got, expected)
    rows_base, ratios = 1e3 * vit_times[0], [vit_ratios[i] for i in (1, 0, 2)]
    return dict(zip(COLUMNS, (V, T, *(1e3 * t for t in fb_times), fb_ratio,
                              rows_base, *ratios), strict=True))


def markdown(rows):
    return markdown_table(list(COLUMNS), [
        [r["labels"], r["tokens"], *(f"{r[c]:.3f}" for c in COLUMNS[2:4]),
         f"{r[COLUMNS[4]]:.2f}x", f"{r[COLUMNS[5]]:.3f}",
         *(f"{r[c]:.2f}x" for c in COLUMNS[6:])] for r in rows])


def markdown_stacked(rows):
    return markdown_table(list(STACKED_COLUMNS), [
        [r["data set"], r["tokens"], r["labels"], f"{r['base ms']:.2f}",
         f"{r['avx2 ms']:.2f}", f"{r['avx2 / base']:.2f}x"] for r in rows])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=11,
                        help="alternating rounds of every call (default 11)")
    parser.add_argument("--quick", action="store_true", help="short timings")
    parser.add_argument("--data", default=str(DEFAULT_DATA_DIR), metavar="DIR",
                        help="the shared data folder (default: ../shared/data)")
    parser.add_argument("--out", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    base, avx2 = builds()
    rng = np.random.default_rng(0)
    min_time = 0.005 if args.quick else 0.1
    rows = [measure(base, avx2, *shape, args.rounds, min_time, rng) for shape in SHAPES]
    print("Chain kernels, random batches:\n")
    print(markdown(rows))
    if Path(args.data, "crfpp").is_dir():
        chunks = list(table1_chunks(args.data))
    else:
        print(f"\n{args.data}/crfpp not found: a synthetic chunk instead")
        chunks = [synthetic_chunk(rng)]
    stacked = builds("_stacked")
    stacked_rows = [measure_stacked(*stacked, chunk, args.rounds, min_time, rng)
                    for chunk in chunks]
    print("\nStacked potentials, one evaluation (single precision, "
          f"{N_SAMPLES} samples):\n")
    print(markdown_stacked(stacked_rows))
    print(f"\ncommand: {command_line()}")
    if args.out:
        write_json(args.out, {"command": command_line(), "environment": environment(),
                              "quick": args.quick, "rows": rows,
                              "stacked_rows": stacked_rows})


if __name__ == "__main__":
    main()
