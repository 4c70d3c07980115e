"""Training settings are lowered at compile time: the IR's `Training.config` holds every
default, the algorithm's estimator, loss and aggregation, and the schedule's steps; it is
part of the experiment hash, so changing a default that a spec relies on changes the hash."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from askspec.ir.canonical import experiment_hash, from_json, to_json
from askspec.lang import training
from askspec.lang.compiler import compile_source
from askspec.runtime.train.config import config_from_ir

SPEC = """model m = hf("smollm2-135m-instruct")
role a {{ model = m; prompt = "guess a number"; trained }}
game g for i in range(0, 8) {{
    x = ask a
    reward a = 1.0
}}
train a with {algo} {{ {settings} }}
schedule online {{ steps = 7 }}
"""


def compile_ok(tmp_path: Path, algo: str = "grpo", settings: str = "group = 2"):
    res = compile_source(str(tmp_path / "s.ask"), SPEC.format(algo=algo, settings=settings))
    assert res.ok, [d.message for d in res.sink.items]
    return res.ir


def test_the_ir_holds_every_default_and_the_schedule_steps(tmp_path):
    cfg = compile_ok(tmp_path).training[0].config
    assert cfg is not None
    assert (cfg.lr, cfg.beta2, cfg.micro_batch, cfg.dtype) == (1e-6, 0.999, 8, "auto")
    assert (cfg.estimator, cfg.loss, cfg.aggregation, cfg.clip_low, cfg.clip_high) == ("grpo", "ppo", "sequence", 0.2, 0.2)
    assert (cfg.group, cfg.steps) == (2, 7)  # steps from the online schedule
    gspo = compile_ok(tmp_path, "gspo(clip_low = 0.001)").training[0].config
    assert gspo is not None and (gspo.loss, gspo.clip_low, gspo.clip_high) == ("gspo", 0.001, 4e-4)


def test_the_trainer_reads_the_lowered_settings(tmp_path):
    exp = compile_ok(tmp_path, "cispo", "lr = 0.001; kl = 0.1")
    exp.training[0].config = exp.training[0].config.model_copy(update={"lr": 0.5})  # type: ignore[union-attr]
    cfg = config_from_ir(exp.training[0], exp)
    assert (cfg.role, cfg.algorithm, cfg.loss, cfg.lr, cfg.kl) == ("a", "cispo", "cispo", 0.5, 0.1)


def test_the_config_round_trips_through_json(tmp_path):
    exp = compile_ok(tmp_path)
    assert from_json(to_json(exp)).training[0].config == exp.training[0].config


def test_a_changed_default_changes_the_hash_of_a_spec_that_relies_on_it(tmp_path, monkeypatch):
    relies, states = compile_ok(tmp_path), compile_ok(tmp_path, settings="group = 2; beta2 = 0.999")
    before = experiment_hash(relies), experiment_hash(states)
    monkeypatch.setitem(training.HYPERPARAMETERS, "beta2",
                        dataclasses.replace(training.HYPERPARAMETERS["beta2"], default=0.95))
    after = experiment_hash(compile_ok(tmp_path)), experiment_hash(compile_ok(tmp_path, settings="group = 2; beta2 = 0.999"))
    assert after[0] != before[0]
    assert after[1] == before[1]  # a spec that gives the setting does not depend on its default


def test_a_train_block_is_lowered_whole(tmp_path):
    """The IR keeps no setting as written: only the lowered `config` and the names the
    block gives (`given`), whose values `written()` reads back from the config."""
    t = compile_ok(tmp_path, "gspo(clip = 0.01, clip_high = 0.02)", "group = 2; lr = 0.001; micro_batch = 4").training[0]
    dumped = t.model_dump()
    assert "hyper" not in dumped and "algorithm_args" not in dumped
    assert t.given == ["clip", "clip_high", "group", "lr", "micro_batch"]
    assert t.written() == {"clip": 0.01, "clip_high": 0.02, "group": 2, "lr": 0.001, "micro_batch": 4}
    assert t.config is not None and (t.config.clip_low, t.config.clip_high, t.config.steps) == (0.01, 0.02, 7)


def test_an_ir_written_with_the_settings_as_written_still_reads(tmp_path):
    """An old run's ir.json kept a block's settings under `hyper` and `algorithm_args`: it
    reads, its names becoming `given`, and it lowers as before (its config is its own)."""
    exp = compile_ok(tmp_path, "cispo(clip_high = 3.0)", "group = 2; lr = 0.001")
    old = exp.model_dump(mode="json")
    for block in old["training"]:
        block.pop("given")
        block["hyper"], block["algorithm_args"] = {"group": 2, "lr": 0.001}, {"clip_high": 3.0}
    read = type(exp).model_validate(old)
    assert read.training[0].given == ["clip_high", "group", "lr"]
    assert read.training[0].written() == exp.training[0].written()


TWO_ROLES = """model m = hf("smollm2-135m-instruct")
role p {{ model = m; prompt = "propose"; trained }}
role s {{ model = m; prompt = "solve"; trained }}
buffer qs {{ capacity = 50 }}
game propose for i in range(0, 5) {{
    x = ask p
    push qs: {{q: x}}
    reward p = 1.0
}}
game big for i in range(0, 3) sample 4 {{
    x = ask p
    reward p = 1.0
}}
game solve for q in qs {{
    y = ask s
    reward s = 1.0
}}
train p with grpo {{ {p} }}
train s with grpo {{ {s} }}
schedule alternating {{ p = 2; s = 1; iterations = 3 }}
"""


def test_each_phase_is_lowered_with_its_games_group_and_step_sizes(tmp_path):
    """The schedule's phases are in the IR with each game's group, the sessions a step
    plays and the items a replaying step takes: a `sample N` game's N wins over the
    block's `group`; `batch` counts sessions in whole groups; one group without it."""
    res = compile_source(str(tmp_path / "s.ask"), TWO_ROLES.format(p="group = 2; batch = 5", s="group = 3; batch = 7"))
    assert res.ok, [d.message for d in res.sink.items]
    (cycle,) = res.ir.train_cycles
    assert cycle.iterations == 3
    p, s = cycle.phases
    assert (p.name, p.roles, p.plain, p.replay, p.steps) == ("p", ("p",), ("propose", "big"), (), 2)
    assert (p.groups, p.batch, p.replay_items) == ({"propose": 2, "big": 4}, 5, {})
    assert (s.plain, s.replay, s.groups, s.replay_items) == ((), ("solve",), {"solve": 3}, {"solve": 3})  # 7 -> 9 sessions
    # without `batch`: one group a step, of the phase's first plain game; a replay takes one group
    res = compile_source(str(tmp_path / "s.ask"), TWO_ROLES.format(p="group = 2", s=""))
    p, s = res.ir.train_cycles[0].phases
    assert (p.batch, s.groups, s.replay_items) == (2, {"solve": 1}, {"solve": 1})


def test_the_trainer_and_the_job_plan_with_the_lowered_sizes(tmp_path):
    """The sizes are read, not computed again: a phase whose lowered `batch` is changed in
    the IR (as a later lowering rule would) plans that many sessions, locally and in the
    job's prompts per step."""
    from askspec.runtime.train.planner import StepPlanner
    from askspec.runtime.targets.openrlhf.check import Phase
    from askspec.runtime.targets.openrlhf.generate import step_prompts

    exp = compile_source(str(tmp_path / "s.ask"), TWO_ROLES.format(p="group = 2; batch = 5", s="")).ir
    cycle = exp.train_cycles[0]
    p = cycle.phases[0].model_copy(update={"batch": 8})
    exp.train_cycles = [cycle.model_copy(update={"phases": [p, cycle.phases[1]]})]
    games = [g for g in exp.games if g.name in p.plain]
    planner = StepPlanner(exp, games, exp.param_values(), {}, 0, p.groups, p.batch)
    assert planner.sessions_per_step(1) == 8 and {x.group_size for x in planner.plans(1)} == {2}
    job_phase = Phase(role="p", games=["propose"], training=exp.training[0], algorithm="grpo", substituted=None,
                      group=2, steps=None)
    assert step_prompts(exp, job_phase, games[0]) == 4  # 8 sessions in groups of 2


def test_a_nested_schedules_trained_roles_need_train_blocks(tmp_path):
    """The outer role's steps (and, with the inner loop, the inner role's sizes) come from
    their train blocks: a trained role without one is an error, not a crash."""
    spec = ('model m = hf("smollm2-135m-instruct")\nrole t { model = m; prompt = "teach"; trained }\n'
            'role s { model = m; prompt = "learn"; trained }\ngame teach { x = ask t\n reward t = 1.0 }\n'
            "train t with grpo { group = 2 }\nschedule nested { outer = OUTER; inner = INNER; outer_reward = intrinsic }\n")
    ok = compile_source(str(tmp_path / "n.ask"), spec.replace("OUTER", "t").replace("INNER", "s"))
    assert ok.ok and ok.ir.inner_phase is None  # intrinsic: no inner loop, the inner role needs no block
    bad = compile_source(str(tmp_path / "n.ask"), spec.replace("OUTER", "s").replace("INNER", "t"))
    errors = [(d.code, d.message) for d in bad.sink.items if d.severity == "error"]
    assert errors == [("E405", "the outer role 's' of a nested schedule has no train block")]


SAMPLED = """model m = hf("smollm2-135m-instruct") {{ temperature = 0.7; top_p = 0.9; max_tokens = 64 }}
role a {{ model = m; prompt = "guess a number"; trained; {role} }}
game g for i in range(0, 8) {{
    x = ask a
    reward a = 1.0
}}
train a with grpo {{ group = 2 }}
"""


def test_each_roles_sampling_is_lowered_on_its_model(tmp_path):
    """A role's sampling arrives merged: the IR's defaults, its model's fields over them,
    its own over those, its `max_tokens` last; the engine's rule for a bound model is the
    same function, and the job's flags read the lowered fields."""
    from askspec.ir.model import merged_sampling
    from askspec.runtime.engine.calls import ModelCalls
    from askspec.runtime.engine.state import ModelBinding

    exp = compile_source(str(tmp_path / "s.ask"), SAMPLED.format(role="temperature = 0.2; max_tokens = 32")).ir
    (role,) = exp.roles
    assert role.resolved_sampling == {"temperature": 0.2, "top_p": 0.9, "max_tokens": 32}
    plain = compile_source(str(tmp_path / "s.ask"), SAMPLED.format(role="memory = full")).ir
    assert plain.roles[0].resolved_sampling == {"temperature": 0.7, "top_p": 0.9, "max_tokens": 64}
    # the engine merges the same way over whatever model a run binds (here: the declared one)
    binding = ModelBinding(name="m", backend=None, weights="", sampling=dict(exp.models[0].sampling))  # type: ignore[arg-type]
    fields, _ = ModelCalls(None, defaults=exp.sampling_defaults).sampling("a", role, binding)  # type: ignore[arg-type]
    assert {k: fields[k] for k in role.resolved_sampling} == merged_sampling(exp.sampling_defaults, binding.sampling, role)
    assert {k: fields[k] for k in role.resolved_sampling} == role.resolved_sampling


def test_the_job_passes_the_lowered_sampling(tmp_path):
    """`--rollout.*` flags come from the role's lowered sampling, the defaults included:
    a spec that sets no max_tokens passes askspec's (what a local call uses), not OpenRLHF's."""
    import re

    from askspec.runtime.targets.openrlhf.generate import compile_job

    res = compile_source(str(tmp_path / "s.ask"), SAMPLED.replace(" max_tokens = 64 ", " ").format(role="memory = full"))
    assert res.ok
    assert compile_job(res, str(tmp_path / "s.ask"), str(tmp_path / "job"), {}) == 0
    flag = dict(re.findall(r"(--rollout\.\w+) (\S+)", (tmp_path / "job" / "launch.sh").read_text()))
    assert (flag["--rollout.max_new_tokens"], flag["--rollout.temperature"], flag["--rollout.top_p"]) == ("256", "0.7", "0.9")


def test_the_engine_names_a_replys_fields_as_the_ir_does(tmp_path):
    """A `sections` or `tags` parser's field names are the IR's (`ReplyParser.fields`, the
    checker's one tag -> field rule): the engine reads them rather than naming the tags
    again, so an IR whose names differ parses into those names."""
    from askspec.ir import model as ir
    from askspec.runtime.engine.calls import reply_fields

    res = compile_source(str(tmp_path / "s.ask"), 'model m = hf("smollm2-135m-instruct")\n'
                         'role a { model = m; prompt = "p"; reply = sections("#Draft#", "#Final Answer#") }\n'
                         'role b { model = m; prompt = "p"; reply = tags("think", "answer_box", boxed = "answer_box") }\n'
                         "game g { x = ask a\n y = ask b }\n")
    assert res.ok, [d.message for d in res.sink.items]
    sections, tags = res.ir.roles[0].reply, res.ir.roles[1].reply
    assert sections.fields == ["draft", "finalanswer"] and tags.fields == ["think", "answer_box", "answer"]
    fields, ok, _ = reply_fields(sections, "#Draft# a plan #Final Answer# 42")
    assert ok and (fields["draft"], fields["finalanswer"]) == ("a plan", "42")
    renamed = ir.ReplyParser(kind="sections", args=sections.args, fields=["plan", "final"], required=["final"])
    fields, ok, _ = reply_fields(renamed, "#Draft# a plan #Final Answer# 42")
    assert ok and (fields["plan"], fields["final"]) == ("a plan", "42") and "draft" not in fields
    renamed = ir.ReplyParser(kind="tags", args=tags.args, fields=["reasoning", "box", "answer"], required=tags.required)
    fields, ok, _ = reply_fields(renamed, "<think>hm</think><answer_box>so \\boxed{7}</answer_box>")
    assert ok and (fields["reasoning"], fields["box"], fields["answer"]) == ("hm", "so \\boxed{7}", "7")
