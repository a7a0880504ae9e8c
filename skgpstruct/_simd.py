"""Which build of the compiled kernels this process runs.

Where the package is built for x86-64 (except with MSVC), the two hottest
compiled modules, ``_chain`` (forward-backward, Viterbi) and ``_stacked``
(the stacked unary potentials and their gradients), are compiled twice
from the same source: for the baseline instruction set, and as
``<module>_avx2`` with AVX2 and FMA. The AVX2 build is loaded where the
processor and the operating system support those instructions, so one
built package runs on every x86-64 processor and uses the wider vectors
where it can. ``skgpstruct.chain`` takes only forward-backward at 8 labels
or more from it: there the AVX2 code was faster, and for Viterbi and
fewer labels slower (``benchmarks/bench_builds.py``), so those run the
baseline build everywhere (:func:`baseline_kernels`).

The two builds compute the same functions; their results differ at
rounding level (a fused multiply-add rounds once where the baseline
rounds twice, and vectorised sums run in another order). Within a
process, and between the processes of a machine, every computation uses
the same build, so a fit with a given ``random_state`` is reproducible
whatever ``n_jobs`` or joblib backend. On a dask cluster whose machines
differ, set ``SKGPSTRUCT_SIMD=baseline`` on every worker (and the
client) for results identical to the last bit everywhere.

The environment variable ``SKGPSTRUCT_SIMD``, read once at import:

``auto`` (or unset)
    the AVX2 build where it is built and supported, else the baseline;
``baseline``
    the baseline build always;
``avx2``
    the AVX2 build, and an ImportError where it is not built or the
    processor does not support it.
"""

import importlib
import os

from ._cpu import has_avx2_fma

ENVIRONMENT_VARIABLE = "SKGPSTRUCT_SIMD"
CHOICES = ("auto", "baseline", "avx2")
#: The modules compiled in two builds.
DISPATCHED = ("_chain", "_stacked")


def baseline_kernels(name):
    """The baseline build of ``name``, for the functions whose AVX2 code is
    slower (see ``skgpstruct/chain.py``)."""
    return importlib.import_module(f"{__package__}.{name}")


def _requested():
    value = os.environ.get(ENVIRONMENT_VARIABLE, "auto")
    choice = value.strip().lower() or "auto"
    if choice not in CHOICES:
        raise ValueError(
            f"the environment variable {ENVIRONMENT_VARIABLE} must be one of "
            f"{', '.join(map(repr, CHOICES))} (or unset); got {value!r}"
        )
    return choice


def avx2_modules():
    """``(modules, None)``: the AVX2 builds of :data:`DISPATCHED` by name, or
    ``(None, reason)`` where they cannot run here (also what the tests and
    ``benchmarks/bench_builds.py`` ask)."""
    if not has_avx2_fma():
        return None, "this processor (or its operating system) lacks AVX2 or FMA"
    try:
        modules = {
            name: importlib.import_module(f"{__package__}.{name}_avx2")
            for name in DISPATCHED
        }
    except ImportError as error:
        return None, f"the AVX2 build is not installed ({error})"
    return modules, None


def _load():
    choice = _requested()
    if choice != "baseline":
        modules, reason = avx2_modules()
        if modules is not None:
            return "avx2", modules
        if choice == "avx2":
            raise ImportError(
                f"{ENVIRONMENT_VARIABLE}=avx2, but {reason}; unset it or set "
                f"{ENVIRONMENT_VARIABLE}=baseline"
            )
    return "baseline", {name: baseline_kernels(name) for name in DISPATCHED}


#: ``"avx2"`` or ``"baseline"``: the build this process loaded.
KERNEL_BUILD, _MODULES = _load()


def kernels(name):
    """The loaded build of the compiled module ``name`` (one of
    :data:`DISPATCHED`)."""
    return _MODULES[name]
