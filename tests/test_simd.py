"""The two builds of the compiled kernels (``skgpstruct/_simd.py``).

Each build is checked against the references on its own in test_chain.py
and test_inference.py (their kernel tests run on both). Here: which build
a process loads, and that whole fits and predictions agree between them.
"""

import importlib.util
import os
import platform
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from _builds import compiled_builds

from skgpstruct import GPStructClassifier, chain
from skgpstruct._cpu import has_avx2_fma
from skgpstruct.datasets import make_sequences
from skgpstruct.inference import terms

_REPORT = (
    "from skgpstruct import chain; from skgpstruct.inference import terms; "
    "print(chain.KERNEL_BUILD, chain._chain.__name__, "
    "terms.stacked_kernels.__name__)"
)


def _run(choice, cwd):
    # cwd: away from a source checkout, whose uncompiled package would
    # shadow the installed one (python -c puts the working directory first)
    env = dict(os.environ)
    env.pop("SKGPSTRUCT_SIMD", None)
    if choice is not None:
        env["SKGPSTRUCT_SIMD"] = choice
    return subprocess.run(
        [sys.executable, "-c", _REPORT], env=env, cwd=cwd, capture_output=True,
        text=True,
    )


def _avx2_runs_here():
    return all(build.values[0] is not None for build in (
        compiled_builds("_chain")[1], compiled_builds("_stacked")[1]))


def test_the_processor_check_agrees_with_the_kernel_s_cpu_flags():
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        pytest.skip("needs /proc/cpuinfo (Linux)")
    flags = set()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    # Linux lists avx2 only where the kernel enabled the 256-bit state.
    assert has_avx2_fma() == ({"avx2", "fma"} <= flags)


def test_the_avx2_build_is_installed_on_x86_64():
    # setup.py builds it on x86-64 except on Windows (MSVC's flags differ)
    # and with SKGPSTRUCT_BUILD_AVX2=0; a packaging slip that drops it would
    # otherwise only show as skipped AVX2 tests.
    if platform.machine().lower() not in ("x86_64", "amd64") or sys.platform == "win32":
        pytest.skip("setup.py builds the AVX2 modules on x86-64 only")
    if os.environ.get("SKGPSTRUCT_BUILD_AVX2", "1").strip() == "0":
        pytest.skip("built with SKGPSTRUCT_BUILD_AVX2=0")
    for name in ("_chain", "_stacked"):
        assert importlib.util.find_spec(f"skgpstruct.{name}_avx2") is not None, name


def test_baseline_is_loaded_when_asked_for(tmp_path):
    run = _run("baseline", tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [
        "baseline", "skgpstruct._chain", "skgpstruct._stacked"]


@pytest.mark.parametrize("choice", [None, "auto", " AVX2 "])
def test_auto_and_avx2_load_the_avx2_build_where_it_runs(choice, tmp_path):
    run = _run(choice, tmp_path)
    if _avx2_runs_here():
        assert run.returncode == 0, run.stderr
        assert run.stdout.split() == [
            "avx2", "skgpstruct._chain_avx2", "skgpstruct._stacked_avx2"]
    elif choice in (None, "auto"):
        assert run.returncode == 0, run.stderr
        assert run.stdout.split()[0] == "baseline"
    else:
        assert run.returncode != 0
        assert "SKGPSTRUCT_SIMD=avx2, but" in run.stderr


def test_forward_backward_runs_the_avx2_build_from_eight_labels_on():
    # The rule of skgpstruct/chain.py (from benchmarks/bench_builds.py):
    # Viterbi, the path scores and forward-backward below 8 labels run the
    # baseline build, forward-backward from 8 labels on the loaded one.
    import skgpstruct._chain

    assert chain._baseline_chain is skgpstruct._chain
    assert chain.FB_AVX2_MIN_LABELS == 8
    assert chain._fb_kernels(7) is skgpstruct._chain
    assert chain._fb_kernels(8) is chain._chain
    expected = {"avx2": "skgpstruct._chain_avx2", "baseline": "skgpstruct._chain"}
    assert chain._chain.__name__ == expected[chain.KERNEL_BUILD]


def test_viterbi_runs_the_avx2_build_from_its_column_step_on():
    # Viterbi's row-wise step runs the baseline build, its column-wise step
    # (from VITERBI_COLUMNS_FROM labels on) the loaded one.
    import skgpstruct._chain

    columns_from = skgpstruct._chain.VITERBI_COLUMNS_FROM
    assert columns_from == 10
    assert chain._viterbi_kernels(columns_from - 1) is skgpstruct._chain
    assert chain._viterbi_kernels(columns_from) is chain._chain


@pytest.mark.parametrize("n_labels", [3, 12, 45])
def test_both_builds_decode_to_the_same_bits(n_labels):
    # Viterbi only adds and compares: no step rounds differently in the
    # AVX2 build (no fused multiply-add), so either build may decode.
    builds = [p.values[0] for p in compiled_builds("_chain")]
    if builds[1] is None:
        pytest.skip("the AVX2 build cannot run here")
    rng = np.random.default_rng(n_labels)
    offsets = np.array([0, 40, 41, 41, 90], dtype=np.int64)
    unary = rng.standard_normal((90, n_labels)) * 5
    pairwise = rng.standard_normal((n_labels, n_labels))
    decoded = []
    for build in builds:
        for by_columns in (False, True):
            labels, scores = np.zeros(90, np.int64), np.zeros(4)
            backpointers = np.empty((48, n_labels), np.int32)
            build.viterbi(unary, pairwise, offsets, labels, scores, backpointers,
                          by_columns)
            decoded.append((labels, scores))
    for labels, scores in decoded[1:]:
        np.testing.assert_array_equal(labels, decoded[0][0])
        np.testing.assert_array_equal(scores, decoded[0][1])


def test_an_unknown_choice_is_refused_naming_the_variable(tmp_path):
    run = _run("avx512", tmp_path)
    assert run.returncode != 0
    assert (
        "the environment variable SKGPSTRUCT_SIMD must be one of 'auto', "
        "'baseline', 'avx2' (or unset); got 'avx512'" in run.stderr
    )


@pytest.fixture
def use_build(monkeypatch):
    """``use_build(i)``: build ``i`` (0 baseline, 1 AVX2) of both modules."""
    chains, stackeds = compiled_builds("_chain"), compiled_builds("_stacked")

    def use(i):
        if chains[i].values[0] is None or stackeds[i].values[0] is None:
            pytest.skip("the AVX2 build cannot run here")
        monkeypatch.setattr(chain, "_chain", chains[i].values[0])
        monkeypatch.setattr(chain, "_baseline_chain", chains[i].values[0])
        monkeypatch.setattr(terms, "stacked_kernels", stackeds[i].values[0])

    return use


@pytest.mark.parametrize("optimizer", ["lbfgs", "stochastic"])
def test_both_builds_fit_the_same_model_to_rounding(use_build, optimizer):
    # A few iterations from the same start: the builds differ at rounding
    # level only (fused multiply-adds, the order of vectorised sums; the
    # unary samples are single precision, about 1e-7 an entry), so the
    # fitted parameters, ELBO and marginals agree far below any effect
    # (parameters near 0 to 1e-8: single precision's rounding at the
    # scale of the others, about 1).
    X, y = make_sequences(40, n_features=10, sparse=True, random_state=3)
    fits = []
    for i in (0, 1):
        use_build(i)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # not converged in 4 iterations
            model = GPStructClassifier(
                optimizer=optimizer, max_iter=4, random_state=0).fit(X, y)
        fits.append((model, model.predict_marginals(X[:10])))
    (base, base_marginals), (avx2, avx2_marginals) = fits
    assert base.n_iter_ == avx2.n_iter_
    np.testing.assert_allclose(avx2.elbo_history_, base.elbo_history_, rtol=1e-6)
    for name in ("q_mu_", "q_sqrt_", "pairwise_mean_", "pairwise_std_"):
        np.testing.assert_allclose(
            getattr(avx2, name), getattr(base, name), rtol=1e-6, atol=1e-8,
            err_msg=name)
    for got, expected in zip(avx2_marginals, base_marginals, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-9)
    # and the builds are not the same code (else this test checks nothing)
    assert not np.array_equal(avx2.q_mu_, base.q_mu_)
