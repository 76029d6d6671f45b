"""The README's Python code blocks run as written, each in a fresh interpreter outside the checkout, against
the demo model shipped in the package (what a user who copies them gets)."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"^```python\n(.*?)^```$", (ROOT / "README.md").read_text(), re.MULTILINE | re.DOTALL)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 2


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> list[str]:
    """Each block's stdout; a block that fails fails the test with its stderr."""
    results = []
    for index, block in enumerate(BLOCKS):
        cwd = tmp_path_factory.mktemp(f"block{index}")
        run = subprocess.run(
            [sys.executable, "-c", block],
            capture_output=True,
            text=True,
            timeout=280,
            cwd=cwd,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])
                ),
            },
            check=False,
        )
        assert run.returncode == 0, f"README python block {index} failed:\n{block}\n{run.stderr[-3000:]}"
        results.append(run.stdout)
    return results


def test_the_policy_example_says_the_scenes_true_subtask(outputs):
    said, truth = re.search(r"said '(.*)', true subtask '(.*)', actions \(10, 2\)", outputs[0]).groups()
    assert said == truth and truth.startswith("reach the ")
    assert outputs[0].splitlines()[-1] == "['memory', 'narration']"


def test_the_openpi_port_example_builds_the_demo_policy(outputs):
    assert outputs[1].startswith("Policy(config='pi05_demo'")
