"""Throughput of the compiled chain kernels against plain NumPy.

Prints, for V in {3, 17, 45}, sequence lengths {1, 10, 100, 1000} and S in
{1, 32}, the forward-backward and Viterbi throughput in token x V^2 cells per
second of :mod:`skgpstruct.chain` and of the same recursions in vectorised
NumPy (over samples and sequences, a Python loop over positions only:
:func:`numpy_forward_backward`, :func:`numpy_viterbi`), with their ratio.
Then the same for the log-space fallback (pairwise range > 300), against
NumPy's recursion in log space.

Run from the repository root::

    python benchmarks/bench_chain.py [--quick] [--out FILE]

``--out`` also writes the rows as JSON (``_common.write_json``).
"""

import argparse
import sys
import time

import numpy as np
from _common import seconds_per_call
from scipy.special import logsumexp

from skgpstruct import chain

COLUMNS = ("V", "T", "S", "tokens", "fb", "fb_numpy", "fb_ratio", "viterbi",
           "viterbi_numpy", "viterbi_ratio")
LABELS = (3, 17, 45)
LENGTHS = (1, 10, 100, 1000)
SAMPLES = (1, 32)
MAX_OUTPUT_BYTES = 2e8  # marginals + pair marginals of one call


def numpy_forward_backward(unary, pairwise, length, log_space=False):
    """Forward-backward in vectorised NumPy over sequences of ``length``.

    The scaled recursion (potentials exponentiated after a shift, each
    position's messages normalised), or with ``log_space`` the recursion in
    logarithms (``logaddexp`` reductions), as the compiled kernels do on
    their two paths. Returns what :func:`skgpstruct.chain.forward_backward`
    returns: log partition functions (S, n), marginals (S, n * length, V)
    and pair marginals summed over each sequence (S, n, V, V).
    """
    S, N, V = unary.shape
    u = unary.reshape(S, N // length, length, V)
    if log_space:
        alpha = np.empty_like(u)
        beta = np.empty_like(u)
        alpha[:, :, 0] = u[:, :, 0]
        pw = pairwise[:, None]  # (S, 1, V, V)
        for t in range(1, length):
            alpha[:, :, t] = u[:, :, t] + logsumexp(
                alpha[:, :, t - 1, :, None] + pw, axis=-2
            )
        beta[:, :, -1] = 0.0
        for t in range(length - 2, -1, -1):
            beta[:, :, t] = logsumexp(
                pw + (u[:, :, t + 1] + beta[:, :, t + 1])[:, :, None, :], axis=-1
            )
        log_z = logsumexp(alpha[:, :, -1], axis=-1)
        marginals = np.exp(alpha + beta - log_z[:, :, None, None])
        pair = np.exp(
            alpha[:, :, :-1, :, None] + pw[:, :, None]
            + (u[:, :, 1:] + beta[:, :, 1:])[:, :, :, None, :]
            - log_z[:, :, None, None, None]
        ).sum(axis=2)
        return log_z, marginals.reshape(S, N, V), pair
    shift = u.max(axis=-1, keepdims=True)
    phi = np.exp(u - shift)
    pw_shift = pairwise.max(axis=(1, 2), keepdims=True)
    psi = np.exp(pairwise - pw_shift)[:, None]  # (S, 1, V, V)
    alpha = np.empty_like(phi)
    beta = np.empty_like(phi)
    scale = np.empty(phi.shape[:3])
    x = phi[:, :, 0]
    scale[:, :, 0] = x.sum(axis=-1)
    alpha[:, :, 0] = x / scale[:, :, 0, None]
    for t in range(1, length):
        x = np.matmul(alpha[:, :, t - 1, None, :], psi)[:, :, 0] * phi[:, :, t]
        scale[:, :, t] = x.sum(axis=-1)
        alpha[:, :, t] = x / scale[:, :, t, None]
    beta[:, :, -1] = 1.0
    for t in range(length - 2, -1, -1):
        x = np.matmul(psi, (phi[:, :, t + 1] * beta[:, :, t + 1])[..., None])[..., 0]
        beta[:, :, t] = x / scale[:, :, t + 1, None]
    log_z = (
        np.log(scale).sum(axis=-1) + shift[..., 0].sum(axis=-1)
        + (length - 1) * pw_shift[:, 0]
    )
    marginals = alpha * beta
    nxt = phi[:, :, 1:] * beta[:, :, 1:] / scale[:, :, 1:, None]
    pair = np.matmul(np.swapaxes(alpha[:, :, :-1], -1, -2), nxt) * psi
    return log_z, marginals.reshape(S, N, V), pair


def numpy_viterbi(unary, pairwise, length):
    """Viterbi in vectorised NumPy over sequences of ``length``: the best
    labels (n * length,) and their scores (n,), as
    :func:`skgpstruct.chain.viterbi` returns them (ties to the lowest
    label)."""
    N, V = unary.shape
    n = N // length
    u = unary.reshape(n, length, V)
    back = np.empty((n, length, V), dtype=np.int64)
    delta = u[:, 0].copy()
    for t in range(1, length):
        scores = delta[:, :, None] + pairwise  # (n, V, V): from, to
        back[:, t] = scores.argmax(axis=1)
        delta = scores.max(axis=1) + u[:, t]
    labels = np.empty((n, length), dtype=np.int64)
    labels[:, -1] = delta.argmax(axis=1)
    rows = np.arange(n)
    for t in range(length - 1, 0, -1):
        labels[:, t - 1] = back[rows, t, labels[:, t]]
    return labels.reshape(N), delta.max(axis=1)


def _timed(func, min_time):
    """Seconds per call of ``func`` after one warm-up call."""
    func()
    return seconds_per_call(func, min_time)


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
    log_space = pair_scale > 1.0
    compiled = chain.forward_backward(unary, pairwise, offsets)
    plain = numpy_forward_backward(unary, pairwise, length, log_space)
    for a, b in zip(compiled, plain, strict=True):  # the same results
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)
    fb = cells / _timed(
        lambda: chain.forward_backward(unary, pairwise, offsets), args.time
    )
    fb_ref = cells / _timed(
        lambda: numpy_forward_backward(unary, pairwise, length, log_space),
        args.time,
    )
    row = [n_labels, length, n_samples, unary.shape[1], fb, fb_ref, fb / fb_ref]
    if n_samples == 1:
        labels, _ = chain.viterbi(unary[0], pairwise[0], offsets)
        np.testing.assert_array_equal(
            labels, numpy_viterbi(unary[0], pairwise[0], length)[0]
        )
        vit = cells / _timed(
            lambda: chain.viterbi(unary[0], pairwise[0], offsets), args.time
        )
        vit_ref = cells / _timed(
            lambda: numpy_viterbi(unary[0], pairwise[0], length), args.time
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
            "n/a" if x is None else (f"{x:.1f}x" if i % 3 == 2 else f"{x:.2e}")
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
        return "n/a" if x is None else f"{x:.1f}x"

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
        "cells = samples x tokens x V^2 per call, per second, one thread. NumPy: "
        "the same\nrecursions vectorised over samples and sequences (a Python loop "
        "over positions),\nchecked to give the compiled kernels' results. Viterbi "
        "has no samples axis (n/a for S=32)."
    )
    print(f"total time {time.perf_counter() - start:.0f} s")
    if args.out:
        from _common import command_line, environment, write_json

        write_json(args.out, {
            "command": command_line(),
            "environment": environment(),
            "quick": args.quick,
            "scaled": [dict(zip(COLUMNS, r, strict=True)) for r in rows],
            "fallback": [dict(zip(COLUMNS, r, strict=True)) for r in fallback],
        })


if __name__ == "__main__":
    sys.exit(main())
