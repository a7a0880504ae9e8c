"""How the fit scales with the number of training tokens, side by side.

BENCHMARK.md section 3, last point, and DESIGN.md "Scale": fit time and
peak memory of GPStructClassifier at about 1k, 10k and 100k training tokens,
and n_jobs = 1 vs 2 at the largest size, against sklearn-crfsuite on the
same data in the same run.

Data: synthetic, :func:`skgpstruct.datasets.make_sequences` with sparse
binary indicator features (``sparse=True``: ``2 * n_features`` columns,
``n_features`` of them active per token), sequence lengths 20..30 (about 25
tokens), a sticky label chain over ``--n-classes`` labels. The CRF++ sets
concatenated hold only about 40k distinct tokens (basenp and chunking share
their sentences) under four incompatible label sets, so they cannot reach
100k tokens of one problem. The data are nested: the first 40 sequences
(about 1,000 tokens) are the test set of every size, the training set of a
size is the sequences after them until the token budget is reached, so a
larger training set contains every smaller one. With the linear kernel and
``inducing="auto"`` the inducing variables are the feature weights, so M =
``2 * n_features + 1`` is fixed across sizes: the cost per iteration should
then grow linearly in the tokens.

Measurements, each in a fresh process (``multiprocessing`` spawn), so that
peak RSS (``getrusage(RUSAGE_SELF).ru_maxrss``) is per configuration:

- GP, ``optimizer="lbfgs"``, ``max_iter`` fixed (``--max-iter``, default 10;
  not a converged fit: the test error is only a sanity check). Seconds per
  L-BFGS iteration are read from the estimator's progress lines (verbose=1,
  captured): (time of the last iteration - time of the first) / (iterations
  - 1), so set-up (features stacking, inducing variables, worker start) is
  reported apart, as "set-up".
- GP, ``optimizer="stochastic"``, one epoch (``--epochs``): its time and
  ``saga_memory_bytes_`` (the SAGA stored gradients), beside what storing a
  dense gradient per mini-batch would take (mini-batches x parameters x 8
  bytes).
- sklearn-crfsuite, L-BFGS, c1=0, c2=1, run to its own convergence: fit
  time, iterations and seconds per iteration (from its training log).
- At the largest size the two GP configurations again with ``n_jobs=2``
  (the estimator's default backend: threads of the same process, so the
  peak RSS covers them; ``bench_dask.py`` compares the backends).

"peak RSS" is the process's whole peak (interpreter, libraries, data);
"fit increment" is how far the resident set's high-water mark rose from
just before ``fit`` (``_common.PeakMemory``), the memory the fit itself
added.

Examples
--------
Smoke test (sizes 500 and 2000, three iterations; under a minute)::

    python benchmarks/bench_scale.py --quick

The full measurement::

    python benchmarks/bench_scale.py --out benchmarks/results/scale.json
"""

import argparse
import contextlib
import io
import math
import multiprocessing
import re
import resource
import sys
import time
import traceback
import warnings
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from _common import (
    CRF_MISSING,
    PeakMemory,
    Stopwatch,
    command_line,
    crfsuite_available,
    environment,
    failure_status,
    format_mean_std,
    markdown_table,
    to_crfsuite,
    token_error,
    write_json,
)

#: Default token budgets of the training sets.
DEFAULT_SIZES = (1000, 10000, 100000)
QUICK_SIZES = (500, 2000)
#: Default L-BFGS iterations and SAGA epochs per measurement.
DEFAULT_MAX_ITER = 10
QUICK_MAX_ITER = 3
DEFAULT_EPOCHS = 1
#: Synthetic data: sequences 20..30 tokens long; the first TEST_SEQUENCES
#: sequences are the common test set.
LENGTH_RANGE = (20, 30)
TEST_SEQUENCES = 40
DEFAULT_N_CLASSES = 3
DEFAULT_N_FEATURES = 50
DEFAULT_RANDOM_STATE = 0
#: The CRF peer's L2 coefficient.
CRF_C2 = 1.0

_PROGRESS = re.compile(r"iteration\s+(\d+)\s+ELBO\s+(\S+)\s+([0-9.]+)\s*s")


# ---------------------------------------------------------------------- #
# data
def make_data(size, n_classes, n_features, dense, seed):
    """Nested synthetic data: (X_train, y_train, X_test, y_test)."""
    from skgpstruct.datasets import make_sequences

    # Enough sequences for the budget at the shortest length.
    n_sequences = TEST_SEQUENCES + math.ceil(size / LENGTH_RANGE[0])
    X, y = make_sequences(
        n_sequences, n_classes=n_classes, n_features=n_features,
        length_range=LENGTH_RANGE, sparse=not dense, random_state=seed,
    )
    lengths = np.cumsum([len(s) for s in y[TEST_SEQUENCES:]])
    n_train = int(np.searchsorted(lengths, size) + 1)
    train = slice(TEST_SEQUENCES, TEST_SEQUENCES + n_train)
    return X[train], y[train], X[:TEST_SEQUENCES], y[:TEST_SEQUENCES]


def crfsuite_input(X, dense):
    """Token feature dicts for crfsuite: names ``f<j>``, values kept if dense."""
    if not dense:
        names = np.array([f"f{j}" for j in range(X[0].shape[1])], dtype=object)
        return to_crfsuite(X, names)
    return [
        [{f"f{j}": float(v) for j, v in enumerate(row)} for row in matrix]
        for matrix in X
    ]


# ---------------------------------------------------------------------- #
# one measurement (runs in a fresh process)


class _TimestampedLines(io.TextIOBase):
    """A stdout replacement that notes when each progress line is written.

    The estimator's progress lines print their time with two decimals; the
    moment a line is written is taken here at full resolution instead.
    """

    def __init__(self):
        self.lines = []  # (perf_counter, text)
        self._buffer = ""

    def writable(self):
        return True

    def write(self, text):
        now = time.perf_counter()
        self._buffer += text
        while "\n" in self._buffer:
            line, self._buffer = self._buffer.split("\n", 1)
            self.lines.append((now, line))
        return len(text)

    def progress(self):
        """[(iteration, write time, printed seconds)] of the progress lines."""
        found = []
        for now, line in self.lines:
            m = _PROGRESS.search(line)
            if m:
                found.append((int(m.group(1)), now, float(m.group(3))))
        return found


def _start_workers(n_jobs):
    """Start joblib's reusable loky workers and import skgpstruct in them.

    Returns the seconds it took. The estimator's ``Parallel`` reuses these
    workers, so their start-up (interpreter, NumPy, SciPy, skgpstruct
    imports) is reported apart instead of being charged to the first
    iteration: a session pays it once, not every fit.
    """
    from joblib import Parallel, delayed

    # A library function (pickled by reference): importing it imports
    # skgpstruct, which imports the estimator and its dependencies.
    from skgpstruct.datasets import make_sequences

    with Stopwatch() as sw:
        Parallel(n_jobs=n_jobs)(
            delayed(make_sequences)(1, random_state=i) for i in range(4 * n_jobs)
        )
    return sw.seconds


def _n_parameters(gp):
    """Free parameters of the variational fit (approximate: layout not public)."""
    n = gp.q_mu_.size + gp.q_sqrt_.size + gp.pairwise_mean_.size
    n += gp.pairwise_std_.size + len(gp.kernel_.theta) + 1
    if gp.weights_.size > 1:
        n += gp.weights_.size
    return int(n)


def measure(config):
    """Run one configuration; returns a dict (``failure`` set on error)."""
    try:
        return _measure(config)
    except Exception as exc:  # noqa: BLE001 - reported in the parent
        return {"failure": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()}


def _measure(config):
    from sklearn.exceptions import ConvergenceWarning

    X_train, y_train, X_test, y_test = make_data(
        config["size"], config["n_classes"], config["n_features"],
        config["dense"], config["seed"],
    )
    out = {
        "n_sequences": len(y_train),
        "n_tokens": int(sum(len(s) for s in y_train)),
        "n_columns": int(X_train[0].shape[1]),
        "n_test_tokens": int(sum(len(s) for s in y_test)),
    }
    kind = config["kind"]
    if kind == "crf":
        from _common import _fit_crf

        C_train = crfsuite_input(X_train, config["dense"])
        C_test = crfsuite_input(X_test, config["dense"])
        memory = PeakMemory()
        with Stopwatch() as fit:
            crf = _fit_crf(C_train, y_train, CRF_C2)
        iterations = list(getattr(crf.training_log_, "iterations", None) or [])
        n_iter = len(iterations)
        iter_times = [it["time"] for it in iterations if "time" in it]
        out.update(
            fit_time=fit.seconds,
            n_iter=n_iter,
            seconds_per_iter=(sum(iter_times) / len(iter_times) if iter_times
                              else fit.seconds / max(n_iter, 1)),
            error=token_error([[str(v) for v in s] for s in y_test],
                              crf.predict(C_test)),
        )
    else:
        from skgpstruct import GPStructClassifier

        params = dict(config["gp_params"], optimizer=kind, verbose=1,
                      n_jobs=config["n_jobs"])
        params["max_iter"] = config["max_iter"] if kind == "lbfgs" else config[
            "epochs"]
        if kind == "stochastic":
            # Keeps SAGA's state after the fit, read below for the number of
            # mini-batches drawn. The same fit: warm_start only stops the
            # lone features from being collapsed, and no feature of these
            # data is active at a single token.
            params["warm_start"] = True
        gp = GPStructClassifier(**params)
        captured = _TimestampedLines()
        memory = PeakMemory()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            with contextlib.redirect_stdout(captured), Stopwatch() as fit:
                gp.fit(X_train, y_train)
        # Seconds per iteration (epoch) between the first and the last
        # progress line; with a single line, the time it prints (seconds
        # since the optimisation started, two decimals).
        progress = captured.progress()
        if len(progress) >= 2:
            (i0, w0, _), (i1, w1, _) = progress[0], progress[-1]
            per_iter = (w1 - w0) / (i1 - i0)
        elif progress:
            i1, _, printed = progress[0]
            per_iter = printed / i1
        else:  # progress format changed: amortise everything
            per_iter = fit.seconds / max(gp.n_iter_, 1)
        setup = fit.seconds - per_iter * gp.n_iter_ if progress else float("nan")
        out.update(
            fit_time=fit.seconds,
            n_iter=int(gp.n_iter_),
            seconds_per_iter=per_iter,
            setup_time=setup,
            progress_parsed=bool(progress),
            n_inducing=int(gp.q_mu_.shape[-1]),
            n_parameters=_n_parameters(gp),
            elbo=float(gp.elbo_history_[-1]) if gp.elbo_history_ else None,
        )
        with Stopwatch() as predict:
            y_pred = gp.predict(X_test)
        out["predict_time"] = predict.seconds
        out["error"] = token_error(y_test, y_pred)
        if kind == "stochastic":
            n_items = math.ceil(len(y_train) / gp.batch_size)
            # Items drawn at least once so far (uniform draws with
            # replacement: about 63 % after one epoch). Not public: read
            # from the SAGA state if it is there.
            stored = (getattr(gp, "_saga_state", None) or {}).get("stored")
            n_stored = (None if stored is None
                        else sum(item is not None for item in stored))
            out.update(
                saga_memory_bytes=int(gp.saga_memory_bytes_),
                saga_items=n_items,
                saga_items_stored=n_stored,
                saga_dense_bytes=n_items * out["n_parameters"] * 8,
            )
            if n_stored:
                out["saga_bytes_all_items"] = (
                    out["saga_memory_bytes"] / n_stored * n_items
                )
    self_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out["peak_rss_mib"] = self_peak / 1024
    out["fit_increment_mib"] = memory.increment_mib()
    return out


def run_isolated(config):
    """``measure(config)`` in a fresh spawned interpreter."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(measure, config).result()


# ---------------------------------------------------------------------- #
# command line
def build_parser():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="GP options left out take GPStructClassifier's defaults "
        f"(random_state defaults to {DEFAULT_RANDOM_STATE} here).",
    )
    parser.add_argument(
        "--sizes", nargs="+", type=int, default=None, metavar="TOKENS",
        help="training-set sizes in tokens (default: "
        f"{' '.join(map(str, DEFAULT_SIZES))})",
    )
    parser.add_argument(
        "--jobs", nargs="+", type=int, default=[1, 2], metavar="N",
        help="n_jobs values compared at the largest size (default: 1 2); the "
        "smaller sizes run with the first",
    )
    parser.add_argument("--out", metavar="FILE", help="also write the results as JSON")
    parser.add_argument(
        "--quick", action="store_true",
        help=f"smoke test: sizes {' '.join(map(str, QUICK_SIZES))} and "
        f"max_iter={QUICK_MAX_ITER} unless given",
    )
    parser.add_argument("--no-lbfgs", action="store_true",
                        help="skip the GP with optimizer='lbfgs'")
    parser.add_argument("--no-stochastic", action="store_true",
                        help="skip the GP with optimizer='stochastic'")
    parser.add_argument("--no-crf", action="store_true",
                        help="skip the sklearn-crfsuite peer")
    data = parser.add_argument_group("synthetic data (make_sequences)")
    data.add_argument("--n-classes", type=int, default=DEFAULT_N_CLASSES,
                      metavar="V")
    data.add_argument(
        "--n-features", type=int, default=DEFAULT_N_FEATURES, metavar="D",
        help=f"latent features (default {DEFAULT_N_FEATURES}); sparse data has "
        "2 * D indicator columns, D active per token",
    )
    data.add_argument("--dense", action="store_true",
                      help="dense features instead of sparse indicators")
    data.add_argument("--seed", type=int, default=0,
                      help="seed of the synthetic data (default 0)")
    gp = parser.add_argument_group("GPStructClassifier options")
    gp.add_argument("--max-iter", type=int, metavar="N",
                    help=f"L-BFGS iterations (default {DEFAULT_MAX_ITER})")
    gp.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS, metavar="K",
                    help=f"SAGA epochs (default {DEFAULT_EPOCHS})")
    gp.add_argument("--batch-size", type=int, metavar="B")
    gp.add_argument("--kernel", metavar="NAME")
    gp.add_argument("--n-inducing", type=int, metavar="M")
    gp.add_argument("--inducing", metavar="HOW")
    gp.add_argument("--covariance", metavar="KIND")
    gp.add_argument("--n-samples", type=int, metavar="S")
    gp.add_argument("--random-state", type=int, default=DEFAULT_RANDOM_STATE,
                    metavar="SEED")
    return parser


GP_OPTIONS = ("batch_size", "kernel", "n_inducing", "inducing", "covariance",
              "n_samples", "random_state")


def plan(args, with_crf):
    """The list of configurations to measure, in order."""
    sizes = args.sizes or list(QUICK_SIZES if args.quick else DEFAULT_SIZES)
    sizes = sorted(set(sizes))
    max_iter = args.max_iter or (QUICK_MAX_ITER if args.quick else DEFAULT_MAX_ITER)
    if max_iter < 2:
        sys.exit("--max-iter must be at least 2 (seconds per iteration are "
                 "measured between the first and the last iteration)")
    gp_params = {
        k: getattr(args, k) for k in GP_OPTIONS if getattr(args, k) is not None
    }
    common = {
        "n_classes": args.n_classes, "n_features": args.n_features,
        "dense": args.dense, "seed": args.seed, "gp_params": gp_params,
        "max_iter": max_iter, "epochs": args.epochs,
    }
    kinds = [k for k, skip in (("lbfgs", args.no_lbfgs),
                               ("stochastic", args.no_stochastic)) if not skip]
    configs = []
    for size in sizes:
        jobs = args.jobs if size == sizes[-1] else args.jobs[:1]
        for kind in kinds:
            for n_jobs in jobs:
                configs.append({**common, "size": size, "kind": kind,
                                "n_jobs": n_jobs})
        if with_crf:
            configs.append({**common, "size": size, "kind": "crf", "n_jobs": 1})
    return sizes, configs


# ---------------------------------------------------------------------- #
# reporting
def _f(value, digits=2, unit=""):
    return format_mean_std([value], digits=digits, unit=unit) if value is not None \
        else "-"


def _label(config):
    if config["kind"] == "crf":
        return f"CRF c2={CRF_C2:g}"
    name = "GP L-BFGS" if config["kind"] == "lbfgs" else "GP SAGA"
    return f"{name}, n_jobs={config['n_jobs']}"


def measurements_table(rows):
    header = ["tokens", "sequences", "model", "fit", "iterations",
              "s / iteration", "s / iteration / 1k tokens", "set-up",
              "peak RSS", "fit increment", "SAGA stored (items)",
              "SAGA stored, all items", "dense equivalent", "test error %"]
    lines = []
    for config, r in rows:
        if "failure" in r:
            lines.append([str(config["size"]), "-", _label(config),
                          "FAILED: " + r["failure"]] + ["-"] * 10)
            continue
        per_k = r["seconds_per_iter"] / r["n_tokens"] * 1000
        worker = r.get("worker_peak_rss_mib")
        rss = _f(r["peak_rss_mib"], 0, " MiB") + (
            f" (+ workers {worker:.0f} MiB)" if worker else "")
        stored = r.get("saga_memory_bytes")
        dense = r.get("saga_dense_bytes")
        full = r.get("saga_bytes_all_items")
        if stored is not None:
            items = r.get("saga_items_stored")
            stored = _f(stored / 2**20, 2, " MiB") + (
                f" ({items}/{r['saga_items']})" if items is not None else "")
        setup = "-"
        if "setup_time" in r:
            setup = _f(r["setup_time"], unit=" s")
            if "worker_start_time" in r:
                setup += f" + workers {r['worker_start_time']:.2f} s"
        lines.append([
            str(r["n_tokens"]), str(r["n_sequences"]), _label(config),
            _f(r["fit_time"], unit=" s"), str(r["n_iter"]),
            _f(r["seconds_per_iter"], 4, " s"), _f(per_k, 4, " s"),
            setup, rss, _f(r["fit_increment_mib"], 1, " MiB"),
            stored if stored is not None else "-",
            _f(full / 2**20, 2, " MiB") if full is not None else "-",
            _f(dense / 2**20, 2, " MiB") if dense is not None else "-",
            _f(r["error"]),
        ])
    return markdown_table(header, lines)


def _find(rows, size, kind, n_jobs=None):
    for config, r in rows:
        if (config["size"] == size and config["kind"] == kind
                and (n_jobs is None or config["n_jobs"] == n_jobs)
                and "failure" not in r):
            return r
    return None


def _ratio(a, b):
    if a is None or b is None or not b:
        return "-"
    return f"{a / b:.2f}x"


def ratios_table(rows, sizes, first_jobs):
    """Per size: GP against the CRF, and growth against the previous size."""
    header = ["tokens", "GP L-BFGS s/iter / CRF s/iter",
              "GP SAGA epoch / CRF fit", "GP L-BFGS fit / CRF fit",
              "tokens x", "GP L-BFGS s/iter x", "GP SAGA epoch x",
              "SAGA stored x", "CRF fit x"]
    lines, previous = [], None
    for size in sizes:
        lb = _find(rows, size, "lbfgs", first_jobs)
        sg = _find(rows, size, "stochastic", first_jobs)
        crf = _find(rows, size, "crf")
        current = {
            "tokens": next((r["n_tokens"] for r in (lb, sg, crf) if r), None),
            "lbfgs": lb and lb["seconds_per_iter"],
            "saga": sg and sg["seconds_per_iter"],
            "stored": sg and sg.get("saga_bytes_all_items",
                                    sg["saga_memory_bytes"]),
            "crf": crf and crf["fit_time"],
        }
        growth = ["-"] * 5
        if previous is not None:
            growth = [_ratio(current[k], previous[k]) for k in
                      ("tokens", "lbfgs", "saga", "stored", "crf")]
        lines.append([
            str(current["tokens"]),
            _ratio(current["lbfgs"], crf and crf["seconds_per_iter"]),
            _ratio(current["saga"], current["crf"]),
            _ratio(lb and lb["fit_time"], current["crf"]),
            *growth,
        ])
        previous = current
    return markdown_table(header, lines)


def jobs_table(rows, size, jobs):
    header = ["model", *[f"n_jobs={j}" for j in jobs],
              *[f"speed-up n_jobs={j}" for j in jobs[1:]]]
    lines = []
    for kind, name in (("lbfgs", "GP L-BFGS s/iter"),
                       ("stochastic", "GP SAGA s/epoch")):
        found = [_find(rows, size, kind, j) for j in jobs]
        if not any(found):
            continue
        values = [None if r is None else r["seconds_per_iter"] for r in found]
        lines.append([
            name, *[_f(v, 4, " s") if v is not None else "-" for v in values],
            *[_ratio(values[0], v) for v in values[1:]],
        ])
    return markdown_table(header, lines)


def main(argv=None):
    args = build_parser().parse_args(argv)
    with_crf = not args.no_crf and crfsuite_available()
    sizes, configs = plan(args, with_crf)
    env = environment()
    print(f"command: {command_line()}")
    print("environment: " + ", ".join(f"{k} {v}" for k, v in env.items()))
    print(f"data: make_sequences(sparse={not args.dense}, n_classes={args.n_classes}, "
          f"n_features={args.n_features}, length_range={LENGTH_RANGE}, "
          f"random_state={args.seed}); test set: the first {TEST_SEQUENCES} "
          "sequences")
    print(f"GP: L-BFGS max_iter={configs[0]['max_iter']}, SAGA {args.epochs} "
          f"epoch(s), options {configs[0]['gp_params']}; n_jobs {args.jobs} at "
          f"{sizes[-1]} tokens")
    if not args.no_crf and not with_crf:
        print(CRF_MISSING)
    print(f"{len(configs)} measurements, each in a fresh process")
    print()

    rows = []
    for config in configs:
        with Stopwatch() as wall:
            result = run_isolated(config)
        result["wall_time"] = wall.seconds
        rows.append((config, result))
        if "failure" in result:
            print(result.get("traceback", ""), file=sys.stderr)
            print(f"{config['size']:>7} tokens  {_label(config):<22} FAILED: "
                  f"{result['failure']}", flush=True)
            continue
        extra = ""
        if "saga_memory_bytes" in result:
            extra = f", SAGA stored {result['saga_memory_bytes'] / 2**20:.2f} MiB"
        print(
            f"{result['n_tokens']:>7} tokens  {_label(config):<22} fit "
            f"{result['fit_time']:8.2f} s, {result['n_iter']} iterations, "
            f"{result['seconds_per_iter']:.4f} s/iteration, peak RSS "
            f"{result['peak_rss_mib']:.0f} MiB{extra}, error {result['error']:.2f} %",
            flush=True,
        )
    print()
    print("## Measurements (one fresh process each)")
    print()
    print(measurements_table(rows))
    print()
    print("s / iteration: GP L-BFGS iteration or SAGA epoch, timed between the "
          "first and the last progress line (one line: the seconds it prints), "
          "set-up and worker start excluded; CRF: its training log. SAGA "
          "stored: saga_memory_bytes_ (mini-batches drawn so far / all); all "
          "items: scaled to every mini-batch stored; dense equivalent: "
          "mini-batches x parameters x 8 bytes.")
    print()
    print(f"## Ratios (n_jobs={args.jobs[0]}; 'x' columns: this size over the "
          "previous one)")
    print()
    print(ratios_table(rows, sizes, args.jobs[0]))
    if len(args.jobs) > 1:
        print()
        print(f"## n_jobs at {sizes[-1]} tokens")
        print()
        print(jobs_table(rows, sizes[-1], args.jobs))
    print()
    print(f"command: {command_line()}")

    if args.out:
        payload = {
            "command": command_line(),
            "environment": env,
            "quick": args.quick,
            "measurements": [{"config": c, "result": r} for c, r in rows],
        }
        write_json(args.out, payload)
    return failure_status([r for _, r in rows])


if __name__ == "__main__":
    sys.exit(main())
