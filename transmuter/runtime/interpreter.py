"""The interpreter: walks a graph's sorted nodes and calls each operator's JAX function.

Values are of two kinds (see DESIGN.md): host values (numpy arrays, lists of them, None), known
while tracing, and device values (JAX arrays or tracers). A node whose inputs are all host values
is evaluated on the host, so shape arithmetic stays concrete under `jax.jit`; an input that an
operator declares as host-needed is converted to a host value, or, when it is a tracer, raises
HostValueNeeded (the point where the compiling runtime breaks the graph).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import jax
import numpy as np
from jax.export import is_symbolic_dim

from transmuter import dtypes, ir
from transmuter.errors import HostValueNeeded, NodeError, TransmuterError, UnsupportedOpError
from transmuter.lowering import OpContext, OpDef, lookup
from transmuter.lowering.shared import after
from transmuter.lowering.symbolic import dims_to_device, is_symbolic, settle_dims


@dataclass
class Step:
    node: ir.Node
    opdef: OpDef
    opset: int
    # For a conversion of weights (`_conversions_next_to_use`): what its reader reads besides
    # weights; it waits on the first traced float value of them (`lowering.shared.after`).
    gate: tuple[str, ...] = ()


@dataclass
class Plan:
    """A graph with every node resolved to its lowering, subgraphs included. Built once per model
    so that running a graph does no lookups."""

    graph: ir.Graph
    steps: list[Step]
    subplans: dict[int, Plan]  # id(ir.Graph) -> Plan for every subgraph at any depth; shared

    @cached_property
    def host_needed(self) -> frozenset[str]:
        """The names of this graph whose values some node needs on the host, directly (an input
        an op declares host-needed, every input of a data-dependent op, of an op that may ask
        for host values or builds host values, of an op on strings in a graph that has strings,
        and what a subgraph needs on the host from outside it) or through the nodes computing
        them; Shape and Size read only their input's shape. One backward pass over the steps."""
        strings = _has_strings(self.graph)
        needed: set[str] = set()
        for step in reversed(self.steps):
            node, opdef = step.node, step.opdef
            if any(o in needed for o in node.outputs if o) and not opdef.reads_shape:
                needed.update(n for n in node.inputs if n)
                continue
            subs = ir.subgraphs(node)
            if (
                opdef.data_dependent
                or opdef.may_need_host
                or (opdef.strings_on_host and strings)
                or opdef.host_outputs
            ):
                needed.update(n for n in node.inputs if n)
            else:
                needed.update(node.inputs[i] for i in opdef.host_input_indices(node.inputs))
            for sub in subs:
                # An op deciding on its subgraphs' results (If's branch, Loop's condition) may
                # decide on any value they read, so all of them stay on the host.
                decides = opdef.may_need_host is not None
                needed.update(sub.outer_names if decides else self._needed_by(node, sub))
        return frozenset(needed)

    def _needed_by(self, node: ir.Node, sub: ir.Graph) -> set[str]:
        """What a Scan's body needs on the host from outside it: the outer values it reads that
        its own plan needs there, and the node's inputs bound to such body inputs (counted from
        the end: Scan-8 has sequence_lens first, needed here too)."""
        inner = self.subplans[id(sub)].host_needed
        needed = sub.outer_names & inner
        first_bound = max(len(node.inputs) - len(sub.inputs), 0)
        needed.update(n for n in node.inputs[:first_bound] if n)
        for name, value in zip(node.inputs[first_bound:], sub.inputs):
            if name and value.name in inner:
                needed.add(name)
        return needed

    @cached_property
    def stageable(self) -> frozenset[str]:
        """The values this graph computes that no node needs on the host: when their inputs
        are host values while compiling, they are computed in the program (XLA folds or runs
        them) rather than op by op on the host, which through JAX would compile a small
        program per op and shape."""
        made = {o for step in self.steps for o in step.node.outputs if o}
        return frozenset(made - self.host_needed)

    @classmethod
    def build(cls, graph: ir.Graph, opsets: Mapping[str, int]) -> Plan:
        unsupported: list[UnsupportedOpError] = []
        plan = cls._build(graph, opsets, unsupported, {})
        plan.steps = _conversions_next_to_use(plan.steps, set(graph.initializers))
        if len(unsupported) == 1:
            raise unsupported[0]
        if unsupported:
            first = unsupported[0]
            kinds = sorted({f"{e.domain or 'ai.onnx'}::{e.op_type}" for e in unsupported})
            raise UnsupportedOpError(
                first.domain,
                first.op_type,
                first.opset,
                first.node,
                f"{len(unsupported)} nodes use unsupported operators: {', '.join(kinds)}",
            )
        return plan

    @classmethod
    def _build(cls, graph, opsets, unsupported, subplans) -> Plan:
        plan = cls(graph, [], subplans)
        for node in graph.nodes:
            opset = opsets.get(node.domain)
            try:
                if opset is None:
                    raise UnsupportedOpError(
                        node.domain,
                        node.op_type,
                        0,
                        node.label,
                        f"the model imports no opset for domain {node.domain!r}",
                    )
                opdef = lookup(node.domain, node.op_type, opset, node.label)
                plan.steps.append(Step(node, opdef, opset))
            except UnsupportedOpError as exc:
                unsupported.append(exc)
            for sub in ir.subgraphs(node):
                subplans[id(sub)] = cls._build(sub, opsets, unsupported, subplans)
        return plan


def _conversions_next_to_use(steps: list[Step], weights: set[str]) -> list[Step]:
    """`steps` with each conversion of weights moved to just before the first node that reads
    it and computes on data, and gated on that node's other inputs. The main graph's weights
    are params: converting them is work on every call, which XLA:CPU would schedule at the
    program's start. A conversion is a `converts` step reading only values computed from
    weights, or such a step reading a conversion (the graph's own Transpose after a storage
    Cast); it reads nothing computed from data, so any position before its reader is valid.
    A node's reads include what its subgraphs read from outside (an If branch's weights)."""
    derived = set(weights)  # values computed from weights alone
    waiting: dict[str, tuple[int, Step]] = {}  # output -> (position, conversion)
    ordered: list[Step] = []
    for position, step in enumerate(steps):
        subs = ir.subgraphs(step.node)
        reads = [n for n in step.node.inputs if n]
        reads += sorted(set().union(*(sub.outer_names for sub in subs)))
        outputs = [o for o in step.node.outputs if o]
        if all(n in derived for n in reads):
            derived.update(outputs)
            movable = not step.opdef.random and not subs
            if movable and (step.opdef.converts or any(n in waiting for n in reads)):
                waiting.update((o, (position, step)) for o in outputs)
                continue
        gate = tuple(n for n in reads if n not in derived)
        needed: dict[int, Step] = {}
        pending = [n for n in reads if n in waiting]
        while pending:
            at, conversion = waiting[pending.pop()]
            if at not in needed:
                needed[at] = conversion
                pending.extend(n for n in conversion.node.inputs if n in waiting)
        for at in sorted(needed):
            for name in needed[at].node.outputs:
                waiting.pop(name, None)
            ordered.append(replace(needed[at], gate=gate))
        ordered.append(step)
    # Conversions no node reads (graph outputs) keep no gate and end the plan.
    left = {at: step for at, step in waiting.values()}
    return ordered + [left[at] for at in sorted(left)]


def is_host(value: Any) -> bool:
    """True for values known on the host: numpy arrays, None, lists of host values, and maps
    (dicts) whose values are numpy scalars, strings or host values."""
    if value is None or isinstance(value, np.ndarray):
        return True
    if isinstance(value, list):
        return all(is_host(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(v, (np.generic, str)) or is_host(v) for v in value.values())
    return False


def to_host(value: Any) -> Any:
    """A concrete value as numpy (lists element-wise); tracers are returned unchanged."""
    if isinstance(value, jax.core.Tracer) or value is None or isinstance(value, np.ndarray):
        return value
    if isinstance(value, list):
        return [to_host(v) for v in value]
    if isinstance(value, dict):
        return {k: v if isinstance(v, (np.generic, str)) else to_host(v) for k, v in value.items()}
    if isinstance(value, jax.Array):
        return np.asarray(value)
    if isinstance(value, (bool, int, float, complex, np.generic)):
        return np.asarray(value)
    if is_symbolic_dim(value):  # one dim of a symbolic shape (see dims_array)
        return np.asarray(value, dtype=object)
    return value


def _is_traced(value: Any) -> bool:
    if isinstance(value, list):
        return any(_is_traced(v) for v in value)
    if isinstance(value, dict):
        return any(_is_traced(v) for v in value.values())
    return isinstance(value, jax.core.Tracer)


def _is_float_tracer(value: Any) -> bool:
    return isinstance(value, jax.core.Tracer) and jax.numpy.issubdtype(value.dtype, np.inexact)


class Interpreter:
    """Evaluates plans. One instance per call: it owns the call's random-key stream."""

    def __init__(self, root: Plan, key: Any = None, stage: frozenset[str] = frozenset()):
        self.root = root
        self.key = key
        self.draws = 0
        # Values computed in the trace even from host values (`Plan.stageable`); only while
        # tracing a program, where they cost nothing on the host.
        self.stage = stage

    def run(self, plan: Plan, env: MutableMapping[str, Any]) -> list[Any]:
        for step in plan.steps:
            self.step(step, env)
        return [env[v.name] for v in plan.graph.outputs]

    def run_graph(
        self, graph: ir.Graph, inputs: Sequence[Any], outer: Mapping[str, Any]
    ) -> list[Any]:
        plan = self.root.subplans[id(graph)]
        local = dict(zip((v.name for v in graph.inputs), inputs))
        local.update(graph.initializers)  # subgraph initializers are small constants
        return self.run(plan, ChainMap(local, outer))

    def recompute(
        self, at: Step, names: Sequence[str], feeds: Mapping[str, Any], env: Mapping[str, Any]
    ) -> list[Any]:
        """The values `names` of the graph holding step `at`, computed again from `feeds` by
        the steps between them; every other value is read from `env`."""
        plans = (self.root, *self.root.subplans.values())
        steps = next(p.steps for p in plans if any(s is at for s in p.steps))
        producer = {o: s for s in steps for o in s.node.outputs if o}
        needed: set[int] = set()
        pending = [n for n in names if n not in feeds]
        while pending:
            step = producer.get(pending.pop())
            if step is None or id(step) in needed:
                continue  # a graph input, initializer or outer value: read from env
            needed.add(id(step))
            pending.extend(n for n in step.node.inputs if n and n not in feeds)
        local = ChainMap(dict(feeds), env)
        for step in steps:
            if id(step) in needed:
                self.step(step, local)
        return [local[n] for n in names]

    def next_key(self) -> Any:
        if self.key is None:
            raise TransmuterError("this graph has random operators: pass a PRNG key to run them")
        self.draws += 1
        return jax.random.fold_in(self.key, self.draws)

    def step(self, step: Step, env: MutableMapping[str, Any]) -> None:
        node, opdef = step.node, step.opdef
        args = []
        for name in node.inputs:
            if name and name not in env:
                raise NodeError(
                    f"node {node.label!r} ({node.op_type}) reads {name!r}, which has no value"
                )
            args.append(env[name] if name else None)
        dependency = next((env[n] for n in step.gate if _is_float_tracer(env.get(n))), None)
        if dependency is not None:
            args = [after(a, dependency) if isinstance(a, jax.core.Tracer) else a for a in args]
        for index in opdef.host_input_indices(node.inputs):
            if _is_traced(args[index]):
                reason = opdef.host_reason(index)
                raise HostValueNeeded(node.label, node.op_type, node.inputs[index], reason)
            args[index] = to_host(args[index])
        if opdef.context:
            ctx = OpContext(
                node,
                step.opset,
                lambda g, xs: self.run_graph(g, xs, env),
                self.next_key,
                lambda names, feeds: self.recompute(step, names, feeds, env),
                opdef.asks_host,
            )
            args.insert(0, ctx)
        values = [a for a in args if not isinstance(a, OpContext)]
        on_host = not opdef.random and all(is_host(a) for a in values)
        if on_host and self.stage and _stages(step, values, self.stage):
            on_host = False
            keep = {i + opdef.context for i in opdef.host_input_indices(node.inputs)}
            args = [
                jax.numpy.asarray(a) if isinstance(a, np.ndarray) and i not in keep else a
                for i, a in enumerate(args)
            ]
        try:
            if any(map(is_symbolic, values)):
                result = _with_symbolic_dims(step, args, on_host)
            elif on_host:
                with jax.ensure_compile_time_eval():
                    result = _outputs(opdef.fn(*args, **node.attrs), on_host=True)
            else:
                fn = opdef.fn if opdef.differentiable else _gradient_refused(step)
                result = _outputs(fn(*args, **node.attrs), on_host=False)
        except TransmuterError:
            raise
        except Exception as exc:
            raise NodeError(_failure(step, args, exc)) from exc
        # Absent outputs may sit between present ones: every position up to the last is needed.
        if len(result) < max((i + 1 for i, o in enumerate(node.outputs) if o), default=0):
            raise NodeError(
                f"node {node.label!r} ({opdef.name}) lists {len(node.outputs)} outputs but the "
                f"lowering produced {len(result)}"
            )
        for name, value in zip(node.outputs, result):
            if name:
                env[name] = value


def _has_strings(graph: ir.Graph) -> bool:
    """Whether a graph holds or makes string tensors (its declared values, initializers, or a
    Cast to strings, which ml ops aside is how strings are made)."""
    declared = [*graph.inputs, *graph.outputs, *graph.value_info.values()]
    if any(getattr(v.type, "dtype", None) == np.dtype(object) for v in declared):
        return True
    if any(a.dtype == object for a in graph.initializers.values()):
        return True
    return any(n.op_type == "Cast" and n.attrs.get("to") == 8 for n in graph.nodes) or any(
        n.domain.startswith("ai.onnx.ml") for n in graph.nodes
    )


def _stages(step: Step, values: list, stage: frozenset[str]) -> bool:
    """Whether a node whose inputs are all host values is computed in the trace instead: its
    outputs are stageable, it reads at least one input, and every input is a numeric array."""
    node, opdef = step.node, step.opdef
    if opdef.reads_shape or opdef.may_need_host or opdef.host_outputs or ir.subgraphs(node):
        return False
    if not any(v is not None for v in values):
        return False
    if not all(o in stage for o in node.outputs if o):
        return False
    return all(
        v is None
        or (isinstance(v, np.ndarray) and v.dtype != object and v.dtype not in _FOLDED_DIFFERENTLY)
        for v in values
    )


# A staged host value is a constant of the program, and XLA folds constants of the narrow types
# (float8, float4, float6, e8m0, 4- and 2-bit integers) other than it computes on them at run
# time: float8e8m0's NaN (0xFF) cast to float32 folds to inf. Those stay on the host.
_FOLDED_DIFFERENTLY = frozenset(d for c, d in dtypes.ONNX_TO_NUMPY.items() if c >= 17)


def _with_symbolic_dims(step: Step, args: list, on_host: bool) -> tuple:
    """Run a node that reads host values holding `jax.export` symbolic dims (exporting with
    symbolic shapes). Shape arithmetic stays on the host, symbolically, where the operator's
    registration says how (`OpDef.symbolic`); elsewhere the dims become int64 values in the
    trace, and an operator that needs them on the host breaks."""
    node, opdef = step.node, step.opdef
    if on_host and callable(opdef.symbolic):
        values = [a for a in args if not isinstance(a, OpContext)]
        return tuple(map(settle_dims, _outputs(opdef.symbolic(*values, **node.attrs), True)))
    moves = opdef.symbolic is True
    args = list(args)
    for index, name in enumerate(node.inputs):
        value = args[index + opdef.context]
        if not is_symbolic(value):
            continue
        if index in opdef.host_inputs:
            if not moves:
                raise NodeError(
                    f"{node.op_type} node {node.label!r} takes {opdef.host_inputs[index]} "
                    f"({name!r}) only as concrete numbers, but it depends on symbolic dims "
                    f"({value.tolist()}): give those dims as ints"
                )
        elif not (on_host and moves):
            args[index + opdef.context] = dims_to_device(value)
    fn = opdef.fn if on_host or opdef.differentiable else _gradient_refused(step)
    # Symbolic dims exist only inside a trace, where to_host leaves traced results alone.
    return tuple(map(settle_dims, _outputs(fn(*args, **node.attrs), on_host=True)))


def _gradient_refused(step: Step) -> Callable:
    """The step's lowering as a `jax.custom_vjp` of its device inputs whose backward pass raises
    (an op registered with differentiable=False). JAX runs that backward pass only when a
    nonzero cotangent reaches the outputs from a differentiated input, so forward runs, outputs
    left out of a loss and integer outputs (zero cotangents) are unaffected."""
    node, opdef = step.node, step.opdef
    message = (
        f"node {node.label!r} ({opdef.name}) has no gradient: JAX's derivative of its lowering "
        "is not the operator's, so the gradient reaching it is refused rather than returned "
        "wrong. Differentiate with respect to values it does not read, or leave its outputs "
        "out of the differentiated result."
    )

    def call(*args, **attrs):
        leaves, tree = jax.tree.flatten(list(args))
        device = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)]

        def with_values(values):
            full = list(leaves)
            for i, value in zip(device, values):
                full[i] = value
            return jax.tree.unflatten(tree, full)

        @jax.custom_vjp
        def apply(*values):
            return opdef.fn(*with_values(values), **attrs)

        def backward(_, cotangents):
            raise NodeError(message)

        apply.defvjp(lambda *values: (apply(*values), None), backward)
        return apply(*(leaves[i] for i in device))

    return call


def _outputs(result: Any, on_host: bool) -> tuple:
    values = result if isinstance(result, tuple) else (result,)
    return tuple(to_host(v) for v in values) if on_host else values


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, list):
        return f"sequence[{len(value)}]"
    if isinstance(value, dict):
        return f"map[{len(value)}]"
    if isinstance(value, OpContext):
        return ""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    return f"{np.dtype(dtype).name}{list(shape)}" if shape is not None else type(value).__name__


def _failure(step: Step, args: list, exc: Exception) -> str:
    node = step.node
    inputs = ", ".join(
        f"{name or '<absent>'}: {_describe(a)}"
        for name, a in zip(node.inputs, [a for a in args if not isinstance(a, OpContext)])
    )
    return (
        f"node {node.label!r} ({step.opdef.name}, model opset {step.opset}) failed: "
        f"{type(exc).__name__}: {exc} [inputs: {inputs or 'none'}; attributes: {sorted(node.attrs)}]"
    )
