"""`compile`: a model as compiled segments, cached per input signature (see segments.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from transmuter import telemetry
from transmuter.errors import InputError
from transmuter.runtime.execute import as_output, x64_scope
from transmuter.runtime.segments import SegmentRunner, signature

EAGER_THRESHOLD = 20


class CompiledModel:
    """A callable `inputs -> outputs` running `model` as compiled programs.

    A graph whose shapes follow from its input shapes is one XLA program per input signature; a
    graph where a value decides a shape or a branch is split there (a graph break), the break
    node runs on the host, and compiling goes on after it. Programs are cached per segment start
    position, keeping the `cache_size` most recently used; segments shorter than
    `eager_threshold` nodes around a break run op by op instead of compiling.
    """

    def __init__(
        self,
        model,
        example_inputs: Mapping[str, Any],
        *,
        static_inputs: Mapping[str, Any] | None = None,
        cache_size: int = 8,
        cache_dir: str | os.PathLike | None = None,
        eager_threshold: int = EAGER_THRESHOLD,
    ):
        if cache_size < 1:
            raise ValueError(f"cache_size must be at least 1, got {cache_size}")
        self.model = model
        self.static_inputs = {
            name: np.asarray(model.check_input(name, value))
            for name, value in (static_inputs or {}).items()
        }
        if cache_dir is not None:
            use_persistent_cache(cache_dir)
        self.runner = SegmentRunner(model, cache_size=cache_size, eager_threshold=eager_threshold)
        self._data = frozenset(
            n for n in model.inputs if n not in self.static_inputs and not _is_string(model, n)
        )
        # Graphs with random operators draw from a key stream: a new key per call.
        self._keys = jax.random.key(0) if _has_random(model.plan) else None
        self._fast: tuple | None = None
        with telemetry.span("transmuter.compile", {"source": model.source}) as span:
            self(example_inputs)
            # A graph without nodes has no segment (its outputs are its inputs or constants).
            first = next(iter(self.runner.caches.get(0, {}).values()), None)
            span.stop_metadata["graph_break"] = first is not None and first.stop is not None
        # String inputs live on the host and key the segments by value: no fast path for them.
        strings = any(_is_string(model, n) for n in model.inputs)
        if first is not None and first.stop is None and first.program is not None and not strings:
            weights, varying = self.runner.reads(0)
            # Exactly the arguments the program was lowered with: inputs no node reads stay out.
            read_inputs = tuple(n for n in varying if n in self._data)
            signature = self._signature(self._arrays(example_inputs))
            self._fast = (signature, first, weights, read_inputs)

    @property
    def segments(self) -> list[tuple[int, int | str, bool]]:
        """The segment plan seen so far: (start position, stop position or "end", compiled)."""
        seen = {}
        for start, cache in sorted(self.runner.caches.items()):
            for segment in cache.values():
                stop = "end" if segment.stop is None else segment.stop
                seen[(start, stop, segment.program is not None)] = None
        return list(seen)

    def __call__(self, inputs: Mapping[str, Any], *, key: Any = None) -> dict[str, Any]:
        """Run on `inputs`. `key` seeds the random operators of this call; without it, calls
        draw from the callable's own key stream, so each call draws new values."""
        with telemetry.span("transmuter.call", {"source": self.model.source}):
            arrays = self._arrays(inputs)
            with x64_scope():
                if key is None and self._keys is not None:
                    self._keys, key = jax.random.split(self._keys)
                if self._fast is not None and self._signature(arrays) == self._fast[0]:
                    return self._run_fast(arrays, key)
                env: dict[str, Any] = dict(self.model.host_constants)
                env.update(self.model.device_constants)
                env.update(self.model.params)
                env.update(arrays)
                self.runner.run(env, self._data, key)
                return {name: as_output(env[name]) for name in self.model.outputs}

    def _arrays(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(inputs, Mapping):
            raise InputError(f"inputs must be a dict of name -> array; got {type(inputs).__name__}")
        arrays = self.model.check_inputs({**self.static_inputs, **inputs})
        for name in self.static_inputs:
            arrays[name] = np.asarray(arrays[name])
        return arrays

    def _signature(self, arrays: Mapping[str, Any]) -> tuple:
        return tuple(
            (k, _static_key(v) if k in self.static_inputs else signature(v))
            for k, v in arrays.items()
        )

    def _run_fast(self, arrays, key) -> dict[str, Any]:
        """A break-free graph at its compile-time signature: call the program, skip the cache."""
        _, segment, weights, read_inputs = self._fast
        args = dict(weights)
        args.update((n, arrays[n]) for n in read_inputs)
        produced = segment.program(args, None if key is None else jax.random.fold_in(key, 0))
        outputs = {}
        for name in self.model.outputs:
            for source in (
                produced,
                segment.host_outputs,
                args,
                self.static_inputs,
                self.model.host_constants,
            ):
                if name in source:
                    outputs[name] = as_output(source[name])
                    break
        return outputs


def _is_string(model, name: str) -> bool:
    return getattr(model.input_specs[name], "dtype", None) == np.dtype(object)


def _has_random(plan) -> bool:
    plans = [plan, *plan.subplans.values()]
    return any(step.opdef.random for p in plans for step in p.steps)


def _static_key(value: np.ndarray) -> Any:
    return (
        value.shape,
        value.dtype.str,
        value.tobytes() if value.dtype != object else tuple(value.ravel().tolist()),
    )


def use_persistent_cache(path: str | os.PathLike) -> None:
    """Persist compiled programs under `path` through JAX's persistent compilation cache (a
    process-wide setting), with no minimum compile time, so that a later process skips XLA."""
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    if jax.config.jax_compilation_cache_dir != path:
        from jax.experimental.compilation_cache import compilation_cache

        compilation_cache.reset_cache()
        jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
