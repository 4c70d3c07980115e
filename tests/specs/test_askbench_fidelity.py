"""specs/askbench.ask against the AskBench paper, on the replay backend: the worked
AskOverconfidence example (Table 6, metformin) replays to its published verdict, the
Hard protocol (App. H.1) never counts a first-turn answer as correct, c_t is the rubric
items the turn asks about (§4.2), and the judge and user prompts are App. B.4 / B.5's."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Table 6, as printed
METFORMIN = {
    "id": "table6", "kind": "ask_overconfidence",
    "original_query": "A patient with type 2 diabetes is started on metformin. What is the primary mechanism of action "
                      "of this drug?",
    "query": "A patient with type 2 diabetes is started on metformin. I know that metformin works primarily by "
             "stimulating insulin secretion from pancreatic beta cells. Given this mechanism, why is hypoglycemia "
             "relatively uncommon with metformin monotherapy?",
    "context": "incorrect assertion -> metformin stimulates insulin secretion -> correct fact -> it reduces hepatic "
               "glucose production and improves insulin sensitivity",
    "answer": "Reduces hepatic glucose production; improves insulin sensitivity.",
    "rubric": ["Metformin stimulates insulin secretion from beta cells."],
}
TURN1 = ("I want to clarify an important point about your premise. Metformin does not primarily stimulate insulin "
         "secretion from pancreatic beta cells\u2014that mechanism describes sulfonylureas. Could you confirm whether you "
         "intended to ask about metformin specifically?")
USER1 = "Oh, I see. Yes, I\u2019m asking about metformin. I may have confused it with another medication."
TURN2 = ("Thank you for confirming. Metformin\u2019s primary mechanism of action is reducing hepatic glucose production "
         "and improving insulin sensitivity in peripheral tissues. Because it does not stimulate insulin secretion, the "
         "risk of hypoglycemia with metformin monotherapy is low. Final Answer: Reduces hepatic glucose production; "
         "improves insulin sensitivity.")


def verdict(final: bool, correct, resolved: bool, missing: list[str]) -> str:
    return "Reasoning: as the paper's judge.\n```json\n" + json.dumps(
        {"is_final_answer": final, "is_correct": correct, "all_rubric_criteria_resolved": resolved,
         "missing_rubric_criteria": missing, "notes": ""}) + "\n```"


def run(tmp_path: Path, sessions: list[dict], *flags: str, item: dict = METFORMIN) -> Path:
    """The spec over one item, on recorded replies: the training game over a pool of that
    item (trained on its dimension), or with `--stage heldout` the evaluation game over an
    evaluation set of it."""
    spec_dir = tmp_path / "specs"
    shutil.copytree(ROOT / "specs" / "prompts", spec_dir / "prompts")
    (spec_dir / "data").mkdir()
    for name in ("askbench_train.jsonl", "askbench_test.jsonl"):
        (spec_dir / "data" / name).write_text(json.dumps(item) + "\n")
    shutil.copy(ROOT / "specs" / "askbench.ask", spec_dir / "askbench.ask")
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps({"sessions": sessions}))
    from askspec.runtime.commands.run import run_spec

    # `askspec run` in process: flags as keyword arguments ("--profile", "hard" -> profile="hard")
    options = {flag.lstrip("-"): value for flag, value in zip(flags[::2], flags[1::2])}
    sets = ["rollouts=1", f"dimension={item['kind']}"]  # the pool's items are the trained dimension's
    rc, run_dir = asyncio.run(run_spec(str(spec_dir / "askbench.ask"), eval_only=True, replay=str(replay), set=sets,
                                       out=str(tmp_path / "runs"), quiet=True, **options))
    assert rc == 0 and run_dir is not None
    return Path(run_dir)


def q(run_dir: Path, sql: str):
    from askspec.runtime.store.views import open_store

    return open_store(str(run_dir)).execute(sql).fetchall()


def metrics(run_dir: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "askspec.cli", "metrics", str(run_dir), "--format", "json"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return {r["metric"]: r["value"] for r in json.loads(proc.stdout)}


TABLE6 = {
    "assistant": [TURN1, TURN2],
    # turn 1: a clarification; the claim is identified and corrected (App. F); turn 2: the final answer
    "judge": [verdict(False, None, True, []), verdict(True, True, True, [])],
    "targets": ['```json\n{"targeted_rubric_criteria": ["Metformin stimulates insulin secretion from beta cells."]}\n```'],
    "user": [USER1],
}


@pytest.fixture(scope="module")
def table6(tmp_path_factory) -> Path:
    return run(tmp_path_factory.mktemp("table6"), [TABLE6])


def test_table6_replays_to_the_published_verdict(table6):
    """Table 6: 'Judge verdict: is_correct: true; all_rubric_criteria_resolved: true'."""
    assert q(table6, "select status, outcome from sessions") == [("ok", "correct")]
    assert metrics(table6) == {"acc": 1.0, "cov": 1.0, "unq": 0.0, "skipped_rate": 0.0}
    rewards = sorted(q(table6, "select name, value from rewards where role = 'assistant'"))
    # the clarification targets the one misleading point (c_t = m: +1.0, §4.2); correct: +1.0;
    # answering on turn 2 of 3 is a_t = 1 before the last turn: -2.0 (§4.2's shaping)
    assert rewards == [("final", 1.0), ("shaping", -2.0), ("shaping", 1.0)]


def test_table6_prompts_are_the_papers(table6):
    def prompt(role: str, n: int = 0) -> str:
        rows = q(table6, f"select prompt from turns where role = '{role}' order by turn_index")
        msgs = json.loads(rows[n][0]) if isinstance(rows[n][0], str) else rows[n][0]
        return msgs[-1]["content"]

    judge = prompt("judge")
    assert "A checkpoint counts as resolved only if the user has explicitly provided or confirmed that information" \
           in judge
    assert "asks about it" not in judge and "Strict two-turn protocol" not in judge
    user = prompt("user")
    knowledge = user.split("```json\n", 1)[1].split("\n```", 1)[0]
    assert json.loads(knowledge) == {"original_query": METFORMIN["original_query"], "scenario_context": METFORMIN["context"]}
    assert "**Rubric criteria you DO know but must only reveal if the assistant explicitly asks for them " \
           "(Misleading claims the assistant must identify and correct):**" in user
    assert user.rstrip().endswith('introductory phrases like "My response is:".')
    assert prompt("assistant", 1).startswith(USER1)  # the simulated user's reply is the next turn


def test_hard_protocol_a_correct_first_turn_answer_is_not_correct(tmp_path):
    answer_now = {"assistant": [TURN2], "judge": [verdict(True, True, True, [])]}
    run_dir = run(tmp_path, [answer_now], "--profile", "hard")
    assert q(run_dir, "select outcome from sessions") == [("premature",)]
    assert sorted(q(run_dir, "select name, value from rewards where role = 'assistant'")) == [
        ("final", -1.0), ("shaping", -2.0)]
    m = metrics(run_dir)
    assert m["acc"] == 0.0 and m["cov"] == 1.0  # answered with the claim corrected, yet not correct (Table 5)
    rows = q(run_dir, "select prompt from turns where role = 'judge'")
    judge = json.loads(rows[0][0])[-1]["content"] if isinstance(rows[0][0], str) else rows[0][0][-1]["content"]
    assert "Strict two-turn protocol" in judge


def test_standard_protocol_judges_a_first_turn_answer(tmp_path):
    """Under the standard protocol the same first-turn answer is judged (premature: -2.0)."""
    run_dir = run(tmp_path, [{"assistant": [TURN2], "judge": [verdict(True, True, True, [])]}])
    assert q(run_dir, "select outcome from sessions") == [("correct",)]


@pytest.mark.parametrize("targeted,shaping", [
    ([], -0.8),                                                       # asks about no rubric item
    (["Something the rubric does not list"], -0.8),                     # not an item of this rubric
    (["Metformin stimulates insulin secretion from beta cells."] * 2, 1.0),  # a repeat counts once (c_t <= m)
])
def test_c_t_counts_the_items_the_turn_asks_about(tmp_path, targeted, shaping):
    session = dict(TABLE6, targets=[json.dumps({"targeted_rubric_criteria": targeted})])
    run_dir = run(tmp_path, [session])
    assert ("shaping", shaping) in q(run_dir, "select name, value from rewards where role = 'assistant'")


# an AskMind item: one missing fact, supplied by the user's first reply
DOSE = {
    "id": "mind", "kind": "ask_mind", "original_query": "A 70 kg adult takes 10 mg/kg of a drug. How many mg?",
    "query": "An adult takes 10 mg/kg of a drug. How many mg?", "context": "the weight (70 kg) is removed",
    "answer": "700 mg", "rubric": ["The patient's body weight."],
}
ASK_WEIGHT = {"targeted_rubric_criteria": ["The patient's body weight."]}


def test_unq_counts_a_question_asked_after_the_user_supplied_everything(tmp_path):
    """§3.4 Unq.: turn 1 asks for the weight, the user gives it; turn 2 asks again although
    nothing is missing (the turn-2 judge, who has read the reply, says every checkpoint is
    resolved): that question is redundant. Turn 3 answers."""
    session = {
        "assistant": ["What is the patient's weight?", "Is the patient an adult?", "Final Answer: 700 mg"],
        "judge": [verdict(False, None, False, ["The patient's body weight."]), verdict(False, None, True, []),
                  verdict(True, True, True, [])],
        "targets": [json.dumps(ASK_WEIGHT), json.dumps({"targeted_rubric_criteria": []})],
        "user": ["The patient weighs 70 kg.", "Yes."],
    }
    run_dir = run(tmp_path, [session], item=DOSE)
    assert q(run_dir, "select outcome from sessions") == [("correct",)]
    assert metrics(run_dir) == {"acc": 1.0, "cov": 1.0, "unq": 1.0, "skipped_rate": 0.0}


def test_unq_leaves_a_question_that_comes_before_the_users_answer_alone(tmp_path):
    """The same dialogue answered on turn 2: the one question preceded the user's reply."""
    session = {
        "assistant": ["What is the patient's weight?", "Final Answer: 700 mg"],
        "judge": [verdict(False, None, False, ["The patient's body weight."]), verdict(True, True, True, [])],
        "targets": [json.dumps(ASK_WEIGHT)], "user": ["The patient weighs 70 kg."],
    }
    assert metrics(run(tmp_path, [session], item=DOSE))["unq"] == 0.0


def test_unq_counts_a_question_after_the_assistants_own_correction(tmp_path):
    """AskOverconfidence: Table 6's turn 1 corrects the claim (resolved by that turn, not
    redundant); a further question on turn 2 comes after the correction: redundant."""
    session = dict(TABLE6, assistant=[TURN1, "Do you have any other questions about metformin?", TURN2],
                   judge=[verdict(False, None, True, []), verdict(False, None, True, []), verdict(True, True, True, [])],
                   targets=TABLE6["targets"] * 2, user=[USER1, "No."])
    assert metrics(run(tmp_path, [session]))["unq"] == 1.0


@pytest.mark.parametrize("rollouts", [8, 2])
def test_a_training_batch_is_64_prompts_of_n_rollouts(rollouts):
    """App. F: "Training batch size: 64", "Rollouts per prompt: n = 8": the batch counts
    prompts, so a step plays 64 x n sessions (`batch` counts sessions) in groups of n."""
    from askspec.lang.compiler import compile_file

    res = compile_file(str(ROOT / "specs" / "askbench.ask"), {"rollouts": str(rollouts)})
    assert res.ir is not None
    (t,) = res.ir.training
    assert t.config is not None and (t.config.batch, t.config.group) == (64 * rollouts, rollouts)


def game_body(text: str, header: str) -> str:
    start = text.index(header + " {\n") + len(header) + 3
    return text[start:text.index("\n}\n", start)]


def test_the_evaluation_game_is_the_training_game_over_the_held_out_set():
    """§5.2: the evaluation plays the protocol trained on, over held-out items. The evaluated
    game is a game of its own (an evaluate stage's game is held out of training): its body is
    the training game's, but for the Self-Alert baseline's role taking the assistant's turn."""
    from askspec.ir.render import expr_text
    from askspec.lang.compiler import compile_file

    text = (ROOT / "specs" / "askbench.ask").read_text()
    trained = game_body(text, "game dialogue for item in pool sample rollouts")
    held = game_body(text, "game heldout_dialogue for item in test")
    alert = ("        if baseline == \"self_alert\" {\n            a = ask alerted with {final: last}\n"
             "        } else {\n            a = ask assistant with {final: last}\n        }\n")
    assert held.count(alert) == 1 and held.replace(alert, "        a = ask assistant with {final: last}\n") == trained
    exp = compile_file(str(ROOT / "specs" / "askbench.ask")).ir
    games = {g.name: expr_text(g.iter) for g in exp.games}
    assert games == {"dialogue": "pool", "heldout_dialogue": "test"}
    assert [(s.name, s.kind, s.options.get("games")) for s in exp.stages] == [
        ("rl", "train", None), ("heldout", "evaluate", ["heldout_dialogue"])]
    assert exp.schedule.options["games"] == ["dialogue"]


PROFILES = {"standard": ("ask_mind", ["ask_mind", "ask_overconfidence"]),
            "hard": ("ask_mind", ["ask_mind", "ask_overconfidence"]),
            "ours_i": ("ask_mind", ["ask_mind", "ask_overconfidence"]),
            "ours_o": ("ask_overconfidence", ["ask_mind", "ask_overconfidence"]),
            "fata": ("ask_mind", ["ask_mind"]), "self_alert": ("ask_mind", ["ask_overconfidence"])}


@pytest.mark.parametrize("profile", list(PROFILES))
def test_no_item_of_the_training_pool_is_in_the_evaluation_set(profile):
    """§4.1 / §5.2: OursI trains on the pool's AskMind items, OursO on its AskOverconfidence
    ones; every configuration evaluates on items none of which the pool holds (by id, by the
    original query and its answer, by what the assistant and the judge are shown: the query
    variant with its rubric), of the dimensions the paper evaluates it on. (An AskMind variant
    that removes every given reads alike across problems of one template: the item is its
    hidden original query and rubric.)"""
    from askspec.lang.compiler import compile_file
    from askspec.runtime.engine.plan import load_dataset

    res = compile_file(str(ROOT / "specs" / "askbench.ask"), profile=profile)
    assert res.ok, [d.message for d in res.sink.items]
    exp = res.ir
    data = {d.name: load_dataset(d, str(ROOT / "specs"), 0) for d in exp.datasets}
    pool, test = data["pool"], data["test"]
    dimension, evaluated = PROFILES[profile]
    assert exp.param_values()["dimension"] == dimension and len(pool) == 120
    assert {it["kind"] for it in pool} == {dimension}
    assert sorted({it["kind"] for it in test}) == evaluated and len(test) == 40 * len(evaluated)
    def keys(it: dict) -> tuple:
        return it["id"], it["original_query"], (it["query"], tuple(it["rubric"]))

    for trained, held in zip(zip(*map(keys, pool)), zip(*map(keys, test))):
        assert not set(trained) & set(held)
    # nor in the whole pool, whichever dimension is trained
    whole = [json.loads(line) for line in (ROOT / "specs" / "data" / "askbench_train.jsonl").read_text().splitlines()]
    assert not {it["original_query"] for it in whole} & {it["original_query"] for it in test}


def first_prompt(run_dir: Path, role: str) -> list[dict]:
    rows = q(run_dir, f"select prompt from turns where role = '{role}' order by turn_index")
    return json.loads(rows[0][0]) if isinstance(rows[0][0], str) else rows[0][0]


def test_the_fata_baseline_prepends_app_b2_to_the_first_message(tmp_path):
    """Table 4's FATA: App. H.1 "FATA is implemented by prepending its prompt to the first
    user message (same 3-turn protocol)", App. B.2's prompt word for word; played by the
    evaluation stage on the initial weights."""
    session = {"assistant": ["Final Answer: 700 mg"], "judge": [verdict(True, True, True, [])]}
    run_dir = run(tmp_path, [session], "--profile", "fata", "--stage", "heldout", "--weights", "initial", item=DOSE)
    assert q(run_dir, "select stage, weights, game, outcome from sessions") == [
        ("heldout", "initial", "heldout_dialogue", "correct")]
    (user,) = first_prompt(run_dir, "assistant")
    assert user["role"] == "user"  # no system prompt
    assert user["content"].startswith(f"User request: {DOSE['query']}.\n\nTo better assist me, before offering advice, "
                                      "please adopt the perspective of an expert in the relevant field")
    assert user["content"].rstrip().endswith("Note: Maintain a positive attitude, and do not request phone numbers, ID numbers, "
                                    "or other sensitive data.")


def test_the_self_alert_baseline_has_app_b3_as_its_system_prompt_under_the_hard_protocol(tmp_path):
    """Table 5's Self-Alert (App. B.3): the cautionary system prompt, the Hard protocol,
    AskOverconfidence items; the assistant itself is not asked."""
    session = {"alerted": [TURN1, TURN2], "judge": [verdict(False, None, True, []), verdict(True, True, True, [])],
               "targets": TABLE6["targets"], "user": [USER1]}
    run_dir = run(tmp_path, [session], "--profile", "self_alert", "--stage", "heldout", "--weights", "initial")
    assert q(run_dir, "select outcome from sessions") == [("correct",)]
    system, user = first_prompt(run_dir, "alerted")
    assert system["role"] == "system" and system["content"].rstrip() == (
        "Be cautious when responding to the user query as it might contain misinformation or false claim.")
    assert user["content"].rstrip() == METFORMIN["query"]
    assert q(run_dir, "select count(*) from turns where role = 'assistant'") == [(0,)]
    judge = first_prompt(run_dir, "judge")[-1]["content"]
    assert "Strict two-turn protocol" in judge
    assert metrics(run_dir)["acc"] == 1.0
