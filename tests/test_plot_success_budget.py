"""`scripts/plot_success_budget.py`: success against the step budget from runs to a longer budget."""

import collections
import json
import re

import pytest
from conftest import load_script

budget_plot = load_script("plot_success_budget")


def _cell(success_steps: list[int], collisions: list[int], episodes: int = 4) -> dict:
    def histogram(steps: list[int]) -> dict[str, int]:
        return {str(step): count for step, count in sorted(collections.Counter(steps).items())}

    return {
        "episodes": episodes,
        "max_steps": 120,
        "collision_rate": len(collisions) / episodes,
        "success_steps_histogram": histogram(success_steps),
        "collision_steps_histogram": histogram(collisions),
    }


def _write_cells(root) -> None:
    runs = {"sync": ([90, 100], []), "naive": ([30, 35, 40], [21]), "rtc": ([30, 32, 44, 70], [])}
    for jitter, d in budget_plot.PANELS:
        for execution, (successes, collisions) in runs.items():
            folder = root / budget_plot.cell_name(execution, jitter, d)
            folder.mkdir()
            (folder / "results.json").write_text(json.dumps(_cell(successes, collisions)))


def test_ahead_from_is_where_the_leader_stays_strictly_ahead():
    assert budget_plot.ahead_from([0, 0.5, 0.5, 1.0], [0, 0.5, 0.75, 0.75]) == 3
    assert budget_plot.ahead_from([0, 0.6, 0.6, 1.0], [0, 0.5, 0.5, 0.75]) == 1
    assert budget_plot.ahead_from([0, 0.5, 0.5], [0, 0.5, 0.5]) is None


def test_the_table_reads_each_budget_and_the_plot_is_drawn(tmp_path):
    _write_cells(tmp_path)
    cells = budget_plot.load(tmp_path)
    text = budget_plot.table(cells, [42, 120])
    # rtc: 2 of 4 by step 42, 3 by 44 (level with naive's 3 of 4, one collided at 21), 4 by 70: strictly
    # ahead of naive from 70.
    assert "| exact | 5 | rtc | 0.500 | 1.000 | 0.000 |  |" in text
    assert "| exact | 5 | naive | 0.750 | 0.750 | 0.250 | of naive: 70 |" in text
    assert "| exact | 5 | sync | 0.000 | 0.500 | 0.000 | of sync: 30 |" in text
    png = tmp_path / "budget.png"
    budget_plot.plot(cells, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_a_missing_cell_is_named(tmp_path):
    with pytest.raises(SystemExit, match=re.escape("sync_d5/results.json is missing")):
        budget_plot.load(tmp_path)
