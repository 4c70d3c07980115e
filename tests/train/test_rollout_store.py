"""The run store's training records: flat `train_steps` columns and the `rollouts` view
over Parquet shards (latest attempt of each session only)."""

from __future__ import annotations

from askspec.runtime.store import rollouts
from askspec.runtime.store.views import open_store
from askspec.runtime.store.writer import RunWriter


def make_run(tmp_path):
    return RunWriter.create(tmp_path, experiment="t", experiment_hash="h", ir_json="{}", spec_files={}, seed=0,
                            roles={}, params={}, planned_sessions=1, argv=[])


def test_train_steps_have_flat_columns(tmp_path):
    w = make_run(tmp_path)
    w.train_step("policy", 1, {"loss": 0.5, "reward_mean": 0.25, "lr": 1e-6, "tokens": 12, "extra": 3})
    w.finish()
    con = open_store(w.run_dir)
    row = con.execute("SELECT role, step, loss, reward_mean, lr, tokens, clip_frac, metrics->>'$.extra' FROM train_steps").fetchone()
    assert row == ("policy", 1, 0.5, 0.25, 1e-6, 12, None, "3")


def test_rollouts_view_keeps_the_latest_attempt(tmp_path):
    w = make_run(tmp_path)
    a1 = w.session_started("s000000", game="g", group_id=None, params={}, index=0)
    w.session_finished("s000000", a1, status="ok", outcome=None, error=None, vars={})
    w.flush()
    row = dict(run_id=w.run_id, session_id="s000000", attempt=a1, turn_index=0, role="policy", step=1,
               trajectory="s000000/policy", group_key="s000000", policy_version=0, temperature=1.0,
               finish_reason="stop", prompt_ids=[1, 2, 3], completion_ids=[7, 2], logprobs=[-0.5, -0.1], gen=0)
    rollouts.write_shard(w.run_dir, 1, 0, [row])
    con = open_store(w.run_dir)
    got = con.execute("SELECT session_id, prompt_ids, completion_ids, logprobs FROM rollouts").fetchall()
    assert got == [("s000000", [1, 2, 3], [7, 2], [-0.5, -0.10000000149011612])]
    # the session is run again (a resumed step): only the new attempt's rollouts count
    a2 = w.session_started("s000000", game="g", group_id=None, params={}, index=0)
    w.session_finished("s000000", a2, status="ok", outcome=None, error=None, vars={})
    w.finish()
    rollouts.write_shard(w.run_dir, 1, 1, [{**row, "attempt": a2, "completion_ids": [9, 2], "gen": 1}])
    con = open_store(w.run_dir)
    assert con.execute("SELECT attempt, completion_ids FROM rollouts").fetchall() == [(2, [9, 2])]
    assert con.execute("SELECT count(*) FROM events_rollouts").fetchone() == (2,)


def test_a_run_without_rollouts_has_an_empty_view(tmp_path):
    w = make_run(tmp_path)
    w.finish()
    assert open_store(w.run_dir).execute("SELECT count(*) FROM rollouts").fetchone() == (0,)
