"""Linear algebra: MatMul, Gemm, Einsum, Det.

Products of float16/bfloat16 accumulate in float32 (`preferred_element_type`) and round once;
the other types accumulate in their own type. Matmul precision on accelerators is JAX's default
(`jax_default_matmul_precision`), which the caller controls.
"""

from __future__ import annotations

from collections import Counter

import jax.numpy as jnp

from transmuter.dtypes import accumulation_dtype
from transmuter.errors import ShapeError
from transmuter.lowering import op, variant
from transmuter.lowering.shared import broadcast_unidirectional


@op("MatMul", since=(1, 9, 13))
def matmul(A, B):
    """ONNX MatMul-1..13: numpy.matmul (batched, 1-D operands promoted and squeezed)."""
    if A.ndim == 0 or B.ndim == 0:
        raise ShapeError(
            f"MatMul operands must have rank >= 1, got shapes {list(A.shape)} and {list(B.shape)}"
        )
    product = jnp.matmul(A, B, preferred_element_type=accumulation_dtype(A.dtype))
    return product.astype(A.dtype)


def _gemm(A, B, C, alpha, beta, transA, transB, broadcast_c: bool):
    if A.ndim != 2 or B.ndim != 2:
        raise ShapeError(
            f"Gemm A and B must be matrices, got shapes {list(A.shape)} and {list(B.shape)}"
        )
    a = A.T if transA else A
    b = B.T if transB else B
    if a.shape[1] != b.shape[0]:
        raise ShapeError(
            f"Gemm inner dims differ: A' is {list(a.shape)} and B' is {list(b.shape)} "
            f"(transA={transA}, transB={transB})"
        )
    wide = accumulation_dtype(A.dtype)
    y = jnp.matmul(a, b, preferred_element_type=wide)
    if alpha != 1.0:
        y = y * jnp.asarray(alpha, dtype=wide)
    # With beta == 0, C is not read (as BLAS and ONNX Runtime do), so Inf/NaN in C stay out.
    if C is not None and beta != 0.0:
        if not broadcast_c and tuple(C.shape) != tuple(y.shape):
            raise ShapeError(
                f"Gemm C of shape {list(C.shape)} must be {list(y.shape)} unless broadcast=1"
            )
        c = broadcast_unidirectional(C.astype(wide), y.shape, "Gemm C")
        y = y + (c if beta == 1.0 else c * jnp.asarray(beta, dtype=wide))
    return y.astype(A.dtype)


@op("Gemm", since=(1, 6))
def gemm_v1(A, B, C, *, alpha=1.0, beta=1.0, broadcast=0, transA=0, transB=0):
    """ONNX Gemm-1..6: alpha*A'B' + beta*C; C broadcasts only with broadcast=1."""
    return _gemm(A, B, C, alpha, beta, transA, transB, broadcast_c=bool(broadcast))


@op("Gemm", since=(11, 13))
def gemm(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    """ONNX Gemm-11..13: alpha*A'B' + beta*C with optional C, broadcast to (M, N)."""
    return _gemm(A, B, C, alpha, beta, transA, transB, broadcast_c=True)


gemm_v7 = op("Gemm", since=(7, 9))(variant(
    gemm, "gemm_v7", "ONNX Gemm-7..9: Gemm-11 with C required.", required=("C",)
))  # fmt: skip


@op("Einsum", since=(12, 28))
def einsum(*Inputs, equation):
    """ONNX Einsum-12..28: Einstein summation; implicit outputs sort labels by ASCII."""
    if not Inputs:
        raise ShapeError("Einsum needs at least one input")
    dtype = Inputs[0].dtype
    wide = accumulation_dtype(dtype)
    equation = equation.replace(" ", "")
    if wide != dtype and _sums_within_an_operand(equation):
        # jnp.einsum sums such labels with a reduce that mixes the operand's half type with
        # preferred_element_type (a promotion strict mode refuses), so widen the operands first.
        Inputs = [x.astype(wide) for x in Inputs]
    result = jnp.einsum(equation, *Inputs, preferred_element_type=wide)
    return result.astype(dtype)


def _sums_within_an_operand(equation: str) -> bool:
    """True when a label is summed inside one operand: it repeats within a term (a diagonal),
    or it appears in a single term and not in the output."""
    inputs, arrow, output = equation.partition("->")
    terms = [term.replace("...", ".") for term in inputs.split(",")]
    if any(len(set(term)) != len(term) for term in terms):
        return True
    in_terms = Counter(label for term in terms for label in term)
    if not arrow:
        # Implicit output: every label that appears once (and the ellipsis) is kept.
        return False
    output = output.replace("...", ".")
    return any(count == 1 and label not in output for label, count in in_terms.items())


@op("Det", since=(11, 22))
def det(X):
    """ONNX Det-11..22: determinants of the trailing square matrices of X."""
    if X.ndim < 2 or X.shape[-1] != X.shape[-2]:
        raise ShapeError(f"Det input must be [..., M, M], got shape {list(X.shape)}")
    return jnp.linalg.det(X.astype(accumulation_dtype(X.dtype))).astype(X.dtype)
