"""Training you can watch and trust (issue #26, items 1, 2 and 4): a line per trained role
and step on stderr and closing lines with a warning when most steps had no signal; a step
whose advantages are all 0 skips its update and `train_steps.skipped` says so; `--log
tensorboard` / `--log wandb` write every train_steps column, read back with their own
readers. On the suite's tiny random Llama (tests/conftest.py)."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import struct
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import pytest
import torch

from askspec.ir import model as ir
from askspec.lang.training import lower_training
from askspec.runtime.commands.options import RunOptions, UsageError
from askspec.runtime.commands.train_report import TrainReport
from askspec.runtime.store.views import open_store
from askspec.runtime.train.batch import Trajectory, Turn
from askspec.runtime.train.config import config_from_ir

pytestmark = pytest.mark.slow  # (askspec processes, a Ray cluster or a real model)


# two groups of 4 a step; the reward is the test's: a constant (no signal), or one that
# varies with the reply (four replies of equal length in both groups would be a skip)
SPEC = """model m = hf("{model}") {{ max_tokens = 4; temperature = 1.0 }}
role a {{ model = m; memory = none; prompt = "guess a number"; trained }}
game g for i in range(0, 8) {{
    x = ask a
    reward a = {reward}
}}
train a with grpo {{ group = 4; batch = 8; steps = 2; save_every = 1; lr = 0.01 }}
"""


def policy_for(folder: Path, **hyper):
    from askspec.runtime.train.policy import TrainedPolicy

    exp = lower_training(ir.Experiment(name="t", roles=[ir.Role(name="r", trained=True)],
                                       training=[ir.Training(role="r", algorithm="grpo")]), {"r": {"lr": 0.01, **hyper}})
    return TrainedPolicy(config_from_ir(exp.training[0], exp), str(folder), {"num_threads": 1})


def trajectories(rewards: list[float], completion: list[int] | None = None) -> list[Trajectory]:
    done = [10, 11, 2] if completion is None else completion
    return [Trajectory(f"s{i}/r", f"g{i // 2}", r, [Turn(f"s{i}", 1, 0, [1, 5, 8, 9], done, [-3.0] * len(done), 1.0,
                                                          "stop")])
            for i, r in enumerate(rewards)]


@pytest.fixture
def run(capsys, monkeypatch) -> Callable[..., SimpleNamespace]:
    """`askspec run SPEC --out OUT ARGS` in this process (a fresh interpreter would import torch
    and transformers again): its exit status and stderr, as `returncode` and `stderr`."""
    from askspec.cli import main

    for name in ("ASKSPEC_DEBUG", "WANDB_API_KEY"):  # a user's shell: no traceback, no W&B account
        monkeypatch.delenv(name, raising=False)

    def go(spec: Path, out: Path, *args: str) -> SimpleNamespace:
        capsys.readouterr()
        rc = main(["run", str(spec), "--out", str(out), *args])
        return SimpleNamespace(returncode=rc, stderr=capsys.readouterr().err)

    return go


def only_run(out: Path) -> Path:
    (run_dir,) = [d for d in out.iterdir() if d.is_dir() and not d.name.startswith(".")]
    return run_dir


# ---------------------------------------------------------------------------------------
# the update


def test_equal_rewards_skip_the_update_without_a_forward_pass(tiny_model, monkeypatch):
    policy = policy_for(tiny_model)
    before = [p.detach().clone() for p in policy.params]

    def no_forward(*a, **k):
        raise AssertionError("a skipped step ran the model")

    monkeypatch.setattr(policy, "token_logprobs", no_forward)
    m = policy.update(trajectories([1.0, 1.0, 0.0, 0.0]))  # two groups, each of equal rewards
    assert m["skipped"] == "zero_advantage" and "2 of 2 group(s)" in m["skip_reason"]
    assert m["zero_adv_share"] == 1.0 and m["loss"] is None and m["grad_norm"] is None
    assert m["reward_std"] == pytest.approx(math.sqrt(1 / 3))  # the block's std: sample (n − 1) by default
    assert all(torch.equal(a, p) for a, p in zip(before, policy.params)) and not policy.optimizer.state
    assert policy.version == 1  # the learning-rate schedule counts the step (docs/training.md)
    monkeypatch.undo()
    m = policy.update(trajectories([1.0, 0.0, 0.0, 0.0]))  # one group with a signal: the update runs
    assert "skipped" not in m and m["loss"] is not None and m["grad_norm"] > 0
    assert any(not torch.equal(a, p) for a, p in zip(before, policy.params))


def test_a_kl_term_keeps_the_step_and_no_tokens_skip_it(tiny_model):
    policy = policy_for(tiny_model, kl=0.1)
    m = policy.update(trajectories([1.0, 1.0]))  # no advantage, but the KL term is a loss of its own
    assert "skipped" not in m and m["zero_adv_share"] == 1.0 and m["kl"] is not None and m["loss"] is not None
    m = policy_for(tiny_model).update(trajectories([1.0, 0.0], completion=[]))
    assert m["skipped"] == "no_tokens" and m["tokens"] == 0
    one = trajectories([1.0, 0.0])
    one[1].group_key = "g1"  # two groups of one trajectory: nothing to compare within
    m = policy_for(tiny_model).update(one)
    assert m["skipped"] == "zero_advantage" and "0 of 2 group(s) had equal rewards, 2 had one trajectory" in m["skip_reason"]


def test_the_report_counts_skips_and_warns_when_most_steps_had_no_signal():
    report = TrainReport(3)
    flat = {"reward_mean": 1.0, "reward_std": 0.0, "zero_adv_share": 1.0, "trajectories": 4, "skipped": "zero_advantage"}
    line = report.step(1, {"a": {**flat, "stage": "rl", "generated_tokens": 12, "seconds_play": 2.0,
                                  "seconds_update": 0.001}})[0]
    assert line == ("step 1/3 rl a: reward 1.000 ± 0.000  zero-adv 100%  loss -  kl -  grad -  clip -  tokens 12  "
                    "rollout 2.0 s  update 0.00 s  skipped: zero_advantage")
    report.step(2, {"a": flat, "b": {"reward_mean": 0.5, "zero_adv_share": 0.0, "trajectories": 4, "loss": 0.1}})
    report.step(3, {"a": {"reward_mean": 2.0, "zero_adv_share": 0.5, "trajectories": 4, "loss": 0.2},
                    "b": {"skipped": "gate", "trajectories": 0}})
    # a: 2 of 3 steps without a signal (most); b: its gate's skip is no sign of equal rewards
    assert report.warnings() == ["a: 2 of 3 steps: every group had equal rewards — no gradient; widen the reward or "
                                 "the group"]
    assert report.summary() == [
        "  training a: 3 step(s), reward mean 1.000 (step 1) -> 2.000 (step 3); 2 skipped (zero_advantage 2)",
        "  training b: 2 step(s), reward mean 0.500 (step 2) -> 0.500 (step 2); 1 skipped (gate 1)"]
    report.step(4, {"a": {"reward_mean": 2.5, "zero_adv_share": 0.0, "trajectories": 4, "loss": 0.1}})
    assert report.warnings() == []  # 2 of 4: not most
    # groups of one trajectory (no `group` in a GRPO block) are named as the cause
    alone = TrainReport(1)
    alone.step(1, {"a": {**flat, "groups": 4, "zero_var_groups": 0}})
    assert alone.warnings() == ["a: 1 of 1 steps: every group had one trajectory — no gradient; set `group` in the "
                                "train block (e.g. group = 4) so that each prompt's rollouts are compared"]


# ---------------------------------------------------------------------------------------
# whole runs


def test_a_run_without_signal_shows_each_step_skips_each_update_and_warns(tiny_model, tmp_path, run):
    spec = tmp_path / "flat.ask"
    spec.write_text(SPEC.format(model=tiny_model, reward="1.0"))
    done = run(spec, tmp_path / "runs")
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("step ")]
    assert len(lines) == 2, done.stderr
    for n, line in enumerate(lines, 1):
        assert re.fullmatch(rf"step {n}/2 online a: reward 1\.000 ± 0\.000  zero-adv 100%  loss -  kl -  grad -  "
                            rf"clip -  (mis \S+  )?tokens \d+  rollout \d+\.\d s  update \d\.\d\d s  "
                            rf"skipped: zero_advantage",
                            line), line
    assert "  training a: 2 step(s), reward mean 1.000 (step 1) -> 1.000 (step 2); 2 skipped (zero_advantage 2)" \
        in done.stderr
    assert ("warning: a: 2 of 2 steps: every group had equal rewards — no gradient; widen the reward or the group"
            in done.stderr)
    run_dir = only_run(tmp_path / "runs")
    rows = open_store(run_dir).execute("SELECT step, skipped, loss, zero_adv_share, metrics->>'skip_reason' "
                                       "FROM train_steps ORDER BY step").fetchall()
    assert [r[:4] for r in rows] == [(1, "zero_advantage", None, 1.0), (2, "zero_advantage", None, 1.0)]
    assert all(r[4].startswith("every advantage is 0 (2 of 2 group(s)") for r in rows)
    # a skipped step is still a resume point: its checkpoint is written (the weights are unchanged)
    assert json.loads((run_dir / "checkpoints" / "latest.json").read_text())["step"] == 2
    state = json.loads((run_dir / "checkpoints" / "a" / "step-2" / "trainer_state.json").read_text())
    assert state["version"] == 2 and state["optimizer_steps"] == {}  # the schedule counted; AdamW never stepped
    quiet = run(spec, tmp_path / "quiet", "--quiet")
    assert quiet.returncode == 0 and "step 1/2" not in quiet.stderr and "every group had equal rewards" in quiet.stderr


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                    reason="the tensorboard package is not installed (pip install -e '.[dev]')")
def test_live_lines_and_tensorboard_hold_the_train_steps(tiny_model, tmp_path, run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    spec = tmp_path / "live.ask"
    spec.write_text(SPEC.format(model=tiny_model, reward="len(x.text) + i"))
    spec.write_text("param bonus = 0\n" + SPEC.format(model=tiny_model, reward="len(x.text) + i + bonus"))
    board = tmp_path / "board"
    done = run(spec, tmp_path / "runs", "--log", f"tensorboard:{board}", "--set", "bonus=1", "--seed", "7")
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("step ")]
    assert len(lines) == 2 and all("skipped" not in ln for ln in lines), done.stderr
    for line in lines:
        assert re.search(r"reward [\d.]+ ± [\d.]+  zero-adv \d+%  loss \S+  kl 0  grad [\d.e+-]+  clip \d+%  "
                         r"(mis \S+  )?tokens \d+  rollout \d+\.\d s  update \d\.\d\d s$", line), line
        assert "loss -  " not in line and "grad -  " not in line, line  # "-" alone: no value
    assert "equal rewards" not in done.stderr
    run_dir = only_run(tmp_path / "runs")
    rows = open_store(run_dir).execute("SELECT step, loss, reward_mean, reward_std, zero_adv_share, kl, clip_frac, "
                                       "grad_norm, lr, tokens, seconds, skipped FROM train_steps ORDER BY step").fetchall()
    assert all(r[-1] is None for r in rows)
    acc = EventAccumulator(str(board / run_dir.name), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    cols = ("loss", "reward_mean", "reward_std", "zero_adv_share", "kl", "clip_frac", "grad_norm", "lr", "tokens",
            "seconds")
    for c, col in enumerate(cols, 1):
        got = [(e.step, e.value) for e in acc.Scalars(f"a/{col}")]
        assert got == [(r[0], pytest.approx(r[c], rel=1e-6, abs=1e-7)) for r in rows], col
    assert [e.value for e in acc.Scalars("a/skipped")] == [0.0, 0.0]
    assert {"a/seconds_play", "a/seconds_update", "a/generated_tokens"} <= set(acc.Tags()["scalars"])
    config = json.loads(acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode().strip("`\n"))
    assert config["experiment"] == "live" and config["seed"] == 7 and config["overrides"] == {"bonus": "1"}
    assert config["run_id"] == run_dir.name and len(config["experiment_hash"]) >= 12


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                    reason="the tensorboard package is not installed (pip install -e '.[dev]')")
def test_a_logger_that_cannot_start_fails_the_run_before_any_step(tiny_model, tmp_path, run):
    spec = tmp_path / "live.ask"
    spec.write_text(SPEC.format(model=tiny_model, reward="len(x.text)"))
    (tmp_path / "afile").write_text("not a folder")
    done = run(spec, tmp_path / "runs", "--log", f"tensorboard:{tmp_path / 'afile'}")
    assert done.returncode == 1 and "error: --log: " in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "step 1/2" not in done.stderr
    manifest = json.loads((only_run(tmp_path / "runs") / "manifest.json").read_text())
    assert manifest["status"] == "failed"


# ---------------------------------------------------------------------------------------
# options and the W&B writer


def test_log_values_are_checked_before_the_run(monkeypatch):
    with pytest.raises(UsageError, match=r"one of tensorboard\[:DIR\], wandb\[:PROJECT\]"):
        RunOptions.from_kwargs("x.ask", log="mlflow")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(UsageError, match=r"--log wandb needs the wandb package.*pip install 'askspec\[wandb\]'"):
        RunOptions.from_kwargs("x.ask", log=["wandb"])
    monkeypatch.undo()
    # a resumed run logs where the run did, unless told otherwise
    saved = RunOptions.from_kwargs("x.ask", log="tensorboard:/tmp/tb").recorded()
    assert RunOptions.from_kwargs(resume="r").resumed(saved).log == ("tensorboard:/tmp/tb",)


def _wandb_records(path: Path) -> list:
    """The records of a W&B run file: W&B's header, then LevelDB-log blocks holding its own
    protobuf Records (wandb 0.31 ships no Python reader for it)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, buf, out = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if n == 0 and kind == 0:  # block padding
            pos += left
            continue
        if pos + 7 + n > len(data):  # a record still being written
            break
        buf, pos = buf + data[pos + 7:pos + 7 + n], pos + 7 + n
        if kind in (1, 4):  # a full record, or the last piece of one
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
    return out


def test_the_wandb_writer_logs_offline_without_a_key(tmp_path, monkeypatch):
    from askspec.runtime.commands.loggers import WandbLogger

    for var in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = WandbLogger("askspec-test", "r1", tmp_path, {"experiment": "e", "seed": 3, "overrides": {"n": "2"}})
    logger.step(1, {"a": {"loss": 0.5, "reward_mean": 1.0, "tokens": 4}})
    logger.step(2, {"a": {"reward_mean": 1.0, "stage": "rl", "skipped": "zero_advantage", "skip_reason": "all 0"}})
    logger.close()
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-r1.wandb")
    deadline = time.monotonic() + 60
    # wandb-core, a process of its own, may still be writing the file when finish() returns
    records = _wandb_records(run_file)
    while not any(r.WhichOneof("record_type") == "exit" for r in records):
        assert time.monotonic() < deadline, f"no exit record in {run_file} after 60 s"
        time.sleep(0.2)
        records = _wandb_records(run_file)
    history = [{(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    assert [{k: v for k, v in h.items() if not k.startswith("_")} | {"_step": h["_step"]} for h in history] == [
        {"a/loss": 0.5, "a/reward_mean": 1.0, "a/tokens": 4, "a/skipped": 0, "_step": 1},
        {"a/rl/reward_mean": 1.0, "a/rl/skipped": 1, "a/rl/skip_reason": "zero_advantage: all 0", "_step": 2}]
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"][:1]
    assert (run.run_id, run.project, run.display_name) == ("r1", "askspec-test", "r1")
    config = {i.key: json.loads(i.value_json) for i in run.config.update if not i.key.startswith("_")}
    assert config == {"experiment": "e", "seed": 3, "overrides": {"n": "2"}}


def test_the_loggers_write_the_importance_weights_of_asynchronous_rollouts():
    """A max_staleness > 0 step's policy and sampling versions and importance-weight figures
    (train_steps.metrics) reach TensorBoard and W&B with the columns."""
    from askspec.runtime.commands.loggers import step_values

    values, reason = step_values({"loss": 0.25, "skipped": None, "policy_version": 2, "sampling_version": 1,
                                  "is_ratio_mean": 0.84, "is_truncated_share": 0.125, "stale_share": 1.0})
    assert reason is None
    assert values == {"loss": 0.25, "skipped": 0.0, "policy_version": 2.0, "sampling_version": 1.0,
                      "is_ratio_mean": 0.84, "is_truncated_share": 0.125, "stale_share": 1.0}


# ---------------------------------------------------------------------------------------
# issue #30 items 6 and 9: what trained and what was skipped, the declared metrics per
# step, the sampler/trainer mismatch, the checkpoints' size


def test_the_step_line_shows_the_mismatch_when_the_step_has_one():
    from askspec.runtime.commands.train_report import step_line

    row = {"reward_mean": 1.0, "reward_std": 0.0, "zero_adv_share": 0.0, "loss": 0.5, "kl": 0.0, "grad_norm": 1.0,
           "clip_frac": 0.0, "generated_tokens": 8, "seconds_play": 1.0, "seconds_update": 0.5}
    assert "clip 0%  tokens 8" in step_line("a", 1, 2, row)  # no column (an older trainer), or no value
    assert "clip 0%  tokens 8" in step_line("a", 1, 2, {**row, "mismatch_kl": None, "mismatch_abs": None})
    assert "clip 0%  mis 0.0e+00  tokens 8" in step_line("a", 1, 2, {**row, "mismatch_kl": 0.0})
    assert "clip 0%  mis 1.2e-03  tokens 8" in step_line("a", 1, 2, {**row, "mismatch_kl": 0.00123})
    past = {**row, "mismatch_kl": 0.02, "mismatch_warning": "step 1: the mismatch is KL 2.00e-02"}
    assert "clip 0%  mis 2.0e-02 (> max_mismatch)  tokens 8" in step_line("a", 1, 2, past)
    report = TrainReport(2)
    report.step(1, {"a": past})
    report.step(2, {"a": row})
    assert report.warnings() == ["a: 1 of 2 steps past max_mismatch; the first: step 1: the mismatch is KL 2.00e-02"]


def test_the_declared_metrics_end_the_steps_last_line():
    from askspec.runtime.commands.train_report import DECLARED_SHOWN, declared_words

    rows = [{"metric": "solve_rate", "by": {}, "value": 0.75, "n": 8},
            {"metric": "acc", "by": {"variant": "a", "k": 2}, "value": 1 / 3, "n": 3},
            {"metric": "acc", "by": {"variant": "b", "k": 2}, "value": None, "n": 0},
            {"metric": "count_ok", "by": {}, "value": 7, "n": 7},
            {"metric": "broken", "by": {}, "value": "error: division by zero", "n": 8}]
    assert declared_words(rows) == ("solve_rate 0.75  acc[variant=a,k=2] 0.333  acc[variant=b,k=2] -  count_ok 7  "
                                    "broken error")
    many = [{"metric": f"m{i}", "by": {}, "value": 1.0, "n": 1} for i in range(DECLARED_SHOWN + 3)]
    assert declared_words(many).endswith(f"m{DECLARED_SHOWN - 1} 1  +3 more")
    report = TrainReport(2)
    lines = report.step(1, {"p": {"reward_mean": 1.0}, "s": {"skipped": "gate"}}, rows[:1])
    assert not lines[0].endswith("0.75") and lines[1].endswith("skipped: gate  | solve_rate 0.75")
    assert not report.step(2, {"p": {"reward_mean": 1.0}}, [])[0].endswith("|")


def test_the_end_line_names_what_trained_and_what_was_skipped():
    from collections import Counter

    from askspec.runtime.commands.train_report import trained_line

    counts = {"proposer": Counter({None: 2}), "solver": Counter({"gate": 4})}
    assert trained_line(["proposer", "solver"], counts) == ("trained proposer for 2 steps; solver: 4 steps, all skipped "
                                                            "(gate)")
    counts = {"a": Counter({None: 1, "zero_advantage": 2, "nonfinite": 1}), "b": Counter({None: 1}),
              "c": Counter({"gate": 1, "no_tokens": 2})}
    assert trained_line(["a", "b", "c", "d"], counts) == (
        "trained a for 1 of 4 steps (3 skipped: nonfinite 1, zero_advantage 2), b for 1 step; "
        "c: 3 steps, all skipped (gate 1, no_tokens 2); d: no step")
    assert trained_line(["a"], {"a": Counter({"gate": 1})}) == "trained nothing; a: 1 step, all skipped (gate)"
    # this process's steps, when the store cannot be read
    report = TrainReport(3)
    report.step(1, {"a": {"skipped": "gate"}})
    report.step(2, {"a": {"loss": 0.1}})
    assert trained_line(["a"], report.counts()) == "trained a for 1 of 2 steps (1 skipped: gate 1)"


def test_a_save_every_plan_over_the_threshold_says_what_its_checkpoints_hold():
    from askspec.runtime.commands.train_report import CHECKPOINT_NOTE_BYTES, checkpoint_note, checkpoints_written

    assert checkpoints_written(3, 1) == 3 and checkpoints_written(3, 25) == 1 and checkpoints_written(50, 25) == 2
    assert checkpoints_written(51, 25) == 3
    # the 3-step run with save_every = 1: 0.5 GB of weights, 1 GB of moments
    note = checkpoint_note({"a": (500_000_000, 1_000_000_000)}, 3, 1, 2)
    assert note == ("checkpoints: about 2.0 GB on disk at the end, up to 3.5 GB while one is written: 3 written "
                    "(save_every = 1 over 3 steps), the newest 2 kept (keep_checkpoints = 2), each 0.5 GB of weights, "
                    "the newest also 1.0 GB of AdamW moments; a larger save_every writes fewer, a smaller "
                    "keep_checkpoints keeps fewer (train block)")
    # one checkpoint (save_every past the end): weights and moments once
    assert checkpoint_note({"a": (300_000_000, 600_000_000)}, 3, 25, 2) is None
    assert "about 1.2 GB" in checkpoint_note({"a": (400_000_000, 800_000_000)}, 3, 25, 2)
    assert checkpoint_note({"a": (100, 200)}, 1000, 1, 2) is None  # a small model: nothing to say
    assert checkpoint_note({"a": (100, 200)}, 3, 1, 2, threshold=400) is not None
    assert CHECKPOINT_NOTE_BYTES == 10**9


def test_the_checkpoint_estimate_is_what_a_checkpoint_holds(tiny_model, tmp_path):
    from askspec.runtime.commands.train_report import policy_bytes

    policy = policy_for(tiny_model)
    policy.update(trajectories([0.0, 1.0, 0.0, 1.0]))
    weights, moments = policy_bytes(policy)
    policy.save(tmp_path / "step-1", 1, {})
    on_disk = (tmp_path / "step-1" / "model.safetensors").stat().st_size
    optimizer = (tmp_path / "step-1" / "optimizer.safetensors").stat().st_size
    assert weights <= on_disk < weights + 100_000  # the safetensors header apart
    assert moments <= optimizer < moments + 100_000


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name):
        return lambda *a, **k: self.calls.append(name) or 1


def test_the_declared_metrics_are_evaluated_over_each_steps_sessions():
    from askspec.lang.compiler import compile_source
    from askspec.runtime.commands.train_report import StepSessions

    res = compile_source("t.ask", """
model m = python("unused:reply")
role a { model = m; memory = none; prompt = "q" }
game g for i in range(0, 4) sample 2 {
    x = ask a
    n = len(x.text)
    reward a = n
}
metric chars = mean(n)
metric chars_by = mean(n) by i
metric moved = mean(abs(advantage))
""", {})
    assert res.ok, [d.message for d in res.sink.items]
    inner = _Recorder()
    tap = StepSessions(inner, res.ir)

    def play(step: int, sid: str, n: int, group: str, status: str = "ok") -> None:
        tap.session_started(sid, game="g", group_id=group, params={"i": step}, index=0, step=step)
        tap.reward(sid, 1, role="a", turn_index=0, name="r", value=float(n), kind="turn")
        tap.session_finished(sid, 1, status=status, outcome=None, error=None, vars={"n": n, "x": object()})

    play(1, "s1", 2, "g1")
    play(1, "s2", 4, "g1")
    play(2, "s3", 10, "g2")  # step 2 plays while step 1 trains (asynchronous rollouts)
    play(1, "s4", 100, "g3", status="error")  # an errored session counts nowhere
    tap.group("g1", route="train", stats={"role": "a"}, members=["s1", "s2"])
    rows = tap.metrics(1)
    assert [(r["metric"], r["by"], r["value"], r["n"]) for r in rows] == [
        ("chars", {}, 3.0, 2), ("chars_by", {"i": 1}, 3.0, 2), ("moved", {}, pytest.approx(1.0, abs=1e-3), 2)]
    assert inner.calls.count("session_started") == 4 and "group" in inner.calls  # passed through
    assert [r["value"] for r in tap.metrics(2)][:2] == [10.0, 10.0]
    assert tap.metrics(1) == [] and tap.metrics(2) == []  # forgotten once shown


def test_the_loggers_write_the_declared_metrics_and_the_mismatch():
    from askspec.runtime.commands.loggers import declared_values, step_values

    values, _ = step_values({"loss": 0.25, "mismatch_abs": 0.001, "mismatch_kl": 0.0})
    assert values == {"loss": 0.25, "skipped": 0.0, "mismatch_abs": 0.001, "mismatch_kl": 0.0}
    assert declared_values([{"metric": "solve_rate", "by": {}, "value": 0.75, "n": 8},
                            {"metric": "acc", "by": {"variant": "a"}, "value": True, "n": 1},
                            {"metric": "acc", "by": {"variant": "b"}, "value": None, "n": 0},
                            {"metric": "bad", "by": {}, "value": "error: x", "n": 3}]) == {
        "metrics/solve_rate": 0.75, "metrics/acc/variant=a": 1.0}


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                    reason="the tensorboard package is not installed (pip install -e '.[dev]')")
def test_a_run_shows_its_declared_metrics_per_step_and_what_its_gate_skipped(tiny_model, tmp_path, run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from askspec.runtime.engine.metrics import run_metrics

    spec = tmp_path / "gated.ask"
    spec.write_text(SPEC.format(model=tiny_model, reward="len(x.text) + i")
                    .replace("    x = ask a\n", "    x = ask a\n    n = len(x.text) + i\n")
                    .replace("lr = 0.01 }", "lr = 0.01; update_when = mean(step) > 1 }")
                    + "metric chars = mean(n)\nmetric chars_by_step = mean(n) by step\n")
    board = tmp_path / "board"
    done = run(spec, tmp_path / "runs", "--log", f"tensorboard:{board}")
    assert done.returncode == 0, done.stderr
    run_dir = only_run(tmp_path / "runs")
    by_step = {r["by"]["step"]: r["value"] for r in run_metrics(str(run_dir))[0] if r["metric"] == "chars_by_step"}
    assert sorted(by_step) == [1, 2]
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("step ")]
    assert len(lines) == 2, done.stderr
    for step, line in enumerate(lines, 1):  # each step's own sessions, as `askspec metrics` has them by step
        value = format(by_step[step], ".3g")
        assert line.endswith(f"  | chars {value}  chars_by_step[step={step}] {value}"), line
    assert "skipped: gate  | " in lines[0] and "skipped" not in lines[1]
    assert "  replies: a 16 of 16 truncated" in done.stderr  # max_tokens = 4
    assert "warning: a: 16 of 16 replies were cut at max_tokens" in done.stderr
    assert (f"trained a for 1 of 2 steps (1 skipped: gate 1); schedule: 2 step(s); weights in {run_dir}/checkpoints"
            in done.stderr)
    acc = EventAccumulator(str(board / run_dir.name), size_guidance={"scalars": 0}).Reload()
    assert [(e.step, e.value) for e in acc.Scalars("metrics/chars")] == [
        (1, pytest.approx(by_step[1])), (2, pytest.approx(by_step[2]))]
    assert [e.step for e in acc.Scalars("metrics/chars_by_step/step=2")] == [2]
