"""Sizes that vary per call, rounded to buckets so that a task compiles a few programs."""

from __future__ import annotations


def pow2(size: int, smallest: int = 1) -> int:
    """The power of two at or above `size`, at least `smallest`."""
    return max(smallest, 1 << (size - 1).bit_length())


def batch_buckets(batch_size: int) -> list[int]:
    """The batch sizes a call of up to `batch_size` items rounds to: 1, 2, 4, ..., batch_size."""
    return sorted({min(1 << i, batch_size) for i in range((batch_size - 1).bit_length() + 1)})
