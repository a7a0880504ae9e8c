"""The documentation builds without warnings, and the docstring examples run.

The Sphinx build is skipped (with the reason) when Sphinx or numpydoc is not
installed: ``python -m pip install ".[docs]"``. The doctests run always,
except those of :mod:`skgpstruct.plotting`, which need matplotlib.
"""

import doctest
import importlib
import pkgutil
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from sklearn.exceptions import ConvergenceWarning

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "doc"

def _package_modules():
    """Every module of the package, so that no docstring example is missed."""
    import skgpstruct

    names = ["skgpstruct"]
    for info in pkgutil.walk_packages(skgpstruct.__path__, "skgpstruct."):
        if info.name != "skgpstruct.__main__":
            names.append(info.name)
    return sorted(names)


#: Modules whose docstring examples are run.
PUBLIC_MODULES = _package_modules()


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_docstring_examples(module_name):
    if module_name == "skgpstruct.plotting":
        matplotlib = pytest.importorskip(
            "matplotlib", reason="plotting doctests need matplotlib (plot extra)"
        )
        matplotlib.use("Agg")
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    with warnings.catch_warnings():
        # An example that fits with a small max_iter to stay quick may stop
        # before the convergence rule; that is not a failure of the example.
        warnings.simplefilter("ignore", ConvergenceWarning)
        for test in finder.find(module, module_name):
            runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed"
    if module_name == "skgpstruct.plotting":
        import matplotlib.pyplot as plt

        plt.close("all")


def test_sphinx_build_has_no_warnings(tmp_path):
    pytest.importorskip("sphinx", reason="needs Sphinx (docs extra)")
    pytest.importorskip("numpydoc", reason="needs numpydoc (docs extra)")
    # Build from a copy: autosummary writes its stub pages into the source.
    source = tmp_path / "doc"
    shutil.copytree(DOC, source, ignore=shutil.ignore_patterns("_build", "generated"))
    # The examples page includes ../examples/*.py.
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    # conf.py puts its parent (the copy's) on sys.path; point it at the repo.
    env_path = str(REPO)
    result = subprocess.run(
        [
            sys.executable, "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); "
            "from sphinx.cmd.build import main; "
            "sys.exit(main(sys.argv[2:]))",
            env_path, "-W", "--keep-going", "-q", "-b", "html",
            str(source), str(tmp_path / "html"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, (
        f"sphinx-build -W failed:\n{result.stdout}\n{result.stderr}"
    )
    assert (tmp_path / "html" / "index.html").is_file()
    assert (tmp_path / "html" / "generated" / "skgpstruct.GPStructClassifier.html"
            ).is_file()
