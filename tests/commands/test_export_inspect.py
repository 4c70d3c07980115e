"""`askspec export RUN --inspect DIR`: the logs are read back with inspect-ai's own reader
and every field is checked against what `askspec query` says of the run: an Ask-E-shaped
run (four roles, a role on three models, a tournament with matches, an errored session,
token counts) and a Reasoning Arena run played by askspec (a live tournament judged by a
second model)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from askspec.cli import main
from askspec.runtime.commands.query import query

inspect_log = pytest.importorskip("inspect_ai.log")  # the dev extra installs it

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tui"))
from tui_helpers import ROOT, build_demo_run  # noqa: E402

from askspec.tui.data import FINAL_REWARDS  # noqa: E402  (the rewards `askspec query`/the TUI show)


def _rows(run: Path, sql: str) -> list[dict]:
    return query(run, sql).to_pylist()


def _export(run: Path, out: Path, capsys) -> list:
    capsys.readouterr()
    assert main(["export", str(run), "--inspect", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    logs = [inspect_log.read_eval_log(str(p)) for p in sorted(out.glob("*.eval"))]
    assert len(printed) == len(logs) >= 1
    return logs


def _check(run: Path, logs: list) -> None:
    """Every field of the logs against the run's views."""
    (info,) = _rows(run, "SELECT run_id, experiment, experiment_hash, seed FROM runs")
    sessions = {s["session_id"]: s for s in _rows(run, "SELECT * FROM sessions")}
    turns = _rows(run, "SELECT * FROM turns ORDER BY session_id, turn_index")
    finals = {(r["session_id"], r["role"]): r["total"] for r in _rows(run, FINAL_REWARDS)}
    groups = {g["group_id"]: g for g in _rows(run, "SELECT * FROM groups")}
    matches = _rows(run, "SELECT * FROM matches")
    games = {s["game"] for s in sessions.values()}
    assert sorted(log.eval.task for log in logs) == sorted(f"{info['experiment']}/{g}" for g in games)
    first_member = {(g["members"] or [None])[0]: gid for gid, g in groups.items()}
    for log in logs:
        game = log.eval.task.split("/", 1)[1]
        meta = log.eval.metadata["askspec"]
        assert (meta["run_id"], meta["experiment_hash"], meta["seed"]) == (info["run_id"], info["experiment_hash"],
                                                                          info["seed"])
        assert log.status == "success"
        mine = {sid for sid, s in sessions.items() if s["game"] == game}
        assert {s.id for s in log.samples} == mine
        # who played: each role and the models it ran on (a group's judge calls count for its game)
        in_game = [t for t in turns if t["session_id"] in mine or t["session_id"] in groups]
        models = defaultdict(set)
        usage = defaultdict(lambda: [0, 0])
        model_usage = defaultdict(lambda: [0, 0])
        for t in in_game:
            models[t["role"]].add(t["model"])
            usage[t["role"]][0] += t["tokens_in"]
            usage[t["role"]][1] += t["tokens_out"]
            model_usage[t["model"]][0] += t["tokens_in"]
            model_usage[t["model"]][1] += t["tokens_out"]
        roles = log.eval.model_roles
        assert set(roles) == set(models)
        for role, cfg in roles.items():
            names = {c.model for c in cfg} if isinstance(cfg, list) else {cfg.model}
            assert names == models[role], role
        assert {r: [u.input_tokens, u.output_tokens] for r, u in log.stats.role_usage.items()} == dict(usage)
        assert {m: [u.input_tokens, u.output_tokens] for m, u in log.stats.model_usage.items()} == dict(model_usage)
        for sample in log.samples:
            s = sessions[sample.id]
            own = [t for t in turns if t["session_id"] == sample.id]
            judged = [t for t in turns if t["session_id"] == first_member.get(sample.id)]
            assert sample.metadata["vars"] == json.loads(s["vars"])
            assert sample.metadata["params"] == json.loads(s["params"])
            assert sample.metadata["experiment_hash"] == info["experiment_hash"]
            assert sample.metadata["seed"] == s["seed"]
            # the transcript: every reply, in order, naming its model and role
            replies = [m for m in sample.messages if m.role == "assistant"]
            assert [(m.text, m.model, m.metadata["role"]) for m in replies] == \
                   [(t["text"], t["model"], t["role"]) for t in own]
            # one span per role, holding that role's calls
            spans = [e for e in sample.events if e.event == "span_begin"]
            calls = [e for e in sample.events if e.event == "model"]
            assert len(spans) == len({t["role"] for t in own}) + (1 if judged else 0)
            by_span = {sp.id: sp.name for sp in spans}
            assert [(c.role, c.model, c.output.completion, c.output.usage.input_tokens) for c in calls] == \
                   sorted([(t["role"], t["model"], t["text"], t["tokens_in"]) for t in own + judged],
                          key=lambda x: [sp.name.split(" ")[0] for sp in spans].index(x[0]))
            assert all(by_span[c.span_id].startswith(c.role) for c in calls)
            got_usage = {r: (u.input_tokens, u.output_tokens) for r, u in sample.role_usage.items()}
            want = defaultdict(lambda: [0, 0])
            for t in own + judged:
                want[t["role"]][0] += t["tokens_in"]
                want[t["role"]][1] += t["tokens_out"]
            assert got_usage == {r: tuple(v) for r, v in want.items()}
            # scores: each role's reward as the trainer uses it, and the outcome
            rewards = {k.split("/", 1)[1]: v.value for k, v in (sample.scores or {}).items() if k != "outcome"}
            assert rewards == pytest.approx({r: v for (sid, r), v in finals.items() if sid == sample.id})
            assert (sample.scores or {}).get("outcome", None) is None if s["outcome"] is None else \
                sample.scores["outcome"].value == s["outcome"]
            assert (sample.error is not None) == (s["status"] == "error")
            if s["group_id"] in groups:
                g = groups[s["group_id"]]
                got = sample.metadata["group"]
                assert (got["route"], got["members"], got["judge_calls"]) == (g["route"], g["members"],
                                                                              g["judge_calls"])
                assert got["stats"] == json.loads(g["stats"])
                assert sorted((m["a"], m["b"], m["verdict"]) for m in got["matches"]) == \
                       sorted((m["a"], m["b"], m["verdict"]) for m in matches
                              if m["group_id"] == s["group_id"] and sample.id in (m["a"], m["b"]))
        assert [sc.name for sc in log.results.scores] == sorted({f"reward/{r}" for (sid, r) in finals if sid in mine})


def test_ask_e_shaped_run(tmp_path, capsys):
    run = build_demo_run(tmp_path / "runs")
    logs = _export(run, tmp_path / "inspect", capsys)
    _check(run, logs)
    (log,) = logs
    # the facts this run was built with, so the checks above cannot pass on empty data
    assert isinstance(log.eval.model_roles["boundary_a"], list) and len(log.eval.model_roles["boundary_a"]) == 2  # small, mid
    assert log.stats.role_usage["questioner"].input_tokens > 0
    assert sum(len(s.metadata.get("group", {}).get("matches", [])) for s in log.samples) == 2 * 3
    assert sum(s.error is not None for s in log.samples) == 1


def test_reasoning_arena_run(tmp_path, capsys):
    from askspec.runtime.commands.run import run_spec

    rc, run = asyncio.run(run_spec(str(ROOT / "specs" / "reasoning_arena.ask"), eval_only=True,
                                   out=str(tmp_path / "runs"), sessions=8, quiet=True,
                                   model=["policy=python:fake_models:always_one",
                                          "judge=python:fake_models:judge_first"]))
    assert rc == 0 and run is not None
    logs = _export(Path(run), tmp_path / "inspect", capsys)
    _check(Path(run), logs)
    (log,) = logs
    assert set(log.eval.model_roles) == {"policy", "judge"}
    judged = [s for s in log.samples if any(e.event == "model" and e.role == "judge" for e in s.events)]
    assert len(judged) == 1 and judged[0].metadata["group"]["route"].startswith("tournament")


def test_without_the_extra(tmp_path, capsys, monkeypatch):
    run = build_demo_run(tmp_path / "runs")
    monkeypatch.setitem(sys.modules, "inspect_ai.log", None)  # import fails as if not installed
    assert main(["export", str(run), "--inspect", str(tmp_path / "inspect")]) == 1
    err = capsys.readouterr().err
    assert "pip install 'askspec[inspect]'" in err and err.count("\n") == 1
    assert not (tmp_path / "inspect").exists()


def test_one_of_the_formats(tmp_path, capsys):
    run = build_demo_run(tmp_path / "runs")
    assert main(["export", str(run)]) == 1
    assert "--parquet OUT" in capsys.readouterr().err
