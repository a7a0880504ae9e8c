"""The benchmark helpers every published figure goes through.

The scripts under ``benchmarks/`` read the shared data sets and run for
minutes, so they are not run here; their arithmetic is: the calibration
figures (NLL and ECE) and the paired differences against the peers against
values worked out by hand, the summary of folds, the CRF peer's selection
over two c2 grids from one inner cross-validation, the dev splits' setting
parser and their mean-potential marginals against enumeration, and the
stacked-potentials benchmark on a synthetic chunk (its check of the
compiled loops against the sparse products, and its paired timing),
profile_fit's sum of a function's cumulative time, bench_block_cache's
pairing of fits with and without the cache (on a short fit of the shared
data), the hyperparameters bench_ess samples at (fixed, or those a
variational fit learns), run_suite's Table 1 rows for both ESS steps,
section 2's summary of every model that ran (with the suite's report of
it), the prediction times against the CRF's (table and ratios),
bench_prior_draws' two ways of drawing on a synthetic design and
bench_predict's row on synthetic data.
"""

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _benchmark_module(name):
    """Import ``benchmarks/<name>.py`` with the folder on the path while the
    fixture lives (the scripts import ``_common`` as a top-level module)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))


def _module_fixture(name):
    """A module-scoped fixture giving ``benchmarks/<name>.py``."""

    @pytest.fixture(scope="module")
    def module():
        yield from _benchmark_module(name)

    return module


common = _module_fixture("_common")
dev_splits = _module_fixture("dev_splits")
bench_ess = _module_fixture("bench_ess")
bench_stacked = _module_fixture("bench_stacked")
profile_fit = _module_fixture("profile_fit")
bench_block_cache = _module_fixture("bench_block_cache")
run_suite = _module_fixture("run_suite")
bench_table1 = _module_fixture("bench_table1")
bench_section2 = _module_fixture("bench_section2")
bench_prior_draws = _module_fixture("bench_prior_draws")
bench_predict = _module_fixture("bench_predict")
bench_saga_noise = _module_fixture("bench_saga_noise")
bench_long_sequence = _module_fixture("bench_long_sequence")
bench_hashed = _module_fixture("bench_hashed")
bench_chain = _module_fixture("bench_chain")


@pytest.mark.parametrize("log_space", [False, True])
@pytest.mark.parametrize("length", [1, 2, 5])
def test_bench_chain_numpy_baseline_is_the_same_recursion(bench_chain, length,
                                                          log_space):
    # The kernels' peer (BENCHMARK.md: plain NumPy of the same recursion):
    # its results against brute-force enumeration of the label sequences.
    from _chain_reference import enumerate_one

    rng = np.random.default_rng(length)
    S, n, V = 2, 3, 3
    unary = rng.standard_normal((S, n * length, V))
    pairwise = rng.standard_normal((S, V, V)) * (50.0 if log_space else 1.0)
    log_z, marginals, pair = bench_chain.numpy_forward_backward(
        unary, pairwise, length, log_space
    )
    for s in range(S):
        for k in range(n):
            rows = slice(k * length, (k + 1) * length)
            want = enumerate_one(unary[s, rows], pairwise[s])
            np.testing.assert_allclose(log_z[s, k], want[0], rtol=1e-10)
            np.testing.assert_allclose(marginals[s, rows], want[1], atol=1e-10)
            np.testing.assert_allclose(pair[s, k], want[2], atol=1e-10)
    labels, scores = bench_chain.numpy_viterbi(unary[0], pairwise[0], length)
    for k in range(n):
        want = enumerate_one(unary[0, k * length:(k + 1) * length], pairwise[0])
        np.testing.assert_array_equal(labels[k * length:(k + 1) * length], want[3])
        np.testing.assert_allclose(scores[k], want[4], rtol=1e-12)


def test_bench_ess_hyperparameters_fixed_or_learned(bench_ess):
    from skgpstruct import GPStructClassifier
    from skgpstruct.datasets import make_sequences
    from skgpstruct.kernels import LinearKernel

    X, y = make_sequences(10, random_state=1, n_classes=2)
    fixed = bench_ess.build_parser().parse_args(
        ["--kernel-variance", "2.5", "--pairwise-prior-variance", "0.3"]
    )
    kernel, pairwise, learned = bench_ess.hyperparameters(X, y, fixed)
    assert isinstance(kernel, LinearKernel) and learned is None
    assert kernel.variance == 2.5 and kernel.bias == 0.0 and pairwise == 0.3
    assert len(kernel.theta) == 0  # nothing left for anyone to learn

    args = bench_ess.build_parser().parse_args(
        ["--learned-hyperparameters", "--random-state", "4"]
    )
    kernel, pairwise, learned = bench_ess.hyperparameters(X, y, args)
    # The batch fit of the Table 1 column, with the run's seed.
    model = GPStructClassifier(random_state=4).fit(X, y)
    np.testing.assert_array_equal(kernel.theta, model.kernel_.theta)
    assert pairwise == model.pairwise_prior_variance_
    assert learned["n_iter"] == model.n_iter_
    assert learned["pairwise_prior_variance"] == model.pairwise_prior_variance_
    assert learned["kernel"] == repr(model.kernel_) and learned["fit_time"] > 0
    assert learned["converged"] is True  # this small fit converges


def test_run_suite_reports_both_ess_steps_against_the_paper_s_gp_ess(run_suite):
    def payload(errors):
        folds = [
            {"fold": k, "error": e, "fit_time": 1.0,
             "calibration": {"nll": 0.3, "ece": 0.02}}
            for k, e in enumerate(errors)
        ]
        return {"results": {"seg": folds}, "options": {"n_iter": 100}}

    steps = {s.name: s for s in run_suite.TABLE1_STEPS}
    assert {"ess", "ess-learned"} <= set(steps)
    results = {"ess": payload([10.0, 12.0]), "ess-learned": payload([9.0, 11.0])}
    report = run_suite.table1_section({"steps": {}}, results)
    rows = [line for line in report.splitlines() if line.startswith("| seg |")]
    error_rows = [r for r in rows if "GP-ESS" in r]
    assert len(error_rows) == 2
    assert steps["ess"].title in error_rows[0] and "11.00 (1.41)" in error_rows[0]
    assert steps["ess-learned"].title in error_rows[1]
    assert "10.00 (1.41)" in error_rows[1]
    # The variational steps that did not run are named as not run.
    assert "`table1-batch`: not run" in report


def test_run_suite_reports_the_fit_time_against_both_crf_grids(run_suite):
    def fold(k, gp_time, crf_time, wide_time):
        return {
            "fold": k,
            "gp": {"error": 5.0, "fit_time": gp_time, "n_iter": 10,
                   "converged": True, "calibration": {"nll": 0.3, "ece": 0.02}},
            "crf": {"error": 6.0, "total_time": crf_time},
            "crf_wide": {"error": 6.0, "total_time": wide_time},
            "logreg": {"error": 7.0},
            "gp_over_crf_time": gp_time / crf_time,
        }

    payload = {"results": {"seg": [fold(0, 2.0, 1.0, 4.0), fold(1, 3.0, 1.0, 2.0)]},
               "gp_options": {}}
    report = run_suite.table1_section({"steps": {}}, {"table1-batch": payload})
    header = next(line for line in report.splitlines()
                  if line.startswith("| data set | GP mode | folds | GP fit"))
    assert header.rstrip(" |").endswith("GP fit / CRF {1e-4..10} time")
    row = next(line for line in report.splitlines()
               if line.startswith("| seg |") and "2.50 s" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    # 2/1 and 3/1 against the protocol's CRF; 2/4 and 3/2 against the wide one.
    assert cells[-2] == f"2.5x ({np.std([2.0, 3.0], ddof=1):.1f})"
    assert cells[-1] == f"1.0x ({np.std([0.5, 1.5], ddof=1):.1f})"


def test_prediction_times_against_the_crf(common, run_suite):
    def fold(k, gp, crf):
        return {
            "fold": k,
            "gp": {"error": 5.0, "fit_time": 1.0, "n_iter": 10, "converged": True,
                   "calibration": {"nll": 0.3, "ece": 0.02},
                   "predict_time": gp[0], "marginals_time": gp[1]},
            "crf": {"error": 6.0, "total_time": 1.0,
                    "predict_time": crf[0], "marginals_time": crf[1]},
            "logreg": {"error": 7.0},
        }

    folds = [fold(0, (0.002, 0.060), (0.010, 0.030)),
             fold(1, (0.004, 0.090), (0.010, 0.030))]
    rows = common.prediction_rows({"seg": folds})
    # predict 2 and 4 ms against 10 (0.2x, 0.4x); marginals 60 and 90 ms
    # against 30 (2x, 3x): ratios per fold, then averaged.
    sd = np.std([0.2, 0.4], ddof=1)
    assert rows == [[
        "seg", f"3.0 ms ({np.std([2.0, 4.0], ddof=1):.1f})", "10.0 ms (0.0)",
        f"0.30x ({sd:.2f})", f"75.0 ms ({np.std([60.0, 90.0], ddof=1):.1f})",
        "30.0 ms (0.0)", f"2.50x ({np.std([2.0, 3.0], ddof=1):.2f})",
        "-", "-",
    ]]
    # The inputs' building costs, where measured (the folds' that have them).
    folds[0]["gp"]["transform_time"] = 0.050
    folds[1]["gp"]["transform_time"] = 0.070
    folds[1]["crf"]["items_time"] = 0.008
    with_inputs = common.prediction_rows({"seg": folds})
    assert with_inputs[0][-2:] == [
        f"60.0 ms ({np.std([50.0, 70.0], ddof=1):.1f})", "8.0 ms",
    ]
    assert with_inputs[0][:-2] == rows[0][:-2]
    for f in folds:
        f["gp"].pop("transform_time", None), f["crf"].pop("items_time", None)
    # Folds of earlier JSON (no times) are left out, and a data set with
    # none gives no row.
    old = fold(2, (0.0, 0.0), (0.0, 0.0))
    del old["gp"]["marginals_time"], old["crf"]["marginals_time"]
    assert common.prediction_rows({"seg": [*folds, old]}) == rows
    assert common.prediction_rows({"seg": [old]}) == []
    payload = {"results": {"seg": folds}, "gp_options": {}}
    report = run_suite.table1_section({"steps": {}}, {"table1-batch": payload})
    assert "### Prediction time on the test fold" in report
    row = next(line for line in report.splitlines()
               if line.startswith("| seg |") and "75.0 ms" in line)
    assert "| 0.30x" in row and "| 2.50x" in row


def test_section2_reports_every_model_that_ran(bench_section2, run_suite):
    def gp(error, fit_time, n_iter=10):
        return {"error": error, "fit_time": fit_time, "n_iter": n_iter,
                "calibration": {"nll": 0.2, "ece": 0.01}}

    def rep(r, gp_time, crf_time):
        return {
            "rep": r, "n_train_tokens": 100,
            "gp_batch": gp(4.0, gp_time),
            "gp_batch_pseudo": gp(5.0, 1.0),
            "gp_stochastic_pseudo": gp(6.0, 2.0, n_iter=7),
            "gp_ess": gp(4.5, 30.0),
            "crf_c2=1": {"error": 4.2, "fit_time": 0.5},
            "crf_cv": {"error": 4.1, "total_time": crf_time,
                       "calibration": {"nll": 0.3, "ece": 0.03}},
            "logreg": {"error": 4.6, "total_time": 2.0,
                       "calibration": {"nll": 0.25, "ece": 0.02}},
        }

    reps = [rep(0, 2.0, 1.0), rep(1, 6.0, 2.0)]
    names = [m[1] for m in bench_section2.models(reps, [50])]
    # In report order; the stochastic curve and the c2 = 0.1 CRF did not run.
    assert names == ["GP L-BFGS", "GP L-BFGS pseudo", "GP SAGA pseudo 50 ep",
                     "GP ESS", "CRF c2=1", "CRF c2 by CV", "LR, C by CV"]
    summary = bench_section2.summary_table(reps, [50])
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in summary.splitlines()[2:]}
    # The batch fit against the CRF's selection + refit: 2/1 and 6/2.
    assert rows["GP L-BFGS"][1:4] == ["4.00 (0.00)", "4.00 s (2.83)", "2.5x (0.7)"]
    assert rows["GP ESS"][3] == f"22.5x ({np.std([30.0, 15.0], ddof=1):.1f})"
    assert rows["LR, C by CV"][1:] == ["4.60 (0.00)", "2.00 s (0.00)", "-",
                                       "0.250 (0.000)", "0.0200 (0.0000)"]
    assert rows["CRF c2=1"][4:] == ["-", "-"]  # no marginals recorded
    # A stochastic summary without calibration (JSON of an earlier script)
    # takes the longest budget's.
    reps[0]["gp_stochastic"] = reps[1]["gp_stochastic"] = {
        "error": 4.2, "fit_time": 3.0, "nested": True,
        "curve": [{"epochs": 5, "error": 4.5, "fit_time": 1.0,
                   "calibration": {"nll": 0.9, "ece": 0.9}},
                  {"epochs": 50, "error": 4.2, "fit_time": 3.0,
                   "calibration": {"nll": 0.15, "ece": 0.005}}]}
    row = next(line for line in bench_section2.summary_table(reps, [50]).splitlines()
               if line.startswith("| GP SAGA 50 ep |"))
    assert row.rstrip(" |").endswith("0.150 (0.000) | 0.0050 (0.0000)")
    _, time_cols = bench_section2.columns(reps, [50])
    assert "GP SAGA pseudo epochs" in [c[0] for c in time_cols]
    # The suite's report carries the same table.
    report = run_suite.section2_section(
        {"steps": {}}, {"section2": {"results": reps, "n_train": 500,
                                     "stochastic_epochs": [50]}})
    assert bench_section2.summary_table(reps, [50]) in report


def test_bench_prior_draws_times_both_ways(bench_prior_draws):
    # 300 tokens of 40 shared binary features: a 41-column feature map, which
    # the sampler takes (41 * 600 <= 300^2).
    rng = np.random.default_rng(0)
    X = (rng.random((300, 40)) < 0.2).astype(float)
    X[:, 0] = 1.0
    row = bench_prior_draws.measure("synthetic", sp.csr_matrix(X), 3, block=4,
                                    rounds=2, min_time=0.01)
    assert (row["N"], row["D"], row["labels"]) == (300, 41, 3)
    assert row["the sampler draws through"] == "feature map"
    for column in bench_prior_draws.COLUMNS[4:9]:
        assert np.isfinite(row[column]) and row[column] > 0
    # The units follow from the times: N^2 V / 2 multiply-adds, D V deviates.
    assert row["ps per multiply-add (factor)"] == pytest.approx(
        1e9 * row["factor ms / draw"] / (300**2 * 3 / 2))
    assert row["ns per deviate (feature map)"] == pytest.approx(
        1e6 * row["feature map ms / draw"] / (41 * 3))


def test_calibration_by_hand(common):
    # Four tokens, labels a / b. Top-label confidences 0.9, 0.6, 0.7, 0.55
    # fall in bins 9, 6, 7, 5, one token each: ECE = mean |correct - conf|.
    y = [["a", "b"], ["a", "a"]]
    marginals = [
        np.array([[0.9, 0.1], [0.4, 0.6]]),
        np.array([[0.3, 0.7], [0.55, 0.45]]),
    ]
    result = common.calibration(y, marginals, ["a", "b"])
    p_true = np.array([0.9, 0.6, 0.3, 0.55])
    np.testing.assert_allclose(result["nll"], -np.mean(np.log(p_true)))
    correct = np.array([1, 1, 0, 1])
    confidence = np.array([0.9, 0.6, 0.7, 0.55])
    np.testing.assert_allclose(result["ece"], np.mean(np.abs(correct - confidence)))


def test_calibration_pools_tokens_in_one_bin(common):
    # Two tokens in the same bin: |mean correct - mean confidence| there,
    # not the mean of the two gaps.
    y = [["a", "a"]]
    marginals = [np.array([[0.82, 0.18], [0.12, 0.88]])]
    result = common.calibration(y, marginals, ["a", "b"])
    np.testing.assert_allclose(result["ece"], abs(0.5 - (0.82 + 0.88) / 2))
    # A label the model does not know has probability 0 (clipped in the log).
    unseen = common.calibration([["c"]], [np.array([[0.5, 0.5]])], ["a", "b"])
    np.testing.assert_allclose(unseen["nll"], -np.log(1e-12))


def test_calibration_of_non_finite_marginals_is_failed(common):
    # A NaN row fell in no bin: its weight was lost and the ECE came out
    # lower, averaged as a valid value.
    marginals = [np.array([[0.9, 0.1], [np.nan, np.nan]])]
    result = common.calibration([["a", "b"]], marginals, ["a", "b"])
    assert np.isnan(result["nll"]) and np.isnan(result["ece"])


def _failed_fold(k):
    return {
        "fold": k,
        "gp": {"error": float("nan"), "fit_time": float("nan"),
               "failure": "LinAlgError: boom"},
        "crf": {"error": 6.0, "total_time": 1.0, "predict_time": 0.01,
                "marginals_time": 0.02, "calibration": {"nll": 0.4, "ece": 0.05}},
        "logreg": {"error": 7.0},
    }


def _good_fold(k):
    return {
        "fold": k,
        "gp": {"error": 5.0, "fit_time": 2.0, "n_iter": 10, "converged": False,
               "predict_time": 0.02, "marginals_time": 0.04,
               "calibration": {"nll": 0.3, "ece": 0.02}},
        "crf": {"error": 6.0, "total_time": 1.0, "predict_time": 0.01,
                "marginals_time": 0.02, "calibration": {"nll": 0.4, "ece": 0.05}},
        "logreg": {"error": 7.0},
    }


def test_failed_gp_folds_are_marked_in_every_table(common, run_suite, capsys):
    # Calibration, prediction times, iterations and convergence averaged
    # the GP over the folds that survived, with no note of the others.
    results = {"seg": [_good_fold(0), _failed_fold(1), _good_fold(2)]}
    (gp_row, crf_row) = common.calibration_rows(results, [("GP", "gp"), ("CRF", "crf")])
    assert gp_row[2:] == ["0.300 (0.000) [1 failed]", "0.0200 (0.0000) [1 failed]"]
    assert crf_row[2:] == ["0.400 (0.000)", "0.0500 (0.0000)"]
    (row,) = common.prediction_rows(results)
    assert all(cell.endswith("[1 failed]") for cell in row[1:2] + row[3:5] + row[6:7])
    report = run_suite.table1_section(
        {"steps": {}}, {"table1-batch": {"results": results, "gp_options": {}}}
    )
    assert "| 0/3 [1 failed] |" in report
    assert common.failure_status(results) == 1
    assert "1 fit(s) failed (first: LinAlgError: boom)" in capsys.readouterr().err
    assert common.failure_status({"seg": [_good_fold(0)]}) == 0


def test_table1_is_seeded_and_refuses_repeated_folds(bench_table1):
    parser = bench_table1.build_parser()
    assert bench_table1.gp_params(parser.parse_args([]))["random_state"] == 0
    with pytest.raises(SystemExit, match=r"--folds repeats a fold: \[0, 0\]"):
        bench_table1.main(["--folds", "0", "0", "--data", str(BENCHMARKS)])


def test_report_says_where_the_steps_environments_differ(run_suite):
    envs = {"table1-batch": {"commit": "aaa", "python": "3.11"},
            "ess": {"commit": "bbb", "python": "3.11"}}
    lines = run_suite._environment_lines(envs)
    assert "Environment (table1-batch): commit aaa, python 3.11." in lines
    assert "Environment of ess, where it differs: commit bbb." in lines
    same = {"a": {"commit": "aaa"}, "b": {"commit": "aaa"}}
    assert run_suite._environment_lines(same) == ["", "Environment: commit aaa."]


def test_token_error_and_fold_summary(common):
    assert common.token_error([["a", "b"], ["c"]], [["a", "c"], ["c"]]) == (
        pytest.approx(100 / 3)
    )
    assert common.format_mean_std([1.0, 3.0]) == f"2.00 ({np.sqrt(2):.2f})"
    assert common.format_mean_std([1.0, np.nan]) == "1.00 [1 failed]"
    assert common.format_mean_std([np.nan]) == "failed"


def test_table1_hyperprior_option(bench_table1):
    parser = bench_table1.build_parser()

    def params(*argv):
        return bench_table1.gp_params(parser.parse_args(list(argv)))

    assert "hyperprior_scale" not in params()  # the estimator's default
    assert params("--hyperprior-scale", "none")["hyperprior_scale"] is None
    assert params("--hyperprior-scale", "None")["hyperprior_scale"] is None
    assert params("--hyperprior-scale", "1.5")["hyperprior_scale"] == 1.5
    with pytest.raises(SystemExit):
        parser.parse_args(["--hyperprior-scale", "wide"])


@pytest.mark.shared_data
def test_dev_pools_share_no_sentence_with_a_benchmark(dev_splits, shared_data_dir):
    # Defaults are chosen on the dev splits: none of their sentences may be
    # one a benchmark trains or tests on. basenp's test.data is section 2's
    # whole pool, and chunking's test.data holds the same sentences.
    from skgpstruct.io import read_conll

    def sentences(name, file_name, start=0, stop=None):
        tokens, _ = read_conll(
            shared_data_dir / "crfpp" / name / file_name,
            encoding=dev_splits.DATASETS[name].encoding,
        )
        return {tuple(row[0] for row in seq) for seq in tokens[start:stop]}

    benchmark = set()
    for name, dataset in dev_splits.DATASETS.items():
        benchmark |= sentences(name, dataset.pool_file, 0, dataset.n_data)
    benchmark |= sentences("basenp", "test.data")  # section 2
    for name in dev_splits.DEV_SPLITS:
        tokens, labels, _ = dev_splits.dev_pool(shared_data_dir, name)
        dev = {tuple(row[0] for row in seq) for seq in tokens}
        assert len(tokens) >= 19 and len(tokens) == len(labels)
        assert not dev & benchmark, name


def test_dev_setting_parser(dev_splits):
    assert dev_splits.parse_setting("a=1 b=0.5,c=x") == {"a": 1, "b": 0.5, "c": "x"}
    assert dev_splits.parse_setting("a=None b=True c=False") == {
        "a": None, "b": True, "c": False
    }
    with pytest.raises(Exception, match="name=value"):
        dev_splits.parse_setting("a=1 b")


def test_mean_potential_marginals_match_enumeration(dev_splits):
    # On a two-token chain, the forward-backward marginals at the posterior
    # mean potentials, against brute force over the four labellings.
    from skgpstruct import GPStructClassifier
    from skgpstruct.datasets import make_sequences

    X, y = make_sequences(12, random_state=0, n_classes=2)
    model = GPStructClassifier(kernel="linear", max_iter=5, random_state=0)
    with pytest.warns(ConvergenceWarning):
        model.fit(X, y)
    x = [X[0][:2]]
    marginals = dev_splits.mean_potential_marginals(model, x)[0]
    # The kernel "linear" acts on the dense features centred on the training
    # mean.
    unary = model._mean_potentials(np.asarray(x[0]) - model.feature_mean_)
    pairwise = model.pairwise_mean_
    scores = np.array([
        [unary[0, a] + unary[1, b] + pairwise[a, b] for b in range(2)]
        for a in range(2)
    ])
    joint = np.exp(scores - scores.max())
    joint /= joint.sum()
    np.testing.assert_allclose(marginals[0], joint.sum(axis=1), rtol=1e-10)
    np.testing.assert_allclose(marginals[1], joint.sum(axis=0), rtol=1e-10)


def test_paired_difference_by_hand(common):
    # Differences -1, +0.5, -2: mean -0.833..., std (ddof=1) 1.2583...,
    # standard error std / sqrt(3) = 0.7265; the first is lower on 2 folds.
    text, lower = common.paired_difference([3.0, 4.5, 1.0], [4.0, 4.0, 3.0])
    assert text == "-0.83 (0.73)"
    assert lower == "2 of 3"
    # A failed fold (NaN) is skipped, not counted as a loss or a win.
    assert common.paired_difference([np.nan, 2.0], [1.0, 1.0]) == ("+1.00", "0 of 1")
    assert common.paired_difference([np.nan], [1.0]) == ("-", "-")


def test_difference_rows_cover_every_peer_that_ran(common):
    folds = [
        {"gp": {"error": 5.0}, "crf": {"error": 6.0}, "logreg": {"error": 5.0}},
        {"gp": {"failure": "boom"}, "crf": {"error": 1.0}, "logreg": {"error": 9.0}},
        {"gp": {"error": 3.0}, "crf": {"error": 2.0}, "logreg": {"error": 4.0}},
    ]
    rows = common.difference_rows({"toy": folds}, lambda f: f["gp"].get("error"))
    # crf_wide did not run on these folds: no row for it.
    assert rows == [
        ["toy", "CRF", "+0.00 (1.00)", "1 of 2"],
        ["toy", "LR", "-0.50 (0.50)", "1 of 2"],
    ]


def test_bench_predict_row(bench_predict, monkeypatch):
    # One data set's row on synthetic data: every column, the GP's
    # marginals bit-identical at n_jobs 1 and 2 (several chunks), the
    # ratios those of the timed calls.
    pytest.importorskip("sklearn_crfsuite")
    import skgpstruct._estimator as estimator_module
    from skgpstruct.datasets import make_sequences

    monkeypatch.setattr(estimator_module, "CHUNK_TOKENS", 50)
    X, y = make_sequences(n_sequences=24, n_features=6, sparse=True, random_state=0)
    names = np.array([f"f{j}" for j in range(X[0].shape[1])])
    data = (X[:12], y[:12], X[12:], y[12:], names)
    row = bench_predict.measure("synthetic", data, rounds=2, min_time=0.01)
    assert list(row) == bench_predict.COLUMNS + bench_predict.ONE_COLUMNS
    assert row["identical"] == "yes"
    assert row["test tokens"] == sum(len(s) for s in y[12:])
    for column in bench_predict.COLUMNS[2:-1] + bench_predict.ONE_COLUMNS[1:]:
        assert np.isfinite(row[column]) and row[column] > 0
    # one sentence per call: the first ONE_AT_A_TIME test sequences (all 12)
    assert row["sentences"] == 12
    assert row["mean tokens"] == np.mean([x.shape[0] for x in X[12:]])


def test_bench_hashed_rows(bench_hashed):
    # Word / part-of-speech sentences: both designs' rows, the hashed one
    # 2**20 columns wide with a model over its active columns only, and
    # the ratios those of the measured runs (one round).
    rng = np.random.default_rng(0)
    words = np.array(["the", "Cat", "sat", "on", "a", "mat", "1999", "DOGS"])
    tags = np.array(["DT", "NN", "VBD", "IN", "NNS"])
    sentences, labels = [], []
    for _ in range(16):
        n = int(rng.integers(2, 7))
        sentences.append([[str(w), str(t)] for w, t in zip(
            rng.choice(words, n), rng.choice(tags, n), strict=True)])
        labels.append([["B", "I", "O"][len(w) % 3] for w, _ in sentences[-1]])
    dicts = bench_hashed.token_dicts(sentences)
    assert dicts[0][0]["BOS"] is True and "-1:c1" not in dicts[0][0]
    assert dicts[0][0]["c1"] == sentences[0][0][1]
    data = (dicts[:10], labels[:10], dicts[10:], labels[10:])
    rows, ratio = bench_hashed.measure("synthetic", data, rounds=1, min_time=0.01)
    vocabulary, hashed = rows
    assert set(vocabulary) == set(hashed) == set(bench_hashed.COLUMNS)
    assert hashed["columns"] == bench_hashed.HASHED_COLUMNS
    assert hashed["model columns"] <= vocabulary["columns"] < 100
    assert vocabulary["model columns"] <= vocabulary["columns"]
    assert ratio["pickle"] == hashed["pickle MB"] / vocabulary["pickle MB"]
    assert ratio["fit"] == hashed["fit s"] / vocabulary["fit s"]


def test_crfsuite_from_prebuilt_items_matches_its_own_api(common):
    # The prediction timings call crfsuite's tagger on prebuilt item
    # sequences; what they compute must be CRF.predict's labels and
    # CRF.predict_marginals' probabilities (per-token dicts there).
    pytest.importorskip("sklearn_crfsuite")
    from skgpstruct.datasets import make_sequences

    X, y = make_sequences(n_sequences=12, n_features=8, n_classes=3, sparse=True,
                          random_state=1)
    names = np.array([f"f{j}" for j in range(X[0].shape[1])])
    C = common.to_crfsuite(X, names)
    crf = common._fit_crf(C[:8], y[:8], 0.1)
    items = common.crf_items(C[8:])
    assert [list(s) for s in common.crf_predict(crf, items)] == [
        list(s) for s in crf.predict(C[8:])
    ]
    marginals, classes = common.crf_marginals(crf, items)
    assert classes == sorted(crf.classes_)
    expected = crf.predict_marginals(C[8:])
    assert len(marginals) == len(expected) == 4
    for array, dicts, x in zip(marginals, expected, X[8:], strict=True):
        assert array.shape == (x.shape[0], len(classes))
        np.testing.assert_allclose(
            array, [[token[c] for c in classes] for token in dicts], rtol=0, atol=0
        )
        np.testing.assert_allclose(array.sum(axis=1), 1.0, rtol=1e-12)


def test_crfsuite_grids_share_the_inner_cv(common):
    # Against sklearn-crfsuite called directly: every c2 scored by 3-fold
    # contiguous inner CV (token accuracy), each grid picking its best value
    # (the first of a tie) and refitting on the whole training part.
    sklearn_crfsuite = pytest.importorskip("sklearn_crfsuite")
    from sklearn.model_selection import KFold

    from skgpstruct.datasets import make_sequences

    X, y = make_sequences(n_sequences=18, n_features=12, sparse=True, random_state=0)
    names = np.array([f"f{j}" for j in range(X[0].shape[1])])
    C = common.to_crfsuite(X, names)
    y = [[str(v) for v in s] for s in y]
    train, test = slice(0, 12), slice(12, None)

    def fit(X_, y_, c2):
        crf = sklearn_crfsuite.CRF(
            algorithm="lbfgs", c1=0.0, c2=c2, all_possible_transitions=True
        )
        return crf.fit(X_, y_)

    def accuracy(truth, predicted):
        return np.mean(np.concatenate(truth) == np.concatenate(predicted))

    grids = {"narrow": (0.1, 10.0), "wide": (1e-3, 0.1, 10.0)}
    cv = {}
    for c2 in grids["wide"]:
        scores = []
        for tr, va in KFold(n_splits=3).split(np.arange(12)):
            model = fit([C[i] for i in tr], [y[i] for i in tr], c2)
            predicted = model.predict([C[i] for i in va])
            scores.append(accuracy([y[i] for i in va], predicted))
        cv[c2] = np.mean(scores)
    out = common.run_crfsuite_grids(C[train], y[train], C[test], y[test], grids)
    for name, grid in grids.items():
        best = max(grid, key=lambda c: cv[c])
        assert out[name]["c2"] == best
        for c2 in grid:
            assert out[name]["cv_accuracy"][str(c2)] == pytest.approx(cv[c2], abs=1e-12)
        refit = fit(C[train], y[train], best)
        error = 100.0 * (1.0 - accuracy(y[test], refit.predict(C[test])))
        assert out[name]["error"] == pytest.approx(error, abs=1e-12)


def _short_fit(random_state):
    """A 15-iteration fit on small synthetic data: X, y, the model and a copy
    of the prior variances it learned."""
    from skgpstruct import GPStructClassifier
    from skgpstruct.datasets import make_sequences

    X, y = make_sequences(10, random_state=1, n_classes=2, sparse=True)
    # Of each feature's two sign columns, the one active at fewer tokens:
    # indicators none of which is active at most tokens, which the fit uses
    # as given, like the CRF++ features of the dev splits.
    stacked = sp.vstack(X).tocsc()
    keep = np.flatnonzero(np.diff(stacked.indptr) <= stacked.shape[0] / 2)
    X = [x[:, keep] for x in X]
    model = GPStructClassifier(max_iter=15, random_state=random_state)
    with pytest.warns(ConvergenceWarning):
        model.fit(X, y)
    return X, y, model, np.asarray(model.kernel_.variance).copy()


def test_frozen_refit_rescales_the_learned_variances(dev_splits):
    X, y, model, learned = _short_fit(0)
    with pytest.warns(ConvergenceWarning):
        refit = dev_splits.frozen_refit(model, 4.0, X, y)
    # Frozen: the refit keeps 4 x the learned variance and the learned
    # pairwise prior; the original model's kernel is left alone.
    np.testing.assert_allclose(refit.kernel_.variance, 4.0 * learned)
    np.testing.assert_allclose(model.kernel_.variance, learned)
    assert refit.kernel_.bias == model.kernel_.bias
    assert refit.pairwise_prior_variance_ == model.pairwise_prior_variance_
    assert refit.get_params()["learn_hyperparameters"] is False


def test_variance_shifts_are_against_the_initial_variances(dev_splits):
    X, y, shared, _ = _short_fit(0)
    assert dev_splits.variance_shifts(shared) is None  # one variance
    n_features = X[0].shape[1]
    grouped = clone(shared).set_params(feature_groups=np.arange(n_features) % 3)
    with pytest.warns(ConvergenceWarning):
        grouped.fit(X, y)
    learned = np.asarray(grouped.kernel_.variance)
    shifts = dev_splits.variance_shifts(grouped)
    # "linear" starts every group at 1 / (1 + the mean squared norm of a
    # training token; sparse features are used as given).
    rows = sp.vstack(X).tocsr()
    mean_sq = np.asarray(rows.multiply(rows).sum(axis=1)).mean()
    assert shifts.shape == (3,)
    np.testing.assert_allclose(shifts, np.log10(learned * (1.0 + mean_sq)))
    line = dev_splits.variances_line([shifts, shifts])
    assert "6 templates" in line
    assert f"median {np.median(shifts):+.2f}" in line
    assert "no per-template" in dev_splits.variances_line([shifts, None])


def test_ess_at_learned_samples_at_the_learned_hyperparameters(dev_splits):
    from skgpstruct import GPStructClassifier

    X, y, model, learned = _short_fit(3)
    sampled = dev_splits.ess_at_learned(model, 40, X, y)
    assert sampled.get_params()["inference"] == "ess"
    assert sampled.get_params()["learn_hyperparameters"] is False
    assert sampled.n_iter_ == 40
    np.testing.assert_array_equal(sampled.kernel_.variance, learned)
    assert sampled.kernel_.bias == model.kernel_.bias
    assert sampled.kernel_ is not model.kernel_
    assert sampled.pairwise_prior_variance_ == model.pairwise_prior_variance_
    # The same chain as an ESS fit set up by hand with the model's seed.
    by_hand = GPStructClassifier(
        inference="ess", ess_n_iter=40, kernel=model.kernel_,
        pairwise_prior_variance=model.pairwise_prior_variance_, random_state=3,
        learn_hyperparameters=False,
    ).fit(X, y)
    pairs = zip(
        sampled.predict_marginals(X), by_hand.predict_marginals(X), strict=True
    )
    for a, b in pairs:
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(model.kernel_.variance, learned)


def test_calibration_line_adds_the_ess_figures_when_every_split_has_them(dev_splits):
    def split(nll, ess=None):
        figures = {
            key: {"nll": nll, "ece": nll / 10}
            for key in ("predict_marginals", "with the transitions' spread",
                        "at the mean")
        }
        figures.update({
            "confidence": 0.9, dev_splits.SPREAD_CONFIDENCE: 0.9, "accuracy": 0.9,
            "transition sd, seen pairs": 1.0, "transition sd, unseen pairs": 2.0,
        })
        if ess is not None:
            figures[dev_splits.ESS_KEY] = {
                "predict_marginals": {"nll": ess, "ece": 0.01},
                "at the mean": {"nll": ess + 0.1, "ece": 0.02},
            }
        return figures

    line = dev_splits.calibration_line([split(0.2, 0.3), split(0.4, 0.5)])
    assert "predict_marginals: NLL 0.300 ECE 0.0300" in line
    assert (
        f"{dev_splits.ESS_KEY}, predict_marginals: NLL 0.400 ECE 0.0100" in line
    )
    assert f"{dev_splits.ESS_KEY}, at the mean: NLL 0.500 ECE 0.0200" in line
    # A split without them (the option off): no ESS figures at all.
    assert dev_splits.ESS_KEY not in dev_splits.calibration_line(
        [split(0.2, 0.3), split(0.4)]
    )


def test_dev_splits_from_token_dicts(dev_splits, shared_data_dir):
    # The same splits (sequences and labels) as with the template, features
    # from token dicts grouped by key, the vocabulary of the training part.
    template = list(dev_splits.splits("seg", shared_data_dir))
    dicts = list(dev_splits.splits("seg", shared_data_dir, token_dicts=True))
    assert len(dicts) == len(template) == dev_splits.N_SPLITS
    for (X, y, X_test, y_test, names), (_, y_t, _, y_test_t, _) in zip(
        dicts, template, strict=True
    ):
        for a, b in zip(y + y_test, y_t + y_test_t, strict=True):
            np.testing.assert_array_equal(a, b)
        assert X.feature_groups is not None and len(X) == len(y)
        assert X[0].shape[1] == X_test[0].shape[1] == len(names)
        assert "word.lower()" in {str(n).split("=")[0] for n in names}


def test_dev_splits_refuses_a_chain_of_no_iterations(dev_splits, capsys):
    with pytest.raises(SystemExit):
        dev_splits.main(["--ess-at-learned", "0"])
    err = capsys.readouterr().err
    assert "--ess-at-learned must be a positive integer, got 0" in err


def test_marginals_with_pairwise_spread(dev_splits):
    # Against enumeration at the posterior mean potentials (no unary spread):
    # the helper averages over transition draws and differs from it, unless
    # the transitions have no spread; the model is left as it was.
    from _chain_reference import enumerate_one

    from skgpstruct import GPStructClassifier
    from skgpstruct.datasets import make_sequences

    X, y = make_sequences(12, random_state=2, n_classes=3)
    model = GPStructClassifier(max_iter=10, random_state=0)
    with pytest.warns(ConvergenceWarning):
        model.fit(X, y)
    model.q_sqrt_ = np.zeros_like(model.q_sqrt_)
    x = [np.zeros((4, X[0].shape[1]))]  # the transitions decide these
    unary, _ = dev_splits._mean_unaries(model, x)
    at_mean = enumerate_one(unary, model.pairwise_mean_)[1]
    spread = dev_splits.marginals_with_pairwise_spread(model, x)[0]
    assert np.abs(spread - at_mean).max() > 1e-3
    assert model.get_params()["pairwise_uncertainty"] is False
    np.testing.assert_allclose(model.predict_marginals(x)[0], at_mean, atol=1e-4)
    model.pairwise_std_ = np.zeros_like(model.pairwise_std_)
    np.testing.assert_allclose(
        dev_splits.marginals_with_pairwise_spread(model, x)[0], at_mean, atol=1e-4
    )


def test_transition_spread_splits_seen_and_unseen_pairs(dev_splits):
    class Fitted:
        classes_ = np.array(["a", "b", "c"])
        pairwise_std_ = np.arange(9.0).reshape(3, 3)

    # Seen pairs: a->b, b->b, b->c (entries 1, 4, 5); the other six unseen.
    y = [["a", "b", "b"], ["b", "c"], ["c"]]
    spread = dev_splits.transition_spread(Fitted(), y)
    assert spread["transition sd, seen pairs"] == pytest.approx((1 + 4 + 5) / 3)
    unseen = (0 + 2 + 3 + 6 + 7 + 8) / 6
    assert spread["transition sd, unseen pairs"] == pytest.approx(unseen)


def test_bench_stacked_on_a_synthetic_chunk(bench_stacked, capsys):
    rng = np.random.default_rng(0)
    name, X, offsets, n_labels = bench_stacked.synthetic_chunk(
        rng, n_tokens=300, n_features=500, n_labels=4
    )
    assert X.shape == (offsets[-1], 500) and np.all(X.data == 1.0)
    # measure() asserts that the three implementations agree before timing.
    row = bench_stacked.measure(name, X, offsets, n_labels, 3, 1e-3, rng)
    assert row[:3] == ("synthetic", offsets[-1], 4)
    assert row[3] == X.nnz + offsets[-1]  # every feature entry and the bias
    assert 0 < row[4] < row[3]
    assert all(value > 0 for value in row[5:])
    table = bench_stacked.markdown([row])
    assert table.count("\n") == 2 and "| synthetic | " in table
    # The paired timing runs the calls in turn and pairs their runs.
    calls = []
    calls_of = [lambda name=name: calls.append(name) for name in "abc"]
    bench_stacked.paired_timings(calls_of, 0.0, rounds=3)
    assert calls == ["a", "b", "c"] * 4


def test_profile_fit_merges_repeated_settings(profile_fit):
    # --setting may be repeated; every one counts (it once kept the last).
    parse = profile_fit.parse_setting
    settings = [
        parse("optimizer=stochastic batch_size=2"), parse("tol=1e-3 batch_size=4")
    ]
    assert profile_fit.estimator_settings(settings) == {
        "random_state": 0, "optimizer": "stochastic", "batch_size": 4, "tol": 1e-3,
    }
    assert profile_fit.estimator_settings([]) == {"random_state": 0}


def test_profile_fit_sums_a_function_s_cumulative_time(profile_fit):
    import cProfile
    import pstats
    import time


    def inner():
        time.sleep(0.02)

    def outer():
        inner()
        inner()

    profile = cProfile.Profile()
    profile.runcall(outer)
    stats = pstats.Stats(profile)
    inner_seconds = profile_fit.cumulative_seconds(stats, "inner")
    assert 0.035 < inner_seconds <= profile_fit.cumulative_seconds(stats, "outer")
    assert profile_fit.cumulative_seconds(stats, "no_such_function") == 0
    # Two sequences over 5 features: 0 everywhere, 1 and 2 at one token each
    # (the same token), 3 at one token, 4 at none: 3 lone features on two
    # tokens, so 1 + 2 + 1 inducing variables instead of 6.
    X = [
        sp.csr_matrix([[1.0, 1.0, 1.0, 0, 0], [1.0, 0, 0, 0, 0]]),
        sp.csr_matrix([[1.0, 0, 0, 1.0, 0]]),
    ]
    assert profile_fit.lone_feature_line(X) == (
        "5 features, 3 (60 %) active at one training token; inducing "
        "variables 6, 4 with the lone features collapsed"
    )


@pytest.mark.shared_data
def test_bench_saga_noise_pairs_the_same_fits(bench_saga_noise, shared_data_dir):
    # Three epochs on seg's fold 0: measure() checks that keeping the base
    # samples and drawing them again give the same model.
    protocol = {**bench_saga_noise.PROTOCOL, "max_iter": 3}
    result = bench_saga_noise.measure("seg", shared_data_dir, "crf", 1, protocol)
    assert result["epochs"] == 3 and result["ratio"] > 0
    store = result["store_bytes"]
    assert store["kept"] > store["drawn again"] > 0


def test_bench_block_cache_pairs_fits_with_and_without_the_cache(
    bench_block_cache, shared_data_dir
):
    # Two short fits in fresh processes; measure() checks that both give the
    # same model and that the one without the cache reused no block.
    row = bench_block_cache.measure(
        "chunking", shared_data_dir, ["--setting", "max_iter=2"], rounds=1
    )
    assert row[:3] == ("chunking", 1178, 2)
    assert all(value > 0 for value in row[3:6] + row[7:8] + row[10:])
    with_cache = bench_block_cache.run_child(
        "chunking", shared_data_dir, ["--setting", "max_iter=2"], True, n_fits=2
    )
    assert with_cache["reused_blocks"] > 0 and with_cache["n_iter"] == 2
    table = bench_block_cache.markdown([row])
    assert table.count("\n") == 2 and "| chunking | 1178 | 2 |" in table


def test_write_json_makes_the_folder_of_a_documented_out_path(common, tmp_path):
    # The documented --out paths name benchmarks/results/, which a fresh
    # checkout lacks: a finished benchmark then died on its last line.
    path = tmp_path / "benchmarks" / "results" / "table1.json"
    common.write_json(path, {"error": np.float64(0.25), "folds": [1, 2]})
    assert json.loads(path.read_text(encoding="utf-8")) == {
        "error": 0.25, "folds": [1, 2]
    }


def test_bench_long_sequence_measures_both_gp_ways(bench_long_sequence, monkeypatch):
    # In-process on a small sequence: the script's "at once" raises the
    # estimator's budget, restored here by monkeypatch; both ways give
    # marginals that sum to one (checked inside) and a time and a memory.
    import skgpstruct._estimator as estimator_module

    monkeypatch.setattr(
        estimator_module, "PREDICT_SAMPLE_BYTES", estimator_module.PREDICT_SAMPLE_BYTES
    )
    X, y, long_x = bench_long_sequence._data(300, 4)
    assert long_x.shape[0] == 300 and len(X) == bench_long_sequence.N_TRAIN
    assert {v for seq in y for v in seq} == {0, 1, 2, 3}
    for model in ("gp-blocks", "gp-at-once"):
        result = bench_long_sequence.measure(
            {"tokens": 300, "labels": 4, "model": model}
        )
        assert result["seconds"] > 0 and result["peak_increment_mib"] >= 0
    assert estimator_module.PREDICT_SAMPLE_BYTES == float("inf")
    assert bench_long_sequence._cell(None) == "not run"
    assert bench_long_sequence._cell(
        {"seconds": 1.234, "peak_increment_mib": 56.7}
    ) == "1.23 / 57"


def test_calibration_against_hand_counts(common):
    # Four tokens, labels a / b, counted by hand. Top labels: a at 0.58
    # (right) and a at 0.62 (wrong) fall in bins 5 and 6; b at 0.95 (right)
    # and a at 0.91 with a true label the model does not know (wrong) in bin
    # 9. ECE = 1/4 |1 - 0.58| + 1/4 |0 - 0.62| + 2/4 |1/2 - 0.93| = 0.475.
    marginals = [np.array([[0.58, 0.42], [0.62, 0.38]]),
                 np.array([[0.05, 0.95], [0.91, 0.09]])]
    y_true = [["a", "b"], ["b", "c"]]
    result = common.calibration(y_true, marginals, ["a", "b"])
    assert result["ece"] == pytest.approx(0.25 * 0.42 + 0.25 * 0.62 + 0.5 * 0.43)
    # NLL: the true label's probability, 1e-12 for a label not in classes.
    expected_nll = -np.mean(np.log([0.58, 0.38, 0.95, 1e-12]))
    assert result["nll"] == pytest.approx(expected_nll)


def test_fold_split_takes_the_rest_of_the_row_as_test(common):
    folds = np.array([[3, 0, 4, 1, 2], [1, 2, 3, 4, 0]])
    train, test = common.fold_split(folds, 1, 2)
    assert train.tolist() == [1, 2] and test.tolist() == [3, 4, 0]
