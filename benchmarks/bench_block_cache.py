"""Fits with the block cache against fits without it (fresh memory each time).

For Table 1's fold 0 of every data set, with the CRF++ template features,
fits ``GPStructClassifier(random_state=0)`` (plus ``--setting`` parameters)
in a fresh process, once as the library does (NumPy's large temporaries
through ``skgpstruct._block_cache``) and once with ``reuse_blocks``
replaced by a no-op (every temporary from ``malloc``, as without the
cache), alternating, ``--rounds`` times each; with ``--fits N``, N fits
in each process and the last one measured (a process that only fits GPs,
as a grid search does). Prints per data set the best fit time of each,
the median of the rounds' time ratios, the minor page faults and system
CPU seconds of a fit, and the process's peak resident memory; and checks
that both fits give the same model (the cache changes where arrays live,
not what they hold).

Run from the repository root::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_block_cache.py \
        [--fits N] [--quick] [--out FILE]
"""

import argparse
import contextlib
import json
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
COLUMNS = ("data set", "training tokens", "iterations",
           "fit s (cache)", "fit s (no cache)", "no cache / cache (median)",
           "page faults (cache)", "page faults (no cache)",
           "system s (cache)", "system s (no cache)",
           "peak MB (cache)", "peak MB (no cache)")


def child(dataset_name, data_dir, setting, use_cache, n_fits=1):
    """Fit ``n_fits`` times in this process; print the last fit's
    measurements as JSON."""
    sys.path.insert(0, str(HERE))
    from _common import DATASETS, table1_training_set

    import skgpstruct._estimator
    import skgpstruct.inference.elbo
    from skgpstruct import GPStructClassifier
    from skgpstruct._block_cache import cache_info

    if not use_cache:
        for module in (skgpstruct._estimator, skgpstruct.inference.elbo):
            module.reuse_blocks = contextlib.nullcontext
    X, y = table1_training_set(data_dir, DATASETS[dataset_name])
    for _ in range(n_fits):
        model = GPStructClassifier(**{"random_state": 0, **setting})
        hits = cache_info()["hits"]
        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.fit(X, y)
        seconds = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({
        "seconds": seconds,
        "faults": after.ru_minflt - before.ru_minflt,
        "system": after.ru_stime - before.ru_stime,
        "peak_mb": after.ru_maxrss / 1024,  # kilobytes on Linux
        "tokens": int(sum(len(s) for s in y)),
        "n_iter": int(model.n_iter_),
        "reused_blocks": cache_info()["hits"] - hits,
        "model": [float(np.sum(model.q_mu_)), float(np.sum(model.q_sqrt_)),
                  float(np.sum(model.pairwise_mean_))],
    }))


def run_child(dataset_name, data_dir, setting_args, use_cache, n_fits=1):
    command = [sys.executable, __file__, "--child", dataset_name, "--data",
               str(data_dir), "--fits", str(n_fits), *setting_args]
    if not use_cache:
        command.append("--no-cache")
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(dataset_name, data_dir, setting_args, rounds, n_fits=1):
    """One row: ``rounds`` alternating processes with and without the cache
    (the last of their ``n_fits`` fits)."""
    runs = {True: [], False: []}
    for r in range(rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        for use_cache in order:
            runs[use_cache].append(
                run_child(dataset_name, data_dir, setting_args, use_cache, n_fits)
            )
    models = {json.dumps(run["model"]) for both in runs.values() for run in both}
    if len(models) != 1:
        raise AssertionError(f"{dataset_name}: the fits differ: {models}")
    if any(run["reused_blocks"] for run in runs[False]):
        raise AssertionError(f"{dataset_name}: the fit without the cache used it")
    ratios = [b["seconds"] / a["seconds"]
              for a, b in zip(runs[True], runs[False], strict=True)]

    def best(key, use_cache):
        return min(run[key] for run in runs[use_cache])

    def median(key, use_cache):
        return float(np.median([run[key] for run in runs[use_cache]]))

    first = runs[True][0]
    return (dataset_name, first["tokens"], first["n_iter"],
            best("seconds", True), best("seconds", False), float(np.median(ratios)),
            median("faults", True), median("faults", False),
            median("system", True), median("system", False),
            median("peak_mb", True), median("peak_mb", False))


def markdown(rows):
    """The rows as a Markdown table."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        (name, tokens, n_iter, s_on, s_off, ratio, f_on, f_off, sys_on, sys_off,
         mb_on, mb_off) = row
        lines.append(
            f"| {name} | {tokens} | {n_iter} | {s_on:.2f} | {s_off:.2f} | "
            f"{ratio:.2f}x | {f_on:,.0f} | {f_off:,.0f} | {sys_on:.2f} | "
            f"{sys_off:.2f} | {mb_on:.0f} | {mb_off:.0f} |"
        )
    return "\n".join(lines)


def main(argv=None):
    sys.path.insert(0, str(HERE))
    from _common import DATASETS, DEFAULT_DATA_DIR
    from dev_splits import parse_setting

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", default=str(DEFAULT_DATA_DIR), metavar="DIR",
        help="the shared data folder (default: ../shared/data beside the checkout)",
    )
    parser.add_argument("--setting", default="", type=parse_setting,
                        help="estimator parameters, name=value ...")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fits", type=int, default=1,
                        help="fits per process, the last one measured (default 1)")
    parser.add_argument("--quick", action="store_true", help="one round")
    parser.add_argument("--out", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--child", choices=list(DATASETS), help=argparse.SUPPRESS)
    parser.add_argument("--no-cache", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.data, args.setting, not args.no_cache, args.fits)
        return
    if not Path(args.data, "crfpp").is_dir():
        print(f"{args.data}/crfpp not found: nothing to measure")
        return
    setting_args = []
    if args.setting:
        setting_args = ["--setting",
                        " ".join(f"{k}={v}" for k, v in args.setting.items())]
    rounds = 1 if args.quick else args.rounds
    if args.fits < 1:
        parser.error(f"--fits must be at least 1, got {args.fits}")
    rows = [measure(name, args.data, setting_args, rounds, args.fits)
            for name in DATASETS]
    print(markdown(rows))
    which = "a fresh process" if args.fits == 1 else (
        f"the last of {args.fits} in a fresh process")
    print(
        f"\nTable 1 fold 0 fits ({ {'random_state': 0, **args.setting} }), each "
        f"{which}, {rounds} alternating rounds: best fit seconds, median "
        "ratio of the rounds' times, median page faults, system CPU seconds and "
        "peak resident memory of a fit's process; both fits give the same model."
    )
    if args.out:
        from _common import command_line, environment, write_json

        write_json(args.out, {
            "command": command_line(),
            "environment": environment(),
            "quick": args.quick,
            "rounds": rounds,
            "fits_per_process": args.fits,
            "setting": args.setting,
            "rows": [dict(zip(COLUMNS, r, strict=True)) for r in rows],
        })


if __name__ == "__main__":
    main()
