"""Batch fits of two checkouts of skgpstruct, alternating fresh processes.

Fits ``GPStructClassifier(random_state=0)`` on the training part of Table 1
folds (CRF++ template features) with the skgpstruct of checkout BEFORE and
of checkout AFTER, in fresh processes, alternating the order every round:
each process fits every fold of one data set ``--fits`` times (after one
short warm-up fit) and reports each fold's best time. Over the rounds
each fold keeps its best time per checkout. On a shared, noisy machine
one round can be off by 15 %; the best of several alternating rounds is
what compares two versions of the code. Prints per data set the folds'
total fit time for each checkout, the ratio AFTER / BEFORE, the ratio per
L-BFGS iteration (mean over the folds: the fits of two versions may take
other iteration counts), the iterations, and each round's ratio.

Each checkout must have its compiled modules built in place, for example
a frozen worktree of a commit::

    git worktree add /tmp/before COMMIT
    (cd /tmp/before && python setup.py build_ext --inplace)

Run from the repository root::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_checkouts.py /tmp/before . \
        [--datasets NAME ...] [--folds K ...] [--rounds R] [--fits N] \
        [--data DIR] [--out FILE] [--quick]
"""

import argparse
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

WARM_UP_ITERATIONS = 3


def worker(root, dataset_name, data_dir, folds, n_fits, max_iter):
    """Fit the folds with the skgpstruct of ``root``; print JSON lines."""
    sys.path.insert(0, str(Path(root).resolve()))
    sys.path.insert(1, str(HERE))
    import skgpstruct

    where = Path(skgpstruct.__file__).resolve()
    if Path(root).resolve() not in where.parents:
        raise SystemExit(f"skgpstruct was imported from {where}, not from {root}")
    from _common import DATASETS, _git_commit, table1_training_set

    from skgpstruct import GPStructClassifier

    params = {"random_state": 0}
    if max_iter is not None:
        params["max_iter"] = max_iter
    for fold in folds:
        X, y = table1_training_set(data_dir, DATASETS[dataset_name], fold)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            GPStructClassifier(random_state=0, max_iter=WARM_UP_ITERATIONS).fit(X, y)
            best = np.inf
            for _ in range(n_fits):
                start = time.perf_counter()
                model = GPStructClassifier(**params).fit(X, y)
                best = min(best, time.perf_counter() - start)
        print(json.dumps({
            "dataset": dataset_name, "fold": fold, "seconds": best,
            "n_iter": int(model.n_iter_), "elbo": float(model.elbo_history_[-1]),
            "commit": _git_commit(), "skgpstruct": str(where.parent),
        }), flush=True)


def worker_main(argv):
    """``bench_checkouts.py --worker ROOT ...``: :func:`worker` in this
    process, before anything imports skgpstruct (``_common`` does)."""
    parser = argparse.ArgumentParser(prog="bench_checkouts.py --worker")
    parser.add_argument("root")
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--folds", nargs="+", type=int, required=True)
    parser.add_argument("--fits", type=int, required=True)
    parser.add_argument("--max-iter", type=int, default=None)
    args = parser.parse_args(argv)
    worker(args.root, args.dataset, args.data, args.folds, args.fits, args.max_iter)
    return 0


def run_worker(root, dataset_name, data_dir, folds, n_fits, max_iter):
    """One fresh process of :func:`worker`; its records."""
    command = [sys.executable, __file__, "--worker", str(root), "--data",
               str(data_dir), "--dataset", dataset_name, "--fits", str(n_fits),
               "--folds", *map(str, folds)]
    if max_iter is not None:
        command += ["--max-iter", str(max_iter)]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{out.stderr[-3000:]}")
    lines = out.stdout.splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def summarise(runs, folds):
    """Per data set, from ``runs[tree][round]`` (lists of records).

    Returns dicts with the folds' best-time totals of each tree (``before``,
    ``after``, their ``ratio``), the mean over the folds of the ratio of
    seconds per iteration, the iterations summed over the folds, and each
    round's ratio of totals.
    """
    rows = []
    datasets = dict.fromkeys(rec["dataset"] for rnd in runs["before"] for rec in rnd)
    for name in datasets:
        def records(tree, name=name):
            return [[r for r in rnd if r["dataset"] == name] for rnd in runs[tree]]

        best, iterations = {}, {}
        for tree in ("before", "after"):
            by_fold = {}
            for rnd in records(tree):
                for rec in rnd:
                    by_fold.setdefault(rec["fold"], []).append(rec)
            if sorted(by_fold) != sorted(folds):
                raise ValueError(f"{name}: {tree} has folds {sorted(by_fold)}")
            best[tree] = {k: min(r["seconds"] for r in v) for k, v in by_fold.items()}
            iterations[tree] = {k: v[0]["n_iter"] for k, v in by_fold.items()}
        total = {tree: sum(best[tree].values()) for tree in best}
        per_iteration = [
            (best["after"][k] / iterations["after"][k])
            / (best["before"][k] / iterations["before"][k])
            for k in folds
        ]
        rounds = [
            sum(r["seconds"] for r in a) / sum(r["seconds"] for r in b)
            for a, b in zip(records("after"), records("before"), strict=True)
        ]
        rows.append({
            "dataset": name, "folds": list(folds),
            "before": total["before"], "after": total["after"],
            "ratio": total["after"] / total["before"],
            "per_iteration_ratio": float(np.mean(per_iteration)),
            "iterations_before": sum(iterations["before"].values()),
            "iterations_after": sum(iterations["after"].values()),
            "round_ratios": rounds,
        })
    return rows


def markdown(rows):
    """The summary rows as a Markdown table."""
    header = ["data set", "folds", "BEFORE s", "AFTER s", "AFTER / BEFORE",
              "per iteration", "iterations", "each round"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append(
            f"| {row['dataset']} | {', '.join(map(str, row['folds']))} | "
            f"{row['before']:.2f} | {row['after']:.2f} | {row['ratio']:.2f}x | "
            f"{row['per_iteration_ratio']:.2f}x | "
            f"{row['iterations_before']} / {row['iterations_after']} | "
            + ", ".join(f"{r:.2f}" for r in row["round_ratios"]) + " |"
        )
    return "\n".join(lines)


def main(argv=None):
    sys.path.insert(0, str(HERE))
    from _common import DATASETS, DEFAULT_DATA_DIR, check_data_dir, command_line

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", nargs="?", help="checkout of the first version")
    parser.add_argument("after", nargs="?", help="checkout of the second version")
    parser.add_argument("--datasets", nargs="+", default=["chunking", "JapaneseNE"],
                        choices=list(DATASETS))
    parser.add_argument("--folds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--fits", type=int, default=2,
                        help="fits per fold in each process (default 2)")
    parser.add_argument("--max-iter", type=int, default=None,
                        help="GPStructClassifier's max_iter (default: its own)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--out", type=Path, default=None, help="also write JSON")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: fold 0, one round, one fit, max_iter=5")
    args = parser.parse_args(argv)
    if args.before is None or args.after is None:
        parser.error("BEFORE and AFTER checkouts are required")
    for name in ("before", "after"):
        if not (Path(getattr(args, name)) / "skgpstruct").is_dir():
            parser.error(f"{name} {getattr(args, name)!r} holds no skgpstruct folder")
    for name in ("rounds", "fits"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.quick:
        args.folds, args.rounds, args.fits = [0], 1, 1
        args.max_iter = args.max_iter or 5
    check_data_dir(args.data)
    trees = {"before": args.before, "after": args.after}
    runs = {"before": [], "after": []}
    for r in range(args.rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        records = {tree: [] for tree in trees}
        for tree in order:
            for name in args.datasets:
                records[tree] += run_worker(trees[tree], name, args.data, args.folds,
                                            args.fits, args.max_iter)
        for tree in trees:
            runs[tree].append(records[tree])
    rows = summarise(runs, args.folds)
    commits = {tree: runs[tree][0][0]["commit"] for tree in trees}
    print(f"BEFORE: {args.before} (commit {commits['before']}); "
          f"AFTER: {args.after} (commit {commits['after']})")
    print(f"{args.rounds} rounds, {args.fits} fits per fold and process, each "
          "fold's best time")
    print()
    print(markdown(rows))
    print()
    print(f"command: {command_line()}")
    if args.out is not None:
        args.out.write_text(json.dumps(
            {"command": command_line(), "commits": commits, "rows": rows,
             "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(worker_main(sys.argv[2:]))
    sys.exit(main())
