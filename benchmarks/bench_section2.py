"""The paper's larger experiment (section 6.2) on basenp, side by side.

BENCHMARK.md section 2: the pool is all 823 sequences of
``crfpp/basenp/test.data``; repetition ``r`` (r = 0..4) permutes it with
``np.random.default_rng(r).permutation(823)``, trains on the first 500
sequences (about 11,600 tokens) and tests on the remaining 323. Features are
the basenp CRF++ template, its vocabulary fitted on the 500 training
sequences only. In the same process and on the same features, every
repetition runs

(a) GPStructClassifier, ``optimizer="lbfgs"`` (batch), ``max_iter`` from
    ``--max-iter`` (default: the estimator's);
(b) GPStructClassifier, ``optimizer="stochastic"`` (SAGA), fitted once for
    every epoch budget of ``--epochs`` (default 1 2 5 10 20 50): a time /
    error curve (on 100 training sequences the error was still falling at
    10 epochs and flat from 20 to 50). Every point is a separate fit from
    scratch with the same ``random_state``, so the k-epoch fit is exactly
    the first k epochs of the longer ones (the script checks this on the ELBO
    histories); its fit time is what k epochs cost, set-up included. The
    public API gives no error after each epoch, and a warm-started
    continuation would restart the step-size schedule, so refits are the
    honest way to draw the curve (they cost the sum of the budgets);
(c) the piecewise pseudo-likelihood (``likelihood="pseudo"``): one batch
    fit, and one stochastic fit at the longest epoch budget
    (``--no-pseudo`` skips both);
(d) GPstruct's sampler, ``inference="ess"`` with ``ess_n_iter`` from
    ``--ess-n-iter`` (default: the estimator's 10,000), at the
    hyperparameters the estimator's own variational fit learns (its fit
    time includes that fit; ``--no-ess`` skips it). It needs the dense Gram
    matrix of the training tokens and its Cholesky factor: about 2.2 GB at
    11,700 tokens;
(e) sklearn-crfsuite (L-BFGS, c1=0) with c2 = 0.1 and c2 = 1, the two
    values the paper and BENCHMARK.md report, and with c2 chosen by 3-fold
    inner cross-validation over {0.01, 0.1, 1, 10} (``--no-crf-cv`` skips
    it);
(f) a per-token ``LogisticRegression`` on the same features, ``C`` chosen by
    the same inner cross-validation over {0.01, 0.1, 1, 10, 100}
    (``--no-lr`` skips it).

It prints per repetition and as mean (std over repetitions, ddof=1) the
token error %, the fit times, the GP's time to its final error (stochastic:
the time of the shortest epoch budget whose error is no worse than the
longest budget's), GP time / CRF time ratios, and the calibration of every
model's per-token marginals (mean negative log-probability of the true
label, expected calibration error of the top label), then the exact
command.

Examples
--------
Smoke test (one repetition, 100 training sequences, few iterations)::

    python benchmarks/bench_section2.py --quick

The full measurement::

    python benchmarks/bench_section2.py --out benchmarks/results/section2.json
"""

import argparse
import sys

import numpy as np
from _common import (
    CRF_C2_GRID,
    CRF_MISSING,
    DEFAULT_DATA_DIR,
    INNER_FOLDS,
    QUOTED_SECTION2,
    DataSet,
    Stopwatch,
    _fit_crf,
    calibration,
    calibration_text,
    check_data_dir,
    command_line,
    crf_items,
    crf_marginals,
    crfsuite_available,
    environment,
    failure_status,
    fit_gp,
    format_mean_std,
    load_pool,
    markdown_table,
    run_crfsuite,
    run_logreg,
    take,
    template_features,
    to_crfsuite,
    token_error,
    write_json,
)

#: BENCHMARK.md section 2: all of basenp/test.data, 500 sequences to train.
BASENP_ALL = DataSet("basenp", "test.data", 823, 500)
#: The two fixed c2 values of the paper (regularisation 0.1 and 1.0).
FIXED_C2 = (0.1, 1.0)
#: Default stochastic epoch budgets (a time / error curve).
DEFAULT_EPOCHS = (1, 2, 5, 10, 20, 50)
#: Default random_state of both GP fits (needed for the curve to be nested).
DEFAULT_RANDOM_STATE = 0
#: ``--quick``: one repetition, 100 training sequences, few iterations.
QUICK_N_TRAIN = 100
QUICK_MAX_ITER = 20
QUICK_EPOCHS = (1, 2)
QUICK_ESS_N_ITER = 200

# GP options exposed on the command line (flag --n-inducing -> n_inducing),
# shared by the batch and the stochastic fits. max_iter is per optimiser.
GP_OPTIONS = (
    "kernel",
    "n_inducing",
    "inducing",
    "covariance",
    "n_samples",
    "batch_size",
    "learning_rate",
    "tol",
    "n_jobs",
    "random_state",
)


def build_parser():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="GP options left out take GPStructClassifier's defaults "
        f"(random_state defaults to {DEFAULT_RANDOM_STATE} here).",
    )
    parser.add_argument(
        "--reps", nargs="+", type=int, default=None, metavar="R",
        help="repetitions (permutation seeds) to run (default: 0 1 2 3 4)",
    )
    parser.add_argument(
        "--n-train", type=int, default=None, metavar="N",
        help=f"training sequences taken from the front of each permutation "
        f"(default {BASENP_ALL.n_train}; the test part is always the last "
        f"{BASENP_ALL.n_data - BASENP_ALL.n_train})",
    )
    parser.add_argument(
        "--data", default=str(DEFAULT_DATA_DIR), metavar="DIR",
        help="directory holding crfpp/ and gpstruct-splits/ "
        "(default: <repo>/../shared/data)",
    )
    parser.add_argument("--out", metavar="FILE", help="also write the results as JSON")
    parser.add_argument(
        "--quick", action="store_true",
        help=f"smoke test: the first repetition only, {QUICK_N_TRAIN} training "
        f"sequences, max_iter={QUICK_MAX_ITER} and epochs "
        f"{' '.join(map(str, QUICK_EPOCHS))} unless given",
    )
    parser.add_argument("--no-batch", action="store_true",
                        help="skip the GP with optimizer='lbfgs'")
    parser.add_argument("--no-stochastic", action="store_true",
                        help="skip the GP with optimizer='stochastic'")
    parser.add_argument("--no-pseudo", action="store_true",
                        help="skip the GP fits of the pseudo-likelihood")
    parser.add_argument("--no-ess", action="store_true",
                        help="skip the GP with inference='ess'")
    parser.add_argument("--no-crf-cv", action="store_true",
                        help="skip the CRF with c2 chosen by inner CV")
    parser.add_argument("--no-lr", action="store_true",
                        help="skip the per-token logistic regression")
    parser.add_argument(
        "-v", "--verbose", action="store_true",
        help="print the GP's ELBO progress lines",
    )
    gp = parser.add_argument_group("GPStructClassifier options")
    gp.add_argument("--max-iter", type=int, metavar="N",
                    help="L-BFGS iterations of the batch GP")
    gp.add_argument(
        "--epochs", nargs="+", type=int, metavar="K",
        help="epoch budgets (max_iter) of the stochastic GP, one fit each "
        f"(default {' '.join(map(str, DEFAULT_EPOCHS))})",
    )
    gp.add_argument(
        "--ess-n-iter", type=int, metavar="N",
        help="iterations of the ESS fit (default: the estimator's 10000; "
        f"{QUICK_ESS_N_ITER} with --quick)",
    )
    gp.add_argument("--batch-size", type=int, metavar="B",
                    help="sequences per SAGA mini-batch")
    gp.add_argument("--learning-rate", type=float, metavar="ETA")
    gp.add_argument("--n-jobs", type=int, metavar="N")
    gp.add_argument("--random-state", type=int, default=DEFAULT_RANDOM_STATE,
                    metavar="SEED")
    gp.add_argument("--kernel", metavar="NAME", help="e.g. linear, rbf")
    gp.add_argument("--n-inducing", type=int, metavar="M")
    gp.add_argument("--inducing", metavar="HOW")
    gp.add_argument("--covariance", metavar="KIND", help="full or diag")
    gp.add_argument("--n-samples", type=int, metavar="S")
    gp.add_argument("--tol", type=float, metavar="TOL")
    return parser


def settings(args):
    """(reps, n_train, shared GP params, batch max_iter or None, epochs).

    Also sets ``args.ess_n_iter`` to the ESS fit's iterations (None: the
    estimator's default).
    """
    reps = args.reps if args.reps is not None else list(range(5))
    n_train = args.n_train
    max_iter, epochs = args.max_iter, args.epochs
    if args.quick:
        reps = reps[:1]
        n_train = QUICK_N_TRAIN if n_train is None else n_train
        max_iter = QUICK_MAX_ITER if max_iter is None else max_iter
        epochs = list(QUICK_EPOCHS) if epochs is None else epochs
        if args.ess_n_iter is None:
            args.ess_n_iter = QUICK_ESS_N_ITER
    if args.ess_n_iter is not None and args.ess_n_iter < 1:
        sys.exit(f"--ess-n-iter must be positive, got {args.ess_n_iter}")
    n_train = BASENP_ALL.n_train if n_train is None else n_train
    if not 1 <= n_train <= BASENP_ALL.n_train:
        sys.exit(f"--n-train must be in 1..{BASENP_ALL.n_train}, got {n_train}")
    epochs = sorted(set(DEFAULT_EPOCHS if epochs is None else epochs))
    if epochs[0] < 1:
        sys.exit(f"--epochs must be positive, got {epochs}")
    params = {
        name: getattr(args, name)
        for name in GP_OPTIONS
        if getattr(args, name) is not None
    }
    return reps, n_train, params, max_iter, epochs


# ---------------------------------------------------------------------- #
# the GP
def _describe(gp, what):
    if "failure" in gp:
        return f"  {what:<16} FAILED: {gp['failure']}"
    note = "" if gp["converged"] else ", not converged"
    return (
        f"  {what:<16} error {gp['error']:6.2f} %   fit {gp['fit_time']:8.2f} s "
        f"({gp['n_iter']} iterations{note})   {calibration_text(gp)}"
    )


def _fit_and_report(params, what, verbose, data):
    """:func:`fit_gp` with its one-line report; the fit's time is also its
    time to its final error."""
    result = fit_gp(params, verbose, *data)
    result["time_to_final_error"] = result["fit_time"]
    print(_describe(result, what), flush=True)
    return result


def stochastic_curve(params, epochs, verbose, data):
    """One stochastic fit per epoch budget; the curve and its summary."""
    points = []
    for k in epochs:
        point = fit_gp({**params, "optimizer": "stochastic", "max_iter": k},
                       verbose, *data)
        point["epochs"] = k
        print(_describe(point, f"GP SAGA {k:>3} ep"), flush=True)
        points.append(point)
    ok = [p for p in points if "failure" not in p]
    # The shorter fits must replay the first epochs of the longer ones.
    nested = all(
        np.array_equal(a["elbo_history"], b["elbo_history"][: len(a["elbo_history"])])
        for a, b in zip(ok, ok[1:], strict=False)
    )
    summary = {"curve": points, "nested": nested}
    if ok:
        final = ok[-1]
        first = next(p for p in ok if p["error"] <= final["error"])
        summary.update(
            error=final["error"],
            calibration=final.get("calibration"),
            fit_time=final["fit_time"],
            epochs=final["epochs"],
            n_iter=final["n_iter"],
            saga_memory_bytes=final.get("saga_memory_bytes"),
            time_to_final_error=first["fit_time"],
            epochs_to_final_error=first["epochs"],
        )
    else:
        summary.update(error=float("nan"), fit_time=float("nan"),
                       time_to_final_error=float("nan"))
    if not nested:
        print("  note: the ELBO histories of the epoch budgets are not nested "
              "(the fits did not replay the same steps)", flush=True)
    return summary


# ---------------------------------------------------------------------- #
# one repetition
def run_rep(pool, r, n_train, params, max_iter, epochs, args, with_crf):
    tokens, labels, template = pool
    perm = np.random.default_rng(r).permutation(BASENP_ALL.n_data)
    train, test = perm[:n_train], perm[BASENP_ALL.n_train:]
    y_train, y_test = take(labels, train), take(labels, test)
    X_train, X_test, names, feature_time = template_features(
        template, take(tokens, train), take(tokens, test)
    )
    result = {
        "rep": r,
        "n_train": int(len(train)),
        "n_test": int(len(test)),
        "n_train_tokens": int(sum(len(s) for s in y_train)),
        "n_test_tokens": int(sum(len(s) for s in y_test)),
        "n_features": int(len(names)),
        "feature_time": feature_time,
    }
    print(
        f"repetition {r}: {len(train)} training sequences "
        f"({result['n_train_tokens']} tokens), {len(test)} test "
        f"({result['n_test_tokens']} tokens), {result['n_features']} features",
        flush=True,
    )
    data = (X_train, y_train, X_test, y_test)
    batch = {**params, "optimizer": "lbfgs"}
    if max_iter is not None:
        batch["max_iter"] = max_iter
    if not args.no_batch:
        result["gp_batch"] = _fit_and_report(batch, "GP L-BFGS", args.verbose, data)
    if not args.no_stochastic:
        result["gp_stochastic"] = stochastic_curve(params, epochs, args.verbose, data)
    if not args.no_pseudo:
        result["gp_batch_pseudo"] = _fit_and_report(
            {**batch, "likelihood": "pseudo"}, "GP L-BFGS pseudo", args.verbose, data
        )
        stochastic = {**params, "optimizer": "stochastic", "max_iter": epochs[-1]}
        result["gp_stochastic_pseudo"] = _fit_and_report(
            {**stochastic, "likelihood": "pseudo"}, f"GP SAGA pseudo {epochs[-1]} ep",
            args.verbose, data,
        )
    if not args.no_ess:
        ess = {**batch, "inference": "ess"}
        if args.ess_n_iter is not None:
            ess["ess_n_iter"] = args.ess_n_iter
        result["gp_ess"] = _fit_and_report(ess, "GP ESS", args.verbose, data)
    if with_crf:
        with Stopwatch() as convert:
            C_train, C_test = to_crfsuite(X_train, names), to_crfsuite(X_test, names)
        result["crf_convert_time"] = convert.seconds
        y_train_s = [[str(v) for v in s] for s in y_train]
        y_test_s = [[str(v) for v in s] for s in y_test]
        for c2 in FIXED_C2:
            with Stopwatch() as fit:
                crf = _fit_crf(C_train, y_train_s, c2)
            error = token_error(y_test, crf.predict(C_test))
            marginals, classes = crf_marginals(crf, crf_items(C_test))
            fixed = result[f"crf_c2={c2:g}"] = {
                "error": error,
                "fit_time": fit.seconds,
                "calibration": calibration(y_test_s, marginals, classes),
            }
            print(f"  {'CRF c2=' + format(c2, 'g'):<16} error {error:6.2f} %   fit "
                  f"{fit.seconds:8.2f} s   {calibration_text(fixed)}", flush=True)
        if not args.no_crf_cv:
            result["crf_cv"] = _selected(
                run_crfsuite(C_train, y_train, C_test, y_test), "CRF c2 by CV", "c2"
            )
    if not args.no_lr:
        result["logreg"] = _selected(
            run_logreg(X_train, y_train, X_test, y_test), "LR, C by CV", "C"
        )
    return result


def _selected(peer, what, parameter):
    """A peer chosen by inner CV: its total time (selection + refit) added,
    and its one-line report."""
    peer["total_time"] = peer["select_time"] + peer["refit_time"]
    print(
        f"  {what:<16} error {peer['error']:6.2f} %   selection "
        f"{peer['select_time']:.2f} s + refit {peer['refit_time']:.2f} s "
        f"({parameter}={peer[parameter]:g})   {calibration_text(peer)}",
        flush=True,
    )
    return peer


# ---------------------------------------------------------------------- #
# reporting
def _get(r, *keys):
    value = r
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return float("nan")
        value = value[key]
    return float("nan") if value is None else value


def _ratio(r, gp_key, crf_keys):
    gp, crf = _get(r, gp_key, "fit_time"), _get(r, *crf_keys)
    if np.isfinite(gp) and np.isfinite(crf) and crf > 0:
        return gp / crf
    return float("nan")


def models(reps, epochs):
    """The models present in any repetition, in report order.

    Each is ``(key, name, time_key, count)``: the result's key, its column
    name, the key of its time (``fit_time``, or ``total_time`` for the
    peers chosen by inner CV: selection plus refit) and the name of its
    iteration count column, or None.
    """
    k = epochs[-1]
    spec = [
        ("gp_batch", "GP L-BFGS", "fit_time", "GP L-BFGS iterations"),
        ("gp_stochastic", f"GP SAGA {k} ep", "fit_time", None),
        ("gp_batch_pseudo", "GP L-BFGS pseudo", "fit_time",
         "GP L-BFGS pseudo iterations"),
        ("gp_stochastic_pseudo", f"GP SAGA pseudo {k} ep", "fit_time",
         "GP SAGA pseudo epochs"),
        ("gp_ess", "GP ESS", "fit_time", None),
    ]
    spec += [(f"crf_c2={c2:g}", f"CRF c2={c2:g}", "fit_time", None) for c2 in FIXED_C2]
    spec += [
        ("crf_cv", "CRF c2 by CV", "total_time", None),
        ("logreg", "LR, C by CV", "total_time", None),
    ]
    return [m for m in spec if any(m[0] in r for r in reps)]


def crf_reference(reps):
    """The CRF time the GP fits are compared with: ``(key, time key, name)``
    (the CV-selected CRF's selection plus refit, else the c2 = 1 fit), or
    None when no CRF ran."""
    if any("crf_cv" in r for r in reps):
        return "crf_cv", "total_time", "CRF CV total"
    if any("crf_c2=1" in r for r in reps):
        return "crf_c2=1", "fit_time", "CRF c2=1"
    return None


def columns(reps, epochs):
    """(header, cell function[, unit]) columns of the error and time tables."""
    err, time = [], []
    present = models(reps, epochs)
    for key, name, time_key, count in present:
        err.append((name, lambda r, key=key: _get(r, key, "error")))
        suffix = " selection + refit" if time_key == "total_time" else " fit"
        time.append((name + suffix, lambda r, key=key, t=time_key: _get(r, key, t)))
        if count is not None:
            time.append((count, lambda r, key=key: _get(r, key, "n_iter"), "n"))
        if key == "gp_stochastic":
            time.append(("GP SAGA to final error",
                         lambda r: _get(r, "gp_stochastic", "time_to_final_error")))
    reference = crf_reference(reps)
    if reference is not None:
        crf_key, crf_time, ref = reference
        for key, name, _, _ in present:
            if key.startswith("gp_"):
                time.append((f"{name} / {ref}",
                             lambda r, g=key: _ratio(r, g, (crf_key, crf_time)), "x"))
    return err, time


def _with_final_calibration(rep):
    """The repetition with its stochastic summary's calibration taken from
    the longest budget's fit when the summary lacks it (JSON written before
    the summary recorded it)."""
    stochastic = rep.get("gp_stochastic")
    if not stochastic or "calibration" in stochastic:
        return rep
    ok = [p for p in stochastic.get("curve", []) if "calibration" in p]
    if not ok:
        return rep
    final = {**stochastic, "calibration": ok[-1]["calibration"]}
    return {**rep, "gp_stochastic": final}


def summary_table(reps, epochs):
    """One row per model: error, time, time / CRF, NLL and ECE, mean (std)."""
    reference = crf_reference(reps)
    rows = []
    reps = [_with_final_calibration(r) for r in reps]
    for key, name, time_key, _ in models(reps, epochs):
        ratio = "-"
        if reference is not None and key.startswith("gp_"):
            ratio = format_mean_std(
                [_ratio(r, key, reference[:2]) for r in reps], digits=1, unit="x"
            )
        calibrated = any("calibration" in r.get(key, {}) for r in reps)
        rows.append([
            name,
            format_mean_std([_get(r, key, "error") for r in reps]),
            format_mean_std([_get(r, key, time_key) for r in reps], unit=" s"),
            ratio,
        ] + [
            format_mean_std([_get(r, key, "calibration", what) for r in reps],
                            digits=digits) if calibrated else "-"
            for what, digits in (("nll", 3), ("ece", 4))
        ])
    against = reference[2] if reference is not None else "CRF"
    return markdown_table(
        ["model", "error %", "fit time (peers: selection + refit)",
         f"time / {against}", "NLL of the true label", "ECE (top label)"],
        rows,
    )


def table(reps, cols, unit):
    """Rows per repetition, then the mean (std). A column is (name, cell) or
    (name, cell, unit); the unit "x" marks a ratio, "n" a count."""
    header = ["repetition"] + [c[0] for c in cols]

    def fmt(values, col):
        col_unit = col[2] if len(col) > 2 else unit
        if col_unit == "n":  # a count
            return format_mean_std(values, digits=0)
        digits = 1 if col_unit == "x" else 2
        return format_mean_std(values, digits=digits, unit=col_unit)

    rows = [[str(r["rep"])] + [fmt([c[1](r)], c) for c in cols] for r in reps]
    if len(reps) > 1:
        rows.append([f"**mean ({len(reps)})**"] + [
            fmt([c[1](r) for r in reps], c) for c in cols
        ])
    return markdown_table(header, rows)


def curve_table(reps):
    """Stochastic curve: error and fit time per epoch budget, mean (std)."""
    budgets = {}
    for r in reps:
        for p in r.get("gp_stochastic", {}).get("curve", []):
            budgets.setdefault(p["epochs"], []).append(p)
    rows = []
    for k, points in sorted(budgets.items()):
        rows.append([
            str(k),
            format_mean_std([p["error"] for p in points]),
            format_mean_std([p["fit_time"] for p in points], unit=" s"),
            format_mean_std([p.get("elbo") or float("nan") for p in points],
                            digits=1),
            format_mean_std([p.get("saga_memory_bytes", float("nan")) / 2**20
                             for p in points], digits=2, unit=" MiB"),
        ])
    return markdown_table(
        ["epochs", "error %", "fit time", "final ELBO (SAGA estimate)",
         "SAGA stored gradients"],
        rows,
    )


def main(argv=None):
    args = build_parser().parse_args(argv)
    data_dir = check_data_dir(args.data)
    reps, n_train, params, max_iter, epochs = settings(args)
    with_crf = crfsuite_available()
    env = environment()

    print(f"command: {command_line()}")
    print("environment: " + ", ".join(f"{k} {v}" for k, v in env.items()))
    print(f"shared GPStructClassifier options: {params}")
    print(f"  L-BFGS: max_iter={max_iter if max_iter is not None else 'default'}; "
          f"SAGA: one fit per epoch budget {epochs}"
          + ("" if args.no_pseudo else
             f"; pseudo-likelihood: L-BFGS, and SAGA at {epochs[-1]} epochs")
          + ("" if args.no_ess else
             "; ESS: ess_n_iter="
             + (str(args.ess_n_iter) if args.ess_n_iter else "default")))
    print(f"protocol: basenp/test.data, {BASENP_ALL.n_data} sequences, "
          f"permutation default_rng(r), r in {reps}, first {n_train} to train, "
          f"last {BASENP_ALL.n_data - BASENP_ALL.n_train} to test")
    if with_crf:
        print(f"CRF: c2 in {list(FIXED_C2)}"
              + ("" if args.no_crf_cv else
                 f", and c2 by inner {INNER_FOLDS}-fold CV over {list(CRF_C2_GRID)}"))
    else:
        print(CRF_MISSING)
    print()

    pool = load_pool(data_dir, BASENP_ALL)
    results = []
    for r in reps:
        results.append(
            run_rep(pool, r, n_train, params, max_iter, epochs, args, with_crf)
        )
        print()

    err_cols, time_cols = columns(results, epochs)
    print("## Token error % (measured in this run; mean (std over repetitions, "
          "ddof=1))")
    print()
    print(table(results, err_cols, ""))
    print()
    print("## Fit time (measured in this run)")
    print()
    print(table(results, time_cols, " s"))
    print()
    print("Ratios are per repetition, then averaged. 'GP SAGA to final error' is "
          "the fit time of the shortest epoch budget whose test error is no "
          "worse than the longest budget's.")
    print()
    print("## Every model: error, time and calibration (mean (std))")
    print()
    print(summary_table(results, epochs))
    if not args.no_stochastic:
        print()
        print("## GP SAGA: error against epochs (one fit per budget, same seed)")
        print()
        print(curve_table(results))
        nested = all(r["gp_stochastic"]["nested"] for r in results)
        print()
        print("The shorter fits replay the first epochs of the longer ones: "
              + ("yes (ELBO histories nested)." if nested else
                 "NO (ELBO histories differ): the curve mixes different runs."))
    print()
    print("## Quoted from BENCHMARK.md section 2 (not measured in this run)")
    print()
    print(markdown_table(["result", "error %"], QUOTED_SECTION2))
    print()
    print(f"command: {command_line()}")

    if args.out:
        payload = {
            "command": command_line(),
            "environment": env,
            "gp_options": params,
            "lbfgs_max_iter": max_iter,
            "stochastic_epochs": epochs,
            "ess_n_iter": args.ess_n_iter,
            "n_train": n_train,
            "quick": args.quick,
            "results": results,
        }
        write_json(args.out, payload)
    return failure_status(results)


if __name__ == "__main__":
    sys.exit(main())
