"""`scripts/run.py`'s summary agrees with what the run showed: the stream it ran on, the frames its bar
counted, and how many of the finished requests it printed."""

import json
import re
import subprocess
import sys

import pytest
from conftest import SCRIPTS


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_demo_run_summary_names_table_scenes_and_counts_the_bars_frames(tmp_path):
    out = tmp_path / "summary.json"
    command = [sys.executable, str(SCRIPTS / "run.py"), "--frames=4", "--print_text=2", f"--out={out}"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=280, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["layout"] == "table"  # pi05_demo runs on rendered table scenes, not a LIBERO layout
    bar = re.findall(r"frames: 100%\|[^|]*\| (\d+)/(\d+) \[", run.stderr)
    assert bar and bar[-1] == ("4", "4")
    assert summary["frames"] == 4
    assert summary["frames"] + summary["drain_frames"] == summary["frames_total"]
    assert f"the first 2 of {summary['requests_completed']} finished requests" in run.stdout
    assert len(re.findall(r"^request \d+ ", run.stdout, re.MULTILINE)) == 2
