"""RingBuffer and PasoDoble's offline question buffer (pasodoble.txt §3.6, Alg. 2, App. D)."""

from __future__ import annotations

import pytest

from reference_buffers import (
    BufferEmpty,
    EvictionRule,
    QuestionBuffer,
    RingBuffer,
    ValidityFilter,
)

# ----------------------------------------------------------------- RingBuffer


def test_ring_buffer_evicts_oldest():
    rb = RingBuffer[int](3)
    assert [rb.append(k) for k in range(3)] == [None, None, None]
    assert rb.full and list(rb) == [0, 1, 2]
    assert rb.append(3) == 0
    assert rb.append(4) == 1
    assert list(rb) == [2, 3, 4] and len(rb) == 3
    assert rb.oldest() == 2 and rb.newest() == 4 and rb[1] == 3 and rb[-2] == 3
    with pytest.raises(IndexError):
        rb[3]
    rb.clear()
    assert len(rb) == 0 and list(rb) == []


def test_ring_buffer_rejects_zero_capacity():
    with pytest.raises(ValueError):
        RingBuffer(0)


# ----------------------------------------------------------------- validity filter

@pytest.mark.parametrize("p,valid,retain", [
    (0.0, False, False), (1 / 6, False, False), (0.2, False, False),
    (2 / 6, True, True), (5 / 6, True, True), (1.0, True, False),
])
def test_validity_filter(p, valid, retain):
    f = ValidityFilter()  # tau_low = 0.2
    assert f.valid(p) is valid
    assert f.retain(p) is retain and f(p) is retain


# ----------------------------------------------------------------- QuestionBuffer

def filled(n: int, eviction=None, capacity=None, p=0.5) -> QuestionBuffer:
    buf = QuestionBuffer(capacity=capacity, eviction=eviction)
    for k in range(n):
        buf.add(f"q{k}", f"a{k}", p)
    return buf


def test_circular_replay():
    buf = filled(3)
    assert [buf.next().question for _ in range(7)] == ["q0", "q1", "q2", "q0", "q1", "q2", "q0"]


def test_new_questions_join_the_cycle():
    buf = filled(2)
    assert buf.next().question == "q0"
    buf.add("q2", "a2", 0.5)
    assert [buf.next().question for _ in range(4)] == ["q1", "q2", "q0", "q1"]


def test_next_batch_wraps_without_repeats_in_one_batch():
    buf = filled(5)
    assert [q.question for q in buf.next_batch(3)] == ["q0", "q1", "q2"]
    assert [q.question for q in buf.next_batch(3)] == ["q3", "q4", "q0"]
    assert [q.question for q in buf.next_batch(10)] == ["q1", "q2", "q3", "q4", "q0"]


def test_empty_buffer_stops_the_solver_phase():
    buf = QuestionBuffer()
    assert buf.empty and buf.next_batch(4) == []
    with pytest.raises(BufferEmpty):
        buf.next()


def test_entries_carry_algorithm_2_fields():
    buf = QuestionBuffer()
    item = buf.add("q", "a", 0.5)
    assert (item.used, item.prev_acc, item.peak) == (0, 0.5, 0.5)


def test_no_eviction_by_default():
    buf = filled(1)
    item = buf.next()
    for _ in range(10):
        assert buf.record(item.id, 1.0) is False
    assert len(buf) == 1 and buf.next().used == 10


def test_evict_when_solver_is_100_percent_correct():
    buf = filled(2, eviction=True)
    item = buf.next()
    assert buf.record(item.id, 5 / 6) is False
    assert buf.record(item.id, 1.0) is True
    assert [q.question for q in buf] == ["q1"]
    assert buf.evicted == [(item.id, "solved")]


def test_evict_after_c_attempts_without_a_new_peak():
    """App. D: pass rate has not risen above its peak in the last c = 3 attempts. The peak
    starts at the proposer-phase pass rate (prev_acc, Alg. 2 line 19)."""
    buf = filled(1, eviction=EvictionRule(c=3), p=3 / 6)
    item = buf.next()
    assert buf.record(item.id, 2 / 6) is False   # 1 without a new peak (peak 3/6)
    assert buf.record(item.id, 3 / 6) is False   # 2: equal is not an increase
    assert buf.record(item.id, 4 / 6) is False   # new peak: counter resets
    assert buf.record(item.id, 4 / 6) is False   # 1
    assert buf.record(item.id, 1 / 6) is False   # 2
    assert buf.record(item.id, 4 / 6) is True    # 3 -> evicted
    assert buf.empty and buf.evicted == [(item.id, "no_new_peak")]


def test_eviction_keeps_the_replay_order():
    buf = filled(4, eviction=True)
    batch = buf.next_batch(2)                  # q0, q1; cursor at q2
    assert buf.record(batch[1].id, 1.0) is True  # evict q1 (behind the cursor)
    assert [buf.next().question for _ in range(4)] == ["q2", "q3", "q0", "q2"]
    q3 = next(q for q in buf if q.question == "q3")
    assert buf.record(q3.id, 1.0) is True        # evict q3 (ahead of the cursor)
    assert [buf.next().question for _ in range(3)] == ["q0", "q2", "q0"]


def test_capacity_drops_oldest():
    buf = filled(5, capacity=3)
    assert [q.question for q in buf] == ["q2", "q3", "q4"]
    assert [reason for _, reason in buf.evicted] == ["capacity", "capacity"]
    assert buf.next().question == "q2"


def test_record_unknown_id_raises():
    buf = filled(1)
    with pytest.raises(KeyError):
        buf.record(99, 0.5)
