"""`scripts/plot_isolation.py` draws a probe's record, and refuses one without the timeline."""

import json

import pytest
from conftest import load_script

plot_isolation = load_script("plot_isolation")


def _record(**extra) -> dict:
    return {
        "command": "python scripts/probe_isolation.py --only=flood",
        "stall_table": [{"attack": "flood"}],
        **extra,
    }


def test_the_plot_is_written_beside_the_record(tmp_path):
    timeline = [[0.03 * i, 25.0 + (40.0 if i == 50 else 0.0)] for i in range(100)]
    record = _record(healthy_timeline=timeline, attack_windows={"bad key": [0.5, 0.8], "flood": [1.0, 2.0]})
    source = tmp_path / "isolation.json"
    source.write_text(json.dumps(record))
    plot_isolation.main(["plot_isolation.py", str(source)])
    png = tmp_path / "isolation.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_a_record_without_the_timeline_is_refused(tmp_path):
    source = tmp_path / "isolation.json"
    source.write_text(json.dumps(_record()))
    with pytest.raises(SystemExit, match="no healthy_timeline"):
        plot_isolation.main(["plot_isolation.py", str(source)])
