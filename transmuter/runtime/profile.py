"""Where a model's time goes (`transmuter bench MODEL --profile`).

The whole graph runs as one XLA program, and XLA's fusions have no ONNX node names, so the
profile times each node of the plan on its own instead: the node's lowering jitted as a program
of its device inputs (host inputs, such as a Reshape's shape, fixed as in a compiled run), run on
the values the graph really produces there, `block_until_ready`, median of `runs` calls. Nodes
whose inputs are all host values cost nothing at run time (they run on the host while tracing)
and are counted apart. The sum of the node times is an upper bound on the compiled run: it has
no fusion and one dispatch per node (the `floor`, a jitted identity timed the same way, says how
much of each node time is that dispatch). Read it as "which operators hold the arithmetic",
beside the compiled run's own time.

JAX's profiler (`jax.profiler.trace`) would time the compiled program itself, but it reports XLA
fusions and thunks, not ONNX nodes, and reading its trace needs TensorBoard's profile plugin.
"""

from __future__ import annotations

import statistics
import time
from collections import ChainMap
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from transmuter import ir
from transmuter.runtime.compiled import CompiledModel
from transmuter.runtime.execute import on_device, x64_scope
from transmuter.runtime.interpreter import Interpreter, Step, is_host, to_host


@dataclass(frozen=True)
class NodeTime:
    """One node's time: `ms` run as its own compiled program (None: on the host while tracing)."""

    label: str
    op_type: str
    ms: float | None
    how: str  # "compiled", "eager" (its lowering could not be jitted alone) or "host"


@dataclass
class Profile:
    """A profile of one input signature: the compiled run and every node timed alone."""

    compiled_ms: float
    floor_ms: float
    nodes: list[NodeTime] = field(default_factory=list)

    @property
    def total_ms(self) -> float:
        return sum(n.ms for n in self.nodes if n.ms is not None)

    def by_op_type(self) -> list[tuple[str, int, float]]:
        """(op type, device nodes, ms) by descending time; host-only nodes left out."""
        counts: dict[str, list] = {}
        for n in self.nodes:
            if n.ms is not None:
                entry = counts.setdefault(n.op_type, [0, 0.0])
                entry[0] += 1
                entry[1] += n.ms
        return sorted(((k, c, ms) for k, (c, ms) in counts.items()), key=lambda r: -r[2])

    def report(self, top: int = 15) -> str:
        total = self.total_ms or float("nan")
        host = sum(1 for n in self.nodes if n.ms is None)
        lines = [
            f"compiled run {self.compiled_ms:.3f} ms; {len(self.nodes) - host} device nodes "
            f"timed alone sum to {self.total_ms:.3f} ms (dispatch floor {self.floor_ms:.3f} ms "
            f"each); {host} nodes run on the host while tracing",
            f"{'op type':<28} {'nodes':>6} {'ms':>10} {'share':>6}",
        ]
        for op_type, count, ms in self.by_op_type():
            lines.append(f"{op_type:<28} {count:6d} {ms:10.3f} {ms / total:6.1%}")
        lines.append(f"top {top} nodes:")
        ranked = sorted((n for n in self.nodes if n.ms is not None), key=lambda n: -n.ms)
        for n in ranked[:top]:
            lines.append(f"  {n.ms:9.3f} ms  {n.op_type:<20} {n.label}{_how(n)}")
        return "\n".join(lines)


def _how(n: NodeTime) -> str:
    return "" if n.how == "compiled" else f"  ({n.how})"


def profile(model, inputs: Mapping[str, Any], *, runs: int = 10, key: Any = None) -> Profile:
    """Profile `model` (a `transmuter.Model`) on `inputs`: the compiled run's median and each
    node of the main graph timed alone (see the module docstring). `key`: for random ops."""
    compiled = CompiledModel(model, inputs)
    compiled_ms = _median_ms(lambda: jax.block_until_ready(compiled(inputs)), runs)
    arrays = model.check_inputs(inputs)
    with x64_scope():
        env: dict[str, Any] = dict(model.host_constants)
        env.update(model.device_constants)
        env.update(model.params)
        env.update({k: on_device(v) for k, v in arrays.items()})
        interpreter = Interpreter(model.plan, key if key is not None else jax.random.key(0))
        probe = jax.numpy.zeros((), np.float32)
        identity = jax.jit(lambda x: x + 1)
        floor_ms = _median_ms(lambda: jax.block_until_ready(identity(probe)), runs)
        result = Profile(compiled_ms, floor_ms)
        programs: dict[Any, Any] = {}
        for step in model.plan.steps:
            result.nodes.append(_time_step(interpreter, step, env, runs, programs))
    return result


def _time_step(interpreter: Interpreter, step: Step, env: dict, runs: int, programs) -> NodeTime:
    node = step.node
    names = [n for n in node.inputs if n]
    for sub in ir.subgraphs(node):
        names.extend(sorted(sub.outer_names))
    reads = {n: env[n] for n in dict.fromkeys(names) if n in env}
    start = time.perf_counter()
    interpreter.step(step, env)  # the node's real outputs, for the nodes after it
    eager_ms = (time.perf_counter() - start) * 1e3
    host_at = {node.inputs[i] for i in step.opdef.host_input_indices(node.inputs)}
    device = {n: v for n, v in reads.items() if not is_host(v) and n not in host_at}
    if not device:
        return NodeTime(node.label, node.op_type, None, "host")
    fixed = {n: to_host(v) for n, v in reads.items() if n not in device}
    signature = _signature(step, device, fixed)
    program = programs.get(signature) if signature is not None else None
    # Positional, so that a program shared by nodes of one signature reads each node's values.
    values = list(device.values())
    if program is None:
        order = list(device)

        def run_alone(values):
            local = ChainMap(dict(zip(order, values)), fixed)
            interpreter.step(step, local)
            return [local[o] for o in node.outputs if o]

        program = jax.jit(run_alone)
        try:
            jax.block_until_ready(program(values))
        except Exception:  # noqa: BLE001 - strings, a host value asked while tracing, ...
            return NodeTime(node.label, node.op_type, eager_ms, "eager")
        if signature is not None:
            programs[signature] = program
    ms = _median_ms(lambda: jax.block_until_ready(program(values)), runs)
    return NodeTime(node.label, node.op_type, ms, "compiled")


def _signature(step: Step, device: dict, fixed: dict) -> Any:
    """A key under which nodes of the same op, attributes, input shapes and fixed values share
    one compiled program (the layers of a transformer); None when it cannot be had cheaply."""
    node = step.node
    if ir.subgraphs(node) or step.opdef.random:
        return None
    try:
        fixed_key = tuple(
            (i, np.asarray(fixed[n]).tobytes(), np.asarray(fixed[n]).dtype.str, np.shape(fixed[n]))
            for i, n in enumerate(node.inputs)
            if n in fixed and isinstance(fixed[n], np.ndarray) and fixed[n].size <= 4096
        )
        if any(n in fixed and not isinstance(fixed[n], np.ndarray) for n in node.inputs):
            return None
        if any(n in fixed and fixed[n].size > 4096 for n in node.inputs):
            return None
        device_key = tuple(
            (i, tuple(device[n].shape), str(device[n].dtype))
            for i, n in enumerate(node.inputs)
            if n in device
        )
        return (node.op_type, node.domain, step.opset, repr(sorted(node.attrs.items())),
                fixed_key, device_key, tuple(bool(o) for o in node.outputs))  # fmt: skip
    except (AttributeError, TypeError):
        return None


def _median_ms(fn, runs: int) -> float:
    fn()
    times = []
    for _ in range(max(1, runs)):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)
