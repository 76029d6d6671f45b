"""scripts/infer.py --rtc end to end on the golden checkpoint: guided actions as the reference made them."""

import re

import numpy as np
import pytest
from conftest import GOLDEN, infer_script

pytestmark = pytest.mark.integration  # runs scripts / full measurements: the second tier


@pytest.fixture(scope="module")
def rtc_io():
    return np.load(GOLDEN / "rtc_io.npz")


def _rtc_file(path, rtc_io, case: str, **override) -> str:
    arrays = {
        "prev_chunk": rtc_io["in/prev_chunk_aligned"],
        "d": rtc_io[f"case_{case}/d"],
        "s": rtc_io[f"case_{case}/s"],
        **override,
    }
    np.savez(path, **arrays)
    return str(path)


@pytest.mark.parametrize(
    ("case", "flags"), [("B", []), ("C", ["--rtc_schedule=linear", "--max_guidance_weight=1"])]
)
def test_rtc_file_gives_the_reference_guided_actions(tmp_path, obs_file, rtc_io, case, flags):
    """Case B (default exp schedule and beta 5; row 0 unguided) and case C (linear, beta 1)."""
    out_path = tmp_path / "out.npz"
    rtc = _rtc_file(tmp_path / "rtc.npz", rtc_io, case)
    run = infer_script(f"--obs={obs_file}", f"--rtc={rtc}", f"--out={out_path}", *flags)
    assert run.returncode == 0, run.stderr
    assert "(guided)" in run.stdout
    np.testing.assert_allclose(
        np.load(out_path)["actions"], rtc_io[f"case_{case}/actions"], rtol=0, atol=1e-4
    )


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [("absent.npz", None, "--rtc: no file at"), ("rtc.npz", "text", "is not a numpy file")],
)
def test_an_rtc_path_that_is_no_numpy_file_is_a_one_line_error(tmp_path, obs_file, name, content, message):
    if content is not None:
        (tmp_path / name).write_text(content)
    run = infer_script(f"--obs={obs_file}", f"--rtc={tmp_path / name}")
    assert run.returncode == 2
    error, fix = run.stderr.strip().splitlines()[-2:]
    assert error.startswith("error: ") and message in error and fix.startswith("  fix: "), run.stderr


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            {"d": np.array([2, 8]), "s": np.array([6, 7])},
            "0 <= delay <= horizon <= 10, got delay=8 horizon=7",
        ),
        ({"d": np.array([2.0, 3.0])}, "'d': expected int"),
        ({"prev_chunk": np.zeros((2, 10, 7), np.float32)}, r"'prev_chunk': expected shape \[2, 10, 32\]"),
    ],
)
def test_bad_rtc_file_is_a_one_line_error(tmp_path, obs_file, rtc_io, override, message):
    rtc = _rtc_file(tmp_path / "rtc.npz", rtc_io, "A", **override)
    run = infer_script(f"--obs={obs_file}", f"--rtc={rtc}")
    assert run.returncode == 2
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and re.search(message, last), run.stderr
