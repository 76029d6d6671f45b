"""The training loop on a micro pi0.5 and a tiny synthetic set: loss goes down, openpi's checkpoint
layout, resume, data parallelism over forced host devices, and a trained run served by create_policy."""

import itertools
import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import GOLDEN
from flax import traverse_util

from oxygen_jax import checkpoints, config
from oxygen_jax.engine.compile_counter import CompileCounter
from oxygen_jax.models import pi05
from oxygen_jax.policies.normalization import load_norm_stats
from oxygen_jax.policies.policy import create_policy
from oxygen_jax.training import checkpointing, loop, synthetic, train_step

ROOT = pathlib.Path(__file__).resolve().parents[1]
STEPS = 8
ASSET_ID = "synthetic/micro"


def micro_config():
    """pi05_tiny with one 56-pixel camera (16 image tokens), 12 prompt tokens, horizon 4, text loss on."""
    cfg = config.load_config("pi05_tiny")
    cfg.model.image_keys = ("base_0_rgb",)
    cfg.model.image_size = 56
    cfg.model.max_token_len = 12
    cfg.model.action_horizon = 4
    cfg.model.prefix_attention = "causal_text"
    cfg.asset_id = ASSET_ID
    t = cfg.training
    t.text_loss_weight = 1.0
    t.peak_lr, t.warmup_steps, t.decay_steps, t.decay_lr = 3e-3, 1, 100, 1e-4
    t.ema_decay = 0.9
    t.batch_size = 4
    t.log_interval = 1
    t.save_interval = 4
    t.keep_period = 0
    return cfg


@pytest.fixture(scope="module")
def cfg():
    return micro_config()


@pytest.fixture(scope="module")
def dataset(cfg):
    return synthetic.synthetic_dataset(config.model_config(cfg), size=4)


@pytest.fixture(scope="module")
def norm_stats():
    return load_norm_stats(GOLDEN / "checkpoint" / "assets" / "physical-intelligence" / "libero")


def _init_params(cfg):
    return pi05.init_params(config.model_config(cfg), jax.random.key(0))


def _fail_if_called():
    raise AssertionError("a resumed run must not load the initial params")


@pytest.fixture(scope="module")
def full_run(cfg, dataset, norm_stats, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("full")
    state = loop.train(
        cfg,
        itertools.repeat(dataset),
        run_dir=run_dir,
        init_params=lambda: _init_params(cfg),
        norm_stats=norm_stats,
        num_steps=STEPS,
    )
    return run_dir, state


@pytest.mark.integration
def test_steps_on_a_tiny_synthetic_set_lower_the_loss(full_run):
    run_dir, _ = full_run
    rows = [json.loads(line) for line in (run_dir / loop.METRICS_FILE).read_text().splitlines()]
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1))
    first, last = rows[0], rows[-1]
    assert last["loss"] < 0.85 * first["loss"]
    assert last["loss_ce"] < first["loss_ce"] - 0.5
    assert last["loss_flow"] < first["loss_flow"]
    assert (run_dir / loop.PLOT_FILE).stat().st_size > 1000


@pytest.mark.integration
def test_run_is_in_openpi_layout(full_run, cfg, norm_stats):
    run_dir, state = full_run
    assert sorted(p.name for p in run_dir.iterdir() if p.is_dir()) == [str(STEPS)]  # max_to_keep 1
    step_dir = run_dir / str(STEPS)
    assert (step_dir / "params" / "_METADATA").is_file()
    assert (step_dir / "train_state").is_dir()
    stored = load_norm_stats(step_dir / "assets" / ASSET_ID)
    np.testing.assert_array_equal(stored["actions"].q99, norm_stats["actions"].q99)
    assert checkpoints.resolve_checkpoint_dir(run_dir) == step_dir.resolve()
    spec = train_step.TrainSpec.from_config(cfg)
    params = checkpoints.restore_params(run_dir, expected=pi05.param_shapes(spec.model))
    ema = traverse_util.flatten_dict(train_step.serving_params(state, spec), sep="/")
    for path, value in traverse_util.flatten_dict(params, sep="/").items():
        np.testing.assert_array_equal(value, np.asarray(ema[path]), err_msg=path)  # the EMA is served


@pytest.mark.integration
def test_resume_continues_the_run_exactly(full_run, cfg, dataset, norm_stats, tmp_path):
    _, uninterrupted = full_run
    loop.train(
        cfg,
        itertools.repeat(dataset),
        run_dir=tmp_path,
        init_params=lambda: _init_params(cfg),
        norm_stats=norm_stats,
        num_steps=STEPS // 2,
    )
    assert checkpointing.latest_step(tmp_path) == STEPS // 2
    with CompileCounter() as counter:  # the step compiled for the first run serves the resumed one
        resumed = loop.train(
            cfg, itertools.repeat(dataset), run_dir=tmp_path, init_params=_fail_if_called, num_steps=STEPS
        )
    assert counter.count == 0
    assert int(resumed.step) == STEPS
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed), jax.device_get(uninterrupted))
    steps = [json.loads(line)["step"] for line in (tmp_path / loop.METRICS_FILE).read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))


_DATA_PARALLEL_CHILD = """
import itertools, sys, jax, numpy as np
sys.path.insert(0, {tests!r})
from test_training_loop import micro_config, _init_params
from oxygen_jax import config
from oxygen_jax.training import batch as tb, loop, synthetic, train_step
assert jax.device_count() == 2
cfg = micro_config()
spec = train_step.TrainSpec.from_config(cfg)
data = synthetic.synthetic_dataset(config.model_config(cfg), size=4)
results = []
for devices in (jax.devices()[:1], jax.devices()):
    mesh = loop.data_mesh(devices)
    state = loop.replicate(train_step.init_train_state(_init_params(cfg), spec, jax.random.key(0)), mesh)
    batch = loop.shard_batch(tb.batch_from_arrays(data, spec.model), mesh)
    assert len(batch.actions.sharding.device_set) == len(devices)
    for _ in range(2):
        state, metrics = train_step.train_step(state, batch, jax.random.key(1), spec=spec)
    results.append((jax.device_get(metrics), jax.device_get(state.trainable)))
(m1, p1), (m2, p2) = results
for k in m1:
    np.testing.assert_allclose(m2[k], m1[k], rtol=1e-5, err_msg=k)
# AdamW divides each gradient element by its own magnitude, so an element whose gradient is ~0 moves
# by a share of lr (1.5e-3 here) that depends on the all-reduce order: params agree to 1e-4.
jax.tree.map(lambda a, b: np.testing.assert_allclose(b, a, rtol=0, atol=1e-4), p1, p2)
print("data parallel ok", {{k: float(v) for k, v in m2.items()}})
"""


@pytest.mark.slow
def test_two_devices_split_the_batch_and_match_one_device():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    child = _DATA_PARALLEL_CHILD.format(tests=str(ROOT / "tests"))
    result = subprocess.run(
        [sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=1800, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "data parallel ok" in result.stdout


def test_trained_checkpoint_serves_through_create_policy(golden_params, norm_stats, tmp_path):
    """write -> create_policy -> the same actions as a policy on the same params saved by hand."""
    cfg = config.load_config("pi05_tiny")
    spec = train_step.TrainSpec.from_config(cfg)
    state = train_step.init_train_state(golden_params, spec, jax.random.key(0))
    state = state.replace(step=state.step + 3, ema=jax.tree.map(lambda x: x * 1.01, state.ema))
    checkpointing.save_checkpoint(tmp_path / "run", state, spec, norm_stats=norm_stats, asset_id=cfg.asset_id)
    by_hand = tmp_path / "by_hand"
    checkpoints.save_params(by_hand, train_step.serving_params(state, spec))
    (by_hand / "assets").symlink_to(tmp_path / "run" / "3" / "assets")

    e2e = np.load(GOLDEN / "policy_e2e.npz")
    obs = {k.removeprefix("in/"): e2e[k] for k in e2e.files if k.startswith("in/observation/")}
    obs["prompt"] = str(e2e["in/prompt"])
    rng = np.random.default_rng(0)
    noise = rng.normal(size=(cfg.model.action_horizon, cfg.model.action_dim)).astype(np.float32)
    actions = [
        create_policy("pi05_tiny", str(path), params_dtype="float32").infer(obs, noise=noise)["actions"]
        for path in (tmp_path / "run", by_hand, GOLDEN / "checkpoint")
    ]
    np.testing.assert_array_equal(actions[0], actions[1])
    assert not np.allclose(actions[0], actions[2])  # the EMA params were served, not the golden ones


@pytest.mark.integration
def test_cli_refuses_ambiguous_data_with_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), "--config=pi05_tiny", f"--run_dir={tmp_path}"],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip().splitlines()[-1] == "error: give exactly one of --dataset=DIR and --synthetic"
    )


def _train_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), "--config=pi05_tiny", "--synthetic", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_init_from_refuses_a_checkpoint_of_another_shape_in_one_line(cfg, tmp_path):
    """`--init_from` loads with the model's shapes checked: the micro model's params (56-pixel images)
    do not fit pi05_tiny (224)."""
    checkpoints.save_params(tmp_path / "micro", _init_params(cfg))
    result = _train_cli(
        f"--init_from={tmp_path / 'micro'}", f"--run_dir={tmp_path / 'run'}", "--train_steps=1"
    )
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert (
        last.startswith(f"error: {tmp_path / 'micro'} does not fit config 'pi05_tiny'")
        and "pos_embedding" in last
    )


@pytest.mark.integration
def test_init_from_starts_training_from_the_checkpoints_params(tmp_path):
    """A run started `--init_from` a checkpoint trains from its params: after one step of a tiny learning
    rate they are still those params, not a random init's."""
    tiny = config.load_config("pi05_tiny")
    start = pi05.init_params(config.model_config(tiny), jax.random.key(7))
    checkpoints.save_params(tmp_path / "start", start)
    result = _train_cli(
        f"--init_from={tmp_path / 'start'}",
        f"--run_dir={tmp_path / 'run'}",
        "--train_steps=1",
        "--config.training.peak_lr=1e-12",
        "--config.training.ema_decay=0.0",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    trained = checkpoints.restore_params(tmp_path / "run")
    flat_start, flat_trained = traverse_util.flatten_dict(start), traverse_util.flatten_dict(trained)
    key = next(k for k in flat_start if "pos_embedding" in "/".join(map(str, k)))
    np.testing.assert_allclose(np.asarray(flat_trained[key]), np.asarray(flat_start[key]), atol=1e-6)
