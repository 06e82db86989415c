"""Gradient checks for Transmuter graphs: `jax.grad` of `transmuter.run` against central finite
differences, computed in float64.

    model = graph_model([node], inputs={"X": x}, weights={"W": w})
    check_gradients(model, {"X": x})

`weights` become initializers, loaded with `transmuter.load(..., trainable=True)` so they are
params; `constants` become Constant nodes (never params, so values that decide shapes, like
Resize's scales, stay on the host). The checked scalar is sum_k sum(output_k * r_k) over the
float outputs, r_k fixed random arrays, so every output element's gradient is weighed.

Every check also takes the gradient as a caller with x64 off does (`jax.enable_x64(False)`
around `jax.grad`, as in a process with JAX's defaults): of the float32 copy of the model,
equal to the float32 copy's gradient with x64 on (JAX lowers and transposes the caller's
program after Transmuter's own x64 scope has closed).

Finite differences are taken per element, not along one random direction as
`jax.test_util.check_grads` does, so every partial derivative is checked and the size of the
error is known.

Tolerance. Every differentiated value is float64 and perturbed one element at a time by
h = 1e-5 (times max(1, |value|)): the central difference then errs by h^2 |f'''| / 6 (~1e-10 for
these O(1) functions) plus rounding, eps |f| / h (~1e-11 * |f|). Errors are measured relative to
max(1, max |FD gradient|) and must stay under 1e-6: three orders of magnitude above that noise,
and far below the O(1) error of a wrong or missing gradient term.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnx
from jax.flatten_util import ravel_pytree
from onnx import helper, numpy_helper

import transmuter
from transmuter import dtypes

STEP = 1e-5
TOLERANCE = 1e-6
KEY = jax.random.key(7)


def graph_model(
    nodes: Sequence[onnx.NodeProto],
    *,
    inputs: Mapping[str, np.ndarray] | None = None,
    weights: Mapping[str, np.ndarray] | None = None,
    constants: Mapping[str, np.ndarray] | None = None,
    outputs: Sequence[str] = ("Y",),
    opset: int = 21,
    domains: Mapping[str, int] | None = None,
) -> onnx.ModelProto:
    """A model of `nodes` with graph inputs, trainable initializers and Constant nodes."""
    inputs, weights, constants = inputs or {}, weights or {}, constants or {}
    constant_nodes = [
        helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(v)))
        for name, v in constants.items()
    ]
    graph = helper.make_graph(
        [*constant_nodes, *nodes],
        "gradient_check",
        [
            helper.make_tensor_value_info(n, dtypes.to_onnx(np.asarray(v).dtype), np.shape(v))
            for n, v in inputs.items()
        ],
        [helper.make_value_info(n, onnx.TypeProto()) for n in outputs],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in weights.items()],
    )
    opsets = [helper.make_opsetid("", opset)]
    opsets += [helper.make_opsetid(d, version) for d, version in (domains or {}).items()]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model


def node_model(
    op_type: str,
    node_inputs: Sequence[str],
    attrs: Mapping[str, Any] | None = None,
    *,
    outputs: Sequence[str] = ("Y",),
    domain: str = "",
    **graph: Any,
) -> onnx.ModelProto:
    """A one-node model; `node_inputs` and `outputs` list the node's names in order ("" for an
    absent one)."""
    node = helper.make_node(
        op_type, list(node_inputs), list(outputs), domain=domain, **(attrs or {})
    )
    if domain:
        graph.setdefault("domains", {domain: 1})
    return graph_model([node], outputs=[n for n in outputs if n], **graph)


def _is_float(value: Any) -> bool:
    return hasattr(value, "dtype") and np.dtype(value.dtype).kind == "f"


def scalar_loss(
    model: transmuter.Model, feeds: Mapping[str, Any], key: Any = None
) -> Callable[[dict, dict], jax.Array]:
    """(float inputs, params) -> sum_k sum(output_k * r_k), with the other inputs fixed."""
    outputs = jax.eval_shape(lambda f: transmuter.run(model, f, key=key), feeds)
    rng = np.random.default_rng(1)
    readout = {
        name: rng.uniform(0.5, 1.5, np.shape(v)) * rng.choice([-1.0, 1.0], np.shape(v))
        for name, v in outputs.items()
        if _is_float(v)
    }
    if not readout:
        raise ValueError("the model has no float output to differentiate")

    def loss(float_inputs: dict, params: dict) -> jax.Array:
        out = transmuter.run(model, {**feeds, **float_inputs}, params=params, key=key)
        return sum(
            jnp.sum(out[name].astype(jnp.float64) * weight) for name, weight in readout.items()
        )

    return loss


def differentiable_inputs(feeds: Mapping[str, Any]) -> dict:
    """The float inputs, as given (numpy keeps float64 outside an x64 scope)."""
    return {name: v for name, v in feeds.items() if _is_float(v)}


def perturbed_points(args: tuple) -> tuple[np.ndarray, np.ndarray, Callable]:
    """args flattened to one float64 vector x, and the points x + h_i e_i then x - h_i e_i."""
    flat, unravel = ravel_pytree(args)
    flat = np.asarray(flat, np.float64)
    steps = STEP * np.maximum(1.0, np.abs(flat))
    shifts = np.diag(steps)
    return np.concatenate([flat + shifts, flat - shifts]), steps, unravel


def loss_at_points(loss: Callable, unravel: Callable) -> Callable:
    """points -> loss at each, evaluated in a `lax.map` (sequential, so the reference relies on
    no batching rule)."""
    return lambda points: jax.lax.map(lambda x: loss(*unravel(x)), points)


def central_differences(values: Any, steps: np.ndarray, unravel: Callable) -> Any:
    values = np.asarray(values, np.float64)
    n = steps.size
    return unravel(jnp.asarray((values[:n] - values[n:]) / (2 * steps)))


def gradient_error(grads: Any, expected: Any) -> tuple[float, str]:
    """max |grad - FD| / max(1, max |FD|) over every differentiated value, and the value
    where it is largest."""
    scale = max(1.0, max(float(np.max(np.abs(v), initial=0.0)) for v in jax.tree.leaves(expected)))
    worst, where = 0.0, ""
    for (path, got), want in zip(jax.tree.leaves_with_path(grads), jax.tree.leaves(expected)):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        error = np.max(np.abs(got - want), initial=0.0) / scale
        error = float(error) if np.all(np.isfinite(got)) else float("inf")
        if error >= worst:
            worst, where = error, ("inputs" if path[0].idx == 0 else "params") + str(path[1:][0])
    return worst, where


def check_gradients(
    proto: onnx.ModelProto,
    feeds: Mapping[str, Any],
    *,
    key: Any = None,
    eager: bool = False,
) -> tuple:
    """Assert that `jax.grad` of the readout w.r.t. the float inputs and the params matches
    finite differences; returns the gradients (of the float inputs, of the params).

    By default the gradient and the finite differences are one `jax.jit` program (one compile:
    the cheap way to check many ops). eager=True calls `jax.grad` eagerly instead, where values
    a node reads stay concrete (an If condition from a graph input picks its branch on the host).
    """
    # x64 for the test's own arithmetic too (the readout, the FD points); run enables it inside.
    with jax.enable_x64(True):
        model = transmuter.load(proto, trainable=True)
        floats = differentiable_inputs(feeds)
        if not floats and not model.params:
            raise ValueError("the model has no float input or param to differentiate")
        for value in (*floats.values(), *model.params.values()):
            assert np.dtype(value.dtype) == np.float64, "build the check in float64"
        loss = scalar_loss(model, feeds, key)
        args = (floats, dict(model.params))
        points, steps, unravel = perturbed_points(args)
        grad = jax.grad(loss, argnums=(0, 1))
        at_points = loss_at_points(loss, unravel)
        if eager:
            grads, values = grad(*args), jax.jit(at_points)(points)
        else:
            grads, values = jax.jit(lambda a, p: (grad(*a), at_points(p)))(args, points)
        error, where = gradient_error(grads, central_differences(values, steps, unravel))
    assert error < TOLERANCE, f"d/d {where} differs from finite differences by {error:.3g}"
    check_x64_off(proto, feeds, key=key, eager=eager)
    return grads


def check_gradients_jit_and_eager(proto: onnx.ModelProto, feeds: Mapping[str, Any], **kwargs):
    """`check_gradients` under jit and, where a node's lowering can take another path run eagerly
    (tests/opcheck.py's `eager_can_differ`: it asks whether a value is traced), eagerly too.
    Other lowerings run the same code either way, so an eager `jax.grad` of them only repeats
    the jitted check op by op, each op compiled on its own. Returns the jitted gradients."""
    from opcheck import eager_can_differ  # tests/ is on pytest's path, not model_gradients.py's

    grads = check_gradients(proto, feeds, **kwargs)
    if eager_can_differ(proto):
        check_gradients(proto, feeds, eager=True, **kwargs)
    return grads


# float32 rounding through a few operators, relative to max(1, max |gradient|).
FLOAT32_TOLERANCE = 1e-5


def check_x64_off(proto: onnx.ModelProto, feeds: Mapping[str, Any], *, key: Any, eager: bool):
    """Assert that the float32 copy of the model has the same gradients in a caller with x64
    off as with x64 on."""
    proto32 = as_float32(proto)
    feeds32 = {
        n: v.astype(np.float32) if np.asarray(v).dtype == np.float64 else v
        for n, v in feeds.items()
    }

    def gradients():
        model = transmuter.load(proto32, trainable=True)
        floats = differentiable_inputs(feeds32)
        loss = float32_loss(model, feeds32, key)
        grad = jax.grad(loss, argnums=(0, 1))
        run = grad if eager else jax.jit(grad)
        return jax.tree.map(np.asarray, run(floats, dict(model.params)))

    with jax.enable_x64(False):
        off = gradients()
    with jax.enable_x64(True):
        on = gradients()
    scale = max(1.0, max(float(np.max(np.abs(v), initial=0.0)) for v in jax.tree.leaves(on)))
    for (path, got), want in zip(jax.tree.leaves_with_path(off), jax.tree.leaves(on)):
        assert got.dtype == want.dtype == np.float32, f"{path}: {got.dtype}, {want.dtype}"
        error = float(np.max(np.abs(got - want), initial=0.0)) / scale
        assert error < FLOAT32_TOLERANCE, f"with x64 off, d/d {path} differs by {error:.3g}"


def float32_loss(model: transmuter.Model, feeds: Mapping[str, Any], key: Any) -> Callable:
    """`scalar_loss` in float32, whatever the caller's x64 setting."""
    outputs = jax.eval_shape(lambda f: transmuter.run(model, f, key=key), feeds)
    rng = np.random.default_rng(1)
    readout = {
        name: rng.uniform(0.5, 1.5, np.shape(v)).astype(np.float32)
        for name, v in outputs.items()
        if _is_float(v)
    }

    def loss(float_inputs: dict, params: dict) -> jax.Array:
        out = transmuter.run(model, {**feeds, **float_inputs}, params=params, key=key)
        return sum(jnp.sum(out[n].astype(jnp.float32) * w) for n, w in readout.items())

    return loss


# Attributes that name an element type (Cast's `to`, a random op's `dtype`, a normalization's
# `stash_type`): they are retyped with the tensors.
_TYPE_ATTRIBUTES = {"to", "dtype", "stash_type", "output_dtype"}


# Normalizations whose statistics are float32 unless stash_type says otherwise: a float64 copy
# computes them in float64 too.
_STASHING = {"LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization"}
DOUBLE = onnx.TensorProto.DOUBLE


def as_float32(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the model with every float64 type, tensor and type attribute made float32."""
    return retyped(proto, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT)


def retyped(proto: onnx.ModelProto, old: int, new: int) -> onnx.ModelProto:
    """A copy of the model with every `old` element type (of values, tensors and the type
    attributes) made `new`."""
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    _retype_graph(copy.graph, old, new)
    return copy


def _retype_graph(graph: onnx.GraphProto, old: int, new: int) -> None:
    for info in (*graph.input, *graph.output, *graph.value_info):
        if info.type.tensor_type.elem_type == old:
            info.type.tensor_type.elem_type = new
    for tensor in graph.initializer:
        _retype_tensor(tensor, old, new)
    for node in graph.node:
        names = {attr.name for attr in node.attribute}
        if node.op_type in _STASHING and "stash_type" not in names and new == DOUBLE:
            node.attribute.append(helper.make_attribute("stash_type", DOUBLE))
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                _retype_tensor(attr.t, old, new)
            elif attr.type == onnx.AttributeProto.GRAPH:
                _retype_graph(attr.g, old, new)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    _retype_graph(sub, old, new)
            elif attr.name in _TYPE_ATTRIBUTES and attr.i == old:
                attr.i = new


def _retype_tensor(tensor: onnx.TensorProto, old: int, new: int) -> None:
    if tensor.data_type == old:
        array = numpy_helper.to_array(tensor).astype(dtypes.from_onnx(new))
        tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))
