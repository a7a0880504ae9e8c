"""The example scripts of ``examples/`` run to the end on the shared data.

Each runs as a user runs it (``python examples/<name>.py``), in a child
process, with its figures written to a temporary folder. An example that
crashed went unnoticed: ``plot_marginals_and_elbo.py`` stopped before its
reliability diagram when the test sentences had a label the training ones
lacked.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import skgpstruct

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
#: Examples that read CRF++'s chunking data (``--data``).
READS_CHUNKING = {
    "plot_crfpp_gridsearch", "plot_marginals_and_elbo", "plot_token_dicts",
}


@pytest.mark.shared_data
@pytest.mark.parametrize("name", sorted(p.stem for p in EXAMPLES.glob("plot_*.py")))
def test_example_runs(name, shared_data_dir, tmp_path):
    pytest.importorskip("matplotlib", reason="the examples draw (plot extra)")
    args = [sys.executable, str(EXAMPLES / f"{name}.py"), "--out", str(tmp_path)]
    if name in READS_CHUNKING:
        args += ["--data", str(shared_data_dir / "crfpp" / "chunking")]
    env = dict(os.environ, MPLBACKEND="Agg", OPENBLAS_NUM_THREADS="1")
    package_root = str(Path(skgpstruct.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [package_root, env.get("PYTHONPATH")] if p
    )
    result = subprocess.run(args, capture_output=True, text=True, env=env,
                            timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert list(tmp_path.glob("*.png")), "no figure written"
