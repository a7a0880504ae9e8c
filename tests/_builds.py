"""The builds of the compiled kernels that tests run on (see
``skgpstruct/_simd.py``)."""

import importlib

import pytest

from skgpstruct._cpu import has_avx2_fma


def compiled_builds(module):
    """``pytest.param`` of every build of the compiled ``module`` (``_chain``
    or ``_stacked``), with ids ``baseline`` and ``avx2``; the AVX2 one is
    skipped, with the reason, where it is not built or cannot run."""
    builds = [pytest.param(importlib.import_module(f"skgpstruct.{module}"),
                           id="baseline")]
    reason = None
    if not has_avx2_fma():
        reason = "this processor lacks AVX2 or FMA"
    else:
        try:
            avx2 = importlib.import_module(f"skgpstruct.{module}_avx2")
        except ImportError:
            reason = f"skgpstruct.{module}_avx2 is not built here"
    if reason is None:
        builds.append(pytest.param(avx2, id="avx2"))
    else:
        builds.append(pytest.param(None, id="avx2", marks=pytest.mark.skip(reason)))
    return builds
