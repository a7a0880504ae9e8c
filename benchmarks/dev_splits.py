"""Compare estimator settings on dev splits that no benchmark scores on.

Defaults are chosen here, never on the benchmark folds. The Table 1 pools
are the first ``n_data`` sequences of a data set's pool file (basenp 300,
chunking 100, JapaneseNE 100 of ``test.data``; seg: the 36 of
``train.data``), and section 2's pool is all of basenp's ``test.data``,
whose sentences are also those of chunking's ``test.data`` (822 of 823
word for word, with the same noun phrases on 780). So the dev splits
draw from (``DEV_POOLS``): basenp's and chunking's ``train.data`` (77
sequences each, the same sentences as each other), JapaneseNE's
``test.data`` after its Table 1 pool (400), seg's ``test.data`` (19).
Before, basenp's dev splits drew from its ``test.data`` after the Table
1 pool (most of section 2's test sequences) and chunking's from its
``test.data`` after its pool (sentences of basenp's Table 1 pool): the
earlier dev-split figures were measured on those (doc/benchmark_history.rst,
"Dev splits off the benchmark data"). Three random splits per data set
(seeds 100, 101, 102; seg 200, 201, 202): basenp and chunking train on
50 and test on the other 27, JapaneseNE 50 / 150, seg 10 / the rest.
Features: the set's CRF++ template fitted on the training split.

Each setting is a list of ``name=value`` estimator parameters; the script
prints, per data set and setting, the mean token error over the splits,
each split's error, the mean fit time and the iterations. Example (the
comparison behind ``tol=1e-5``)::

    OPENBLAS_NUM_THREADS=1 python benchmarks/dev_splits.py \\
        --datasets basenp chunking JapaneseNE --setting tol=1e-6 \\
        --setting tol=1e-5 --setting tol=1e-4

``--transitions`` also decodes every fit with its fitted transitions as
they are and with none (unaries only), beside ``predict`` (which decodes
with the transitions its likelihood names: for ``likelihood=pseudo``, the
pointwise mutual information of the label pairs)::

    OPENBLAS_NUM_THREADS=1 python benchmarks/dev_splits.py --transitions \\
        --setting likelihood=pseudo

``--calibration`` also prints, per setting, the mean over the splits of the
negative log-probability of the true label and the top-label ECE of
``predict_marginals`` as the setting has it (by default averaged over the
unary samples, transitions at their posterior mean), of the marginals
averaged over the transitions' posterior spread too
(``pairwise_uncertainty=True``) and of the forward-backward marginals at
the posterior mean potentials, with the mean top-label confidence of the
first two against the accuracy, and the mean posterior standard deviation
of the transitions between label pairs seen in training and never seen::

    OPENBLAS_NUM_THREADS=1 python benchmarks/dev_splits.py --calibration

``--peers`` also runs, once per data set, the peers of the Table 1 bench on
the same splits and features (sklearn-crfsuite with c2 by inner CV over
both grids, the per-token LR), with their error, NLL and ECE.
``--variance-scales C ...`` refits every (linear-kernel) fit with its
hyperparameters frozen at ``C`` times the prior variances it learned
(pairwise prior variance as learned): whether the ELBO's choice of the
regularisation is what a rescaling would improve on::

    OPENBLAS_NUM_THREADS=1 python benchmarks/dev_splits.py --peers \
        --variance-scales 0.5 2 4 16

``--ess-at-learned N`` also samples, for every fit, the exact posterior of
the same GP by elliptical slice sampling (``inference="ess"``, ``N``
iterations) at the kernel and pairwise prior variance the fit learned, and
prints its error and, with ``--calibration``, the NLL and ECE of its
marginals and of those at its mean potentials: whether what the
variational posterior gets wrong is its own (mean field, fixed samples) or
the model's::

    OPENBLAS_NUM_THREADS=1 python benchmarks/dev_splits.py --calibration \
        --ess-at-learned 10000

``--variances`` also prints where the learned per-template prior variances
(``feature_groups``) end against their start, over all the splits'
templates: how far the ELBO switches templates off, with and without the
hyperprior (the comparison behind ``hyperprior_scale=3``)::

    OPENBLAS_NUM_THREADS=1 python benchmarks/dev_splits.py --variances \
        --setting hyperprior_scale=None --setting hyperprior_scale=1 \
        --setting hyperprior_scale=2 --setting hyperprior_scale=3 \
        --setting hyperprior_scale=5
"""

import argparse
import copy
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from _common import (
    DATASETS,
    DEFAULT_DATA_DIR,
    PEERS,
    calibration,
    check_data_dir,
    command_line,
    crfsuite_available,
    dict_features,
    run_peers,
    take,
    template_features,
    token_error,
)
from sklearn.exceptions import ConvergenceWarning

from skgpstruct import GPStructClassifier, chain
from skgpstruct._sequences import split_by_offsets, stack_sequences
from skgpstruct.io import read_conll
from skgpstruct.kernels import GroupedLinearKernel

#: Training and test sizes of the dev splits (None: the rest of the dev
#: pool), and the first split seed.
DEV_SPLITS = {
    "basenp": (50, None, 100),
    "chunking": (50, None, 100),
    "JapaneseNE": (50, 150, 100),
    "seg": (10, None, 200),
}
#: The file each data set's dev splits draw from, and its first sequence
#: used: sequences no benchmark trains or tests on (module docstring).
DEV_POOLS = {
    "basenp": ("train.data", 0),
    "chunking": ("train.data", 0),
    "JapaneseNE": ("test.data", DATASETS["JapaneseNE"].n_data),
    "seg": ("test.data", 0),
}
N_SPLITS = 3


_CONSTANTS = {"None": None, "True": True, "False": False}


def parse_setting(text):
    """``"a=1 b=x"`` or ``"a=1,b=x"`` -> {"a": 1, "b": "x"} (numbers, None,
    True and False parsed)."""
    params = {}
    for item in text.replace(",", " ").split():
        if "=" not in item:
            raise argparse.ArgumentTypeError(
                f"a setting is name=value pairs, got {item!r} in {text!r}"
            )
        name, value = item.split("=", 1)
        if value in _CONSTANTS:
            params[name] = _CONSTANTS[value]
            continue
        for convert in (int, float):
            try:
                value = convert(value)
                break
            except ValueError:
                continue
        params[name] = value
    return params


def dev_pool(data_dir, name):
    """Token rows and labels of the dev pool (``DEV_POOLS``), and the
    template's path."""
    folder = Path(data_dir) / "crfpp" / name
    file_name, start = DEV_POOLS[name]
    tokens, labels = read_conll(folder / file_name, encoding=DATASETS[name].encoding)
    return tokens[start:], labels[start:], folder / "template"


def _mean_unaries(model, X):
    """The model's posterior mean unaries of the stacked ``X``, and offsets
    (``X`` checked, and centred if the model centres, as ``predict`` does)."""
    X_c, offsets = stack_sequences(model._check_predict_input(X))
    return model._mean_potentials(X_c), offsets


def decode_with(model, X, pairwise):
    """Viterbi on the model's posterior mean unaries and ``pairwise``."""
    unary, offsets = _mean_unaries(model, X)
    labels, _ = chain.viterbi(unary, pairwise, offsets)
    return [model.classes_[piece] for piece in split_by_offsets(labels, offsets)]


def mean_potential_marginals(model, X):
    """Forward-backward marginals at the posterior mean potentials."""
    unary, offsets = _mean_unaries(model, X)
    pairwise = model._decoding_pairwise(model.pairwise_mean_)
    _, marginals, _ = chain.forward_backward(unary[None], pairwise[None], offsets)
    return split_by_offsets(marginals[0], offsets)


#: Key of the top-label confidence of :func:`marginals_with_pairwise_spread`.
SPREAD_CONFIDENCE = "confidence with the transitions' spread"


def marginals_with_pairwise_spread(model, X):
    """``predict_marginals`` averaged over the transitions' posterior spread
    too (``pairwise_uncertainty=True``), whatever the model's setting."""
    return copy.copy(model).set_params(pairwise_uncertainty=True).predict_marginals(X)


def calibration_figures(model, X, y):
    """NLL and ECE of ``predict_marginals`` as the model is set, of the
    marginals averaged over the transitions' spread too and of those at the
    mean potentials, and the top-label confidence of the first two against
    the accuracy."""
    marginals = model.predict_marginals(X)
    at_mean = calibration(y, mean_potential_marginals(model, X), model.classes_)
    spread = marginals_with_pairwise_spread(model, X)
    P, Q = np.vstack(marginals), np.vstack(spread)
    top = model.classes_[P.argmax(axis=1)]
    return {
        "predict_marginals": calibration(y, marginals, model.classes_),
        "with the transitions' spread": calibration(y, spread, model.classes_),
        "at the mean": at_mean,
        "confidence": float(P.max(axis=1).mean()),
        SPREAD_CONFIDENCE: float(Q.max(axis=1).mean()),
        "accuracy": float(np.mean(top == np.concatenate(y))),
    }


def transition_spread(model, y_train):
    """Mean posterior standard deviation of the transitions between label
    pairs seen in ``y_train`` and of those never seen (NaN if none)."""
    index = {label: i for i, label in enumerate(model.classes_)}
    seen = np.zeros(model.pairwise_std_.shape, dtype=bool)
    for labels in y_train:
        codes = [index[label] for label in labels]
        seen[codes[:-1], codes[1:]] = True
    std = model.pairwise_std_
    return {
        "transition sd, seen pairs": float(std[seen].mean()) if seen.any() else np.nan,
        "transition sd, unseen pairs": (
            float(std[~seen].mean()) if (~seen).any() else np.nan
        ),
    }


def splits(name, data_dir, token_dicts=False):
    """The data set's dev splits: ``(X_train, y_train, X_test, y_test,
    feature_names)`` for each, features fitted on the training part (the
    CRF++ template's, or with ``token_dicts`` :func:`_common.dict_features`)."""
    tokens, labels, template = dev_pool(data_dir, name)
    n_train, n_test, seed = DEV_SPLITS[name]
    for split in range(N_SPLITS):
        order = np.random.default_rng(seed + split).permutation(len(tokens))
        train = order[:n_train]
        test = order[n_train:] if n_test is None else order[n_train : n_train + n_test]
        if token_dicts:
            X_train, X_test, names, _ = dict_features(
                take(tokens, train), take(tokens, test)
            )
        else:
            X_train, X_test, names, _ = template_features(
                template, take(tokens, train), take(tokens, test)
            )
        y_train = [np.asarray(y) for y in take(labels, train)]
        y_test = [np.asarray(y) for y in take(labels, test)]
        yield X_train, y_train, X_test, y_test, names


def _check_features_as_given(model):
    """Refuse a model fitted on centred features: a refit at its learned
    kernel (an object, used on the features as given) would not be the
    same model. The dev splits' CRF++ features are sparse indicators none
    of which is active at most tokens: never centred."""
    if getattr(model, "feature_mean_", None) is not None:
        raise ValueError(
            "the model centred its features (feature_mean_: dense features, or "
            "sparse columns active at most tokens); refits at its learned "
            "kernel are for features used as given only"
        )


def frozen_refit(model, scale, X, y):
    """``model`` refitted with its kernel frozen at ``scale`` times the prior
    variances it learned (bias and pairwise prior variance as learned)."""
    _check_features_as_given(model)
    kernel = copy.deepcopy(model.kernel_)
    kernel.set_params(variance=scale * np.asarray(kernel.variance))
    refit = GPStructClassifier(**{
        **model.get_params(), "kernel": kernel, "learn_hyperparameters": False,
        "pairwise_prior_variance": model.pairwise_prior_variance_,
    })
    return refit.fit(X, y)


def variance_shifts(model):
    """log10 of every learned per-template prior variance over its start
    (the initial hyperparameters the fit kept as its hyperprior's centre),
    or None when the fit's kernel has no groups."""
    kernel = model.kernel_
    if not isinstance(kernel, GroupedLinearKernel):
        return None
    start = kernel.clone_with_theta(model._hyperprior_centre)
    return np.log10(
        np.asarray(kernel.variance, float) / np.asarray(start.variance, float)
    )


def ess_at_learned(model, n_iter, X, y):
    """The exact posterior of ``model``'s GP, sampled by ESS (``n_iter``
    iterations, the exact chain likelihood) at the kernel and the pairwise
    prior variance ``model`` learned; same ``random_state``."""
    _check_features_as_given(model)
    return GPStructClassifier(
        inference="ess", likelihood="crf", ess_n_iter=n_iter,
        learn_hyperparameters=False, kernel=copy.deepcopy(model.kernel_),
        pairwise_prior_variance=model.pairwise_prior_variance_,
        random_state=model.random_state,
    ).fit(X, y)


#: Key of the ESS figures of :func:`run`.
ESS_KEY = "ESS at the learned hyperparameters"


def peer_results(name, data_dir, token_dicts=False):
    """The Table 1 peers (:func:`_common.run_peers`: both CRFs when
    sklearn-crfsuite is installed, and the LR) on every split:
    ``{peer label: [result per split]}``."""
    out = {}
    with_crf = crfsuite_available()
    for X_train, y_train, X_test, y_test, names in splits(
        name, data_dir, token_dicts
    ):
        results = run_peers(X_train, y_train, X_test, y_test, names, with_crf)
        for key, label in PEERS:
            if key in results:
                out.setdefault(label, []).append(results[key])
    return out


def run(name, params, data_dir, transitions=False, with_calibration=False,
        variance_scales=(), ess_iterations=None, with_variances=False,
        token_dicts=False):
    """Errors, fit times and iterations over the splits; with ``transitions``
    also the errors of the fitted and of no transitions (else empty), with
    ``with_calibration`` the :func:`calibration_figures` of every split, with
    ``variance_scales`` the errors of every :func:`frozen_refit`, and with
    ``ess_iterations`` the error of every :func:`ess_at_learned` (and, with
    ``with_calibration``, its calibration under :data:`ESS_KEY`), and with
    ``with_variances`` every split's :func:`variance_shifts` (else empty).
    ``token_dicts``: features from token dicts (:func:`splits`)."""
    errors, times, iterations, calibrations, shifts = [], [], [], [], []
    variants = (
        {"decoded with fitted transitions": [], "decoded with unaries only": []}
        if transitions else {}
    )
    for scale in variance_scales:
        variants[f"refit, prior variances x {scale:g} frozen"] = []
    if ess_iterations:
        variants[f"{ESS_KEY}, {ess_iterations} iterations"] = []
    for X_train, y_train, X_test, y_test, _ in splits(name, data_dir, token_dicts):
        model = GPStructClassifier(**{"random_state": 0, **params})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            start = time.perf_counter()
            model.fit(X_train, y_train)
            times.append(time.perf_counter() - start)
        errors.append(token_error(y_test, model.predict(X_test)))
        iterations.append(model.n_iter_)
        if with_variances:
            shifts.append(variance_shifts(model))
        if transitions:
            fitted = model.pairwise_mean_
            for key, pairwise in (
                ("decoded with fitted transitions", fitted),
                ("decoded with unaries only", np.zeros_like(fitted)),
            ):
                variants[key].append(
                    token_error(y_test, decode_with(model, X_test, pairwise))
                )
        for scale in variance_scales:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                refit = frozen_refit(model, scale, X_train, y_train)
            variants[f"refit, prior variances x {scale:g} frozen"].append(
                token_error(y_test, refit.predict(X_test))
            )
        figures = (
            {**calibration_figures(model, X_test, y_test),
             **transition_spread(model, y_train)}
            if with_calibration else {}
        )
        if ess_iterations:
            sampled = ess_at_learned(model, ess_iterations, X_train, y_train)
            variants[f"{ESS_KEY}, {ess_iterations} iterations"].append(
                token_error(y_test, sampled.predict(X_test))
            )
            if with_calibration:
                figures[ESS_KEY] = {
                    "predict_marginals": calibration(
                        y_test, sampled.predict_marginals(X_test), sampled.classes_
                    ),
                    "at the mean": calibration(
                        y_test, mean_potential_marginals(sampled, X_test),
                        sampled.classes_,
                    ),
                }
        if with_calibration:
            calibrations.append(figures)
    return errors, times, iterations, variants, calibrations, shifts


def variances_line(shifts):
    """Where the learned per-template prior variances ended, over all the
    splits' templates, against their start."""
    if any(s is None for s in shifts):
        return "prior variances: the kernel has no per-template variances"
    values = np.concatenate(shifts)
    return (
        f"prior variances over their start (log10), {values.size} templates: "
        f"median {np.median(values):+.2f}, range {values.min():+.2f} to "
        f"{values.max():+.2f}; below 1/100 of the start: "
        f"{np.mean(values < -2):.0%}"
    )


def calibration_line(calibrations):
    """The mean over the splits of :func:`calibration_figures`."""
    def mean(get):
        return np.mean([get(c) for c in calibrations])

    parts = [
        f"{key}: NLL {mean(lambda c, k=key: c[k]['nll']):.3f} "
        f"ECE {mean(lambda c, k=key: c[k]['ece']):.4f}"
        for key in ("predict_marginals", "with the transitions' spread",
                    "at the mean")
    ]
    if all(ESS_KEY in c for c in calibrations):
        parts += [
            f"{ESS_KEY}, {key}: NLL {mean(lambda c, k=key: c[ESS_KEY][k]['nll']):.3f} "
            f"ECE {mean(lambda c, k=key: c[ESS_KEY][k]['ece']):.4f}"
            for key in ("predict_marginals", "at the mean")
        ]
    return (
        f"marginals {'; '.join(parts)}; top-label confidence "
        f"{mean(lambda c: c['confidence']):.3f}, with the transitions' spread "
        f"{mean(lambda c: c[SPREAD_CONFIDENCE]):.3f}, "
        f"accuracy {mean(lambda c: c['accuracy']):.3f}; posterior sd of the "
        f"transitions: seen label pairs "
        f"{mean(lambda c: c['transition sd, seen pairs']):.2f}, unseen "
        f"{mean(lambda c: c['transition sd, unseen pairs']):.2f}"
    )


def _errors(values):
    """``mean % (split, split, ...)``."""
    return f"{np.mean(values):.2f} % ({', '.join(f'{e:.2f}' for e in values)})"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--datasets", nargs="+", choices=sorted(DEV_SPLITS),
        default=["basenp", "chunking", "JapaneseNE", "seg"],
    )
    parser.add_argument(
        "--setting", action="append", type=parse_setting, metavar="NAME=VALUE ...",
        help="estimator parameters of one setting (repeat the option to "
        "compare several; none: the defaults)",
    )
    parser.add_argument("--data", default=str(DEFAULT_DATA_DIR), metavar="DIR")
    parser.add_argument(
        "--transitions", action="store_true",
        help="also decode every fit with its fitted transitions and with none",
    )
    parser.add_argument(
        "--calibration", action="store_true",
        help="also print the calibration of predict_marginals, with the "
        "transitions' spread and at the mean potentials",
    )
    parser.add_argument(
        "--peers", action="store_true",
        help="also run the CRF (both c2 grids) and the per-token LR on the "
        "same splits, once per data set",
    )
    parser.add_argument(
        "--variance-scales", nargs="+", type=float, default=(), metavar="C",
        help="also refit every fit with its prior variances frozen at C times "
        "the learned ones (linear kernels)",
    )
    parser.add_argument(
        "--ess-at-learned", type=int, default=None, metavar="N",
        help="also sample every fit's exact posterior by ESS, N iterations, at "
        "the hyperparameters it learned (its error; with --calibration its "
        "NLL and ECE)",
    )
    parser.add_argument(
        "--variances", action="store_true",
        help="also print where the learned per-template prior variances end, "
        "against their start",
    )
    parser.add_argument(
        "--token-dicts", action="store_true",
        help="features from sklearn-crfsuite-style token dicts through "
        "SequenceDictVectorizer (columns grouped by key) instead of the "
        "CRF++ template",
    )
    args = parser.parse_args(argv)
    if args.ess_at_learned is not None and args.ess_at_learned < 1:
        parser.error(
            f"--ess-at-learned must be a positive integer, got {args.ess_at_learned}"
        )
    data_dir = check_data_dir(args.data)
    settings = args.setting or [{}]
    print(f"command: {command_line()}")
    for name in args.datasets:
        if args.peers:
            for peer, results in peer_results(
                name, data_dir, args.token_dicts
            ).items():
                print(
                    f"{name:10s} {peer}: error {_errors([r['error'] for r in results])}"
                    f", NLL {np.mean([r['calibration']['nll'] for r in results]):.3f}"
                    f" ECE {np.mean([r['calibration']['ece'] for r in results]):.4f}",
                    flush=True,
                )
        for params in settings:
            errors, times, iterations, variants, calibrations, shifts = run(
                name, params, data_dir, args.transitions, args.calibration,
                args.variance_scales, args.ess_at_learned, args.variances,
                args.token_dicts,
            )
            print(
                f"{name:10s} {params or 'defaults'}: error {_errors(errors)}, fit "
                f"{np.mean(times):.1f} s, iterations {iterations}",
                flush=True,
            )
            for key, values in variants.items():
                print(f"{'':10s}   {key}: error {_errors(values)}")
            if calibrations:
                print(f"{'':10s}   {calibration_line(calibrations)}", flush=True)
            if shifts:
                print(f"{'':10s}   {variances_line(shifts)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
