"""`compile`: a model as compiled segments, cached per input signature (see segments.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from transmuter import ir, telemetry
from transmuter.errors import InputError
from transmuter.runtime.buckets import Buckets, dim_parts
from transmuter.runtime.disk_cache import use_persistent_cache
from transmuter.runtime.execute import as_output, x64_scope
from transmuter.runtime.segments import SegmentRunner, signature
from transmuter.runtime.sharding import Placement

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
        buckets: Mapping[str, Any] | None = None,
        pad_values: Mapping[str, Any] | None = None,
        checks: bool = False,
        placement: Placement | None = None,
    ):
        if cache_size < 1:
            raise ValueError(f"cache_size must be at least 1, got {cache_size}")
        # On a mesh the programs run on the placed copy of the model (its weights on the mesh).
        self.placement = placement
        model = model if placement is None else placement.model
        self.model = model
        self.static_inputs = {
            name: np.asarray(model.check_input(name, value))
            for name, value in (static_inputs or {}).items()
        }
        if cache_dir is not None:
            use_persistent_cache(cache_dir)
        self.cache_size = cache_size
        self.eager_threshold = eager_threshold
        self.checks = checks
        self.runner = SegmentRunner(
            model, cache_size=cache_size, eager_threshold=eager_threshold, checks=checks
        )
        self._data = frozenset(
            n for n in model.inputs if n not in self.static_inputs and not _is_string(model, n)
        )
        if pad_values and not buckets:
            raise InputError("pad_values without buckets: there is nothing to pad")
        self.buckets = (
            Buckets(model, buckets, pad_values, inputs=[n for n in model.inputs if n in self._data])
            if buckets
            else None
        )
        self._example = self._arrays(example_inputs)
        self._padding_checked = False
        # Graphs with random operators draw from a key stream: a new key per call.
        self._keys = jax.random.key(0) if _has_random(model.plan) else None
        self._fast: tuple | None = None
        # The example's (name, dtype) in input order and its shapes: a call with arrays of those
        # dtypes may skip conversion, padding and the signature (`_given_shapes`).
        self._exact: tuple | None = None
        self._exact_shapes: tuple | None = None
        self._example_run: tuple | None = None
        with telemetry.span("transmuter.compile", {"source": model.source}) as span:
            outputs = self(example_inputs)
            # A graph without nodes has no segment (its outputs are its inputs or constants).
            first = next(iter(self.runner.caches.get(0, {}).values()), None)
            span.stop_metadata["graph_break"] = first is not None and first.stop is not None
        # The example's run answers the next call if that call gives the same inputs (a
        # pipeline's first call compiles on its own inputs): one model run less to the first
        # result. Not with random operators, where each call draws new values.
        snapshot = _snapshot(example_inputs)
        if self._keys is None and snapshot is not None:
            self._example_run = (snapshot, outputs)
        # String inputs live on the host and key the segments by value: no fast path for them.
        strings = any(_is_string(model, n) for n in model.inputs)
        if first is not None and first.stop is None and first.program is not None and not strings:
            weights, varying = self.runner.reads(0)
            # Exactly the arguments the program was lowered with: inputs no node reads stay out.
            read_inputs = tuple(n for n in varying if n in self._data)
            signature = self._signature(self._pad(self._example)[0])
            self._fast = (signature, first, weights, read_inputs)
            plain = self.buckets is None and placement is None and self._keys is None
            tensors = all(isinstance(v, _ARRAYS) for v in self._example.values())
            if plain and tensors and not self.static_inputs:
                self._exact = tuple((n, self._example[n].dtype) for n in model.inputs)
                self._exact_shapes = tuple(self._example[n].shape for n in model.inputs)

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
            example_run, self._example_run = self._example_run, None
            if example_run is not None and key is None and _same(inputs, example_run[0]):
                return example_run[1]
            if self._exact is not None and key is None:
                shapes = self._given_shapes(inputs)
                segment = None if shapes is None else self._whole_program(inputs, shapes)
                if segment is not None:
                    self.model.check_index_ranges(inputs)
                    with x64_scope():
                        return self._run_program(segment, inputs, None)
            given = self._arrays(inputs)
            arrays, padding, note = self._pad(given)
            if self.placement is not None:
                arrays = self.placement.inputs(arrays)
            if padding is not None and padding.exceeded:
                if telemetry.listening("transmuter.bucket.exceeded"):
                    metadata = {"source": self.model.source, "dims": padding.exceeded}
                    telemetry.emit("transmuter.bucket.exceeded", {"count": 1}, metadata)
            with x64_scope():
                if key is None and self._keys is not None:
                    self._keys, key = jax.random.split(self._keys)
                if self._fast is not None and self._signature(arrays) == self._fast[0]:
                    outputs = self._run_fast(arrays, key)
                else:
                    outputs = self._run(arrays, key, note)
                if padding is not None and padding.padded:
                    outputs = self.buckets.slice(outputs, padding)
                    if not self._padding_checked:
                        self._check_padding(given, outputs, padding)
                return outputs if self.placement is None else self.placement.outputs(outputs)

    def _check_padding(self, given, outputs, padding) -> None:
        """The first padded call is compared with the same call unpadded (one more compile,
        once), so that a model that sees its padding (a Shape output, an unmasked mean) is
        refused instead of answering wrongly. Graphs with random operators are not compared:
        their draws differ."""
        if self._keys is None:
            # A runner of its own, so that the exact shape takes no place in the cache.
            runner = SegmentRunner(
                self.model, cache_size=1, eager_threshold=self.eager_threshold, checks=self.checks
            )
            want = self._run(given, None, {"padding_check": True}, runner)
            for name in self.model.outputs:
                error = _mismatch(outputs[name], want[name])
                if error:
                    raise InputError(
                        f"buckets change output {name!r} ({error}) when padding "
                        f"{_describe(padding)}: the model sees the padding (its shapes, or "
                        "positions no mask hides); compile without buckets for those dims"
                    )
        self._padding_checked = True

    def _run(self, arrays, key, note, runner: SegmentRunner | None = None) -> dict[str, Any]:
        """Run through the segment cache. Call inside `x64_scope`."""
        env: dict[str, Any] = dict(self.model.host_constants)
        env.update(self.model.device_constants)
        env.update(self.model.params)
        env.update(arrays)
        (runner or self.runner).run(env, self._data, key, note)
        return {name: as_output(env[name]) for name in self.model.outputs}

    @property
    def signatures(self) -> list[dict[str, tuple[int, ...]]]:
        """The input shapes the first segment is compiled for, least recently used first (inputs
        it does not read left out): after buckets, what calls are padded to."""
        cache = self.runner.caches.get(0, {})
        return [{name: sig[0] for name, sig in shapes} for shapes, _ in cache]

    def warmup(self, shapes: Any = "buckets") -> int:
        """Compile ahead of traffic; returns how many signatures were warmed.

        `shapes`: "buckets" (every combination of the buckets' sizes, other dims as in the
        example inputs), a list of {dim name: size} (the same, for those sizes), or a list of
        input dicts. With `cache_dir` a later process warms from disk instead of compiling."""
        if isinstance(shapes, str):
            if shapes != "buckets":
                raise InputError(f"warmup takes 'buckets' or a list; got {shapes!r}")
            if self.buckets is None:
                raise InputError("warmup('buckets') needs compile(..., buckets=...)")
            shapes = self.buckets.combinations(self._example_dims())
        calls = [s if _is_inputs(self.model, s) else self._inputs_for(s) for s in shapes]
        distinct = {self._signature(self._pad(self._arrays(c))[0]) for c in calls}
        if len(distinct) > self.cache_size:
            raise ValueError(
                f"warmup would compile {len(distinct)} signatures but cache_size is "
                f"{self.cache_size}: the first would be evicted before traffic; compile with "
                f"cache_size={len(distinct)} or more"
            )
        for inputs in calls:
            shapes_in = {n: tuple(np.shape(v)) for n, v in inputs.items()}
            with telemetry.span(
                "transmuter.warmup", {"source": self.model.source, "shapes": shapes_in}
            ):
                self(inputs)
        return len(distinct)

    def _pad(self, arrays: dict[str, Any]):
        """`arrays` padded to their buckets, the padding, and what cache events say of it."""
        if self.buckets is None:
            return arrays, None, None
        padding = self.buckets.padding(arrays)
        if not padding.padded:
            return arrays, padding, None
        note = {
            "padded_from": {
                n: tuple(np.shape(arrays[n])) for n in self.buckets.inputs if n in arrays
            }
        }
        return self.buckets.pad(arrays, padding), padding, note

    def _example_dims(self) -> dict[str, int]:
        """The size of each named dim in the example inputs."""
        sizes = {}
        for name, value in self._example.items():
            spec = self.model.input_specs[name]
            for dim, size in zip(getattr(spec, "shape", None) or (), np.shape(value)):
                if isinstance(dim, ir.SymbolicDim):
                    sizes.setdefault(dim.name, size)
        return sizes

    def _inputs_for(self, dims: Mapping[str, int]) -> dict[str, Any]:
        """Inputs of the shapes `dims` gives (example sizes for the rest): the pad values, or
        zeros, of the example inputs' dtypes; static and string inputs as in the example."""
        if not isinstance(dims, Mapping):
            raise InputError(f"warmup shapes are dicts of dim name -> size; got {dims!r}")
        sizes = {**self._example_dims(), **dims}
        inputs = {}
        for name, value in self._example.items():
            if name not in self._data:
                inputs[name] = value
                continue
            shape = []
            for axis, dim in enumerate(self.model.input_specs[name].shape):
                parts = dim_parts(dim)
                if parts is None or any(isinstance(p, str) and p not in sizes for p in parts):
                    shape.append(np.shape(value)[axis])
                else:
                    shape.append(sum(p if isinstance(p, int) else sizes[p] for p in parts))
            fill = (self.buckets.pad_values if self.buckets else {}).get(name, 0)
            inputs[name] = np.full(shape, fill, np.asarray(value).dtype)
        return inputs

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

    def _given_shapes(self, inputs: Any) -> tuple | None:
        """The shapes of `inputs` when they are arrays of the model's inputs, each of its
        example's dtype, else None. The hot path of a cache-hit call: a program compiled for
        those shapes was compiled for a call that passed every check but the index ranges, so
        the call needs a few comparisons per input instead of conversion and checks."""
        if type(inputs) is not dict or len(inputs) != len(self._exact):
            return None
        shapes = []
        for name, dtype in self._exact:
            value = inputs.get(name)
            if not isinstance(value, _ARRAYS) or value.dtype != dtype:
                return None
            shapes.append(value.shape)
        return tuple(shapes)

    def _whole_program(self, inputs, shapes: tuple):
        """The compiled whole-graph segment for inputs of `shapes`: the compile-time one, or a
        cached one (a cache hit), or None."""
        if shapes == self._exact_shapes:
            return self._fast[1]
        _, _, _, read_inputs = self._fast
        if len(read_inputs) != len(self._exact):
            return None  # an input no node reads: only the full checks see its shape
        return self.runner.compiled_whole(tuple((n, signature(inputs[n])) for n in read_inputs))

    def _run_fast(self, arrays, key) -> dict[str, Any]:
        """A break-free graph at its compile-time signature: call the program, skip the cache."""
        return self._run_program(self._fast[1], arrays, key)

    def _run_program(self, segment, arrays, key) -> dict[str, Any]:
        """Call a break-free graph's program on `arrays`, checked inputs."""
        _, _, weights, read_inputs = self._fast
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


_ARRAYS = (np.ndarray, jax.Array)


def _is_string(model, name: str) -> bool:
    """Inputs that live on the host: string tensors, and maps whose values are strings."""
    spec = model.input_specs[name]
    if isinstance(spec, ir.MapType):
        spec = spec.value
    return getattr(spec, "dtype", None) == np.dtype(object)


def _mismatch(got: Any, want: Any) -> str:
    """What differs between a padded run's output and the unpadded one; "" when they agree
    within float rounding (padding may change the order of a few sums)."""
    if isinstance(want, list) or want is None:
        return "" if _same_structure(got, want) else "a different sequence"
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{got.dtype}{list(got.shape)} instead of {want.dtype}{list(want.shape)}"
    if want.dtype.kind not in "fc":
        return "" if np.array_equal(got, want) else "different values"
    wide_got, wide_want = got.astype(np.complex128), want.astype(np.complex128)
    finite = np.isfinite(wide_want)
    scale = float(np.abs(wide_want[finite]).max(initial=0.0))
    rtol = max(1e-4, 64 * float(np.finfo(want.dtype).eps))
    error = float(np.abs(wide_got - wide_want)[finite].max(initial=0.0))
    same_special = np.array_equal(wide_got[~finite], wide_want[~finite], equal_nan=True)
    if error <= rtol * max(scale, 1e-30) and same_special:
        return ""
    return f"max difference {error:.3g} against values up to {scale:.3g}"


def _same_structure(got: Any, want: Any) -> bool:
    if want is None or got is None:
        return got is want
    return len(got) == len(want) and all(not _mismatch(a, b) for a, b in zip(got, want))


def _describe(padding) -> str:
    return ", ".join(
        f"{d} {got} to {padded}" for d, (got, padded) in padding.sizes.items() if got != padded
    )


def _is_inputs(model, value: Any) -> bool:
    """Whether a warmup entry is an input dict (not a dict of dim sizes)."""
    return isinstance(value, Mapping) and bool(value) and set(value) <= set(model.inputs)


def _has_random(plan) -> bool:
    plans = [plan, *plan.subplans.values()]
    return any(step.opdef.random for p in plans for step in p.steps)


def _static_key(value: np.ndarray) -> Any:
    return (
        value.shape,
        value.dtype.str,
        value.tobytes() if value.dtype != object else tuple(value.ravel().tolist()),
    )


def _snapshot(inputs: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
    """Host copies of the inputs, which a caller may change in place after the call; None for
    inputs that are not arrays (sequences of tensors, maps)."""
    try:
        return {name: np.array(value, copy=True) for name, value in inputs.items()}
    except (TypeError, ValueError):
        return None


def _same(inputs: Any, snapshot: dict[str, np.ndarray]) -> bool:
    """Whether `inputs` holds what `snapshot` holds: the same names, dtypes, shapes and values."""
    if not isinstance(inputs, Mapping) or inputs.keys() != snapshot.keys():
        return False
    for name, kept in snapshot.items():
        try:
            given = np.asarray(inputs[name])
        except (TypeError, ValueError):  # not an array (a sequence of tensors): left to the call
            return False
        if given.dtype != kept.dtype or given.shape != kept.shape:
            return False
        if not np.array_equal(given, kept, equal_nan=given.dtype.kind in "fc"):
            return False
    return True
