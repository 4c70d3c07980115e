"""The researcher's view (issue #23): session variables as columns and filters, groups
that show what the trainer saw, the metrics dashboard and a comparison of two runs with
their settings and intervals — over GRPO runs written as the trainer writes them."""

from __future__ import annotations

import json
import re

import pytest

from askspec.tui import columns, data
from askspec.tui.app import AskspecApp
from askspec.tui.filters import parse_filter
from askspec.tui.numbers import number
from askspec.tui.screens import sessions
from askspec.tui.screens.run import RunScreen
from askspec.tui.screens.transcript import TranscriptScreen

from tui_helpers import build_grpo_run, screen_text, shows, type_text, wait_until

SIZE = (160, 40)
RUN_A = "20260102-030405-arith-grpo01"
RUN_B = "20260102-030406-arith-grpo02"


@pytest.fixture(scope="module")
def grpo_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("grpo") / "runs"
    build_grpo_run(out, RUN_A, stages=True)
    build_grpo_run(out, RUN_B, shift=0.1, seed=7, overrides={"lr": 1e-05})
    return out


async def _open(pilot, app, run_id: str = RUN_A) -> None:
    await wait_until(pilot, shows(app, "2 runs"))
    if run_id == RUN_B:
        await pilot.press("down")
    await pilot.press("enter")
    await wait_until(pilot, lambda: isinstance(app.screen, RunScreen) and "24 sessions" in screen_text(app)
                     and "reading rewards" not in screen_text(app), what="the sessions")


def _header(app) -> str:
    return next(line for line in screen_text(app).splitlines() if re.match(r"\s*#\s+session ", line))


# ------------------------------------------------------------ 2: session variables

def test_numbers_have_four_significant_digits_and_no_rounding_noise():
    assert number(-2.7755575615628914e-17) == "0"
    assert number(0.1 + 0.2) == "0.3"
    assert number(1234567.0) == "1.235e+06"
    assert number(-0.4, sign=True) == "-0.4"
    assert number(0.0, sign=True) == "+0"
    assert number(3) == "3" and number(None) == "-" and number(float("nan")) == "nan"


async def test_session_variables_step_and_item_are_columns_and_filters(grpo_runs):
    app = AskspecApp(grpo_runs, follow_interval=3600)
    async with app.run_test(size=SIZE) as pilot:
        await _open(pilot, app)
        head = _header(app)
        for col in ("step", "stage", "item", "correct", "has_box", "questions", "solver"):
            assert f" {col} " in head + " ", (col, head)
        assert "__step__" not in head and "var:item" not in head  # (the engine's keys, the bound item)
        # a variable, compared as a number, and the training step
        await pilot.press("slash")
        await type_text(pilot, "var:questions>3 step:2")
        await pilot.press("enter")
        await wait_until(pilot, shows(app, "3 sessions", "matching 'var:questions>3 step:2'"))
        text = screen_text(app)
        assert "s000015" in text and "s000019" in text and "s000023" in text and "s000003" not in text
        await pilot.press("home")  # (a key on the table: letters are keys again)
        app.screen.query_one("#filter").value = ""
        await pilot.press("slash")
        await type_text(pilot, "var:correct=true stage:warmup")
        await pilot.press("enter")
        await wait_until(pilot, shows(app, "1 session", "s000000"))
        assert "s000012" not in screen_text(app)  # (the same item in stage main)


async def test_letters_typed_after_a_filter_go_on_into_the_filter(grpo_runs, monkeypatch):
    # (typing on: however long this machine takes to show the rows; a pause ends it,
    # see test_tui_hardening)
    monkeypatch.setattr(sessions, "TYPING_PAUSE_S", 60.0)
    app = AskspecApp(grpo_runs, follow_interval=3600)
    async with app.run_test(size=SIZE) as pilot:
        await _open(pilot, app)
        await pilot.press("slash", *"step:1", "enter")
        await wait_until(pilot, shows(app, "12 sessions"))
        await pilot.press(*" Sfc")  # before: S reversed the sort, f followed, c opened the columns
        await pilot.pause(0.3)
        box = app.screen.query_one("#filter")
        assert box.value == "step:1 Sfc" and app.focused is box
        status = next(line for line in screen_text(app).splitlines() if "12 sessions" in line)
        assert "sorted by" not in status and isinstance(app.screen, RunScreen)
        await pilot.press("backspace", "backspace", "backspace", "backspace", "enter")
        await wait_until(pilot, shows(app, "12 sessions", "matching 'step:1'"))
        await pilot.press("down", "S")  # after a key on the table, S is the sort key again
        await wait_until(pilot, shows(app, "sorted by # ↓"))
        # a filter applied, a letter typed on (into the box), then escape out of the box:
        # keys are keys again (2: the groups tab)
        await pilot.press("slash", "enter")
        await wait_until(pilot, lambda: app.focused is not box, what="the table to take the focus")
        await pilot.press("z")
        await wait_until(pilot, lambda: app.focused is box, what="z typed into the box")
        await pilot.press("escape", "2")
        await wait_until(pilot, lambda: app.screen.query_one("#tabs").active == "tab-groups", what="the groups tab")
        assert box.value == "step:1z"


async def test_column_chooser_hides_adds_tokens_and_is_remembered_per_spec(grpo_runs):
    app = AskspecApp(grpo_runs, follow_interval=3600)
    async with app.run_test(size=SIZE) as pilot:
        await _open(pilot, app)
        assert " game " in _header(app) and "solver in" not in _header(app)
        await pilot.press("c")
        await wait_until(pilot, shows(app, "Columns of arith's runs"))
        await pilot.press("down", "space", "end", "space", "enter")  # game off, the token columns on
        await wait_until(pilot, lambda: "solver in" in _header(app), what="the token columns")
        head = _header(app)
        assert " game " not in head and "solver out" in head
        row = next(line for line in screen_text(app).splitlines() if "s000001" in line)
        assert " 21 " in row and " 5 " in row  # tokens in, out of that session's turn
    saved = json.loads(columns.prefs_file().read_text())
    assert saved["arith"] == {"hidden": ["game"], "tokens": True}
    # another run of the same spec opens with the same columns
    app = AskspecApp(grpo_runs, follow_interval=3600)
    async with app.run_test(size=SIZE) as pilot:
        await _open(pilot, app, RUN_B)
        await wait_until(pilot, lambda: "solver in" in _header(app), what="the remembered columns")
        assert " game " not in _header(app)


async def test_the_transcript_header_lists_the_sessions_variables(grpo_runs):
    app = AskspecApp(grpo_runs, follow_interval=3600)
    async with app.run_test(size=SIZE) as pilot:
        await _open(pilot, app)
        await pilot.press("down", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, TranscriptScreen) and "vars:" in screen_text(app),
                         what="the transcript")
        text = screen_text(app)
        assert "step 1" in text and "stage warmup" in text
        assert "correct=false" in text and "has_box=true" in text and "questions=2" in text
        assert "__step__" not in text
        assert 'params: item={"id": "p0"' in text and "vars: item=" not in text  # (the item said once)


def test_var_filters_compare_text_numbers_and_missing_values(grpo_runs):
    src = data.Source(grpo_runs)

    def ids(text: str) -> list[str]:
        return data.sessions_table(src, RUN_A, parse_filter(text)).column("session").to_pylist()

    assert len(ids("var:questions=2")) == 6 and len(ids("var:questions!=2")) == 18
    assert ids("var:s=*{0}") == ["s000000", "s000012"]  # (a wildcard over the text)
    assert ids("var:nothing=-") == ids("") and ids("var:nothing!=-") == []
    assert len(ids("step:2..")) == 12 and len(ids("var:questions<=1 step:..1")) == 3


# ------------------------------------------------------------------- 3: groups

def test_group_advantages_are_the_trainers():
    torch = pytest.importorskip("torch")
    from askspec.runtime.train.advantages import ESTIMATORS, advantages
    from askspec.tui.shaping import group_advantages

    groups = [[1.0, 0.5, 0.5, 0.0], [-0.4] * 4, [0.1, 0.2, -0.3, 0.0], [0.7]]
    flat = [r for g in groups for r in g]
    ids = torch.tensor([i for i, g in enumerate(groups) for _ in g])
    for est in ESTIMATORS:
        if est in ("reinforce", "reinforce_baseline"):
            continue  # (whitened over the whole batch: the screen shows them before it)
        for std in ("sample", "population"):  # (Reasoning Arena divides by the population std)
            want = advantages(est, torch.tensor(flat), ids, std=std).tolist()
            got = [a for g in groups for a in group_advantages(est, g, std)]
            assert got == pytest.approx(want, abs=1e-5), (est, std)
    # the two differ where the estimator divides by the std
    assert group_advantages("grpo", groups[0], "population") != pytest.approx(group_advantages("grpo", groups[0]))


async def test_groups_show_members_rewards_mean_std_and_advantages(grpo_runs):
    app = AskspecApp(grpo_runs, follow_interval=3600)
    async with app.run_test(size=SIZE) as pilot:
        await _open(pilot, app)
        await pilot.press("2")
        await wait_until(pilot, shows(app, "solve-t000002-e002", "advantage: grpo"), what="the groups")
        text = screen_text(app)
        # before: "route none  mean -  var -" and "rewards: count 0" beside four rewards
        assert "count 0" not in text
        assert "solver: count 4, mean 0.5, std 0.4082, min 0, max 1" in text
        assert "no route: the game routes no group, so the trainer keeps every member" in text
        row = next(line for line in text.splitlines() if "s000000" in line)
        assert row.split()[-2:] == ["1", "1.224"]  # final reward, advantage (4 significant digits)
        await pilot.press("down")  # the group whose rewards are all -0.4
        await wait_until(pilot, shows(app, "every advantage is 0"))
        await pilot.press("down")  # rewards that cancel: mean 0, not -2.77556e-17
        await wait_until(pilot, shows(app, "s000010"))
        text = screen_text(app)
        assert "e-17" not in text and "mean 0, std 0.216" in text
        table = next(line for line in text.splitlines() if line.lstrip().startswith("solve-t000001-e002"))
        assert table.split()[:7] == ["solve-t000001-e002", "1", "4", "0", "0.216", "none", "solver"]


# ------------------------------------------------------------------ 4: metrics

async def test_metrics_dashboard_key_curves_first_bookkeeping_behind_b(grpo_runs):
    app = AskspecApp(grpo_runs, follow_interval=3600)
    async with app.run_test(size=SIZE) as pilot:
        await _open(pilot, app)
        await pilot.press("3")
        await wait_until(pilot, shows(app, "solver: reward mean ± std", "other series"), what="the dashboard")
        text = screen_text(app)
        # the key curves in one grid, in this order, reward with its ± std lines
        order = [text.index(t) for t in ("solver: reward mean ± std", "solver: loss", "solver: kl",
                                         "solver: grad norm", "solver: zero-advantage share", "solver: tokens / s")]
        assert order == sorted(order)
        first = next(line for line in text.splitlines() if "reward mean ± std" in line)
        assert "solver: loss" in first and "solver: kl" in first  # (side by side, not 21 plots in a column)
        assert "+std" in text and "-std" in text
        assert "policy_version" not in text and "over steps" not in text
        # the declared metrics: one table with n and a 95 % interval (Wilson for 2 of 24, 10 of 24)
        assert "accuracy" in text and "0.08333  24  0.02316 … 0.2585" in text
        assert "0.4167  24  0.2447 … 0.6117" in text
        # keyboard scrolling works on first focus (before: only after Tab twice)
        pane = app.screen.query_one("#metrics-pane")
        assert app.focused is pane
        await pilot.resize_terminal(160, 20)  # (a page that does not hold it all)
        await pilot.pause(0.2)
        await pilot.press("pagedown")
        await wait_until(pilot, lambda: pane.scroll_y > 0, what="PageDown to scroll")
        await pilot.press("b", "end")
        await wait_until(pilot, shows(app, "solver: policy_version"), what="the other series")
        assert "solver: step" not in screen_text(app)  # (the x axis, not a curve)


def test_intervals_wilson_t_and_bootstrap():
    from askspec.tui import stats

    iv = stats.wilson(4, 4)  # 4 of 4: not "1 ± 0"
    assert round(iv.lo, 4) == 0.5101 and iv.hi == 1.0
    iv = stats.t_interval([1.0, 0.5, 0.5, 0.0])  # mean 0.5, s 0.4082, t(3) 3.182
    assert round(iv.lo, 3) == -0.150 and round(iv.hi, 3) == 1.150
    assert stats.mean_interval([1.0]) is None
    assert stats.Interval(0, 1, "t").overlaps(stats.Interval(0.9, 2, "t"))
    assert not stats.Interval(0, 1, "t").overlaps(stats.Interval(1.1, 2, "t"))


# ------------------------------------------------------------------ 5: compare

async def test_compare_shows_settings_diff_intervals_and_overlaid_curves(grpo_runs):
    app = AskspecApp(grpo_runs, follow_interval=3600)
    async with app.run_test(size=(160, 60)) as pilot:
        await wait_until(pilot, shows(app, "2 runs"))
        await pilot.press("space", "down", "space", "c")
        await wait_until(pilot, shows(app, "training curves, A and B overlaid", "boxed_rate"), what="the comparison")
        lines = screen_text(app).splitlines()

        def row(start: str) -> list[str]:
            return next(line for line in lines if line.lstrip().startswith(start)).split()

        # what differs between the runs' settings, from their manifests: said at the top,
        # and row by row (those that differ first)
        assert "settings: 4 differ (spec hash, seed, profile, --set lr), listed below" in screen_text(app)
        assert row("seed") == ["seed", "0", "7", "≠"]
        assert row("--set lr") == ["--set", "lr", "-", "1e-05", "≠"]
        assert row("spec hash") == ["spec", "hash", "5eed5eed5eed", "ab12ab12ab12", "≠"]
        assert row("profile") == ["profile", "-", "cpu", "≠"]
        assert row("model solver") == ["model", "solver", "policy", "policy"]  # (the same: not marked)
        # n and a 95 % interval for each run, B - A and whether the intervals overlap
        assert row("mean reward solver") == ["mean", "reward", "solver", "0.03333", "24", "-0.1542", "…", "0.2208",
                                             "0.1333", "24", "-0.05417", "…", "0.3208", "0.1", "yes"]
        assert row("accuracy")[1:5] == ["0.08333", "24", "0.02316", "…"]
        # the key curves of both runs in one plot each
        assert "solver: reward mean" in screen_text(app) and "solver: loss" in screen_text(app)
        plots = [p for p in app.screen.query("TrainPlot")]
        assert {label for p in plots for label, _ in p.curve.lines} == {"A", "B"}
        reward = next(p for p in plots if p.curve.column == "reward_mean")
        assert [pts for _, pts in reward.curve.lines] == [[(1, 0.2), (2, 0.4)], [(1, 0.30000000000000004), (2, 0.5)]]
