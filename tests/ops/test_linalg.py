"""MatMul, Gemm, Einsum and Det against ONNX Runtime (or onnx.reference where ORT has no kernel)."""

import ml_dtypes
import numpy as np
import pytest
from opcheck import assert_close, check_node, make_node_model, transmuter_runs

from transmuter.errors import TransmuterError

TOL = {
    np.float16: {"rtol": 1e-2, "atol": 1e-2},
    np.float32: {"rtol": 1e-5, "atol": 1e-5},
    np.float64: {"rtol": 1e-10, "atol": 1e-10},
}


def _data(rng, shape, dtype=np.float32):
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0 if np.dtype(dtype).kind == "u" else -5, 6, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _expect(op_type, inputs, attrs, expected, *, opset, rtol=1e-6, atol=1e-6, **options):
    """Run through Transmuter only and compare with `expected` (for semantics no reference has)."""
    model = make_node_model(op_type, inputs, attrs, opset=opset, **options)
    for mode, outputs in transmuter_runs(model, inputs).items():
        for i, (got, want) in enumerate(zip(outputs, expected, strict=True)):
            assert_close(got, want, rtol=rtol, atol=atol, what=f"{op_type} output {i} ({mode})")


# ---------------------------------------------------------------------------------- MatMul


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [
        ((3, 4), (4, 5)),
        ((2, 3, 4), (4, 5)),
        ((2, 1, 3, 4), (5, 4, 2)),
        ((4,), (4, 3)),
        ((2, 3, 4), (4,)),
        ((4,), (4,)),
        ((0, 4), (4, 3)),
        ((3, 0), (0, 2)),
    ],
    ids=str,
)
def test_matmul_shapes(rng, a_shape, b_shape):
    check_node("MatMul", {"A": _data(rng, a_shape), "B": _data(rng, b_shape)}, opset=13)


@pytest.mark.parametrize("opset", [1, 9, 13])
@pytest.mark.parametrize(
    "dtype", [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint32]
)
def test_matmul_dtypes_and_versions(rng, opset, dtype):
    if np.dtype(dtype).kind in "iu" and opset < 9:
        dtype = np.float32  # integer MatMul arrives in opset 9
    inputs = {"A": _data(rng, (2, 3, 8), dtype), "B": _data(rng, (8, 5), dtype)}
    # ONNX Runtime builds an invalid Cast for float16 at opset 1.
    reference = "onnx" if (dtype, opset) == (np.float16, 1) else "ort"
    check_node("MatMul", inputs, opset=opset, reference=reference, **TOL.get(dtype, {}))


def test_matmul_half_accumulates_in_float32():
    # 4096 products of 1: a float16 accumulator would stall at 2048.
    a = np.ones((1, 4096), np.float16)
    b = np.ones((4096, 1), np.float16)
    _expect("MatMul", {"A": a, "B": b}, {}, [np.full((1, 1), 4096, np.float16)], opset=13)
    inputs = {"A": a.astype(ml_dtypes.bfloat16), "B": b.astype(ml_dtypes.bfloat16)}
    _expect("MatMul", inputs, {}, [np.full((1, 1), 4096, ml_dtypes.bfloat16)], opset=13)


def test_matmul_symbolic_batch_and_constant_weight(rng):
    inputs = {"A": _data(rng, (3, 5, 4)), "B": _data(rng, (4, 6))}
    check_node("MatMul", inputs, opset=13, constants=["B"], symbolic={"A": [0]})


def test_matmul_rejects_mismatched_dims(rng):
    inputs = {"A": _data(rng, (3, 4)), "B": _data(rng, (5, 2))}
    with pytest.raises(TransmuterError):
        _expect("MatMul", inputs, {}, [], opset=13)


# ------------------------------------------------------------------------------------ Gemm


@pytest.mark.parametrize("transA", [0, 1])
@pytest.mark.parametrize("transB", [0, 1])
@pytest.mark.parametrize("c_shape", [(3, 5), (5,), (1, 5), (3, 1), ()], ids=str)
def test_gemm(rng, transA, transB, c_shape):
    a = _data(rng, (4, 3) if transA else (3, 4))
    b = _data(rng, (5, 4) if transB else (4, 5))
    inputs = {"A": a, "B": b, "C": _data(rng, c_shape)}
    attrs = {"transA": transA, "transB": transB, "alpha": 0.5, "beta": 2.0}
    check_node("Gemm", inputs, attrs, opset=13, constants=["C"])


@pytest.mark.parametrize("opset", [7, 9, 11, 13])
def test_gemm_versions(rng, opset):
    inputs = {"A": _data(rng, (3, 4)), "B": _data(rng, (4, 2)), "C": _data(rng, (2,))}
    check_node("Gemm", inputs, {"alpha": 1.5}, opset=opset)


@pytest.mark.parametrize("opset", [11, 13])
def test_gemm_without_c(rng, opset):
    inputs = {"A": _data(rng, (3, 4)), "B": _data(rng, (2, 4))}
    check_node("Gemm", inputs, {"transB": 1, "beta": 3.0}, opset=opset)


@pytest.mark.parametrize("opset", [1, 6])
def test_gemm_legacy_broadcast(rng, opset):
    a, b = _data(rng, (3, 4)), _data(rng, (4, 2))
    c_full, c_row = _data(rng, (3, 2)), _data(rng, (2,))
    # ONNX Runtime has no Gemm before opset 7, onnx.reference none before opset 6.
    _expect("Gemm", {"A": a, "B": b, "C": c_full}, {}, [a @ b + c_full], opset=opset, rtol=1e-5)
    attrs = {"broadcast": 1, "alpha": 2.0}
    _expect(
        "Gemm", {"A": a, "B": b, "C": c_row}, attrs, [2 * a @ b + c_row], opset=opset, rtol=1e-5
    )
    with pytest.raises(TransmuterError, match="broadcast=1"):
        _expect("Gemm", {"A": a, "B": b, "C": c_row}, {}, [a @ b], opset=opset)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.int64, np.uint64])
def test_gemm_dtypes(rng, dtype):
    inputs = {
        "A": _data(rng, (3, 4), dtype),
        "B": _data(rng, (4, 5), dtype),
        "C": _data(rng, (5,), dtype),
    }
    # ONNX Runtime has Gemm kernels for float types only.
    reference = "ort" if np.dtype(dtype).kind == "f" else "onnx"
    attrs = {"alpha": 2.0, "beta": 3.0}
    check_node("Gemm", inputs, attrs, opset=13, reference=reference, **TOL.get(dtype, {}))


def test_gemm_zero_beta_ignores_c_and_zero_size(rng):
    a, b = _data(rng, (3, 4)), _data(rng, (4, 2))
    c = np.full((3, 2), np.nan, np.float32)
    _expect("Gemm", {"A": a, "B": b, "C": c}, {"beta": 0.0}, [a @ b], opset=13, rtol=1e-5)
    inputs = {"A": _data(rng, (0, 4)), "B": b, "C": _data(rng, (2,))}
    check_node("Gemm", inputs, opset=13)


def test_gemm_rejects_bad_shapes(rng):
    a, b = _data(rng, (3, 4)), _data(rng, (4, 2))
    with pytest.raises(TransmuterError, match="broadcastable"):
        _expect("Gemm", {"A": a, "B": b, "C": _data(rng, (3,))}, {}, [], opset=13)
    with pytest.raises(TransmuterError, match="inner dims"):
        _expect("Gemm", {"A": a, "B": b}, {"transA": 1}, [], opset=13)


# ---------------------------------------------------------------------------------- Einsum


@pytest.mark.parametrize(
    "equation, shapes",
    [
        ("ij,jk->ik", [(2, 3), (3, 4)]),
        ("ij,jk", [(2, 3), (3, 4)]),
        ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
        ("ij->ji", [(2, 3)]),
        ("ii->i", [(3, 3)]),
        ("ii", [(3, 3)]),
        ("ij->", [(2, 3)]),
        ("i,i", [(4,), (4,)]),
        ("i,j->ij", [(2,), (3,)]),
        ("...ij,...jk->...ik", [(5, 2, 3), (5, 3, 4)]),
        ("i...,j...", [(2, 3), (4, 3)]),
        ("ab, bc -> ac", [(2, 3), (3, 4)]),
        ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
        ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_einsum(rng, equation, shapes):
    inputs = {f"x{i}": _data(rng, shape) for i, shape in enumerate(shapes)}
    check_node("Einsum", inputs, {"equation": equation}, opset=12, rtol=1e-5, atol=1e-5)


def test_einsum_upper_case_labels_sort_before_lower_case(rng):
    # ONNX Runtime rejects upper-case labels, which the spec allows.
    inputs = {"x0": _data(rng, (2, 3)), "x1": _data(rng, (3, 4))}
    check_node("Einsum", inputs, {"equation": "Ab,bc"}, opset=12, reference="onnx", rtol=1e-5)
    check_node("Einsum", {"x0": _data(rng, (2, 3))}, {"equation": "bA"}, opset=12, reference="onnx")


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("opset", [12, 28])
def test_einsum_dtypes(rng, dtype, opset):
    inputs = {"x0": _data(rng, (2, 3, 4), dtype), "x1": _data(rng, (2, 4, 3), dtype)}
    check_node(
        "Einsum",
        inputs,
        {"equation": "bij,bjk->bik"},
        opset=opset,
        **TOL.get(dtype, {}),
    )


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize(
    "equation, shapes",
    [
        ("ij->i", [(3, 4)]),
        ("ij->", [(3, 4)]),
        ("ii->i", [(3, 3)]),
        ("ii", [(3, 3)]),
        ("ij,jk->i", [(2, 3), (3, 4)]),
        ("ij,kl->", [(2, 3), (4, 5)]),
        ("ii,ij->j", [(3, 3), (3, 2)]),
        ("...ij->...", [(2, 3, 4)]),
        ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_einsum_half_sums_within_an_operand(rng, dtype, equation, shapes):
    """Labels summed inside one operand (test_einsum_sum_bfloat16): half inputs accumulate in
    float32 and round once, with no float32/half promotion."""
    inputs = {f"x{i}": _data(rng, shape).astype(dtype) for i, shape in enumerate(shapes)}
    wide = [x.astype(np.float32) for x in inputs.values()]
    want = np.asarray(np.einsum(equation, *wide)).astype(dtype)
    _expect("Einsum", inputs, {"equation": equation}, [want], opset=12, rtol=1e-2, atol=1e-2)


def test_einsum_bfloat16_sum_accumulates_in_float32():
    # 4096 ones: a bfloat16 accumulator would stall at 256.
    x = np.ones((4, 1024), ml_dtypes.bfloat16)
    _expect("Einsum", {"x0": x}, {"equation": "ij->"}, [np.array(4096, x.dtype)], opset=12)


# ------------------------------------------------------------------------------------- Det


@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (2, 1, 2, 2), (0, 3, 3), (1, 1)], ids=str)
@pytest.mark.parametrize("opset", [11, 22])
def test_det(rng, shape, opset):
    check_node("Det", {"X": _data(rng, shape)}, opset=opset, rtol=1e-4, atol=1e-5)


def test_det_dtypes_and_singular(rng):
    # ONNX Runtime has no float64 Det.
    x = _data(rng, (2, 3, 3), np.float64)
    check_node("Det", {"X": x}, opset=22, reference="onnx", **TOL[np.float64])
    # Neither reference has a float16 Det; the float32 result rounded once is what we compute.
    half = _data(rng, (2, 3, 3), np.float16)
    want = np.linalg.det(half.astype(np.float32)).astype(np.float16)
    _expect("Det", {"X": half}, {}, [want], opset=22, rtol=2e-3, atol=2e-3)
    singular = np.array([[1.0, 2.0], [2.0, 4.0]], np.float32)
    check_node("Det", {"X": singular}, opset=22)


def test_det_rejects_non_square(rng):
    with pytest.raises(TransmuterError, match="M, M"):
        _expect("Det", {"X": _data(rng, (2, 3))}, {}, [], opset=22)
