"""GP-ESS (the original GPstruct sampler) on the Table 1 protocol.

BENCHMARK.md section 1 on the CRF++ data sets (basenp, chunking, seg,
JapaneseNE): for every fold, the set's CRF++ template features (vocabulary
fitted on the training fold), elliptical slice sampling of the joint
posterior of all training unaries and the pairwise potentials under the full
GP prior (:func:`skgpstruct.inference.ess.sample_posterior`), and
GPstruct's prediction: for every kept sample the test unaries are the GP
conditional mean ``K_*X K^{-1} f``, forward-backward marginals are averaged
over the samples, and each token takes its max-marginal label.

Hyperparameters are fixed, as in GPstruct's experiments (pygpstruct's
``lhp_init``): the linear kernel ``k(x, x') = x . x'`` on the binary
template features (variance 1, no bias) and pairwise prior variance 0.01.
GPstruct ran 250,000 iterations; ``--n-iter`` sets a budget that fits in
minutes. ``--learned-hyperparameters`` samples instead at the kernel and
pairwise prior variance that a batch variational fit
(``GPStructClassifier(random_state=SEED)``) learns from the ELBO on the same
training fold: the fit time then includes that fit.

On the same fold and features, the peers of ``bench_table1.py`` run in the
same process (``--no-peers`` skips them): sklearn-crfsuite with c2 chosen by
3-fold inner CV, and the per-token LogisticRegression.

Printed: token error % per fold and mean (std over folds, ddof=1) beside the
peers and the paper's GP-ESS row, the fit time (Gram matrix, Cholesky factor
and sampling), prediction time and ESS fit / (CRF selection + refit), the
calibration of the averaged marginals (NLL of the true label, top-label
ECE) beside the peers', and the error as a function of the number of
iterations: at checkpoints ``c`` the marginals averaged over the kept
samples of iterations ``(burn_in_fraction * c, c]`` (the final checkpoint is
the reported error), and the error of the single sample at ``c``.

Examples
--------
One fold of basenp (about two minutes on a busy two-core machine)::

    python benchmarks/bench_ess.py --datasets basenp --folds 0

Smoke test (first fold of every data set, 1,000 iterations)::

    python benchmarks/bench_ess.py --quick

Section 1, all four data sets::

    python benchmarks/bench_ess.py --out benchmarks/results/ess.json

The same sampler at the hyperparameters the ELBO learns::

    python benchmarks/bench_ess.py --learned-hyperparameters
"""

import argparse
import copy
import sys

import numpy as np
from _common import (
    CRF_MISSING,
    DATASETS,
    DEFAULT_DATA_DIR,
    MEASURED_TABLE1,
    PAPER_TABLE1,
    PEERS,
    Stopwatch,
    calibration,
    calibration_rows,
    calibration_text,
    check_data_dir,
    command_line,
    crfsuite_available,
    difference_rows,
    environment,
    fit_recording_convergence,
    fold_split,
    format_mean_std,
    load_pool,
    markdown_table,
    read_folds,
    run_peers,
    take,
    template_features,
    token_error,
    write_json,
)

from skgpstruct import GPStructClassifier
from skgpstruct._sequences import stack_sequences
from skgpstruct.inference.ess import sample_posterior
from skgpstruct.kernels import LinearKernel

#: Default ESS iterations per fold, and those of ``--quick``.
DEFAULT_N_ITER = 10000
QUICK_N_ITER = 1000
#: Fractions of ``--n-iter`` at which the error-vs-iterations curve is read.
CHECKPOINTS = (1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4, 1)


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS),
        metavar="NAME",
        help=f"data sets to run, among {', '.join(DATASETS)} (default: all)",
    )
    parser.add_argument(
        "--folds", nargs="+", type=int, choices=range(5), default=list(range(5)),
        metavar="K", help="folds to run, among 0..4 (default: all five)",
    )
    parser.add_argument(
        "--data", default=str(DEFAULT_DATA_DIR), metavar="DIR",
        help="directory holding crfpp/ and gpstruct-splits/",
    )
    parser.add_argument("--out", metavar="FILE", help="also write the results as JSON")
    parser.add_argument(
        "--quick", action="store_true",
        help=f"smoke test: the first requested fold only, and {QUICK_N_ITER} "
        "iterations unless --n-iter is given",
    )
    parser.add_argument(
        "--no-peers", action="store_true",
        help="skip the CRF and LR peers (run by default on the same folds)",
    )
    parser.add_argument(
        "--n-iter", type=int, default=None, metavar="N",
        help=f"ESS iterations per fold (default: {DEFAULT_N_ITER}, one to two "
        "minutes on basenp; GPstruct ran 250,000)",
    )
    parser.add_argument(
        "--burn-in", type=float, default=0.25, metavar="FRACTION",
        help="fraction of the iterations discarded (default: 0.25)",
    )
    parser.add_argument(
        "--n-kept", type=int, default=200, metavar="S",
        help="samples kept over the whole run, evenly spaced (default: 200)",
    )
    parser.add_argument(
        "--kernel-variance", type=float, default=1.0, metavar="V",
        help="variance of the linear kernel x . x' (default: 1, GPstruct's)",
    )
    parser.add_argument(
        "--pairwise-prior-variance", type=float, default=0.01, metavar="V",
        help="prior variance of the pairwise potentials (default: 0.01, "
        "GPstruct's)",
    )
    parser.add_argument(
        "--learned-hyperparameters", action="store_true",
        help="sample at the kernel and pairwise prior variance a batch "
        "variational fit learns on the training fold (instead of "
        "--kernel-variance and --pairwise-prior-variance)",
    )
    parser.add_argument("--random-state", type=int, default=0, metavar="SEED")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="print the sampler's progress"
    )
    return parser


def run_fold(dataset, pool, folds, k, args, with_crf):
    tokens, labels, template = pool
    train, test = fold_split(folds, k, dataset.n_train)
    y_train, y_test = take(labels, train), take(labels, test)
    X_train, X_test, names, _ = template_features(
        template, take(tokens, train), take(tokens, test)
    )
    classes, train_index = np.unique(
        np.concatenate([np.asarray(s) for s in y_train]), return_inverse=True
    )
    X_tr, offsets_tr = stack_sequences(X_train)
    X_te, offsets_te = stack_sequences(X_test)
    n_tokens = X_tr.shape[0]
    print(
        f"{dataset.name} fold {k}: {len(train)} training sequences ({n_tokens} "
        f"tokens), {len(test)} test ({X_te.shape[0]} tokens), {len(names)} "
        f"features, {len(classes)} labels",
        flush=True,
    )
    # Keep samples from the start so that the curve can be read at every
    # checkpoint; the reported error discards the burn-in fraction.
    thin = max(1, args.n_iter // args.n_kept)
    kernel, pairwise_prior_variance, learned = hyperparameters(
        X_train, y_train, args
    )
    with Stopwatch() as sampling:
        posterior = sample_posterior(
            X_tr, offsets_tr, train_index, kernel, len(classes),
            pairwise_prior_variance=pairwise_prior_variance,
            n_iter=args.n_iter, burn_in=0, thin=thin,
            random_state=args.random_state, verbose=int(args.verbose),
        )
    fit_seconds = sampling.seconds + (learned["fit_time"] if learned else 0.0)
    with Stopwatch() as predict:
        marginals = posterior.sample_marginals(X_te, offsets_te)  # (S, n, V)
    iterations = posterior.sample_iterations

    def error_of(mean_marginals):
        pred = classes[np.argmax(mean_marginals, axis=1)]
        pieces = np.split(pred, offsets_te[1:-1])
        return token_error(y_test, pieces)

    # The reported prediction: marginals averaged over the kept samples
    # after the burn-in.
    final = marginals[iterations > args.burn_in * args.n_iter].mean(axis=0)

    curve = []
    for fraction in CHECKPOINTS:
        c = int(round(fraction * args.n_iter))
        window = (iterations > args.burn_in * c) & (iterations <= c)
        if not window.any():
            continue
        last = np.flatnonzero(iterations <= c)[-1]
        curve.append({
            "iteration": c,
            "n_samples": int(window.sum()),
            "error_average": error_of(marginals[window].mean(axis=0)),
            "error_single": error_of(marginals[last]),
            "log_likelihood": float(posterior.log_likelihood_trace[c - 1]),
        })
    result = {
        "dataset": dataset.name,
        "fold": k,
        "n_train_tokens": int(n_tokens),
        "n_test_tokens": int(X_te.shape[0]),
        "n_features": int(len(names)),
        "error": curve[-1]["error_average"],
        "fit_time": fit_seconds,
        "sampling_time": sampling.seconds,
        "predict_time": predict.seconds,
        "calibration": calibration(
            y_test, np.split(final, offsets_te[1:-1]), list(classes)
        ),
        "jitter": posterior.jitter,
        "evaluations_per_iteration": float(posterior.n_evaluations.mean()),
        "curve": curve,
    }
    if learned:
        result["learned"] = learned
        status = "" if learned["converged"] else ", not converged"
        print(
            f"  variational fit {learned['fit_time']:.2f} s ({learned['n_iter']} "
            f"iterations{status}): kernel {learned['kernel']}, pairwise prior "
            f"variance {pairwise_prior_variance:.3g}",
            flush=True,
        )
    print(
        f"  ESS  error {result['error']:6.2f} %   fit {fit_seconds:7.2f} s   "
        f"predict {predict.seconds:6.2f} s   "
        f"({result['evaluations_per_iteration']:.2f} likelihood evaluations "
        f"per iteration, jitter {posterior.jitter:.3g})   "
        f"{calibration_text(result)}",
        flush=True,
    )
    if not args.no_peers:
        result.update(run_peers(X_train, y_train, X_test, y_test, names,
                                with_crf, gp_fit_time=fit_seconds))
    return result


def hyperparameters(X_train, y_train, args):
    """The sampler's kernel and pairwise prior variance, and (with
    ``--learned-hyperparameters``) what the variational fit that learned them
    reports, else None."""
    if not args.learned_hyperparameters:
        kernel = LinearKernel(
            variance=args.kernel_variance, bias=0.0, bias_bounds="fixed",
            variance_bounds="fixed",
        )
        return kernel, args.pairwise_prior_variance, None
    model = GPStructClassifier(random_state=args.random_state)
    fit_seconds, converged = fit_recording_convergence(model, X_train, y_train)
    learned = {
        "fit_time": fit_seconds,
        "n_iter": int(model.n_iter_),
        "converged": converged,
        "kernel": repr(model.kernel_),
        "pairwise_prior_variance": float(model.pairwise_prior_variance_),
    }
    return copy.deepcopy(model.kernel_), model.pairwise_prior_variance_, learned


def _peer_cells(folds, key, field="error", digits=2, unit=""):
    values = [r[key][field] for r in folds if key in r]
    return format_mean_std(values, digits=digits, unit=unit) if values else "-"


def main(argv=None):
    args = build_parser().parse_args(argv)
    if len(set(args.folds)) < len(args.folds):
        # A fold run twice would count twice in the means and differences.
        sys.exit(f"--folds repeats a fold: {args.folds}")
    if not 0.0 <= args.burn_in < 1.0:
        sys.exit(f"--burn-in must be a fraction in [0, 1), got {args.burn_in}")
    if args.n_iter is None:
        args.n_iter = QUICK_N_ITER if args.quick else DEFAULT_N_ITER
    if args.quick:
        args.folds = args.folds[:1]
    if args.n_iter < 1 or args.n_kept < 1:
        sys.exit("--n-iter and --n-kept must be positive")
    data_dir = check_data_dir(args.data)
    with_crf = not args.no_peers and crfsuite_available()
    env = environment()
    print(f"command: {command_line()}")
    print("environment: " + ", ".join(f"{k} {v}" for k, v in env.items()))
    hyper = (
        "the kernel and pairwise prior variance a batch variational fit learns "
        "on each training fold (its time included in the fit)"
        if args.learned_hyperparameters else
        f"linear kernel x.x' with variance {args.kernel_variance:g}, pairwise "
        f"prior variance {args.pairwise_prior_variance:g} (fixed)"
    )
    print(
        f"ESS: {args.n_iter} iterations, burn-in {args.burn_in:g} of them, "
        f"about {args.n_kept} samples kept; {hyper}; seed {args.random_state}"
    )
    if args.no_peers:
        print("peers: skipped (--no-peers)")
    elif not with_crf:
        print(CRF_MISSING)
    print()

    results = {}
    for name in args.datasets:
        dataset = DATASETS[name]
        pool = load_pool(data_dir, dataset)
        folds = read_folds(data_dir, dataset)
        results[name] = [
            run_fold(dataset, pool, folds, k, args, with_crf) for k in args.folds
        ]
        print()

    def cells(folds):
        return [
            format_mean_std([r["error"] for r in folds]),
            _peer_cells(folds, "crf"),
            _peer_cells(folds, "crf_wide"),
            _peer_cells(folds, "logreg"),
            format_mean_std([r["fit_time"] for r in folds], digits=1, unit=" s"),
            format_mean_std([r["predict_time"] for r in folds], digits=1, unit=" s"),
            _peer_cells(folds, "crf", "total_time", unit=" s"),
            format_mean_std([r.get("gp_over_crf_time", float("nan"))
                             for r in folds], digits=1, unit="x")
            if any("crf" in r for r in folds) else "-",
        ]

    rows = []
    for name, folds in results.items():
        for r in folds:
            rows.append([name, str(r["fold"]), *cells([r]), "", ""])
        rows.append([
            f"**{name}**", f"mean ({len(folds)})", *cells(folds),
            PAPER_TABLE1[name]["GP-ESS"], MEASURED_TABLE1[name]["CRF"],
        ])
    print("## GP-ESS, measured (mean (std over folds, ddof=1))")
    print()
    print(markdown_table(
        ["data set", "fold", "ESS error %", "CRF error %", "CRF {1e-4..10} error %",
         "LR error %", "ESS fit",
         "ESS predict", "CRF selection + refit", "ESS fit / CRF time",
         "paper GP-ESS (quoted)", "CRF (BENCHMARK.md, quoted)"],
        rows,
    ))
    print()
    print("## Calibration of the per-token marginals (mean (std over folds))")
    print()
    print(markdown_table(
        ["data set", "model", "NLL of the true label (nats/token)",
         "ECE (top label)"],
        calibration_rows(
            results, [("GP-ESS", None), *((label, key) for key, label in PEERS)]
        ),
    ))
    print()
    if not args.no_peers:
        print("## Paired differences, ESS minus peer (error points, mean "
              "(standard error) over the folds)")
        print()
        print(markdown_table(
            ["data set", "peer", "ESS - peer", "folds where ESS is lower"],
            difference_rows(results, lambda fold: fold["error"]),
        ))
        print()
    print("## Error % against iterations (running average; single sample)")
    print()
    for name, folds in results.items():
        checkpoints = [p["iteration"] for p in folds[0]["curve"]]
        curve_rows = []
        for i, c in enumerate(checkpoints):
            points = [r["curve"][i] for r in folds]
            curve_rows.append([
                str(c),
                format_mean_std([p["error_average"] for p in points]),
                format_mean_std([p["error_single"] for p in points]),
                format_mean_std([p["log_likelihood"] for p in points], digits=1),
            ])
        print(f"{name} (folds {', '.join(str(r['fold']) for r in folds)})")
        print()
        print(markdown_table(
            ["iteration", "averaged marginals", "single sample",
             "training log-likelihood"],
            curve_rows,
        ))
        print()
    print(f"command: {command_line()}")
    if args.out:
        write_json(
            args.out,
            {"command": command_line(), "environment": env,
             "options": vars(args), "quick": args.quick, "results": results},
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
