"""Renderers of the IR: a readable text outline (with the static per-role bound on model
calls per session), Graphviz DOT and Mermaid flowcharts of each game, its group routes,
their tournaments or judges and the judge roles they consult."""

from __future__ import annotations

import json
from math import comb

from . import model as ir
from .canonical import experiment_hash
from .plansize import training_steps, weight_rounds
from .vocab import CONTEST_ROUTES
from .walk import bodies


def expr_text(e: ir.Expr | None) -> str:
    match e:
        case None:
            return ""
        case ir.Lit(value=v, type=t):
            if t == "string":
                return json.dumps(v)
            return "none" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
        case ir.Ref(name=name):
            return name
        case ir.GetAttr(obj=obj, name=name):
            return f"{expr_text(obj)}.{name}"
        case ir.GetIndex(obj=obj, index=index):
            return f"{expr_text(obj)}[{expr_text(index)}]"
        case ir.CallFn(fn=fn, args=args, kwargs=kwargs):
            call_args = [expr_text(a) for a in args] + [f"{n}={expr_text(v)}" for n, v in kwargs.items()]
            return f"{fn}({', '.join(call_args)})"
        case ir.UnaryOp(op=op, operand=operand):
            return f"{op}{' ' if op == 'not' else ''}{expr_text(operand)}"
        case ir.BinaryOp(op=op, left=left, right=right):
            return f"({expr_text(left)} {op} {expr_text(right)})"
        case ir.CaseOf(subject=subject, arms=arms, default=default):
            shown = "; ".join(f"{expr_text(a.when)} -> {expr_text(a.then)}" for a in arms)
            if default is not None:
                shown += f"; else -> {expr_text(default)}"
            subj = f" {expr_text(subject)}" if subject is not None else ""
            return f"case{subj} {{ {shown} }}"
        case ir.ListOf(items=items):
            return "[" + ", ".join(expr_text(x) for x in items) + "]"
        case ir.RecordOf(fields=fields):
            return "{" + ", ".join(f"{n}: {expr_text(v)}" for n, v in fields.items()) + "}"
        case ir.Filter(seq=seq, cond=cond):
            return f"({expr_text(seq)} where {expr_text(cond)})"
    return "?"


def step_text(s: ir.Step) -> str:
    match s:
        case ir.AskStep():
            lhs = ", ".join(t for t in s.targets if t)
            parts = [f"ask {', '.join(s.roles)}"]
            if s.sample is not None:
                parts.insert(0, f"sample {expr_text(s.sample)}")
            if s.template:
                parts.append(f"using {s.template}")
            if s.message is not None:
                parts.append(f": {expr_text(s.message)}")
            if s.context is not None:
                parts.append(f"with {expr_text(s.context)}")
            if s.sampling or s.role_sampling:
                fields = [f"{k} = {json.dumps(v)}" for k, v in s.sampling.items()]
                fields += [f"{role} {{ " + "; ".join(f"{k} = {json.dumps(v)}" for k, v in own.items()) + " }"
                           for role, own in (s.role_sampling or {}).items()]
                parts.append("with sampling { " + "; ".join(fields) + " }")
            return (f"{lhs} = " if lhs else "") + " ".join(parts)
        case ir.AssignStep():
            return f"{s.name} = {expr_text(s.value)}"
        case ir.OutcomeStep():
            return f"outcome = {expr_text(s.value)}"
        case ir.RewardStep():
            kind = "turn" if s.turn_var else "terminal"
            return f"reward {s.turn_var or s.role} as {s.name} ({kind}) = {expr_text(s.value)}"
        case ir.BindStep():
            return f"bind {s.role} = {expr_text(s.model)}"
        case ir.EndStep():
            return "end" + (f" {s.outcome}" if s.outcome else "")
        case ir.DropStep():
            return f"drop {s.turn_var or s.role} (not trained)"
        case ir.PushStep():
            return f"push {s.buffer}: {expr_text(s.value)}"
        case ir.RepeatStep():
            var = f"{s.var} in " if s.var else ""
            return f"repeat {var}{expr_text(s.start)}..{expr_text(s.stop)} (≤ {s.bound})"
        case ir.WhileStep():
            return f"{'until' if s.until else 'while'} {expr_text(s.cond)} (≤ {s.limit})"
        case ir.ForStep():
            return f"for {', '.join(s.names)} in {expr_text(s.iter)} (≤ {s.limit})"
        case ir.IfStep():
            return f"if {expr_text(s.branches[0].cond)}"
    return s.kind


def _children(s: ir.Step) -> list[tuple[str | None, list]]:
    """The step lists nested in `s` (walk.bodies), each with the label it is shown under."""
    if not isinstance(s, ir.IfStep):
        return [(None, body) for _, body in bodies(s)]
    out: list[tuple[str | None, list]] = [(f"elif {expr_text(b.cond)}" if i else None, b.body)
                                          for i, b in enumerate(s.branches)]
    if s.orelse:
        out.append(("else", s.orelse))
    return out


def judged_pairs(t: ir.Tournament, n: int) -> int:
    """Judge calls of one group of n when every verdict parses (the papers' count): C(n, 2)
    for round robin; for live pairing, arrival i meets min(i, k) of the k anchors
    (1 + 2 + 3·5 = 18 for N = 8, reasoning_arena.txt App. B), at most."""
    if t.pairing == "round_robin":
        matches = comb(n, 2)
    else:
        k = len(set(t.live_opponents))
        matches = sum(min(i, k) for i in range(n))
    return matches * (2 if t.order == "both" else 1)


def judge_calls_per_group(t: ir.Tournament, n: int) -> int:
    """The most judge calls of one group, verdict retries included."""
    return judged_pairs(t, n) * (1 + t.retries)


def contest_calls(exp: ir.Experiment, g: ir.Game) -> list[tuple[str, str, int, int]]:
    """Per contest a game's routes can reach: (label, "=" or "≤", judge calls of a group
    when every verdict parses, most calls with retries). Round robin always makes all its
    calls; live pairing makes fewer when anchors coincide."""
    out: list[tuple[str, str, int, int]] = []
    seen: set[tuple[str, str | None]] = set()
    for rt in g.routes:
        for a in rt.arms:
            if a.action not in CONTEST_ROUTES or (a.action, a.target) in seen:
                continue
            seen.add((a.action, a.target))
            if a.action == "tournament":
                t = next((t for t in exp.tournaments if t.name == a.target), None)
                if t is not None:
                    pairing = t.pairing if t.pairing == "round_robin" else f"live({', '.join(t.live_opponents)})"
                    out.append((f"tournament {t.name}, {pairing}", "=" if t.pairing == "round_robin" else "≤",
                                judged_pairs(t, g.group_size), judge_calls_per_group(t, g.group_size)))
            else:
                j = next((j for j in exp.judges if j.name == a.target), None)
                if j is not None:
                    out.append((f"judge {j.name}, pointwise", "=", g.group_size, g.group_size * (1 + j.retries)))
    return out


def arm_cost(exp: ir.Experiment, g: ir.Game, arm: ir.RouteArm) -> tuple[str, int, str] | None:
    """(judge role, most judge calls one group costs, contest label) of a route arm that
    consults a judge; None for keep / drop."""
    if arm.action == "tournament":
        t = next((t for t in exp.tournaments if t.name == arm.target), None)
        return (t.judge, judge_calls_per_group(t, g.group_size), f"tournament {t.name}, {t.pairing}") if t else None
    if arm.action == "judge":
        j = next((j for j in exp.judges if j.name == arm.target), None)
        return (j.judge, g.group_size * (1 + j.retries), f"judge {j.name}") if j else None
    return None


def route_call_bounds(exp: ir.Experiment, g: ir.Game) -> list[tuple[str, int, str]]:
    """Per judge role: the most calls one group can cost through the game's routes (a
    group takes one arm), with the contests that reach that bound."""
    best: dict[str, tuple[int, list[str]]] = {}
    for rt in g.routes:
        for a in rt.arms:
            cost = arm_cost(exp, g, a)
            if cost is None:
                continue
            role, n, label = cost
            prev_n, labels = best.get(role, (-1, []))
            if n > prev_n:
                best[role] = (n, [label])
            elif n == prev_n and label not in labels:
                labels.append(label)
    return [(role, n, " / ".join(labels)) for role, (n, labels) in sorted(best.items())]


def arm_text(a: ir.RouteArm) -> str:
    return f"{'when ' + expr_text(a.cond) if a.cond is not None else 'else'} -> {a.action}{' ' + a.target if a.target else ''}"


def to_text(exp: ir.Experiment) -> str:
    out = [f"experiment {exp.name}  (hash {experiment_hash(exp)[:16]})"]
    if exp.options.get("profile"):
        out.append(f"profile: {exp.options['profile']}")
    if exp.params:
        out.append("params:")
        for p in exp.params:
            out.append(f"  {p.name}: {p.type} = {json.dumps(p.value)}")
    if exp.models:
        out.append("models:")
        for m in exp.models:
            samp = ", ".join(f"{k}={v}" for k, v in sorted(m.sampling.items()))
            source = f"current({m.weights_of}), {m.backend}({m.weights!r}) as trained" if m.weights_of else f"{m.backend}({m.weights!r})"
            out.append(f"  {m.name}: {source}{' ' + samp if samp else ''}")
    out.append("roles:")
    for r in exp.roles:
        bits = [f"model={r.model or '(bound per session)'}", "trained" if r.trained else "frozen",
                f"memory={r.memory.kind}{f'({r.memory.size})' if r.memory.kind == 'window' else ''}"
                f"{f'({r.memory.conversation})' if r.memory.kind == 'shared' else ''}", f"reply={r.reply.kind}"]
        if r.max_prompt_tokens is not None and r.prompt_overflow is not None:
            over = r.prompt_overflow
            bits.append(f"max_prompt_tokens={r.max_prompt_tokens} "
                        f"{over.mode if over.mode == 'truncate_left' else f'end({over.outcome})'}")
        if r.recover.retries:
            bits.append(f"{'resample' if r.recover.mode == 'resample' else 'recover'}×{r.recover.retries}")
        out.append(f"  {r.name}: " + ", ".join(bits))
    for g in exp.games:
        head = f"game {g.name}"
        if g.iter is not None:
            head += f" for {', '.join(g.pattern)} in {expr_text(g.iter)}"
        if g.times > 1:
            head += f" times {g.times}"
        if g.group_size > 1:
            head += f" sample {g.group_size}"
        out.append(head)
        if g.outcomes:
            out.append(f"  outcomes: {', '.join(g.outcomes)}")

        def walk(steps, depth):
            for s in steps:
                out.append("  " * depth + "- " + step_text(s))
                for label, body in _children(s):
                    if label:
                        out.append("  " * depth + "  " + label)
                    walk(body, depth + 1)

        walk(g.body, 1)
        for rt in g.routes:
            arms = "; ".join(arm_text(a) for a in rt.arms)
            out.append(f"  route {rt.role}: {arms}")
        out.append("  model calls per session (upper bound, recovery retries included):")
        for role, n in g.call_bounds.items():
            out.append(f"    {role}: ≤ {n}")
        for role, n, via in route_call_bounds(exp, g):
            out.append(f"    {role}: ≤ {n} per group of {g.group_size} (route {via})")
        contests = contest_calls(exp, g)
        if contests:
            out.append(f"  judge calls per routed group of {g.group_size} (every verdict parsed; with verdict retries):")
            for label, rel, n, most in contests:
                out.append(f"    {label}: {rel} {n} (≤ {most})")
    for t in exp.training:
        hp = ", ".join(f"{k}={v}" for k, v in t.written().items())
        out.append(f"train {t.role} with {t.algorithm}{' {' + hp + '}' if hp else ''}")
        if t.update_when is not None:
            out.append(f"  update_when {expr_text(t.update_when)}")
    if exp.schedule:
        out.append(f"schedule {exp.schedule.kind} {json.dumps(exp.schedule.options) if exp.schedule.options else ''}".rstrip())
        out.extend(schedule_lines(exp))
    if exp.stages:
        out.extend(stage_lines(exp))
    for metric in exp.metrics:
        out.append(f"metric {metric.name} = {expr_text(metric.value)}{' by (' + ', '.join(metric.by) + ')' if metric.by else ''}")
    return "\n".join(out) + "\n"


def _esc(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


class _Graph:
    def __init__(self) -> None:
        self.nodes: list[tuple[str, str, str]] = []  # id, label, shape
        self.edges: list[tuple[str, str, str]] = []
        self.n = 0

    def node(self, label: str, shape: str = "box") -> str:
        self.n += 1
        nid = f"n{self.n}"
        self.nodes.append((nid, label, shape))
        return nid

    def edge(self, a: str, b: str, label: str = "") -> None:
        self.edges.append((a, b, label))


def _build(exp: ir.Experiment, g: ir.Game) -> _Graph:
    gr = _Graph()
    start = gr.node(f"start {g.name}", "oval")
    end = gr.node("end", "oval")

    def seq(steps, prev: list[tuple[str, str]]) -> list[tuple[str, str]]:
        for s in steps:
            loop = isinstance(s, (ir.RepeatStep, ir.WhileStep, ir.ForStep))
            nid = gr.node(step_text(s), "diamond" if loop or isinstance(s, ir.IfStep) else "box")
            for p, label in prev:
                gr.edge(p, nid, label)
            if loop:
                tail = seq(s.body, [(nid, "body")])
                for t, label in tail:
                    gr.edge(t, nid, label or "next")
                prev = [(nid, "done")]
            elif isinstance(s, ir.IfStep):
                outs = []
                for i, b in enumerate(s.branches):
                    outs += seq(b.body, [(nid, "yes" if i == 0 else f"elif {expr_text(b.cond)}")])
                outs += seq(s.orelse, [(nid, "else")]) if s.orelse else [(nid, "else")]
                prev = outs
            elif isinstance(s, ir.EndStep):
                gr.edge(nid, end, "")
                prev = []
            else:
                prev = [(nid, "")]
        return prev

    for p, label in seq(g.body, [(start, "")]):
        gr.edge(p, end, label)
    _routes(exp, g, gr, end)
    return gr


def _routes(exp: ir.Experiment, g: ir.Game, gr: _Graph, end: str) -> None:
    """A game's routes after its sessions end (once per group of `sample N`): each arm's
    condition, its action, and for a tournament or judge the judge role it consults and
    the most calls it costs a group (as the text outline states them)."""
    judges: dict[str, str] = {}  # judge role -> its node
    for rt in g.routes:
        rid = gr.node(f"route {rt.role} (group of {g.group_size})", "diamond")
        gr.edge(end, rid, "group finished")
        actions: dict[tuple[str, str | None], str] = {}  # arms leading to the same action share its node
        for a in rt.arms:
            label = f"when {expr_text(a.cond)}" if a.cond is not None else "else"
            aid = actions.get((a.action, a.target))
            if aid is None:
                cost = arm_cost(exp, g, a)
                if cost is None:
                    aid = gr.node({"keep": "keep the verifier rewards", "resample": "drop the group and sample another (training)"}
                                  .get(a.action, "drop the group (not trained)"))
                else:
                    role, calls, contest = cost
                    aid = gr.node(f"{contest}: rewards {rt.role} (≤ {calls} judge calls)")
                    if role not in judges:
                        judges[role] = gr.node(f"judge role {role}", "oval")
                    gr.edge(aid, judges[role], "asks")
                actions[(a.action, a.target)] = aid
            gr.edge(rid, aid, label)


def to_dot(exp: ir.Experiment) -> str:
    out = [f'digraph "{_esc(exp.name)}" {{', "  rankdir=TB;", '  node [fontname="Helvetica"];']
    for gi, g in enumerate(exp.games):
        gr = _build(exp, g)
        out.append(f'  subgraph "cluster_{_esc(g.name)}" {{')
        out.append(f'    label="game {_esc(g.name)}";')
        for nid, label, shape in gr.nodes:
            out.append(f'    g{gi}{nid} [label="{_esc(label)}", shape={shape}];')
        for a, b, label in gr.edges:
            lab = f' [label="{_esc(label)}"]' if label else ""
            out.append(f"    g{gi}{a} -> g{gi}{b}{lab};")
        out.append("  }")
    out.append("}")
    return "\n".join(out) + "\n"


def _mm(label: str) -> str:
    return label.replace('"', "#quot;").replace("\n", " ")


def to_mermaid(exp: ir.Experiment) -> str:
    out = ["flowchart TD"]
    for gi, g in enumerate(exp.games):
        gr = _build(exp, g)
        out.append(f'  subgraph g{gi}["game {_mm(g.name)}"]')
        for nid, label, shape in gr.nodes:
            left, right = {"oval": ("([", "])"), "diamond": ("{", "}"), "box": ("[", "]")}[shape]
            out.append(f'    g{gi}{nid}{left}"{_mm(label)}"{right}')
        for a, b, label in gr.edges:
            arrow = f' -->|"{_mm(label)}"| ' if label else " --> "
            out.append(f"    g{gi}{a}{arrow}g{gi}{b}")
        out.append("  end")
    return "\n".join(out) + "\n"


def schedule_lines(exp: ir.Experiment) -> list[str]:
    """The schedule's phases with their step bounds (and each phase's games' model-call
    bounds per session), as the local trainer runs them (docs/training.md)."""
    sched = exp.schedule
    if sched is not None and sched.kind == "nested":
        return _nested_lines(exp, sched.options)
    if sched is not None and sched.kind == "online":
        return _online_lines(exp, sched.options)
    if sched is None or sched.kind != "alternating":
        return []
    opts = sched.options
    trained = {t.role for t in exp.training}
    phases = [(k, int(v)) for k, v in opts.items() if k in trained and isinstance(v, int)]
    iterations = int(opts.get("iterations") or 1)
    per_cycle = sum(n for _, n in phases)
    out = [f"  {iterations * per_cycle} step(s) = {iterations} iteration(s) × ({' + '.join(f'{r} {n}' for r, n in phases)})"]
    games_opt = opts.get("games")
    chosen: dict = games_opt if isinstance(games_opt, dict) else {}
    for role, n in phases:
        others = sorted(trained - {role})
        names = chosen.get(role) or [g.name for g in exp.games if role in g.call_bounds]
        calls = "; ".join(f"{g.name}: " + ", ".join(f"{r} ≤ {c}" for r, c in g.call_bounds.items()) + " per session"
                          for g in exp.games if g.name in names)
        out.append(f"  phase {role}: {n} step(s) per iteration, {iterations * n} in all; updates {role}"
                   + (f", {', '.join(others)} frozen" if others else "") + (f"; {calls}" if calls else ""))
    return out


def _online_lines(exp: ir.Experiment, opts: dict) -> list[str]:
    """The online schedule: its steps, the roles every step updates (and their update
    gates), and the games' model-call bounds per session."""
    from .plansize import held_out_games, replays_buffer

    held = held_out_games(exp)
    chosen = opts.get("games")
    names = chosen if isinstance(chosen, list) else [g.name for g in exp.games
                                                      if replays_buffer(g) is None and g.name not in held]
    calls = "; ".join(f"{g.name}: " + ", ".join(f"{r} ≤ {c}" for r, c in g.call_bounds.items()) + " per session"
                      for g in exp.games if g.name in names)
    roles = ", ".join(t.role + (f" (update_when {expr_text(t.update_when)})" if t.update_when is not None else "")
                      for t in exp.training)
    n = _schedule_steps(exp)
    return [f"  {n} step(s); each plays {', '.join(names) or 'no game'} and updates {roles}" + (f"; {calls}" if calls else "")]


def stage_lines(exp: ir.Experiment) -> list[str]:
    """The stages in the order they run, with each one's steps (global, as train_steps
    counts them) and sessions."""
    from .plansize import Unknown, dataset_sizes, items_count

    out = ["stages (in order):"]
    step = 0
    params, data = exp.param_values(), dataset_sizes(exp)

    def items(name: str) -> int | None:
        g = next(g for g in exp.games if g.name == name)
        try:
            return (1 if g.iter is None else items_count(g.iter, params, data)) * g.times
        except Unknown:
            return None
    for st in exp.stages:
        o = st.options
        if st.kind == "sft":
            system = f", system '{o['system']}'" if o.get("system") else ""
            out.append(f"  stage {st.name} sft: {o['role']} on {o['data']} (prompt '{o['prompt']}', completion "
                       f"'{o['completion']}'{system}), {o['steps']} step(s) of {o['batch']} record(s), steps {step + 1}–{step + o['steps']}")
            step += o["steps"]
        elif st.kind == "train":
            n = _schedule_steps(exp)
            kept = ", keeping the promoted student of best accuracy" if o.get("keep") else ""
            out.append(f"  stage {st.name} train: the schedule ({exp.schedule.kind if exp.schedule else 'online'}){kept}, "
                       f"steps {step + 1}–{step + n}" if n else f"  stage {st.name} train: the schedule{kept}")
            step += n
        elif st.kind == "retrain":
            synthetic = (["the promoted datasets"] if o["promoted"] else []) + \
                ([f"{o['sample']}'s sampled replies"] if o.get("sample") else [])
            source = " + ".join(synthetic + ([o["data"]] if o["data"] else []))
            mix = (f"curriculum: {' + '.join(synthetic)} alone for {o['curriculum']} step(s), then {o['data']}"
                   if o["curriculum"] else "mixed" if synthetic and o["data"] else "")
            keep = o.get("keep")
            stop = ""
            if keep and keep["rule"] == "plateau" and keep.get("select") == "posthoc":
                spread = (f", the evaluations after it averaged over the kept checkpoints of the {keep['average']} "
                          f"steps from it" if keep.get("average") else "")
                stop = (f", then keeping its weights at the start of its reward plateau over the whole curve (a "
                        f"centred window {keep['window']}, fraction {keep['fraction']:g}; weights kept every "
                        f"{keep['every']} step(s)){spread}")
            elif keep and keep["rule"] == "plateau":
                guard = f", not before step {keep['min_steps']}" if keep.get("min_steps") else ""
                stop = (f", stopping at its reward plateau (window {keep['window']}, fraction {keep['fraction']:g}"
                        f"{guard})")
            out.append(f"  stage {st.name} retrain: a fresh {o['role']} (the spec's weights, a new optimizer) trained "
                       f"{'at most ' if stop.startswith(', stopping') else ''}{o['steps']} step(s) playing {o['game']} over {source}"
                       f"{f' ({mix})' if mix else ''}{stop}, steps {step + 1}–{step + o['steps']}")
            step += o["steps"]
        else:
            counts = [items(g) for g in o["games"]]
            known = None if None in counts else sum(c or 0 for c in counts)
            ks = ", ".join(f"pass@{k}" for k in o["k"])
            rounds = weight_rounds(exp, st)  # a post-hoc plateau's checkpoints: each one's `trained` samples
            played = (f"{len(o['weights'])} weights" if rounds == len(o["weights"]) else
                      f"{rounds} weights/checkpoints (at most; the trained weights at each checkpoint of the "
                      f"plateau's averaging window)")
            size = (f"{known} item(s) × {o['samples']} sample(s) × {played} = "
                    f"{known * o['samples'] * rounds} session(s)" if known is not None
                    else f"{o['samples']} sample(s) per item × {played}")
            out.append(f"  stage {st.name} evaluate: {', '.join(o['games'])} against {' and '.join(o['weights'])} "
                       f"weights, {size}; {ks}, avg@{o['samples']} of '{o['score']}'; step {step + 1}")
            step += 1
    return out


def _schedule_steps(exp: ir.Experiment) -> int:
    """The RL schedule's steps (0 when they depend on the data)."""
    sched = exp.schedule
    opts = sched.options if sched is not None else {}
    if sched is not None and sched.kind == "alternating":
        return sum(int(v) for k, v in opts.items() if any(r.name == k for r in exp.roles)) * int(opts.get("iterations") or 1)
    if sched is not None and sched.kind == "nested":
        outer = next((t for t in exp.training if t.role == opts.get("outer")), None)
        return training_steps(outer, exp) if outer else int(opts.get("outer_steps") or 1)
    return max((training_steps(t, exp) for t in exp.training), default=0)


def _nested_lines(exp: ir.Experiment, opts: dict) -> list[str]:
    """The nested schedule's outer steps, each one's inner loop and model-call bounds."""
    outer, inner = str(opts.get("outer")), str(opts.get("inner"))
    blocks = {t.role: t for t in exp.training}
    steps = training_steps(blocks[outer], exp) if outer in blocks else int(opts.get("outer_steps") or 1)
    games = {g.name: g for g in exp.games}

    def calls(g: ir.Game) -> str:
        return ", ".join(f"{r} ≤ {c}" for r, c in g.call_bounds.items()) + " per session"

    skip = {opts.get("practice"), opts.get("evaluate")}
    chosen = opts.get("games")
    outer_games: list[str] = chosen if isinstance(chosen, list) else [
        g.name for g in exp.games if g.name not in skip and outer in g.call_bounds]
    grounded = (opts.get("outer_reward") or "grounded") == "grounded"
    out = [f"  {steps} outer step(s); each updates {outer} once{', after its inner loop' if grounded else ''}; "
           + "; ".join(f"{n}: {calls(games[n])}" for n in outer_games if n in games)]
    if not grounded:
        out.append(f"  outer reward: the games' own (intrinsic); no inner loop, {inner} not trained")
        return out
    k, r, n = int(opts.get("datasets") or 1), int(opts.get("copies") or 1), int(opts.get("inner_steps") or 1)
    extra, m = int(opts.get("extra_inner_steps") or 0), int(opts.get("reward_questions") or 1)
    practice, evaluate = games.get(opts.get("practice") or ""), games.get(opts.get("evaluate") or "")
    # an inner step's sessions: the lowered inner phase's (an IR written before it: one group)
    per_step = exp.inner_phase.batch if exp.inner_phase is not None else (practice.group_size if practice else 1)
    longer = f" ({n + extra} after a promotion)" if extra else ""
    out.append(f"  inner loop: {k} dataset(s) × {r} copies of {inner} × {n} step(s){longer} = "
               f"{k * r * n}{f'-{k * r * (n + extra)}' if extra else ''} inner update(s) per outer step, "
               f"{per_step} session(s) each"
               + (f"; {practice.name}: {calls(practice)}" if practice is not None else ""))
    out.append(f"  accuracy: {1 + k * r} × {m} reward question(s) per outer step (the baseline and each copy)"
               + (f"; {evaluate.name}: {calls(evaluate)}" if evaluate is not None else ""))
    out.append(f"  promotion: moving average over {opts.get('promotion_window') or 1} step(s) of the mean outer "
               f"reward > {opts.get('promotion_threshold') or 0}: the best dataset's median copy becomes {inner}")
    return out
