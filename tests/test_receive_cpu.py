"""`scripts/receive_cpu.py` end to end, small: it measures a server that refused every message."""

import re
import subprocess
import sys

import pytest
from conftest import SCRIPTS


@pytest.mark.integration
def test_it_reports_the_servers_cpu_per_refused_message():
    small = ["--mb=0.5", "--rounds=2", "--connections=2", "--servers=2"]
    run = subprocess.run(
        [sys.executable, str(SCRIPTS / "receive_cpu.py"), *small],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "2 at once, answered ['Bad request: undecodable msgpack-numpy message" in run.stdout
    per_server = re.search(r"server CPU ms per message: \[(.*)\]", run.stdout).group(1).split(", ")
    assert len(per_server) == 2 and all(float(ms) >= 0 for ms in per_server)
    assert re.search(r"median \d+\.\d ms", run.stdout)
