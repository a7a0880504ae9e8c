"""Build the compiled modules (chain, stacked potentials, whole vectors, the
block cache, chunk layouts and collapsed sampling designs).

The metadata is in pyproject.toml.
"""

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension(
        name,
        [name.replace(".", "/") + ".pyx"],
        include_dirs=[np.get_include()],
        define_macros=[
            ("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"),
            # the data memory handlers (NEP 49) of skgpstruct._block_cache
            ("NPY_TARGET_VERSION", "NPY_1_22_API_VERSION"),
        ],
        extra_compile_args=["-O3", "-fno-math-errno"],
    )
    for name in (
        "skgpstruct._chain",
        "skgpstruct._stacked",
        "skgpstruct._vectors",
        "skgpstruct._block_cache",
        "skgpstruct._layout",
    )
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
