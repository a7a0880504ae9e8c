"""Build the compiled modules (chain, stacked potentials, whole vectors, the
block cache, chunk layouts, collapsed sampling designs and the CPU check),
and on x86-64 an AVX2 build of the chain and stacked-potential kernels.

The metadata is in pyproject.toml.
"""

import os
import platform
import sys

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

BASELINE = (
    "skgpstruct._chain",
    "skgpstruct._stacked",
    "skgpstruct._vectors",
    "skgpstruct._block_cache",
    "skgpstruct._layout",
    "skgpstruct._cpu",
)
# Built a second time with AVX2 and FMA; skgpstruct._simd picks the build
# at import from what the processor supports.
DISPATCHED = ("skgpstruct._chain", "skgpstruct._stacked")
AVX2_FLAGS = ["-mavx2", "-mfma"]


def builds_avx2():
    """x86-64 with a GCC-style compiler, unless SKGPSTRUCT_BUILD_AVX2=0."""
    wanted = os.environ.get("SKGPSTRUCT_BUILD_AVX2", "1").strip()
    if wanted not in ("0", "1"):
        raise SystemExit(
            f"SKGPSTRUCT_BUILD_AVX2 must be 0 or 1, got {wanted!r}"
        )
    return (
        wanted == "1"
        and platform.machine().lower() in ("x86_64", "amd64")
        and sys.platform != "win32"
    )


def extension(name, source, flags=()):
    return Extension(
        name,
        [source.replace(".", "/") + ".pyx"],
        include_dirs=[np.get_include()],
        define_macros=[
            ("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"),
            # the data memory handlers (NEP 49) of skgpstruct._block_cache
            ("NPY_TARGET_VERSION", "NPY_1_22_API_VERSION"),
        ],
        # -fno-trapping-math: no code here reads or traps on floating-point
        # exceptions, and without it GCC keeps the selects of branch-free
        # loops (_chain's exponentials) as branches, unvectorised.
        extra_compile_args=["-O3", "-fno-math-errno", "-fno-trapping-math", *flags],
    )


extensions = [extension(name, name) for name in BASELINE]
if builds_avx2():
    # <module>_avx2.pyx includes <module>.pyx: the same code, other flags.
    extensions += [
        extension(name + "_avx2", name + "_avx2", AVX2_FLAGS) for name in DISPATCHED
    ]

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives={
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    )
)
