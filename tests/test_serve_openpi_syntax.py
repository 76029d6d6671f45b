"""openpi's `serve_policy.py` syntax read as serve.py's flags (parse only: no model is built)."""

import subprocess
import sys

import pytest

from oxygen_jax.serving import openpi_args


@pytest.mark.parametrize(
    "theirs",
    [
        ["policy:checkpoint", "--policy.config=pi05_libero", "--policy.dir=/ckpt"],
        ["policy:checkpoint", "--policy.config", "pi05_libero", "--policy.dir", "/ckpt"],  # tyro's spaces
    ],
)
def test_policy_checkpoint_maps_to_config_and_checkpoint_dir(theirs):
    argv, note = openpi_args.translate(["serve", *theirs, "--port=8001"])
    assert argv == ["serve", "--config=pi05_libero", "--checkpoint_dir=/ckpt", "--port=8001"]
    assert note == (
        "openpi's serve_policy.py syntax: read policy:checkpoint as implied, --policy.config=pi05_libero as "
        "--config=pi05_libero, --policy.dir=/ckpt as --checkpoint_dir=/ckpt (docs/serving.md)"
    )


def test_policy_default_is_the_envs_default_checkpoint():
    argv, note = openpi_args.translate(["serve", "--env=LIBERO", "policy:default"])
    assert argv == ["serve", "--env=LIBERO", "--checkpoint_dir=default"]
    assert "policy:default as --checkpoint_dir=default" in note


def test_our_own_flags_pass_untouched():
    ours = ["serve", "--config=pi05_demo", "--port", "8001", "--checkpoint_dir=x"]
    assert openpi_args.translate(ours) == (ours, None)


def test_a_policy_flag_without_a_value_is_one_line():
    with pytest.raises(openpi_args.OpenpiSyntaxError, match=r"--policy.dir needs a value"):
        openpi_args.translate(["serve", "policy:checkpoint", "--policy.dir", "--port=1"])


def test_serve_parses_openpi_syntax_into_its_flags():
    """serve.py's own flag parser (what `oxygen-serve` runs) on openpi's command line, in a fresh
    interpreter (every tool defines the shared flags, so one process holds one tool)."""
    code = (
        "from oxygen_jax.tools import serve; "
        "serve.parse_flags(['serve', 'policy:checkpoint', '--policy.config=pi05_droid', "
        "'--policy.dir=/ckpt']); "
        "print(serve.flags.FLAGS.config.name, serve.flags.FLAGS.checkpoint_dir)"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["pi05_droid", "/ckpt"]
    assert "read policy:checkpoint as implied" in run.stderr
