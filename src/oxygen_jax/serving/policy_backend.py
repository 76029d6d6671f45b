"""Serves a `Policy` over the openpi websocket protocol: request options in, text fields out.

Besides the robot observation a request may carry `noise` ([H, action_dim], making that sample
deterministic), `max_text_tokens` and `temperature`; they are taken out before the robot transforms see
the observation. With language on, the reply adds `text`, `text_tokens` and `text_done` (True: the full
text is in this reply). Bad requests raise ValueError, which the server answers as "Bad request: ...".
"""

from typing import Any

from oxygen_jax.policies.policy import Policy

REQUEST_OPTIONS = ("noise", "max_text_tokens", "temperature")


def _option(value: Any, kind: type, name: str) -> Any:
    """A msgpack scalar (int, float or numpy scalar) as `kind`, or a ValueError naming the field."""
    try:
        return None if value is None else kind(value)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name!r}: expected a {kind.__name__}, got {value!r}") from error


class PolicyServerBackend:
    """The `PolicyBackend` the websocket server calls, one request at a time, around one Policy."""

    def __init__(self, policy: Policy) -> None:
        self._policy = policy

    @property
    def metadata(self) -> dict:
        return self._policy.metadata

    def infer(self, obs: dict) -> dict:
        obs = dict(obs)
        noise, max_text_tokens, temperature = (obs.pop(name, None) for name in REQUEST_OPTIONS)
        result = self._policy.infer(
            obs,
            noise=noise,
            max_text_tokens=_option(max_text_tokens, int, "max_text_tokens"),
            temperature=_option(temperature, float, "temperature"),
        )
        if "text" in result:
            result["text_done"] = True
        return result
