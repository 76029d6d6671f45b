"""dm-control runs only on the MuJoCo releases it was built for; another pair fails late and looks unrelated.

With a mujoco older than dm-control needs, creating an ALOHA env dies inside dm-control with
`'MjModel' object has no attribute 'actuator_armature'`, which reads like a rendering problem. Before the
simulator is imported, the installed pair is checked against dm-control's own declared mujoco requirement
(so every release is covered without a table of versions).
"""

from collections.abc import Iterable
from importlib import metadata

from packaging.requirements import Requirement

# The pair both simulator extras pin (pyproject.toml), which every extra install order ends with.
FIX = (
    'pip install "dm-control>=1.0.34,<1.0.35" "mujoco>=3.3.6,<3.4" '
    "(what the oxygen_jax[aloha] and oxygen_jax[libero] extras pin)"
)


def mismatch(dm_control_version: str, dm_control_requires: Iterable[str], mujoco_version: str) -> str | None:
    """One line saying why this dm-control cannot run on this mujoco, or None when the pair fits."""
    for text in dm_control_requires:
        requirement = Requirement(text)
        applies = requirement.marker is None or requirement.marker.evaluate({"extra": ""})
        fits = requirement.specifier.contains(mujoco_version, prereleases=True)
        if requirement.name == "mujoco" and applies and not fits:
            return (
                f"dm-control {dm_control_version} needs {requirement} but mujoco {mujoco_version} is "
                f"installed (an incompatible pair, not a rendering problem); {FIX}"
            )
    return None


def installed_mismatch() -> str | None:
    """`mismatch` for the installed packages; None when either is absent (that is reported on import)."""
    try:
        dm_control_version = metadata.version("dm-control")
        mujoco_version = metadata.version("mujoco")
    except metadata.PackageNotFoundError:
        return None
    return mismatch(dm_control_version, metadata.requires("dm-control") or [], mujoco_version)
