"""Sizes that vary per call, rounded to buckets so that a task compiles a few programs, and
the bound on programs where a shape cannot be bucketed."""

from __future__ import annotations

import jax

# Every program XLA:CPU compiles holds its code in memory maps (about six), and a process past
# the kernel's limit (vm.max_map_count, 65,530 by default) crashes inside XLA's compiler.
PROGRAM_LIMIT = 1024


def pow2(size: int, smallest: int = 1) -> int:
    """The power of two at or above `size`, at least `smallest`."""
    return max(smallest, 1 << (size - 1).bit_length())


def batch_buckets(batch_size: int) -> list[int]:
    """The batch sizes a call of up to `batch_size` items rounds to: 1, 2, 4, ..., batch_size."""
    return sorted({min(1 << i, batch_size) for i in range((batch_size - 1).bit_length() + 1)})


class ProgramBudget:
    """For steps compiled at shapes no bucket bounds (a decoder whose past grows a token a
    step: a program per step, batch and encoder length, for as long as the process serves).
    `spend(programs)`, called before each generation with its owner's count of programs
    traced so far, drops every compiled program of the process (`jax.clear_caches()`) once
    `limit` more have been traced since the last drop; what is used again compiles again."""

    def __init__(self, limit: int = PROGRAM_LIMIT):
        self.limit = limit
        self.drops = 0
        self._since = 0

    def spend(self, programs: int) -> None:
        if programs - self._since >= self.limit:
            jax.clear_caches()
            self.drops += 1
            self._since = programs
