"""The documentation builds without warnings, and the docstring examples run.

The Sphinx build is skipped (with the reason) when Sphinx or numpydoc is not
installed: ``python -m pip install ".[docs]"``. The doctests run always,
except those of :mod:`skgpstruct.plotting`, which need matplotlib. Every
public name (the ``__all__`` of the modules in ``doc/api.rst``) must have an
``Examples`` section with at least one example.
"""

import doctest
import importlib
import inspect
import pkgutil
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from sklearn.exceptions import ConvergenceWarning

import skgpstruct

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


#: Modules of the API reference (doc/api.rst): every name in their
#: ``__all__`` needs an example. ``inference`` and ``optim`` are internal.
API_MODULES = [
    "skgpstruct",
    "skgpstruct.chain",
    "skgpstruct.cli",
    "skgpstruct.datasets",
    "skgpstruct.features",
    "skgpstruct.io",
    "skgpstruct.kernels",
    "skgpstruct.likelihoods",
    "skgpstruct.metrics",
    "skgpstruct.plotting",
]

_EXAMPLES_HEADING = re.compile(r"^Examples\n-{8,}\n", re.MULTILINE)
_NEXT_HEADING = re.compile(r"^\S[^\n]*\n-{3,}\n", re.MULTILINE)


def _examples_section(docstring):
    """The doctest examples of a docstring's ``Examples`` section."""
    if not docstring:
        return []
    text = inspect.cleandoc(docstring)
    match = _EXAMPLES_HEADING.search(text)
    if match is None:
        return []
    section = text[match.end():]
    following = _NEXT_HEADING.search(section)
    if following is not None:
        section = section[: following.start()]
    return doctest.DocTestParser().get_examples(section)


def _own_docstring(obj):
    """The docstring written for ``obj`` itself (never an inherited one)."""
    if inspect.isclass(obj):
        return obj.__dict__.get("__doc__")
    return obj.__doc__


def test_examples_parser_finds_sections():
    documented = """Summary.

    Examples
    --------
    >>> 1 + 1
    2

    Notes
    -----
    >>> "not an example of the Examples section"
    """
    assert len(_examples_section(documented)) == 1
    assert _examples_section("Summary.\n\n>>> 1 + 1\n2\n") == []
    assert _examples_section(None) == []


@pytest.mark.parametrize("module_name", API_MODULES)
def test_public_names_have_examples(module_name):
    """Functions and classes need their own example; data (dicts of
    scorers or kernels, scorer objects), which cannot carry a docstring,
    must appear in an example of the module docstring."""
    module = importlib.import_module(module_name)
    module_examples = "\n".join(
        example.source for example in _examples_section(module.__doc__)
    )
    missing = []
    for name in module.__all__:
        if name.startswith("__"):  # __version__
            continue
        obj = getattr(module, name)
        if inspect.isclass(obj) or inspect.isroutine(obj):
            if not _examples_section(_own_docstring(obj)):
                missing.append(name)
        elif not re.search(rf"\b{re.escape(name)}\b", module_examples):
            missing.append(f"{name} (data: use it in the module's Examples)")
    assert not missing, (
        f"public names of {module_name} without an Examples section: {missing}"
    )


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
        # An example must show a fit that converges (pick parameters that do,
        # or show only shapes): a ConvergenceWarning fails the example.
        warnings.simplefilter("error", ConvergenceWarning)
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
    # conf.py puts its parent (the copy's) on sys.path; put the directory of
    # the package these tests import (installed or built in place) first.
    env_path = str(Path(skgpstruct.__file__).resolve().parents[1])
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
