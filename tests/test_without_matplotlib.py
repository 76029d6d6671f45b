"""matplotlib is the `plot` extra (pulled by `train` and `benchmark`): inference, serving and the main job
run without it, it is imported only when a plot is drawn, and a tool that will plot says so in one line
before it starts."""

import os
import subprocess
import sys

import pytest
from conftest import SCRIPTS

from oxygen_jax import plotting

# Makes `import matplotlib` fail in a fresh interpreter, as it does where the extra is not installed.
BLOCK_MATPLOTLIB = "import sys\nsys.modules['matplotlib'] = None\nsys.modules['matplotlib.pyplot'] = None\n"


def test_drawing_a_plot_without_matplotlib_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(plotting.MissingMatplotlibError, match=r'pip install "oxygen_jax\[plot\]"'):
        plotting.pyplot()


def _without_matplotlib(tmp_path, *command: str) -> subprocess.CompletedProcess:
    """`command` run by this Python with a `sitecustomize` that blocks matplotlib."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCK_MATPLOTLIB)
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, *command], capture_output=True, text=True, timeout=300, env=env, check=False
    )


def test_the_modules_that_plot_import_without_matplotlib(tmp_path):
    modules = (
        "oxygen_jax.training.loop",
        "oxygen_jax.benchmarks.plots",
        "oxygen_jax.evaluation.closed_loop_sweep",
        "oxygen_jax.tools.benchmark",
    )
    run = _without_matplotlib(tmp_path, "-c", "; ".join(f"import {m}" for m in modules) + "; print('ok')")
    assert run.returncode == 0 and run.stdout == "ok\n", run.stderr[-3000:]


def test_training_without_matplotlib_stops_first_with_one_line(tmp_path):
    run = _without_matplotlib(
        tmp_path,
        str(SCRIPTS / "train.py"),
        "--config=pi05_tiny",
        "--synthetic",
        f"--run_dir={tmp_path / 'run'}",
    )
    assert run.returncode == 2, run.stderr[-3000:]
    assert run.stderr.splitlines() == [
        "error: plotting the training loss (RUN/loss.png) needs the matplotlib package",
        '  fix: install it: pip install "oxygen_jax[train]"',
    ]
    assert not (tmp_path / "run").exists()


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_the_main_job_runs_without_matplotlib(tmp_path):
    run = _without_matplotlib(tmp_path, str(SCRIPTS / "run.py"), "--frames=2")
    assert run.returncode == 0, run.stderr[-3000:]
    assert '"subtask_exact_match"' in run.stdout
