"""com.microsoft MatMulNBits and GatherBlockQuantized against ONNX Runtime's CPU kernels.

Weights are packed here by the spec's layout (B [N, blocks, blob], values along K, low-order
bits first), not by a tool, so the test pins the layout; one case checks the packing that
onnxruntime.quantization's MatMulNBitsQuantizer writes.
"""

from __future__ import annotations

import copy

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper
from opcheck import (
    assert_close,
    check_node,
    make_node_model,
    ort_run,
    summation_atol,
    transmuter_runs,
)

from transmuter.errors import TransmuterError

MS = "com.microsoft"
WEIGHTS = ["B", "scales", "zero_points", "g_idx"]


def pack(values, bits):
    """Unsigned `values` [..., n] (n a multiple of 8 // bits) packed into uint8, low bits first."""
    per = 8 // bits
    values = np.asarray(values, np.uint32).reshape(values.shape[:-1] + (-1, per))
    out = np.zeros(values.shape[:-1], np.uint32)
    for i in range(per):
        out |= values[..., i] << (bits * i)
    return out.astype(np.uint8)


def pad_last(values, multiple):
    extra = -values.shape[-1] % multiple
    return np.concatenate([values, np.zeros(values.shape[:-1] + (extra,), values.dtype)], -1)


def quantized_weights(rng, n, k, bits, block_size):
    """Random q [N, K], scales and zero points [N, blocks], and packed B [N, blocks, blob]."""
    blocks = -(-k // block_size)
    q = rng.integers(0, 1 << bits, (n, k))
    scales = rng.uniform(0.01, 0.1, (n, blocks)).astype(np.float32)
    zeros = rng.integers(0, 1 << bits, (n, blocks))
    b = pack(pad_last(q, blocks * block_size).reshape(n, blocks, block_size), bits)
    return q, scales, zeros, b


def dequantized(q, scales, zeros, block_of_k):
    """Float64 (q - zero) * scale [N, K], scales and zeros picked per row of K."""
    return (q - zeros[:, block_of_k]) * scales.astype(np.float64)[:, block_of_k]


def reference(a, q, scales, zeros, block_of_k, bias=None):
    """Float64 A @ dequantized weightsᵀ."""
    y = a.astype(np.float64) @ dequantized(q, scales, zeros, block_of_k).T
    return y if bias is None else y + bias


def atol(a, q, scales, zeros, block_of_k):
    """The float32 accumulation's tolerance over K (ONNX Runtime sums in another order)."""
    w = dequantized(q, scales, zeros, block_of_k)
    return summation_atol(a.shape[-1], np.max(np.abs(a) @ np.abs(w).T, initial=0))


ZERO_FORMS = ["absent", "packed", "float"]


def zero_input(form, zeros, bits, dtype=np.float32):
    if form == "absent":
        return None
    if form == "packed":
        return pack(pad_last(zeros, 8 // bits), bits)
    return zeros.astype(dtype)


@pytest.mark.parametrize(
    "bits,block_size,k",
    [(4, 16, 64), (4, 32, 40), (4, 128, 300), (2, 16, 48), (2, 64, 70), (8, 16, 33), (8, 256, 256)],
)
@pytest.mark.parametrize("form", ZERO_FORMS)
def test_matmul_nbits(bits, block_size, k, form, rng):
    n = 6
    q, scales, zeros, b = quantized_weights(rng, n, k, bits, block_size)
    a = rng.standard_normal((3, k)).astype(np.float32)
    inputs = {"A": a, "B": b, "scales": scales, "zero_points": zero_input(form, zeros, bits)}
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block_size}
    block_of_k = np.arange(k) // block_size
    tolerance = atol(a, q, scales, zeros, block_of_k)
    if bits == 8 and form == "float":
        # ONNX Runtime's CPU kernel refuses 8-bit weights with float zero points.
        model = make_node_model("MatMulNBits", inputs, attrs, domain=MS, constants=WEIGHTS)
        expected = reference(a, q, scales, zeros, block_of_k).astype(np.float32)
        for mode, (got,) in transmuter_runs(model, inputs).items():
            assert_close(got, expected, rtol=1e-5, atol=tolerance, what=mode)
        return
    check_node(
        "MatMulNBits", inputs, attrs, domain=MS, constants=WEIGHTS, rtol=1e-5, atol=tolerance
    )


def test_matmul_nbits_matches_the_spec_formula(rng):
    q, scales, zeros, b = quantized_weights(rng, 5, 64, 4, 16)
    a = rng.standard_normal((2, 64)).astype(np.float32)
    inputs = {"A": a, "B": b, "scales": scales, "zero_points": zero_input("packed", zeros, 4)}
    expected = check_node(
        "MatMulNBits", inputs, {"K": 64, "N": 5, "block_size": 16}, domain=MS, constants=WEIGHTS
    )
    want = reference(a, q, scales, zeros, np.arange(64) // 16)
    np.testing.assert_allclose(expected[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("first", [np.nan, np.inf, -np.inf])
def test_matmul_nbits_a_non_finite_first_element_leaves_other_rows(first, rng):
    # The dequantization waits on A's first element (`_after`); what that element holds must
    # not reach the weights.
    q, scales, zeros, b = quantized_weights(rng, 4, 32, 4, 16)
    a = rng.standard_normal((3, 32)).astype(np.float32)
    a[0, 0] = first
    inputs = {"A": a, "B": b, "scales": scales}
    model = make_node_model(
        "MatMulNBits", inputs, {"K": 32, "N": 4, "block_size": 16}, domain=MS, constants=WEIGHTS
    )
    expected = reference(a[1:], q, scales, np.full_like(zeros, 8), np.arange(32) // 16)
    for mode, (got,) in transmuter_runs(model, inputs).items():
        assert not np.isfinite(got[0]).any(), mode
        assert_close(got[1:], expected.astype(np.float32), rtol=1e-5, atol=1e-5, what=mode)


@pytest.mark.parametrize("form", ZERO_FORMS)
def test_matmul_nbits_g_idx_bias_symbolic_batch(form, rng):
    k, n, block_size, bits = 64, 5, 16, 4
    q, scales, zeros, b = quantized_weights(rng, n, k, bits, block_size)
    g_idx = np.repeat(np.arange(k // block_size), block_size).astype(np.int32)
    rng.shuffle(g_idx)
    a = rng.standard_normal((2, 3, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    inputs = {
        "A": a,
        "B": b,
        "scales": scales,
        "zero_points": zero_input(form, zeros, bits),
        "g_idx": g_idx,
        "bias": bias,
    }
    attrs = {"K": k, "N": n, "block_size": block_size}
    options = dict(domain=MS, constants=WEIGHTS, symbolic={"A": [0, 1]})
    tolerance = atol(a, q, scales, zeros, g_idx)
    if form != "packed":
        check_node("MatMulNBits", inputs, attrs, rtol=1e-5, atol=tolerance, **options)
        return
    # ONNX Runtime 1.32's CPU kernel ignores packed uint8 zero points when g_idx is given (its
    # output equals the one for zero point 8); the spec applies each block's zero point.
    model = make_node_model("MatMulNBits", inputs, attrs, **options)
    expected = reference(a, q, scales, zeros, g_idx, bias).astype(np.float32)
    for mode, (got,) in transmuter_runs(model, inputs).items():
        assert_close(got, expected, rtol=1e-5, atol=tolerance, what=mode)


def test_matmul_nbits_weights_as_graph_inputs(rng):
    q, scales, zeros, b = quantized_weights(rng, 4, 32, 4, 16)
    inputs = {
        "A": rng.standard_normal((0, 2, 32)).astype(np.float32),
        "B": b,
        "scales": scales.reshape(-1),
        "zero_points": zero_input("packed", zeros, 4),
    }
    check_node("MatMulNBits", inputs, {"K": 32, "N": 4, "block_size": 16}, domain=MS)
    inputs["A"] = rng.standard_normal((3, 32)).astype(np.float32)
    check_node(
        "MatMulNBits", inputs, {"K": 32, "N": 4, "block_size": 16}, domain=MS, rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("bits,form", [(4, "absent"), (4, "packed"), (4, "float"), (8, "packed")])
def test_matmul_nbits_float16(bits, form, rng):
    # ONNX Runtime computes in float32 and rounds once to float16, as Transmuter does.
    k, n = 64, 5
    q, scales, zeros, b = quantized_weights(rng, n, k, bits, 32)
    inputs = {
        "A": rng.standard_normal((3, k)).astype(np.float16),
        "B": b,
        "scales": scales.astype(np.float16),
        "zero_points": zero_input(form, zeros, bits, np.float16),
        "g_idx": None,
        "bias": rng.standard_normal(n).astype(np.float16),
    }
    attrs = {"K": k, "N": n, "bits": bits, "block_size": 32}
    check_node("MatMulNBits", inputs, attrs, domain=MS, constants=WEIGHTS, rtol=1e-3, atol=1e-3)


def test_matmul_nbits_accuracy_level_keeps_level_0_semantics(rng):
    # Level 4 lets ONNX Runtime quantize A to int8; Transmuter never quantizes A, so its output
    # at level 4 is ONNX Runtime's at level 0.
    k, n = 128, 8
    q, scales, _, b = quantized_weights(rng, n, k, 4, 32)
    inputs = {"A": rng.standard_normal((4, k)).astype(np.float32), "B": b, "scales": scales}
    attrs = {"K": k, "N": n, "block_size": 32}
    level0 = ort_run(make_node_model("MatMulNBits", inputs, attrs, domain=MS), inputs)
    model = make_node_model("MatMulNBits", inputs, {**attrs, "accuracy_level": 4}, domain=MS)
    # Without zero points the spec's default is 8 (2^(bits - 1)).
    tolerance = atol(inputs["A"], q, scales, np.full(scales.shape, 8), np.arange(k) // 32)
    for mode, (got,) in transmuter_runs(model, inputs).items():
        assert_close(got, level0[0], rtol=1e-5, atol=tolerance, what=mode)


def test_matmul_nbits_empty_weights_give_the_bias(rng):
    bias = rng.standard_normal(5).astype(np.float32)
    inputs = {
        "A": rng.standard_normal((2, 3, 64)).astype(np.float32),
        "B": np.zeros((5, 0, 8), np.uint8),
        "scales": np.zeros((0,), np.float32),
        "zero_points": None,
        "g_idx": None,
        "bias": bias,
    }
    check_node("MatMulNBits", inputs, {"K": 64, "N": 5, "block_size": 16}, domain=MS)


@pytest.mark.parametrize("symmetric", [False, True])
def test_matmul_nbits_from_the_ort_quantizer(symmetric, rng):
    from onnxruntime.quantization import matmul_nbits_quantizer

    w = rng.standard_normal((96, 24)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "W"], ["Y"])],
        "g",
        [helper.make_tensor_value_info("A", onnx.TensorProto.FLOAT, ["batch", 96])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["batch", 24])],
        [onnx.numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    quantizer = matmul_nbits_quantizer.MatMulNBitsQuantizer(
        copy.deepcopy(model), bits=4, block_size=32, is_symmetric=symmetric
    )
    quantizer.process()
    quantized = quantizer.model.model
    assert [n.op_type for n in quantized.graph.node] == ["MatMulNBits"]
    inputs = {"A": rng.standard_normal((3, 96)).astype(np.float32)}
    expected = ort_run(quantized, inputs)
    for mode, (got,) in transmuter_runs(quantized, inputs).items():
        assert_close(got, expected[0], rtol=1e-5, atol=1e-5, what=mode)
    # 4-bit weights keep the product within a few percent of the float one.
    exact = inputs["A"] @ w
    np.testing.assert_allclose(expected[0], exact, atol=0.15 * np.abs(exact).max())


@pytest.mark.parametrize(
    "attrs,b_shape",
    [
        ({"bits": 3, "block_size": 16}, (4, 2, 6)),
        ({"bits": 4, "block_size": 24}, (4, 2, 12)),
        ({"bits": 4, "block_size": 8}, (4, 4, 4)),
        ({"bits": 4, "block_size": 16}, (4, 2, 16)),
        ({"bits": 4, "block_size": 16, "weight_prepacked": 1}, (4, 2, 8)),
    ],
)
def test_matmul_nbits_rejects(attrs, b_shape):
    inputs = {
        "A": np.zeros((2, 32), np.float32),
        "B": np.zeros(b_shape, np.uint8),
        "scales": np.ones((4, 2), np.float32),
    }
    model = make_node_model("MatMulNBits", inputs, {"K": 32, "N": 4, **attrs}, domain=MS)
    with pytest.raises(TransmuterError):
        transmuter_runs(model, inputs, compiled=False)


# GatherBlockQuantized: ONNX Runtime takes int4/float8/float4 data only as initializers.
DATA = ["data", "scales", "zero_points"]


def blocked(rng, shape, axis, block_size, low=0.1, high=1.0, dtype=np.float32):
    shape = list(shape)
    shape[axis] = -(-shape[axis] // block_size) if block_size else 1
    return rng.uniform(low, high, shape).astype(dtype)


@pytest.mark.parametrize("dtype,with_zero", [(ml_dtypes.int4, False), (ml_dtypes.uint4, True)])
@pytest.mark.parametrize(
    "gather_axis,quantize_axis", [(0, 2), (1, 2), (2, 0), (-1, 1), (1, -1), (0, 0), (2, 2)]
)
def test_gather_block_quantized_int4(dtype, gather_axis, quantize_axis, with_zero, rng):
    info = ml_dtypes.iinfo(dtype)
    data = rng.integers(info.min, info.max + 1, (4, 5, 40)).astype(dtype)
    scales = blocked(rng, data.shape, quantize_axis, 16)
    zeros = rng.integers(info.min, info.max + 1, scales.shape).astype(dtype) if with_zero else None
    inputs = {
        "data": data,
        "indices": np.array([[1, 0, -1], [2, 2, 0]], np.int64),
        "scales": scales,
        "zero_points": zeros,
    }
    attrs = {"block_size": 16, "gather_axis": gather_axis, "quantize_axis": quantize_axis}
    check_node("GatherBlockQuantized", inputs, attrs, domain=MS, constants=DATA)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("with_zero", [False, True])
@pytest.mark.parametrize("index_type", [np.int32, np.int64])
def test_gather_block_quantized_uint8(bits, with_zero, index_type, rng):
    rows, cols, block_size = 6, 80, 16
    q = rng.integers(0, 1 << bits, (rows, cols))
    scales = blocked(rng, (rows, cols), 1, block_size)
    zeros = None
    if with_zero:
        # Packed like data along the last axis; 5 blocks leave padding in the last byte.
        zeros = pack(pad_last(rng.integers(0, 1 << bits, scales.shape), 8 // bits), bits)
    inputs = {
        "data": pack(q, bits),
        "indices": np.array([[5, 0], [-1, 3], [2, 2]], index_type),
        "scales": scales,
        "zero_points": zeros,
    }
    attrs = {"bits": bits, "block_size": block_size}
    check_node(
        "GatherBlockQuantized", inputs, attrs, domain=MS, constants=DATA, symbolic={"indices": [0]}
    )


def test_gather_block_quantized_float16_scales(rng):
    data = rng.integers(-8, 8, (6, 64)).astype(ml_dtypes.int4)
    inputs = {
        "data": data,
        "indices": np.array([4, 1], np.int64),
        "scales": blocked(rng, data.shape, 1, 32, dtype=np.float16),
        "zero_points": rng.integers(-8, 8, (6, 2)).astype(ml_dtypes.int4),
    }
    check_node(
        "GatherBlockQuantized", inputs, {"block_size": 32}, domain=MS, constants=DATA, atol=1e-3
    )


@pytest.mark.parametrize(
    "dtype,block_size,scale_shape",
    [
        (ml_dtypes.float8_e4m3fn, 16, (4, 2)),
        (ml_dtypes.float8_e4m3fnuz, 0, (4, 1)),
        (ml_dtypes.float8_e5m2, 16, (1, 2)),
        (ml_dtypes.float8_e5m2fnuz, 16, (4, 2)),
        (ml_dtypes.float4_e2m1fn, 16, (4, 2)),
        (ml_dtypes.float4_e2m1fn, 0, (1, 1)),
    ],
)
def test_gather_block_quantized_float8(dtype, block_size, scale_shape, rng):
    data = rng.standard_normal((4, 32)).astype(dtype)
    inputs = {
        "data": data,
        "indices": np.array([3, 1, 3], np.int64),
        "scales": rng.uniform(0.1, 1.0, scale_shape).astype(np.float32),
    }
    check_node(
        "GatherBlockQuantized", inputs, {"block_size": block_size}, domain=MS, constants=DATA
    )


@pytest.mark.parametrize(
    "data,attrs",
    [
        (np.zeros((4, 32), np.uint8), {"bits": 4, "gather_axis": 1, "quantize_axis": 0}),
        (np.zeros((4, 32), np.uint8), {"bits": 3}),
        (np.zeros((4, 32), ml_dtypes.int4), {"block_size": 24}),
        (np.zeros((4, 32), np.int8), {}),
    ],
)
def test_gather_block_quantized_rejects(data, attrs):
    inputs = {
        "data": data,
        "indices": np.array([0], np.int64),
        "scales": np.ones((4, 2), np.float32),
    }
    model = make_node_model(
        "GatherBlockQuantized", inputs, {"block_size": 16, **attrs}, domain=MS, constants=DATA
    )
    with pytest.raises(TransmuterError):
        transmuter_runs(model, inputs, compiled=False)
