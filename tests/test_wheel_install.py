"""A user's install, end to end: the wheel built from this checkout, installed with its dependencies from
the package registry into a fresh venv (pinned by constraints.txt), every console script answering
`--help`, and the main job on the shipped demo model, all from a folder outside the checkout.

Slow (a fresh venv downloads or unpacks JAX and its stack; pip's cache makes reruns faster) and needs the
package registry, as CI has it."""

import os
import pathlib
import subprocess
import sys
import tomllib

import pytest
from conftest import project_copy

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def _run(command: list[str], cwd: pathlib.Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """`command` with the environment a user has: no PYTHONPATH pointing into the checkout."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def venv_bin(tmp_path_factory) -> pathlib.Path:
    """The bin/ folder of a fresh venv holding the wheel and its dependencies."""
    tmp = tmp_path_factory.mktemp("wheel_install")
    project = project_copy(tmp / "project")
    build = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp / "dist"), str(project)], tmp
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("oxygen_jax-*.whl")
    created = _run([sys.executable, "-m", "venv", str(tmp / "venv")], tmp)
    assert created.returncode == 0, created.stderr[-3000:]
    bin_dir = tmp / "venv" / "bin"
    install = [
        str(bin_dir / "python"),
        "-m",
        "pip",
        "install",
        "-q",
        "-c",
        str(ROOT / "constraints.txt"),
        str(wheel),
    ]
    installed = _run(install, tmp, timeout=1500)
    assert installed.returncode == 0, installed.stderr[-3000:]
    return bin_dir


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_console_script_answers_help(venv_bin, script, tmp_path):
    run = _run([str(venv_bin / script), "--help"], tmp_path)
    assert run.returncode in (0, 1), run.stderr[-3000:]  # absl's --help exits with 1 after the usage
    assert "flags:" in run.stdout and "Traceback" not in run.stderr, run.stderr[-3000:]


def test_the_main_job_runs_from_the_wheel(venv_bin, tmp_path):
    run = _run([str(venv_bin / "oxygen-run"), "--frames=2", f"--out={tmp_path / 'summary.json'}"], tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = (tmp_path / "summary.json").read_text()
    assert '"config": "pi05_demo"' in summary and '"subtask_exact_match"' in summary
    # The installed package ran, not the checkout.
    where = _run([str(venv_bin / "python"), "-c", "import oxygen_jax; print(oxygen_jax.__file__)"], tmp_path)
    assert pathlib.Path(where.stdout.strip()).is_relative_to(venv_bin.parent)
