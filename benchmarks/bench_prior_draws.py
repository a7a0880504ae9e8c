"""ESS prior draws: through the Cholesky factor against the feature map.

Elliptical slice sampling (``inference="ess"``) draws the GP prior of the
training tokens' unaries once per iteration. Through the Cholesky factor
``L`` of the Gram matrix a draw is ``L @ z``, ``N^2 V / 2`` multiply-adds;
through the linear kernels' feature map ``Phi`` (one column per scaled
feature and the bias, the lone features of each token collapsed into one
column) it is ``Phi @ z``, one normal deviate per column and label. For
Table 1's fold 0 of every data set (CRF++ template features, a
:class:`~skgpstruct.kernels.LinearKernel`), this times blocks of draws both
ways with the sampler's own code (``skgpstruct.inference.ess``), in turn,
and prints per data set: the tokens ``N``, the columns ``D`` of ``Phi``, the
labels, milliseconds per draw each way, their ratio (median over the
rounds), the cost per unit of each (picoseconds per multiply-add of the
triangular product, nanoseconds per normal deviate of the feature map), and
the way the sampler picks (the feature map when ``D <= N^2 / 600``).

Run from the repository root::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_prior_draws.py [--rounds R]
"""

import argparse
import sys

import numpy as np
from _common import (
    DATASETS,
    add_timing_arguments,
    check_data_dir,
    command_line,
    environment,
    markdown_table,
    table1_training_set,
    write_json,
)
from bench_stacked import paired_timings

from skgpstruct._linalg import jitter_cholesky
from skgpstruct._sequences import stack_sequences
from skgpstruct.inference import ess
from skgpstruct.kernels import LinearKernel

COLUMNS = ("data set", "N", "D", "labels", "factor ms / draw",
           "feature map ms / draw", "factor / feature map (median)",
           "ps per multiply-add (factor)", "ns per deviate (feature map)",
           "the sampler draws through")


def measure(name, X, n_labels, block, rounds, min_time):
    """One row: both ways of drawing ``block`` iterations' prior draws."""
    kernel = LinearKernel()
    n_tokens = X.shape[0]
    factor, jitter = jitter_cholesky(kernel(X), name="the Gram matrix")
    phi = ess.prior_feature_map(X, kernel, always=True)
    rng = np.random.default_rng(0)
    through_factor = ess._PriorDraws(factor, jitter, None, n_labels, rng)
    through_map = ess._PriorDraws(factor, jitter, phi, n_labels, rng)
    (t_factor, t_map), (ratio,) = paired_timings(
        [lambda: through_factor.block(block), lambda: through_map.block(block)],
        min_time, rounds,
    )
    t_factor, t_map = t_factor / block, t_map / block
    chosen = ess.prior_feature_map(X, kernel) is not None
    return {
        "data set": name, "N": n_tokens, "D": phi.shape[1], "labels": n_labels,
        "factor ms / draw": 1e3 * t_factor,
        "feature map ms / draw": 1e3 * t_map,
        "factor / feature map (median)": 1.0 / ratio,
        "ps per multiply-add (factor)": 1e12 * t_factor / (n_tokens**2 * n_labels / 2),
        "ns per deviate (feature map)": 1e9 * t_map / (phi.shape[1] * n_labels),
        "the sampler draws through": "feature map" if chosen else "factor",
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args = add_timing_arguments(parser, rounds=5).parse_args(argv)
    data_dir = check_data_dir(args.data)
    print(f"command: {command_line()}")
    rows = []
    for dataset in DATASETS.values():
        X, y = table1_training_set(data_dir, dataset)
        X_all, _ = stack_sequences(list(X))
        n_labels = len({label for s in y for label in s})
        rows.append(measure(dataset.name, X_all, n_labels, ess._DRAW_BLOCK,
                            args.rounds, args.min_time))
        print(f"  {dataset.name}: done", flush=True)
    formats = {"factor ms / draw": "{:.3f}", "feature map ms / draw": "{:.3f}",
               "factor / feature map (median)": "{:.2f}x",
               "ps per multiply-add (factor)": "{:.0f}",
               "ns per deviate (feature map)": "{:.1f}"}
    print()
    print(markdown_table(COLUMNS, [
        [formats.get(c, "{}").format(row[c]) for c in COLUMNS] for row in rows
    ]))
    print()
    print(f"Blocks of {ess._DRAW_BLOCK} iterations' draws, one thread; times are "
          "the best of the rounds, the ratio the median of the rounds' ratios.")
    print(f"command: {command_line()}")
    if args.out:
        write_json(args.out, {"command": command_line(), "environment": environment(),
                              "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
