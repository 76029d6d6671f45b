"""`scripts/probe_isolation.py` end to end: serve.py on the tiny model (language on) under every hostile
kind of request and transport fault, beside a healthy robot that checks its own replies."""

import json
import re
import subprocess
import sys

import pytest
from conftest import SCRIPTS, load_script

from oxygen_jax.policies import libero

hostile_probe = load_script("hostile_probe")
stall_attacks = load_script("stall_attacks")
SCRIPT = SCRIPTS / "probe_isolation.py"


def test_hostile_kinds_each_break_one_thing_of_a_valid_observation():
    base = hostile_probe.valid_observation(libero.RAW_SPEC)
    cases = hostile_probe.hostile_requests(libero.RAW_SPEC, base)
    assert len(cases) >= 40
    assert base["observation/image"].dtype.name == "uint8" and base["observation/state"].shape == (8,)
    assert {"state string", "image uint16", "extra actions key", "missing state"} <= set(cases)
    assert cases["extra actions key"]["observation/image"] is base["observation/image"]


def test_the_controls_worst_of_as_many_replies_is_the_median_worst_of_every_run_that_long():
    control = [1.0, 5.0, 1.0, 1.0, 2.0, 1.0]
    assert stall_attacks.control_worst(control, 2) == 2.0  # runs of two: worst 5, 5, 1, 2, 2
    assert stall_attacks.control_worst(control, 1) == 1.0  # a single reply: the control's median
    assert stall_attacks.control_worst(control, 6) == 5.0 == stall_attacks.control_worst(control, 60)
    assert stall_attacks.control_worst([], 3) is None and stall_attacks.control_worst(control, 0) is None


def test_each_attack_is_judged_against_the_healthy_robots_median_just_before_it():
    # Replies (sent, got, unchanged): alone at 10 ms, then quiet before "a" at 20 ms (the machine slowed),
    # "a" at worst 50 ms; quiet before "b" and "c" (earlier kinds, refused) at 30 and 40 ms, both worst 60.
    times = [(t, t + 0.010, True) for t in (0.0, 0.1, 0.2)]
    times += [(t, t + 0.020, True) for t in (1.0, 1.1, 1.2)] + [(2.0, 2.050, True), (2.1, 2.110, True)]
    times += [(3.0, 3.030, True), (3.1, 3.130, True), (4.0, 4.060, True)]
    times += [(5.0, 5.040, True), (5.1, 5.140, True), (6.0, 6.060, True)]
    refused = hostile_probe.Outcome("refused", "Bad request")
    report = hostile_probe.ProbeReport(
        outcomes={"a": refused, "b": refused, "c": refused},
        healthy_times=times,
        windows={"a": (2.0, 2.5), "b": (4.0, 4.5), "c": (6.0, 6.5)},
        quiet={"a": (1.0, 1.5), "b": (3.0, 3.5), "c": (5.0, 5.5)},
    )
    rows = {row["attack"]: row for row in stall_attacks.stall_table(report, ["a"], rss=None)}
    assert rows["a"]["median alone ms"] == 15.0  # every reply before the first attack: 10, 10, 10, 20, 20, 20
    assert rows["a"]["worst / median"] == round(50 / 15, 2)
    assert rows["a"]["median just before ms"] == 20.0 and rows["a"]["worst / median just before"] == 2.5
    earlier = rows["the 2 earlier kinds refused"]  # their quiet replies pooled: 30, 30, 40, 40 ms
    assert earlier["median just before ms"] == 35.0
    assert earlier["worst / median just before"] == round(60 / 35, 2)


@pytest.mark.slow  # ~2 min on a quiet 2-core machine: the script is also the recorded figure
@pytest.mark.timeout(600)
def test_no_hostile_request_reaches_the_healthy_robot(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--env=libero",
            "--max_text_tokens=4",
            "--scale=0.05",
            f"--out={tmp_path}",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    record = json.loads((tmp_path / "isolation.json").read_text())
    summary, outcomes = record["summary"], record["outcomes"]
    assert summary["healthy_affected"] == 0 and summary["healthy_replies"] > 10
    assert summary["healthy_texts_done"] > 0  # its language kept completing under attack
    assert summary["hostile_kinds"] == len(outcomes) >= 45
    for name in ("state string", "image uint16", "state 1000-level nesting", "option temperature inf"):
        assert outcomes[name]["kind"] == "refused" and "\n" not in outcomes[name]["detail"], name
    oversize = outcomes["fault 200 MB message"]
    assert oversize["kind"] == "closed" and "1009" in oversize["detail"]
    assert outcomes["extra actions key"]["kind"] == "answered"
    for name in ("0.75 MB list of ints x3", "0.75 MB task instruction", "task options as strings and floats"):
        assert outcomes[name]["kind"] == "refused", name
    assert outcomes["no API key"]["detail"].startswith("HTTP 401")
    assert outcomes["63 idle subscribers + 60 idle robots"]["kind"] == "answered"
    assert (
        outcomes["1-byte fragments"]["kind"] == "closed" and "1008" in outcomes["1-byte fragments"]["detail"]
    )
    for name in ("rtc control_hz inf after a chunk", "1x5000x3 image", "wrong API keys for 1 s"):
        assert outcomes[name]["kind"] == "refused", (name, outcomes[name])
    flood = outcomes["flood of tiny bad messages for 1 s"]
    assert flood["kind"] == "refused" and "server log +" in flood["detail"], flood
    closed_floods = re.search(r"\((\d+) closed by the server for flooding", flood["detail"])
    assert closed_floods and int(closed_floods.group(1)) >= 1, flood  # and it connected again
    assert outcomes["60 handshakes at once"]["kind"] == "answered"
    assert outcomes["4 x 0.75 MB requests pipelined, never read"]["kind"] == "closed"
    shutdown = outcomes["SIGTERM while four robots keep sending"]
    assert shutdown["kind"] == "answered" and " 0 lost;" in shutdown["detail"], shutdown
    stalls = {row["attack"]: row for row in record["stall_table"]}
    assert all(row.get("healthy errors or changes", 0) == 0 for row in stalls.values())
    # The control's own row: its worst is the control's worst of as many replies (all of them).
    assert any(name.startswith("the ") and name.endswith(" earlier kinds refused") for name in stalls)
    control = next(row for name, row in stalls.items() if name.endswith("(control)"))
    assert control["control's worst of as many / median"] == control["worst / median"]
