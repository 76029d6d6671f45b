"""Console output of the evaluation loops: progress bars, lines between them, and summary tables."""

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import tqdm

T = TypeVar("T")


def progress(iterable: Iterable[T], desc: str, *, leave: bool = True) -> Iterable[T]:
    """A tqdm bar on terminals; silent in logs (CI), where the per-episode lines say enough."""
    return tqdm.tqdm(iterable, desc=desc, leave=leave, dynamic_ncols=True, disable=None)


def echo(message: str) -> None:
    """Prints a line without breaking the progress bars."""
    tqdm.tqdm.write(message)


def format_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table with left-aligned columns (first) and right-aligned ones (the rest)."""
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        )

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(row) for row in cells[1:])])
