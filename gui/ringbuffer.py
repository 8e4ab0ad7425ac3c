"""Fixed-capacity numpy ring buffer whose contents are always one contiguous slice.

Each value is written twice (at ``i`` and ``i + capacity``), so the newest ``n`` values
are ``data[start:start + n]`` with no copy: a chart can hand the view straight to
``setData`` at every redraw, however many points it holds.
"""

from __future__ import annotations

import numpy as np


class RingBuffer:
    def __init__(self, capacity: int, dtype=np.float64) -> None:
        if capacity < 1:
            raise ValueError(f"ring buffer capacity must be 1 or more (got {capacity})")
        self.capacity = capacity
        self._data = np.zeros(2 * capacity, dtype=dtype)
        self._next = 0  # write position in [0, capacity)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def append(self, value: float) -> None:
        self._data[self._next] = value
        self._data[self._next + self.capacity] = value
        self._next = (self._next + 1) % self.capacity
        self._size = min(self._size + 1, self.capacity)

    def extend(self, values) -> None:
        values = np.asarray(values, dtype=self._data.dtype).ravel()
        values = values[-self.capacity :]  # older ones would be overwritten anyway
        while len(values):
            # a block write may cross the wrap point: write up to it, then go round
            pos = self._next
            block = values[: self.capacity - pos]
            self._data[pos : pos + len(block)] = block
            self._data[pos + self.capacity : pos + self.capacity + len(block)] = block
            self._next = (pos + len(block)) % self.capacity
            self._size = min(self._size + len(block), self.capacity)
            values = values[len(block) :]

    def clear(self) -> None:
        self._next = 0
        self._size = 0

    def view(self) -> np.ndarray:
        """The values, oldest first, as a read-only view (valid until the next write)."""
        start = (self._next - self._size) % self.capacity
        out = self._data[start : start + self._size]
        out.flags.writeable = False
        return out
