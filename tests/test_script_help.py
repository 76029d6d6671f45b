"""Every script's `--help` renders its flags' text as written: absl prints help strings verbatim, so a
`%%` (printf's escape) would reach the user as `%%`."""

import subprocess
import sys

import pytest
from conftest import SCRIPTS

SCRIPTS_WITH_FLAGS = sorted(p.name for p in SCRIPTS.glob("*.py") if "flags.DEFINE_" in p.read_text())


@pytest.mark.integration
@pytest.mark.parametrize("script", SCRIPTS_WITH_FLAGS)
def test_help_prints_percent_signs_once(script):
    run = subprocess.run(
        [sys.executable, str(SCRIPTS / script), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "flags:" in run.stdout, run.stderr[-2000:]
    assert "%%" not in run.stdout
