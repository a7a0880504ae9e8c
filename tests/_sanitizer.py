"""Run a compiled module of the package under AddressSanitizer.

A wrong index in a compiled loop may write past the end of a buffer and
still return the right numbers (the h32a audit found four such mutants of
``_chain.pyx``), which no comparison of outputs can see. The
``sanitized_run`` helper below builds one ``.pyx`` of the repository with
``-fsanitize=address`` as ``<module>_asan``, runs a script that puts it in
place of the package's module, with libasan preloaded, and fails with
the sanitizer's report. It skips with the reason where Cython,
setuptools, gcc, libasan or the module's source is missing (an installed
package has only the compiled modules). A build takes 10 to 20 s.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

_SETUP = """
import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
ext = Extension(
    "{module}_asan", ["{module}_asan.pyx"], include_dirs=[np.get_include()],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    extra_compile_args=["-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer"],
    extra_link_args=["-fsanitize=address"],
)
setup(name="asan-build", ext_modules=cythonize([ext], language_level=3, quiet=True,
      compiler_directives={{"boundscheck": False, "wraparound": False,
                            "cdivision": True, "initializedcheck": False}}))
"""


def sanitized_run(tmp_path, module, exercise):
    """Build ``skgpstruct/<module>.pyx`` with AddressSanitizer and run
    ``exercise`` (Python source, which must print ``ok`` last) beside it.

    ``exercise`` imports ``<module>_asan`` (its folder is the working
    directory) and swaps it in for the package's module.
    """
    import skgpstruct

    pytest.importorskip("Cython", reason=f"builds {module}.pyx: needs Cython")
    pytest.importorskip("setuptools", reason=f"builds {module}.pyx: needs setuptools")
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    libasan = subprocess.run(
        ["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True
    ).stdout.strip()
    if not os.path.isabs(libasan) or not os.path.exists(libasan):
        pytest.skip("needs libasan")
    # The repository's source, else the package's own if it ships the .pyx.
    candidates = [
        Path(__file__).resolve().parents[1] / "skgpstruct" / f"{module}.pyx",
        Path(skgpstruct.__file__).parent / f"{module}.pyx",
    ]
    source = next((path for path in candidates if path.exists()), None)
    if source is None:
        pytest.skip(f"needs the source of skgpstruct/{module}.pyx")
    shutil.copy(source, tmp_path / f"{module}_asan.pyx")
    (tmp_path / "setup_asan.py").write_text(_SETUP.format(module=module))
    (tmp_path / "exercise.py").write_text(exercise)
    build = subprocess.run(
        [sys.executable, "setup_asan.py", "build_ext", "--inplace", "-q"],
        cwd=tmp_path, capture_output=True, text=True,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    env = dict(os.environ, LD_PRELOAD=libasan, ASAN_OPTIONS="detect_leaks=0")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(skgpstruct.__file__).parents[1]), env.get("PYTHONPATH", "")]
    )
    run = subprocess.run(
        [sys.executable, "exercise.py"], cwd=tmp_path, env=env,
        capture_output=True, text=True,
    )
    lines = run.stdout.strip().splitlines()
    assert run.returncode == 0 and lines[-1:] == ["ok"], run.stderr[-3000:]
