"""Which platforms a trace is for, as the runtime knows it: `transmuter.compile` traces for the
backend it runs on, `transmuter.export` for the platforms it is given. A lowering with a route
per platform (`platform_dependent`) then traces only the route that will run, where JAX's
`lax.platform_dependent` traces every route and lowers one: ConvInteger's three routes made
tracing the real Kokoro's 87 integer convolutions cost 2.7 s. Outside the runtime (a user's
own `jax.jit` over `transmuter.run`) the platforms are unknown and every route is traced."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any

from jax import lax

_TARGETS: ContextVar[tuple[str, ...] | None] = ContextVar("transmuter_targets", default=None)


@contextlib.contextmanager
def tracing_for(platforms: Sequence[str]) -> Iterator[None]:
    """Trace, inside the block, for these platforms only ("cpu", "cuda", "rocm", "tpu")."""
    token = _TARGETS.set(tuple(platforms))
    try:
        yield
    finally:
        _TARGETS.reset(token)


def platform_dependent(*args: Any, default: Callable, **routes: Callable) -> Any:
    """`lax.platform_dependent(*args, default=..., **routes)`, tracing the one route of the
    platform being traced for when that is a single platform."""
    targets = _TARGETS.get()
    if targets is not None and len(targets) == 1:
        return routes.get(targets[0], default)(*args)
    return lax.platform_dependent(*args, default=default, **routes)
