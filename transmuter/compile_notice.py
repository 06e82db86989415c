"""A compile that runs long says so on stderr: what it compiles, for which shapes, and when it
is done. XLA:CPU takes from a second (a small model) to minutes (a UNet inside a diffusion
loop), and a call that waits that long without a word looks hung.

`slow_compile(describe)` wraps a call that may compile. If the call is still running
`NOTICE_AFTER_S` seconds in and `describe()` names something (it returns None when no compile
is under way, e.g. a jitted function whose trace counter did not move), one line goes to
stderr, and another with the total once the call returns. Nothing is printed for calls that
finish sooner; the cost is a timer thread per wrapped call, so it wraps calls that compile or
take seconds anyway (segments, the diffusion loop), not each decode step.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

NOTICE_AFTER_S = 5.0
# A segment after a graph break may read hundreds of tensors; the notice names the first few.
SHAPES_SHOWN = 4


@contextlib.contextmanager
def slow_compile(describe: Callable[[], str | None], after: float | None = None) -> Iterator[None]:
    after = NOTICE_AFTER_S if after is None else after
    began = time.perf_counter()
    said: list[str] = []

    def notice() -> None:
        what = describe()
        if what is not None:
            said.append(what)
            _say(f"compiling {what} (over {after:g} s so far)")

    timer = threading.Timer(after, notice)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()  # a notice under way is printed before the total
        if said:
            _say(f"compiled {said[0]} in {time.perf_counter() - began:.1f} s")


def shapes(arrays: Mapping[str, Any]) -> str:
    """`name: dtype[d0, d1]` for the first SHAPES_SHOWN arrays (anything with .shape and
    .dtype), comma-separated, and how many more there are."""
    named = [
        f"{name}: {getattr(value, 'dtype', '?')}{list(getattr(value, 'shape', ()))}"
        for name, value in list(arrays.items())[:SHAPES_SHOWN]
    ]
    more = len(arrays) - SHAPES_SHOWN
    return ", ".join(named) + (f" and {more} more" if more > 0 else "")


def _say(line: str) -> None:
    print(f"transmuter: {line}", file=sys.stderr, flush=True)
