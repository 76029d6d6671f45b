"""`eval_droid.py` writes its video at the end of a run: without imageio it stops before building the
policy, with one line naming the extra (or the flag that skips the video)."""

import os
import subprocess
import sys

import pytest
from conftest import SCRIPTS


@pytest.mark.integration
def test_replay_without_imageio_stops_before_the_run_with_one_line(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['imageio'] = None\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
    }
    out = tmp_path / "out"
    flags = ["--mode=replay", "--config=pi05_tiny", "--synthetic_frames=4", f"--out={out}"]
    command = [sys.executable, str(SCRIPTS / "eval_droid.py"), *flags]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: writing videos needs the `imageio` package")
    assert lines[0].endswith("install it with: pip install 'oxygen_jax[droid]' (or pass --nosave_video)")
    assert not out.exists()  # no policy call was made, no result written
