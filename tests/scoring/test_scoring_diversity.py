"""Diversity rewards: PasoDoble Jaccard history (pasodoble.txt §3.3) and Ask-E embedding
k-NN bonus (ask_e.txt App. E)."""

from __future__ import annotations

import numpy as np
import pytest

from askspec.runtime.scoring.diversity import (
    EmbeddingDiversity,
    JaccardHistory,
    jaccard,
    token_set,
)

from paper_rewards import askE_bonus, ask_e_bonus  # noqa: E402  (tests/scoring/, the reference)

# ----------------------------------------------------------------- tokens & Jaccard


@pytest.mark.parametrize("text,expected", [
    ("What is 2+2?", {"what", "is", "2"}),
    ("Find x^2 = 4x", {"find", "x", "2", "4x"}),
    ("\\frac{1}{2} of THE the", {"frac", "1", "2", "of", "the"}),
    ("", set()),
    ("  ?!  ", set()),
    ("naïve café", {"naïve", "café"}),
])
def test_token_set(text, expected):
    assert token_set(text) == frozenset(expected)


@pytest.mark.parametrize("a,b,expected", [
    ("a b c", "a b c", 1.0),
    ("a b c", "d e f", 0.0),
    ("a b c d", "c d e f", 2 / 6),
    ("A b", "a B b", 1.0),         # case and repeats do not matter (sets)
    ("", "", 1.0),                 # two empty sets are identical
    ("", "a", 0.0),
    ({"x", "y"}, {"y"}, 0.5),      # token sets are accepted directly
])
def test_jaccard(a, b, expected):
    assert jaccard(a, b) == pytest.approx(expected)
    assert jaccard(b, a) == pytest.approx(expected)


# ----------------------------------------------------------------- PasoDoble history

def words(*ids):
    return " ".join(f"w{k}" for k in ids)


def test_empty_history_is_fully_novel():
    assert JaccardHistory().r_div("anything at all") == 1.0


def test_r_div_is_one_minus_share_of_similar_questions():
    h = JaccardHistory(capacity=100, tau_sim=0.3)
    for q in [words(0, 1, 2, 3), words(10, 11), words(20, 21), words(30, 31)]:
        h.add(q)
    # Jaccard with the first item is 3/5 = 0.6 > 0.3; with the others 0
    assert h.r_div(words(0, 1, 2, 9)) == pytest.approx(1 - 1 / 4)
    assert h.r_div(words(99)) == 1.0


def test_similarity_threshold_is_strict():
    # |A & B| = 3, |A | B| = 10 -> Jaccard exactly 0.3: not "exceeding" tau_sim.
    h = JaccardHistory(tau_sim=0.3)
    h.add(words(0, 1, 2, 3, 4, 5, 6))
    q = words(0, 1, 2, 7, 8, 9)
    assert jaccard(q, words(0, 1, 2, 3, 4, 5, 6)) == pytest.approx(0.3)
    assert h.r_div(q) == 1.0
    h2 = JaccardHistory(tau_sim=0.29)
    h2.add(words(0, 1, 2, 3, 4, 5, 6))
    assert h2.r_div(q) == 0.0


def test_history_keeps_only_the_most_recent_capacity_questions():
    h = JaccardHistory(capacity=100)
    h.add("the same question repeated")          # will be pushed out
    for k in range(100):
        h.add(words(1000 + k))
    assert len(h) == 100
    assert h.r_div("the same question repeated") == 1.0
    h.add("the same question repeated")
    assert h.r_div("the same question repeated") == pytest.approx(1 - 1 / 100)


def test_r_div_and_add_scores_before_adding():
    """Algorithm 1: r_div(q_i) is computed, then q_i joins H (so later questions of the
    same batch are compared with it, and q_i is never compared with itself)."""
    h = JaccardHistory()
    assert h.r_div_and_add("how many primes are below 100") == 1.0
    assert h.r_div_and_add("how many primes are below 100") == 0.0
    assert h.r_div_and_add("integrate sin x from 0 to pi") == pytest.approx(1 - 0 / 2)
    assert len(h) == 3


# ----------------------------------------------------------------- Ask-E embeddings

class FakeEmbedderTable:
    """Deterministic fake embedder: looks texts up in a table of fixed vectors."""

    def __init__(self, table: dict[str, list[float]]):
        self.table = {k: np.asarray(v, dtype=np.float32) for k, v in table.items()}
        self.calls = 0

    def __call__(self, texts):
        self.calls += 1
        return np.stack([self.table[t] for t in texts])


class FakeEmbedderHashed:
    """Deterministic fake embedder: a fixed random unit vector per text (seeded by its bytes)."""

    def __init__(self, dim: int = 16):
        self.dim = dim

    def __call__(self, texts):
        out = []
        for t in texts:
            rng = np.random.default_rng(list(t.encode()) or [0])
            out.append(rng.standard_normal(self.dim))
        return np.asarray(out, dtype=np.float32)


def unit(angle_deg: float) -> list[float]:
    a = np.deg2rad(angle_deg)
    return [float(np.cos(a)), float(np.sin(a))]


def test_empty_window_scores_alpha():
    d = EmbeddingDiversity(alpha=1.0, embed=FakeEmbedderTable({"q": [1, 0]}))
    assert d.score("q") == 1.0
    assert EmbeddingDiversity(alpha=0.5, embed=FakeEmbedderTable({"q": [1, 0]})).score("q") == 0.5


def test_bonus_is_alpha_times_one_minus_mean_knn_cosine():
    table = {f"a{k}": unit(10 * k) for k in range(8)}
    table["q"] = unit(0)
    d = EmbeddingDiversity(alpha=2.0, k=3, embed=FakeEmbedderTable(table))
    for k in range(8):
        d.add(f"a{k}")
    nearest = [np.cos(np.deg2rad(x)) for x in (0, 10, 20)]
    assert d.score("q") == pytest.approx(2.0 * (1 - np.mean(nearest)), abs=1e-6)


def test_window_smaller_than_k_averages_all_items():
    table = {"a": unit(0), "b": unit(90), "q": unit(0)}
    d = EmbeddingDiversity(k=5, embed=FakeEmbedderTable(table))
    d.add("a")
    d.add("b")
    assert d.score("q") == pytest.approx(1 - (1.0 + 0.0) / 2, abs=1e-6)


def test_score_and_add_scores_before_adding():
    d = EmbeddingDiversity(k=1, embed=FakeEmbedderTable({"q": [0, 1]}))
    assert d.score_and_add("q") == 1.0       # nothing before it
    assert d.score_and_add("q") == pytest.approx(0.0, abs=1e-6)  # exact repeat
    assert len(d) == 2


def test_sliding_window_drops_oldest():
    table = {"old": unit(0), "x": unit(90), "y": unit(180), "z": unit(270), "q": unit(0)}
    d = EmbeddingDiversity(k=1, window=3, embed=FakeEmbedderTable(table))
    d.add("old")
    assert d.score("q") == pytest.approx(0.0, abs=1e-6)
    for t in ("x", "y", "z"):
        d.add(t)
    assert len(d) == 3
    # "old" (cos 1) has left the window; the nearest is now x or z (cos 0)
    assert d.score("q") == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("window,k,n_items", [(50, 5, 30), (50, 5, 137), (7, 3, 7), (10, 1, 25)])
def test_ring_buffer_matches_brute_force(window, k, n_items):
    fake = FakeEmbedderHashed(dim=12)
    d = EmbeddingDiversity(alpha=1.0, k=k, window=window, embed=fake)
    texts = [f"question {n}" for n in range(n_items)]
    d.score_and_add_many(texts)
    recent = fake(texts[-window:])
    recent /= np.linalg.norm(recent, axis=1, keepdims=True)
    q = fake(["a new question"])[0]
    q /= np.linalg.norm(q)
    sims = np.sort(recent @ q)[::-1][: min(k, len(recent))]
    assert d.score("a new question") == pytest.approx(1 - sims.mean(), abs=1e-5)


def test_zero_embedding_does_not_produce_nan():
    d = EmbeddingDiversity(embed=FakeEmbedderTable({"a": [1, 0], "zero": [0, 0]}))
    d.add("a")
    assert d.score("zero") == pytest.approx(1.0)


def test_dimension_mismatch_raises():
    d = EmbeddingDiversity(embed=FakeEmbedderTable({"a": [1, 0], "b": [1, 0, 0]}))
    d.add("a")
    with pytest.raises(ValueError):
        d.add("b")


# ----------------------------------------------------------------- Ask-E gating

@pytest.mark.parametrize("outcome,diversity,expected", [
    ("calibrated", 0.4, 0.4),   # calibrated: diversity * max(1.0, 0)
    ("calibrated", 1.7, 1.7),
    ("too_easy", 0.4, 0.2 * 0.4),  # too easy: diversity * max(0.2, 0) (App. E's clipped product)
    ("too_hard", 0.4, 0.0),     # too hard: -0.2 clips to 0
    ("too_hard", 2.0, 0.0),
])
def test_ask_e_bonus_is_the_clipped_calibration_product(outcome, diversity, expected):
    assert ask_e_bonus(outcome, diversity) == pytest.approx(expected)
    assert askE_bonus(outcome, diversity) == pytest.approx(expected)


# ----------------------------------------------------------------- real MiniLM

@pytest.mark.slow
def test_minilm_paraphrase_scores_lower_diversity_than_unrelated_text():
    d = EmbeddingDiversity(alpha=1.0, k=2, window=100)  # real all-MiniLM-L6-v2, offline
    for q in [
        "How many positive integers less than 100 are divisible by 3 or 5?",
        "Count the integers below 100 that are multiples of 3 or of 5.",
        "What is the capital city of Australia?",
    ]:
        d.add(q)
    paraphrase = d.score("How many numbers under 100 are divisible by either 3 or 5?")
    unrelated = d.score("Describe the life cycle of a monarch butterfly.")
    assert 0.0 <= paraphrase < unrelated <= 2.0
    assert unrelated - paraphrase > 0.3


@pytest.mark.slow
def test_minilm_gives_unit_rows_with_the_process_torch_threads():
    """The embedder runs on the torch threads the process has (the setting is the
    process's: tests/commands/test_process_settings.py); the same rows at one thread."""
    torch = pytest.importorskip("torch")
    from askspec.runtime.scoring.diversity import MiniLMEmbedder

    before = torch.get_num_threads()
    texts = ["What is the sum of the first 10 primes?", "Name a prime number."]
    default = MiniLMEmbedder()(texts)
    assert torch.get_num_threads() == before
    torch.set_num_threads(1)
    try:
        single = MiniLMEmbedder()(texts)
    finally:
        torch.set_num_threads(before)
    assert default.shape == (2, 384) and default.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(default, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(single, default, atol=1e-5)
