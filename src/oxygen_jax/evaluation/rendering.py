"""MuJoCo's offscreen renderer: chosen before a simulator is imported, and a hint when it fails."""

import ctypes.util
import os

from oxygen_jax.evaluation.requirements import MissingDependencyError

# MUJOCO_GL backend -> the system library it loads, and the Debian package that provides it.
_GL_LIBRARIES = {"egl": ("EGL", "libegl1"), "osmesa": ("OSMesa", "libosmesa6")}


def configure_mujoco_gl() -> str:
    """Picks MuJoCo's offscreen renderer before any simulator is imported (they read MUJOCO_GL then).

    An explicit MUJOCO_GL wins; otherwise EGL where libEGL exists, else OSMesa.
    """
    backend = os.environ.get("MUJOCO_GL")
    if not backend:
        backend = next((b for b, (lib, _) in _GL_LIBRARIES.items() if ctypes.util.find_library(lib)), None)
        if backend is None:
            raise MissingDependencyError(
                "no offscreen renderer for MuJoCo: neither libEGL nor libOSMesa is installed; "
                "run `apt-get update && apt-get install -y libosmesa6` (MUJOCO_GL=osmesa is then used)"
            )
        os.environ["MUJOCO_GL"] = backend
    if backend in _GL_LIBRARIES:
        library, package = _GL_LIBRARIES[backend]
        if not ctypes.util.find_library(library):
            raise MissingDependencyError(
                f"MUJOCO_GL={backend} needs lib{library}: `apt-get update && apt-get install -y {package}`"
            )
        os.environ.setdefault("PYOPENGL_PLATFORM", backend)
    return backend


def renderer_hint(error: Exception) -> str:
    """A failed first render usually means the chosen GL backend does not work on this machine."""
    backend = os.environ.get("MUJOCO_GL", "")
    other = "osmesa" if backend == "egl" else "egl"
    return (
        f"{type(error).__name__}: {error}\nMuJoCo offscreen rendering failed with MUJOCO_GL={backend!r}; "
        f"try MUJOCO_GL={other} (osmesa needs `apt-get install -y libosmesa6`)"
    )
