"""The pieces every evaluation loop shares: keeping a rollout's policy calls, and the results file rewritten
after each episode."""

import json

from oxygen_jax.evaluation import chunking, records


def test_keep_replan_keeps_each_policy_call_and_shows_only_what_the_model_said(capsys):
    replans: list[chunking.Replan] = []
    chunking.keep_replan(replans, None)  # a step without a policy call
    chunking.keep_replan(replans, chunking.Replan(step=3, latency_ms=1.5, text="pick up the cup"))
    chunking.keep_replan(replans, chunking.Replan(step=6, latency_ms=1.0, text=None))
    assert [replan.step for replan in replans] == [3, 6]
    assert capsys.readouterr().out == "  step 3: 'pick up the cup'\n"


def test_add_episode_summarizes_every_episode_so_far_and_rewrites_the_results_file(tmp_path):
    def summarize(episodes: list[dict]) -> dict:
        return {"episodes": len(episodes), "successes": sum(e["success"] for e in episodes)}

    results = {"env": "test", "episodes": []}
    records.add_episode(results, {"success": True}, summarize, tmp_path)
    assert json.loads((tmp_path / "results.json").read_text())["summary"] == {"episodes": 1, "successes": 1}
    records.add_episode(results, {"success": False}, summarize, tmp_path)
    assert results == {
        "env": "test",
        "episodes": [{"success": True}, {"success": False}],
        "summary": {"episodes": 2, "successes": 1},
    }
    assert json.loads((tmp_path / "results.json").read_text()) == results
