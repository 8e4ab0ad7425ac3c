import numpy as np
import pytest

from gui.ringbuffer import RingBuffer


def test_append_keeps_order_before_wrap():
    rb = RingBuffer(4)
    for v in (1, 2, 3):
        rb.append(v)
    assert len(rb) == 3
    assert rb.view().tolist() == [1, 2, 3]


def test_append_wraps_and_keeps_newest():
    rb = RingBuffer(4)
    for v in range(10):
        rb.append(v)
    assert len(rb) == 4
    assert rb.view().tolist() == [6, 7, 8, 9]


def test_extend_across_the_wrap_point():
    rb = RingBuffer(5)
    rb.extend([0, 1, 2])
    rb.extend([3, 4, 5, 6])
    assert rb.view().tolist() == [2, 3, 4, 5, 6]


def test_extend_longer_than_capacity_keeps_tail():
    rb = RingBuffer(3)
    rb.append(-1)
    rb.extend(np.arange(10))
    assert rb.view().tolist() == [7, 8, 9]


def test_view_is_contiguous_and_read_only():
    rb = RingBuffer(3)
    rb.extend([1, 2, 3, 4])
    view = rb.view()
    assert view.flags.c_contiguous
    with pytest.raises(ValueError):
        view[0] = 0


def test_clear_empties():
    rb = RingBuffer(3)
    rb.extend([1, 2])
    rb.clear()
    assert len(rb) == 0
    assert rb.view().tolist() == []
    rb.append(5)
    assert rb.view().tolist() == [5]


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity"):
        RingBuffer(0)
