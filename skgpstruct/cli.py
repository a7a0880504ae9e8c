"""The ``skgpstruct`` command line.

``skgpstruct <command> [options]``; ``skgpstruct --help`` lists the
commands and ``skgpstruct <command> --help`` their options. Each command is
one ``_add_<command>`` function that declares its sub-parser and one
``_run_<command>`` function that takes the parsed arguments and returns the
exit code; :func:`main` dispatches.

Commands
--------
demo
    Fit a :class:`~skgpstruct.GPStructClassifier` to synthetic sequences
    (:func:`skgpstruct.datasets.make_sequences`) and compare it with a
    per-token logistic regression on the same features.
"""

import argparse
import sys
import time
import warnings

import numpy as np

from . import __version__

__all__ = ["main"]

# The synthetic task of ``skgpstruct demo``: noisy enough that a token's own
# features leave many labels ambiguous, so the chain (sticky labels) matters.
_DEMO_NOISE = 2.0
_DEMO_N_CLASSES = 3
_DEMO_N_FEATURES = 8
_DEMO_N_TEST = 100
_DEMO_SHOWN_TOKENS = 8


def _positive_int(text):
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer >= 1, got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _nonnegative_int(text):
    """argparse type: an integer >= 0 (a seed)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer >= 0, got {text!r}"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


# ---------------------------------------------------------------------- #
# demo
def _add_demo(subparsers):
    parser = subparsers.add_parser(
        "demo",
        help="fit the GP to synthetic sequences and compare it with a "
        "per-token logistic regression",
        description=(
            "Generate synthetic labelled sequences (labels follow a sticky "
            "Markov chain, token features are noisy non-linear functions of "
            "the label), fit GPStructClassifier on a training set, and print "
            "its token accuracy on a held-out set beside a per-token "
            "LogisticRegression on the same features, the fit times, and "
            "the GP's per-token marginal probabilities on one test sequence."
        ),
    )
    parser.add_argument(
        "--n-sequences", type=_positive_int, default=150, metavar="N",
        help="number of training sequences (default: %(default)s); "
        f"{_DEMO_N_TEST} more are generated for testing",
    )
    parser.add_argument(
        "--random-state", type=_nonnegative_int, default=0, metavar="SEED",
        help="seed of the data and of the fit (default: %(default)s)",
    )
    parser.add_argument(
        "--n-inducing", type=_positive_int, default=150, metavar="M",
        help="inducing points of the GP (default: %(default)s)",
    )
    parser.add_argument(
        "--max-iter", type=_positive_int, default=100, metavar="N",
        help="L-BFGS iterations of the GP fit (default: %(default)s)",
    )
    parser.add_argument(
        "--n-jobs", type=int, default=None, metavar="N",
        help="joblib workers for the fit (default: 1; -1 for all cores)",
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true",
        help="do not print the ELBO progress lines",
    )
    parser.set_defaults(run=_run_demo, parser=parser)


def _run_demo(args):
    # Imported here so that `skgpstruct --help` stays fast.
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    from ._estimator import GPStructClassifier
    from .datasets import make_sequences
    from .metrics import token_accuracy

    n_train = args.n_sequences
    X, y = make_sequences(
        n_train + _DEMO_N_TEST,
        n_classes=_DEMO_N_CLASSES,
        n_features=_DEMO_N_FEATURES,
        noise=_DEMO_NOISE,
        random_state=args.random_state,
    )
    X_train, y_train = X[:n_train], y[:n_train]
    X_test, y_test = X[n_train:], y[n_train:]
    n_train_tokens = sum(len(s) for s in y_train)
    n_test_tokens = sum(len(s) for s in y_test)
    print(
        f"synthetic data: {_DEMO_N_CLASSES} labels, {_DEMO_N_FEATURES} features, "
        f"noise {_DEMO_NOISE}; {n_train} training sequences ({n_train_tokens} "
        f"tokens), {_DEMO_N_TEST} test sequences ({n_test_tokens} tokens)"
    )

    gp = GPStructClassifier(
        kernel="rbf",
        n_inducing=args.n_inducing,
        max_iter=args.max_iter,
        n_jobs=args.n_jobs,
        random_state=args.random_state,
        verbose=0 if args.quiet else 1,
    )
    print(
        f"fitting GPStructClassifier(kernel='rbf', n_inducing={args.n_inducing}, "
        f"max_iter={args.max_iter})",
        flush=True,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        start = time.perf_counter()
        gp.fit(X_train, y_train)
        gp_time = time.perf_counter() - start
    for warning in caught:
        if issubclass(warning.category, ConvergenceWarning):
            print(f"note: the GP stopped at max_iter={args.max_iter} before "
                  "the ELBO settled (use --max-iter to run longer)")
        else:
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename,
                warning.lineno,
            )
    gp_accuracy = token_accuracy(y_test, gp.predict(X_test))

    logreg = LogisticRegression(max_iter=1000)
    start = time.perf_counter()
    logreg.fit(np.vstack(X_train), np.concatenate(y_train))
    lr_time = time.perf_counter() - start
    lr_pred = logreg.predict(np.vstack(X_test))
    lr_accuracy = float(np.mean(lr_pred == np.concatenate(y_test)))

    print()
    print(f"test token accuracy ({n_test_tokens} tokens):")
    print(f"  GPStructClassifier       accuracy {gp_accuracy:.4f}   "
          f"fit {gp_time:7.2f} s   ({gp.n_iter_} iterations)")
    print(f"  LogisticRegression       accuracy {lr_accuracy:.4f}   "
          f"fit {lr_time:7.2f} s   (per token, no chain)")

    # The test sequence with the most label changes shows the chain at work.
    shown = int(np.argmax([np.count_nonzero(np.diff(s)) for s in y_test]))
    marginals = gp.predict_marginals([X_test[shown]])[0]
    predicted = gp.predict([X_test[shown]])[0]
    lr_shown = logreg.predict(X_test[shown])
    n_shown = min(_DEMO_SHOWN_TOKENS, len(predicted))
    print()
    print(
        f"GP marginals p(label | x) of test sequence {shown} (first {n_shown} "
        f"of {len(predicted)} tokens):"
    )
    names = [f"p({c})" for c in gp.classes_]
    widths = [max(len(n), 5) for n in names]
    header = "  ".join(f"{n:>{w}}" for n, w in zip(names, widths, strict=True))
    print(f"  token  true  GP  LR  {header}")
    for t in range(n_shown):
        probs = "  ".join(
            f"{p:{w}.3f}" for p, w in zip(marginals[t], widths, strict=True)
        )
        print(
            f"  {t:5d}  {y_test[shown][t]!s:>4}  {predicted[t]!s:>2}  "
            f"{lr_shown[t]!s:>2}  {probs}"
        )
    return 0


# ---------------------------------------------------------------------- #
def _build_parser():
    parser = argparse.ArgumentParser(
        prog="skgpstruct",
        description="Bayesian sequence labelling with Gaussian-process priors.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}"
    )
    subparsers = parser.add_subparsers(
        title="commands", dest="command", metavar="<command>", required=True
    )
    _add_demo(subparsers)
    return parser


def main(argv=None):
    """Run the ``skgpstruct`` command line.

    Parameters
    ----------
    argv : list of str or None, default=None
        The arguments after the program name; None reads ``sys.argv[1:]``.

    Returns
    -------
    exit_code : int
        0 on success. Invalid options make argparse print a usage message
        and exit with status 2.
    """
    parser = _build_parser()
    args, extra = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if extra:
        # Report unknown options with the sub-command's usage, not the
        # top-level one argparse would show.
        args.parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args.run(args)
