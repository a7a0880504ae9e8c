"""The builds of the compiled kernels that tests run on (see
``skgpstruct/_simd.py``)."""

import importlib

import pytest

from skgpstruct._simd import avx2_modules


def compiled_builds(module):
    """``pytest.param`` of every build of the compiled ``module`` (``_chain``
    or ``_stacked``), with ids ``baseline`` and ``avx2``; the AVX2 one is
    skipped, with the reason, where it is not built or cannot run."""
    baseline = pytest.param(importlib.import_module(f"skgpstruct.{module}"),
                            id="baseline")
    modules, reason = avx2_modules()
    if modules is None:
        return [baseline,
                pytest.param(None, id="avx2", marks=pytest.mark.skip(reason))]
    return [baseline, pytest.param(modules[module], id="avx2")]
