"""GPStructClassifier under joblib's dask backend, beside loky and n_jobs=1.

The estimator hands its per-sequence terms to ``joblib.Parallel``, so the
backend comes from joblib's context, and it promises the same model, bit for
bit, for every ``n_jobs`` and backend (chunks of sequences are fixed, never
derived from ``n_jobs``). On synthetic data (``make_sequences(sparse=True)``,
built as in ``bench_scale.py``: sequences of 20 to 30 tokens, the first 40
sequences the test set), with ``GPStructClassifier(random_state=0,
max_iter=N)`` (L-BFGS, the estimator's other defaults), this fits

(a) ``n_jobs=1``;
(b) ``n_jobs=2`` inside ``joblib.parallel_config(backend="loky")``
    (worker processes);
(c) ``n_jobs=-1`` inside ``joblib.parallel_config(backend="dask")``, with a
    ``dask.distributed.Client`` on ``LocalCluster(n_workers=2,
    threads_per_worker=1, processes=True)`` (``-1``: every worker thread,
    two here);
(d) ``n_jobs=2`` with no backend configured: the estimator's default,
    threads of this process (the compiled chain kernels, scipy's sparse
    products and NumPy's large array operations release the GIL; the
    chunks stay in this process);

and prints each fit's wall time and its ratio to (a), then whether the
fitted ``q_mu_`` and the ``predict_marginals`` of the test set of (b), (c)
and (d) equal those of (a) exactly (``np.array_equal``; ``q_sqrt_`` and the ELBO
history are compared too). Starting the loky workers and the dask cluster
(and importing skgpstruct in their processes) is timed apart, before the
fit: a session pays it once. (c) also predicts inside the dask context.

The exit status is 1 when (b), (c) or (d) differ from (a). Without
``distributed`` (``pip install "dask[distributed]"``) the dask fit is
skipped with a message and the status is 0.

n_jobs = 2 only means something on an otherwise idle machine with two free
cores; pin the BLAS to one thread (``OPENBLAS_NUM_THREADS=1``).

Examples
--------
Smoke test (about 2,000 training tokens, 10 iterations)::

    python benchmarks/bench_dask.py --quick

The measurement::

    python benchmarks/bench_dask.py --out benchmarks/results/dask.json
"""

import argparse
import logging
import re
import sys
import warnings

import joblib
import numpy as np
from _common import (
    Stopwatch,
    command_line,
    environment,
    format_mean_std,
    markdown_table,
    write_json,
)
from bench_scale import LENGTH_RANGE, TEST_SEQUENCES, _start_workers, make_data

#: Training tokens and L-BFGS iterations (the n_jobs=1 fit takes some 10 to
#: 30 s on one core of the development machine), and those of ``--quick``.
DEFAULT_TOKENS = 40000
DEFAULT_MAX_ITER = 40
QUICK_TOKENS = 2000
QUICK_MAX_ITER = 10
N_WORKERS = 2


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", metavar="FILE", help="also write the results as JSON")
    parser.add_argument(
        "--quick", action="store_true",
        help=f"smoke test: {QUICK_TOKENS} training tokens and max_iter="
        f"{QUICK_MAX_ITER} unless given",
    )
    parser.add_argument(
        "--tokens", type=int, metavar="N",
        help=f"training tokens (default {DEFAULT_TOKENS})",
    )
    parser.add_argument(
        "--max-iter", type=int, metavar="N",
        help=f"L-BFGS iterations of every fit (default {DEFAULT_MAX_ITER})",
    )
    parser.add_argument("--n-classes", type=int, default=3, metavar="V")
    parser.add_argument(
        "--n-features", type=int, default=50, metavar="D",
        help="latent features; 2 * D indicator columns (default 50)",
    )
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the synthetic data (default 0)")
    return parser


def _import_skgpstruct():
    """Run in each dask worker: import the library before the timed fit."""
    import skgpstruct  # noqa: F401


def fit_one(params, data):
    """Fit, predict the test marginals; arrays and timings."""
    from sklearn.exceptions import ConvergenceWarning

    from skgpstruct import GPStructClassifier

    X_train, y_train, X_test, _ = data
    gp = GPStructClassifier(**params)
    with warnings.catch_warnings():
        # A fixed number of iterations is the point: no convergence wanted.
        warnings.simplefilter("ignore", ConvergenceWarning)
        with Stopwatch() as fit:
            gp.fit(X_train, y_train)
    with Stopwatch() as predict:
        marginals = gp.predict_marginals(X_test)
    return {
        "fit_time": fit.seconds,
        "predict_time": predict.seconds,
        "n_iter": int(gp.n_iter_),
        "elbo": float(gp.elbo_history_[-1]) if gp.elbo_history_ else None,
        "arrays": {
            "q_mu_": gp.q_mu_,
            "q_sqrt_": gp.q_sqrt_,
            "elbo_history_": np.asarray(gp.elbo_history_),
            "predict_marginals": marginals,
        },
    }


def _equal(a, b):
    if isinstance(a, list):
        return len(a) == len(b) and all(
            np.array_equal(x, y) for x, y in zip(a, b, strict=True)
        )
    return bool(np.array_equal(a, b))


def _max_abs_diff(a, b):
    if isinstance(a, list):
        if len(a) != len(b):
            return float("inf")
        a, b = np.concatenate(a), np.concatenate(b)
    if np.shape(a) != np.shape(b):
        return float("inf")
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b)), initial=0.0))


def compare(result, reference):
    """Exact equality (and the largest difference) of every compared array."""
    out = {}
    for name, value in result.pop("arrays").items():
        ref = reference["arrays"][name]
        out[name] = {"equal": _equal(value, ref),
                     "max_abs_diff": _max_abs_diff(value, ref)}
    result["identical_to_n_jobs_1"] = out
    return result


def run_dask(params, data):
    """(c): the fit under parallel_config(backend="dask") on a LocalCluster."""
    import joblib
    from dask.distributed import Client, LocalCluster

    with Stopwatch() as start:
        cluster = LocalCluster(
            n_workers=N_WORKERS, threads_per_worker=1, processes=True,
            host="127.0.0.1", dashboard_address=None,
            silence_logs=logging.WARNING,
        )
        client = Client(cluster)
        client.run(_import_skgpstruct)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with joblib.parallel_config(backend="dask"):
                result = fit_one({**params, "n_jobs": -1}, data)
        result["n_workers"] = len(client.scheduler_info()["workers"])
    finally:
        client.close()
        cluster.close()
    result["worker_start_time"] = start.seconds
    # dask warns at every evaluation whose task graph is large ("Sending
    # large graph of size ..."): counted by first line, not repeated.
    counts = {}
    for w in caught:
        first = str(w.message).splitlines()[0]
        key = f"{w.category.__name__}: " + re.sub(r"[0-9.]+ ([KMG]i?B)", r"N \1", first)
        counts[key] = counts.get(key, 0) + 1
    result["warnings"] = counts
    for key, n in counts.items():
        print(f"  dask fit: {n} x {key}", flush=True)
    return result


def report(payload):
    """Markdown table of a payload (as written to JSON)."""
    fits = payload["fits"]
    base = fits.get("n_jobs=1", {}).get("fit_time")
    rows = []
    for label, r in fits.items():
        if "failure" in r:
            rows.append([label, "FAILED: " + r["failure"]] + ["-"] * 6)
            continue
        same = r.get("identical_to_n_jobs_1")
        if same is None:
            q_mu = marg = others = "(reference)"
        else:
            q_mu = "yes" if same["q_mu_"]["equal"] else (
                f"NO (max diff {same['q_mu_']['max_abs_diff']:.3g})")
            marg = "yes" if same["predict_marginals"]["equal"] else (
                f"NO (max diff {same['predict_marginals']['max_abs_diff']:.3g})")
            others = ", ".join(
                f"{k} {'yes' if v['equal'] else 'NO'}" for k, v in same.items()
                if k not in ("q_mu_", "predict_marginals"))
        start = r.get("worker_start_time")
        rows.append([
            label,
            format_mean_std([r["fit_time"]], unit=" s"),
            f"{r['fit_time'] / base:.2f}x" if base else "-",
            str(r["n_iter"]),
            "-" if start is None else format_mean_std([start], unit=" s"),
            q_mu, marg, others,
        ])
    table = markdown_table(
        ["configuration", "fit", "fit / n_jobs=1 fit", "iterations",
         "workers start (apart)", "q_mu_ equal to n_jobs=1",
         "predict_marginals equal", "also equal"],
        rows,
    )
    data = payload["data"]
    options = ", ".join(f"{k}={v!r}" for k, v in payload["gp_params"].items())
    lines = [
        f"Data: {data['n_sequences']} training sequences ({data['n_tokens']} "
        f"tokens, {data['n_columns']} indicator columns, {data['n_classes']} "
        f"labels), {data['n_test_sequences']} test sequences; "
        f"GPStructClassifier({options}).",
        "",
        table,
    ]
    for label, r in fits.items():
        for key, n in r.get("warnings", {}).items():
            lines += ["", f"{label}: {n} warning(s) {key}"]
    if payload.get("dask_skipped"):
        lines += ["", f"dask: skipped ({payload['dask_skipped']})."]
    lines += ["", "Bit-identical whatever the backend: "
              + ("yes" if payload["identical"] else "NO") + "."]
    return "\n".join(lines)


def main(argv=None):
    args = build_parser().parse_args(argv)
    tokens = args.tokens or (QUICK_TOKENS if args.quick else DEFAULT_TOKENS)
    max_iter = args.max_iter or (QUICK_MAX_ITER if args.quick else DEFAULT_MAX_ITER)
    env = environment()
    print(f"command: {command_line()}")
    print("environment: " + ", ".join(f"{k} {v}" for k, v in env.items()))
    try:
        import dask
        import distributed
    except ImportError as exc:
        skipped = (f"distributed is not importable ({exc}); pip install "
                   "\"dask[distributed]\"")
        print(f"dask: skipped: {skipped}")
    else:
        skipped = None
        env["dask"], env["distributed"] = dask.__version__, distributed.__version__

    data = make_data(tokens, args.n_classes, args.n_features, False, args.seed)
    X_train, y_train, X_test, _ = data
    params = {"random_state": 0, "max_iter": max_iter, "tol": 1e-12}
    info = {
        "n_sequences": len(y_train),
        "n_tokens": int(sum(len(s) for s in y_train)),
        "n_columns": int(X_train[0].shape[1]),
        "n_classes": args.n_classes,
        "n_test_sequences": len(X_test),
        "length_range": LENGTH_RANGE,
        "test_sequences": TEST_SEQUENCES,
        "seed": args.seed,
    }
    print(f"data: make_sequences(sparse=True, n_features={args.n_features}, "
          f"n_classes={args.n_classes}, random_state={args.seed}): "
          f"{info['n_sequences']} training sequences, {info['n_tokens']} tokens")
    print(f"GPStructClassifier options: {params} (tol=1e-12: max_iter iterations "
          "unless L-BFGS stops on its own)")
    print()

    fits = {}
    reference = fit_one({**params, "n_jobs": 1}, data)
    print(f"n_jobs=1               fit {reference['fit_time']:7.2f} s  "
          f"({reference['n_iter']} iterations)", flush=True)

    loky = {}
    with Stopwatch() as start:
        _start_workers(N_WORKERS)
    try:
        with joblib.parallel_config(backend="loky"):
            loky = fit_one({**params, "n_jobs": N_WORKERS}, data)
        loky["worker_start_time"] = start.seconds
    except Exception as exc:  # noqa: BLE001 - recorded and reported
        loky = {"failure": f"{type(exc).__name__}: {exc}"}
    print(f"n_jobs={N_WORKERS}, loky          "
          + (f"fit {loky['fit_time']:7.2f} s  (workers started in "
             f"{start.seconds:.2f} s before)" if "failure" not in loky
             else f"FAILED: {loky['failure']}"), flush=True)

    dask_result = None
    if skipped is None:
        try:
            dask_result = run_dask(params, data)
        except Exception as exc:  # noqa: BLE001 - recorded and reported
            import traceback

            traceback.print_exc()
            dask_result = {"failure": f"{type(exc).__name__}: {exc}"}
        print("n_jobs=-1, dask         "
              + (f"fit {dask_result['fit_time']:7.2f} s  (cluster of "
                 f"{dask_result['n_workers']} workers started in "
                 f"{dask_result['worker_start_time']:.2f} s before)"
                 if "failure" not in dask_result
                 else f"FAILED: {dask_result['failure']}"), flush=True)

    try:
        threads = fit_one({**params, "n_jobs": N_WORKERS}, data)
    except Exception as exc:  # noqa: BLE001 - recorded and reported
        threads = {"failure": f"{type(exc).__name__}: {exc}"}
    print(f"n_jobs={N_WORKERS}, threads       "
          + (f"fit {threads['fit_time']:7.2f} s" if "failure" not in threads
             else f"FAILED: {threads['failure']}"), flush=True)

    for label, result in ((f"n_jobs={N_WORKERS}, loky", loky),
                          (f"n_jobs=-1, dask ({N_WORKERS} workers)", dask_result),
                          (f"n_jobs={N_WORKERS}, threads (default)", threads)):
        if result is not None and "failure" not in result:
            compare(result, reference)
        if result is not None:
            fits[label] = result
    reference.pop("arrays")
    fits = {"n_jobs=1": reference, **fits}
    identical = all(
        "failure" not in r and all(
            v["equal"] for v in r.get("identical_to_n_jobs_1", {}).values())
        for r in fits.values()
    )
    payload = {
        "command": command_line(),
        "environment": env,
        "quick": args.quick,
        "data": info,
        "gp_params": params,
        "fits": fits,
        "dask_skipped": skipped,
        "identical": identical,
    }
    print()
    print(report(payload))
    print()
    print(f"command: {command_line()}")
    if args.out:
        write_json(args.out, payload)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
