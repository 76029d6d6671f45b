"""What one server is, as data: `oxygen-serve` fills it from its flags, and each replica of a fleet
(`serving/ray_app.py`) receives it (it pickles) and builds the same server from it."""

import dataclasses
from collections.abc import Mapping
from typing import Any

from oxygen_jax.policies.policy import create_policy
from oxygen_jax.robots.robots import Robots
from oxygen_jax.runtime.runtime import RuntimeConfig
from oxygen_jax.serving import recorder
from oxygen_jax.serving.policy_backend import PolicyServerBackend, SessionServerBackend
from oxygen_jax.serving.websocket_server import PolicyBackend, ServerLimits


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """The policy (`create_policy`'s arguments), how it is served and the server's limits.

    runtime: the streaming session's runtime (None: `--language=inline`, one request at a time);
    max_samples: the most action chunks a streamed request may draw (None: the config's `rtc.samples`);
    max_slots: its language slots (what one server holds of robots with language in flight); metrics:
    Prometheus `/metrics`; record_dir: save each request and reply there (None: no recording).
    """

    config_name: str
    checkpoint_dir: str | None
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tokenizer_path: str | None = None
    max_text_tokens: int = 0
    default_prompt: str | None = None
    num_steps: int | None = None
    params_dtype: str | None = "bfloat16"
    runtime: RuntimeConfig | None = None
    max_text_tasks: int = 0
    rtc: bool = True
    max_samples: int | None = None
    limits: ServerLimits = dataclasses.field(default_factory=ServerLimits)
    metrics: bool = True
    record_dir: str | None = None

    @property
    def max_robots(self) -> int:
        """Robots one server is sized for: its language slots (inline: one at a time)."""
        return max(self.runtime.max_slots, 1) if self.runtime is not None else 1

    def build_backend(self, replica_id: str | None = None) -> PolicyBackend:
        """The policy and its backend, not yet warmed up (call its `warmup`)."""
        policy = create_policy(
            self.config_name,
            self.checkpoint_dir,
            tokenizer_path=self.tokenizer_path,
            max_text_tokens=self.max_text_tokens,
            default_prompt=self.default_prompt,
            num_steps=self.num_steps,
            params_dtype=self.params_dtype,
            overrides=dict(self.overrides),
        )
        if self.runtime is None:
            backend = PolicyServerBackend(policy, metrics=self.metrics, replica_id=replica_id)
        else:
            session = Robots(
                policy,
                self.runtime,
                max_text_tasks=self.max_text_tasks,
                rtc=self.rtc,
                max_samples=self.max_samples,
            )
            backend = SessionServerBackend(session, metrics=self.metrics, replica_id=replica_id)
        return backend if self.record_dir is None else recorder.recording(backend, self.record_dir)
