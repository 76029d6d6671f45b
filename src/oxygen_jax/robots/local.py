"""One robot on its policy's inline runtime, driven by its caller's clock: `Policy.infer`'s interface
with the robot's state kept between calls, so a request may carry `rtc` (real-time chunking towards the
robot's last chunk, `robots/chunks.py`) and the reply carries the `Robot` fields (`chunk_id`, `start`,
`stale`, `rtc_method`, ...). Local inference, the closed-loop evaluations and the inline server run their
robots here; `Robots` runs many on the shared runtime. Both take the same `Robot` sequence, so the same
request gives the same actions on either.
"""

import threading
from collections.abc import Mapping
from typing import Any

from oxygen_jax.client import protocol
from oxygen_jax.policies import rtc_defaults
from oxygen_jax.policies.policy import Policy
from oxygen_jax.policies.request_options import RequestOptions
from oxygen_jax.robots.chunks import RobotChunks
from oxygen_jax.robots.robot import Robot, Turn


def run_inline(robot: Robot, turn: Turn) -> dict[str, Any]:
    """A prepared request of `robot` (`Robot.prepare`) on its policy's inline runtime and its reply, text
    decoded to completion within it. One request of a policy runs at a time."""
    robot.begin(turn)
    actions, text, timing = robot.policy.inline.run(turn.prepared)
    return robot.finish(turn, actions, timing, text)


class LocalRobot:
    """One robot on a local `Policy`. Thread-safe: one request computes at a time.

    fresh_samples: how many chunks a request without `rtc` (a chunk that continues none, such as the
    first) draws when its options name none, keeping the one inside the motion most of them took
    (`RequestOptions.samples`): with `rtc` the robot executes d actions of that chunk before any later one
    can correct it. None: the model config's `rtc.samples` (`rtc_defaults`). A request with `rtc` draws
    one chunk unless told otherwise."""

    def __init__(
        self,
        policy: Policy,
        *,
        schedule: str = "exp",
        max_guidance_weight: float = 5.0,
        fresh_samples: int | None = None,
        robot_id: str = "robot-0",
    ) -> None:
        self.robot = Robot(policy, robot_id, schedule=schedule, max_guidance_weight=max_guidance_weight)
        self.fresh_samples = rtc_defaults.samples(policy.metadata) if fresh_samples is None else fresh_samples
        self._lock = threading.Lock()

    @property
    def metadata(self) -> dict[str, Any]:
        return self.robot.policy.metadata

    @property
    def chunks(self) -> RobotChunks:
        """The robot's real-time-chunking state."""
        return self.robot.chunks

    def infer(self, obs: Mapping[str, Any], **options: Any) -> dict[str, Any]:
        """`Policy.infer` on this robot: guided (or conditioned) when `obs` carries `rtc`; options:
        `RequestOptions`."""
        rtc = obs.get(protocol.RTC)
        obs = {k: v for k, v in obs.items() if k != protocol.RTC}
        options.setdefault("samples", self.fresh_samples if rtc is None else 1)
        # Arrived (and prepared) before it waits for the policy: a reply computed meanwhile is stale.
        turn = self.robot.prepare(obs, RequestOptions(**options), rtc)
        with self._lock:
            return run_inline(self.robot, turn)
