"""The hf prefix cache's matching, bounds and invalidation, on small hand-made tensors."""

from __future__ import annotations

import torch

from askspec.runtime.backends.hf_prefix import PrefixCache, common_prefix


def _kv(n: int, layers: int = 2) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-layer keys/values [heads=1, n, dim=2] (8 bytes a token a tensor)."""
    return [torch.zeros(1, n, 2) for _ in range(layers)], [torch.zeros(1, n, 2) for _ in range(layers)]


def _cache(**kw) -> PrefixCache:
    return PrefixCache(**{"max_entries": 8, "max_bytes": 1 << 20, "min_tokens": 2, **kw})


def test_common_prefix():
    assert common_prefix([], [1, 2]) == 0
    assert common_prefix([1, 2, 3], [2, 2, 3]) == 0
    assert common_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix((1, 2, 3), (1, 2, 3, 4, 5)) == 3
    assert common_prefix([1, 2, 3, 9, 5], [1, 2, 3, 4, 5]) == 3
    assert common_prefix([1, 9], [1, 2]) == 1
    for cut in range(0, 40):  # every divergence point of a long sequence
        a = list(range(40))
        b = a[:cut] + [-1] + a[cut + 1:]
        assert common_prefix(a, b) == cut


def test_lookup_takes_the_longest_common_prefix_and_leaves_the_last_token_to_feed():
    cache = _cache()
    cache.store([1, 2, 3, 4], *_kv(4))
    cache.store([1, 2, 7, 8, 9, 10], *_kv(6))
    entry, n = cache.lookup([1, 2, 3, 4, 5, 6])
    assert (entry.ids, n) == ((1, 2, 3, 4), 4)
    entry, n = cache.lookup([1, 2, 7, 8, 9, 11])
    assert (entry.ids, n) == ((1, 2, 7, 8, 9, 10), 5)
    # a prompt equal to a cached sequence still feeds its last token (its logits are needed)
    entry, n = cache.lookup([1, 2, 3, 4])
    assert (entry.ids, n) == ((1, 2, 3, 4), 3)
    assert cache.lookup([5, 6, 7]) == (None, 0)
    assert (cache.hits, cache.misses) == (3, 1)


def test_a_common_prefix_below_min_tokens_is_a_miss():
    cache = _cache(min_tokens=3)
    cache.store([1, 2, 3, 4], *_kv(4))
    assert cache.lookup([1, 2, 9, 9]) == (None, 0)
    assert cache.lookup([1, 2, 3, 9])[1] == 3
    assert not cache.store([1, 2], *_kv(2))  # too short to be reused ever
    assert len(cache) == 1


def test_an_extended_sequence_replaces_the_entry_it_extends():
    cache = _cache()
    cache.store([1, 2, 3], *_kv(3))
    cache.store([5, 6, 7], *_kv(3))
    cache.store([1, 2, 3, 4, 5], *_kv(5))  # the next turn of the first conversation
    assert sorted(e.ids for e in cache._entries.values()) == [(1, 2, 3, 4, 5), (5, 6, 7)]
    assert cache.nbytes == 2 * 2 * 8 * (5 + 3)


def test_bounded_by_entries_least_recently_used_first():
    cache = _cache(max_entries=2)
    cache.store([1, 1, 1], *_kv(3))
    cache.store([2, 2, 2], *_kv(3))
    cache.lookup([1, 1, 1, 5])  # touches the first: the second is now the oldest
    cache.store([3, 3, 3], *_kv(3))
    assert sorted(e.ids for e in cache._entries.values()) == [(1, 1, 1), (3, 3, 3)]
    assert cache.evictions == 1


def test_bounded_by_bytes():
    per_token = 2 * 2 * 8  # layers x (keys, values) x bytes
    cache = _cache(max_bytes=10 * per_token)
    cache.store([1] * 4, *_kv(4))
    cache.store([2] * 4, *_kv(4))
    cache.store([3] * 4, *_kv(4))  # 12 tokens > 10: the oldest goes
    assert sorted(e.ids[0] for e in cache._entries.values()) == [2, 3]
    assert cache.nbytes == 8 * per_token <= cache.max_bytes
    assert not cache.store([4] * 11, *_kv(11))  # larger than the whole bound: not kept
    assert len(cache) == 2


def test_clear_and_a_weight_change_empty_it():
    cache = _cache()
    cache.check_weights(0)
    cache.store([1, 2, 3], *_kv(3))
    cache.check_weights(0)  # same weights version: kept
    assert len(cache) == 1
    cache.check_weights(1)
    assert len(cache) == 0 and cache.nbytes == 0
    cache.store([1, 2, 3], *_kv(3))
    cache.clear()
    assert len(cache) == 0 and cache.lookup([1, 2, 3, 4]) == (None, 0)

