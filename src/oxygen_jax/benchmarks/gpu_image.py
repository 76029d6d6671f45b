"""Can the lent GPU machine's image run the benchmark as it is? Its package list against every distribution
the benchmark imports, and the wheels carried for the rest against the image's Python and the limit on
what travels with the working tree.

The machine reaches no package index: a distribution the image lacks must be a wheel in the carried
folder, for CPython 3.12 on x86-64 Linux, one version per distribution (pip refuses two in one install).
"""

import dataclasses
import importlib.metadata
import os
import pathlib
import subprocess
import sys
import sysconfig
import tomllib
from collections.abc import Mapping
from types import ModuleType

from packaging import tags, utils
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

IMAGE_PYTHON = (3, 12)
# manylinux_2_N wheels the image's glibc takes (the machine's notes: N up to 39).
IMAGE_GLIBC_MINOR = 39
TRAVEL_LIMIT_BYTES = 64 * 2**20  # the working tree and the carried wheels together
MIB = 2**20


def read_package_list(path: pathlib.Path) -> dict[str, str | None]:
    """Normalized distribution name -> version (None where the list gives none); '#' starts a comment."""
    packages = {}
    for line in path.read_text().splitlines():
        entry = line.partition("#")[0].strip()
        if entry:
            name, _, version = entry.partition("==")
            packages[utils.canonicalize_name(name)] = version or None
    return packages


def read_requirements(pyproject: pathlib.Path) -> dict[str, SpecifierSet]:
    """Normalized distribution name -> the versions the project's dependencies allow."""
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    requirements = [Requirement(d) for d in dependencies]
    return {utils.canonicalize_name(r.name): r.specifier for r in requirements}


def startup_modules() -> set[str]:
    """Modules this interpreter holds before any import of the program's (site hooks, .pth files)."""
    code = "import sys; print(*sys.modules, sep='\\n')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def _module_owners() -> dict[str, str]:
    """Absolute path of every installed module file -> the distribution that installed it."""
    owners = {}
    for dist in importlib.metadata.distributions():
        name = utils.canonicalize_name(dist.metadata["Name"])
        for file in dist.files or ():
            if file.suffix in (".py", ".so", ".pyc"):
                owners[os.path.abspath(dist.locate_file(file))] = name
    return owners


def imported_distributions(
    modules: Mapping[str, ModuleType], first_party: pathlib.Path
) -> tuple[dict[str, set[str]], set[str]]:
    """Distribution -> top-level names it was imported as, for `modules` outside the standard library and
    outside `first_party` (the checkout); and the top-level names of modules no distribution installed.
    Namespace packages and modules made at run time have no file of their own and are skipped."""
    owners = _module_owners()
    root = os.path.abspath(first_party) + os.sep
    stdlib = tuple(os.path.abspath(sysconfig.get_path(p)) + os.sep for p in ("stdlib", "platstdlib"))
    found: dict[str, set[str]] = {}
    unowned = set()
    for name, module in modules.items():
        top = name.partition(".")[0]
        file = getattr(module, "__file__", None)
        if top in sys.stdlib_module_names or not file:
            continue
        path = os.path.abspath(file)
        if owner := owners.get(path):  # before the checkout test: a virtual env may live inside it
            found.setdefault(owner, set()).add(top)
        elif not path.startswith((root, *stdlib)):  # stdlib's generated modules (_sysconfigdata_*)
            unowned.add(top)
    return found, unowned


def image_tags() -> frozenset[tags.Tag]:
    """Every wheel tag pip accepts on the image's CPython 3.12, x86-64 manylinux."""
    abi = f"cp{IMAGE_PYTHON[0]}{IMAGE_PYTHON[1]}"
    platforms = [f"manylinux_2_{n}_x86_64" for n in range(IMAGE_GLIBC_MINOR, 4, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
    return frozenset(
        [
            *tags.cpython_tags(IMAGE_PYTHON, [abi], platforms),
            *tags.compatible_tags(IMAGE_PYTHON, abi, platforms),
        ]
    )


@dataclasses.dataclass(frozen=True)
class Wheel:
    path: pathlib.Path
    name: str  # normalized distribution name
    version: str
    installs_on_image: bool


def read_wheels(folder: pathlib.Path) -> list[Wheel]:
    """The `.whl` files in `folder` (none if it does not exist), by file name."""
    supported = image_tags()
    wheels = []
    for path in sorted(folder.glob("*.whl")):
        name, version, _, wheel_tags = utils.parse_wheel_filename(path.name)
        wheels.append(Wheel(path, name, str(version), bool(wheel_tags & supported)))
    return wheels


def tree_bytes(root: pathlib.Path) -> int:
    """Bytes of what travels of the checkout: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    paths = (root / p for p in listed.decode().split("\0") if p)
    return sum(p.stat().st_size for p in paths if p.is_file())


@dataclasses.dataclass(frozen=True)
class Readiness:
    image: dict[str, str | None]
    imported: dict[str, set[str]]  # distribution -> top-level module names
    unowned: set[str]
    wheels: list[Wheel]
    tree_bytes: int
    requirements: dict[str, SpecifierSet] = dataclasses.field(default_factory=dict)  # the project's

    @property
    def carried(self) -> set[str]:
        return {w.name for w in self.wheels}

    @property
    def missing(self) -> dict[str, set[str]]:
        return {d: m for d, m in self.imported.items() if d not in self.image and d not in self.carried}

    @property
    def foreign_wheels(self) -> list[Wheel]:
        return [w for w in self.wheels if not w.installs_on_image]

    @property
    def duplicate_wheels(self) -> list[Wheel]:
        names = [w.name for w in self.wheels]
        return [w for w in self.wheels if names.count(w.name) > 1]

    @property
    def version_conflicts(self) -> list[str]:
        """The project's requirements that a version read in the image, or a wheel's, does not meet."""
        versions = {name: v for name, v in self.image.items() if v} | {w.name: w.version for w in self.wheels}
        return [
            f"{name} {versions[name]} does not meet the project's requirement {spec}"
            for name, spec in sorted(self.requirements.items())
            if name in versions and not spec.contains(versions[name], prereleases=True)
        ]

    @property
    def travel_bytes(self) -> int:
        return self.tree_bytes + sum(w.path.stat().st_size for w in self.wheels)

    @property
    def ready(self) -> bool:
        return not (
            self.missing
            or self.unowned
            or self.foreign_wheels
            or self.duplicate_wheels
            or self.version_conflicts
            or self.travel_bytes > TRAVEL_LIMIT_BYTES
        )

    def lines(self, wheels_dir: pathlib.Path) -> list[str]:
        """What was checked, one line per finding, then `ready` or `not ready`."""
        from_image = sorted(d for d in self.imported if d in self.image)
        from_wheels = sorted(d for d in self.imported if d not in self.image and d in self.carried)
        wheel_bytes = self.travel_bytes - self.tree_bytes
        out = [
            f"image: {len(self.image)} distributions listed",
            f"imports: {len(self.imported)} distributions, {len(from_image)} in the image, "
            f"{len(from_wheels)} from wheels ({', '.join(from_wheels) or 'none'})",
            f"wheels: {len(self.wheels)} in {wheels_dir} ({wheel_bytes / MIB:.1f} MiB)",
            f"travels: {self.tree_bytes / MIB:.1f} MiB tree + {wheel_bytes / MIB:.1f} MiB wheels = "
            f"{self.travel_bytes / MIB:.1f} MiB (limit {TRAVEL_LIMIT_BYTES / MIB:.0f} MiB)",
        ]
        out += [
            f"missing: {dist} (imported as {', '.join(sorted(mods))}): not in the image and no wheel in "
            f"{wheels_dir} (scripts/gpu_wheels.sh)"
            for dist, mods in sorted(self.missing.items())
        ]
        out += [f"missing: {top}: from a file no distribution installed" for top in sorted(self.unowned)]
        out += [f"wheel not for CPython 3.12 on x86-64 Linux: {w.path.name}" for w in self.foreign_wheels]
        out += [f"two versions of one distribution: {w.path.name}" for w in self.duplicate_wheels]
        out += [f"version: {conflict}" for conflict in self.version_conflicts]
        if self.travel_bytes > TRAVEL_LIMIT_BYTES:
            out.append("too large to travel: the tree and the wheels exceed the limit")
        return [*out, "ready" if self.ready else "not ready"]


def check(
    modules: Mapping[str, ModuleType],
    package_list: pathlib.Path,
    wheels_dir: pathlib.Path,
    root: pathlib.Path,
) -> Readiness:
    """`modules`: what the benchmark imported (sys.modules less the interpreter's own start-up modules);
    `root`: the checkout (its own modules are skipped, its files travel, its pyproject.toml says which
    versions the project needs)."""
    imported, unowned = imported_distributions(modules, root)
    image = read_package_list(package_list)
    wheels = read_wheels(wheels_dir)
    requirements = read_requirements(root / "pyproject.toml")
    return Readiness(image, imported, unowned, wheels, tree_bytes(root), requirements)
