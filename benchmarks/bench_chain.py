"""Throughput of the compiled chain kernels against the NumPy reference.

Prints, for V in {3, 17, 45}, sequence lengths {1, 10, 100, 1000} and S in
{1, 32}, the forward-backward and Viterbi throughput in token x V^2 cells per
second of :mod:`skgpstruct.chain` and of the plain NumPy reference of the
tests (``tests/_chain_reference.py``), with their ratio. Then the same for the
log-space fallback (pairwise range > 300).

Run from the repository root::

    python benchmarks/bench_chain.py [--quick] [--out FILE]

``--out`` also writes the rows as JSON (``_common.write_json``).
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from skgpstruct import chain

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import _chain_reference as ref  # noqa: E402
from _common import seconds_per_call  # noqa: E402

COLUMNS = ("V", "T", "S", "tokens", "fb", "fb_numpy", "fb_ratio", "viterbi",
           "viterbi_numpy", "viterbi_ratio")
LABELS = (3, 17, 45)
LENGTHS = (1, 10, 100, 1000)
SAMPLES = (1, 32)
MAX_OUTPUT_BYTES = 2e8  # marginals + pair marginals of one call


def _timed(func, min_time):
    """Seconds per call of ``func`` after one warm-up call."""
    func()
    return seconds_per_call(func, min_time)


def _reference_rate(func, offsets, n_labels, budget):
    """Cells per second of a reference running sequence by sequence.

    Sequences are processed until ``budget`` seconds have passed (at least
    one), and the rate is measured on the part done.
    """
    cells, start = 0, time.perf_counter()
    for n in range(len(offsets) - 1):
        func(offsets[n], offsets[n + 1])
        cells += (offsets[n + 1] - offsets[n]) * n_labels**2
        if time.perf_counter() - start >= budget:
            break
    return cells / (time.perf_counter() - start)


def _problem(rng, n_samples, n_labels, length, pair_scale, target_tokens):
    bytes_per_seq = 8 * n_samples * n_labels * (length + n_labels)
    n_seq = int(max(1, min(target_tokens // length, MAX_OUTPUT_BYTES // bytes_per_seq)))
    offsets = np.arange(n_seq + 1, dtype=np.int64) * length
    unary = rng.standard_normal((n_samples, n_seq * length, n_labels))
    pairwise = rng.standard_normal((n_samples, n_labels, n_labels)) * pair_scale
    return unary, pairwise, offsets


def _row(rng, n_samples, n_labels, length, pair_scale, args):
    # aim at ~args.time seconds per compiled call, from a rough rate guess
    target = int(args.time * 2e8 / n_labels**2 / max(1.0, 30.0 / length))
    unary, pairwise, offsets = _problem(
        rng, n_samples, n_labels, length, pair_scale, max(target, 1000)
    )
    cells = unary.shape[0] * unary.shape[1] * n_labels**2
    fb = cells / _timed(
        lambda: chain.forward_backward(unary, pairwise, offsets), args.time
    )
    fb_ref = _reference_rate(
        lambda a, b: ref.forward_backward(
            unary[:1, a:b], pairwise[:1], np.array([0, b - a])
        ),
        offsets,
        n_labels,
        args.reference_time,
    )
    row = [n_labels, length, n_samples, unary.shape[1], fb, fb_ref, fb / fb_ref]
    if n_samples == 1:
        vit = cells / _timed(
            lambda: chain.viterbi(unary[0], pairwise[0], offsets), args.time
        )
        vit_ref = _reference_rate(
            lambda a, b: ref.viterbi(unary[0, a:b], pairwise[0], np.array([0, b - a])),
            offsets,
            n_labels,
            args.reference_time,
        )
        row += [vit, vit_ref, vit / vit_ref]
    else:
        row += [None, None, None]
    return row


def _print_table(rows):
    header = (
        f"{'V':>3} {'T':>5} {'S':>3} {'tokens':>8} | "
        f"{'FB cells/s':>10} {'NumPy':>9} {'ratio':>7} | "
        f"{'Vit cells/s':>11} {'NumPy':>9} {'ratio':>7}"
    )
    print(header)
    print("-" * len(header))
    for v, t, s, n, *rates in rows:
        cols = [
            "n/a" if x is None else (f"{x:.0f}x" if i % 3 == 2 else f"{x:.2e}")
            for i, x in enumerate(rates)
        ]
        print(
            f"{v:>3} {t:>5} {s:>3} {n:>8} | {cols[0]:>10} {cols[1]:>9} "
            f"{cols[2]:>7} | {cols[3]:>11} {cols[4]:>9} {cols[5]:>7}"
        )


def markdown(rows):
    """A Markdown table of rows as stored in the JSON (dicts keyed COLUMNS)."""
    from _common import markdown_table

    def rate(x):
        return "n/a" if x is None else f"{x:.2e}"

    def ratio(x):
        return "n/a" if x is None else f"{x:.0f}x"

    return markdown_table(
        ["V", "T", "S", "tokens", "FB cells/s", "NumPy", "ratio",
         "Viterbi cells/s", "NumPy", "ratio"],
        [[r["V"], r["T"], r["S"], r["tokens"], rate(r["fb"]), rate(r["fb_numpy"]),
          ratio(r["fb_ratio"]), rate(r["viterbi"]), rate(r["viterbi_numpy"]),
          ratio(r["viterbi_ratio"])] for r in rows],
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="short timings (a smoke run)"
    )
    parser.add_argument("--out", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    args.time = 0.03 if args.quick else 0.2
    args.reference_time = 0.03 if args.quick else 0.25
    rng = np.random.default_rng(0)
    start = time.perf_counter()

    print("Scaled recursion (unary and pairwise ~ N(0, 1)):")
    rows = [
        _row(rng, s, v, t, 1.0, args)
        for v in LABELS
        for t in LENGTHS
        for s in SAMPLES
    ]
    _print_table(rows)
    print()
    print("Log-space fallback (pairwise ~ N(0, 1000^2), range > 300):")
    fallback = [_row(rng, 1, v, 1000, 1000.0, args) for v in LABELS]
    _print_table(fallback)
    print()
    print(
        "cells = samples x tokens x V^2 per call, per second, one thread. The "
        "NumPy reference\n(tests/_chain_reference.py) runs sequence by sequence "
        f"on sample 0 for ~{args.reference_time} s per\ncell and its rate is "
        "measured on that subset. Viterbi has no samples axis (n/a for S=32)."
    )
    print(f"total time {time.perf_counter() - start:.0f} s")
    if args.out:
        from _common import command_line, environment, write_json

        write_json(args.out, {
            "command": command_line(),
            "environment": environment(),
            "quick": args.quick,
            "reference_seconds": args.reference_time,
            "scaled": [dict(zip(COLUMNS, r, strict=True)) for r in rows],
            "fallback": [dict(zip(COLUMNS, r, strict=True)) for r in fallback],
        })


if __name__ == "__main__":
    sys.exit(main())
