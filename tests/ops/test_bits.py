"""BitCast, SwiGLU and the losses against ONNX Runtime (onnx.reference where it lacks a case)."""

import ml_dtypes
import numpy as np
import pytest
from opcheck import check_node, make_node_model, transmuter_runs

from transmuter import dtypes
from transmuter.errors import TransmuterError


def _bits_of(rng, shape, dtype):
    """Values of `dtype` made of random bits (NaNs and infinities included for floats)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if dtype.name in ("int4", "uint4"):
        info = ml_dtypes.iinfo(dtype)
        return rng.integers(int(info.min), int(info.max) + 1, shape).astype(dtype)
    raw = rng.integers(0, 256, shape + (dtype.itemsize,), dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


@pytest.mark.parametrize(
    "source,target",
    [
        (np.float32, np.int32),
        (np.int32, np.float32),
        (np.uint32, np.float32),
        (np.float16, np.int16),
        (np.uint16, np.float16),
        (np.float64, np.int64),
        (np.int64, np.float64),
        (np.uint64, np.int64),
        (np.int8, np.uint8),
    ],
)
def test_bitcast(rng, source, target):
    x = _bits_of(rng, (3, 4), source)
    check_node("BitCast", {"x": x}, {"to": dtypes.to_onnx(target)}, opset=26)


@pytest.mark.parametrize(
    "source,target",
    [
        (np.bool_, np.uint8),
        (np.uint8, np.bool_),
        (np.bool_, np.int8),
        (np.complex64, np.int64),
        (np.complex64, np.float64),
        (np.uint64, np.complex64),
        (ml_dtypes.bfloat16, np.uint16),
        (np.float16, ml_dtypes.bfloat16),
        (ml_dtypes.float8_e4m3fn, np.uint8),
        (np.int8, ml_dtypes.float8_e5m2),
        (ml_dtypes.int4, ml_dtypes.uint4),
        (ml_dtypes.uint4, ml_dtypes.float4_e2m1fn),
    ],
)
def test_bitcast_special_types(rng, source, target):
    """bool, complex, bfloat16, float8 and 4-bit types, which ONNX Runtime's Python API cannot
    feed: onnx.reference."""
    if source == np.uint8 and target == np.bool_:
        x = rng.integers(0, 2, (3, 4), dtype=np.uint8)  # a bool byte is 0 or 1
    else:
        x = _bits_of(rng, (3, 4), source)
    check_node("BitCast", {"x": x}, {"to": dtypes.to_onnx(target)}, opset=26, reference="onnx")


def test_bitcast_is_little_endian():
    x = np.array([1.0 + 2.0j], np.complex64)
    model = make_node_model("BitCast", {"x": x}, {"to": dtypes.to_onnx(np.uint64)}, opset=26)
    for outputs in transmuter_runs(model, {"x": x}).values():
        # The real part occupies the low 32 bits.
        assert int(outputs[0][0]) == (0x40000000 << 32) | 0x3F800000


def test_bitcast_host_constant_and_zero_size(rng):
    check_node(
        "BitCast", {"x": _bits_of(rng, (2, 3), np.float32)}, {"to": 6}, opset=26, constants=["x"]
    )
    check_node("BitCast", {"x": np.zeros((0, 3), np.float16)}, {"to": 5}, opset=26)


def test_bitcast_symbolic_batch(rng):
    check_node(
        "BitCast", {"x": _bits_of(rng, (2, 3), np.int32)}, {"to": 12}, opset=26, symbolic={"x": [0]}
    )


@pytest.mark.parametrize("to", [dtypes.to_onnx(np.float64), dtypes.to_onnx(np.uint8), 8])
def test_bitcast_rejects_other_widths(rng, to):
    x = _bits_of(rng, (2, 3), np.float32)
    with pytest.raises(TransmuterError, match="BitCast"):
        transmuter_runs(make_node_model("BitCast", {"x": x}, {"to": to}, opset=26), {"x": x})


# SwiGLU (ONNX Runtime 1.32 cannot run its Swish-24 function body: onnx.reference)


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-6), (np.float64, 1e-12), (np.float16, 2e-3)])
@pytest.mark.parametrize("alpha", [1.0, 1.702])
def test_swiglu(rng, dtype, tol, alpha):
    inputs = {
        "A": (rng.standard_normal((2, 3, 5)) * 3).astype(dtype),
        "B": rng.standard_normal((2, 3, 5)).astype(dtype),
    }
    check_node("SwiGLU", inputs, {"alpha": alpha}, opset=28, reference="onnx", rtol=tol, atol=tol)


def test_swiglu_bfloat16_and_zero_size(rng):
    inputs = {k: rng.standard_normal((4, 6)).astype(ml_dtypes.bfloat16) for k in "AB"}
    check_node("SwiGLU", inputs, {}, opset=28, reference="onnx", rtol=2e-2, atol=2e-2)
    empty = {k: np.zeros((0, 6), np.float32) for k in "AB"}
    check_node("SwiGLU", empty, {}, opset=28, reference="onnx")


def test_swiglu_does_not_broadcast(rng):
    inputs = {
        "A": rng.standard_normal((2, 3)).astype(np.float32),
        "B": rng.standard_normal((1, 3)).astype(np.float32),
    }
    with pytest.raises(TransmuterError, match="same shape"):
        transmuter_runs(make_node_model("SwiGLU", inputs, {}, opset=28), inputs, compiled=False)


# NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss


def _loss_inputs(
    rng, op_type, shape, *, weight, ignore_index=None, target_dtype=np.int64, dtype=np.float32
):
    n, c, rest = shape[0], shape[1], shape[2:]
    target = rng.integers(0, c, (n,) + rest).astype(target_dtype)
    if ignore_index is not None:
        target.flat[::3] = ignore_index
    x = rng.standard_normal(shape).astype(dtype)
    w = rng.uniform(0.2, 2.0, (c,)).astype(dtype) if weight else None
    if op_type == "NegativeLogLikelihoodLoss":
        return {"input": x, "target": target, "weight": w}, ["input", "target", "weight"]
    return {"scores": x, "labels": target, "weights": w}, ["scores", "labels", "weights"]


def _loss(rng, op_type, shape, attrs, *, opset, weight, dtype=np.float32, tol=1e-5, **options):
    inputs, names = _loss_inputs(
        rng,
        op_type,
        shape,
        weight=weight,
        ignore_index=attrs.get("ignore_index"),
        dtype=dtype,
        **options,
    )
    outputs = 2 if op_type == "SoftmaxCrossEntropyLoss" else 1
    check_node(
        op_type, inputs, attrs, opset=opset, input_names=names, outputs=outputs, rtol=tol, atol=tol
    )


LOSSES = ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"]


@pytest.mark.parametrize("op_type", LOSSES)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weight", [False, True])
@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 4, 2)])
def test_losses(rng, op_type, reduction, weight, shape):
    _loss(rng, op_type, shape, {"reduction": reduction}, opset=13, weight=weight)


@pytest.mark.parametrize("op_type", LOSSES)
@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("weight", [False, True])
@pytest.mark.parametrize("ignore_index", [-1, 2, -100])
def test_losses_ignore_index(rng, op_type, reduction, weight, ignore_index):
    # With ignore_index=-1 and no weight, onnx.reference's NLL averages over all targets; ONNX
    # Runtime (followed here, like PyTorch and the reference's own SoftmaxCrossEntropyLoss)
    # averages over the targets that are not ignored.
    attrs = {"reduction": reduction, "ignore_index": ignore_index}
    _loss(rng, op_type, (6, 4, 3), attrs, opset=13, weight=weight)


@pytest.mark.parametrize(
    "op_type,opset", [(LOSSES[0], 12), (LOSSES[0], 22), (LOSSES[1], 12), (LOSSES[1], 13)]
)
@pytest.mark.parametrize("target_dtype", [np.int32, np.int64])
def test_losses_versions(rng, op_type, opset, target_dtype):
    attrs = {"reduction": "mean", "ignore_index": 1}
    _loss(rng, op_type, (3, 4, 5), attrs, opset=opset, weight=True, target_dtype=target_dtype)


@pytest.mark.parametrize("op_type", LOSSES)
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_losses_float16(rng, op_type, reduction):
    _loss(
        rng,
        op_type,
        (4, 5, 3),
        {"reduction": reduction},
        opset=13,
        weight=True,
        dtype=np.float16,
        tol=2e-3,
    )


@pytest.mark.parametrize("op_type", LOSSES)
def test_losses_float64(rng, op_type):
    _loss(rng, op_type, (4, 5), {}, opset=13, weight=True, dtype=np.float64, tol=1e-12)


def test_losses_bfloat16(rng):
    # ONNX Runtime has no bfloat16 kernel; onnx.reference computes in bfloat16 throughout.
    inputs, names = _loss_inputs(rng, LOSSES[0], (4, 5), weight=True, dtype=ml_dtypes.bfloat16)
    check_node(
        LOSSES[0],
        inputs,
        {"reduction": "none"},
        opset=22,
        input_names=names,
        reference="onnx",
        rtol=1e-2,
        atol=1e-2,
    )


@pytest.mark.parametrize("op_type", LOSSES)
def test_losses_all_ignored_mean_is_nan(rng, op_type):
    inputs, names = _loss_inputs(rng, op_type, (3, 4), weight=False)
    inputs[names[1]][:] = 7
    check_node(
        op_type,
        inputs,
        {"ignore_index": 7},
        opset=13,
        input_names=names,
        outputs=1 + (op_type == LOSSES[1]),
    )


def test_losses_symbolic_batch(rng):
    inputs, names = _loss_inputs(rng, LOSSES[1], (3, 4, 2), weight=True)
    check_node(
        LOSSES[1],
        inputs,
        {"reduction": "sum"},
        opset=13,
        input_names=names,
        outputs=2,
        symbolic={"scores": [0], "labels": [0]},
    )


def test_losses_bad_target_shape(rng):
    inputs = {
        "input": rng.standard_normal((3, 4)).astype(np.float32),
        "target": np.zeros((4,), np.int64),
    }
    with pytest.raises(TransmuterError, match="target"):
        model = make_node_model(LOSSES[0], inputs, {}, opset=13)
        transmuter_runs(model, inputs, compiled=False)
