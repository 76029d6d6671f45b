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


def test_behind_at_names_the_budgets_where_rtc_succeeds_less_often():
    assert budget_plot.behind_at([0, 0.5, 0.5, 1.0, 0.5, 0.5], [0, 0.6, 0.6, 0.75, 0.75, 0.5]) == "1-2, 4"
    assert budget_plot.behind_at([0, 0.5, 0.5], [0, 0.5, 0.5]) == "none"


def test_the_table_reads_each_budget_and_the_plot_is_drawn(tmp_path):
    _write_cells(tmp_path)
    cells = budget_plot.load(tmp_path)
    text = budget_plot.table(cells, [42, 120])
    # rtc: 2 of 4 by step 42, 3 by 44 (level with naive's 3 of 4, one collided at 21), 4 by 70: behind
    # naive from naive's third success (40) until rtc's third (44); behind sync nowhere.
    assert "| exact | 5 | rtc | 0.500 | 1.000 | 0.000 |  |" in text
    assert "| exact | 5 | naive | 0.750 | 0.750 | 0.250 | 40-43 |" in text
    assert "| exact | 5 | sync | 0.000 | 0.500 | 0.000 | none |" in text
    png = tmp_path / "budget.png"
    budget_plot.plot(cells, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_a_missing_cell_is_named(tmp_path):
    with pytest.raises(SystemExit, match=re.escape("sync_d5/results.json is missing")):
        budget_plot.load(tmp_path)
