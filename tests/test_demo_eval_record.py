"""The demo evaluation's report names its checkpoint so that it reads the same on every machine."""

import json
import pathlib

import oxygen_jax
from oxygen_jax import config
from oxygen_jax.table_task.scoring import recorded_checkpoint

PACKAGE_PARENT = pathlib.Path(oxygen_jax.__file__).resolve().parents[1]
DEMO = config.checkpoint_for(config.load_config("pi05_demo"), None)


def test_the_shipped_checkpoint_is_recorded_relative_to_the_package():
    assert recorded_checkpoint(DEMO) == "oxygen_jax/assets/pi05_demo"


def test_other_checkpoints_are_recorded_as_given(tmp_path):
    assert recorded_checkpoint(str(tmp_path)) == str(tmp_path)
    assert recorded_checkpoint("pi05_libero") == "pi05_libero"
    assert recorded_checkpoint("gs://openpi-assets/checkpoints/pi05_libero") == (
        "gs://openpi-assets/checkpoints/pi05_libero"
    )


def test_the_shipped_report_names_the_shipped_checkpoint_without_a_machine_path():
    report = json.loads((pathlib.Path(DEMO) / "demo_eval.json").read_text())
    assert report["checkpoint_dir"] == "oxygen_jax/assets/pi05_demo"
    assert (PACKAGE_PARENT / report["checkpoint_dir"]).resolve() == pathlib.Path(DEMO).resolve()
