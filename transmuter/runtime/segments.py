"""Graph breaks: running a graph as compiled segments split where a value decides a shape.

A segment starts at a node position and runs until the first node that needs, on the host, a
value only known inside the trace (HostValueNeeded), or to the end. The segment is traced once,
which finds where it stops; it is then compiled (or, when short and after a break, run eagerly).
The break node runs eagerly with concrete values, and the next segment starts after it, traced
for the shapes that resulted.

Segments are cached per start position under a key of the shapes and dtypes of the device values
they read and the values of the host values they read (static inputs, values a break made
concrete); each position keeps its `cache_size` most recently used entries.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax._src import util as jax_util  # JAX's staging caches have no public handle of their own

from transmuter import compile_notice, ir, telemetry
from transmuter.errors import HostValueNeeded, NodeError
from transmuter.lowering.platforms import tracing_for
from transmuter.runtime import trace_cache
from transmuter.runtime.analysis import graph_breaks
from transmuter.runtime.disk_cache import compile_lowered, guarded
from transmuter.runtime.execute import on_device, to_device
from transmuter.runtime.interpreter import Interpreter, Plan, is_host, to_host
from transmuter.runtime.xla_options import compiler_options

# Host results of a break node up to this many elements stay host values (shape-like values
# that later nodes may need on the host); larger ones become device values.
BREAK_HOST_RESULT_MAX_SIZE = 1024


@dataclass
class Segment:
    """A traced segment: where it stops, why, and how to run it."""

    start: int
    stop: int | None  # the break node's position; None when the segment runs to the end
    reason: str | None  # what value the break needs, e.g. "the If condition"
    host_outputs: dict[str, Any]  # host values the segment computes (constants of its key)
    host_values: list[str]  # host values the segment reads besides the model's constants
    program: Callable | None  # the compiled executable; None when the segment runs eagerly
    needed: str | None = None  # the input the break node needs on the host (HostValueNeeded)


class SegmentRunner:
    """Runs one model's main graph through cached segments."""

    def __init__(self, model, *, cache_size: int, eager_threshold: int, checks: bool = False):
        self.model = model
        # checks: every segment compiles under checkify and raises for out-of-range indices.
        self.checks = checks
        self.plan: Plan = model.plan
        self.cache_size = cache_size
        self.eager_threshold = eager_threshold
        self.caches: dict[int, OrderedDict[tuple, Segment]] = {}
        self.reads_after = ReadsAfter(self.plan)
        self._reads: dict[int, tuple[dict[str, Any], tuple[str, ...]]] = {}
        self.data: frozenset[str] = frozenset()
        # Threads share the caches: the lock guards them, and a key being compiled has a future
        # that later threads wait on, so each key compiles once.
        self._lock = threading.Lock()
        self._building: dict[tuple[int, tuple], Future] = {}
        self._hints: tuple[frozenset[str], dict[str, tuple[str, ...]]] | None = None

    def run(
        self,
        env: dict[str, Any],
        data: frozenset[str],
        key: Any = None,
        note: Mapping[str, Any] | None = None,
    ) -> None:
        """Run every node, updating `env` (name -> value) in place. Call inside `x64_scope`.

        `data` names the inputs that are device values even while they are still numpy arrays
        (compiled programs take numpy directly; they move to the device only where a node runs
        eagerly). `key` is the call's PRNG key (None for graphs without random operators); each
        segment and break draws from it folded with its position, so no two draw alike. `note`
        is added to the call's cache events (the shapes a call had before buckets padded it)."""
        self.data = data
        start = 0
        steps = self.plan.steps
        while start < len(steps):
            segment_key = _fold(key, start)
            segment, device_args = self.segment(start, env, segment_key, note)
            if segment.program is not None:
                env.update(segment.program(device_args, segment_key))
                env.update(segment.host_outputs)
            else:
                self._inputs_to_device(env)
                interpreter = Interpreter(self.plan, segment_key)
                for position in range(start, _end(segment, len(steps))):
                    interpreter.step(steps[position], env)
            if segment.stop is None:
                return
            self._inputs_to_device(env)
            _keep_decision_on_host(env, self.plan.steps[segment.stop].node, segment.needed)
            self.run_break(segment.stop, env, _fold(key, segment.stop))
            start = self._concatenate_after_break(segment.stop + 1, env)

    def _concatenate_after_break(self, position: int, env: dict[str, Any]) -> int:
        """Run the ConcatFromSequence steps right after a break that read a sequence the break
        made, and put their results on the device; returns the position after them.

        A Loop that builds a sequence of tensors of data-dependent lengths (torch.onnx's
        repeat_interleave: one tensor per token, as long as its duration) leaves a host list at
        the break. Read by the next segment, the list would key that segment by its contents,
        a program per duration pattern; concatenated here, the segment is keyed by the total
        length only."""
        steps = self.plan.steps
        while position < len(steps):
            node = steps[position].node
            if node.op_type != "ConcatFromSequence" or not isinstance(
                env.get(node.inputs[0]), list
            ):
                break
            Interpreter(self.plan).step(steps[position], env)
            env[node.outputs[0]] = on_device(env[node.outputs[0]])  # strings stay on the host
            position += 1
        return position

    def compiled_whole(self, shapes: tuple) -> Segment | None:
        """The cached program of the whole graph for device arguments of these (name,
        signature) pairs and no host values, marked most recently used; None where there is
        none (not compiled yet, evicted, or a graph break at those shapes)."""
        cache_key = (shapes, ())
        with self._lock:
            cache = self.caches.get(0)
            segment = None if cache is None else cache.get(cache_key)
            if segment is None or segment.stop is not None or segment.program is None:
                return None
            cache.move_to_end(cache_key)
        if telemetry.listening("transmuter.cache.hit"):
            metadata = {"source": self.model.source, "position": 0, "shapes": list(shapes)}
            telemetry.emit("transmuter.cache.hit", {"count": 1}, metadata)
        return segment

    def static_hints(self) -> dict[str, tuple[str, ...]]:
        """Break node -> the model inputs that, made static, would remove that break (graph
        analysis, `Model.graph_breaks`), for the inputs this runner takes as data."""
        static = frozenset(n for n in self.model.inputs if n not in self.data)
        if self._hints is None or self._hints[0] != static:
            found = {b.node: b.static for b in graph_breaks(self.model, static) if b.static}
            self._hints = (static, found)
        return self._hints[1]

    def _inputs_to_device(self, env: dict[str, Any]) -> None:
        for name in self.data:
            if is_host(env.get(name)):
                env[name] = on_device(env[name])

    def segment(
        self,
        start: int,
        env: Mapping[str, Any],
        key: Any = None,
        note: Mapping[str, Any] | None = None,
    ) -> tuple[Segment, dict[str, Any]]:
        """The cached segment starting at `start` for the values in `env`, and its arguments.
        Compiled once per key, whichever threads ask for it at once."""
        weights, varying = self.reads(start)
        device_args = dict(weights)
        shapes, host_digests = [], []
        for name in varying:
            if name in env:
                value = env[name]
                if is_host(value) and (name not in self.data or _holds_strings(value)):
                    host_digests.append((name, _digest(value)))
                else:
                    device_args[name] = value
                    shapes.append((name, signature(value)))
        cache_key = (tuple(shapes), tuple(host_digests))
        metadata = {
            "source": self.model.source,
            "position": start,
            "shapes": shapes,
            **(note or {}),
        }
        with self._lock:
            cache = self.caches.setdefault(start, OrderedDict())
            segment = cache.get(cache_key)
            if segment is not None:
                cache.move_to_end(cache_key)
            pending = self._building.get((start, cache_key))
            builds = segment is None and pending is None
            if builds:
                pending = self._building[(start, cache_key)] = Future()
        if segment is not None or not builds:
            if telemetry.listening("transmuter.cache.hit"):
                waited = {} if segment is not None else {"waited_for_compile": True}
                telemetry.emit("transmuter.cache.hit", {"count": 1}, {**metadata, **waited})
            return (segment if segment is not None else pending.result()), device_args
        if telemetry.listening("transmuter.cache.miss"):
            telemetry.emit("transmuter.cache.miss", {"count": 1}, metadata)
        host_names = [name for name, _ in host_digests]
        try:
            segment = self.build(start, env, device_args, host_names, metadata, key, cache_key)
        except BaseException as exc:
            with self._lock:
                del self._building[(start, cache_key)]
            pending.set_exception(exc)
            raise
        with self._lock:
            cache[cache_key] = segment
            del self._building[(start, cache_key)]
            evicted = 0
            while len(cache) > self.cache_size:
                cache.popitem(last=False)  # dropping the executable frees it
                evicted += 1
        if evicted:
            _forget_traced_shapes()
        pending.set_result(segment)
        if evicted and telemetry.listening("transmuter.cache.evict"):
            evict_metadata = {**metadata, "cache_size": self.cache_size}
            for _ in range(evicted):
                telemetry.emit("transmuter.cache.evict", {"count": 1}, evict_metadata)
        return segment, device_args

    def reads(self, start: int) -> tuple[dict[str, Any], tuple[str, ...]]:
        """What the nodes from `start` on read: the weights (the same every call) and the sorted
        names of everything else, bar the model's host constants (these never change either)."""
        if start not in self._reads:
            weights = {**self.model.params, **self.model.device_constants}
            reads = self.reads_after[start]
            fixed = {n: weights[n] for n in reads if n in weights}
            varying = tuple(sorted(reads - set(weights) - set(self.model.host_constants)))
            self._reads[start] = (fixed, varying)
        return self._reads[start]

    def build(self, start, env, device_args, host_names, metadata, key, cache_key) -> Segment:
        host_env = {
            n: v for n, v in env.items() if is_host(v) and (n not in self.data or _holds_strings(v))
        }
        found: dict[str, Any] = {}

        def program(args, key):
            local = dict(host_env)
            local.update(args)
            before = set(local)
            interpreter = Interpreter(self.plan, key, self.plan.stageable)
            stop, reason = None, None
            for position in range(start, len(self.plan.steps)):
                try:
                    interpreter.step(self.plan.steps[position], local)
                except HostValueNeeded as exc:
                    stop, reason = position, exc.reason
                    found["needed"] = exc.input_name
                    break
            live = self.reads_after[stop] if stop is not None else self.reads_after[-1]
            produced = {n: local[n] for n in live if n in local and n not in before}
            found.update(stop=stop, reason=reason)
            found["host"] = {n: v for n, v in produced.items() if is_host(v)}
            return {n: v for n, v in produced.items() if not is_host(v)}

        fixed = self.reads(start)[0]
        varying = {n: v for n, v in device_args.items() if n not in fixed}
        source = self.model.source or "a model from memory"
        what = f"{source} from node {start} for {compile_notice.shapes(varying)}"
        platform = jax.default_backend()
        stored = None
        if trace_cache.folder() is not None and key is None and not self.checks:
            if _on_one_device(device_args):  # a mesh's programs carry their shardings
                stored = trace_cache.key(self.model, "segment", start, cache_key, platform)
        with (
            telemetry.span("transmuter.segment.compile", metadata) as span,
            compile_notice.slow_compile(lambda: what),
        ):
            # Timed apart: tracing is our graph walk, lowering JAX's, compiling XLA's.
            began = time.perf_counter()
            jitted = jax.jit(_checked(program) if self.checks else program)
            traced = exported = None
            kept = None if stored is None else trace_cache.read(stored)
            if kept is not None:
                exported = kept.pop("exported")
                if exported is None and not self._eager(start, kept["stop"]):
                    kept = None  # kept as run op by op, which this runner's threshold is not
            traced_from = "hit" if kept is not None else "miss" if stored else None
            if kept is None:
                with tracing_for([platform]):
                    traced = jitted.trace(device_args, key)
                kept = {
                    "stop": found["stop"],
                    "reason": found["reason"],
                    "needed": found.get("needed"),
                    "host_outputs": found["host"],
                }
            traced_at = time.perf_counter()
            stop = kept["stop"]
            eager = self._eager(start, stop)
            if traced_from == "miss":
                exported, blob = None, None
                if not eager:
                    exported, blob = _exported(jitted, device_args, key, platform)
                if not (eager or blob) or not trace_cache.write(stored, blob, **kept):
                    traced_from, exported = "unexportable", None
            disk = None
            lowered_at = time.perf_counter()
            if not eager:
                if exported is not None:
                    lower = functools.partial(_lower_exported, exported, device_args, key)
                else:
                    lower = traced.lower
                lowered = lower()
                lowered_at = time.perf_counter()
                options = compiler_options(lowered, device_args)
                compiled, disk = compile_lowered(lowered, lower, options)
                if disk == "hit":
                    compiled = guarded(compiled, jax.config.jax_compilation_cache_dir)
            span.stop_metadata.update(
                trace_s=round(traced_at - began, 4),
                lower_s=round(lowered_at - traced_at, 4),
                xla_s=round(time.perf_counter() - lowered_at, 4) if not eager else 0.0,
                stop=stop if stop is not None else "end",
                compiled=not eager,
                disk_cache=disk,
                trace_cache=traced_from,
                reason=kept["reason"],
                host_values=host_names,
            )
        return Segment(
            start,
            stop,
            kept["reason"],
            kept["host_outputs"],
            host_names,
            None if eager else self._raising(compiled, start, stop) if self.checks else compiled,
            kept["needed"],
        )

    def _eager(self, start: int, stop: int | None) -> bool:
        """Whether the segment from `start` to `stop` runs op by op. A short segment around a
        break costs more to compile than to run op by op; a graph without breaks always
        compiles, whatever its size, and so does one whose only break is a node building host
        values (ZipMap's maps) from the segment's results. Nothing checks indices op by op."""
        length = sum(1 + _body_nodes(step.node) for step in self.plan.steps[start:stop])
        tail = stop is not None and self.plan.steps[stop].opdef.host_outputs
        eager = (start > 0 or (stop is not None and not tail)) and length < self.eager_threshold
        return eager and not self.checks

    def _raising(self, compiled: Callable, start: int, stop: int | None) -> Callable:
        """A checked program that raises a NodeError for its first failed check."""
        steps = self.plan.steps[start:stop]
        suspects = [s.node.label for s in steps if s.node.op_type.endswith(_INDEXING_OPS)]
        named = ", ".join(repr(n) for n in suspects[:5]) + (", ..." if len(suspects) > 5 else "")

        def call(args, key):
            error, outputs = compiled(args, key)
            exception = error.get_exception()
            if exception is not None:
                where = f"nodes {start} to {'the end' if stop is None else stop - 1}"
                raise NodeError(
                    f"an index computed in the graph is out of range (checks=True): "
                    f"{str(exception).strip()} in {where}, indexing nodes {named or 'none'}"
                ) from exception
            return outputs

        return call

    def run_break(self, position: int, env: dict[str, Any], key: Any = None) -> None:
        """Run the break node eagerly, with its host-needed inputs made concrete."""
        step = self.plan.steps[position]
        node = step.node
        metadata = {
            "source": self.model.source,
            "position": position,
            "node": node.label,
            "op_type": node.op_type,
        }
        if telemetry.listening("transmuter.break.stop"):
            hint = self.static_hints().get(node.label)
            if hint:
                metadata["static_inputs"] = list(hint)
        with telemetry.span("transmuter.break", metadata):
            for index in step.opdef.host_inputs:
                name = node.inputs[index] if index < len(node.inputs) else ""
                if name:
                    env[name] = to_host(env[name])  # small, shape-deciding: keep it on the host
            Interpreter(self.plan, key).step(step, env)
            needed = self.plan.host_needed
            for name in node.outputs:
                value = env.get(name) if name else None
                if _to_device_after_break(value, step.opdef.data_dependent, name in needed):
                    env[name] = to_device(value)


def _exported(jitted, device_args, key, platform: str) -> tuple[Any, bytes | None]:
    """The traced segment as a `jax.export.Exported` for `platform` and its serialized form, or
    (None, None) where JAX cannot export it (a host callback) or serialize it (a 2-bit type)."""
    try:
        with tracing_for([platform]):
            exported = jax.export.export(jitted, platforms=[platform])(device_args, key)
    except Exception:  # whatever export refuses, the segment still compiles from its trace
        return None, None
    blob = trace_cache.serialized(exported)
    return (exported, blob) if blob is not None else (None, None)


def _lower_exported(exported, device_args, key) -> Any:
    """The exported segment lowered as a program named as traced ones are (`jit_program` in
    JAX's cache), with no graph walk."""

    def program(args, key):
        return exported.call(args, key)

    return jax.jit(program).trace(device_args, key).lower()


def _on_one_device(args: Mapping[str, Any]) -> bool:
    return all(
        not isinstance(v, jax.Array) or len(v.sharding.device_set) == 1 for v in args.values()
    )


def _forget_traced_shapes() -> None:
    """Free what JAX's staging caches keep for every shape ever traced (each jnp function holds
    a jaxpr and a lowering per shape it saw), so that memory follows `cache_size`. The programs
    Transmuter keeps are its own references and stay usable, and JAX's C++ dispatch caches are
    left alone: a caller's own jitted functions keep their compiled programs, which
    `jax.clear_caches()` would drop and make every one of them compile again."""
    jax_util.clear_all_caches()


def _checked(program: Callable) -> Callable:
    """`program` returning checkify's error too: out-of-range gather and scatter indices."""
    from jax.experimental import checkify

    return checkify.checkify(program, errors=checkify.index_checks | checkify.user_checks)


# The ops whose indices checkify checks; a failed check names those of its segment (checkify
# locates the failure inside jnp.take, not in the node that called it).
_INDEXING_OPS = ("Gather", "Scatter", "EmbedLayerNormalization", "OneHot", "ReverseSequence")


def _keep_decision_on_host(env: dict[str, Any], node: ir.Node, name: str | None) -> None:
    """A break on a one-element boolean an operator decides by (an If whose branches differ, or
    one of which cannot be traced for these shapes) keeps that boolean on the host: later nodes
    reading it (more Ifs on the same condition) then trace only their taken branch, and the
    segments after are keyed by its value (two at most). Larger values stay device values, so
    that a data input never keys a program by its contents."""
    value = env.get(name) if name and name in node.inputs else None
    if value is not None and not isinstance(value, (list, dict)):
        if np.size(value) == 1 and np.dtype(value.dtype) == np.bool_:
            env[name] = to_host(value)


def _to_device_after_break(value: Any, data_dependent: bool, host_needed: bool) -> bool:
    """Data (NonZero indices, large results) goes back to the device so that the next segments
    are keyed by its shape, not its values; small shape-like results stay on the host, and so
    do small data-dependent results that later nodes need on the host (NonZero's indices
    becoming Slice bounds): on the device, each of those nodes would break again, with a small
    eager segment between each two, and the segments after are keyed by those values anyway."""
    if not isinstance(value, np.ndarray) or value.dtype == object:
        return False
    if value.size > BREAK_HOST_RESULT_MAX_SIZE:
        return True
    return data_dependent and not host_needed


def _fold(key: Any, position: int) -> Any:
    return None if key is None else jax.random.fold_in(key, position)


def _body_nodes(node: ir.Node) -> int:
    """The nodes of a node's subgraphs, counted into a segment's length: a Scan of a model's
    repeated layers is a long segment however few nodes surround it."""
    return sum(len(g.nodes) + sum(_body_nodes(n) for n in g.nodes) for g in ir.subgraphs(node))


def _end(segment: Segment, length: int) -> int:
    return length if segment.stop is None else segment.stop


class ReadsAfter:
    """`reads_after[p]`: the names that nodes p.. (and their subgraphs) read, plus the graph
    outputs; `[len]` and `[-1]` are the graph outputs alone. From each name's last reading
    position, found in one pass; a position's set is built when first asked for (segment starts
    and stops only), so that the cost stays linear in the graph's size."""

    def __init__(self, plan: Plan):
        self.length = len(plan.steps)
        last: dict[str, int] = {}
        for position, step in enumerate(plan.steps):
            for name in step.node.inputs:
                if name:
                    last[name] = position
            for sub in ir.subgraphs(step.node):
                last.update(dict.fromkeys(sub.outer_names, position))
        last.update(dict.fromkeys((v.name for v in plan.graph.outputs), self.length))
        self.last = last
        self.sets: dict[int, frozenset[str]] = {}

    def __getitem__(self, position: int) -> frozenset[str]:
        position = self.length if position == -1 else position
        found = self.sets.get(position)
        if found is None:
            found = frozenset(n for n, last in self.last.items() if last >= position)
            self.sets[position] = found
        return found


def signature(value: Any) -> Any:
    """What a compiled program depends on in a device value: (shape, dtype name) of a tensor,
    a tuple of those for a sequence, None for an empty optional."""
    if value is None:
        return None
    if isinstance(value, list):
        return tuple(signature(v) for v in value)
    if isinstance(value, dict):  # a map: its keys are part of the program's structure
        return ("map", tuple((k, signature(value[k])) for k in sorted(value)))
    if isinstance(value, str):  # a map's string value: keyed by content (host values)
        return ("str", value)
    return (tuple(value.shape), _dtype_name(value.dtype))


@functools.cache
def _dtype_name(dtype: np.dtype) -> str:
    return np.dtype(dtype).name  # a numpy property that takes microseconds: once per dtype


def _holds_strings(value: Any) -> bool:
    """Whether a value holds strings, which cannot be program arguments (maps of strings)."""
    if isinstance(value, list):
        return any(_holds_strings(v) for v in value)
    if isinstance(value, dict):
        return any(isinstance(v, str) or _holds_strings(v) for v in value.values())
    return isinstance(value, np.ndarray) and value.dtype == object


def _digest(value: Any) -> Any:
    """A hashable stand-in for a host value's content."""
    if value is None:
        return None
    if isinstance(value, list):
        return tuple(_digest(v) for v in value)
    if isinstance(value, dict):
        return ("map", tuple((k, _digest(np.asarray(value[k]))) for k in sorted(value)))
    if value.dtype == object:
        return (value.shape, tuple(value.ravel().tolist()))
    data = np.ascontiguousarray(value)
    return (
        value.shape,
        value.dtype.str,
        hashlib.blake2b(data.view(np.uint8), digest_size=16).digest(),
    )
