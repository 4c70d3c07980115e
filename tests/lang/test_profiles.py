"""Profiles (`profile NAME { ... }`, `--profile NAME`): one switch selects a configuration
covering parameters, models and train blocks, and the IR is that configuration's."""

from __future__ import annotations

from pathlib import Path

from askspec.ir import canonical, render
from askspec.lang.compiler import compile_source

from lang_helpers import ROOT, run_cli

BASE = """
experiment e {
    param probes: int = 4
    param names: list[string] = ["small", "big"]
    PROFILE_DEFAULT
}
model policy = hf("smollm2-135m-instruct") { temperature = 1.0; max_tokens = 6000 }
model small = hf("smollm2-135m-instruct") { temperature = 0.7; max_tokens = 4000 }
model big = small { top_p = 0.9 }
role q { model = policy; trained; prompt = "Ask." }
role b { prompt = "Answer." }
game g for m in names {
    bind b = m
    repeat probes { x = ask q }
    y = ask b
    reward q = 1.0
}
train q with cispo(clip_low = 0.75, clip_high = 3.0) { lr = 0.000001; steps = 10 }
"""

PROFILES = """
profile benchmark { param probes = 4 }
profile training {
    param probes = 3
    model policy { max_tokens = 4000 }
    model big = python("askspec.runtime.backends.python_backend:echo")
    train q { steps = 200; warmup = 60; weight_decay = 0.01 }
}
"""

# what the training profile amounts to, written out by hand
TRAINING_INLINE = BASE.replace("param probes: int = 4", "param probes: int = 3").replace(
    "temperature = 1.0; max_tokens = 6000", "temperature = 1.0; max_tokens = 4000").replace(
    "model big = small { top_p = 0.9 }", 'model big = python("askspec.runtime.backends.python_backend:echo")').replace(
    "{ lr = 0.000001; steps = 10 }", "{ lr = 0.000001; steps = 200; warmup = 60; weight_decay = 0.01 }")


def compiled(text: str, profile: str | None = None, overrides: dict | None = None):
    res = compile_source("e.ask", text, overrides, profile)
    assert res.ok, [d.message for d in res.sink.items]
    return res.ir


def without_profile(ir) -> dict:
    data = canonical.canonical_data(ir)
    data["options"].pop("profile", None)
    return data


def spec(default: str | None = None) -> str:
    return BASE.replace("PROFILE_DEFAULT", f"profile = {default}" if default else "") + PROFILES


def test_a_profile_is_the_same_ir_as_its_values_written_out() -> None:
    inline = compiled(TRAINING_INLINE.replace("PROFILE_DEFAULT", ""))
    chosen = compiled(spec(), "training")
    assert without_profile(chosen) == without_profile(inline)
    assert chosen.options["profile"] == "training"
    hyper = chosen.training[0].written()
    assert (hyper["steps"], hyper["warmup"], hyper["weight_decay"], hyper["lr"]) == (200, 60, 0.01, 0.000001)
    assert chosen.model("policy").sampling["max_tokens"] == 4000
    assert chosen.model("policy").sampling["temperature"] == 1.0  # settings not overridden stay
    assert chosen.model("big").backend == "python"


def test_the_default_profile_applies_without_the_switch_and_the_switch_wins() -> None:
    assert compiled(spec("training")).options["profile"] == "training"
    assert compiled(spec("training")).params[0].value == 3
    bench = compiled(spec("training"), "benchmark")
    assert bench.options["profile"] == "benchmark" and bench.params[0].value == 4
    assert bench.model("policy").sampling["max_tokens"] == 6000
    # no default and no switch: the declarations as written, and no profile in the IR
    plain = compiled(spec())
    assert "profile" not in plain.options and plain.params[0].value == 4


def test_set_overrides_a_profiles_value_and_hashes_differ_per_profile() -> None:
    assert compiled(spec(), "training", {"probes": "2"}).params[0].value == 2
    hashes = {canonical.experiment_hash(compiled(spec(), p)) for p in ("benchmark", "training")}
    assert len(hashes) == 2
    # a spec without profiles keeps its hash (profile is only recorded when one is chosen)
    assert canonical.experiment_hash(compiled(spec())) == canonical.experiment_hash(
        compiled(BASE.replace("PROFILE_DEFAULT", "")))


def test_text_names_the_profile() -> None:
    text = render.to_text(compiled(spec("benchmark")))
    assert text.splitlines()[1] == "profile: benchmark"


def test_train_algorithm_replaced_and_value_errors_point_into_the_profile() -> None:
    text = spec() + "profile alt { train q with grpo { steps = 5 } }\n"
    alt = compiled(text, "alt")
    assert alt.training[0].algorithm == "grpo" and alt.training[0].written()["steps"] == 5
    assert not {"clip_low", "clip_high"} & set(alt.training[0].given)  # the cispo arguments went with cispo
    res = compile_source("e.ask", text + "profile bad { param probes = \"x\" }\n", None, "bad")
    assert not res.ok
    (d,) = [d for d in res.sink.items if d.is_error]
    assert d.code == "E201" and d.span.line == text.count("\n") + 1  # the profile's line


def test_duplicate_profiles_and_settings_are_e104() -> None:
    res = compile_source("e.ask", spec() + "profile training { }\nprofile x { param probes = 1; param probes = 2 }\n")
    assert sorted(d.code for d in res.sink.items if d.is_error) == ["E104", "E104"]


def test_cli_profile_on_check_and_compile(tmp_path: Path) -> None:
    (tmp_path / "e.ask").write_text(spec("benchmark"))
    res = run_cli("compile", "e.ask", "--format", "text", "--profile", "training", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "profile: training" in res.stdout and "probes: int = 3" in res.stdout
    res = run_cli("check", "e.ask", "--profile", "trainig", cwd=tmp_path)
    assert res.returncode == 1
    assert "error[E112]: --profile trainig: no profile named 'trainig'" in res.stderr
    assert "did you mean 'training'?" in res.stderr and "Traceback" not in res.stderr


def test_shipped_specs_keep_their_profiles_checked() -> None:
    """Every shipped spec with profiles compiles under each of them."""
    import re

    for path in sorted((ROOT / "specs").glob("*.ask")):
        text = path.read_text()
        for name in re.findall(r"^profile (\w+)", text, re.M):
            res = run_cli("check", "-q", str(path.relative_to(ROOT)), "--profile", name)
            assert res.returncode == 0, (path.name, name, res.stderr)


TWO_ROLES = """
experiment e { param t_a: int = 2; param steps: int = 3 }
model m = hf("smollm2-135m-instruct") { max_tokens = 8 }
role a { model = m; trained; memory = none }
role b { model = m; trained; memory = none }
data qs = [{q: "1+1"}]
game g for item in qs {
    x = ask a: item.q
    y = ask b: item.q
    valid = len(x.text) > 3
    reward a = 1.0
    reward b = 1.0
}
train a with grpo { lr = 0.000001 }
train b with grpo { lr = 0.000001 }
SCHEDULE
profile off { }
profile on {
    schedule online { steps = steps }
    train a { update_when = sum(valid) > 0 }
}
"""


def test_a_profile_replaces_the_schedule_and_adds_an_update_gate():
    src = TWO_ROLES.replace("SCHEDULE", "schedule alternating { a = t_a; b = 1; iterations = 2 }")
    off, on = compiled(src, "off"), compiled(src, "on")
    assert off.schedule.kind == "alternating" and all(t.update_when is None for t in off.training)
    assert on.schedule.kind == "online" and on.schedule.options == {"steps": 3}
    assert [t.update_when is not None for t in on.training] == [True, False]
    # the same as writing the online configuration out by hand
    inline = TWO_ROLES.replace("SCHEDULE", "schedule online { steps = steps }").replace(
        "train a with grpo { lr = 0.000001 }", "train a with grpo { lr = 0.000001; update_when = sum(valid) > 0 }")
    assert without_profile(on) == without_profile(compiled(inline, "off"))
    # a spec without a schedule (online by default) gets the profile's
    assert compiled(TWO_ROLES.replace("SCHEDULE", ""), "on").schedule.options == {"steps": 3}
    text = render.to_text(on)
    assert "  3 step(s); each plays g and updates a (update_when (sum(valid) > 0)), b; g: a ≤ 1, b ≤ 1 per session" in text


def test_parameters_another_configuration_uses_are_not_reported_unused():
    src = TWO_ROLES.replace("SCHEDULE", "schedule alternating { a = t_a; b = 1; iterations = 2 }")
    for profile in ("off", "on"):
        res = compile_source("e.ask", src, None, profile)
        assert res.ok and [d.message for d in res.sink.items if d.code == "W501"] == []
    # a parameter no configuration uses still is
    res = compile_source("e.ask", src.replace("param steps: int = 3 }", "param steps: int = 3; param idle: int = 1 }"),
                         None, "on")
    assert [d.message for d in res.sink.items if d.code == "W501"] == ["param 'idle' is never used"]


def test_check_checks_every_profile_and_reports_each_error_once(tmp_path: Path) -> None:
    """`askspec check` without --profile finds errors only profiles that are not the
    default have (noted with each profile), reports an error of every configuration once
    and leaves out the other profiles' warnings; --profile checks that one only."""
    (tmp_path / "e.ask").write_text(
        'experiment e { param n: int = 2; profile = ok }\n'
        'model m = hf("smollm2-135m-instruct")\n'
        'role q { model = m; prompt = "Hi." }\n'
        'role unused { prompt = scroe }\n'           # every configuration: E110, once
        'game g times n { ask q }\n'                 # n = 0 in two profiles: one E107, two notes
        'profile ok { }\n'
        'profile zero { param n = 0 }\n'
        'profile zero_too { param n = 0 }\n'
        'profile text { param n = "x"; param spare = 1 }\n')  # E201 here; E113 once
    res = run_cli("check", "e.ask", cwd=tmp_path)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    err = res.stderr
    assert err.count("error[E110]: unknown template 'scroe'") == 1
    assert err.count("error[E113]") == 1
    [times] = [block for block in err.split("\ne.ask:") if "times must be" in block]
    assert "e.ask:5:14" in "e.ask:" + times
    assert "note: e.ask:7:9: in profile zero\n" in times and "note: e.ask:8:9: in profile zero_too" in times
    assert "error[E201]" in err and "note: e.ask:9:9: in profile text" in err
    assert "in profile ok" not in err and err.count("in profile") == 3
    assert err.count("warning[") == 1  # W501 role 'unused': the default's; no profile adds its own copy
    res = run_cli("check", "e.ask", "--profile", "ok", cwd=tmp_path)
    assert "times must be" not in res.stderr and "in profile" not in res.stderr
