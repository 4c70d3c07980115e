"""The training contract of a trajectory (runtime/scoring/trajectory.py), by hand."""

from askspec.runtime.scoring.trajectory import trained_turns, trajectory_return

ROWS = [("q", None, "final", 1.0), ("q", 0, "shaping", -0.8), ("q", 3, "shaping", 0.8), ("j", None, "x", 5.0),
        ("q", None, "penalty", -0.05)]


def test_terminal_plus_own_turns() -> None:
    assert trajectory_return(ROWS, "q") == 1.0 - 0.8 + 0.8 - 0.05  # the whole conversation
    assert trajectory_return(ROWS, "q", turns=[3]) == 1.0 + 0.8 - 0.05  # one reply of a sample
    assert trajectory_return(ROWS, "j") == 5.0


def test_routed_score_replaces_and_no_reward_is_none() -> None:
    assert trajectory_return(ROWS, "q", routed=0.25) == 0.25
    assert trajectory_return(ROWS, "nobody") is None
    assert trajectory_return([("q", 7, "s", 1.0)], "q", turns=[1, 2]) is None


def test_dropped_turns() -> None:
    assert trained_turns([0, 3, 5], "q", []) == [True, True, True]
    assert trained_turns([0, 3, 5], "q", [{"role": "q", "turns": [3]}, {"role": "j", "turns": None}]) == [True, False, True]
    assert trained_turns([0, 3], "q", [{"role": "q", "turns": None}]) == [False, False]
