"""Shared fixtures and helpers: the golden reference data computed by upstream openpi on the tiny model, the
golden policy, served robots and serve.py, so that no test file imports another."""

import contextlib
import importlib.util
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import websockets.sync.client
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from oxygen_jax import checkpoints, config
from oxygen_jax.client import SimClock
from oxygen_jax.models import inputs
from oxygen_jax.policies.policy import create_policy

# Reference outputs of upstream openpi (and the OxyGen fork) on the tiny model; tests/golden/README.md.
GOLDEN = pathlib.Path(__file__).resolve().parent / "golden"
ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
# The fields every closed-loop results.json has (eval_table, eval_aloha --execution).
CLOSED_LOOP_FIELDS = {
    "success_rate",
    "mean_steps",
    "switch_jump_mean",
    "switch_jump_max",
    "jerk_mean",
    "execution",
    "delay_steps",
    "action_horizon",
    "episodes",
}
# Four CPU devices for mesh tests; JAX reads the flag at import, so only a subprocess can take it.
FORCED_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}


def load_script(name: str) -> types.ModuleType:
    """`scripts/<name>.py` as a module (scripts are not a package; tests call their functions)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the script runs
    spec.loader.exec_module(module)
    return module


def run_benchmark(out: pathlib.Path, *flags: str) -> None:
    """scripts/benchmark.py with `flags`, writing to `out` with its own compilation cache; fails the test
    with the script's stderr when it fails."""
    script = SCRIPTS / "benchmark.py"
    cmd = [sys.executable, str(script), *flags, f"--out={out}", f"--jax_cache_dir={out / 'xla'}"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-4000:]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def golden_inputs(npz) -> dict:
    """model_io-style `in/...` arrays as model-level keys (without the `in/` prefix)."""
    return {k[3:]: npz[k] for k in npz.files if k.startswith("in/") and not k.startswith("in/image_u8/")}


@pytest.fixture(scope="session")
def tiny_config():
    return config.model_config(config.load_config("pi05_tiny"))


@pytest.fixture(scope="session")
def golden_params():
    return checkpoints.restore_params(GOLDEN / "checkpoint")


@pytest.fixture(scope="session")
def model_io():
    return np.load(GOLDEN / "model_io.npz")


@pytest.fixture(scope="module")
def obs_file(tmp_path_factory, model_io):
    """The golden model inputs as an `infer.py --obs` file."""
    path = tmp_path_factory.mktemp("obs") / "obs.npz"
    np.savez(path, **golden_inputs(model_io))
    return path


@pytest.fixture(scope="session")
def golden_obs(model_io, tiny_config):
    return inputs.observation_from_arrays(golden_inputs(model_io), tiny_config)


# The golden policy (policy_e2e: openpi's `create_trained_policy` on the tiny checkpoint) and its input.
# Read once into memory: an NpzFile parses headers lazily and is not safe across the tests' client threads.
with np.load(GOLDEN / "policy_e2e.npz") as _npz:
    E2E = dict(_npz)
TOKENIZER = str(GOLDEN / "tokenizer" / "tiny_paligemma_standin.model")
VARIANTS = {"dsi0": False, "dsi1": True}
ACTIONS_ATOL = 1e-4


def make_policy(tag: str, params_dtype: str = "bfloat16", max_text_tokens: int = 0):
    return create_policy(
        "pi05_tiny",
        str(GOLDEN / "checkpoint"),
        tokenizer_path=TOKENIZER,
        max_text_tokens=max_text_tokens,
        params_dtype=params_dtype,
        overrides={
            "model.discrete_state_input": VARIANTS[tag],
            "asset_id": "physical-intelligence/libero",
        },
    )


def raw_observation() -> dict:
    """The golden raw LIBERO observation, unbatched, as a robot sends it."""
    return {key.removeprefix("in/"): E2E[key] for key in E2E if key.startswith("in/observation/")} | {
        "prompt": str(E2E["in/prompt"])
    }


# Robots served at once: each client's own prompt and text budget, so a reply given to the wrong one shows.
MAX_TEXT_TOKENS = 5
PROMPTS = ("pick up the black bowl", "open the top drawer", "put the cup on the plate", "close the drawer")


@pytest.fixture(scope="module")
def policy():
    """The golden policy with a text budget, one per test module (so compile and engine counts are the
    module's own); a module that serves another policy defines its own `policy`."""
    return make_policy("dsi0", max_text_tokens=MAX_TEXT_TOKENS)


@pytest.fixture(scope="module")
def noise() -> np.ndarray:
    """One action chunk's noise, [action_horizon, action_dim] of the tiny model, for a robot to send."""
    return np.random.default_rng(1).standard_normal((10, 32)).astype(np.float32)


def text_budget(client: int) -> int:
    """Each client asks for its own text length, so text given to the wrong client shows (the tiny
    model's greedy text repeats one token and never stops early: its length is the budget)."""
    return 3 + client % (MAX_TEXT_TOKENS - 2)


def client_observation(client: int) -> dict:
    return raw_observation() | {"prompt": PROMPTS[client]}


def answers_alone(policy, noises: np.ndarray, clients: int) -> tuple[dict, dict]:
    """What `Policy.infer` answers each client's observation alone: actions per (client, noise index),
    and its text per client."""
    actions = {
        (client, which): policy.infer(client_observation(client), noise=noise, prompt_for_text=False)[
            "actions"
        ]
        for client in range(clients)
        for which, noise in enumerate(noises)
    }
    texts = {
        client: policy.infer(client_observation(client), max_text_tokens=text_budget(client))
        for client in range(clients)
    }
    return actions, texts


# openpi-client's own use of websockets (it connects without a context manager); not ours to fix.
OPENPI_CLIENT_WARNING = pytest.mark.filterwarnings(
    "ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"
)


def openpi_client(port: int, **options: Any) -> Any:
    """An unmodified openpi robot client connected to the server on `port` (loopback); it receives the
    server's metadata on connecting."""
    client_policy = pytest.importorskip("openpi_client.websocket_client_policy")
    return client_policy.WebsocketClientPolicy(host="127.0.0.1", port=port, **options)


def websocket(port: int, path: str = "", **options: Any) -> websockets.sync.client.ClientConnection:
    """A raw websocket to the server on `port` (loopback), uncompressed as openpi's client connects; for
    the messages a robot client would never send and for the `/text` stream."""
    return websockets.sync.client.connect(f"ws://127.0.0.1:{port}{path}", compression=None, **options)


def http_get(port: int, path: str, timeout_s: float = 10, headers: dict | None = None) -> tuple[int, str]:
    """(status, body) of a GET on the server on `port` (loopback), error statuses included."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def metric_samples(port: int, timeout_s: float = 10, headers: dict | None = None) -> list[Sample]:
    """Every sample of the server's /metrics, parsed by prometheus_client's own parser."""
    status, text = http_get(port, "/metrics", timeout_s, headers)
    assert status == 200, text
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def run_client(
    client: int, port: int, noises: np.ndarray, requests: int, **options
) -> list[tuple[int, dict]]:
    """One openpi client's requests, each with the next noise (so requests in flight together carry
    different noises); its replies with the noise index each used."""
    connection = openpi_client(port)
    replies = []
    for request in range(requests):
        which = (client + request) % len(noises)
        obs = client_observation(client) | {"noise": noises[which], "max_text_tokens": text_budget(client)}
        replies.append((which, connection.infer(obs | options)))
    return replies


SERVE = SCRIPTS / "serve.py"


def wait_until_healthy(process: subprocess.Popen, port: int, timeout_s: float, log: Callable[[], str]):
    """Polls the server's /healthz until it answers; fails with `log()` if it exits or times out first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).close()
            return
        except OSError:
            assert process.poll() is None and time.monotonic() < deadline, log()
            time.sleep(0.05)


@contextlib.contextmanager
def serve_script(
    log_dir: pathlib.Path,
    *flags: str,
    golden: bool = True,
    env: dict[str, str] | None = None,
    model: tuple[str, ...] = ("--env=libero", "--config=pi05_tiny"),
) -> Iterator[tuple[subprocess.Popen, int]]:
    """`scripts/serve.py` on the `model` flags (the tiny config) in a subprocess, until it answers
    /healthz; on the golden checkpoint and tokenizer unless `golden` is False (then the config's own
    checkpoint, else random-initialized); `env` adds variables."""
    port = free_port()
    checkpoint = [f"--checkpoint_dir={GOLDEN / 'checkpoint'}", f"--tokenizer_path={TOKENIZER}"]
    command = [
        sys.executable,
        str(SERVE),
        *model,
        *(checkpoint if golden else []),
        f"--port={port}",
        "--max_text_tokens=0",  # openpi's server: actions only (text is the config's default otherwise)
        *flags,
    ]
    # The servers share compiled programs, so only the first one pays for compiling the prefill.
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(log_dir.parent / "jax_cache"), **(env or {})}
    log = log_dir / f"serve_{port}.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(command, stdout=stderr, stderr=stderr, env=env)
    try:
        wait_until_healthy(process, port, 60, lambda: log.read_text()[-3000:])
        yield process, port
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def project_copy(folder: pathlib.Path) -> pathlib.Path:
    """What the wheel is made of, copied to `folder` (setuptools builds in the source folder)."""
    shutil.copytree(ROOT / "src", folder / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy(ROOT / name, folder / name)
    return folder


def run_script(name: str, *args: str, timeout_s: float = 300, **options: Any) -> subprocess.CompletedProcess:
    """`scripts/<name>.py` with `args` in a subprocess started in the repository root, its output captured
    as text; `options` go to `subprocess.run`."""
    command = [sys.executable, str(SCRIPTS / f"{name}.py"), *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout_s, check=False, cwd=ROOT, **options
    )


def infer_script(*args: str) -> subprocess.CompletedProcess:
    """`scripts/infer.py` on the golden tiny checkpoint with its params as stored (float32, as upstream
    made the golden outputs)."""
    cmd = [
        sys.executable,
        str(SCRIPTS / "infer.py"),
        "--config=pi05_tiny",
        f"--checkpoint_dir={GOLDEN / 'checkpoint'}",
        "--params_dtype=stored",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)


class FakePending:
    """A reply that arrives at `ready_at` on a `SimClock`; reading it earlier is the executor's bug."""

    def __init__(self, clock: SimClock, ready_at: float, reply: dict):
        self.clock, self.ready_at, self.reply = clock, ready_at, reply

    def done(self) -> bool:
        return self.clock.now() >= self.ready_at - 1e-9

    def result(self) -> dict:
        assert self.done(), "the executor must not wait for a reply"
        return self.reply


class StandInPolicy:
    """An evaluation loop's policy without a model: remembers every request and answers call n with
    `chunk(n)` and the text "call n", so replans show in the actions and the texts."""

    def __init__(self, chunk: Callable[[int], np.ndarray]) -> None:
        self.metadata = {"action_horizon": 10}
        self.requests: list[dict] = []
        self._chunk = chunk

    def infer(self, obs: dict) -> dict:
        self.requests.append(obs)
        calls = len(self.requests)
        return {"actions": self._chunk(calls), "text": f"call {calls}"}


class GoldenRobot:
    """A robot for the client executor: always the golden raw observation; keeps the actions it got."""

    def __init__(self):
        self.executed: list[np.ndarray] = []

    def observe(self) -> dict:
        return raw_observation()

    def act(self, action: np.ndarray) -> None:
        self.executed.append(action)
