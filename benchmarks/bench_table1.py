"""Table 1 of the gray-box paper, side by side with today's peers.

BENCHMARK.md section 1 protocol on the CRF++ data sets (basenp, chunking,
seg, JapaneseNE): for every fold, in the same process and on the same
features (the set's CRF++ template, vocabulary fitted on the training fold),

(a) GPStructClassifier with the options given on the command line
    (default: the estimator's defaults);
(b) sklearn-crfsuite (L-BFGS, c1=0, transitions between all labels), c2
    picked by 3-fold inner cross-validation over {0.01, 0.1, 1, 10} on the
    training fold, then refitted on it;
(c) a per-token LogisticRegression, C picked the same way over
    {0.01, 0.1, 1, 10, 100}.

It prints token error %, fit times and the ratio GP fit time / CRF
(selection + refit) per fold, then a Markdown table with the mean (std over
the folds) and the exact command line.

Examples
--------
Smoke test (one fold, few iterations)::

    python benchmarks/bench_table1.py --datasets basenp --folds 0 --quick

The full table::

    python benchmarks/bench_table1.py --out results.json
"""

import argparse
import sys

from _common import (
    CRF_C2_GRID,
    CRF_C2_WIDE_GRID,
    CRF_MISSING,
    DATASETS,
    DEFAULT_DATA_DIR,
    INNER_FOLDS,
    LR_C_GRID,
    MEASURED_TABLE1,
    PAPER_TABLE1,
    PEERS,
    PREDICT_MIN_TIME,
    PREDICTION_HEADER,
    PROBE_BASENP,
    calibration_rows,
    calibration_text,
    check_data_dir,
    command_line,
    crfsuite_available,
    difference_rows,
    environment,
    failure_status,
    fit_gp,
    fold_split,
    format_mean_std,
    load_pool,
    markdown_table,
    paper_gp_row,
    prediction_rows,
    read_folds,
    run_peers,
    take,
    template_features,
    transform_time,
    write_json,
)

from skgpstruct import GPStructClassifier
from skgpstruct.cli import _scale_or_none

#: ``max_iter`` of ``--quick`` when ``--max-iter`` is not given.
QUICK_MAX_ITER = 20

# GP options exposed on the command line (flag --n-inducing -> n_inducing).
GP_OPTIONS = (
    "kernel",
    "n_inducing",
    "inducing",
    "covariance",
    "n_samples",
    "max_iter",
    "gradient",
    "optimizer",
    "likelihood",
    "batch_size",
    "learning_rate",
    "n_iter_no_change",
    "tol",
    "n_jobs",
    "random_state",
)


def build_parser():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="GP options left out take GPStructClassifier's defaults.",
    )
    parser.add_argument(
        "--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS),
        metavar="NAME",
        help=f"data sets to run, among {', '.join(DATASETS)} (default: all)",
    )
    parser.add_argument(
        "--folds", nargs="+", type=int, choices=range(5), default=None,
        metavar="K", help="folds to run, among 0..4 (default: all five)",
    )
    parser.add_argument(
        "--data", default=str(DEFAULT_DATA_DIR), metavar="DIR",
        help="directory holding crfpp/ and gpstruct-splits/ "
        "(default: <repo>/../shared/data)",
    )
    parser.add_argument("--out", metavar="FILE", help="also write the results as JSON")
    parser.add_argument(
        "--quick", action="store_true",
        help=f"smoke test: the first requested fold only, and max_iter="
        f"{QUICK_MAX_ITER} unless --max-iter is given",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true",
        help="print the GP's ELBO progress lines",
    )
    gp = parser.add_argument_group("GPStructClassifier options")
    # Accepted values are the estimator's to check (its message lists them).
    gp.add_argument("--kernel", metavar="NAME", help="e.g. linear, rbf")
    gp.add_argument("--n-inducing", type=int, metavar="M")
    gp.add_argument("--inducing", metavar="HOW",
                    help="how inducing variables are chosen")
    gp.add_argument("--covariance", metavar="KIND", help="full or diag")
    gp.add_argument("--n-samples", type=int, metavar="S")
    gp.add_argument("--max-iter", type=int, metavar="N")
    gp.add_argument("--gradient", metavar="KIND", help="pathwise or score")
    gp.add_argument("--optimizer", metavar="KIND", help="lbfgs or stochastic")
    gp.add_argument("--likelihood", metavar="NAME", help="crf or pseudo")
    gp.add_argument("--batch-size", type=int, metavar="N")
    gp.add_argument("--learning-rate", type=float, metavar="RATE")
    gp.add_argument("--tol", type=float, metavar="TOL")
    gp.add_argument("--n-iter-no-change", type=int, metavar="N")
    # Absent unless given: its value None means "no hyperprior".
    gp.add_argument(
        "--hyperprior-scale", type=_scale_or_none, default=argparse.SUPPRESS,
        metavar="S",
        help="sd of the log-normal hyperprior on the kernel hyperparameters, "
        "or 'none' for none (type-II maximum likelihood)",
    )
    gp.add_argument("--n-jobs", type=int, metavar="N")
    gp.add_argument(
        "--random-state", type=int, default=0, metavar="SEED",
        help="the GP's random_state (default 0, as the suite's runs: a run "
        "without a seed could not be reproduced)",
    )
    return parser


def gp_params(args):
    params = {
        name: getattr(args, name)
        for name in GP_OPTIONS
        if getattr(args, name) is not None
    }
    if "hyperprior_scale" in vars(args):
        params["hyperprior_scale"] = args.hyperprior_scale
    if args.quick:
        params.setdefault("max_iter", QUICK_MAX_ITER)
    return params


def run_fold(dataset, pool, folds, k, params, args, with_crf):
    tokens, labels, template = pool
    train, test = fold_split(folds, k, dataset.n_train)
    tok_train, tok_test = take(tokens, train), take(tokens, test)
    y_train, y_test = take(labels, train), take(labels, test)
    X_train, X_test, names, feature_time = template_features(
        template, tok_train, tok_test
    )
    result = {
        "dataset": dataset.name,
        "fold": k,
        "n_train_tokens": int(sum(len(s) for s in y_train)),
        "n_test_tokens": int(sum(len(s) for s in y_test)),
        "n_features": int(len(names)),
        "feature_time": feature_time,
    }
    print(
        f"{dataset.name} fold {k}: {len(train)} training sequences "
        f"({result['n_train_tokens']} tokens), {len(test)} test "
        f"({result['n_test_tokens']} tokens), {result['n_features']} features",
        flush=True,
    )
    result["gp"] = fit_gp(params, args.verbose, X_train, y_train, X_test, y_test)
    gp = result["gp"]
    gp["transform_time"] = transform_time(template, tok_train, tok_test)
    if "failure" in gp:
        print(f"  GP   FAILED: {gp['failure']}", flush=True)
    else:
        note = "" if gp["converged"] else ", not converged"
        print(
            f"  GP   error {gp['error']:6.2f} %   fit {gp['fit_time']:8.2f} s "
            f"({gp['n_iter']} iterations{note})   {calibration_text(gp)}   "
            f"{prediction_text(gp)}",
            flush=True,
        )
    result.update(run_peers(X_train, y_train, X_test, y_test, names, with_crf,
                            gp_fit_time=gp["fit_time"]))
    return result


def prediction_text(model_result):
    """``"predict x ms  predict_marginals y ms"`` of a GP or CRF result."""
    return (
        f"predict {1e3 * model_result['predict_time']:.1f} ms  "
        f"predict_marginals {1e3 * model_result['marginals_time']:.1f} ms"
    )


def _cells(folds, with_crf):
    """Table cells of a list of fold results: the value for one fold, the
    mean (std) for several."""

    def fmt(values, digits=2, unit=" s"):
        return format_mean_std(values, digits=digits, unit=unit)

    gp_err = fmt([r["gp"]["error"] for r in folds], unit="")
    lr_err = fmt([r["logreg"]["error"] for r in folds], unit="")
    gp_fit = fmt([r["gp"]["fit_time"] for r in folds])
    lr_time = fmt(
        [r["logreg"]["select_time"] + r["logreg"]["refit_time"] for r in folds]
    )
    if not with_crf:
        return [gp_err, lr_err, gp_fit, lr_time]
    return [
        gp_err,
        fmt([r["crf"]["error"] for r in folds], unit=""),
        fmt([r["crf_wide"]["error"] for r in folds], unit=""),
        lr_err,
        gp_fit,
        fmt([r["crf"]["select_time"] for r in folds]),
        fmt([r["crf"]["refit_time"] for r in folds]),
        lr_time,
        fmt([r["gp_over_crf_time"] for r in folds], digits=1, unit="x"),
    ]


def summary_rows(results, with_crf):
    """Markdown rows: every fold, then the mean (std) of each data set."""
    rows = []
    for name, folds in results.items():
        for r in folds:
            rows.append([name, str(r["fold"]), *_cells([r], with_crf)])
        label = f"mean ({len(folds)} fold{'s' if len(folds) > 1 else ''})"
        rows.append([f"**{name}**", label, *_cells(folds, with_crf)])
    return rows


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.folds is not None and len(set(args.folds)) < len(args.folds):
        # A fold run twice would count twice in the means and differences.
        sys.exit(f"--folds repeats a fold: {args.folds}")
    data_dir = check_data_dir(args.data)
    folds_to_run = args.folds if args.folds is not None else list(range(5))
    if args.quick:
        folds_to_run = folds_to_run[:1]
    params = gp_params(args)
    with_crf = crfsuite_available()
    env = environment()

    print(f"command: {command_line()}")
    print("environment: " + ", ".join(f"{k} {v}" for k, v in env.items()))
    print(f"GPStructClassifier options: {params or 'defaults'}")
    print(f"GP parameters: {GPStructClassifier(**params).get_params()}")
    print(
        f"peers: inner {INNER_FOLDS}-fold CV; CRF c2 grid {list(CRF_C2_GRID)}, "
        f"LR C grid {list(LR_C_GRID)}"
    )
    if not with_crf:
        print(CRF_MISSING)
    print()

    results = {}
    for name in args.datasets:
        dataset = DATASETS[name]
        pool = load_pool(data_dir, dataset)
        folds = read_folds(data_dir, dataset)
        results[name] = [
            run_fold(dataset, pool, folds, k, params, args, with_crf)
            for k in folds_to_run
        ]
        print()

    header = ["data set", "fold", "GP error %"]
    if with_crf:
        header += ["CRF error %", "CRF {1e-4..10} error %", "LR error %",
                   "GP fit", "CRF selection",
                   "CRF refit", "LR selection + refit", "GP / CRF time"]
    else:
        header += ["LR error %", "GP fit", "LR selection + refit"]
    print("## Measured in this run (mean (std over folds, ddof=1))")
    print()
    print(markdown_table(header, summary_rows(results, with_crf)))
    print()
    failed = [f"{name} {r['fold']}" for name, folds in results.items()
              for r in folds if "failure" in r["gp"]]
    if failed:
        print(f"The GP FAILED on fold(s) {', '.join(failed)}: its means (marked "
              "[n failed]) cover the other folds, the peers' every fold; the "
              "paired differences below pair the same folds.")
        print()
    print("GP / CRF time = GP fit time / (CRF c2 selection + CRF refit), per "
          "fold, then averaged. CRF: c2 over the protocol's grid "
          f"{list(CRF_C2_GRID)}; CRF {{1e-4..10}}: over "
          f"{list(CRF_C2_WIDE_GRID)}, the grid of BENCHMARK.md's measured row.")
    print()
    print("## Paired differences, GP minus peer (error points, mean (standard "
          "error) over the folds)")
    print()
    print(markdown_table(
        ["data set", "peer", "GP - peer", "folds where the GP is lower"],
        difference_rows(results, lambda fold: fold["gp"].get("error")),
    ))
    print()
    prediction = prediction_rows(results)
    if prediction:
        print("## Prediction time on the test fold (mean (std over folds))")
        print()
        print(markdown_table(
            ["data set", *PREDICTION_HEADER], prediction,
        ))
        print()
        print("Mean seconds per call over repeated calls of at least "
              f"{PREDICT_MIN_TIME:g} s, each model from its own input, built "
              "beforehand: the GP from the CSR template features, the CRF "
              "(the protocol grid's refit) from crfsuite's item sequences; "
              "labels and marginal arrays out (the CRF's marginals read "
              "from its tagger into arrays, no per-token dicts). "
              "predict_marginals: the GP averages "
              f"{GPStructClassifier(**params).n_predict_samples} posterior "
              "samples' forward-backward marginals, the CRF runs one "
              "forward-backward. The last two columns: building those "
              "inputs, the GP's template features from the test tokens and "
              "crfsuite's item sequences from its feature dicts (how the "
              "dicts are made from tokens is the CRF user's own code, not "
              "timed).")
        print()
    print("## Calibration of the per-token marginals (mean (std over folds))")
    print()
    print(markdown_table(
        ["data set", "model", "NLL of the true label (nats/token)", "ECE (top label)"],
        calibration_rows(
            results, [("GP", "gp"), *((label, key) for key, label in PEERS)]
        ),
    ))
    print()
    print("## Quoted from BENCHMARK.md (not measured in this run)")
    print()
    # The paper's row of the GP configured here (pseudo-likelihood in batch
    # mode has none: the paper's GP-VAR-B column is shown instead).
    row = paper_gp_row(params.get("optimizer"), params.get("likelihood"))
    paper_label = row or "GP-VAR-B (no paper row for this configuration)"
    quoted = [
        [name, PAPER_TABLE1[name][row or "GP-VAR-B"], MEASURED_TABLE1[name]["CRF"],
         MEASURED_TABLE1[name]["LR"], MEASURED_TABLE1[name]["CRF time"]]
        for name in args.datasets
    ]
    print(markdown_table(
        ["data set", f"paper {paper_label} error %", "measured CRF error %",
         "measured per-token LR error %", "CRF fit + selection per fold"],
        quoted,
    ))
    if "basenp" in args.datasets:
        print()
        print(f"Floor (BENCHMARK.md, NumPy weight-space probe, basenp): "
              f"{PROBE_BASENP}.")
    print()
    print(f"command: {command_line()}")

    if args.out:
        payload = {
            "command": command_line(),
            "environment": env,
            "gp_options": params,
            "gp_parameters": {
                k: v if isinstance(v, str | int | float | bool | type(None))
                else repr(v)
                for k, v in GPStructClassifier(**params).get_params().items()
            },
            "quick": args.quick,
            "results": results,
        }
        write_json(args.out, payload)
    return failure_status(results)


if __name__ == "__main__":
    sys.exit(main())
