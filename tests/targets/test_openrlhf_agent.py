"""The generated OpenRLHF agent, loaded and driven by OpenRLHF 0.11.2's own code
(`_load_agent_executor`, `RolloutRayActor.generate_responses`) with a scripted llm_engine:
each rollout's reward equals what `askspec run --backend replay` records for the same
replies, its action ranges are exactly the trained role's generated tokens, and the
tokens between them are the other roles' messages as the chat template renders them."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from askspec.lang.compiler import compile_file
from askspec.runtime.backends.registry import aclose_backends
from askspec.runtime.commands.run import run_spec
from askspec.runtime.scoring.trajectory import trajectory_return
from askspec.runtime.store.views import open_store
from askspec.runtime.targets.openrlhf.generate import compile_job

from openrlhf_harness import (FakeEngine, FakeSamplingParams, generate_responses, load_agent_executor,
                              smollm2_tokenizer)

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "specs"
pytestmark = pytest.mark.slow  # the SmolLM2 tokenizer (converted once from the packaged GGUF)


@pytest.fixture(scope="module")
def tokenizer():
    return smollm2_tokenizer()


def make_job(spec: Path, out: Path, sets: dict[str, str], substitutes: dict | None = None) -> Path:
    res = compile_file(str(spec), sets)
    assert res.ok
    assert compile_job(res, str(spec), str(out), substitutes or {}) == 0
    return out


def undrawn(job: Path) -> None:
    """The job's prompt lines without their draws: the agent then plays the k-th group of an
    element as repeat k of `askspec run`'s plan (its seeds and group ids), for a test that
    compares the agent with an `askspec run`. A drawn line plays the local trainer's group
    (test_a_drawn_line_plays_the_local_steps_sessions)."""
    path = job / "prompts.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for line in lines:
        label = json.loads(line["label"])
        label.pop("draw", None)
        line["label"] = json.dumps(label)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def replay_frozen_roles(job: Path, recording: Path) -> None:
    """Point every frozen model of job.json at the replay backend (job.json's endpoints are
    meant to be edited; the test serves the frozen roles from the same recording)."""
    data = json.loads((job / "job.json").read_text())
    for table in ("roles", "models"):
        for name in data["endpoints"][table]:
            data["endpoints"][table][name] = {"backend": "replay", "weights": "", "options": {"file": str(recording)}}
    (job / "job.json").write_text(json.dumps(data))


def expected_returns(run_dir: str, role: str) -> dict[int, float | None]:
    """Per session index: the contract applied to what `askspec run` recorded."""
    con = open_store(run_dir)
    index = {sid: int(sid[1:]) for (sid,) in con.execute("select session_id from sessions").fetchall()}
    rows: dict[str, list] = {sid: [] for sid in index}
    routed: dict[str, float] = {}
    routes = dict(con.execute("select group_id, route from groups").fetchall())
    members = {sid: gid for sid, gid in con.execute("select session_id, group_id from sessions").fetchall()}
    for sid, r, turn, name, value in con.execute(
            "select session_id, role, turn_index, name, value from rewards order by session_id").fetchall():
        route = routes.get(members.get(sid), "") or ""
        if r == role and name in ("tournament", "judge") and route.startswith(name + ":"):
            routed[sid] = value
        else:
            rows[sid].append((r, turn, name, value))
    return {index[sid]: trajectory_return(rows[sid], role, None, routed.get(sid)) for sid in index}


def recorded_turns(run_dir: str, role: str) -> dict[int, list[tuple[list, str]]]:
    con = open_store(run_dir)
    out: dict[int, list] = {}
    for sid, prompt, text in con.execute(
            "select session_id, prompt, text from turns where role = ? order by session_id, turn_index", [role]).fetchall():
        out.setdefault(int(sid[1:]), []).append((json.loads(prompt) if isinstance(prompt, str) else prompt, text))
    return out


class SessionScript:
    """The trained role's replies session by session, for sessions that run concurrently:
    a prompt holding a reply already given belongs to that reply's session, any other is
    the next session's first call (sessions start in order). Each session's first reply
    must be unique to it."""

    def __init__(self, per_session: list[list[str]]) -> None:
        self.per_session = per_session
        self.given: list[list[str]] = []

    def __call__(self, prompt: str) -> str:
        for k, given in enumerate(self.given):
            if given[0] in prompt:
                given.append(self.per_session[k][len(given)])
                return given[-1]
        self.given.append([self.per_session[len(self.given)][0]])
        return self.given[-1][0]


async def drive(job: Path, tokenizer, elements: int | None, group: int, replies, max_length: int = 4096):
    """The first `elements` elements (None: all of prompts.jsonl) through OpenRLHF's
    generate_responses; the engine answers the trained role's calls with `replies` (a list,
    in call order, or a script of the prompt)."""
    executor = load_agent_executor(job / "agent.py")
    if callable(replies):
        script = replies
    else:
        it = iter(replies)
        script = lambda prompt: next(it)  # noqa: E731
    engine = FakeEngine(executor, tokenizer, script)
    lines = [json.loads(x) for x in (job / "prompts.jsonl").read_text().splitlines()][:elements]
    out = []
    for line in lines:
        params = FakeSamplingParams(temperature=1.0, logprobs=1)
        out += await generate_responses(engine, line["prompt"], line["label"], params, max_length, tokenizer, group)
    await aclose_backends()
    executor.agent.close()
    return out, engine


def test_reasoning_arena_tournament_rewards_match_replay(tmp_path, tokenizer, monkeypatch):
    """Reasoning Arena (cispo substituted by grpo): a diverse group keeps its verifier
    rewards; a non-diverse group goes to the live tournament inside the agent, judged on
    the judge's endpoint, and every member returns its Bradley-Terry score."""
    sets = {"group_size": "4", "advantage_std": "sample"}  # OpenRLHF's group_norm std (E604 for Eq. 2's)
    # the first two problems of the spec's data set are the two groups' elements
    with open(SPECS / "data" / "math_problems.jsonl") as f:
        answers = [json.loads(next(f))["answer"] for _ in range(2)]
    policy = []
    for k in range(8):  # group 0: 2 right, 2 wrong (kept); group 1: all wrong (tournament)
        right = k < 4 and k % 2 == 0
        policy.append(f"Work for trace {k}. The answer is \\boxed{{{answers[k // 4] if right else 7 + k}}}.")
    verdicts = ["The first is better. \\boxed{A}", "\\boxed{B}", "Equal. \\boxed{Tie}"] * 10
    sessions = [{"policy": [policy[k]]} for k in range(8)]
    sessions[4]["judge"] = verdicts  # a group's judge calls are keyed on its first session
    recording = tmp_path / "replies.json"
    recording.write_text(json.dumps({"sessions": sessions}))
    spec = SPECS / "reasoning_arena.ask"
    rc, run_dir = asyncio.run(run_spec(str(spec), out=str(tmp_path / "runs"), replay=str(recording), eval_only=True,
                                       set=[f"{k}={v}" for k, v in sets.items()], sessions=8))
    assert rc == 0
    expected = expected_returns(run_dir, "policy")
    con = open_store(run_dir)
    routes = sorted(r for (r,) in con.execute("select route from groups").fetchall())
    assert routes == ["keep", "tournament:arena"]

    job = make_job(spec, tmp_path / "job", sets, {"cispo": "grpo"})
    undrawn(job)  # the tournament's pairs follow the group's seeds: `askspec run`'s here
    replay_frozen_roles(job, recording)
    monkeypatch.setenv("ASKSPEC_RUNS", str(tmp_path / "agent-runs"))
    responses, engine = asyncio.run(drive(job, tokenizer, elements=2, group=4, replies=policy))
    assert len(responses) == 8
    got = [r["reward"] for r in responses]
    assert got == pytest.approx([expected[k] for k in range(8)], abs=1e-12)
    assert got[:4] == [1.0, 0.0, 1.0, 0.0]
    assert len(set(got[4:])) > 1 and all(0.0 <= g <= 1.0 for g in got[4:])  # contest scores, not verifier zeros
    for k, r in enumerate(responses):  # one trained turn: its range is exactly the generated ids
        (start, end), = r["action_ranges"]
        assert r["observation_tokens"][start:end] == engine.calls[k]["ids"]
        assert end == len(r["observation_tokens"])
        assert len(r["rollout_log_probs"]) == len(r["observation_tokens"])
    # the agent's own run directory recorded the same routed group
    agent_run = next((tmp_path / "agent-runs").iterdir())
    agent_routes = sorted(r for (r,) in open_store(str(agent_run)).execute("select route from groups").fetchall())
    assert agent_routes == routes


def askbench_recording(n_sessions: int) -> tuple[list[dict], list[str]]:
    """Judge/user/assistant replies for AskBench sessions: a clarifying question then a
    correct answer; a premature answer; a session whose judge never parses (skipped)."""
    def judge(final: bool, correct, missing: list[str], resolved: bool) -> str:
        return json.dumps({"is_final_answer": final, "is_correct": correct, "all_rubric_criteria_resolved": resolved,
                           "missing_rubric_criteria": missing, "notes": "ok"})

    sessions, assistant = [], []
    for k in range(n_sessions):
        kind = k % 3
        if kind == 0:  # ask once (resolves one item), then answer correctly
            a = [f"Could you tell me more about case {k}?", f"The answer for case {k} is final."]
            # the question targets one rubric item of either data item (c_t = 1 < m: +0.8): the
            # first two of the spec's training pool (its AskMind items, two rubric items each)
            pool = (SPECS / "data" / "askbench_train.jsonl").read_text().splitlines()[:2]
            targeted = json.dumps({"targeted_rubric_criteria": [json.loads(line)["rubric"][0] for line in pool]})
            s = {"assistant": a, "judge": [judge(False, None, ["x"], False), judge(True, True, [], True)],
                 "targets": [targeted], "user": [f"Here is the detail for {k}."]}
        elif kind == 1:  # a premature wrong answer on the first turn
            a = [f"It is obviously {k}."]
            s = {"assistant": a, "judge": [judge(True, False, ["x", "y"], False)]}
        else:  # the judge's JSON never parses: skipped, the session is dropped
            a = [f"Hmm {k}?"]
            s = {"assistant": a, "judge": ["no json", "still none", "nope"]}
        sessions.append(s)
        assistant += a
    return sessions, assistant


def test_askbench_multi_turn_rewards_ranges_and_feedback(tmp_path, tokenizer, monkeypatch):
    """AskBench: a multi-turn assistant with per-turn and terminal rewards, a judge and a
    user simulator on endpoints, and a dropped (skipped) session."""
    sets = {"rollouts": "3"}
    sessions, assistant = askbench_recording(6)
    recording = tmp_path / "replies.json"
    recording.write_text(json.dumps({"sessions": sessions}))
    spec = SPECS / "askbench.ask"
    rc, run_dir = asyncio.run(run_spec(str(spec), out=str(tmp_path / "runs"), replay=str(recording), eval_only=True,
                                       set=[f"{k}={v}" for k, v in sets.items()], sessions=6))
    assert rc == 0
    expected = expected_returns(run_dir, "assistant")
    turns = recorded_turns(run_dir, "assistant")

    job = make_job(spec, tmp_path / "job", sets)
    replay_frozen_roles(job, recording)
    monkeypatch.setenv("ASKSPEC_RUNS", str(tmp_path / "agent-runs"))
    per_session = [s["assistant"] for s in sessions]
    responses, engine = asyncio.run(drive(job, tokenizer, elements=2, group=3, replies=SessionScript(per_session)))
    assert len(responses) == 6
    for k, r in enumerate(responses):
        want = expected[k]
        assert r["reward"] == pytest.approx(0.0 if want is None else want, abs=1e-12), k
        assert len(turns[k]) == len(per_session[k])
        mine = [{"ids": tokenizer(text=t, add_special_tokens=False)["input_ids"] + [2]} for t in per_session[k]]
        obs = r["observation_tokens"]
        if k % 3 == 2:  # skipped: recorded, but no loss anywhere
            assert want is None and r["action_ranges"] == []
            continue
        # one range per assistant turn, each exactly the generated ids
        assert [obs[s:e] for s, e in r["action_ranges"]] == [c["ids"] for c in mine]
        # everything else is the conversation the engine sent: the last turn's prompt,
        # as the chat template renders it, followed by the last generated reply
        last_prompt, last_text = turns[k][-1]
        end = r["action_ranges"][-1][0]
        assert tokenizer.decode(obs[:end]) == tokenizer.apply_chat_template(
            last_prompt, add_generation_prompt=True, tokenize=False)
        assert end + len(mine[-1]["ids"]) == len(obs)  # the trajectory ends with the game
        # feedback between turns: the judge-free user reply, rendered by the template
        for (s0, e0), (s1, _e1), (prompt, _) in zip(r["action_ranges"], r["action_ranges"][1:], turns[k][1:]):
            assert tokenizer.decode(obs[e0:s1]) == "\n<|im_start|>user\n" + prompt[-1]["content"] + \
                "<|im_end|>\n<|im_start|>assistant\n"
    assert [len(r["action_ranges"]) for r in responses] == [2, 1, 0, 2, 1, 0]
    # some items asked (+0.8), then a correct answer before the last turn (premature: -2.0, +1.0);
    # a premature wrong answer (-2.0, -1.0)
    assert [r["reward"] for r in responses][:2] == [pytest.approx(0.8 - 2.0 + 1.0), pytest.approx(-2.0 - 1.0)]


def ask_e_recording(n: int) -> list[dict]:
    """Ask-E sessions with one probing round: calibrated, too_easy, a recovered probe, and a
    final turn that never gets its #Question# (too_hard without boundary calls). Every
    questioner reply names its session ("(case k)")."""
    q = "#Reasoning# think #Draft# d #Question# {}"
    sessions = []
    for k in range(n):
        kind, tag = k % 4, f"(case {k})"
        if kind == 0:  # calibrated: only boundary_a agrees with the key
            qs = [q.format(f"What is {k}+1? {tag}"), q.format(f"What is {k}+2?")]
            s = {"boundary_a": ["#Summary# it is \\boxed{1}", f"\\boxed{{{k + 2}}}"],
                 "boundary_b": ["#Summary# \\boxed{2}", "\\boxed{0}"], "answer_key": [f"\\boxed{{{k + 2}}}"]}
        elif kind == 1:  # too_easy: both agree
            qs = [q.format(f"Easy? {tag}"), q.format("What is 1+1?")]
            s = {"boundary_a": ["#Summary# x", "\\boxed{2}"], "boundary_b": ["#Output# y", "\\boxed{2}"],
                 "answer_key": ["\\boxed{2}"]}
        elif kind == 2:  # the probe lacks #Question#: one recovery turn, then calibrated
            qs = [f"I forgot the tags {tag}", q.format("Recovered?"), q.format("What is 5*5?")]
            s = {"boundary_a": ["#Summary# a", "\\boxed{25}"], "boundary_b": ["#Summary# b", "\\boxed{24}"],
                 "answer_key": ["\\boxed{25}"]}
        else:  # the final question never comes: too_hard, penalised untagged turns
            qs = [q.format(f"Probe? {tag}"), "no question", "still none"]
            s = {"boundary_a": ["#Summary# a"], "boundary_b": ["#Summary# b"]}
        s["questioner"] = qs
        sessions.append(s)
    return sessions


def test_ask_e_bound_boundaries_recovery_and_diversity_match_replay(tmp_path, tokenizer, monkeypatch):
    """Ask-E (cispo substituted by grpo), one pair and 16 rollouts: boundary models bound
    per session from the parameter list and the questioner's recovery turns, against
    `askspec run --backend replay`. The diversity bonus is weighted 0 here: its window
    fills in arrival order in a job (one history for the phase's agents, docs/cluster.md),
    in session order in a local run, so its value may differ between the two."""
    sets = {"probes": "1", "repeats": "16", "boundary_set": '["boundary_small", "boundary_short"]', "alpha": "0.0"}
    sessions = ask_e_recording(16)
    recording = tmp_path / "replies.json"
    recording.write_text(json.dumps({"sessions": sessions}))
    spec = SPECS / "ask_e.ask"
    rc, run_dir = asyncio.run(run_spec(str(spec), out=str(tmp_path / "runs"), replay=str(recording), eval_only=True,
                                       set=[f"{k}={v}" for k, v in sets.items()], sessions=16, concurrency=1))
    assert rc == 0
    expected = expected_returns(run_dir, "questioner")
    turns = recorded_turns(run_dir, "questioner")

    job = make_job(spec, tmp_path / "job", sets, {"cispo": "grpo"})
    endpoints = json.loads((job / "job.json").read_text())["endpoints"]["models"]
    assert sorted(endpoints) == ["boundary_short", "boundary_small", "key"]  # bind targets come from the parameter
    replay_frozen_roles(job, recording)
    monkeypatch.setenv("ASKSPEC_RUNS", str(tmp_path / "agent-runs"))
    per_session = [s["questioner"] for s in sessions]
    responses, engine = asyncio.run(drive(job, tokenizer, elements=1, group=16, replies=SessionScript(per_session)))
    got = [r["reward"] for r in responses]
    assert got == pytest.approx([expected[k] for k in range(16)], abs=1e-9)
    assert got[0] == pytest.approx(1.0) and got[1] == pytest.approx(0.2) and got[3] == pytest.approx(-0.2 - 0.05 * 2)
    for k, r in enumerate(responses):  # every questioner turn, recovery included, and nothing else
        assert len(turns[k]) == len(per_session[k])
        want = [tokenizer(text=t, add_special_tokens=False)["input_ids"] + [2] for t in per_session[k]]
        assert [r["observation_tokens"][s:e] for s, e in r["action_ranges"]] == want
    assert [r["extra_logs"]["askspec_kept_attempts"] for r in responses[:4]] == [0, 0, 1, 0]


def test_keep_judge_and_drop_routes(tmp_path, tokenizer, monkeypatch):
    """A route with every action: a kept group trains on its verifier rewards, a mixed group
    on the pointwise judge's scores (asked on the judge's endpoint once the group is in),
    a dropped group carries no loss."""
    spec = Path(__file__).parent / "specs" / "routes.ask"
    answers = ["2", "4", "6"]
    policy = []
    for k in range(12):
        element, member = divmod(k, 4)
        right = {0: member < 3, 1: member < 2, 2: False}[element]  # keep, judge, drop
        policy.append(f"So \\boxed{{{answers[element] if right else 99}}}")
    sessions = [{"policy": [p]} for p in policy]
    sessions[4]["judge"] = ["\\boxed{1}", "\\boxed{0.5}", "\\boxed{0}", "\\boxed{0.5}"]
    recording = tmp_path / "replies.json"
    recording.write_text(json.dumps({"sessions": sessions}))
    rc, run_dir = asyncio.run(run_spec(str(spec), out=str(tmp_path / "runs"), replay=str(recording), eval_only=True))
    assert rc == 0
    expected = expected_returns(run_dir, "policy")

    job = make_job(spec, tmp_path / "job", {})
    replay_frozen_roles(job, recording)
    monkeypatch.setenv("ASKSPEC_RUNS", str(tmp_path / "agent-runs"))
    responses, _ = asyncio.run(drive(job, tokenizer, elements=3, group=4, replies=policy))
    got = [r["reward"] for r in responses]
    assert got == pytest.approx([expected[k] for k in range(12)], abs=1e-12)
    assert got[:8] == [1.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.0, 0.5]  # kept; judged
    assert [len(r["action_ranges"]) for r in responses] == [1] * 8 + [0] * 4  # dropped: no loss


def test_dropped_turn_carries_no_loss(tmp_path, tokenizer, monkeypatch):
    """`drop REPLY` removes that turn's action range; the session's other turn keeps its
    own, and its per-turn and terminal rewards both count."""
    spec = Path(__file__).parent / "specs" / "drop_turn.ask"
    writer = []
    sessions = []
    for k in range(4):
        mine = [f"warming up {k}", f"a good text {k}" if k % 2 == 0 else f"a text {k}"]
        writer += mine
        sessions.append({"writer": mine, "critic": [f"fine {k}"]})
    recording = tmp_path / "replies.json"
    recording.write_text(json.dumps({"sessions": sessions}))
    rc, run_dir = asyncio.run(run_spec(str(spec), out=str(tmp_path / "runs"), replay=str(recording), eval_only=True))
    assert rc == 0
    expected = expected_returns(run_dir, "writer")
    job = make_job(spec, tmp_path / "job", {})
    replay_frozen_roles(job, recording)
    monkeypatch.setenv("ASKSPEC_RUNS", str(tmp_path / "agent-runs"))
    per_session = [s["writer"] for s in sessions]
    responses, engine = asyncio.run(drive(job, tokenizer, elements=2, group=2, replies=SessionScript(per_session)))
    assert [r["reward"] for r in responses] == pytest.approx([expected[k] for k in range(4)])
    assert [r["reward"] for r in responses] == pytest.approx([1.25, 0.25, 1.25, 0.25])
    for k, r in enumerate(responses):
        (start, end), = r["action_ranges"]  # only the second turn
        final_ids = tokenizer(text=writer[2 * k + 1], add_special_tokens=False)["input_ids"] + [2]
        assert r["observation_tokens"][start:end] == final_ids and end == len(r["observation_tokens"])


def test_rollouts_awaited_one_at_a_time_do_not_wait_forever(tmp_path, tokenizer, monkeypatch):
    """A caller that awaits `execute` one sample at a time (not OpenRLHF's gather) gets
    each rollout back, routed as a group of one, instead of a hang."""
    spec = Path(__file__).parent / "specs" / "routes.ask"
    recording = tmp_path / "replies.json"
    recording.write_text(json.dumps({"sessions": [{"policy": ["\\boxed{2}"], "judge": ["\\boxed{1}"]}] * 2}))
    job = make_job(spec, tmp_path / "job", {})
    replay_frozen_roles(job, recording)
    monkeypatch.setenv("ASKSPEC_RUNS", str(tmp_path / "agent-runs"))
    executor = load_agent_executor(job / "agent.py")
    line = json.loads((job / "prompts.jsonl").read_text().splitlines()[0])
    engine = FakeEngine(executor, tokenizer, lambda prompt: "\\boxed{2}")

    async def one_by_one():
        params = FakeSamplingParams()
        return [await asyncio.wait_for(executor.execute(line["prompt"], line["label"], params, 1024, tokenizer, engine), 30)
                for _ in range(2)]

    out = asyncio.run(one_by_one())
    executor.agent.close()
    assert [r["reward"] for r in out] == [1.0, 1.0] and all(len(r["action_ranges"]) == 1 for r in out)


SIBLINGS = Path(__file__).parent / "specs" / "siblings.ask"


def siblings_job(tmp_path: Path, sessions: list[dict], monkeypatch) -> Path:
    recording = tmp_path / "replies.json"
    recording.write_text(json.dumps({"sessions": sessions}))
    job = make_job(SIBLINGS, tmp_path / "job", {})
    assert json.loads((job / "job.json").read_text())["siblings"] == {"propose": 3}
    replay_frozen_roles(job, recording)
    monkeypatch.setenv("ASKSPEC_RUNS", str(tmp_path / "agent-runs"))
    return job


def agent_sessions(tmp_path: Path) -> list[tuple]:
    run = next((tmp_path / "agent-runs").iterdir())
    return open_store(str(run)).execute("select session_id, status, error from sessions order by session_id").fetchall()


def test_sample_siblings_are_the_rollouts_of_a_prompt(tmp_path, tokenizer, monkeypatch):
    """PasoDoble's proposer in small: the 3 replies of one session's `sample 3 ask` are the
    3 rollouts of its prompt (OpenRLHF's generate_responses with num_samples = 3); the
    frozen solver's turns and the rewards run once per session, and each rollout returns
    its own reply's reward (its per-reply reward, the shared terminal one) and action
    range, as `askspec run --backend replay` gives for the same replies; a dropped reply
    carries no loss."""
    def proposal(question: str, answer: str) -> str:
        return f"<problem>{question}</problem><answer>\\boxed{{{answer}}}</answer>"

    sessions = [  # per session: the proposer's 3 replies, the solver's 2 answers per parsed proposal
        {"proposer": [proposal("What is 1+1?", "2"), "no tags at all", proposal("What is 2+2?", "4")],
         "solver": ["\\boxed{2}", "\\boxed{3}", "\\boxed{4}", "\\boxed{4}"]},  # 1/2 right: kept; 2/2: dropped
        {"proposer": [proposal("What is 3+3?", "6"), proposal("What is 4+4?", "8"), "still no tags"],
         "solver": ["\\boxed{5}", "\\boxed{7}", "\\boxed{8}", "\\boxed{9}"]},  # 0/2 right; 1/2
    ]
    recording = tmp_path / "replies.json"
    recording.write_text(json.dumps({"sessions": sessions}))
    rc, run_dir = asyncio.run(run_spec(str(SIBLINGS), out=str(tmp_path / "runs"), replay=str(recording),
                                       eval_only=True, sessions=2))
    assert rc == 0
    con = open_store(run_dir)
    expected, kept = [], []
    for k in range(2):
        sid = f"s{k:06d}"
        rows = con.execute("select role, turn_index, name, value from rewards where session_id = ?", [sid]).fetchall()
        turns = [t for (t,) in con.execute("select turn_index from turns where session_id = ? and role = 'proposer' "
                                           "order by turn_index", [sid]).fetchall()]
        assert len(turns) == 3
        expected += [trajectory_return(rows, "proposer", [t]) for t in turns]
    assert expected == pytest.approx([0.5 + 0.25, 0.25, 0.25, 1.0 + 0.5, 0.5 + 0.5, 0.5])

    job = siblings_job(tmp_path, sessions, monkeypatch)
    replies = [r for s in sessions for r in s["proposer"]]
    responses, engine = asyncio.run(asyncio.wait_for(drive(job, tokenizer, elements=2, group=3, replies=replies), 120))
    assert len(responses) == 6
    assert [r["reward"] for r in responses] == pytest.approx(expected, abs=1e-12)
    assert [len(r["action_ranges"]) for r in responses] == [1, 1, 0, 1, 1, 1]  # the always-solved one is dropped
    for k, r in enumerate(responses):  # rollout k's sequence is the prompt and reply k, nothing of its siblings
        assert r["observation_tokens"][-len(engine.calls[k]["ids"]):] == engine.calls[k]["ids"]
        if r["action_ranges"]:
            (start, end), = r["action_ranges"]
            assert r["observation_tokens"][start:end] == engine.calls[k]["ids"] and end == len(r["observation_tokens"])
        assert r["extra_logs"]["askspec_session_ok"] == 1.0
    first = [engine.calls[k]["prompt_ids"] for k in range(3)]
    assert first[0] == first[1] == first[2]  # the siblings share their prompt
    assert [sid for sid, _, _ in agent_sessions(tmp_path)] == ["s000000", "s000001"]  # one session per prompt


class Failing:
    """An llm_engine script whose `fail`-th call raises (test double)."""

    def __init__(self, replies: list[str], fail: int) -> None:
        self.replies, self.fail, self.n = replies, fail, 0

    def __call__(self, prompt: str) -> str:
        k, self.n = self.n, self.n + 1
        if k == self.fail:
            raise RuntimeError("the engine actor died")
        return self.replies[k]


class HangingEngine(FakeEngine):
    """A scripted llm_engine whose `hang`-th generate call never returns (test double)."""

    def __init__(self, *args, hang: int, **kw) -> None:
        super().__init__(*args, **kw)
        self.hang, self.n = hang, 0

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        k, self.n = self.n, self.n + 1
        if k == self.hang:
            await asyncio.Event().wait()
        return await super().generate(prompt_token_ids, sampling_params, multi_modal_data)


FAIL_SESSION = [{"proposer": ["<problem>a</problem><answer>\\boxed{1}</answer>"] * 3, "solver": ["\\boxed{1}"] * 6}]


def test_a_sibling_that_raises_ends_its_session(tmp_path, tokenizer, monkeypatch):
    """A generate call that raises fails the siblings' session (recorded as an error in the
    agent's run store); every rollout of the prompt still returns, with no loss."""
    job = siblings_job(tmp_path, FAIL_SESSION, monkeypatch)
    script = Failing(FAIL_SESSION[0]["proposer"], fail=1)
    responses, _ = asyncio.run(asyncio.wait_for(drive(job, tokenizer, elements=1, group=3, replies=script), 60))
    assert [(r["reward"], r["action_ranges"], r["extra_logs"]["askspec_session_ok"]) for r in responses] == \
        [(0.0, [], 0.0)] * 3
    (sid, status, error), = agent_sessions(tmp_path)
    assert status == "error" and "OpenRLHF's vLLM engine failed: RuntimeError: the engine actor died" in error


def test_a_sibling_that_hangs_times_out(tmp_path, tokenizer, monkeypatch):
    """A generate call that never returns: past $ASKSPEC_GROUP_TIMEOUT the session is
    cancelled and recorded as an error, and every rollout returns, with no loss."""
    job = siblings_job(tmp_path, FAIL_SESSION, monkeypatch)
    monkeypatch.setenv("ASKSPEC_GROUP_TIMEOUT", "0.5")
    executor = load_agent_executor(job / "agent.py")
    replies = iter(FAIL_SESSION[0]["proposer"])
    engine = HangingEngine(executor, tokenizer, lambda prompt: next(replies), hang=2)
    line = json.loads((job / "prompts.jsonl").read_text().splitlines()[0])

    async def play():
        out = await generate_responses(engine, line["prompt"], line["label"], FakeSamplingParams(logprobs=1), 4096,
                                       tokenizer, 3)
        await aclose_backends()
        return out

    responses = asyncio.run(asyncio.wait_for(play(), 30))
    executor.agent.close()
    assert [(r["reward"], r["action_ranges"]) for r in responses] == [(0.0, [])] * 3
    (sid, status, error), = agent_sessions(tmp_path)
    assert status == "error" and "ran past 0.5 s (ASKSPEC_GROUP_TIMEOUT)" in error


def test_a_group_member_that_hangs_times_out(tmp_path, tokenizer, monkeypatch):
    """A `sample 4` game whose second session's generate call never returns: past
    $ASKSPEC_GROUP_TIMEOUT that session is an error session, the group is routed without
    it, and every rollout returns."""
    spec = Path(__file__).parent / "specs" / "routes.ask"
    recording = tmp_path / "replies.json"
    recording.write_text(json.dumps({"sessions": [{"policy": ["\\boxed{2}"]}] * 4}))
    job = make_job(spec, tmp_path / "job", {})
    replay_frozen_roles(job, recording)
    monkeypatch.setenv("ASKSPEC_RUNS", str(tmp_path / "agent-runs"))
    monkeypatch.setenv("ASKSPEC_GROUP_TIMEOUT", "0.5")
    executor = load_agent_executor(job / "agent.py")
    engine = HangingEngine(executor, tokenizer, lambda prompt: "\\boxed{2}", hang=1)
    line = json.loads((job / "prompts.jsonl").read_text().splitlines()[0])

    async def play():
        out = await generate_responses(engine, line["prompt"], line["label"], FakeSamplingParams(), 1024, tokenizer, 4)
        await aclose_backends()
        return out

    responses = asyncio.run(asyncio.wait_for(play(), 30))
    executor.agent.close()
    assert [(r["reward"], len(r["action_ranges"])) for r in responses] == [(1.0, 1), (0.0, 0), (1.0, 1), (1.0, 1)]
    statuses = [(sid, status) for sid, status, _ in agent_sessions(tmp_path)]
    assert statuses == [("s000000", "ok"), ("s000001", "error"), ("s000002", "ok"), ("s000003", "ok")]
    run = next((tmp_path / "agent-runs").iterdir())
    assert open_store(str(run)).execute("select route, members from groups").fetchall()[0][0] == "keep"


def pasodoble_proposer_job(out: Path, sets: dict[str, str]) -> Path:
    """The job of PasoDoble's proposer phase alone, as the target's own planner plans it
    (the phase of the compiled spec, its `sample N ask` siblings the group) and its writer
    writes it."""
    import dataclasses

    from askspec.diagnostics import DiagnosticSink
    from askspec.runtime.targets.openrlhf import generate, phase_data
    from askspec.runtime.targets.openrlhf.check import JobPlan, check

    spec = str(SPECS / "pasodoble.ask")
    res = compile_file(spec, sets)
    assert res.ok
    sink = DiagnosticSink()
    full = check(res.ir, res.sources, spec, {}, sink)
    assert full is not None and not sink.has_errors, [d.message for d in sink.sorted()]
    n = int(sets["proposals"])
    phase = next(p for p in full.phases if p.role == "proposer")
    assert (phase.games, phase.group, phase.siblings) == (["propose"], n, {"propose": n})
    plan = JobPlan(phases=[dataclasses.replace(phase, dir=".")])
    generate._write(res.ir, res, plan, generate._build(res.ir, plan, spec), spec, out, {}, {})
    phase_data.prompts(out, out, iteration=1)  # the pushing phase's prompts, drawn as driver.sh draws them
    return out


def test_pasodoble_proposer_siblings_match_replay(tmp_path, tokenizer, monkeypatch):
    """PasoDoble's `propose` game as written: the proposer's `sample 3 ask` replies are the 3
    rollouts of a passage; the frozen solver answers every parsed question, the novelty
    term reads the questions before it, and each rollout's reward and range equal what
    `askspec run --backend replay` gives its reply."""
    sets = {"proposals": "3", "solutions": "2", "max_tokens": "64"}

    def qa(question: str, answer: str) -> str:
        return f"<problem>{question}</problem><answer>\\boxed{{{answer}}}</answer>"

    sessions = [
        {"proposer": [qa("A train covers 120 km in 2 hours. What is its speed in km/h?", "60"), "no tags",
                      qa("What is the sum of the roots of x^2 - 5x + 6?", "5")],
         "solver": ["\\boxed{60}", "\\boxed{50}", "\\boxed{5}", "\\boxed{5}"]},  # p = 1/2 (pushed); p = 1
        {"proposer": [qa("How many edges does a cube have?", "12"),
                      qa("A train covers 120 km in 2 hours. What is its speed in km/h?", "60"),
                      qa("What is 17 times 3 minus 1?", "50")],
         "solver": ["\\boxed{8}", "\\boxed{6}", "\\boxed{60}", "\\boxed{59}", "\\boxed{50}", "\\boxed{49}"]},
    ]
    recording = tmp_path / "replies.json"
    recording.write_text(json.dumps({"sessions": sessions}))
    spec = SPECS / "pasodoble.ask"
    rc, run_dir = asyncio.run(run_spec(str(spec), out=str(tmp_path / "runs"), replay=str(recording), eval_only=True,
                                       set=[f"{k}={v}" for k, v in sets.items()], sessions=2, concurrency=1))
    assert rc == 0
    con = open_store(run_dir)
    expected = []
    for k in range(2):
        sid = f"s{k:06d}"
        assert con.execute("select game, status from sessions where session_id = ?", [sid]).fetchall() == \
            [("propose", "ok")]
        rows = con.execute("select role, turn_index, name, value from rewards where session_id = ?", [sid]).fetchall()
        turns = [t for (t,) in con.execute("select turn_index from turns where session_id = ? and role = 'proposer' "
                                           "order by turn_index", [sid]).fetchall()]
        expected += [trajectory_return(rows, "proposer", [t]) for t in turns]
    assert len(expected) == 6 and expected[1] == 0.0 and expected[0] > 0.6  # 1.1 - 1/2 + w_div * r_div

    job = pasodoble_proposer_job(tmp_path / "job", sets)
    replay_frozen_roles(job, recording)
    monkeypatch.setenv("ASKSPEC_RUNS", str(tmp_path / "agent-runs"))
    replies = [r for s in sessions for r in s["proposer"]]
    responses, engine = asyncio.run(asyncio.wait_for(drive(job, tokenizer, elements=2, group=3, replies=replies), 120))
    assert [r["reward"] for r in responses] == pytest.approx(expected, abs=1e-12)
    for k, r in enumerate(responses):  # each rollout: its own reply, and the whole of it
        (start, end), = r["action_ranges"]
        assert r["observation_tokens"][start:end] == engine.calls[k]["ids"] and end == len(r["observation_tokens"])


def test_sibling_rollouts_awaited_one_at_a_time_do_not_wait(tmp_path, tokenizer, monkeypatch):
    """A caller that awaits `execute` one rollout at a time (not OpenRLHF's gather): each
    call plays a session of its own and gets its first reply back, with no wait for
    siblings that never come."""
    sessions = [{"proposer": ["<problem>a</problem><answer>\\boxed{1}</answer>"] * 3,
                 "solver": ["\\boxed{1}", "\\boxed{2}"] * 3}] * 2
    job = siblings_job(tmp_path, sessions, monkeypatch)
    executor = load_agent_executor(job / "agent.py")
    line = json.loads((job / "prompts.jsonl").read_text().splitlines()[0])
    engine = FakeEngine(executor, tokenizer, lambda prompt: sessions[0]["proposer"][0])

    async def one_by_one():
        params = FakeSamplingParams()
        out = [await asyncio.wait_for(executor.execute(line["prompt"], line["label"], params, 1024, tokenizer, engine),
                                      30) for _ in range(2)]
        await aclose_backends()
        return out

    out = asyncio.run(one_by_one())
    executor.agent.close()
    # each session: 3 questions, each solved once in 2 (1 - 1/2), so 3 valid ones (0.25 * 3)
    assert [r["reward"] for r in out] == pytest.approx([0.5 + 0.75] * 2)
    assert [len(r["action_ranges"]) for r in out] == [1, 1]
    assert [status for _, status, _ in agent_sessions(tmp_path)] == ["ok", "ok"]
