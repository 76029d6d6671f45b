"""The policy an evaluation loop drives: in-process, or a scripts/serve.py server over openpi's protocol."""

from collections.abc import Mapping
from typing import Any, Protocol

from oxygen_jax.evaluation.requirements import SetupError, require


class EvalPolicy(Protocol):
    """What a loop drives: openpi's `infer(obs) -> {"actions": [H, dims], ...}` plus server metadata."""

    @property
    def metadata(self) -> Mapping[str, Any]: ...

    def infer(self, obs: dict) -> dict: ...


class RemotePolicy:
    """openpi's own websocket client, as a robot would use it, talking to scripts/serve.py."""

    def __init__(self, host: str, port: int) -> None:
        client = require(
            "openpi_client.websocket_client_policy",
            # openpi-client pins numpy<2, which jax cannot use; its code works on numpy 2.
            install="pip install --no-deps openpi-client",
            purpose="--policy=remote",
        )
        try:
            self._client = client.WebsocketClientPolicy(host, port)
        except OSError as error:
            raise SetupError(
                f"no policy server at ws://{host}:{port} ({error}); start one with "
                "`python scripts/serve.py --env=... --config=... --port=...`"
            ) from error

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self._client.get_server_metadata()

    def infer(self, obs: dict) -> dict:
        return self._client.infer(obs)


def local_policy(
    robot: str,
    config_name: str,
    checkpoint_dir: str | None,
    *,
    overrides: Mapping[str, Any] | None = None,
    max_text_tokens: int = 0,
    tokenizer_path: str | None = None,
    num_steps: int | None = None,
    params_dtype: str | None = "bfloat16",
) -> EvalPolicy:
    """An in-process policy for `robot` on a config (name or path) and an openpi checkpoint."""
    from oxygen_jax.policies.policy import create_policy

    return create_policy(
        config_name,
        checkpoint_dir,
        tokenizer_path=tokenizer_path,
        max_text_tokens=max_text_tokens,
        num_steps=num_steps,
        params_dtype=params_dtype,
        # The robot is the evaluation's, whichever robot the config was written for.
        overrides={**(overrides or {}), "robot": robot},
    )


def policy_for(robot: str, kind: str, host: str, port: int, **local: Any) -> EvalPolicy:
    """A served policy (`kind="remote"`, at host:port), or a `local_policy(robot, **local)`."""
    return RemotePolicy(host, port) if kind == "remote" else local_policy(robot, **local)
