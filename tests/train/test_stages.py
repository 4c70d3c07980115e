"""Stages without a model: the pass@k / avg@n arithmetic, the sft loss mask (which tokens
of a prompt/completion record are trained: the real SmolLM2 tokenizer, no weights), the
schedule's steps per stage, and the stage list's checks."""

from __future__ import annotations

import itertools
from math import comb
from pathlib import Path

import pytest

from askspec.ir import model as ir
from askspec.lang.compiler import compile_file, compile_source
from askspec.runtime.train import schedule
from askspec.runtime.engine.passk import evaluation_rows, pass_at_k
from askspec.runtime.train.stages import sft_batch, sft_trajectories

SPEC = Path(__file__).parent / "specs" / "tiny_stages.ask"


def brute_pass_at_k(outcomes: list[bool], k: int) -> float:
    """The share of k-subsets of the samples with at least one right answer."""
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n, c, k", [(4, 0, 1), (4, 1, 1), (4, 1, 2), (4, 2, 3), (5, 4, 2), (8, 3, 4), (3, 3, 3), (6, 1, 6)])
def test_pass_at_k_is_the_share_of_k_subsets_with_a_right_sample(n, c, k):
    outcomes = [True] * c + [False] * (n - c)
    assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(outcomes, k))
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)


def test_pass_at_k_refuses_k_beyond_the_samples():
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_evaluation_rows_average_items_and_keep_weights_apart():
    stage = ir.Stage(name="heldout", kind="evaluate",
                     options={"games": ["test"], "samples": 4, "k": [1, 2], "score": "acc", "weights": ["trained", "initial"]})
    sessions = (
        # item a: 1 right of 4; item b: 3 right of 4 (scores may be fractions: 0.5 is not right)
        [("test", "trained", "a", x) for x in (1.0, 0.0, 0.0, 0.5)]
        + [("test", "trained", "b", x) for x in (True, True, True, False)]
        + [("test", "initial", "a", 0.0)] * 4 + [("test", "initial", "b", None)] * 4  # b: all errors
    )
    rows = {(r["metric"], r["by"]["weights"]): r for r in evaluation_rows(stage, sessions)}
    assert rows[("pass@1", "trained")]["value"] == pytest.approx((1 / 4 + 3 / 4) / 2)
    assert rows[("pass@2", "trained")]["value"] == pytest.approx((1 - comb(3, 2) / comb(4, 2) + 1 - comb(1, 2) / comb(4, 2)) / 2)
    assert rows[("avg@4", "trained")]["value"] == pytest.approx((1.5 / 4 + 3 / 4) / 2)
    assert rows[("pass@1", "trained")]["n"] == 2
    assert rows[("pass@2", "initial")]["value"] == 0.0 and rows[("pass@2", "initial")]["n"] == 1  # b left out


def test_sft_batches_cycle_over_the_records():
    opts = {"data": "cold", "batch": 2}
    recs = [{"i": i} for i in range(3)]
    assert [i for i, _ in sft_batch(recs, opts, 1)] == [0, 1]
    assert [i for i, _ in sft_batch(recs, opts, 2)] == [2, 0]


def test_the_sft_loss_mask_covers_the_completion_and_the_end_of_turn_only():
    from transformers import AutoTokenizer

    from askspec.runtime.backends.hf import resolve_weights

    tok = AutoTokenizer.from_pretrained(str(resolve_weights("smollm2-135m-instruct")))
    end = tok.convert_tokens_to_ids("<|im_end|>")
    opts = {"data": "cold", "prompt": "prompt", "completion": "completion"}
    (tr,) = sft_trajectories(tok, None, end, [(0, {"prompt": "What is 1 + 1?", "completion": "\\boxed{2}"})], opts, 1)
    (turn,) = tr.turns
    # the trained tokens: exactly the completion, then the end of the turn
    assert tok.decode(turn.completion_ids) == "\\boxed{2}<|im_end|>"
    assert tr.tokens == len(turn.completion_ids) == len(tok("\\boxed{2}", add_special_tokens=False)["input_ids"]) + 1
    # the prompt is context: the chat template's user turn, ending where the assistant starts
    text = tok.decode(turn.prompt_ids)
    assert "What is 1 + 1?" in text and text.rstrip().endswith("<|im_start|>assistant")
    whole = tok.apply_chat_template([{"role": "user", "content": "What is 1 + 1?"},
                                     {"role": "assistant", "content": "\\boxed{2}"}], tokenize=False)
    assert whole.startswith(tok.decode(turn.prompt_ids + turn.completion_ids))  # as a chat transcript has it
    with pytest.raises(ValueError, match="needs string fields 'prompt' and 'completion'"):
        sft_trajectories(tok, None, end, [(0, {"question": "x"})], opts, 1)


def test_an_sft_record_s_system_field_is_the_prompt_s_system_message():
    from transformers import AutoTokenizer

    from askspec.runtime.backends.hf import resolve_weights

    tok = AutoTokenizer.from_pretrained(str(resolve_weights("smollm2-135m-instruct")))
    end = tok.convert_tokens_to_ids("<|im_end|>")
    opts = {"data": "cold", "prompt": "prompt", "completion": "completion", "system": "sys"}
    rec = {"prompt": "What is 1 + 1?", "completion": "\\boxed{2}", "sys": "Put the answer in \\boxed{}."}
    (tr,) = sft_trajectories(tok, None, end, [(0, rec)], opts, 1)
    want = tok.apply_chat_template([{"role": "system", "content": rec["sys"]}, {"role": "user", "content": rec["prompt"]}],
                                   add_generation_prompt=True, tokenize=False)
    assert tok.decode(tr.turns[0].prompt_ids) == want  # as the hf backend sends a role's system prompt
    (plain,) = sft_trajectories(tok, None, end, [(0, rec)], {**opts, "system": None}, 1)
    assert "Put the answer" not in tok.decode(plain.turns[0].prompt_ids)
    with pytest.raises(ValueError, match="needs a string field 'sys'"):
        sft_trajectories(tok, None, end, [(0, {"prompt": "x", "completion": "y"})], opts, 1)


def test_the_schedule_runs_the_stages_in_order():
    exp = compile_file(str(SPEC), {}).ir
    slots = schedule.slots(exp)
    assert [(s.step, s.phase.stage, s.phase.kind) for s in slots] == [
        (1, "cold_start", "sft"), (2, "cold_start", "sft"), (3, "rl", "play"), (4, "heldout", "evaluate")]
    assert slots[2].phase.plain == ("practice",)  # the held-out game is not trained on


BASE = """
model m = hf("smollm2-135m-instruct") { max_tokens = 8 }
role solver { model = m; trained; memory = none; reply = boxed }
data cold = [{prompt: "1+1", completion: "2"}]
data qs = [{q: "1+2", a: "3"}]
game practice for item in qs { s = ask solver: item.q; correct = s.answer == item.a; reward solver = 1.0 }
game test for item in qs { s = ask solver: item.q; correct = s.answer == item.a; reward solver = 1.0 }
train solver with grpo { group = 2 }
"""


@pytest.mark.parametrize("stages, code, message", [
    ("stage cold sft { role = solver; data = cold }", "E408", "has train blocks but its stage list has no train stage"),
    ("stage a train\nstage b train", "E408", "only one train stage"),
    ("stage t evaluate { games = [test]; score = correct }", "E408", "has train blocks but its stage list has no train stage"),
    ("stage a rl", "E408", "unknown stage kind 'rl'"),
    ("stage solver train", "E408", "has the name of a role"),
    ("stage rl train\nstage t evaluate { games = [test]; score = right }", "E101", "score 'right' is not a session variable"),
    ("stage rl train\nstage t evaluate { games = [test] }", "E106", "an evaluate stage needs 'score'"),
    ("stage rl train\nstage t evaluate { games = [test]; score = correct; weights = [best] }", "E107", "weights are trained"),
    ("stage c sft { role = solver; data = nope }\nstage rl train", "E110", "data names a declared data set"),
    ("stage c sft { role = solver; data = cold; epochs = 2 }\nstage rl train", "E105", "unknown setting 'epochs'"),
    ("schedule online { games = [practice, test] }\nstage rl train\nstage t evaluate { games = [test]; score = correct }",
     "E408", "game 'test' is evaluated here and trained on by the schedule"),
])
def test_stage_list_diagnostics(stages, code, message):
    res = compile_source("s.ask", BASE + stages)
    assert any(d.code == code and message in d.message for d in res.sink.items), [
        (d.code, d.message) for d in res.sink.items]


def test_a_good_stage_list_compiles():
    res = compile_source("s.ask", BASE + "stage c sft { role = solver; data = cold; steps = 3 }\nstage rl train\n"
                         "stage t evaluate { games = [test]; samples = 4; k = 4; score = correct; weights = trained }",
                         )
    assert res.ok, [(d.code, d.message) for d in res.sink.items]
    assert [(s.name, s.kind) for s in res.ir.stages] == [("c", "sft"), ("rl", "train"), ("t", "evaluate")]
    assert res.ir.stages[2].options == {"games": ["test"], "samples": 4, "k": [4], "score": "correct", "weights": ["trained"]}


class FakeResolver:
    """Stands in for the run's model resolver: one binding per (role, model)."""

    def resolve(self, role, name):
        from askspec.runtime.engine.session import ModelBinding

        return ModelBinding(name=name or "m", backend="initial-backend", weights="smollm2-135m-instruct", sampling={})


class FakePolicy:
    """Stands in for a trained policy: only the backend that serves its weights."""

    backend = "trained-backend"


def test_an_evaluate_stage_serves_the_initial_weights_only_in_its_initial_turn():
    from askspec.runtime.train.trainer import LocalTrainer

    exp = compile_file(str(SPEC), {}).ir
    t = LocalTrainer(exp, params={}, datasets={d.name: d.items for d in exp.datasets}, seed=0, resolver=FakeResolver(),
                     run_dir=None)
    t.policies["solver"] = FakePolicy()
    assert t.resolve("solver", None).backend == "trained-backend"
    with t.serving("initial"):
        assert t.resolve("solver", None).backend == "initial-backend"
    assert t.resolve("solver", None).backend == "trained-backend"  # the trained weights again after it
    assert t.step_sessions(t.slots[3]) == 2 * 2 * 2  # items × samples × weights


def test_stages_without_train_blocks_are_refused():
    src = BASE.replace("train solver with grpo { group = 2 }", "").replace("trained; ", "")
    res = compile_source("s.ask", src + "stage t evaluate { games = [test]; score = correct }")
    assert any(d.code == "E408" and "stages need train blocks" in d.message for d in res.sink.items), [
        (d.code, d.message) for d in res.sink.items]


# -- retrain (SOAR's PQ evaluation) -------------------------------------------------------

def test_retrain_items_mix_or_follow_a_curriculum():
    from askspec.runtime.train.stages import retrain_items

    promotions = [{"items": [{"question": "p1"}]}, {"items": [{"question": "p2"}]}]
    data = {"hard": [{"question": "h1"}]}
    mixed = {"promoted": True, "data": "hard", "curriculum": 0}
    assert retrain_items(mixed, promotions, data, 4) == ([{"question": "p1"}, {"question": "p2"}, {"question": "h1"}], 4)
    curriculum = {**mixed, "curriculum": 2}
    assert retrain_items(curriculum, promotions, data, 2) == ([{"question": "p1"}, {"question": "p2"}], 2)
    assert retrain_items(curriculum, promotions, data, 3) == ([{"question": "h1"}], 1)
    assert retrain_items({**mixed, "promoted": False}, promotions, data, 1) == ([{"question": "h1"}], 1)


RETRAIN_BASE = """
experiment e { seed = 1 }
model m = hf("smollm2-135m-instruct") { max_tokens = 8 }
role teacher { model = m; trained; memory = none; prompt = "q" }
role student { model = m; trained; memory = none; prompt = "{{ question }}"; reply = boxed }
data hard = [{question: "1", answer: "1"}]
game teach { xs = sample 2 ask teacher }
game practice for qa in hard {
    y = ask student with {question: qa.question}
    reward y as student = 1
}
game evaluate for h in hard {
    y = ask student with {question: h.question}
    score = 1
    reward y as student = 1
}
train teacher with rloo { lr = 0.00001 }
train student with rloo { lr = 0.00001 }
schedule nested { outer = teacher; inner = student; practice = practice; evaluate = evaluate }
"""


@pytest.mark.parametrize("stages, message", [
    ("stage pq retrain { role = student; game = practice; promoted = true }\nstage rl train",
     "before the train stage made any"),
    ("stage rl train\nstage pq retrain { role = teacher; game = practice; promoted = true }",
     "nested schedule whose inner role is 'teacher'"),
    ("stage rl train\nstage pq retrain { role = student; game = teach; data = hard }", "game teach for x in DATA"),
    ("stage rl train\nstage pq retrain { role = student; game = practice }", "has nothing to train on"),
    ("stage rl train\nstage pq retrain { role = student; game = practice; data = hard; curriculum = 2 }",
     "curriculum"),
    ("stage rl train\nstage pq retrain { role = student; game = practice; promoted = true; data = hard; steps = 2; "
     "curriculum = 2 }", "fewer curriculum steps"),
])
def test_retrain_stage_refusals_are_e408(stages, message):
    res = compile_source("s.ask", RETRAIN_BASE + stages + "\n")
    assert not res.ok and any(d.code == "E408" and message in d.message for d in res.sink.items), [
        (d.code, d.message) for d in res.sink.items]


def test_retrain_stage_compiles_with_its_defaults():
    res = compile_source("s.ask", RETRAIN_BASE + "stage rl train\nstage pq retrain { role = student; game = practice; "
                         "promoted = true; data = hard; steps = 3; warmup = 1 }\n")
    assert res.ok, [(d.code, d.message) for d in res.sink.items]
    (st,) = [s for s in res.ir.stages if s.kind == "retrain"]
    assert st.options == {"role": "student", "game": "practice", "promoted": True, "data": "hard", "steps": 3,
                          "curriculum": 0, "warmup": 1}


# -- sampled items and the checkpoint a stage keeps (SOAR's teacher evaluations, PS, PQ) --

def test_retrain_items_put_sampled_items_with_the_promoted_ones():
    from askspec.runtime.train.stages import retrain_items

    promotions = [{"items": [{"question": "p1"}]}]
    data = {"hard": [{"question": "h1"}]}
    opts = {"promoted": True, "data": "hard", "curriculum": 1}
    sampled = [{"question": "s1"}, {"question": "s2"}]
    assert retrain_items(opts, promotions, data, 1, sampled) == ([{"question": "p1"}, {"question": "s1"},
                                                                  {"question": "s2"}], 1)
    assert retrain_items(opts, promotions, data, 2, sampled) == ([{"question": "h1"}], 1)
    mixed = {"promoted": False, "data": "hard", "curriculum": 0}
    assert retrain_items(mixed, promotions, data, 3, sampled) == ([{"question": "s1"}, {"question": "s2"},
                                                                   {"question": "h1"}], 3)


@pytest.mark.parametrize("rewards, window, fraction, stops", [
    ([0.0, 0.1, 0.3, 0.6, 0.7, 0.72], 1, 0.15, True),  # slopes .1 .2 .3 .1 .02: .02 < .15 x .3
    ([0.0, 0.1, 0.3, 0.6, 0.7], 1, 0.15, False),  # the last slope .1 is above .045
    ([0.5, 0.5, 0.5, 0.5], 1, 0.15, False),  # a curve that never rose has no plateau
    ([0.9, 0.8, 0.7, 0.6], 1, 0.15, False),  # nor one that only falls
    ([0.0, 1.0, 0.0, 1.0, 1.0, 1.0], 2, 0.5, True),  # smoothed .5 .5 .5 1 1: slopes 0 0 .5 0
    ([0.0, 1.0, 0.0, 1.0, 1.0], 2, 0.5, False),  # smoothed .5 .5 .5 1: the largest slope is the last
    ([0.0, None, 0.5, 0.5], 1, 0.5, True),  # a step without rewards is left out of the curve
])
def test_plateau_is_the_first_slope_below_a_fraction_of_the_largest(rewards, window, fraction, stops):
    from askspec.runtime.train.stages import plateau

    hit = plateau(rewards, window, fraction)
    assert (hit is not None) == stops
    if hit is not None:
        assert hit["slope"] < fraction * hit["max_slope"] and hit["max_slope"] > 0
    # a minimum-steps guard: not before that stage step
    assert plateau(rewards, window, fraction, min_steps=len(rewards) + 1) is None
    assert (plateau(rewards, window, fraction, min_steps=len(rewards)) is not None) == stops


KEEP_BASE = RETRAIN_BASE + "game write { qs = sample 4 ask teacher }\n"


def test_keep_and_sample_settings_compile_to_the_ir():
    res = compile_source("s.ask", KEEP_BASE + "stage rl train { keep = best(accuracy) }\n"
                         "stage t_eval retrain { role = student; game = practice; sample = write; data = hard; "
                         "steps = 30; curriculum = 2; keep = plateau(reward, window = 25, fraction = 0.15) }\n")
    assert res.ok, [(d.code, d.message) for d in res.sink.items]
    train, retrain = res.ir.stages
    assert train.options == {"keep": {"rule": "best", "of": "accuracy"}}
    assert retrain.options == {"role": "student", "game": "practice", "promoted": False, "data": "hard", "steps": 30,
                               "curriculum": 2, "sample": "write",
                               "keep": {"rule": "plateau", "of": "reward", "window": 25, "fraction": 0.15,
                                        "select": "online", "min_steps": 0}}
    from askspec.ir.render import stage_lines

    lines = stage_lines(res.ir)  # `askspec compile --format text`
    assert "keeping the promoted student of best accuracy" in lines[1]
    assert ("at most 30 step(s) playing practice over write's sampled replies + hard (curriculum: write's sampled "
            "replies alone for 2 step(s), then hard), stopping at its reward plateau (window 25, fraction 0.15)") in lines[2]
    # `keep = last` is the default: the IR says nothing
    res = compile_source("s.ask", KEEP_BASE + "stage rl train { keep = last }\n")
    assert res.ok and res.ir.stages[0].options == {}


def test_a_posthoc_plateau_compiles_to_the_ir_and_its_plan():
    res = compile_source("s.ask", KEEP_BASE + "stage rl train\nstage fresh retrain { role = student; game = practice; "
                         "data = hard; steps = 1500; keep = plateau(reward, window = 25, fraction = 0.15, "
                         "select = posthoc, average = 200, every = 50) }\n"
                         "stage fresh_eval evaluate { games = [evaluate]; score = score; weights = [trained] }\n")
    assert res.ok, [(d.code, d.message) for d in res.sink.items]
    _, retrain, evaluate = res.ir.stages
    assert retrain.options["keep"] == {"rule": "plateau", "of": "reward", "window": 25, "fraction": 0.15,
                                       "select": "posthoc", "average": 200, "every": 50}
    from askspec.ir.render import stage_lines
    from askspec.ir.plansize import weight_rounds

    line = next(x for x in stage_lines(res.ir) if "stage fresh retrain" in x)
    assert "trained 1500 step(s)" in line and "at most" not in line  # it trains its whole budget
    assert "start of its reward plateau over the whole curve (a centred window 25, fraction 0.15" in line
    # the evaluation plays each checkpoint of the window: at most 200 / 50 + 1 kept steps and the last
    assert weight_rounds(res.ir, evaluate) == 6
    # the online form takes a minimum-steps guard
    res = compile_source("s.ask", KEEP_BASE + "stage rl train\nstage fresh retrain { role = student; game = practice; "
                         "data = hard; steps = 40; keep = plateau(reward, window = 5, fraction = 0.15, min_steps = 20) }\n")
    assert res.ok and res.ir.stages[1].options["keep"]["min_steps"] == 20
    assert "not before step 20" in next(x for x in stage_lines(res.ir) if "stage fresh retrain" in x)


def app_b6_reference(rewards: list[float], window: int = 25, fraction: float = 0.15) -> int:
    """App. B.6's rule written out from the paper's sentences, apart from the runtime's code:
    "smooth the average training reward curve (centered-moving-average, 25 steps) and
    compute the discrete slopes, normalized by the range of observed rewards. The early
    stopping step is defined as the earliest point where the normalized slope falls below
    15% of the maximum observed slope" (after the steepest rise; the 1-based stage step)."""
    import numpy as np

    r = np.asarray(rewards, dtype=float)
    smooth = np.convolve(r, np.ones(window) / window, mode="valid")  # index i is centred on step i + (window - 1) // 2 + 1
    slopes = np.diff(smooth) / (r.max() - r.min())
    top = int(np.argmax(slopes))
    below = np.nonzero(slopes[top + 1:] < fraction * slopes[top])[0]
    assert below.size  # the curves below level off
    # slope j runs from the smoothed value at step j + (window - 1) // 2 + 1 to the next step's: it is the later one's
    return int(top + 1 + below[0]) + (window - 1) // 2 + 2


def rising_curve(seed: int, rise: int, steps: int = 1500) -> list[float]:
    """A stage's mean training reward: 0.05 rising to 0.55 over `rise` steps, then flat,
    each step the mean of 256 Bernoulli rewards (a batch of 8 questions x 32 samples)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    p = 0.05 + 0.5 * np.minimum(np.arange(1, steps + 1) / rise, 1.0)
    return [float(x) for x in rng.binomial(256, p) / 256]


@pytest.mark.parametrize("seed", range(8))
def test_the_posthoc_selection_is_app_b6_rule_on_a_noisy_rising_curve(seed):
    """SOAR's checkpoint selection (App. B.6), over a 1,500-step noisy curve: the step the
    paper's rule gives, near the end of the rise; the online rule, deciding at each step
    over the curve so far, stops at the first noisy levelling of the rise unless guarded."""
    from askspec.runtime.train.stages import averaged_checkpoints, plateau, plateau_posthoc

    curve = rising_curve(seed, rise=100)
    hit = plateau_posthoc(curve, 25, 0.15)
    assert hit["plateau"] and hit["step"] == app_b6_reference(curve)
    assert hit["max_step"] < hit["step"] and 45 <= hit["step"] <= 115  # the rise ends at step 100
    # App. B.6: test pass@k averaged over 200 steps from it: the checkpoints kept every 50 steps there
    kept = list(range(50, 1501, 50))
    window = averaged_checkpoints(kept, hit["step"], 200, 1500)
    assert window == [n for n in kept if hit["step"] <= n <= hit["step"] + 200] and len(window) == 4
    # the online rule without a guard stops on the rise (the issue's ~30 steps for a 400-step rise)
    slow = rising_curve(seed, rise=400)
    online = next(n for n in range(1, 1501) if plateau(slow[:n], 25, 0.15) is not None)
    assert online < 60
    guarded = next(n for n in range(1, 1501) if plateau(slow[:n], 25, 0.15, min_steps=200) is not None)
    assert guarded >= 200


def test_the_posthoc_selection_without_a_plateau_keeps_the_last_step():
    from askspec.runtime.train.stages import averaged_checkpoints, plateau_posthoc

    assert plateau_posthoc([0.5] * 40, 5, 0.15) == {"step": 40, "plateau": False, "max_slope": 0.0}
    still_rising = [i / 40 for i in range(40)]  # every slope equal: none falls below 15 % of the largest
    assert plateau_posthoc(still_rising, 5, 0.15)["step"] == 40
    assert averaged_checkpoints([10, 20, 30, 40], 40, 200, 40) == [40]
    assert averaged_checkpoints([10, 20, 30, 40], 12, 5, 40) == [20]  # none in [12, 17]: the first kept after it
    assert averaged_checkpoints([10, 20], 25, 200, 33) == [33]  # none after it: the stage's last step


def test_a_sample_game_is_held_out_of_the_schedule_and_needs_no_reward():
    def outer_games(text: str) -> tuple[str, ...]:
        res = compile_source("s.ask", text)
        assert res.ok, [(d.code, d.message) for d in res.sink.items]
        (outer,) = next(c.phases for c in res.ir.train_cycles if c.phases[0].kind == "play")
        return outer.plain

    stage = "stage rl train\nstage t_eval retrain { role = student; game = practice; sample = write }\n"
    assert outer_games(KEEP_BASE + "stage rl train\n") == ("teach", "write")  # any game asking the outer role
    assert outer_games(KEEP_BASE + stage) == ("teach",)  # the sampled game is held out
    # with a reward of the game's own (Intrinsic-T), `write` asks the trained teacher without rewarding it:
    # no E402 for a stage's sample game, E402 for a game the schedule would train on
    intrinsic = KEEP_BASE.replace("evaluate = evaluate }", "evaluate = evaluate; outer_reward = intrinsic }").replace(
        "game teach { xs = sample 2 ask teacher }", "game teach {\n xs = sample 2 ask teacher\n for x in xs { reward x as r = 1 }\n}")
    assert outer_games(intrinsic + stage) == ("teach",)
    res = compile_source("s.ask", intrinsic + "stage rl train\n")
    assert [d.code for d in res.sink.items if d.severity == "error"] == ["E402"]


def test_the_closing_line_counts_the_steps_a_plateau_left_unplayed():
    """`trained ROLE for N step(s)` said the planned steps when `keep = plateau(...)` had
    stopped a stage early; it says how many ran, and why not the rest."""
    from types import SimpleNamespace

    from askspec.runtime.train.trainer import LocalTrainer, StageState

    res = compile_source("s.ask", BASE + "stage rl train\nstage fresh retrain { role = solver; game = practice; "
                         "data = qs; steps = 6; keep = plateau(reward, window = 1, fraction = 0.5) }\n"
                         "stage heldout evaluate { games = [test]; score = correct }\n")
    assert res.ok, [(d.code, d.message) for d in res.sink.items]
    slots = schedule.slots(res.ir)
    assert [s.phase.stage for s in slots] == ["rl"] + ["fresh"] * 6 + ["heldout"]
    trainer = SimpleNamespace(slots=slots, steps=len(slots), stage_state=StageState())
    assert LocalTrainer.steps_done(trainer) == "8 step(s)"  # type: ignore[arg-type]
    trainer.stage_state.stopped["fresh"] = 4  # the stage's third step: steps 5-7 never ran
    assert LocalTrainer.steps_done(trainer) == ("5 of 8 step(s) (stage fresh stopped at its reward plateau "  # type: ignore[arg-type]
                                                "at step 4)")
