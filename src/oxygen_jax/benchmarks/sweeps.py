"""The named sweeps: lists of RunSpecs around the LIBERO ablation point (S=10, N=30, k=5, 1 request/frame).

Deadline-aware k targets are fractions of the action-only rate measured by the roofline, so they mean
the same on any machine.
"""

import dataclasses

from oxygen_jax.benchmarks.spec import RunSpec

SWEEPS = ("ablation", "skip", "layouts", "n_k", "steps", "uniform", "poisson", "random_length", "deadline")
QUICK_MODES = ("isolated", "shared_kv", "oxygen", "action_only")
CORE_MODES = ("isolated", "oxygen", "action_only")
UNIFORM_RATES = (4.0, 2.0, 1.0, 0.5, 0.25)
POISSON_RATES = (0.5, 1.0, 1.5, 2.0)
LONG_FRACTIONS = (0.1, 0.3, 0.5, 0.7, 0.9)
RANDOM_LENGTHS = (5, 20)


@dataclasses.dataclass(frozen=True)
class SweepGrid:
    frames: int = 20
    max_new: tuple[int, ...] = (5, 10, 15, 20, 30)
    k: tuple[int, ...] = (1, 5, 10)
    num_steps: tuple[int, ...] = (5, 10, 15, 20)
    deadline_fractions: tuple[float, ...] = (0.5, 0.7, 0.9)


def quick(frames: int) -> list[RunSpec]:
    """The LIBERO ablation point for isolated, shared_kv, oxygen and action_only."""
    return [RunSpec(mode, frames=frames) for mode in QUICK_MODES]


def build(names: list[str], grid: SweepGrid, action_hz: float) -> list[RunSpec]:
    """Specs of the named sweeps, in order; `action_hz`: the measured action-only rate."""
    unknown = set(names) - set(SWEEPS)
    if unknown:
        raise ValueError(f"unknown sweeps {sorted(unknown)}; known: {SWEEPS}")
    specs = []
    for name in names:
        base = RunSpec("oxygen", frames=grid.frames, sweep=name)
        specs += _SWEEPS[name](base, grid, action_hz)
    return specs


def _modes(base: RunSpec, modes, **changes) -> list[RunSpec]:
    return [dataclasses.replace(base, mode=mode, **changes) for mode in modes]


def _ablation(base, grid, action_hz):
    deadline = dataclasses.replace(base, target_hz=round(0.9 * action_hz, 3))
    # The quick modes first: if a time cap stops the run early, the summary still has them.
    return [*_modes(base, ("action_only", "isolated", "oxygen", "shared_kv", "parallel")), deadline]


def _skip(base, grid, action_hz):
    return _modes(base, ("action_only", "oxygen"), skip_masked_cameras=False)


def _layouts(base, grid, action_hz):
    return [s for layout in ("droid", "aloha") for s in _modes(base, CORE_MODES, layout=layout)]


def _n_k(base, grid, action_hz):
    specs = []
    for n in grid.max_new:
        specs += _modes(base, ("isolated",), max_new=n)
        specs += [dataclasses.replace(base, max_new=n, k=k) for k in grid.k]
    return specs


def _steps(base, grid, action_hz):
    return [s for steps in grid.num_steps for s in _modes(base, CORE_MODES, num_steps=steps)]


def _uniform(base, grid, action_hz):
    return [s for rate in UNIFORM_RATES for s in _modes(base, ("isolated", "oxygen"), rate=rate)]


def _poisson(base, grid, action_hz):
    return [
        s
        for rate in POISSON_RATES
        for s in _modes(base, ("isolated", "oxygen"), arrivals="poisson", rate=rate)
    ]


def _random_length(base, grid, action_hz):
    load = {"arrivals": "random_length", "lengths": RANDOM_LENGTHS, "max_new": max(RANDOM_LENGTHS)}
    return [s for f in LONG_FRACTIONS for s in _modes(base, ("isolated", "oxygen"), long_fraction=f, **load)]


def _deadline(base, grid, action_hz):
    return [dataclasses.replace(base, target_hz=round(f * action_hz, 3)) for f in grid.deadline_fractions]


_SWEEPS = {
    "ablation": _ablation,
    "skip": _skip,
    "layouts": _layouts,
    "n_k": _n_k,
    "steps": _steps,
    "uniform": _uniform,
    "poisson": _poisson,
    "random_length": _random_length,
    "deadline": _deadline,
}
