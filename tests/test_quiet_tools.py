"""Tools are quiet by default: libraries log at WARNING unless `--verbosity` asks for more, and restoring a
checkpoint without orbax's per-step metadata file (every openpi checkpoint, the shipped demo model) warns
about nothing."""

import logging
import re
import subprocess
import sys

import pytest
from conftest import SCRIPTS, serve_script

from oxygen_jax import checkpoints, config

# absl's prefix of an INFO record: `I1202 17:26:00.851560 ...`.
INFO_LINE = re.compile(r"^I\d{4} ", re.MULTILINE)


def test_restoring_the_shipped_demo_model_logs_no_warning(caplog):
    demo = config.checkpoint_for(config.load_config("pi05_demo"), None)
    with caplog.at_level(logging.WARNING):
        params = checkpoints.restore_params(demo)
    assert params  # restored, not skipped
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def _run_demo(*flags: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPTS / "run.py"), "--config=pi05_demo", "--frames=2", *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_run_prints_no_library_info_and_no_checkpoint_warning_by_default():
    run = _run_demo()
    assert run.returncode == 0, run.stderr[-3000:]
    assert INFO_LINE.findall(run.stderr) == []
    assert "_CHECKPOINT_METADATA" not in run.stderr and "orbax" not in run.stderr


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_verbosity_zero_brings_the_info_lines_back():
    run = _run_demo("--verbosity=0")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "restored params from" in run.stderr and INFO_LINE.search(run.stderr)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_server_logs_where_it_listens_and_no_library_info(tmp_path):
    with serve_script(tmp_path) as (_, port):
        pass
    log = (tmp_path / f"serve_{port}.log").read_text()
    assert f"Serving policy on ws://0.0.0.0:{port}" in log  # the server's own events stay at INFO
    info = [line for line in log.splitlines() if INFO_LINE.match(line)]
    assert info and all("websocket_server.py" in line for line in info), info
    assert "_CHECKPOINT_METADATA" not in log
