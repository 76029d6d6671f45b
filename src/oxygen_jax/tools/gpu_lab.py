"""The GPU lab: each phase of the frame against its floor, with a profile, per engine variant
(`benchmarks/lab.py`). `scripts/gpu_lab.sh OUT` runs it on the lent GPU machine.

  python -m oxygen_jax.tools.gpu_lab --out=DIR                       # pi05_libero, then pi05_aloha
  python -m oxygen_jax.tools.gpu_lab --smoke --out=DIR               # pi05_tiny on CPU, about a minute

It has no default config of the one-model kind: `--configs` lists the models it runs in order.
"""

import datetime
import pathlib
import subprocess
import sys
import time

import jax
from absl import flags

from oxygen_jax.benchmarks import lab, lab_report
from oxygen_jax.tools import cli

_CONFIGS = flags.DEFINE_list("configs", ["pi05_libero", "pi05_aloha"], "Model configs, in order.")
_OUT = flags.DEFINE_string("out", None, "Folder for results.md, summary.json and phases.png.", required=True)
_BUDGET_S = flags.DEFINE_float("budget_s", 420.0, "Seconds for every stage together; later ones are skipped.")
_REPEATS = flags.DEFINE_integer("repeats", 20, "Timed calls per phase (after a warm one).")
_SMOKE = flags.DEFINE_bool("smoke", False, "pi05_tiny with 3 repeats: the same path on any machine.")


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main(_):
    start = time.monotonic()
    clock = lab.Clock(_BUDGET_S.value)
    configs = ["pi05_tiny"] if _SMOKE.value else _CONFIGS.value
    repeats = 3 if _SMOKE.value else _REPEATS.value
    runs = []
    for name in configs:
        if clock.left() < 60 and runs:
            print(f"{name}: skipped, {clock.left():.0f} s left")
            continue
        runs.append(lab.run(name, repeats, clock))
        _write(runs, start)  # each config's results are kept even if a later one overruns


def _write(runs: list[dict], start: float) -> None:
    summary = {
        "command": " ".join(["python -m oxygen_jax.tools.gpu_lab", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(),
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "seconds": time.monotonic() - start,
        "runs": runs,
    }
    for path in lab_report.write(summary, pathlib.Path(_OUT.value)):
        print(f"wrote {path}")


def run() -> None:
    cli.run(main)


if __name__ == "__main__":
    run()
