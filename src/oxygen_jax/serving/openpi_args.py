"""openpi's `serve_policy.py` command line read as ours, so a command copied from openpi's docs works:

  policy:checkpoint --policy.config=pi05_libero --policy.dir=DIR
      -> --config=pi05_libero --checkpoint_dir=DIR
  policy:default -> --checkpoint_dir=default

Both `--policy.x=V` and `--policy.x V` (tyro's forms) are read. The table is in docs/serving.md.
"""

_SUBCOMMANDS = {"policy:checkpoint": [], "policy:default": ["--checkpoint_dir=default"]}
_POLICY_FLAGS = {"--policy.config": "--config", "--policy.dir": "--checkpoint_dir"}


class OpenpiSyntaxError(ValueError):
    """An openpi-style argument without its value."""


def translate(argv: list[str]) -> tuple[list[str], str | None]:
    """(argv with openpi's policy arguments replaced by our flags, a one-line note saying what was read
    as what; None when argv holds none of them). argv[0], the program, is kept."""
    out, mapped = argv[:1], []
    args = iter(argv[1:])
    for arg in args:
        name, sep, value = arg.partition("=")
        if arg in _SUBCOMMANDS:
            out += _SUBCOMMANDS[arg]
            mapped.append((arg, " ".join(_SUBCOMMANDS[arg])))
        elif name in _POLICY_FLAGS:
            if not sep:
                value = next(args, None)
                if value is None or value.startswith("--"):
                    raise OpenpiSyntaxError(f"{name} needs a value ({name}=VALUE)")
            ours = f"{_POLICY_FLAGS[name]}={value}"
            out.append(ours)
            mapped.append((f"{name}={value}", ours))
        else:
            out.append(arg)
    if not mapped:
        return out, None
    read = ", ".join(f"{theirs} as {ours}" if ours else f"{theirs} as implied" for theirs, ours in mapped)
    return out, f"openpi's serve_policy.py syntax: read {read} (docs/serving.md)"
