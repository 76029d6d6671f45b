"""Every tool's `--help` renders its flags' text as written: absl prints help strings verbatim, so a
`%%` (printf's escape) would reach the user as `%%`. The tools run as `python -m oxygen_jax.tools.<tool>`
(what the console scripts call); the checkout's remaining scripts run by path."""

import subprocess
import sys

import pytest
from conftest import ROOT, SCRIPTS

# Every module of tools/ is a tool run as `python -m`, except cli.py: the helper they share.
TOOLS = sorted(
    p.stem for p in (ROOT / "src" / "oxygen_jax" / "tools").glob("*.py") if p.stem not in {"__init__", "cli"}
)
SCRIPTS_WITH_FLAGS = sorted(p.name for p in SCRIPTS.glob("*.py") if "flags.DEFINE_" in p.read_text())
COMMANDS = [["-m", f"oxygen_jax.tools.{tool}"] for tool in TOOLS]
COMMANDS += [[str(SCRIPTS / script)] for script in SCRIPTS_WITH_FLAGS]


@pytest.mark.integration
@pytest.mark.parametrize("command", COMMANDS, ids=TOOLS + SCRIPTS_WITH_FLAGS)
def test_help_prints_percent_signs_once(command):
    run = subprocess.run(
        [sys.executable, *command, "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    assert "flags:" in run.stdout, run.stderr[-2000:]
    assert "%%" not in run.stdout
