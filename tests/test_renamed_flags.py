"""Flags renamed so that one idea has one name (docs/cli.md) keep their old name for a while: it still
works, with one warning line, and giving both names is a one-line error."""

import json
import subprocess
import sys

import pytest
from conftest import SCRIPTS

WARNING = "warning: --{old} is deprecated here: use --{new}"


def _script(name: str, *flags: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPTS / f"{name}.py"), *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


def test_make_demo_dataset_scenes_is_episodes_with_a_warning(tmp_path):
    run = _script("make_demo_dataset", f"--out={tmp_path / 'data'}", "--scenes=2")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stderr.splitlines()[0] == WARNING.format(old="scenes", new="episodes")  # then the bar
    info = json.loads((tmp_path / "data" / "meta" / "info.json").read_text())
    assert info["total_episodes"] == 2


def test_giving_a_flag_and_its_old_name_is_one_line(tmp_path):
    run = _script("make_demo_dataset", f"--out={tmp_path / 'data'}", "--scenes=2", "--episodes=3")
    assert run.returncode == 2
    assert run.stderr.strip() == "error: give --episodes only (--scenes is its deprecated name)"
    assert not (tmp_path / "data").exists()


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_train_num_steps_is_train_steps_with_a_warning(tmp_path):
    run = _script(
        "train",
        "--config=pi05_tiny",
        "--synthetic",
        f"--run_dir={tmp_path / 'run'}",
        "--num_steps=2",
        "--config.training.batch_size=2",
        "--config.training.log_interval=1",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert WARNING.format(old="num_steps", new="train_steps") in run.stderr.splitlines()
    steps = [
        json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == [1, 2]
