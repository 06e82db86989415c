"""What `jax.grad` does where the derivative is not available, or is zero by convention.

The rule: a gradient may be zero or may raise, never silently wrong.
- Piecewise-constant ops (Floor, a Cast to int and back, Hardmax, ArgMax, quantize-dequantize)
  keep JAX's convention: a zero gradient, which is also their derivative wherever it exists.
- Ops whose lowering JAX differentiates wrongly are registered with differentiable=False and
  raise a NodeError naming the node when a gradient reaches them: BitCast (JAX calls the
  derivative of a bit reinterpretation zero; between float types it is not).
- Ops that compute on the host (data-dependent shapes, strings) raise HostValueNeeded when the
  value they read is traced, as under jax.grad.
- Ops JAX cannot differentiate in reverse mode as lowered raise JAX's error: strict xfails
  below, each a limitation to lift, not a wrong value.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from grad_harness import check_gradients, graph_model, node_model
from onnx import TensorProto, helper

import transmuter
from transmuter.errors import HostValueNeeded, NodeError

BF16 = TensorProto.BFLOAT16


def loss_of(model, output: str):
    def loss(x):
        return jnp.sum(transmuter.run(model, {"X": x})[output].astype(jnp.float32))

    return loss


# ---- BitCast: differentiable=False --------------------------------------------------------


def bitcast_model():
    """Y = Cast(BitCast(X, bfloat16), float32) and Z = X * 2 + Cast(BitCast(X, int16)), X a
    float16 input."""
    return graph_model(
        [
            helper.make_node("BitCast", ["X"], ["as_bf16"], to=BF16),
            helper.make_node("Cast", ["as_bf16"], ["Y"], to=TensorProto.FLOAT),
            helper.make_node("BitCast", ["X"], ["as_int"], to=TensorProto.INT16),
            helper.make_node("Cast", ["as_int"], ["int_part"], to=TensorProto.FLOAT16),
            helper.make_node("Mul", ["X", "two"], ["twice"]),
            helper.make_node("Add", ["twice", "int_part"], ["Z"]),
        ],
        inputs={"X": np.zeros(4, np.float16)},
        constants={"two": np.array(2, np.float16)},
        outputs=["Y", "Z"],
        opset=26,
    )


X16 = np.array([1.5, -2.0, 0.25, 3.0], np.float16)


@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_a_gradient_through_bitcast_between_floats_raises_naming_the_node(transform):
    model = transmuter.load(bitcast_model())
    with pytest.raises(NodeError, match=r"node 'BitCast->as_bf16' \(ai.onnx::BitCast-26\)"):
        transform(jax.grad(loss_of(model, "Y")))(X16)


def test_bitcast_runs_forward_eagerly_under_jit_and_vmap():
    model = transmuter.load(bitcast_model())
    expected = X16.view(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(transmuter.run(model, {"X": X16})["Y"], expected)
    forward = jax.jit(lambda x: transmuter.run(model, {"X": x})["Y"])
    np.testing.assert_array_equal(forward(X16), expected)
    np.testing.assert_array_equal(jax.vmap(forward)(np.stack([X16, X16])), [expected] * 2)


def test_bitcast_to_integers_and_unused_bitcasts_keep_the_zero_convention():
    # Z's gradient passes X * 2 (2 everywhere) and the integer path, which has none; Y, which
    # reads the float BitCast, is computed but not differentiated, so nothing is refused.
    model = transmuter.load(bitcast_model())
    for transform in (lambda f: f, jax.jit):
        grad = transform(jax.grad(loss_of(model, "Z")))(X16)
        np.testing.assert_array_equal(grad, np.full(4, 2, np.float16))


# ---- host computation ---------------------------------------------------------------------

HOST_OPS = {
    "compress_data_dependent_shape": (
        "Compress",
        ["X", "keep"],
        {"axis": 0},
        {"keep": np.array([True, False, True])},
    ),
    "cast_to_string": ("Cast", ["X"], {"to": TensorProto.STRING}, {}),
}


@pytest.mark.parametrize("name", sorted(HOST_OPS))
def test_ops_reading_values_on_the_host_raise_under_grad(name):
    op_type, node_inputs, attrs, constants = HOST_OPS[name]
    x = np.array([0.5, -1.0, 2.0])
    model = transmuter.load(
        node_model(op_type, node_inputs, attrs, inputs={"X": x}, constants=constants)
    )
    transmuter.run(model, {"X": x})  # eagerly, with concrete values, it runs

    def loss(v):
        out = transmuter.run(model, {"X": v})["Y"]
        return jnp.sum(v) if out.dtype == object else jnp.sum(out)

    with (
        jax.enable_x64(True),
        pytest.raises(HostValueNeeded, match=rf"{op_type} node '{op_type}->Y'"),
    ):
        jax.grad(loss)(x)


# ---- piecewise constant: zero by convention -----------------------------------------------


def test_piecewise_constant_ops_have_a_zero_gradient():
    # X = 0.1 k + 0.03 (+-0.01): at least 0.01 from every rounding jump of Floor (integers) and
    # of QuantizeLinear with scale 0.1 (0.05 + 0.1 k), and with a unique maximum for Hardmax and
    # ArgMax, so finite differences are zero too.
    rng = np.random.default_rng(0)
    x = 0.1 * rng.permutation(np.arange(-6, 6)).reshape(3, 4) + 0.03 + rng.uniform(-0.01, 0.01)
    proto = graph_model(
        [
            helper.make_node("Floor", ["X"], ["floor"]),
            helper.make_node("Cast", ["X"], ["as_int"], to=TensorProto.INT64),
            helper.make_node("Cast", ["as_int"], ["int_round_trip"], to=TensorProto.DOUBLE),
            helper.make_node("Hardmax", ["X"], ["hardmax"]),
            helper.make_node("ArgMax", ["X"], ["argmax"], axis=1),
            helper.make_node("Cast", ["argmax"], ["argmax_float"], to=TensorProto.DOUBLE),
            # QuantizeLinear takes no float64: quantize a float32 copy.
            helper.make_node("Cast", ["X"], ["x32"], to=TensorProto.FLOAT),
            helper.make_node("QuantizeLinear", ["x32", "scale", "zero"], ["q"]),
            helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["fake_quant"]),
        ],
        inputs={"X": x},
        constants={"scale": np.array(0.1, np.float32), "zero": np.array(0, np.int8)},
        outputs=["floor", "int_round_trip", "hardmax", "argmax_float", "fake_quant"],
    )
    (grads, _) = check_gradients(proto, {"X": x})
    np.testing.assert_array_equal(grads["X"], np.zeros_like(x))


# ---- loud limitations: differentiable ops JAX cannot differentiate as lowered --------------


# JAX differentiates a scatter-multiply only with unique_indices, which indexing.py passes when
# the host indices are unique (test_grad_data.py). Repeated (or traced) indices get no gradient
# rule: NodeError naming the node. Lift it by a log/sign formulation for repeats.
@pytest.mark.xfail(strict=True, raises=NodeError, reason="JAX: scatter_mul with repeated indices")
@pytest.mark.parametrize("op_type", ["ScatterElements", "ScatterND"])
def test_scatter_with_mul_reduction_and_repeated_indices(op_type):
    x, updates = np.arange(1.0, 7.0).reshape(2, 3), np.array([[2.0, 3.0, 0.5], [4.0, 0.5, 2.0]])
    indices = (
        np.array([[1, 0, 1], [1, 1, 0]]) if op_type == "ScatterElements" else np.array([[1], [1]])
    )
    proto = node_model(
        op_type,
        ["X", "I", "U"],
        {"reduction": "mul"},
        inputs={"X": x, "U": updates},
        constants={"I": indices},
    )
    check_gradients(proto, {"X": x, "U": updates})


# A Loop whose condition is computed from traced values runs as lax.while_loop, which JAX
# cannot differentiate in reverse mode (its error, raised in the backward pass, names no
# node). Lift it by unrolling when the loop runs eagerly, or a bounded lax.scan.
@pytest.mark.xfail(strict=True, raises=ValueError, reason="JAX: reverse mode of while_loop")
def test_loop_with_a_data_dependent_condition():
    # h doubles while its sum stays under 10: from sum 1.5, three iterations.
    double = helper.make_tensor_value_info
    body = helper.make_graph(
        [
            helper.make_node("Add", ["h_in", "h_in"], ["h_out"]),
            helper.make_node("ReduceSum", ["h_out"], ["total"], keepdims=0),
            helper.make_node("Less", ["total", "limit"], ["cond_out"]),
        ],
        "body",
        [
            double("i", TensorProto.INT64, []),
            double("cond_in", TensorProto.BOOL, []),
            double("h_in", TensorProto.DOUBLE, [2]),
        ],
        [double("cond_out", TensorProto.BOOL, []), double("h_out", TensorProto.DOUBLE, [2])],
    )
    h0 = np.array([0.5, 1.0])
    proto = graph_model(
        [helper.make_node("Loop", ["", "keep", "H0"], ["Y"], body=body)],
        inputs={"H0": h0},
        constants={"keep": np.array(True), "limit": np.array(10.0)},
    )
    check_gradients(proto, {"H0": h0})
