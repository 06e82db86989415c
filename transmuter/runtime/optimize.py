"""The runtime's side of the graph passes (transmuter/ir/passes): what they may change for a
model, and the evaluator constant folding computes nodes with, the interpreter's own host path
(so a folded value is exactly what tracing would have computed)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from transmuter import ir
from transmuter.errors import UnsupportedOpError
from transmuter.ir import passes
from transmuter.lowering import lookup
from transmuter.runtime.execute import x64_scope
from transmuter.runtime.interpreter import Interpreter, Step
from transmuter.runtime.model import DEVICE_CONSTANT_MIN_SIZE, PARAM_DTYPES, PARAM_MIN_SIZE


def optimize(
    model: ir.Model, names: Iterable[str] | None = None, *, trainable: bool = False
) -> ir.Model:
    """`model` after the passes `names` (None: `passes.DEFAULT`). A trainable model keeps its
    float initializers as they are (they are its params)."""
    return passes.optimize(model, names, context(model, trainable=trainable))


def context(model: ir.Model, *, trainable: bool = False) -> passes.Context:
    opsets = dict(model.opsets)
    return passes.Context(
        opsets=opsets,
        weights=not trainable,
        evaluate=lambda node, values: evaluate(node, values, opsets),
        random=lambda node: _opdef(node, opsets) is None or _opdef(node, opsets).random,
        device_bound=_device_bound,
        traces=lambda node, traced: _traces(node, traced, opsets),
        weight=lambda node, values: _weight(node, values, opsets),
    )


def _traces(node: ir.Node, traced: frozenset[int], opsets) -> bool | None:
    """Whether `node`'s outputs are traced when the inputs at `traced` are; None where it would
    need one of them on the host (a declared host input, or an op that may ask for one). The
    ops that ask only given strings (`strings_on_host`) count as tracing: traced values are
    numbers."""
    if not traced:
        return False
    opdef = _opdef(node, opsets)
    if opdef is None or opdef.may_need_host is not None or opdef.host_outputs:
        return None
    if traced & set(opdef.host_input_indices(node.inputs)):
        return None
    return not opdef.reads_shape  # Shape and Size read shapes, which tracing knows


def _weight(node: ir.Node, values: dict[str, np.ndarray], opsets) -> np.ndarray | None:
    """The float32 weight the registry's `weight` computes from `node`'s constant inputs (all
    but the activation), or None (no such fact, an input missing, or a failure: the node then
    stays as it is and reports its own error when it runs)."""
    opdef = _opdef(node, opsets)
    if opdef is None or opdef.weight is None:
        return None
    if any(name and name not in values for name in node.inputs[1:]):
        return None
    args = [values[name] if name else None for name in node.inputs[1:]]
    try:
        with x64_scope():
            return np.asarray(opdef.weight(*args, **node.attrs), np.float32)
    except Exception:  # noqa: BLE001 - as `evaluate`: the node keeps its own error
        return None


def _device_bound(array: np.ndarray) -> bool:
    """Whether `Model` makes an initializer a device value (runtime/model.py's split)."""
    if array.dtype in PARAM_DTYPES:
        return array.size > PARAM_MIN_SIZE
    return array.size >= DEVICE_CONSTANT_MIN_SIZE and array.dtype != object


def _opdef(node: ir.Node, opsets):
    try:
        return lookup(node.domain, node.op_type, opsets.get(node.domain, 0), node.label)
    except UnsupportedOpError:
        return None


def evaluate(node: ir.Node, values: dict[str, np.ndarray], opsets) -> list[Any] | None:
    """`node`'s outputs computed on the host from `values` (numpy arrays by input name), or None
    where it cannot be (an unsupported or random op, a failure, a result that is no array)."""
    opdef = _opdef(node, opsets)
    if opdef is None or opdef.random or ir.subgraphs(node):
        return None
    env: dict[str, Any] = dict(values)
    try:
        with x64_scope():
            Interpreter(None).step(Step(node, opdef, opsets.get(node.domain, 0)), env)
    except Exception:  # noqa: BLE001 - the node stays in the graph and fails (or not) at run time
        return None
    results = [env.get(o) if o else None for o in node.outputs]
    if any(o and not isinstance(r, np.ndarray) for o, r in zip(node.outputs, results)):
        return None
    return results
