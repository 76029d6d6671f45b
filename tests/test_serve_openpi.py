"""serve.py used as openpi's serve_policy.py: openpi's env names, a prompt-less ALOHA sim client, --record."""

import signal
import subprocess
import sys

import numpy as np
import pytest
from conftest import (
    E2E,
    GOLDEN,
    OPENPI_CLIENT_WARNING,
    SERVE,
    TOKENIZER,
    make_policy,
    openpi_client,
    raw_observation,
    serve_script,
)

from oxygen_jax.policies import normalization
from oxygen_jax.policies.policy import create_policy
from oxygen_jax.serving import recorder
from oxygen_jax.serving.policy_backend import PolicyServerBackend
from oxygen_jax.serving.websocket_server import BackgroundServer

# openpi-client pins numpy<2, so CI installs it with `pip install --no-deps openpi-client`.
pytest.importorskip("openpi_client.websocket_client_policy")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180), OPENPI_CLIENT_WARNING]

ALOHA_SIM_PROMPT = "Transfer cube"  # openpi's pi0_aloha_sim default_prompt


def aloha_observation() -> dict:
    """What openpi's ALOHA sim client sends: the top camera and 14 joints, and no prompt."""
    rng = np.random.default_rng(0)
    return {
        "images": {"cam_high": rng.integers(0, 256, (3, 224, 224), dtype=np.uint8)},
        "state": rng.uniform(-0.5, 0.5, 14).astype(np.float32),
    }


@pytest.fixture(scope="module")
def aloha_checkpoint(tmp_path_factory):
    """The golden tiny params with ALOHA-sized (14 joints) norm stats under the tiny config's asset id."""
    checkpoint = tmp_path_factory.mktemp("aloha_checkpoint")
    (checkpoint / "params").symlink_to(GOLDEN / "checkpoint" / "params")
    ones = np.ones(14)
    stats = normalization.NormStats(mean=0 * ones, std=ones, q01=-ones, q99=ones)
    normalization.save_norm_stats(
        checkpoint / "assets" / "physical-intelligence" / "libero", {"state": stats, "actions": stats}
    )
    return checkpoint


@pytest.fixture(scope="module")
def aloha_sim_server(tmp_path_factory, aloha_checkpoint):
    """serve.py --env=ALOHA_SIM (openpi's spelling) --record on the tiny model."""
    records = tmp_path_factory.mktemp("records")
    flags = (
        "--env=ALOHA_SIM",
        f"--checkpoint_dir={aloha_checkpoint}",
        f"--tokenizer_path={TOKENIZER}",
        "--record",
        f"--record_dir={records}",
    )
    with serve_script(tmp_path_factory.mktemp("serve"), *flags, golden=False) as (process, port):
        yield process, port, records


@pytest.fixture(scope="module")
def prompt_less_reply(aloha_sim_server, noise):
    _, port, _ = aloha_sim_server
    return openpi_client(port).infer(aloha_observation() | {"noise": noise})


def test_aloha_sim_server_answers_a_prompt_less_observation_with_the_default_prompt(
    prompt_less_reply, noise, aloha_checkpoint
):
    local = create_policy(
        "pi05_tiny", str(aloha_checkpoint), tokenizer_path=TOKENIZER, overrides={"robot": "aloha_sim"}
    )
    with_default = local.infer(aloha_observation() | {"prompt": ALOHA_SIM_PROMPT}, noise=noise)["actions"]
    with_other = local.infer(aloha_observation() | {"prompt": "Insert the peg"}, noise=noise)["actions"]
    assert prompt_less_reply["actions"].shape == (10, 14)
    np.testing.assert_allclose(prompt_less_reply["actions"], with_default, atol=1e-4, rtol=0)
    assert np.abs(with_other - with_default).max() > 1e-3  # the prompt shows in the actions


def test_record_holds_openpis_flat_inputs_and_outputs(aloha_sim_server, prompt_less_reply, noise):
    _, _, records = aloha_sim_server
    record = np.load(records / "step_0.npy", allow_pickle=True).item()
    sent = aloha_observation()
    assert sorted(record) == sorted(
        ["inputs/images/cam_high", "inputs/state", "inputs/noise"]
        + [f"outputs/{key}" for key in prompt_less_reply if key not in ("policy_timing", "server_timing")]
        + [f"outputs/policy_timing/{key}" for key in prompt_less_reply["policy_timing"]]
    )
    np.testing.assert_array_equal(record["inputs/images/cam_high"], sent["images"]["cam_high"])
    np.testing.assert_array_equal(record["inputs/state"], sent["state"])
    np.testing.assert_array_equal(record["inputs/noise"], noise)
    np.testing.assert_array_equal(record["outputs/actions"], prompt_less_reply["actions"])


def test_aloha_sim_server_exits_cleanly(aloha_sim_server, prompt_less_reply):
    process, _, _ = aloha_sim_server
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0


def test_recording_a_one_request_backend_numbers_the_steps(tmp_path):
    policy = make_policy("dsi0")
    backend = recorder.recording(PolicyServerBackend(policy), tmp_path / "records")
    with BackgroundServer(backend) as server:
        client = openpi_client(server.port)
        assert client.get_server_metadata() == policy.metadata
        replies = [client.infer(raw_observation() | {"episode": 3}) for _ in range(2)]
    assert sorted(p.name for p in (tmp_path / "records").iterdir()) == ["step_0.npy", "step_1.npy"]
    for step, reply in enumerate(replies):
        record = np.load(tmp_path / "records" / f"step_{step}.npy", allow_pickle=True).item()
        assert record["inputs/prompt"] == raw_observation()["prompt"]
        assert record["inputs/episode"] == 3  # a key the policy does not read: recorded as sent
        np.testing.assert_array_equal(record["outputs/actions"], reply["actions"])


def test_default_checkpoint_is_openpis_for_the_env(tmp_path, monkeypatch):
    """--checkpoint_dir=default with --env=LIBERO serves gs://openpi-assets/checkpoints/pi05_libero, read
    from openpi's cache (here the golden checkpoint placed there, so nothing is downloaded)."""
    cache = tmp_path / "cache" / "openpi-assets" / "checkpoints"
    cache.mkdir(parents=True)
    (cache / "pi05_libero").symlink_to(GOLDEN / "checkpoint")
    monkeypatch.setenv("OPENPI_DATA_HOME", str(tmp_path / "cache"))
    flags = (
        "--env=LIBERO",
        "--checkpoint_dir=default",
        f"--tokenizer_path={TOKENIZER}",
        "--config.model.discrete_state_input=False",
    )
    with serve_script(tmp_path, *flags, golden=False) as (process, port):
        reply = openpi_client(port).infer(raw_observation() | {"noise": E2E["in/noise"]})
        np.testing.assert_allclose(reply["actions"], E2E["out/dsi0/actions"], atol=1e-4, rtol=0)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0


def test_aloha_sim_has_no_default_pi05_checkpoint():
    command = [sys.executable, str(SERVE), "--env=ALOHA_SIM", "--checkpoint_dir=default"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1].startswith("error: --env=aloha_sim has no pi0.5 default")
