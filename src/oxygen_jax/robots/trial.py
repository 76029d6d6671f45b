"""The robot side of a closed-loop evaluation on a local policy: the guidance settings the evaluation
tools take, and a fresh `LocalRobot` per episode whose action noise comes from a seeded stream, so every
execution mode meets the same noise."""

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from oxygen_jax.client import protocol, simulated
from oxygen_jax.errors import InvalidArgumentError
from oxygen_jax.models.pi05 import Pi05Config
from oxygen_jax.policies import rtc_defaults
from oxygen_jax.policies.policy import MAX_SAMPLES, Policy
from oxygen_jax.robots.local import LocalRobot


@dataclasses.dataclass(frozen=True)
class GuidanceSettings:
    """The guidance of a closed-loop evaluation: the server's schedule and beta, the prefix horizon s the
    robot sends (None: every action left in its current chunk, the executor's default), noise_dims,
    the leading model action dims the action noise is drawn on (None: all of them, as openpi draws it;
    the rest are 0, `draw_noise`), and fresh_samples, the chunks a request without `rtc` draws
    (`LocalRobot`; None: the model config's, `rtc_defaults`)."""

    schedule: str = "exp"
    max_guidance_weight: float = 5.0
    prefix_horizon: int | None = None
    noise_dims: int | None = None
    fresh_samples: int | None = None

    def check(
        self, model: Pi05Config, *, execution: str, delays: Sequence[int], execution_horizon: int
    ) -> None:
        """InvalidArgumentError (one line) for a closed-loop run `model` cannot take: a delay the loop cannot
        run (`simulated.check_delay`) or a noise_dims its actions do not have. The closed-loop tools call it
        from the config, before the model loads."""
        for delay in delays:
            simulated.check_delay(delay, model.action_horizon, execution, execution_horizon)
        if self.noise_dims is not None and not 1 <= self.noise_dims <= model.action_dim:
            raise InvalidArgumentError(
                f"noise_dims must lie in [1, {model.action_dim}] (the model's action dims),"
                f" got {self.noise_dims}"
            )
        if self.fresh_samples is not None and not 1 <= self.fresh_samples <= MAX_SAMPLES:
            raise InvalidArgumentError(
                f"fresh_samples must lie in [1, {MAX_SAMPLES}], got {self.fresh_samples}"
            )

    def for_policy(self, policy: Policy) -> "GuidanceSettings":
        """These settings with fresh_samples resolved: the policy's config default where None."""
        if self.fresh_samples is not None:
            return self
        return dataclasses.replace(self, fresh_samples=rtc_defaults.samples(policy.metadata))

    def fields(self) -> dict[str, Any]:
        """Its results.json fields."""
        return {
            "rtc_schedule": self.schedule,
            "max_guidance_weight": self.max_guidance_weight,
            "prefix_horizon": self.prefix_horizon,
            "noise_dims": self.noise_dims,
            "fresh_samples": self.fresh_samples,
        }


DEFAULT_GUIDANCE = GuidanceSettings()
# One chunk per request whatever the model's config says: what the model alone samples.
ONE_SAMPLE = GuidanceSettings(fresh_samples=1)


def seeded_infer(
    policy: Policy, guidance: GuidanceSettings, rng: np.random.Generator
) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """A fresh `LocalRobot.infer` on `policy` whose action noise [H, action_dim] is drawn from
    `rng`, one draw per request: the same seed gives every execution mode the same noise stream. A request
    that draws several chunks (`fresh_samples`) takes the others' noise from a stream spawned off `rng`,
    which leaves `rng`'s own draws as they are."""
    guidance = guidance.for_policy(policy)
    served = LocalRobot(
        policy,
        schedule=guidance.schedule,
        max_guidance_weight=guidance.max_guidance_weight,
        fresh_samples=guidance.fresh_samples,
    )
    shape = (policy.engine.config.action_horizon, policy.engine.config.action_dim)
    others = rng.spawn(1)[0]

    def infer(obs: Mapping[str, Any]) -> dict[str, Any]:
        samples = guidance.fresh_samples if not protocol.continues_chunk(obs) else 1
        return served.infer(obs, noise=draw_samples(rng, others, shape, guidance.noise_dims, samples))

    return infer


def draw_samples(
    rng: np.random.Generator,
    others: np.random.Generator,
    shape: tuple[int, int],
    noise_dims: int | None,
    samples: int,
) -> np.ndarray:
    """The noise of one request: [H, action_dim] from `rng` for one sample; for several, that draw first
    and the others' from `others` [samples, H, action_dim], so `rng`'s stream is the same either way."""
    noise = draw_noise(rng, shape, noise_dims)
    if samples == 1:
        return noise
    return np.stack([noise, *(draw_noise(others, shape, noise_dims) for _ in range(samples - 1))])


def draw_noise(rng: np.random.Generator, shape: tuple[int, int], noise_dims: int | None) -> np.ndarray:
    """Standard normal action noise [H, action_dim], zero past the first `noise_dims` dims (None: none
    zeroed). The draw is the same either way, so a seed gives the kept dims the same values.

    Training pads a robot's actions with zeros past its own dims, yet draws the noise on all of them, as
    openpi does; how much the noise on the padding dims moves the real ones depends on the model, and this
    ablation measures it (docs/rtc.md, on `pi05_detour`).
    """
    noise = rng.standard_normal(shape).astype(np.float32)
    if noise_dims is not None:
        noise[:, noise_dims:] = 0.0
    return noise
