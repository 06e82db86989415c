"""Single-node test models and their comparison with ONNX Runtime or onnx.reference.

    check_node("Gemm", {"A": a, "B": b}, {"transA": 1}, opset=13)

builds a one-node model, runs it through `transmuter.compile` (and `transmuter.run`, eager, where
that can take another path), and compares every output with ONNX Runtime (graph optimizations
off) or, with reference="onnx", with `onnx.reference`. Inputs named in `constants` become
initializers, as the values that decide shapes (Reshape's shape, Slice's starts) are in real
exports.
"""

from __future__ import annotations

import dis
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

import transmuter
from transmuter import dtypes
from transmuter.errors import UnsupportedOpError
from transmuter.lowering.registry import lookup

DEFAULT_OPSET = 21


def make_model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    """A model of `nodes` over value infos `inputs` and `outputs`, importing ai.onnx `opset`."""
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def make_node_model(
    op_type: str,
    inputs: Mapping[str, Any],
    attrs: Mapping[str, Any] | None = None,
    *,
    opset: int = DEFAULT_OPSET,
    domain: str = "",
    outputs: Sequence[str] | int = 1,
    constants: Sequence[str] = (),
    input_names: Sequence[str] | None = None,
    symbolic: Mapping[str, Sequence[int]] | None = None,
) -> onnx.ModelProto:
    """A model with one node. `inputs` maps names to arrays (None for an absent optional input);
    `input_names` gives the node's input order if it differs. `symbolic` marks axes of inputs
    as named dims ({"X": [0]} makes X's first dim 'batch0')."""
    names = list(input_names) if input_names is not None else list(inputs)
    out_names = [f"out{i}" for i in range(outputs)] if isinstance(outputs, int) else list(outputs)
    node = helper.make_node(
        op_type,
        [n if inputs.get(n) is not None else "" for n in names],
        out_names,
        domain=domain,
        **(attrs or {}),
    )
    graph_inputs, initializers = [], []
    for name in names:
        value = inputs.get(name)
        if value is None:
            continue
        value = np.asarray(value)
        if name in constants:
            initializers.append(onnx.numpy_helper.from_array(value, name))
            continue
        shape: list[Any] = list(value.shape)
        for axis in (symbolic or {}).get(name, ()):
            shape[axis] = f"batch{axis}"
        graph_inputs.append(helper.make_tensor_value_info(name, dtypes.to_onnx(value.dtype), shape))
    graph_outputs = [helper.make_value_info(n, onnx.TypeProto()) for n in out_names if n]
    graph = helper.make_graph([node], f"{op_type}_test", graph_inputs, graph_outputs, initializers)
    opsets = [helper.make_opsetid("", opset if not domain else 21)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1 if domain == "com.microsoft" else opset))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model


def feeds(model: onnx.ModelProto, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    graph_inputs = {i.name for i in model.graph.input}
    return {k: np.asarray(v) for k, v in inputs.items() if k in graph_inputs and v is not None}


def ort_run(model: onnx.ModelProto, inputs: Mapping[str, Any]) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds(model, inputs))


def reference_run(model: onnx.ModelProto, inputs: Mapping[str, Any]) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    return list(ReferenceEvaluator(model).run(None, feeds(model, inputs)))


def transmuter_runs(
    model: onnx.ModelProto,
    inputs: Mapping[str, Any],
    *,
    compiled: bool = True,
    eager: bool | None = None,
):
    """Outputs of `transmuter.run` (eager) and, if `compiled`, of `transmuter.compile`. `eager`
    defaults to where an eager run can differ from the compiled one (`eager_can_differ`)."""
    loaded = transmuter.load(model)
    data = feeds(model, inputs)
    runs = {}
    if not compiled or (eager_can_differ(model) if eager is None else eager):
        runs["eager"] = transmuter.run(loaded, data)
    if compiled:
        runs["compiled"] = transmuter.compile(loaded, data)(data)
    return {mode: [out[name] for name in loaded.outputs] for mode, out in runs.items()}


def eager_can_differ(model: onnx.ModelProto) -> bool:
    """Whether a node's lowering asks if a value is traced (`jax.core.Tracer`, or control flow's
    `_concrete`), itself or through the functions it calls, so that run eagerly it can take
    another path than compiled; an unsupported node counts, for its error. The other lowerings
    run the same code either way, and an eager run of them only repeats the compiled one op by
    op (a third of tests/ops' time). So do those that ask only through `ctx.host_value` (a
    method, which this search does not enter): compiled, a traced value breaks the graph there
    and the node runs on the concrete one, as it does eagerly."""
    opsets = {o.domain: o.version for o in model.opset_import}
    for node in model.graph.node:
        try:
            fn = lookup(node.domain, node.op_type, opsets.get(node.domain, DEFAULT_OPSET)).fn
        except UnsupportedOpError:
            return True
        if _asks_if_traced(fn, set()):
            return True
    return False


_ASKING = {"Tracer", "_concrete"}


def _asks_if_traced(fn: Any, seen: set) -> bool:
    """Whether `fn`'s code, or a Transmuter function it calls by a global name or closes over,
    names `Tracer` or `_concrete`."""
    fn = inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    if code is None or fn in seen:
        return False
    seen.add(fn)
    names, globals_ = _names(code)
    if names & _ASKING:
        return True
    named = [fn.__globals__.get(n) for n in globals_]
    named += [value for cell in fn.__closure__ or () for value in _contents(cell)]
    return any(
        _asks_if_traced(f, seen)
        for f in named
        if callable(f) and getattr(f, "__module__", "").startswith("transmuter.")
    )


def _names(code: Any) -> tuple[set[str], set[str]]:
    """The names a code object and the functions nested in it use (globals and attributes
    alike: `jax.core.Tracer`), and those of them it loads as globals."""
    names, globals_ = set(code.co_names), set()
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            globals_.add(instruction.argval)
    for const in code.co_consts:
        if inspect.iscode(const):
            inner = _names(const)
            names |= inner[0]
            globals_ |= inner[1]
    return names, globals_


def _contents(cell: Any) -> list:
    """A closure cell's value, as a list of one; none while the variable is unbound."""
    try:
        return [cell.cell_contents]
    except ValueError:
        return []


def assert_close(actual: Any, expected: Any, *, rtol: float, atol: float, what: str) -> None:
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.dtype == expected.dtype, (
        f"{what}: dtype {actual.dtype}, expected {expected.dtype}"
    )
    assert actual.shape == expected.shape, (
        f"{what}: shape {actual.shape}, expected {expected.shape}"
    )
    if expected.dtype == object or expected.dtype.kind in "biu":
        np.testing.assert_array_equal(actual, expected, err_msg=what)
    else:
        np.testing.assert_allclose(
            actual.astype(np.float64) if expected.dtype.kind != "c" else actual,
            expected.astype(np.float64) if expected.dtype.kind != "c" else expected,
            rtol=rtol,
            atol=atol,
            err_msg=what,
            equal_nan=True,
        )


def check_node(
    op_type: str,
    inputs: Mapping[str, Any],
    attrs: Mapping[str, Any] | None = None,
    *,
    opset: int = DEFAULT_OPSET,
    reference: str = "ort",
    rtol: float = 1e-5,
    atol: float = 1e-6,
    compiled: bool = True,
    expected: Sequence[np.ndarray] | None = None,
    **model_options: Any,
) -> list[np.ndarray]:
    """Run one node through Transmuter (eager and compiled) and the reference, or compare with
    `expected` where given; assert equal dtypes, shapes and values. Returns the reference
    outputs."""
    model = make_node_model(op_type, inputs, attrs, opset=opset, **model_options)
    if expected is None:
        expected = ort_run(model, inputs) if reference == "ort" else reference_run(model, inputs)
    for mode, outputs in transmuter_runs(model, inputs, compiled=compiled).items():
        assert len(outputs) == len(expected), (
            f"{mode}: {len(outputs)} outputs, expected {len(expected)}"
        )
        for i, (got, want) in enumerate(zip(outputs, expected)):
            assert_close(got, want, rtol=rtol, atol=atol, what=f"{op_type} output {i} ({mode})")
    return expected


def summation_atol(terms: int, magnitude: float, dtype: Any = np.float32) -> float:
    """The absolute tolerance between two correct sums of `terms` products accumulated in
    `dtype` in different orders (the order follows the CPU's vector width, so it differs between
    machines). Each is within gamma(terms + 1) * magnitude of the exact value, gamma(n) =
    n u / (1 - n u) with u the unit roundoff (Higham, Accuracy and Stability of Numerical
    Algorithms, 3.1: terms - 1 additions and a rounding of each product, plus one rounding of an
    operand computed first, such as a dequantized weight), so the two are within twice that.
    `magnitude` is the largest sum of |products| over the outputs: max(|A| @ |B|) for a matmul."""
    nu = (terms + 1) * float(np.finfo(dtype).eps) / 2
    return 2 * nu / (1 - nu) * float(magnitude)


# ONNX Runtime's u8 x s8 integer GEMMs on x86 CPUs without VNNI (AVX2, AVX-512BW) multiply with
# vpmaddubsw, which adds each pair of adjacent products in a saturating 16-bit lane: their
# results then differ from the exact ones, always smaller in magnitude, by up to tens. u8 x u8 and
# s8 x s8 are widened to 16 bits first and are exact on every CPU, as is u8 x s8 with VNNI.
# Tests of integer products keep ORT as the oracle only where it is exact on every CPU.
PAIR_LIMIT = 2**15 - 1


def ort_may_saturate(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ONNX Runtime may saturate multiplying the integer operands `a` and `b` on some
    CPU: one is uint8 and the other int8, and a pair of their products can pass 2^15 - 1."""
    if {np.dtype(a.dtype), np.dtype(b.dtype)} != {np.dtype(np.uint8), np.dtype(np.int8)}:
        return False
    largest = int(np.abs(a.astype(np.int32)).max(initial=0))
    return 2 * largest * int(np.abs(b.astype(np.int32)).max(initial=0)) > PAIR_LIMIT


def as_uint8(x: Any, zero: Any) -> tuple[np.ndarray, np.ndarray]:
    """int8 `x` and its zero point (None: 0) as the uint8 pair with the same x - zero."""
    x = np.asarray(x)
    zero = np.zeros((), np.int8) if zero is None else np.asarray(zero)
    if x.dtype != np.int8 or zero.dtype != np.int8:
        raise ValueError(f"as_uint8 takes int8 values and zero points, got {x.dtype}, {zero.dtype}")
    return tuple((v.astype(np.int16) + 128).astype(np.uint8) for v in (x, zero))


# One integer product of an op: its uint8 operand (None where the op quantizes a float input to
# uint8 itself), its int8 operand and that operand's zero point input.
Product = tuple[str | None, str, str]


def portable_reference(
    op_type: str,
    inputs: Mapping[str, Any],
    attrs: Mapping[str, Any] | None = None,
    *,
    products: Sequence[Product],
    **model_options: Any,
) -> list[np.ndarray] | None:
    """ONNX Runtime's outputs computed so that they hold on every CPU, for check_node's
    `expected`: where ORT may saturate a product (`ort_may_saturate`), its int8 operand and zero
    point move to uint8 (`as_uint8`), the same exact integer products through ORT's u8 x u8
    kernels. None where ORT on `inputs` as they are is exact (check_node then runs it)."""
    shifted = dict(inputs)
    for unsigned, signed, zero in products:
        a = np.asarray(inputs[unsigned]) if unsigned else np.full(1, 255, np.uint8)
        if ort_may_saturate(a, np.asarray(inputs[signed])):
            shifted[signed], shifted[zero] = as_uint8(inputs[signed], inputs.get(zero))
    if all(shifted[name] is inputs[name] for name in inputs):
        return None
    return ort_run(make_node_model(op_type, shifted, attrs, **model_options), shifted)
