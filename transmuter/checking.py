"""Checking Transmuter against ONNX Runtime on one model: inputs made from the model's specs,
the reference run (graph optimizations off), per-output errors, and the first node where the
two disagree. Used by `transmuter check` and the coverage tools; ONNX Runtime is optional (a
test dependency, never a runtime one)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from transmuter import ir
from transmuter.errors import TransmuterError
from transmuter.frontend.edit import reference_model
from transmuter.runtime.execute import intermediates

# Sizes for named dims when the caller gives none, by what the name says it counts. A past
# length of 0 keeps "total" lengths equal to the new sequence, whatever they are named.
DEFAULT_DIMS = (("batch", 1), ("past", 0), ("", 8))


def dim_value(name: str, dims: Mapping[str, int]) -> int:
    """The size for a named dim: the caller's, else a small default chosen by its name."""
    if name in dims:
        return dims[name]
    lowered = name.lower()
    return next(size for word, size in DEFAULT_DIMS if word in lowered)


def example_inputs(
    model,
    dims: Mapping[str, int] | None = None,
    seed: int = 0,
    given: Mapping[str, Any] | None = None,
) -> dict:
    """Inputs for every tensor input of `model`: the `given` ones as they are, the others made
    up, shaped by their declared dims. A named dim takes its size from `dims`, else from a given
    input declaring it, else from `DEFAULT_DIMS`. Values follow the input's name: masks are ones,
    token type / segment ids zeros, position ids 0..n-1 along the last axis, other integers
    small ids (0..15, below any real vocabulary), floats standard normal, booleans true."""
    rng = np.random.default_rng(seed)
    given = dict(given or {})
    sizes = _dims_of(model, given)
    sizes.update(dims or {})
    made = {}
    for name in model.inputs:
        if name in given:
            made[name] = given[name]
            continue
        spec = model.input_specs[name]
        if not isinstance(spec, ir.TensorType) or spec.shape is None:
            raise TransmuterError(
                f"input {name!r} is {spec or 'undeclared'}: give it explicitly (--input)"
            )
        shape = tuple(d if isinstance(d, int) else dim_value(d.name, sizes) for d in spec.shape)
        made[name] = _values(name.lower(), shape, np.dtype(spec.dtype), rng)
    return made


def _dims_of(model, given: Mapping[str, Any]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for name, value in given.items():
        spec = model.input_specs.get(name)
        if isinstance(spec, ir.TensorType) and spec.shape is not None:
            for dim, size in zip(spec.shape, np.shape(value)):
                if isinstance(dim, ir.SymbolicDim):
                    sizes.setdefault(dim.name, size)
    return sizes


def _values(name: str, shape: tuple[int, ...], dtype: np.dtype, rng) -> np.ndarray:
    if dtype == np.bool_:
        return np.ones(shape, bool)
    if dtype.kind in "iu":
        if "mask" in name:
            return np.ones(shape, dtype)
        if "type" in name or "segment" in name:
            return np.zeros(shape, dtype)
        if "position" in name and shape:
            return np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()
        return rng.integers(0, 16, shape).astype(dtype)
    if dtype.kind == "f" or dtype.kind == "V":  # "V": bfloat16 and friends
        return rng.standard_normal(shape).astype(dtype)
    raise TransmuterError(f"cannot make example values of type {dtype}: give the input")


def reference_outputs(
    source, inputs: Mapping[str, Any], *, expose_intermediates: bool = False
) -> dict[str, np.ndarray]:
    """ONNX Runtime's outputs (CPU, graph optimizations off) by name; every intermediate of the
    main graph too when asked."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise TransmuterError(
            "comparing needs onnxruntime: pip install onnxruntime (a test dependency)"
        ) from None
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        reference_model(source, expose_intermediates=expose_intermediates),
        options,
        providers=["CPUExecutionProvider"],
    )
    wanted = {i.name for i in session.get_inputs()}
    feeds = {k: np.asarray(v) for k, v in inputs.items() if k in wanted}
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


@dataclass(frozen=True)
class Difference:
    """How one output of Transmuter compares with the reference: the largest absolute and
    relative errors, and whether every element is within atol + rtol * |reference|."""

    name: str
    max_abs: float
    max_rel: float
    ok: bool
    detail: str = ""  # why it is not ok, when the errors alone don't say


def difference(name: str, ours: Any, theirs: Any, *, rtol: float, atol: float) -> Difference:
    a, b = np.asarray(ours), np.asarray(theirs)
    if a.shape != b.shape or a.dtype != b.dtype:
        detail = f"{a.dtype}{list(a.shape)} vs reference {b.dtype}{list(b.shape)}"
        return Difference(name, float("inf"), float("inf"), False, detail)
    if a.size == 0:
        return Difference(name, 0.0, 0.0, True)
    if a.dtype.kind not in "fcV":
        wrong = int(np.sum(a != b))
        return Difference(name, float(wrong > 0), float(wrong > 0), not wrong, f"{wrong} differ")
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if not (np.isnan(a64) == np.isnan(b64)).all():
        return Difference(name, float("inf"), float("inf"), False, "NaN placement differs")
    finite = ~np.isnan(b64)
    err = np.abs(a64 - b64)[finite]
    ref = np.abs(b64)[finite]
    if err.size == 0:
        return Difference(name, 0.0, 0.0, True)
    rel = err / np.maximum(ref, np.finfo(np.float32).tiny)
    ok = bool(np.all(err <= atol + rtol * ref))
    return Difference(name, float(err.max()), float(rel.max()), ok)


def compare(
    ours: Mapping[str, Any], theirs: Mapping[str, Any], *, rtol: float = 1e-4, atol: float = 1e-5
) -> list[Difference]:
    """One `Difference` per reference output, in the reference's order."""
    return [
        difference(name, ours[name], value, rtol=rtol, atol=atol) for name, value in theirs.items()
    ]


@dataclass(frozen=True)
class Divergence:
    """The first node (in graph order) whose output differs beyond tolerance."""

    node: str
    op_type: str
    output: str
    inputs: tuple[str, ...]
    difference: Difference


def first_divergence(
    model, source, inputs: Mapping[str, Any], *, rtol: float = 1e-4, atol: float = 1e-5
) -> Divergence | None:
    """Run `model` eagerly keeping every value, and ONNX Runtime with every intermediate as an
    output; compare node by node and return the first disagreement."""
    ours = intermediates(model, inputs)
    theirs = reference_outputs(source, inputs, expose_intermediates=True)
    for node in model.ir.graph.nodes:
        for name in node.outputs:
            if name and name in theirs and name in ours:
                diff = difference(name, ours[name], theirs[name], rtol=rtol, atol=atol)
                if not diff.ok:
                    return Divergence(node.label, node.op_type, name, node.inputs, diff)
    return None
