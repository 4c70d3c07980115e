"""One trained role: its weights (served to the role's turns by a dedicated hf backend
that runs the very same module, or, with `max_staleness` > 0, a copy of it refreshed
between steps by `publish`), a frozen reference copy when the KL penalty is on,
AdamW with its learning-rate schedule, the update step and checkpoints.

Precision: float32 weights and optimizer state everywhere (bf16 weights would lose
updates of lr ≈ 1e-6); on a GPU the forward and backward run under bf16 autocast
(`dtype = auto | bfloat16`), on a CPU in float32 unless `dtype = bfloat16`.

Checkpoint folder (``checkpoints/<role>/step-<n>/``): the model as transformers saves it
(safetensors + config + tokenizer), loadable as ``hf("runs/<id>/checkpoints/<role>/step-<n>")``;
``optimizer.safetensors`` (AdamW moments, only in the newest checkpoint) and
``trainer_state.json`` (step, optimizer step counts, the metrics of that step).
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from askspec.ir.advantages import group_std
from askspec.runtime.backends.cpu_linear import use_onednn_linears
from askspec.runtime.train.advantages import advantages, zero_variance_groups
from askspec.runtime.train.batch import Trajectory
from askspec.runtime.train.config import TrainConfig, lr_factor
from askspec.runtime.train.losses import aggregate, importance_weights, kl_penalty, policy_token_loss, row_weights


class TrainedPolicy:
    def __init__(self, cfg: TrainConfig, weights: str, backend_options: dict[str, Any] | None = None,
                 init_from: str | os.PathLike[str] | None = None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        # (no progress-bar switch here: it is the process's; `askspec run` turns the bars
        # off, commands/noise.py, and a library caller keeps its own setting)
        from askspec.runtime.backends.hf import HFBackend, check_memory, resolve_weights

        options = dict(backend_options or {})
        self.cfg = cfg
        self.weights = weights
        folder = Path(init_from) if init_from else resolve_weights(weights, options.get("cache_dir"))
        # torch's CPU threads are the process's: `askspec run` sets them (commands/resolver.py)
        device = options.get("device", "auto")
        device = "cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device)
        self.device = torch.device(device)
        # float32 weights, their gradients and AdamW's two moments, and the frozen KL reference
        # (and the served copy of asynchronous rollouts)
        check_memory(folder, 16 + (4 if cfg.kl > 0 else 0) + (4 if cfg.max_staleness > 0 else 0), self.device,
                     f"trained role '{cfg.role}' ({weights})")
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        self.model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).to(self.device)
        use_onednn_linears(self.model)  # on a CPU: the forward and backward's products (cpu_linear)
        self.model.eval()  # no dropout: the update sees the distribution the sampler saw
        self.attn_implementation = getattr(self.model.config, "_attn_implementation", None)
        # the model config's end-of-sequence id, never the GGUF tokenizer's (it says <|im_start|>)
        eos = self.model.config.eos_token_id
        self.pad_id = int(eos[0] if isinstance(eos, (list, tuple)) else eos if eos is not None else 0)
        self.ref = None
        if cfg.kl > 0:
            self.ref = copy.deepcopy(self.model).eval()
            for p in self.ref.parameters():
                p.requires_grad_(False)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = self._adamw(self.params)
        self.version = 0  # optimizer steps taken
        self.lr_step0 = 0  # the version the learning-rate schedule starts at (after an sft stage's steps)
        self.autocast = (cfg.dtype == "bfloat16") or (cfg.dtype == "auto" and self.device.type == "cuda")
        self.options = {k: v for k, v in options.items() if k != "device"}
        self.backend = HFBackend(weights, **self.options)
        self.backend.adopt(self.model, self.tokenizer)
        # asynchronous rollouts (max_staleness > 0): the backend samples a copy of the weights that
        # `publish` refreshes, so the next step plays while this one's update runs on the weights;
        # copied once adopted, so that both compute with the backend's attention kernel
        self.served = self.model
        self._served_version: int | None = None  # None: the copy holds the weights as loaded (self.version)
        if cfg.max_staleness > 0:
            self.served = copy.deepcopy(self.model).eval()
            for p in self.served.parameters():
                p.requires_grad_(False)
            self.backend.adopt(self.served, self.tokenizer)

    def _adamw(self, params: list[torch.nn.Parameter]) -> torch.optim.AdamW:
        """AdamW over `params`. On a CPU its fused kernel: the same update (to float
        rounding) in one pass over each tensor, faster than the per-tensor loop torch defaults
        to there (SmolLM2-135M's weights, one thread: 0.18–0.19 s a step against 0.23–1.1 s);
        on a GPU torch's default (foreach), into which a checkpoint's CPU step counts load."""
        cfg = self.cfg
        return torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay,
                                 fused=True if self.device.type == "cpu" else None)

    @property
    def mismatch_bound(self) -> float:
        """`max_mismatch`, or the bound of the training precision (float noise of float32
        kernels is ~1e-13; bf16 kernels differ by far more)."""
        from askspec.ir.vocab import MAX_MISMATCH

        if self.cfg.max_mismatch is not None:
            return self.cfg.max_mismatch
        return MAX_MISMATCH["bfloat16" if self.autocast else "float32"]

    @property
    def sampling_version(self) -> int:
        """The policy version of the weights the backend samples: the updates they had seen."""
        return self.version if self._served_version is None else self._served_version

    def publish(self) -> None:
        """Copy the trained weights into the served copy (asynchronous rollouts; call it
        while no session is playing). The backend notices the new weights (its prefix
        cache is keyed on them)."""
        if self.served is not self.model:
            with torch.no_grad():
                self.served.load_state_dict(self.model.state_dict())
            self._weights_written(self.served)
        self._served_version = self.version

    def _weights_written(self, module: Any) -> None:
        """Every write of `module`'s weights ends here: when the backend samples that module,
        it is told, so nothing it cached under the old weights (prompt keys/values) is used
        again. The one rule that keeps the sampler on the weights being trained: torch's
        tensor version counters cannot be trusted for it (the fused AdamW writes in place
        without bumping them)."""
        if module is self.served:
            self.backend.weights_changed()

    def fork(self) -> TrainedPolicy:
        """A copy of this policy to train on its own (a nested schedule's inner copy): its
        own weights (a copy of the current ones), a fresh AdamW and learning-rate schedule,
        its own hf backend serving it; the frozen KL reference is shared, not copied."""
        from askspec.runtime.backends.hf import HFBackend

        new = copy.copy(self)
        new.model = copy.deepcopy(self.model)
        new.params = [p for p in new.model.parameters() if p.requires_grad]
        new.optimizer = new._adamw(new.params)
        new.version = 0
        new.served, new._served_version = new.model, None  # a copy trains on-policy (nested: no staleness)
        new.backend = HFBackend(self.weights, **self.options)
        new.backend.adopt(new.model, new.tokenizer)
        return new

    async def release(self) -> None:
        """Stop serving (a finished copy): the backend's worker thread lets go of the weights."""
        await self.backend.aclose()

    def state(self) -> dict[str, torch.Tensor]:
        """The weights, on the CPU (what a promotion keeps of a copy)."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def take_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Replace the weights in place (the backend keeps serving this module): a promoted
        copy's weights become this policy's."""
        with torch.no_grad():
            self.model.load_state_dict(state)
        self._weights_written(self.model)

    def reset(self) -> None:
        """Back to the spec's weights with a fresh AdamW (a retrain stage's fresh copy of
        the role); the backend keeps serving this module."""
        from transformers import AutoModelForCausalLM

        from askspec.runtime.backends.hf import resolve_weights

        folder = resolve_weights(self.weights, self.options.get("cache_dir"))
        fresh = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
        self.take_weights(fresh.state_dict())
        del fresh
        self.optimizer.state.clear()
        if self.served is not self.model:  # asynchronous rollouts: the fresh copy plays its own weights
            self.publish()

    # -- forward ---------------------------------------------------------------------------

    def token_logprobs(self, model: Any, turns: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """log π(completion token | prompt, earlier completion tokens) [rows, T] at each turn's
        sampling temperature, and the completion mask [rows, T].

        Two passes: each distinct prompt (but its last token) once, then every row's last
        prompt token and completion on top of its prompt's keys/values. A group's rows share
        their prompt (one question sampled `group` times), so its tokens are run through the
        model once instead of once per row; gradients reach the weights through the shared
        keys/values, summed over the rows that read them, as separate passes would give.
        Only the second pass's positions predict completion tokens, so the output head (the
        vocabulary-sized matmul) runs on those alone."""
        rows = len(turns)
        distinct: dict[tuple[int, ...], int] = {}
        which = [distinct.setdefault(tuple(t.prompt_ids[:-1]), len(distinct)) for t in turns]
        width = max(len(p) for p in distinct)  # the longest prompt but its last token
        steps = max(len(t.completion_ids) for t in turns)
        # prompts right-padded (a padded position attends to its row's real tokens, so no
        # attention row is empty); the second pass masks the padding out
        head = torch.full((len(distinct), width), self.pad_id, dtype=torch.long)
        head_attn = torch.zeros((len(distinct), width), dtype=torch.long)
        for p, i in distinct.items():
            head[i, : len(p)] = torch.tensor(p, dtype=torch.long)
            head_attn[i, : len(p)] = 1
        ids = torch.full((rows, steps), self.pad_id, dtype=torch.long)
        attn = torch.zeros((rows, steps), dtype=torch.long)
        pos = torch.zeros((rows, steps), dtype=torch.long)
        tok = torch.full((rows, steps), self.pad_id, dtype=torch.long)
        mask = torch.zeros((rows, steps), dtype=torch.float32)
        for i, t in enumerate(turns):
            c = len(t.completion_ids)
            # the last prompt token and every completion token but the last: position p's
            # logits predict token p + 1
            ids[i, :c] = torch.tensor([t.prompt_ids[-1], *t.completion_ids[:-1]], dtype=torch.long)
            attn[i, :c] = 1
            pos[i] = torch.arange(len(t.prompt_ids) - 1, len(t.prompt_ids) - 1 + steps)
            tok[i, :c] = torch.tensor(t.completion_ids, dtype=torch.long)
            mask[i, :c] = 1.0
        index = torch.tensor(which, device=self.device)
        head, head_attn, ids, attn, pos, tok, mask = (x.to(self.device)
                                                      for x in (head, head_attn, ids, attn, pos, tok, mask))
        decoder = model.get_decoder()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            cache = None
            if width:
                # a one-token prompt leaves an empty row: it attends its padding (keys and values
                # the second pass masks out) rather than nothing, whose softmax is NaN
                seen = head_attn.clone()
                seen[:, 0] = 1
                cache = decoder(input_ids=head, attention_mask=seen, use_cache=True).past_key_values
                for layer in cache.layers:  # each row reads its prompt's keys/values
                    layer.keys, layer.values = layer.keys.index_select(0, index), layer.values.index_select(0, index)
            hidden = decoder(input_ids=ids, attention_mask=torch.cat([head_attn.index_select(0, index), attn], 1),
                             position_ids=pos, past_key_values=cache, use_cache=True).last_hidden_state
            logits = model.get_output_embeddings()(hidden).float()
        temps = torch.tensor([t.temperature if t.temperature > 1e-5 else 1.0 for t in turns], device=self.device)
        logp = (logits / temps[:, None, None]).log_softmax(-1).gather(-1, tok[..., None]).squeeze(-1)
        return logp * mask, mask

    # -- the update ------------------------------------------------------------------------

    def update(self, trajectories: list[Trajectory]) -> dict[str, Any]:
        """One optimizer step per epoch over `trajectories`; returns the step's metrics."""
        cfg = self.cfg
        t0 = time.perf_counter()
        for g in self.optimizer.param_groups:
            g["lr"] = cfg.lr * lr_factor(cfg, max(0, self.version - self.lr_step0))
        lr = self.optimizer.param_groups[0]["lr"]
        if cfg.loss == "sft" and cfg.min_reward is not None:
            trajectories = [t for t in trajectories if t.reward is not None and t.reward >= cfg.min_reward]
        n = len(trajectories)
        rewards, groups = _rewards_and_groups(trajectories)
        counts = torch.tensor([t.tokens for t in trajectories], dtype=torch.float64)
        metrics: dict[str, Any] = {**batch_reward_stats(trajectories, cfg.std), "lr": lr, "tokens": int(counts.sum())}
        if cfg.loss == "sft":
            adv = torch.zeros(n)
        else:
            assert cfg.estimator is not None  # None only for sft, whose loss is "sft"
            adv = advantages(cfg.estimator, rewards, groups, counts, cfg.std) if n else torch.zeros(0)
        if n and not bool(torch.isfinite(adv).all()):  # rewards of ~1e308 overflow the group's mean or std
            return self._not_applied(metrics, t0, "advantage", "an advantage is not finite (rewards too large?)")
        zero = adv.abs() < 1e-8
        metrics["zero_adv_share"] = float(zero.double().mean()) if n else None
        metrics["abs_adv_mean"] = float(adv.abs().double().mean()) if n else None  # Reasoning Arena Fig. 5 (right)
        if n == 0 or metrics["tokens"] == 0:
            return self._skipped(metrics, t0, "no_tokens", "no trajectory with a trained token")
        # every advantage 0 (|A| < 1e-8, as zero_adv_share counts): the policy loss and its
        # gradient vanish, so only a KL term (or sft's −log π, which has no advantage) could
        # move the weights; no forward pass then
        if cfg.loss != "sft" and self.ref is None and bool(zero.all()):
            single = int((torch.bincount(groups) == 1).sum())  # a group of one has advantage 0 (but reinforce)
            why = f"{metrics['zero_var_groups']} of {metrics['groups']} group(s) had equal rewards"
            why += f", {single} had one trajectory" if single else ""
            return self._skipped(metrics, t0, "zero_advantage", f"every advantage is 0 ({why}): no gradient")
        # one row per turn; whole trajectories per micro-batch (GSPO's ratio spans all their rows)
        rows = [(ti, turn) for ti, t in enumerate(trajectories) for turn in t.turns if turn.completion_ids]
        row_traj = torch.tensor([ti for ti, _ in rows])
        row_tokens = torch.tensor([len(turn.completion_ids) for _, turn in rows], dtype=torch.float64)
        max_tokens = max(len(turn.completion_ids) for _, turn in rows)
        weights = row_weights(cfg.aggregation, row_tokens, row_traj, max_tokens)
        chunks = [list(range(i, min(i + cfg.micro_batch, n))) for i in range(0, n, cfg.micro_batch)]
        if cfg.max_staleness:
            self._check_staleness([turn for _, turn in rows])
        train_old: dict[int, torch.Tensor] = {}  # chunk -> log π_old of its stale rows (the first epoch's)
        ratio_sum, truncated, stale_tokens = 0.0, 0.0, 0.0
        mismatch = _Mismatch()  # sampler vs trainer on the on-policy rows, before this update
        for epoch in range(cfg.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            total_loss, clipped, kl_sum, token_sum = 0.0, 0.0, 0.0, 0.0
            for ci, chunk in enumerate(chunks):
                members = set(chunk)
                idx = [i for i, (ti, _) in enumerate(rows) if ti in members]
                turns = [rows[i][1] for i in idx]
                traj = torch.unique(row_traj[idx], return_inverse=True)[1].to(self.device)
                logp, mask = self.token_logprobs(self.model, turns)
                old = torch.zeros_like(logp)
                for j, turn in enumerate(turns):
                    old[j, : len(turn.logprobs)] = torch.tensor(turn.logprobs, device=self.device)
                row_adv = adv[row_traj[idx]].to(self.device)
                # rows sampled by older weights (max_staleness > 0): the ratio is taken against the
                # weights before this update, and the truncated importance weight corrects for the
                # sampler; on-policy rows are left exactly as without staleness (w = 1)
                stale = [j for j, turn in enumerate(turns)
                         if cfg.max_staleness and turn.policy_version is not None and turn.policy_version != self.version]
                if epoch == 0:
                    mismatch.add(logp.detach(), old, mask, [j not in stale for j in range(len(turns))],
                                 [len(turn.logprobs) == len(turn.completion_ids) for turn in turns])
                w = None
                if stale:
                    sel = torch.tensor(stale, device=self.device)
                    if epoch == 0:
                        train_old[ci] = logp.detach()[sel]
                    w_rows, ratio = importance_weights(train_old[ci], old[sel], cfg.is_bound)
                    old = old.index_copy(0, sel, train_old[ci])
                    w = torch.ones_like(logp).index_copy(0, sel, w_rows)
                    if epoch == 0:
                        m_sel = mask[sel]
                        ratio_sum += float((ratio * m_sel).sum()) - float(m_sel.sum())  # on-policy tokens add 1 below
                        truncated += float(((ratio > cfg.is_bound).float() * m_sel).sum())
                        stale_tokens += float(m_sel.sum())
                token_loss, clip = policy_token_loss(cfg.loss, logp, old, row_adv, mask, traj, clip_low=cfg.clip_low,
                                                     clip_high=cfg.clip_high, dual_clip=cfg.dual_clip)
                if w is not None:
                    token_loss = token_loss * w
                if self.ref is not None:
                    with torch.no_grad():
                        ref_logp, _ = self.token_logprobs(self.ref, turns)
                    kl = kl_penalty(logp, ref_logp, cfg.kl_estimator) * mask
                    token_loss = token_loss + cfg.kl * kl
                    kl_sum += float(kl.detach().sum())
                loss = aggregate(token_loss, mask, weights[idx].to(self.device))
                loss.backward()
                total_loss += float(loss.detach())
                clipped += float((clip.float() * mask).sum())
                token_sum += float(mask.sum())
            norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
            bad = "loss" if not math.isfinite(total_loss) else "gradient" if not math.isfinite(float(norm)) else None
            if bad is not None:  # never step on it: one NaN gradient makes every weight NaN
                self.optimizer.zero_grad(set_to_none=True)
                why = f"the {bad} is not finite ({total_loss if bad == 'loss' else float(norm)!r})"
                if epoch:
                    why += f" in epoch {epoch + 1}; the {epoch} before it were applied"
                metrics.update(clip_frac=None, kl=None, epochs=epoch)
                return self._not_applied(metrics, t0, bad, why)
            self.optimizer.step()
            self._weights_written(self.model)
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        metrics.update(mismatch.figures())
        metrics.update(loss=total_loss, clip_frac=clipped / max(token_sum, 1.0),
                       kl=(kl_sum / max(token_sum, 1.0)) if self.ref is not None else 0.0,
                       grad_norm=float(norm), epochs=cfg.epochs, seconds_update=time.perf_counter() - t0)
        if cfg.max_staleness:
            trained = max(float(metrics["tokens"]), 1.0)
            metrics.update(is_ratio_mean=(trained + ratio_sum) / trained, is_truncated_share=truncated / trained,
                           stale_share=stale_tokens / trained)
        return metrics

    def _check_staleness(self, turns: list[Any]) -> None:
        """Never train on a rollout sampled more than `max_staleness` updates ago (nor by
        weights newer than these: a bug in whoever recorded the version)."""
        k = self.cfg.max_staleness
        for turn in turns:
            v = turn.policy_version
            if v is not None and not self.version - k <= v <= self.version:
                raise ValueError(f"role '{self.cfg.role}': a rollout of session {turn.session_id} (turn "
                                 f"{turn.turn_index}) was sampled at policy version {v}, outside "
                                 f"[{self.version - k}, {self.version}] (version {self.version}, max_staleness = {k})")

    def _not_applied(self, metrics: dict[str, Any], t0: float, what: str, why: str) -> dict[str, Any]:
        """The metrics of an update skipped because `what` (advantage, loss, gradient) was
        NaN or infinite (see _skipped)."""
        metrics["nonfinite"] = what
        return self._skipped(metrics, t0, "nonfinite", f"not applied: {why}")

    def _skipped(self, metrics: dict[str, Any], t0: float, code: str, why: str) -> dict[str, Any]:
        """The metrics of an update that did not run (`skipped`: the store's code, see
        layout.TRAIN_SKIP_REASONS; `skip_reason`: in words): no optimizer step, so the
        weights and AdamW moments are unchanged (no momentum, no weight decay); the
        learning-rate schedule still counts the step (docs/training.md, "Skipped steps")."""
        self.version += 1
        for key in ("zero_adv_share", "abs_adv_mean", "clip_frac", "kl"):
            metrics.setdefault(key, None)
        metrics.update(loss=None, grad_norm=None, skipped=code, skip_reason=why,
                       seconds_update=time.perf_counter() - t0)
        return metrics

    def finite(self) -> bool:
        """Whether every weight is a finite number (checked before a checkpoint is written)."""
        with torch.no_grad():
            return all(bool(torch.isfinite(p).all()) for p in self.model.parameters())

    # -- checkpoints -----------------------------------------------------------------------

    def save(self, folder: Path, step: int, metrics: dict[str, Any], with_optimizer: bool = True) -> None:
        """Write the checkpoint under a temporary name, then rename it into place."""
        from safetensors.torch import save_file

        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
        if tmp.exists():
            shutil.rmtree(tmp)
        cfg_attn = self.model.config._attn_implementation
        try:
            # the backend's CPU attention kernel is registered per process; save the stock name
            if self.attn_implementation is not None:
                self.model.config._attn_implementation = self.attn_implementation
            self.model.save_pretrained(str(tmp), safe_serialization=True)
        finally:
            self.model.config._attn_implementation = cfg_attn
        self.tokenizer.save_pretrained(str(tmp))
        optimizer_steps: dict[str, float] = {}
        state = {"step": step, "version": self.version, "role": self.cfg.role, "metrics": metrics,
                 "optimizer_steps": optimizer_steps}
        if with_optimizer:
            tensors = {}
            for i, p in enumerate(self.params):
                st = self.optimizer.state.get(p)
                if not st:
                    continue
                tensors[f"{i}.exp_avg"] = st["exp_avg"].detach().cpu().contiguous()
                tensors[f"{i}.exp_avg_sq"] = st["exp_avg_sq"].detach().cpu().contiguous()
                optimizer_steps[str(i)] = float(st["step"])
            save_file(tensors, str(tmp / "optimizer.safetensors"))
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2, default=str), encoding="utf-8")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)

    def load_optimizer(self, folder: Path, moments: bool = True) -> None:
        """Restore AdamW moments and the step count from a checkpoint (weights are loaded
        by the constructor's `init_from`); `moments=False`: the step count only, AdamW
        starting afresh (an earlier checkpoint resumed after a damaged newest one)."""
        from safetensors.torch import load_file

        state = json.loads((folder / "trainer_state.json").read_text(encoding="utf-8"))
        self.version = int(state["version"])
        if not moments:
            return
        path = folder / "optimizer.safetensors"
        if not path.exists():
            raise FileNotFoundError(f"{folder} has no optimizer state (only the newest checkpoint keeps it)")
        tensors = load_file(str(path), device=str(self.device))
        for i, p in enumerate(self.params):
            if f"{i}.exp_avg" not in tensors:
                continue
            self.optimizer.state[p] = {"step": torch.tensor(state["optimizer_steps"][str(i)]),
                                       "exp_avg": tensors[f"{i}.exp_avg"], "exp_avg_sq": tensors[f"{i}.exp_avg_sq"]}


class _Mismatch:
    """Sampler-trainer mismatch over the trained tokens of on-policy rows: the mean
    |log π_train − log π_sampler| and the KL between them (k3 = r − 1 − log r with
    r = π_train/π_sampler, ≥ 0, averaged over the sampler's tokens), as prime-rl's
    `mismatch_kl` and verl's rollout-correction figures. Both recompute the same
    distribution (hf_ops.token_logprobs: log-softmax at the sampling temperature, no
    sampling-time filters), so on-policy they are float noise; more means the sampler played
    other weights than the trainer's (a stale cache, a copy not refreshed)."""

    def __init__(self) -> None:
        self.abs_sum, self.kl_sum, self.tokens = 0.0, 0.0, 0.0

    def add(self, logp: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor, on_policy: list[bool],
            complete: list[bool]) -> None:
        """One micro-batch: rows that are on-policy and whose every completion token has the
        sampler's log-probability."""
        rows = [j for j, (on, full) in enumerate(zip(on_policy, complete)) if on and full]
        if not rows:
            return
        sel = torch.tensor(rows, device=logp.device)
        m = mask.index_select(0, sel).double()
        d = (logp.index_select(0, sel).double() - sampler.index_select(0, sel).double()) * m
        self.abs_sum += float(d.abs().sum())
        self.kl_sum += float(((d.exp() - 1.0 - d) * m).sum())
        self.tokens += float(m.sum())

    def figures(self) -> dict[str, float | None]:
        if not self.tokens:
            return {"mismatch_abs": None, "mismatch_kl": None}
        return {"mismatch_abs": self.abs_sum / self.tokens, "mismatch_kl": self.kl_sum / self.tokens}


def _rewards_and_groups(trajectories: list[Trajectory]) -> tuple[torch.Tensor, torch.Tensor]:
    """The trajectories' rewards (None as 0) and each one's group number."""
    rewards = torch.tensor([t.reward if t.reward is not None else 0.0 for t in trajectories], dtype=torch.float64)
    group_ids = {k: i for i, k in enumerate(dict.fromkeys(t.group_key for t in trajectories))}
    return rewards, torch.tensor([group_ids[t.group_key] for t in trajectories], dtype=torch.long)


def batch_reward_stats(trajectories: list[Trajectory], std: str) -> dict[str, Any]:
    """What a step's batch was rewarded, whether or not the update then runs (a step the
    spec's update gate closes still played and was rewarded): `reward_std` is the std the
    train block's estimator divides by (`std`: sample | population, askspec.ir.advantages),
    so a step of one group shows the std the TUI's Groups tab shows for that group."""
    n = len(trajectories)
    rewards, groups = _rewards_and_groups(trajectories)
    return {"trajectories": n, "groups": int(groups.unique().numel()) if n else 0,
            "reward_mean": float(rewards.mean()) if n else None,
            "reward_std": group_std(rewards.tolist(), std) if n else None,
            "zero_var_groups": zero_variance_groups(rewards, groups) if n else 0}
