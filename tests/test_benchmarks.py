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
bench_predict's row on synthetic data; and (from a mutation audit of the
reporting code) the paper column every Table 1 step is set beside, the
data sets and quoted tables against BENCHMARK.md, the split files, the
logistic-regression peer against scikit-learn, the peers' timing sums on a
simulated clock, fit_gp's record of a fit, bench_table1's folds and
summary, and run_suite's commands, tables and report.
"""

import importlib
import json
import sys
import types
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
bench_checkouts = _module_fixture("bench_checkouts")
bench_builds = _module_fixture("bench_builds")
bench_lbfgs = _module_fixture("bench_lbfgs")


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


def test_bench_builds_times_both_builds_on_the_same_batch(bench_builds):
    from skgpstruct._cpu import has_avx2_fma

    if not has_avx2_fma():
        pytest.skip("the AVX2 build cannot run on this processor")
    base, avx2 = bench_builds.builds()
    assert (base.__name__, avx2.__name__) == ("skgpstruct._chain",
                                              "skgpstruct._chain_avx2")
    # measure() asserts that both builds give the same marginals and labels
    row = bench_builds.measure(base, avx2, 4, 6, 3, 2, 0.0, np.random.default_rng(0))
    assert (row["labels"], row["tokens"]) == (4, 18)
    assert all(row[c] > 0 for c in bench_builds.COLUMNS[2:])
    table = bench_builds.markdown([row])
    assert table.count("\n") == 2 and table.splitlines()[2].startswith("| 4 | 18 | ")


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


def test_profile_fit_counts_every_call_of_a_function(profile_fit):
    import cProfile
    import pstats

    def countdown(n):  # recursive: n + 1 calls of its own
        if n:
            countdown(n - 1)

    def leaf():
        pass

    def outer():
        countdown(2)
        for _ in range(4):
            leaf()

    profile = cProfile.Profile()
    profile.runcall(outer)
    stats = pstats.Stats(profile)
    assert profile_fit.call_count(stats, "countdown") == 3
    assert profile_fit.call_count(stats, "leaf") == 4
    assert profile_fit.call_count(stats, "outer") == 1
    assert profile_fit.call_count(stats, "no_such_function") == 0


def test_profile_fit_wall_clock_times_and_restores_the_parts(profile_fit):
    # The timers replace a module's function and a class's method while the
    # context is open (calls through the owner see them), count a
    # recursive call once, and put the originals back on exit.
    import time
    import types

    def nap(seconds, depth=0):
        time.sleep(seconds)
        if depth:
            return owner.nap(0.0, depth - 1)  # through the owner: timed
        return "done"

    class Counter:
        def step(self):
            return 1

    owner = types.SimpleNamespace(nap=nap)
    original_step = Counter.step
    parts = [("nap", owner, "nap"), ("step", Counter, "step")]
    with profile_fit.WallClock(parts) as clock:
        assert owner.nap(0.02, depth=2) == "done"
        assert [Counter().step() for _ in range(3)] == [1, 1, 1]
    assert clock.calls == {"nap": 1, "step": 3}
    assert 0.015 < clock.seconds["nap"] < 1.0
    assert 0.0 < clock.seconds["step"] < clock.seconds["nap"]
    assert owner.nap is nap and Counter.step is original_step
    # The parts the script times exist where it looks for them.
    for _, part_owner, attribute in profile_fit.WALL_PARTS:
        assert callable(getattr(part_owner, attribute))
    labels = {label for label, _, _ in profile_fit.WALL_PARTS}
    assert set(profile_fit.WALL_IN_RUN) <= labels


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


def test_peak_memory_is_the_stretchs_own_not_the_processs(common):
    # 64 MiB written (so resident) inside a stretch raise its mark by about
    # that much; a later stretch that allocates nothing reads close to zero,
    # where the process's lifetime peak minus its resident size would read
    # the 64 MiB again.
    memory = common.PeakMemory()
    if not memory.reset:
        pytest.skip("the resident set's high-water mark cannot be reset here "
                    "(/proc/self/clear_refs is Linux's, and must be writable)")
    block = np.ones(8 * 2**20)
    assert 60 <= memory.increment_mib() <= 80
    del block
    quiet = common.PeakMemory()
    assert 0 <= quiet.increment_mib() < 8


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


# Catches C01 (GP-VAR-S / GP-VAR-B swapped), C02 (pseudo-likelihood in batch
# mode given GP-VAR-P), C03 (the default likelihood given no paper row) and
# R08 (run_suite's _paper_row ignoring the likelihood): the paper column
# every Table 1 step of the suite is published beside.
def test_each_table1_step_is_set_beside_its_paper_column(common, run_suite,
                                                         bench_table1):
    # BENCHMARK.md section 1: GP-VAR-B batch, GP-VAR-S stochastic, GP-VAR-P
    # stochastic on the piecewise pseudo-likelihood, GP-ESS the sampler;
    # the pseudo-likelihood in batch mode has no column in the paper.
    expected = {"table1-batch": "GP-VAR-B", "table1-stochastic": "GP-VAR-S",
                "table1-pseudo": "GP-VAR-P", "table1-pseudo-batch": None,
                "ess": "GP-ESS", "ess-learned": "GP-ESS"}
    # seg's row of the paper's Table 1, typed from BENCHMARK.md.
    paper_seg = {"GP-ESS": "14.88 (1.80)", "GP-VAR-B": "15.61 (1.90)",
                 "GP-VAR-S": "14.97 (1.38)", "GP-VAR-P": "15.16 (1.57)"}
    assert {s.name for s in run_suite.TABLE1_STEPS} == set(expected)
    for step in run_suite.TABLE1_STEPS:
        if step.script == "bench_table1.py":
            args = bench_table1.build_parser().parse_args(list(step.args))
            payload = {"gp_options": bench_table1.gp_params(args)}
            fold = {"fold": 0, "gp": {"error": 5.0, "fit_time": 1.0}}
        else:
            payload = {"options": {}}
            fold = {"fold": 0, "error": 5.0, "fit_time": 1.0}
        payload["results"] = {"seg": [fold]}
        report = run_suite.table1_section({"steps": {}}, {step.name: payload})
        (row,) = [line for line in report.splitlines()
                  if line.startswith("| seg |") and "| 5.00 |" in line]
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        column = expected[step.name]
        want = f"{column}: {paper_seg[column]}" if column else "no paper row"
        assert cells[-1] == want, step.name
    # The mapping itself, on the estimator's option values.
    assert common.paper_gp_row() == "GP-VAR-B"
    assert common.paper_gp_row("lbfgs", "crf") == "GP-VAR-B"
    assert common.paper_gp_row("stochastic", None) == "GP-VAR-S"
    assert common.paper_gp_row("stochastic", "pseudo") == "GP-VAR-P"
    assert common.paper_gp_row("lbfgs", "pseudo") is None
    assert common.paper_gp_row(None, "pseudo") is None
    assert common.paper_gp_row(inference="ess") == "GP-ESS"


# Catches C05 (basenp n_train 150 -> 149; any other change of the protocol's
# pools): DATASETS against BENCHMARK.md section 1, typed by hand.
def test_datasets_follow_benchmark_md(common):
    want = {
        "basenp": ("test.data", 300, 150, "utf-8"),
        "chunking": ("test.data", 100, 50, "utf-8"),
        "seg": ("train.data", 36, 20, "utf-8"),
        "JapaneseNE": ("test.data", 100, 50, "euc-jp"),
    }
    got = {name: (d.pool_file, d.n_data, d.n_train, d.encoding)
           for name, d in common.DATASETS.items()}
    assert got == want
    assert common.DATASETS["seg"].split_file == "datasplit.n_data=36.txt"


# Catches C08 (the permutation check of the split file removed) and, without
# the shared data, C07 (1-based indices not shifted): read_folds on a split
# file written here.
def test_read_folds_shifts_and_checks_the_split_file(common, tmp_path):
    dataset = common.DataSet("toy", "test.data", 4, 2)
    (tmp_path / "gpstruct-splits").mkdir()
    path = tmp_path / "gpstruct-splits" / "datasplit.n_data=4.txt"
    path.write_text("3 1 4 2\n2 4 1 3\n", encoding="utf-8")
    np.testing.assert_array_equal(common.read_folds(tmp_path, dataset),
                                  [[2, 0, 3, 1], [1, 3, 0, 2]])
    path.write_text("3 1 4 2\n2 4 4 3\n", encoding="utf-8")  # 4 twice, no 1
    with pytest.raises(SystemExit, match=r"row 1: not a permutation of 1\.\.4"):
        common.read_folds(tmp_path, dataset)


# Catches C21 (a token's last feature dropped) and C22 (a token given its
# predecessor's features): the CRF peer's input against the CSR rows.
def test_to_crfsuite_gives_each_token_its_own_active_features(common):
    X = [sp.csr_matrix(np.array([[1, 0, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]])),
         sp.csr_matrix(np.array([[0, 0, 1, 1]]))]
    names = np.array(["a", "b", "c", "d"])
    assert common.to_crfsuite(X, names) == [
        [{"a": 1.0, "c": 1.0, "d": 1.0}, {"b": 1.0}, {}],
        [{"c": 1.0, "d": 1.0}],
    ]


# Catches C15 (predictions split at the wrong sequence boundaries), C16
# (the worst C picked), C17 (CV accuracy of one inner fold), C18 (refit on
# an inner training part) and C20 (probability columns in the wrong class
# order): the LR peer against scikit-learn called directly.
def test_logreg_peer_against_scikit_learn(common):
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import KFold

    from skgpstruct.datasets import make_sequences

    X, y = make_sequences(n_sequences=18, n_features=12, sparse=True,
                          random_state=0)
    X_train, y_train, X_test, y_test = X[:12], y[:12], X[12:], y[12:]
    grid = (0.01, 1.0, 100.0)

    def flat(X_, y_):
        return sp.vstack(X_).tocsr(), np.concatenate([np.asarray(s) for s in y_])

    cv = {}
    for C in grid:
        scores = []
        for tr, va in KFold(n_splits=3).split(np.arange(12)):
            Xf, yf = flat([X_train[i] for i in tr], [y_train[i] for i in tr])
            model = LogisticRegression(C=C, max_iter=5000).fit(Xf, yf)
            Xv, yv = flat([X_train[i] for i in va], [y_train[i] for i in va])
            scores.append(np.mean(model.predict(Xv) == yv))
        cv[C] = np.mean(scores)
    best = max(grid, key=lambda c: cv[c])
    out = common.run_logreg(X_train, y_train, X_test, y_test, grid=grid)
    assert out["C"] == best
    for C in grid:
        assert out["cv_accuracy"][str(C)] == pytest.approx(cv[C], abs=1e-12)
    model = LogisticRegression(C=best, max_iter=5000).fit(*flat(X_train, y_train))
    Xt, yt = flat(X_test, y_test)
    assert set(yt) <= set(model.classes_)
    assert out["error"] == pytest.approx(100.0 * np.mean(model.predict(Xt) != yt),
                                         abs=1e-9)
    P = model.predict_proba(Xt)
    p_true = P[np.arange(len(yt)), np.searchsorted(model.classes_, yt)]
    assert out["calibration"]["nll"] == pytest.approx(-np.mean(np.log(p_true)),
                                                      rel=1e-9)


# Catches C53 (mean over calls - 1) and C54 (stopping before min_time):
# seconds_per_call on a simulated clock, each call costing 1/16 s.
def test_seconds_per_call_on_a_simulated_clock(common, monkeypatch):
    now = [0.0]
    monkeypatch.setattr(common, "time",
                        types.SimpleNamespace(perf_counter=lambda: now[0]))
    calls = []

    def func():
        calls.append(None)
        now[0] += 0.0625

    assert common.seconds_per_call(func, 0.2) == 0.0625
    assert len(calls) == 4  # 4 / 16 = 0.25 s is the first total >= 0.2 s


# Catches C19 (LR select_time = its refit time), C26 (a CRF grid's
# select_time = the CV time of the union of the grids), C30 (total_time
# without the refit), C31 and C32 (GP / CRF time against the wide-grid CRF)
# and C33 (items_time = the dict conversion time): run_peers on a simulated
# clock where every reading advances one second and every fit costs 10 s,
# so that each figure follows from the protocol's counts of fits.
def test_peer_times_on_a_simulated_clock(common, monkeypatch):
    pytest.importorskip("sklearn_crfsuite")
    from skgpstruct.datasets import make_sequences

    now = [0.0]

    def perf_counter():
        now[0] += 1.0
        return now[0]

    def costing(func, seconds):
        def wrapped(*args, **kwargs):
            now[0] += seconds
            return func(*args, **kwargs)

        return wrapped

    clock = types.SimpleNamespace(perf_counter=perf_counter)
    monkeypatch.setattr(common, "time", clock)
    monkeypatch.setattr(common, "_fit_crf", costing(common._fit_crf, 10.0))
    monkeypatch.setattr(common, "_fit_logreg", costing(common._fit_logreg, 10.0))
    monkeypatch.setattr(common, "to_crfsuite", costing(common.to_crfsuite, 5.0))
    monkeypatch.setattr(common, "crf_items", costing(common.crf_items, 0.5))
    X, y = make_sequences(n_sequences=18, n_features=12, sparse=True,
                          random_state=0)
    names = np.array([f"f{j}" for j in range(X[0].shape[1])])
    out = common.run_peers(X[:12], y[:12], X[12:], y[12:], names, True,
                           gp_fit_time=1000.0)
    # A stopwatch around k fits reads 1 + 10 k seconds.
    folds = common.INNER_FOLDS
    crf, wide, lr = out["crf"], out["crf_wide"], out["logreg"]
    assert crf["select_time"] == len(common.CRF_C2_GRID) * (1 + 10 * folds)
    assert wide["select_time"] == len(common.CRF_C2_WIDE_GRID) * (1 + 10 * folds)
    assert crf["refit_time"] == wide["refit_time"] == 11.0
    assert crf["total_time"] == crf["select_time"] + 11.0
    assert wide["total_time"] == wide["select_time"] + 11.0
    assert out["gp_over_crf_time"] == 1000.0 / crf["total_time"]
    assert crf["convert_time"] == 1 + 2 * 5.0  # training and test parts
    assert crf["items_time"] == 1.5  # one call: 0.5 s between two readings
    assert lr["select_time"] == 1 + 10 * folds * len(common.LR_C_GRID)
    assert lr["refit_time"] == 11.0


# Catches T03 (every fold run on fold 0's split), T04 (n_train_tokens counts
# the test tokens) and T05 (test labels from the training sequences):
# bench_table1.run_fold hands the GP its own fold, on a toy pool.
def test_run_fold_fits_and_scores_on_its_own_fold(common, bench_table1, monkeypatch):
    seen = {}

    def template_features(template, tok_train, tok_test):
        return list(tok_train), list(tok_test), np.array(["f"]), 0.0

    def fit_gp(params, verbose, X_train, y_train, X_test, y_test):
        seen.update(X_train=X_train, y_train=y_train, X_test=X_test, y_test=y_test)
        return {"error": 1.0, "fit_time": 2.0, "n_iter": 3, "converged": True,
                "predict_time": 0.1, "marginals_time": 0.2}

    monkeypatch.setattr(bench_table1, "template_features", template_features)
    monkeypatch.setattr(bench_table1, "fit_gp", fit_gp)
    monkeypatch.setattr(bench_table1, "transform_time", lambda *args: 0.0)
    monkeypatch.setattr(bench_table1, "run_peers", lambda *args, **kwargs: {})
    # Sequence i of the pool has i + 1 tokens, all labelled L<i>.
    tokens = [[[f"w{i}"]] * (i + 1) for i in range(6)]
    labels = [[f"L{i}"] * (i + 1) for i in range(6)]
    folds = np.array([[0, 1, 2, 3, 4, 5], [5, 3, 1, 0, 2, 4]])
    dataset = common.DataSet("toy", "test.data", 6, 4)
    args = bench_table1.build_parser().parse_args([])
    result = bench_table1.run_fold(dataset, (tokens, labels, None), folds, 1, {},
                                   args, False)
    train, test = [5, 3, 1, 0], [2, 4]
    assert seen["X_train"] == [tokens[i] for i in train]
    assert seen["y_train"] == [labels[i] for i in train]
    assert seen["X_test"] == [tokens[i] for i in test]
    assert seen["y_test"] == [labels[i] for i in test]
    assert result["fold"] == 1
    assert result["n_train_tokens"] == 6 + 4 + 2 + 1
    assert result["n_test_tokens"] == 3 + 5


# Catches T02: --quick lowers max_iter only when --max-iter is not given.
def test_table1_quick_keeps_an_explicit_max_iter(bench_table1):
    parser = bench_table1.build_parser()
    assert bench_table1.gp_params(parser.parse_args(["--quick"]))["max_iter"] == (
        bench_table1.QUICK_MAX_ITER)
    assert bench_table1.gp_params(
        parser.parse_args(["--quick", "--max-iter", "5"]))["max_iter"] == 5
    assert "max_iter" not in bench_table1.gp_params(parser.parse_args([]))


def _canned_fold(k, gp, crf, wide, lr, gp_fit, crf_select, crf_refit, lr_select,
                 lr_refit, failed=False):
    """A bench_table1 fold result with the given figures."""
    cal = {"nll": 0.5, "ece": 0.05}
    gp_result = (
        {"error": float("nan"), "fit_time": float("nan"),
         "failure": "LinAlgError: boom"} if failed else
        {"error": gp, "fit_time": gp_fit, "n_iter": 3, "converged": True,
         "calibration": cal, "predict_time": 0.01, "marginals_time": 0.02}
    )
    return {
        "dataset": "seg", "fold": k, "gp": gp_result,
        "crf": {"error": crf, "select_time": crf_select, "refit_time": crf_refit,
                "total_time": crf_select + crf_refit, "calibration": cal,
                "predict_time": 0.001, "marginals_time": 0.002},
        "crf_wide": {"error": wide, "select_time": 2 * crf_select,
                     "refit_time": crf_refit,
                     "total_time": 2 * crf_select + crf_refit, "calibration": cal},
        "logreg": {"error": lr, "select_time": lr_select, "refit_time": lr_refit,
                   "calibration": cal},
        "gp_over_crf_time": gp_fit / (crf_select + crf_refit),
    }


def _markdown_tables(text):
    """{heading: [row dicts]} of the Markdown tables under '#' headings (a
    table without a heading of its own: under the previous one, with '+')."""
    tables, heading, lines = {}, None, text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|")):
            header = [c.strip() for c in line.strip().strip("|").split("|")]
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                rows.append(dict(zip(
                    header, [c.strip() for c in row.strip().strip("|").split("|")],
                    strict=True)))
            while heading in tables:
                heading += "+"
            tables[heading] = rows
    return tables


# Catches T06 (CRF and CRF {1e-4..10} error columns swapped), T07 (LR time
# without its refit), T08 (CRF selection and refit columns swapped), T09
# (without the CRF, LR error and GP fit columns out of order), T10
# (per-fold rows showing the mean), T11 (mean leaving out a fold), T12
# (every --folds refused as repeated), T13 (--quick running the last fold),
# T14 (the quoted paper column always GP-VAR-B), T15 (the quoted LR column
# showing SSVM), T16 (exit status 0 after a failed fit), T17 (no note of the
# failed fold): bench_table1.main on canned fold results, every cell of the
# printed tables read by its column header and checked against figures
# worked out by hand (means and ddof=1 standard deviations by NumPy).
def test_table1_main_prints_each_figure_under_its_column(bench_table1, monkeypatch,
                                                         capsys):
    canned = {
        0: _canned_fold(0, 10.0, 20.0, 30.0, 40.0, 100.0, 5.0, 1.0, 7.0, 2.0),
        2: _canned_fold(2, 12.0, 22.0, 34.0, 46.0, 240.0, 9.0, 3.0, 11.0, 4.0),
    }
    ran = []

    def run_fold(dataset, pool, folds, k, params, args, with_crf):
        ran.append((dataset.name, k))
        return canned[k]

    monkeypatch.setattr(bench_table1, "check_data_dir", lambda path: path)
    monkeypatch.setattr(bench_table1, "load_pool", lambda *args: None)
    monkeypatch.setattr(bench_table1, "read_folds", lambda *args: None)
    monkeypatch.setattr(bench_table1, "crfsuite_available", lambda: True)
    monkeypatch.setattr(bench_table1, "environment", lambda: {"python": "x"})
    monkeypatch.setattr(bench_table1, "run_fold", run_fold)
    status = bench_table1.main(["--datasets", "seg", "--folds", "0", "2",
                                "--optimizer", "stochastic"])
    assert status == 0 and ran == [("seg", 0), ("seg", 2)]
    tables = _markdown_tables(capsys.readouterr().out)
    measured = next(v for k, v in tables.items() if k.startswith("Measured"))

    def mean_sd(a, b, unit="", digits=2):
        v = np.array([a, b])
        return f"{v.mean():.{digits}f}{unit} ({v.std(ddof=1):.{digits}f})"

    assert measured == [
        {"data set": "seg", "fold": "0", "GP error %": "10.00",
         "CRF error %": "20.00", "CRF {1e-4..10} error %": "30.00",
         "LR error %": "40.00", "GP fit": "100.00 s", "CRF selection": "5.00 s",
         "CRF refit": "1.00 s", "LR selection + refit": "9.00 s",
         "GP / CRF time": "16.7x"},
        {"data set": "seg", "fold": "2", "GP error %": "12.00",
         "CRF error %": "22.00", "CRF {1e-4..10} error %": "34.00",
         "LR error %": "46.00", "GP fit": "240.00 s", "CRF selection": "9.00 s",
         "CRF refit": "3.00 s", "LR selection + refit": "15.00 s",
         "GP / CRF time": "20.0x"},
        {"data set": "**seg**", "fold": "mean (2 folds)",
         "GP error %": mean_sd(10, 12), "CRF error %": mean_sd(20, 22),
         "CRF {1e-4..10} error %": mean_sd(30, 34), "LR error %": mean_sd(40, 46),
         "GP fit": mean_sd(100, 240, " s"), "CRF selection": mean_sd(5, 9, " s"),
         "CRF refit": mean_sd(1, 3, " s"),
         "LR selection + refit": mean_sd(9, 15, " s"),
         "GP / CRF time": mean_sd(100 / 6, 20, "x", 1)},
    ]
    quoted = next(v for k, v in tables.items() if k.startswith("Quoted"))
    # BENCHMARK.md section 1, seg: the paper's GP-VAR-S (a stochastic run)
    # and the measured CRF, per-token LR and CRF time.
    assert quoted == [{
        "data set": "seg", "paper GP-VAR-S error %": "14.97 (1.38)",
        "measured CRF error %": "12.80 (2.85)",
        "measured per-token LR error %": "12.87 (2.61)",
        "CRF fit + selection per fold": "0.02 s + 0.2 s",
    }]
    # Without sklearn-crfsuite: the GP and LR columns only, in header order.
    monkeypatch.setattr(bench_table1, "crfsuite_available", lambda: False)
    bench_table1.main(["--datasets", "seg", "--folds", "0"])
    tables = _markdown_tables(capsys.readouterr().out)
    measured = next(v for k, v in tables.items() if k.startswith("Measured"))
    assert measured[0] == {"data set": "seg", "fold": "0", "GP error %": "10.00",
                           "LR error %": "40.00", "GP fit": "100.00 s",
                           "LR selection + refit": "9.00 s"}
    monkeypatch.setattr(bench_table1, "crfsuite_available", lambda: True)
    # --quick: the first fold asked for, whatever its number.
    ran.clear()
    bench_table1.main(["--datasets", "seg", "--folds", "2", "0", "--quick"])
    assert ran == [("seg", 2)]
    capsys.readouterr()
    # A failed GP fit: noted, and the exit status says so.
    canned[2] = _canned_fold(2, 0, 22.0, 34.0, 46.0, 0, 9.0, 3.0, 11.0, 4.0,
                             failed=True)
    assert bench_table1.main(["--datasets", "seg", "--folds", "0", "2"]) == 1
    captured = capsys.readouterr()
    assert "The GP FAILED on fold(s) seg 2" in captured.out
    assert "1 fit(s) failed" in captured.err


# Catches C10 (a confidence of exactly 1.0 put in bin n_bins, which the loop
# never visits: that token's weight is lost and the ECE comes out lower).
# Marginals of exactly 1.0 occur (saturated LR / crfsuite probabilities).
def test_calibration_counts_a_confidence_of_one_in_the_top_bin(common):
    # Token 1: label a at 1.0, true b (wrong, gap 1); token 2: a at 0.6, true
    # a (right, gap 0.4). One token per bin: ECE = (1 + 0.4) / 2.
    marginals = [np.array([[1.0, 0.0], [0.6, 0.4]])]
    result = common.calibration([["b", "a"]], marginals, ["a", "b"])
    assert result["ece"] == pytest.approx(0.7)


def _suite_fold(k, gp, crf, wide, lr, gp_fit, crf_total, wide_total, crf_nll,
                n_iter):
    """A bench_table1 fold as run_suite reads it from the JSON."""
    return {
        "fold": k,
        "gp": {"error": gp, "fit_time": gp_fit, "n_iter": n_iter,
               "converged": k == 0, "calibration": {"nll": 0.1, "ece": 0.01}},
        "crf": {"error": crf, "total_time": crf_total,
                "calibration": {"nll": crf_nll, "ece": 0.02}},
        "crf_wide": {"error": wide, "total_time": wide_total,
                     "calibration": {"nll": 0.6, "ece": 0.03}},
        "logreg": {"error": lr, "calibration": {"nll": 0.8, "ece": 0.04}},
    }


def _mean_sd(values, digits=2, unit=""):
    v = np.asarray(values, dtype=float)
    return f"{v.mean():.{digits}f}{unit} ({v.std(ddof=1):.{digits}f})"


# Catches R05 (an error of 0.0 dropped from a mean), R06 (CRF and CRF
# {1e-4..10} error columns swapped), R07 (LR column showing the CRF's error),
# R11 (every peer given the CRF's calibration), R13 (peers whose calibration
# differs between runs shown as "same in every run"), R14 (CRF selection +
# refit from the wide-grid CRF), R16 (paired differences reading the GP
# error from the wrong level) and R28 (a data set run by one step only
# dropped): run_suite's Table 1 section on canned JSON of two steps, every
# cell read by its column header, figures worked out by hand (means, ddof=1
# standard deviations and standard errors by NumPy).
def test_suite_table1_section_puts_each_figure_under_its_column(run_suite):
    batch_seg = [_suite_fold(0, 5.0, 6.0, 7.0, 0.0, 10.0, 2.0, 4.0, 0.3, 10),
                 _suite_fold(1, 7.0, 9.0, 6.0, 4.0, 30.0, 3.0, 5.0, 0.5, 12)]
    stoch_seg = [_suite_fold(0, 5.0, 6.0, 7.0, 0.0, 10.0, 2.0, 4.0, 0.3, 10),
                 _suite_fold(1, 7.0, 9.0, 6.0, 4.0, 30.0, 3.0, 5.0, 0.7, 12)]
    basenp = [_suite_fold(0, 4.0, 4.5, 4.25, 5.0, 50.0, 10.0, 20.0, 0.2, 9)]
    results = {
        "table1-batch": {"results": {"seg": batch_seg, "basenp": basenp},
                         "gp_options": {}},
        "table1-stochastic": {"results": {"seg": stoch_seg},
                              "gp_options": {"optimizer": "stochastic"}},
    }
    steps = {s.name: s for s in run_suite.STEPS}
    batch, stoch = steps["table1-batch"].title, steps["table1-stochastic"].title
    tables = _markdown_tables(run_suite.table1_section({"steps": {}}, results))
    errors = next(v for k, v in tables.items() if k.startswith("Token error"))
    by_row = {(r["data set"], r["GP mode"]): r for r in errors}
    assert set(by_row) == {("basenp", batch), ("seg", batch), ("seg", stoch)}
    assert by_row["seg", batch] == {
        "data set": "seg", "GP mode": batch, "folds": "0, 1",
        "GP error %": _mean_sd([5, 7]), "CRF error % (same run)": _mean_sd([6, 9]),
        "CRF {1e-4..10} error % (same run)": _mean_sd([7, 6]),
        "LR error % (same run)": _mean_sd([0, 4]),
        "paper (quoted)": "GP-VAR-B: 15.61 (1.90)",
    }
    assert by_row["seg", stoch]["paper (quoted)"] == "GP-VAR-S: 14.97 (1.38)"
    assert by_row["basenp", batch]["CRF {1e-4..10} error % (same run)"] == "4.25"

    diffs = next(v for k, v in tables.items() if k.startswith("Paired"))
    seg_batch = {r["peer"]: (r["GP - peer"], r["folds where the GP is lower"])
                 for r in diffs if (r["data set"], r["GP mode"]) == ("seg", batch)}

    def paired(d):
        d = np.asarray(d, dtype=float)
        return (f"{d.mean():+.2f} ({d.std(ddof=1) / np.sqrt(d.size):.2f})",
                f"{int((d < 0).sum())} of {d.size}")

    assert seg_batch == {"CRF": paired([5 - 6, 7 - 9]),
                         "CRF {1e-4..10}": paired([5 - 7, 7 - 6]),
                         "LR": paired([5 - 0, 7 - 4])}

    times = next(v for k, v in tables.items() if k.startswith("Fit time"))
    row = next(r for r in times if (r["data set"], r["GP mode"]) == ("seg", batch))
    assert row == {
        "data set": "seg", "GP mode": batch, "folds": "0, 1",
        "GP fit": _mean_sd([10, 30], unit=" s"), "iterations": _mean_sd([10, 12], 0),
        "converged": "1/2", "CRF selection + refit": _mean_sd([2, 3], unit=" s"),
        "GP fit / CRF time": _mean_sd([10 / 2, 30 / 3], 1, "x"),
        "GP fit / CRF {1e-4..10} time": _mean_sd([10 / 4, 30 / 5], 1, "x"),
    }

    cal = next(v for k, v in tables.items() if k.startswith("Calibration"))
    seg_cal = {r["model"]: (r["NLL of the true label (nats/token)"],
                            r["ECE (top label)"])
               for r in cal if r["data set"] == "seg"}
    assert seg_cal == {
        f"GP, {batch}": ("0.100 (0.000)", "0.0100 (0.0000)"),
        f"GP, {stoch}": ("0.100 (0.000)", "0.0100 (0.0000)"),
        # the CRF's calibration differs between the two runs: one row each
        "CRF (table1-batch run)": (_mean_sd([0.3, 0.5], 3), "0.0200 (0.0000)"),
        "CRF (table1-stochastic run)": (_mean_sd([0.3, 0.7], 3), "0.0200 (0.0000)"),
        "CRF {1e-4..10} (same in every run)": ("0.600 (0.000)", "0.0300 (0.0000)"),
        "LR (same in every run)": ("0.800 (0.000)", "0.0400 (0.0000)"),
    }
    # basenp ran in one step only: its peers are labelled with that run
    basenp_peers = {r["model"] for r in cal if r["data set"] == "basenp"}
    assert basenp_peers == {f"GP, {batch}", "CRF (table1-batch run)",
                            "CRF {1e-4..10} (table1-batch run)",
                            "LR (table1-batch run)"}


# Catches R01 (--data passed to steps that read no data set) and R02
# (--quick not passed on): the command lines of the suite's steps.
def test_suite_step_commands(run_suite, tmp_path):
    steps = {s.name: s for s in run_suite.STEPS}
    out = tmp_path.resolve()
    cmd = run_suite.step_command(steps["table1-pseudo"], out, True, "/data")
    assert cmd[0] == sys.executable
    assert cmd[1:] == ["benchmarks/bench_table1.py", *steps["table1-pseudo"].args,
                       "--data", "/data", "--quick", "--out",
                       str(out / "table1-pseudo.json")]
    cmd = run_suite.step_command(steps["scale"], out, False, "/data")
    assert cmd[1:] == ["benchmarks/bench_scale.py", "--out", str(out / "scale.json")]


# Catches R21: a step that fails before writing its JSON must not leave the
# previous run's JSON to be reported as this run's.
def test_run_step_removes_the_previous_json(run_suite, tmp_path):
    step = run_suite.Step("broken", "no_such_script.py", (), "a step that fails")
    (tmp_path / "broken.json").write_text('{"results": {}}', encoding="utf-8")
    record = run_suite.run_step(step, tmp_path, False, None, quiet=True)
    assert record["returncode"] != 0
    assert not (tmp_path / "broken.json").exists()
    assert (tmp_path / "broken.log").read_text(encoding="utf-8").startswith("$ ")


# Catches R17 (the log's first lines shown instead of its last) and R18
# (failed and finished steps confused): why a step has no results.
def test_suite_names_why_a_step_has_no_results(run_suite, tmp_path):
    log = tmp_path / "ess.log"
    log.write_text("\n".join(f"line {i}" for i in range(20)), encoding="utf-8")
    suite = {"steps": {"ess": {"returncode": 3, "log": str(log)},
                       "chain": {"returncode": 0, "log": str(log)}}}
    text = run_suite._missing("ess", suite)
    assert text.startswith("`ess`: FAILED (exit status 3)")
    shown = [f"line {i}" for i in range(20 - run_suite.LOG_TAIL, 20)]
    assert text.endswith("```\n" + "\n".join(shown) + "\n```")
    assert "line 0\n" not in text
    assert run_suite._missing("chain", suite) == (
        "`chain`: ran, but its JSON is missing or unreadable.")
    assert run_suite._missing("dask", suite).startswith("`dask`: not run")


# Catches R19 (a JSON written by another command not flagged), R20 (total
# wall time not the sum) and R30 (the quick column always "no"): the steps
# table of the report.
def test_suite_steps_table(run_suite):
    suite = {"steps": {
        "table1-batch": {"command": "python a", "returncode": 0, "seconds": 10.0,
                         "quick": True},
        "ess": {"command": "python b", "returncode": 2, "seconds": 5.0,
                "quick": False},
    }}
    results = {"table1-batch": {"command": "python a"},
               "ess": {"command": "python other", "quick": False}}
    section = run_suite.steps_section(suite, results)
    (table,) = _markdown_tables(section).values()
    rows = {r["step"]: r for r in table}
    assert rows["table1-batch"] == {"step": "table1-batch", "command": "`python a`",
                                    "exit status": "0", "wall time": "10 s",
                                    "quick": "yes"}
    assert rows["ess"]["command"] == (
        "`python other` (the JSON's; the suite's record: `python b`)")
    assert "Total wall time of the recorded steps: 15 s." in section


# Catches R22 (the smoke-run banner naming the wrong steps) and R29 (a key
# that a later step's environment lacks not reported): the report's head.
def test_suite_report_head(run_suite, tmp_path):
    import json

    for name, quick, env in (("table1-batch", True, {"commit": "a", "numpy": "2"}),
                             ("ess", False, {"commit": "a"})):
        (tmp_path / f"{name}.json").write_text(json.dumps(
            {"quick": quick, "environment": env, "results": {}}), encoding="utf-8")
    report = run_suite.build_report(tmp_path)
    assert "for: table1-batch. Its figures" in report
    assert "Environment of ess, where it differs: numpy None." in report


# Catches R23: --report-only must report a step killed by a signal
# (negative exit status) as failed.
def test_suite_report_only_fails_on_a_killed_step(run_suite, tmp_path, capsys):
    import json

    (tmp_path / "suite.json").write_text(json.dumps({"steps": {"chain": {
        "command": "python x", "returncode": -9, "seconds": 1.0,
        "log": str(tmp_path / "chain.log")}}}), encoding="utf-8")
    assert run_suite.main(["--out", str(tmp_path), "--report-only"]) == 1
    assert "FAILED steps: chain" in capsys.readouterr().err


# Catches C55 (the first iteration's ELBO recorded), C56 (every fit recorded
# as converged) and C57 (a failed fit's message under another key, which
# failure_status does not see): fit_gp against the same fit done directly.
def test_fit_gp_records_what_the_fit_did(common, capsys):
    from sklearn.exceptions import ConvergenceWarning

    from skgpstruct import GPStructClassifier
    from skgpstruct.datasets import make_sequences

    X, y = make_sequences(10, random_state=1, n_classes=2)
    data = (X[:7], y[:7], X[7:], y[7:])
    result = common.fit_gp({"max_iter": 3, "random_state": 0}, False, *data)
    model = GPStructClassifier(max_iter=3, random_state=0)
    with pytest.warns(ConvergenceWarning):
        model.fit(X[:7], y[:7])
    assert result["converged"] is False
    assert result["n_iter"] == model.n_iter_
    assert result["elbo"] == model.elbo_history_[-1]
    assert result["elbo_history"] == [float(v) for v in model.elbo_history_]
    truth = np.concatenate([np.asarray(s) for s in y[7:]])
    predicted = np.concatenate([np.asarray(s) for s in model.predict(X[7:])])
    assert result["error"] == pytest.approx(100.0 * np.mean(truth != predicted))
    failed = common.fit_gp({"kernel": "no-such-kernel"}, False, *data)
    assert np.isnan(failed["error"]) and "failure" in failed
    assert common.failure_status({"seg": [{"fold": 0, "gp": failed}]}) == 1
    capsys.readouterr()


# Catches C47: without sklearn-crfsuite (bench_table1 then runs no CRF, a
# supported configuration) the folds have GP prediction times and no CRF:
# no prediction row, rather than a KeyError at the end of the run, before
# its JSON is written.
def test_prediction_rows_without_the_crf_peer(common):
    folds = [{"fold": k,
              "gp": {"error": 5.0, "fit_time": 1.0, "predict_time": 0.01,
                     "marginals_time": 0.02},
              "logreg": {"error": 6.0}} for k in range(2)]
    assert common.prediction_rows({"seg": folds}) == []


# Catches C60 (the neighbours' words filed under the opposite offset):
# token_dict's features of a three-token sentence, written out by hand.
def test_token_dict_by_hand(common):
    sentence = [["The", "DT"], ["cat", "NN"], ["Sat", "VBD"]]
    assert common.token_dict(sentence, 1) == {
        "bias": 1.0, "word.lower()": "cat", "word[-3:]": "cat", "word[-2:]": "at",
        "word.isupper()": False, "word.istitle()": False, "word.isdigit()": False,
        "c1": "NN",
        "-1:word.lower()": "the", "-1:c1": "DT",
        "+1:word.lower()": "sat", "+1:c1": "VBD",
    }
    first = common.token_dict(sentence, 0)
    assert first["BOS"] is True and "EOS" not in first
    assert first["+2:word.lower()"] == "sat" and first["+1:c1"] == "NN"


# Catches R10: in the suite's report, the GP's calibration over the folds
# that did not fail, marked "[n failed]" (not silently over fewer folds).
def test_suite_calibration_marks_a_failed_gp_fold(run_suite):
    good = _suite_fold(0, 5.0, 6.0, 7.0, 1.0, 10.0, 2.0, 4.0, 0.3, 10)
    failed = _suite_fold(1, 5.0, 6.0, 7.0, 1.0, 10.0, 2.0, 4.0, 0.3, 10)
    failed["gp"] = {"error": float("nan"), "fit_time": float("nan"),
                    "failure": "LinAlgError: boom"}
    report = run_suite.table1_section(
        {"steps": {}}, {"table1-batch": {"results": {"seg": [good, failed]},
                                         "gp_options": {}}})
    cal = next(v for k, v in _markdown_tables(report).items()
               if k.startswith("Calibration"))
    (gp,) = [r for r in cal if r["model"].startswith("GP, ")]
    assert gp["NLL of the true label (nats/token)"] == "0.100 [1 failed]"
    assert gp["ECE (top label)"] == "0.0100 [1 failed]"


# Catches R24: bench_scale compares n_jobs at its largest size only (the
# smaller sizes run with the first n_jobs); the suite's report must read the
# n_jobs values there and show their table.
def test_suite_scale_section_shows_the_n_jobs_table(run_suite):
    def result(size, seconds_per_iter):
        return {"n_tokens": size, "n_sequences": size // 10,
                "fit_time": 10 * seconds_per_iter, "n_iter": 10,
                "seconds_per_iter": seconds_per_iter, "peak_rss_mib": 100.0,
                "fit_increment_mib": 5.0, "error": 10.0}

    measurements = [
        {"config": {"size": 500, "kind": "lbfgs", "n_jobs": 1},
         "result": result(500, 0.1)},
        {"config": {"size": 2000, "kind": "lbfgs", "n_jobs": 1},
         "result": result(2000, 0.4)},
        {"config": {"size": 2000, "kind": "lbfgs", "n_jobs": 2},
         "result": result(2000, 0.25)},
    ]
    section = run_suite.scale_section({"steps": {}},
                                      {"scale": {"measurements": measurements}})
    tables = _markdown_tables(section)
    jobs = next(v for k, v in tables.items() if k == "n_jobs at 2000 tokens")
    # 0.4 s against 0.25 s per iteration: a speed-up of 1.6.
    assert jobs == [{"model": "GP L-BFGS s/iter", "n_jobs=1": "0.4000 s",
                     "n_jobs=2": "0.2500 s", "speed-up n_jobs=2": "1.60x"}]


# Catches C63 and C64 (a quoted figure mistyped): every figure of
# PAPER_TABLE1 and MEASURED_TABLE1 against the tables of
# ../shared/BENCHMARK.md, read from the file (skipped without it).
def test_quoted_tables_match_benchmark_md(common):
    path = BENCHMARKS.parents[1] / "shared" / "BENCHMARK.md"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    tables = _markdown_tables(path.read_text(encoding="utf-8"))
    section = next(k for k in tables if k.startswith("1. Accuracy"))
    paper, measured = tables[section], tables[section + "+"]
    assert {r["data set"]: {k: v for k, v in r.items() if k != "data set"}
            for r in paper} == common.PAPER_TABLE1
    names = {"CRF": "CRF", "SSVM": "SSVM", "LR": "per-token LR",
             "CRF time": "CRF fit + selection per fold"}
    assert {r["data set"]: {k: r[v] for k, v in names.items()}
            for r in measured} == common.MEASURED_TABLE1


# Class (b) survivor C43 (a NaN in the second argument not skipped): the
# peers' errors are never NaN today, but the documented contract ("non-
# finite pairs are skipped") is cheap to pin down. Optional.
def test_paired_difference_skips_a_nan_in_either_column(common):
    assert common.paired_difference([1.0, 2.0], [np.nan, 1.0]) == ("+1.00", "0 of 1")


def test_bench_lbfgs_fits_with_each_initial_matrix_and_counts_evaluations(
    bench_lbfgs, monkeypatch
):
    from skgpstruct import _estimator as estimator_module
    from skgpstruct.datasets import make_sequences
    from skgpstruct.inference import elbo
    from skgpstruct.optim import lbfgs

    X, y = make_sequences(12, random_state=3, length_range=(3, 8))
    seen = []
    real = lbfgs.minimize_lbfgs

    def recording(*args, initial="diagonal", **kwargs):
        seen.append(initial)
        return real(*args, initial=initial, **kwargs)

    monkeypatch.setattr(estimator_module, "minimize_lbfgs", recording)
    evaluate = elbo.SparseELBO.evaluate
    records = {
        initial: bench_lbfgs.fit(X, y, initial) for initial in ("scalar", "diagonal")
    }
    assert seen == ["scalar", "diagonal"]
    # both put back when the fits end
    assert estimator_module.minimize_lbfgs is recording
    assert elbo.SparseELBO.evaluate is evaluate
    for rec in records.values():
        # one evaluation at the start, at least one per iteration
        assert rec["evaluations"] >= rec["n_iter"] + 1 and rec["n_iter"] >= 5
        assert rec["seconds"] > 0
    # the same objective, optimised to its tolerance either way
    elbos = [records[initial]["elbo"] for initial in ("diagonal", "scalar")]
    assert elbos[0] == pytest.approx(elbos[1], rel=1e-3)


def test_bench_lbfgs_variants_take_the_inverse_diagonal(bench_lbfgs):
    rng = np.random.default_rng(4)
    n = 9
    variants = (("inverse-diagonal", False), ("secant-inverse-diagonal", True))
    for name, secant in variants:
        initial, memory_class = bench_lbfgs.VARIANTS[name]
        assert initial == "diagonal"
        memory = memory_class(n, 3)
        for _ in range(4):
            s = rng.normal(size=n)
            y = 2.0 * s + 0.1 * rng.normal(size=n)
            assert memory.push(s, y)
            expected = 1.0 / memory.hessian_diagonal
            if secant:
                expected *= (s @ y) / (y @ (expected * y))
            np.testing.assert_allclose(memory.initial_diagonal, expected, rtol=1e-12)


def test_bench_checkouts_summary_keeps_each_folds_best_time(bench_checkouts):
    # Two rounds of two folds by hand: each fold's best time per checkout,
    # the totals' ratio, the per-iteration ratio averaged over the folds,
    # and each round's ratio of totals.
    def rec(fold, seconds, n_iter):
        return {"dataset": "seg", "fold": fold, "seconds": seconds, "n_iter": n_iter}

    runs = {
        "before": [[rec(0, 2.0, 10), rec(1, 4.0, 20)],
                   [rec(0, 3.0, 10), rec(1, 3.0, 20)]],
        "after": [[rec(0, 1.5, 12), rec(1, 3.5, 20)],
                  [rec(0, 1.0, 12), rec(1, 4.5, 20)]],
    }
    (row,) = bench_checkouts.summarise(runs, [0, 1])
    assert row["before"] == pytest.approx(2.0 + 3.0)
    assert row["after"] == pytest.approx(1.0 + 3.5)
    assert row["ratio"] == pytest.approx(4.5 / 5.0)
    # fold 0: (1.0 / 12) / (2.0 / 10); fold 1: (3.5 / 20) / (3.0 / 20)
    expected = ((1.0 / 12) / (2.0 / 10) + (3.5 / 20) / (3.0 / 20)) / 2
    assert row["per_iteration_ratio"] == pytest.approx(expected)
    assert (row["iterations_before"], row["iterations_after"]) == (30, 32)
    assert row["round_ratios"] == pytest.approx([5.0 / 6.0, 5.5 / 6.0])
    runs["after"][1] = runs["after"][1][:1]  # a fold missing from one round
    runs["after"][0] = runs["after"][0][:1]
    with pytest.raises(ValueError, match="after has folds"):
        bench_checkouts.summarise(runs, [0, 1])


@pytest.mark.shared_data
def test_bench_checkouts_runs_one_checkout_against_itself(
    bench_checkouts, shared_data_dir, tmp_path, capsys
):
    # The installed package's folder as both checkouts (in CI a
    # site-packages, here the repository): fresh worker processes fit seg's
    # fold 0 and report the same iterations for both.
    import skgpstruct

    root = str(Path(skgpstruct.__file__).resolve().parents[1])
    out = tmp_path / "ab.json"
    status = bench_checkouts.main([
        root, root, "--datasets", "seg", "--quick", "--data", str(shared_data_dir),
        "--out", str(out),
    ])
    assert status == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["dataset"] == "seg" and row["folds"] == [0]
    assert row["iterations_before"] == row["iterations_after"] == 5
    assert row["before"] > 0 and row["after"] > 0
    assert "| seg | 0 |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench_checkouts.main([str(tmp_path), root, "--quick"])  # no skgpstruct
