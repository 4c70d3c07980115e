"""The stage list: `stage NAME KIND { settings }` declarations, run in declaration order
(docs/language.md, "stage"): a supervised cold start (`sft`), the RL schedule (`train`),
evaluation games on held-out data (`evaluate`), and a fresh copy of a role trained on
items a game plays over (`retrain`: SOAR's promoted questions, PQ, or a data set sampled
from a role, its teacher evaluations). `keep` chooses the checkpoint a stage hands on
(`best(accuracy)`, `plateau(reward, ...)`). Checks each stage's settings and the list as a
whole (E408), and fills `ir.Experiment.stages`."""

from __future__ import annotations

from typing import Any

from ..ir import model as ir
from . import ast as A
from .checker_base import CheckContext
from .exprs import irspan, suggest
from ..ir.plansize import MAX_STEP_SESSIONS, MAX_TRAINING_STEPS
from ..ir.vocab import KEEP_LAST, KEEP_OPTIONS, KEEP_RULES, PLATEAU_SELECTS, STAGE_KINDS
from ..ir.walk import all_steps
from .training import HYPERPARAMETERS

STAGE_SETTINGS: dict[str, tuple[str, ...]] = {
    "sft": ("role", "data", "steps", "batch", "lr", "prompt", "completion", "system"),
    "train": ("keep",),
    "evaluate": ("games", "samples", "k", "score", "weights"),
    "retrain": ("role", "game", "promoted", "data", "sample", "steps", "curriculum", "warmup", "lr", "keep"),
}
WEIGHTS = ("trained", "initial")


class StageChecks:
    """The stage list's pass (after the train blocks and the schedule)."""

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx

    def _bounded(self, value: int | None, key: str, span: Any, where: str) -> None:
        """A stage's steps (warm-up, curriculum) and records per step are bounded as a train
        block's are (askspec.ir.plansize): the schedule lists every step, and a step's
        records are held whole."""
        limit = MAX_STEP_SESSIONS if key == "batch" else MAX_TRAINING_STEPS
        if value is not None and value > limit:
            self.ctx.err("E405", f"{where} '{key}' is {value:,}, more than the limit of {limit:,}", span)

    def stages(self, decls: list[A.StageDecl]) -> None:
        """Check the stage list (after games, training and the schedule are known)."""
        if not decls:
            return
        kinds: list[str] = []
        for d in decls:
            if not self.ctx.declare("stage", d.name, d.name_span):
                continue
            if d.name == "online" or any(r.name == d.name for r in self.ctx.exp.roles):
                # the trainer names its phases after roles (and `online`): a stage must not share one
                self.ctx.err("E408", f"stage '{d.name}' has the name of a {'role' if d.name != 'online' else 'schedule'}",
                             d.name_span, "give the stage its own name, e.g. cold_start, rl, heldout")
                continue
            if d.kind == "retrain" and "train" not in kinds and any(
                    a.name == "promoted" and isinstance(a.value, A.Bool) and a.value.value for a in d.attrs):
                self.ctx.err("E408", f"stage '{d.name}' retrains on the promoted datasets before the train stage made any",
                             d.name_span, "put the retrain stage after the train stage")
                continue
            if d.kind not in STAGE_KINDS:
                self.ctx.err("E408", f"unknown stage kind '{d.kind}'", d.kind_span,
                             suggest(d.kind, STAGE_KINDS) or f"stages are {', '.join(STAGE_KINDS)}")
                continue
            allowed = STAGE_SETTINGS[d.kind]
            seen: dict[str, A.Attribute] = {}
            for a in d.attrs:
                if a.name not in allowed:
                    self.ctx.err("E105", f"unknown setting '{a.name}' of {'an' if d.kind[0] in 'aeiou' else 'a'} {d.kind} stage", a.name_span,
                                 suggest(a.name, allowed) or (f"settings: {', '.join(allowed)}" if allowed
                                                              else "a train stage takes no settings: it runs the train blocks and the schedule"))
                elif a.name in seen:
                    self.ctx.err("E104", f"stage setting '{a.name}' given twice", a.name_span)
                else:
                    seen[a.name] = a
            opts = self.STAGES[d.kind](self, d, seen)
            if opts is not None:
                kind: Any = d.kind
                self.ctx.exp.stages.append(ir.Stage(span=irspan(d.span), name=d.name, kind=kind, options=opts))
            kinds.append(d.kind)
        if self.ctx.exp.training and "train" not in kinds:
            self.ctx.err("E408", "the spec has train blocks but its stage list has no train stage", decls[0].span,
                         "add `stage rl train` where the RL schedule runs")
        trains = [d for d in decls if d.kind == "train"]
        if len(trains) > 1:
            self.ctx.err("E408", "only one train stage (it runs the schedule)", trains[1].span)
        if not self.ctx.exp.training:
            self.ctx.err("E408", "stages need train blocks (trained and initial weights are the same without them)",
                         decls[0].span, "without training, play the games directly: remove the stages")

    def stage_sft(self, d: A.StageDecl, a: dict[str, A.Attribute]) -> dict[str, Any] | None:
        for need in ("role", "data"):
            if need not in a:
                self.ctx.err("E106", f"an sft stage needs '{need}'", d.name_span)
        if "role" not in a or "data" not in a:
            return None
        role = self.ctx.block_checks.role_ref(a["role"].value)
        if role is not None and role not in {t.role for t in self.ctx.exp.training}:
            self.ctx.err("E408", f"the sft stage trains role '{role}', which has no train block", a["role"].value.span,
                         f"add `train {role} with ...` (its weights, optimizer and checkpoints)")
            return None
        data = self.data_ref(a["data"].value, "data names a declared data set of prompt/completion records")
        if data is None:
            return None
        opts: dict[str, Any] = {"role": role, "data": data, "steps": 1, "batch": 8, "prompt": "prompt",
                                "completion": "completion"}
        for key in ("steps", "batch"):
            if key in a:
                opts[key] = self.ctx.const_int(a[key].value, f"sft stage '{key}'", 1)
                self._bounded(opts[key], key, a[key].value.span, "sft stage")
        if "lr" in a:
            opts["lr"] = self.ctx.training_checks.setting_value("lr", HYPERPARAMETERS["lr"], a["lr"].value, "sft stage")
        for key in ("prompt", "completion", "system"):  # system: none unless named
            if key in a:
                field = self.ctx.const(a[key].value, f"sft stage '{key}'")
                if not isinstance(field, str) or not field:
                    self.ctx.err("E107", f"sft stage '{key}' is the name of a record field (a string)", a[key].value.span)
                else:
                    opts[key] = field
        return opts if role is not None and None not in opts.values() else None

    def data_ref(self, v: A.Expr, message: str) -> str | None:
        """The declared data set a stage's `data` names (marked used), or None after E110."""
        if not (isinstance(v, A.Name) and any(ds.name == v.id for ds in self.ctx.exp.datasets)):
            self.ctx.err("E110", message, v.span,
                         suggest(v.id, [ds.name for ds in self.ctx.exp.datasets]) if isinstance(v, A.Name) else None)
            return None
        self.ctx.used.add(("data", v.id))
        return v.id

    def stage_train(self, d: A.StageDecl, a: dict[str, A.Attribute]) -> dict[str, Any] | None:
        if "keep" not in a:
            return {}
        keep = self.keep_rule(a["keep"], "train")
        if keep is None:
            return None
        return {"keep": keep} if keep["rule"] != KEEP_LAST else {}

    def keep_rule(self, attr: A.Attribute, kind: str) -> dict[str, Any] | None:
        """`keep = last | best(accuracy) | plateau(reward, window = N, fraction = F, ...)` as
        {rule, of, ...its arguments, its options with their defaults} (askspec.ir.vocab
        KEEP_RULES, KEEP_OPTIONS), or None after a diagnostic."""
        v = attr.value
        forms = "keep = last, best(accuracy) (a train stage) or plateau(reward, window = N, fraction = F) (a retrain stage)"
        if isinstance(v, A.Name) and v.id == KEEP_LAST:
            return {"rule": KEEP_LAST}
        name = v.func if isinstance(v, A.Call) else v.id if isinstance(v, A.Name) else None
        if name in KEEP_RULES and not isinstance(v, A.Call):  # `keep = plateau`: the rule without its arguments
            _, curve, keywords = KEEP_RULES[name]
            self.ctx.err("E109", f"keep = {name} needs its arguments", v.span,
                         f"keep = {name}({curve}" + "".join(f", {k} = ..." for k in keywords) + ")")
            return None
        if name not in KEEP_RULES or not isinstance(v, A.Call):
            self.ctx.err("E107", f"keep is a rule that chooses the stage's checkpoint, found {name or 'an expression'}",
                         v.func_span if isinstance(v, A.Call) else v.span,
                         (suggest(name, [KEEP_LAST, *KEEP_RULES]) if name else None) or forms)
            return None
        applies, curve, keywords = KEEP_RULES[name]
        if applies != kind:
            self.ctx.err("E408", f"keep = {name}(...) chooses the checkpoint of a {applies} stage, not of a {kind} stage",
                         v.func_span, forms)
            return None
        if len(v.args) != 1 or not isinstance(v.args[0], A.Name) or v.args[0].id != curve:
            self.ctx.err("E109", f"{name}() takes one argument, {curve}" + (
                f", and the keyword arguments {', '.join(keywords)}" if keywords else ""), v.span,
                f"keep = {name}({curve}" + "".join(f", {k} = ..." for k in keywords) + ")")
            return None
        out: dict[str, Any] = {"rule": name, "of": curve}
        given: dict[str, A.Expr] = {}
        for k, e in v.kwargs:
            if k in given:
                self.ctx.err("E104", f"{name}() is given '{k}' twice", e.span)
                return None
            given[k] = e
            allowed = (*keywords, *KEEP_OPTIONS.get(name, {}))
            if k not in allowed:
                self.ctx.err("E109", f"{name}() has no keyword argument '{k}'", e.span,
                             suggest(k, allowed) or (f"its keyword arguments: {', '.join(allowed)}" if allowed
                                                     else f"{name}({curve}) takes none"))
                return None
        for k in keywords:
            if k not in given:
                self.ctx.err("E106", f"{name}() needs '{k} = ...'", v.span,
                             "e.g. keep = plateau(reward, window = 25, fraction = 0.15)")
                return None
        if name == "plateau":
            window = self.ctx.const_int(given["window"], "plateau's window", 1)
            fraction = self.ctx.const(given["fraction"], "plateau's fraction")
            if window is None or fraction is None:
                return None
            if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
                self.ctx.err("E107", f"plateau's fraction is a number in (0, 1] (of the largest slope seen), found "
                                     f"{fraction!r}", given["fraction"].span)
                return None
            self._bounded(window, "window", given["window"].span, "plateau")
            out.update(window=window, fraction=float(fraction))
            options = self.plateau_options(given, v.span)
            if options is None:
                return None
            out.update(options)
        elif name == "best":
            sched = self.ctx.exp.schedule
            if sched is None or sched.kind != "nested":
                self.ctx.err("E408", "keep = best(accuracy) chooses among the promoted students of a nested schedule, "
                                     "and this spec has none", v.func_span, "remove the setting (the train stage keeps its "
                                                                            "last step)")
                return None
        return out

    def plateau_options(self, given: dict[str, A.Expr], span: Any) -> dict[str, Any] | None:
        """plateau's optional arguments (askspec.ir.vocab.KEEP_OPTIONS) with their defaults,
        those of the chosen `select` (online | posthoc): `min_steps` guards the online rule;
        `average` and `every` (required, ≥ 1) belong to the post-hoc one."""
        out = dict(KEEP_OPTIONS["plateau"])
        if "select" in given:
            e = given["select"]
            if not (isinstance(e, A.Name) and e.id in PLATEAU_SELECTS):
                found = e.id if isinstance(e, A.Name) else "an expression"
                self.ctx.err("E107", f"plateau's select is {' or '.join(PLATEAU_SELECTS)}, found {found}", e.span,
                             suggest(found, PLATEAU_SELECTS) if isinstance(e, A.Name) else None)
                return None
            out["select"] = e.id
        for key in ("min_steps", "average", "every"):
            if key in given:
                n = self.ctx.const_int(given[key], f"plateau's {key}", 1 if key == "every" else 0)
                if n is None:
                    return None
                self._bounded(n, key, given[key].span, "plateau")
                out[key] = n
        posthoc = out["select"] == "posthoc"
        for key in ("min_steps",) if posthoc else ("average", "every"):
            if key in given:
                self.ctx.err("E107", f"plateau's {key} belongs to select = {'online' if posthoc else 'posthoc'}",
                             given[key].span, "min_steps guards the online rule; average and every are the post-hoc "
                                          "selection's (select = posthoc)")
                return None
        if not posthoc:
            del out["average"], out["every"]
        else:
            del out["min_steps"]
        if posthoc and "every" not in given:
            self.ctx.err("E106", "plateau(..., select = posthoc) needs 'every = N': how often the stage keeps the "
                                 "role's weights (the checkpoints the selection and the averaging can use)", span,
                         "e.g. keep = plateau(reward, window = 25, fraction = 0.15, select = posthoc, average = 200, "
                         "every = 50)")
            return None
        return out

    def stage_evaluate(self, d: A.StageDecl, a: dict[str, A.Attribute]) -> dict[str, Any] | None:
        for need in ("games", "score"):
            if need not in a:
                self.ctx.err("E106", f"an evaluate stage needs '{need}'", d.name_span,
                             "e.g. games = [test]; score = correct" if need == "games" else
                             "the session variable that says a sample is right: score = correct")
        if "games" not in a or "score" not in a:
            return None
        games = self.ctx.block_checks.schedule_games(a["games"].value, "evaluate")
        sched = self.ctx.exp.schedule  # an evaluated game is held out: the RL schedule must not train on it
        opt = sched.options.get("games") if sched is not None else None
        trained = opt if isinstance(opt, list) else [g for v in opt.values() for g in v] if isinstance(opt, dict) else []
        for g in games:
            if g in trained:
                self.ctx.err("E408", f"game '{g}' is evaluated here and trained on by the schedule", a["games"].value.span,
                             "evaluate on held-out games only")
                return None
        samples = self.ctx.const_int(a["samples"].value, "samples", 1) if "samples" in a else 1
        ks: Any = [1]
        if "k" in a:
            raw = self.ctx.const(a["k"].value, "k")
            ks = raw if isinstance(raw, list) else [raw]
            if not ks or any(isinstance(k, bool) or not isinstance(k, (int, float)) or int(k) != k or k < 1 for k in ks):
                self.ctx.err("E107", f"k is a whole number ≥ 1 or a list of them, found {raw!r}", a["k"].value.span)
                return None
            ks = [int(k) for k in ks]
            if samples is not None and max(ks) > samples:
                self.ctx.err("E408", f"pass@{max(ks)} needs at least {max(ks)} samples per item, the stage draws {samples}",
                             a["k"].value.span, f"samples = {max(ks)}")
                return None
        score = a["score"].value
        if not isinstance(score, A.Name):
            self.ctx.err("E107", "score names a session variable of the evaluated games", score.span)
            return None
        for g in games:
            have = self.ctx.session_vars.get(g, {})
            if score.id not in have:
                self.ctx.err("E101", f"score '{score.id}' is not a session variable of game '{g}'", score.span,
                             suggest(score.id, list(have)))
                return None
            if have[score.id].name not in ("bool", "number", "any"):
                self.ctx.err("E201", f"score '{score.id}' must be a number or true/false, found {have[score.id]}", score.span)
                return None
        weights = list(WEIGHTS)
        if "weights" in a:
            v = a["weights"].value
            items = v.items if isinstance(v, A.ListLit) else [v]
            weights = []
            for x in items:
                if not isinstance(x, A.Name) or x.id not in WEIGHTS:
                    self.ctx.err("E107", "weights are trained and/or initial", x.span)
                    return None
                weights.append(x.id)
        if not games or samples is None:
            return None
        return {"games": games, "samples": samples, "k": ks, "score": score.id, "weights": weights}

    def stage_retrain(self, d: A.StageDecl, a: dict[str, A.Attribute]) -> dict[str, Any] | None:
        """A fresh copy of `role` (the spec's weights, a new AdamW) trained `steps` steps by
        playing `game` over the nested schedule's promoted datasets and/or a data set."""
        for need in ("role", "game"):
            if need not in a:
                self.ctx.err("E106", f"a retrain stage needs '{need}'", d.name_span,
                             "e.g. role = student; game = practice; promoted = true; data = hard")
        if "role" not in a or "game" not in a:
            return None
        role = self.ctx.block_checks.role_ref(a["role"].value)
        if role is None:
            return None
        if role not in {t.role for t in self.ctx.exp.training}:
            self.ctx.err("E408", f"the retrain stage trains role '{role}', which has no train block", a["role"].value.span,
                         f"add `train {role} with ...` (its algorithm, group and batch)")
            return None
        games = self.one_game(a["game"].value, "game")
        if not games:
            return None
        game = next(g for g in self.ctx.exp.games if g.name == games[0])
        if len(game.pattern) != 1 or not (isinstance(game.iter, ir.Ref) and game.iter.scope == "data"):
            self.ctx.err("E408", f"the retrain stage plays game '{game.name}' over items it chooses, so the game must be "
                         f"written `game {game.name} for x in DATA`", a["game"].value.span)
            return None
        opts: dict[str, Any] = {"role": role, "game": game.name, "promoted": False, "data": None, "steps": 1,
                                "curriculum": 0}
        if "sample" in a:
            sampled = self.sample_game(a["sample"].value, game.name)
            if sampled is None:
                return None
            opts["sample"] = sampled
        if "promoted" in a:
            v = self.ctx.const(a["promoted"].value, "promoted")
            if not isinstance(v, bool):
                self.ctx.err("E107", "promoted is true or false", a["promoted"].value.span)
                return None
            opts["promoted"] = v
        sched = self.ctx.exp.schedule
        if opts["promoted"] and (sched is None or sched.kind != "nested" or sched.options.get("inner") != role):
            self.ctx.err("E408", f"promoted datasets come from a nested schedule whose inner role is '{role}'",
                         a["promoted"].value.span, "promoted = true needs `schedule nested { inner = " + role + "; ... }`")
            return None
        if "data" in a:
            opts["data"] = self.data_ref(a["data"].value, "data names a declared data set")
            if opts["data"] is None:
                return None
        if not opts["promoted"] and opts["data"] is None and "sample" not in opts:
            self.ctx.err("E408", f"stage '{d.name}' has nothing to train on", d.name_span,
                         "promoted = true (the nested schedule's promoted datasets), sample = GAME (a data set sampled "
                         "from a role) and/or data = DATA")
            return None
        for key, low in (("steps", 1), ("curriculum", 0), ("warmup", 0)):
            if key in a:
                opts[key] = self.ctx.const_int(a[key].value, f"retrain stage '{key}'", low)
                self._bounded(opts[key], key, a[key].value.span, "retrain stage")
        if "lr" in a:
            opts["lr"] = self.ctx.training_checks.setting_value("lr", HYPERPARAMETERS["lr"], a["lr"].value, "retrain stage")
        if None in (opts["steps"], opts["curriculum"], opts.get("warmup", 0), opts.get("lr", 1)):
            return None
        synthetic = opts["promoted"] or "sample" in opts
        if opts["curriculum"] and not (synthetic and opts["data"] is not None and opts["curriculum"] < opts["steps"]):
            self.ctx.err("E408", "curriculum (the first steps on the promoted or sampled items only, then the data set) "
                         "needs promoted = true or sample = GAME, a data set and fewer curriculum steps than steps",
                         a["curriculum"].value.span)
            return None
        if "keep" in a:
            keep = self.keep_rule(a["keep"], "retrain")
            if keep is None:
                return None
            if keep["rule"] != KEEP_LAST:
                opts["keep"] = keep
        return opts

    def one_game(self, v: A.Expr, key: str) -> list[str]:
        """A retrain stage's `game` or `sample`: one game, named bare ([name] of it, or []
        after a diagnostic: a list here once dropped the stage without one)."""
        if not isinstance(v, A.Name):
            self.ctx.err("E107", f"a retrain stage's {key} is one game, named bare (no brackets or quotes)", v.span,
                         f"e.g. {key} = {'practice' if key == 'game' else 'write'}")
            return []
        return list(self.ctx.block_checks.schedule_games(v, "retrain"))

    def sample_game(self, v: A.Expr, trained_game: str) -> str | None:
        """The game a retrain stage's `sample` names: played once, with the weights the
        stages before left, its `sample N ask ROLE` replies become the stage's items (as a
        nested schedule's datasets are). It is held out of the schedule, as an evaluated game."""
        games = self.one_game(v, "sample")
        if not games:
            return None
        game = next(g for g in self.ctx.exp.games if g.name == games[0])
        if game.name == trained_game:
            self.ctx.err("E408", f"game '{game.name}' both samples the stage's items and trains on them", v.span,
                         "sample = a game that asks the role that writes the items: game write { xs = sample 128 ask teacher }")
            return None
        if not any(isinstance(s, ir.AskStep) and s.sample is not None for s in all_steps(game.body)):
            self.ctx.err("E408", f"game '{game.name}' has no `sample N ask ROLE`: the stage's items are the replies of its "
                                 f"sample calls", v.span, "e.g. game write { xs = sample 128 ask teacher }")
            return None
        sched = self.ctx.exp.schedule
        opt = sched.options.get("games") if sched is not None else None
        trained = opt if isinstance(opt, list) else [g for x in opt.values() for g in x] if isinstance(opt, dict) else []
        if game.name in trained:
            self.ctx.err("E408", f"game '{game.name}' samples a stage's items and is trained on by the schedule", v.span,
                         "sample with a game of its own, held out of the schedule")
            return None
        return game.name

    # the handler of each kind (one table: a missing handler is a KeyError here, not an attribute lookup)
    STAGES = {
        "sft": stage_sft,
        "train": stage_train,
        "evaluate": stage_evaluate,
        "retrain": stage_retrain,
    }
