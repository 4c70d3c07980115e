"""The `sft` and `evaluate` stages of a spec as an OpenRLHF job runs them (docs/cluster.md,
"Stages"): an sft stage is `openrlhf.cli.train_sft` on its records, written in the chat
format OpenRLHF's SFTDataset reads; an evaluate stage serves the evaluated role's weights
with vLLM (serve_frozen.sh) and plays the stage's games against them with
`askspec run --eval-only --stage`. A `retrain` stage is a PPO phase of its own (generate.py
builds it like the schedule's), or, when it samples its items from a role or stops at a
reward plateau, or trains on the nested schedule's promoted datasets (read from the
inner-loop service's state file: `--promotions`), a run of askspec's own trainer
(`askspec run --stage`, retrain.sh). Files
come back in memory, by path; generate.py writes."""

from __future__ import annotations

import json
import os
from typing import Any

import jinja2

from askspec.ir import model as ir

from askspec.runtime.targets.openrlhf import mapping
from askspec.runtime.targets.openrlhf.check import StageJob
from askspec.runtime.train.stages import sft_batch

EVAL_PORT = 8001  # the evaluated weights' server (the stage's own serve_frozen.sh)


class StageError(Exception):
    """A stage's data cannot become the job's (a record without its fields)."""


def sft_records(job: StageJob, datasets: dict[str, list]) -> list[dict]:
    """The stage's steps x batch records in the order askspec's trainer takes them
    (runtime/train/stages.py, sft_batch), as OpenRLHF chat messages: `prompt` is the
    system message (when the stage names a `system` field) and the user message,
    `completion` the assistant message."""
    o = job.stage.options
    try:
        batches = [sft_batch(datasets.get(o["data"]) or [], o, n) for n in range(1, int(o["steps"]) + 1)]
    except ValueError as e:
        raise StageError(f"stage '{job.stage.name}': {e}") from None
    out = []
    for index, rec in (pair for batch in batches for pair in batch):
        fields = [o["prompt"], o["completion"]] + ([o["system"]] if o.get("system") else [])
        if not isinstance(rec, dict) or not all(isinstance(rec.get(f), str) for f in fields):
            raise StageError(f"stage '{job.stage.name}': sft data set '{o['data']}', record {index + 1}: needs string "
                             f"fields {', '.join(repr(f) for f in fields)}")
        prompt = ([{"role": "system", "content": rec[o["system"]]}] if o.get("system") else []) + \
            [{"role": "user", "content": rec[o["prompt"]]}]
        out.append({"prompt": prompt, "completion": [{"role": "assistant", "content": rec[o["completion"]]}]})
    return out


def sft_files(env: jinja2.Environment, common: dict, job: StageJob, training: ir.Training, records: list[dict],
              pretrain: str, max_len: int, seed: int) -> dict[str, str]:
    """sft.jsonl and sft.sh of an sft stage."""
    o = job.stage.options
    flags = mapping.sft_flags(o, training, max_len, seed)
    ctx = {**common, "stage": job.stage.name, "role": job.role, "pretrain": pretrain, "flags": flags,
           "records": len(records), "steps": int(o["steps"]), "batch": int(o["batch"]), "data": o["data"]}
    return {os.path.join(job.dir, "sft.jsonl"): "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
            os.path.join(job.dir, "sft.sh"): env.get_template("sft.sh.j2").render(**ctx)}


def evaluate_files(env: jinja2.Environment, common: dict, job: StageJob, server: Any, initial: str,
                   spec_name: str, profile: str | None, overrides: dict[str, str],
                   frozen: list[tuple[str, Any]] | None = None,
                   passthrough: list[tuple[str, str, str]] | None = None) -> dict[str, str]:
    """evaluate.sh and the stage's serve_frozen.sh: the evaluated weights' server and one
    per distinct weights of the frozen models its games ask (`frozen`: (model, server));
    `askspec run --endpoint` sends each of those models to its server, and each of the
    spec's openai models to its own (`passthrough`: (model, served name, URL))."""
    o = job.stage.options
    frozen = frozen or []
    servers = [server] + [s for i, (_, s) in enumerate(frozen) if all(s is not t for _, t in frozen[:i])]
    ctx = {**common, "stage": job.stage.name, "role": job.role, "games": o["games"], "samples": int(o["samples"]),
           "weights": list(o["weights"]), "initial": initial, "spec": spec_name, "profile": profile,
           "sets": [f"{k}={v}" for k, v in overrides.items()], "port": server.port, "served": server.served,
           "servers": servers,
           # (model, port or None, served name, URL): a frozen model on a stage server, or an openai model's own
           "routes": [(name, s.port, s.served, None) for name, s in frozen] +
                     [(name, None, served, url) for name, served, url in passthrough or []]}
    return {os.path.join(job.dir, "evaluate.sh"): env.get_template("evaluate.sh.j2").render(**ctx),
            os.path.join(job.dir, "serve_frozen.sh"): env.get_template("serve_frozen.sh.j2").render(**ctx)}


def retrain_files(env: jinja2.Environment, common: dict, job: StageJob, others: list[str], pretrain: dict[str, str],
                  spec_name: str, profile: str | None, overrides: dict[str, str]) -> dict[str, str]:
    """retrain.sh of a retrain stage askspec's own trainer runs: `askspec run --stage` with
    the other trained roles (`others`) on their latest weights, the kept weights copied to
    the driver's SAVE_PATH."""
    o = job.stage.options
    why = [f"its items include {o['sample']}'s replies, sampled when the stage starts"] if o.get("sample") else []
    if o.get("promoted"):
        why.append("its items include the nested schedule's promoted datasets (" + (
            "the inner-loop service's $ASKSPEC_INNER_STATE/state.json" if job.promotions else
            "none: the schedule's inner loop does not run, so nothing is promoted") + ")")
    if o.get("keep", {}).get("select") == "posthoc":
        why.append("it selects its checkpoint after its last step, where its reward levels off (keep = plateau(..., "
                   "select = posthoc); the job's evaluate stage plays that checkpoint alone, not the averaging window)")
    elif o.get("keep"):
        why.append(f"it stops where its reward levels off (keep = {o['keep']['rule']})")
    ctx = {**common, "stage": job.stage.name, "role": job.role, "why": "; ".join(why), "spec": spec_name,
           "profile": profile, "sets": [f"{k}={v}" for k, v in overrides.items()], "others": others,
           "pretrain": pretrain, "promotions": job.promotions}
    return {os.path.join(job.dir, "retrain.sh"): env.get_template("retrain.sh.j2").render(**ctx)}
