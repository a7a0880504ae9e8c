"""The command line, run as a user runs it: ``python -m skgpstruct``."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import skgpstruct
from skgpstruct.cli import main

_ACCURACY_LINE = re.compile(
    r"^\s*(GPStructClassifier|LogisticRegression)\s+accuracy\s+([0-9.]+)\s+"
    r"fit\s+([0-9.]+) s",
    re.MULTILINE,
)


def _run(*args, timeout=120):
    """Run ``python -m skgpstruct *args``; return the CompletedProcess.

    The child must import the package the tests import: prepend the
    directory holding it to PYTHONPATH (a source checkout, where the package
    is not installed; harmless when it is pip-installed).
    """
    env = dict(os.environ)
    package_root = str(Path(skgpstruct.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [package_root, env.get("PYTHONPATH")] if p
    )
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return subprocess.run(
        [sys.executable, "-m", "skgpstruct", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


def _accuracies(stdout):
    return {name: (float(acc), float(t)) for name, acc, t in
            _ACCURACY_LINE.findall(stdout)}


def test_demo_runs_and_reports_accuracies():
    result = _run("demo", "--n-sequences", "20", "--n-inducing", "30",
                  "--max-iter", "15", "--random-state", "1")
    assert result.returncode == 0, result.stderr
    scores = _accuracies(result.stdout)
    assert set(scores) == {"GPStructClassifier", "LogisticRegression"}, (
        result.stdout
    )
    for accuracy, fit_time in scores.values():
        assert 0.0 <= accuracy <= 1.0
        assert fit_time >= 0.0
    assert re.search(r"^iteration\s+1\s+ELBO", result.stdout, re.MULTILINE)
    assert "marginals" in result.stdout


def test_demo_quiet_hides_progress():
    result = _run("demo", "-q", "--n-sequences", "10", "--n-inducing", "10",
                  "--max-iter", "3")
    assert result.returncode == 0, result.stderr
    assert not re.search(r"^iteration\s", result.stdout, re.MULTILINE)
    assert len(_accuracies(result.stdout)) == 2


def test_unknown_command_prints_usage():
    result = _run("no-such-command")
    assert result.returncode != 0
    assert "usage:" in result.stderr
    assert "no-such-command" in result.stderr


def test_missing_command_prints_usage():
    result = _run()
    assert result.returncode != 0
    assert "usage:" in result.stderr


@pytest.mark.parametrize(
    "args", [["demo", "--n-sequences", "0"], ["demo", "--n-sequences", "many"],
             ["demo", "--no-such-option"]],
)
def test_bad_demo_options_exit_with_usage(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage: skgpstruct demo" in err


def test_help_lists_demo(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "demo" in capsys.readouterr().out
