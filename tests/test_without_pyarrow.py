"""pyarrow is the `train` extra: the tools that never read or write a LeRobot folder run without it, and
those that do stop with one line naming the extra."""

import os
import subprocess
import sys

import pytest
from conftest import ROOT, SCRIPTS

from oxygen_jax.lerobot import arrow
from oxygen_jax.lerobot.reader import LeRobotDataset
from oxygen_jax.lerobot.writer import LeRobotWriter

# Makes `import pyarrow` fail in the script's interpreter, as it does where the extra is not installed.
BLOCK_PYARROW = "import sys\nsys.modules['pyarrow'] = None\nsys.modules['pyarrow.parquet'] = None\n"
INSTALL_LINE = "error: LeRobot datasets are parquet files"


@pytest.fixture
def without_pyarrow(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)


def test_opening_a_dataset_without_pyarrow_names_the_extra(without_pyarrow, tmp_path):
    with pytest.raises(arrow.MissingPyarrowError, match=r"pip install 'oxygen_jax\[train\]'"):
        LeRobotDataset(tmp_path)


def test_starting_a_recording_without_pyarrow_names_the_extra_and_writes_nothing(without_pyarrow, tmp_path):
    with pytest.raises(arrow.MissingPyarrowError, match=r"pip install 'oxygen_jax\[train\]'"):
        LeRobotWriter(tmp_path / "data", fps=10)
    assert not (tmp_path / "data").exists()


def _script_without_pyarrow(tmp_path, script: str, *flags: str) -> subprocess.CompletedProcess:
    """`scripts/<script>` run as a user runs it, with a `sitecustomize` that blocks pyarrow."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_PYARROW)
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    command = [sys.executable, str(SCRIPTS / script), *flags]
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run(
        command, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env, check=False
    )


@pytest.mark.integration
def test_train_help_runs_without_pyarrow(tmp_path):
    run = _script_without_pyarrow(tmp_path, "train.py", "--help")
    assert run.stderr == ""  # absl's --help exits with status 1 after printing the usage
    assert "eval_only: Table demo configs" in run.stdout


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_train_eval_only_scores_the_demo_model_without_pyarrow(tmp_path):
    run = _script_without_pyarrow(
        tmp_path, "train.py", "--config=pi05_demo", "--eval_only", "--episodes=1", f"--out={tmp_path}"
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "demo_eval.json").is_file()


@pytest.mark.integration
def test_make_demo_dataset_without_pyarrow_fails_with_one_line_naming_the_extra(tmp_path):
    run = _script_without_pyarrow(
        tmp_path, "make_demo_dataset.py", f"--out={tmp_path / 'data'}", "--episodes=1"
    )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1].startswith(INSTALL_LINE)
    assert "Traceback" not in run.stderr and "pip install 'oxygen_jax[train]'" in run.stderr
    assert not (tmp_path / "data").exists()
