"""The scripts' shared command line: the same flags in every `--help`, and user mistakes reported in one
line on stderr (no traceback, no log noise) with a non-zero exit code."""

import json
import pathlib
import re
import subprocess
import sys

import pytest
from absl import flags

from oxygen_jax.tools import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Each case starts a Python with JAX (~5-10 s): the default run covers one script of each kind.
SLOW = pytest.mark.slow
SCRIPTS = (
    pytest.param("run", marks=SLOW),
    "infer",
    pytest.param("serve", marks=SLOW),
    pytest.param("benchmark", marks=SLOW),
    pytest.param("eval_aloha", marks=SLOW),
    pytest.param("eval_droid", marks=SLOW),
    "eval_libero",
)
MODEL_FLAGS = ("--config", "--checkpoint_dir", "--tokenizer_path", "--params_dtype", "--max_text_tokens")
POLICY_FLAGS = ("--policy", "--host", "--port", *MODEL_FLAGS)


def _script(name: str, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(ROOT / "scripts" / f"{name}.py"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


def _shown_flags(help_text: str) -> set[str]:
    return {match.replace("[no]", "") for match in re.findall(r"^\s+(--[\[\]a-z_]+)", help_text, re.M)}


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_shows_the_shared_flags(name):
    run = _script(name, "--help")
    shown = _shown_flags(run.stdout)
    expected = {
        "run": (*MODEL_FLAGS, "--k", "--target_hz", "--out", "--num_steps"),
        "infer": (*MODEL_FLAGS, "--out", "--num_steps"),
        "serve": (*MODEL_FLAGS, "--k", "--target_hz", "--host", "--port"),
        "benchmark": ("--config", "--out", "--k", "--max_text_tokens"),
        "eval_aloha": (*POLICY_FLAGS, "--episodes", "--out"),
        "eval_droid": (*POLICY_FLAGS, "--out"),
        "eval_libero": (*POLICY_FLAGS, "--episodes", "--out"),
    }[name]
    assert set(expected) <= shown, set(expected) - shown
    assert not shown & {"--max_new_tokens", "--N", "--out_dir", "--summary_json", "--trials"}


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("infer", ["--checkpoint_dir=no/such/dir"], "no checkpoint at 'no/such/dir'"),
        ("infer", ["--config=pi05_nope"], "no config named 'pi05_nope'; use one of pi05,"),
        ("infer", ["--max_text_tokens=abc"], "flag --max_text_tokens=abc: invalid literal"),
        pytest.param("infer", ["--max_text_tokens=-1"], "flag --max_text_tokens=-1", marks=SLOW),
        ("infer", ["--config.model.dtype=float16"], "model.dtype must be 'auto', 'float32' or 'bfloat16'"),
        ("infer", ["--config.model.nope=1"], "the config has no field 'nope'"),
        pytest.param("infer", ["--params_dtype=float16"], "<bfloat16|float32|stored>", marks=SLOW),
        pytest.param("run", ["--config=pi05_nope"], "no config named 'pi05_nope'", marks=SLOW),
        pytest.param("run", ["--obs_dir=no/such/dir"], "no .npz frames in no/such/dir", marks=SLOW),
        pytest.param("serve", ["--checkpoint_dir=no/such/dir"], "no checkpoint at 'no/such/dir'", marks=SLOW),
        pytest.param("benchmark", ["--config=pi05_nope"], "no config named 'pi05_nope'", marks=SLOW),
        ("eval_droid", ["--checkpoint_dir=no/such/dir"], "no checkpoint at 'no/such/dir'"),
        pytest.param("eval_libero", ["--max_text_tokens=abc"], "flag --max_text_tokens=abc", marks=SLOW),
        # Out-of-range numbers are refused when the flags are parsed, before anything loads.
        ("infer", ["--top_p=0"], "flag --top_p=0.0: must be > 0"),
        pytest.param("infer", ["--batch=0"], "flag --batch=0: 0 is not a positive integer", marks=SLOW),
        pytest.param("run", ["--rate=-1"], "flag --rate=-1.0: must be > 0", marks=SLOW),
        pytest.param("run", ["--lengths=5"], "expects two positive token counts", marks=SLOW),
        pytest.param("serve", ["--port=70000"], "not an integer in the range [0, 65535]", marks=SLOW),
        pytest.param("serve", ["--max_batch=0"], "flag --max_batch=0", marks=SLOW),
        pytest.param("benchmark", ["--frames=0"], "flag --frames=0", marks=SLOW),
        ("train", ["--dataset=no/such/dir", "--run_dir=unused"], "no/such/dir: no such dataset folder"),
    ],
)
def test_user_mistake_is_one_line_on_stderr(name, args, message):
    if name != "benchmark":
        args = ["--config=pi05_tiny", *args] if not args[0].startswith("--config=") else args
    run = _script(name, *args)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    # One line saying what is wrong, and at most one saying what to do.
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("  fix: ")), run.stderr
    assert lines[0].startswith("error: ") and message in lines[0]


@SLOW
def test_run_shows_layout_drain_and_token_ids(tmp_path):
    """run.py on a random model: the header names the cameras and prefix the rate depends on, no bar
    counts past its total (the drain has its own), and the noise text is shown as token ids."""
    out = tmp_path / "summary.json"
    run = _script("run", "--config=pi05_tiny", "--frames=3", "--max_text_tokens=6", "--k=2", f"--out={out}")
    assert run.returncode == 0, run.stderr
    assert "synthetic libero layout: cameras base_0_rgb, left_wrist_0_rgb (1 of 3 masked)" in run.stdout
    summary = json.loads(out.read_text())
    assert f"prefix {summary['prefix_len']} columns = 2 x 256 image tokens" in run.stdout
    counts = [(int(n), int(total)) for n, total in re.findall(r"(\d+)/(\d+) \[", run.stderr)]
    assert counts and all(n <= total for n, total in counts)
    assert "drain" in run.stderr
    assert summary["requests_completed"] == summary["requests_arrived"] == 3
    assert "token ids are shown" in run.stdout
    assert re.search(r"request 0 \(length, 6 tokens\): \[\d+(, \d+){5}\]", run.stdout)
    assert "Unable to initialize backend" not in run.stderr


@pytest.mark.integration
def test_main_job_says_each_scenes_true_subtask(tmp_path):
    """The README's main job (run.py on its default, the shipped pi05_demo): every finished request says
    the true subtask of the rendered scene it arrived on, and the printout shows both."""
    out = tmp_path / "summary.json"
    run = _script("run", "--frames=8", f"--out={out}")
    assert run.returncode == 0, run.stderr
    summary = json.loads(out.read_text())
    assert summary["config"] == "pi05_demo"
    assert summary["requests_completed"] == summary["requests_arrived"] > 0
    assert summary["subtask_exact_match"] == 1.0
    printed = r"request 0 \(eos, \d+ tokens\): '(.+)'\n  scene: '.+', true subtask '(.+)'"
    said, truth = re.search(printed, run.stdout).groups()
    assert said == truth and said.startswith("reach the ")


def test_mesh_flag_reaches_configs_loaded_by_name():
    """serve.py and the evaluation scripts load their config by name with the command line's overrides:
    `--mesh` must be among them, not only set on the parsed config."""
    snippet = (
        "import sys\n"
        "from oxygen_jax.tools import cli\n"
        "model = cli.define_model_flags('pi05_tiny')\n"
        "cli.parse_flags(sys.argv)\n"
        "print(sorted(model.config_overrides().items()))\n"
    )
    args = ["--config=pi05_tiny", "--mesh=data:1", "--config.engine.max_slots=3"]
    command = [sys.executable, "-c", snippet, *args]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[('engine.max_slots', 3), ('engine.mesh', 'data:1')]"


@pytest.mark.parametrize(
    ("given", "value", "stderr"),
    [
        ([], 10, ""),
        (["--num_steps=5"], 5, ""),
        (["--steps=3"], 3, "warning: --steps is deprecated here: use --num_steps\n"),
    ],
)
def test_a_deprecated_flag_name_still_gives_its_value_with_a_warning(given, value, stderr, capsys):
    values = flags.FlagValues()
    new = flags.DEFINE_integer("num_steps", 10, "Denoising steps.", flag_values=values)
    old = flags.DEFINE_integer("steps", None, "Deprecated: use --num_steps.", flag_values=values)
    values(["tool", *given])
    assert cli.renamed(new, old) == value
    assert capsys.readouterr().err == stderr


def test_giving_a_flag_and_its_deprecated_name_is_one_line(capsys):
    values = flags.FlagValues()
    new = flags.DEFINE_integer("num_steps", 10, "Denoising steps.", flag_values=values)
    old = flags.DEFINE_integer("steps", None, "Deprecated: use --num_steps.", flag_values=values)
    values(["tool", "--steps=3", "--num_steps=5"])
    with pytest.raises(SystemExit) as exit_:
        cli.renamed(new, old)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "error: give --num_steps only (--steps is its deprecated name)\n"
