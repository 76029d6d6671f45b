"""The Dockerfile read statically (no docker here): the server runs as an unprivileged user, Docker's
health check asks the server's /readyz, and `docker run -p 8000:8000 IMAGE` with no arguments serves the
shipped demo model through the installed `oxygen-serve` command. (tests/test_install_pins.py checks that
every COPY source exists and the install line.)"""

import json
import pathlib
import shlex
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined and comments dropped."""
    lines, current = [], ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        current += line.rstrip().removesuffix("\\") + " " if line.rstrip().endswith("\\") else line
        if not line.rstrip().endswith("\\"):
            lines.append(current.strip())
            current = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def _words(arguments: str) -> list[str]:
    """An exec-form (JSON array) or shell-form argument list as words."""
    return json.loads(arguments) if arguments.startswith("[") else shlex.split(arguments)


def _last(name: str) -> str:
    found = [arguments for instruction, arguments in instructions() if instruction == name]
    assert found, f"no {name} in the Dockerfile"
    return found[-1]


def test_the_server_runs_as_an_unprivileged_user():
    user = _last("USER").split(":")[0]
    assert user not in ("root", "0")
    run = " ".join(arguments for instruction, arguments in instructions() if instruction == "RUN")
    assert f"useradd --create-home --uid 1000 {user}" in run


def test_the_health_check_asks_readyz_on_the_served_port():
    options, _, command = _last("HEALTHCHECK").partition(" CMD ")
    assert "--start-period=" in options  # loading and compiling the model is no failure
    words = _words(command.strip())
    assert "http://127.0.0.1:8000/readyz" in " ".join(words)
    assert words[0] in ("python", "curl")  # python:slim has python, not curl
    assert ("EXPOSE", "8000") in instructions()


def test_the_default_command_serves_the_shipped_demo_model():
    entrypoint, command = _words(_last("ENTRYPOINT")), _words(_last("CMD"))
    assert entrypoint[0] == "oxygen-serve" and entrypoint[0] in SCRIPTS
    assert "--host=0.0.0.0" in entrypoint and "--port=8000" in entrypoint
    assert "--config=pi05_demo" in entrypoint + command
