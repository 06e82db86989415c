"""ONNX Runtime as the reference: a CPU session with graph optimizations off, its outputs, and
where its integer kernels saturate (so that a difference there is ORT's, not ours).
ONNX Runtime comes with `pip install transmuter[check]`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from transmuter import cpu, dtypes, ir
from transmuter.errors import TransmuterError
from transmuter.frontend.edit import reference_model
from transmuter.runtime.model import Model


def reference_session(source, *, optimized: bool = False, expose_intermediates: bool = False):
    """An ONNX Runtime CPU session on `source` as `reference_model` prepares it: graph
    optimizations off for a reference, ORT's defaults when `optimized` (for timing)."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise TransmuterError(
            "comparing needs onnxruntime: pip install onnxruntime (a test dependency)"
        ) from None
    prepared = reference_model(source, expose_intermediates=expose_intermediates)
    options = ort.SessionOptions()
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if prepared.data_dir is not None:
        # A model loaded from bytes finds its external data files in this folder.
        options.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", prepared.data_dir
        )
    try:
        return ort.InferenceSession(prepared.data, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT's own error types
        raise TransmuterError(
            f"ONNX Runtime (the reference) cannot load the model: {str(exc).strip()}"
        ) from exc


def reference_feeds(session, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The inputs `session` takes, as numpy arrays: ORT rejects feeds for inputs it does not
    list (initializers declared as inputs, inputs nothing reads)."""
    wanted = {i.name for i in session.get_inputs()}
    return {k: np.asarray(v) for k, v in inputs.items() if k in wanted}


def reference_outputs(
    source, inputs: Mapping[str, Any], *, expose_intermediates: bool = False
) -> dict[str, np.ndarray]:
    """ONNX Runtime's outputs (CPU, graph optimizations off) by name; every intermediate of the
    main graph too when asked."""
    session = reference_session(source, expose_intermediates=expose_intermediates)
    names = [o.name for o in session.get_outputs()]
    try:
        return dict(zip(names, session.run(names, reference_feeds(session, inputs))))
    except Exception as exc:  # ORT's own error types; the message says what it rejected
        raise TransmuterError(
            f"ONNX Runtime (the reference) failed on these inputs: {str(exc).strip()}"
        ) from exc


# ONNX Runtime's integer GEMMs (MLAS) on x86 CPUs without VNNI multiply u8 by s8 with AVX2's or
# AVX-512BW's vpmaddubsw, which adds each pair of adjacent products in a saturating 16-bit lane:
# 255 * 127 + 255 * 127 comes back as 32767, so ORT's result is smaller in magnitude than the
# exact one (its quantizer's `reduce_range`, 7-bit weights, exists for this). With VNNI
# (vpdpbusd) the products accumulate in 32 bits and are exact; u8 x u8 and s8 x s8 are widened
# to 16 bits first and are exact on every CPU.
_PAIR_LIMIT = 2**15 - 1
# The operand inputs of the operators ORT computes through those kernels: (activation, weight)
# input indices; None where the op quantizes a float input to uint8 itself.
_INTEGER_PRODUCTS: Mapping[tuple[str, str], tuple[tuple[int | None, int], ...]] = MappingProxyType(
    {
        ("", "MatMulInteger"): ((0, 1),),
        ("", "ConvInteger"): ((0, 1),),
        ("", "QLinearMatMul"): ((0, 3),),
        ("", "QLinearConv"): ((0, 3),),
        ("com.microsoft", "QGemm"): ((0, 3),),
        ("com.microsoft", "MatMulIntegerToFloat"): ((0, 1),),
        ("com.microsoft", "QAttention"): ((0, 1),),
        ("com.microsoft", "DynamicQuantizeMatMul"): ((None, 1),),
        ("com.microsoft", "DynamicQuantizeLSTM"): ((None, 1), (None, 2)),
    }
)
_U8, _S8 = np.dtype(np.uint8), np.dtype(np.int8)


@dataclass(frozen=True)
class SaturatingProduct:
    """A node whose u8 x s8 product ONNX Runtime may compute with saturating 16-bit pair sums:
    `largest` bounds a pair of products (from the weights' values where they are initializers,
    else from the types' ranges)."""

    node: str
    op_type: str
    inputs: tuple[str, str]
    largest: int


def reference_saturation(
    model: Model | ir.Model, *, vnni: bool | None = None
) -> list[SaturatingProduct]:
    """The nodes where ONNX Runtime's reference may saturate: none where the CPU that ran it had
    VNNI (`vnni`; this CPU's when not given), else every u8 x s8 integer product whose pairs of
    products can pass 2^15 - 1."""
    if vnni is None:
        vnni = cpu.has_vnni()
    if vnni:
        return []
    graph = model.graph if isinstance(model, ir.Model) else model.ir.graph
    return _saturating(graph, {})


def _saturating(graph: ir.Graph, outer: Mapping[str, np.dtype]) -> list[SaturatingProduct]:
    types = dict(outer)
    types.update({v.name: v.type.dtype for v in graph.inputs if isinstance(v.type, ir.TensorType)})
    types.update(
        {n: v.type.dtype for n, v in graph.value_info.items() if isinstance(v.type, ir.TensorType)}
    )
    types.update({name: value.dtype for name, value in graph.initializers.items()})
    found = []
    for node in graph.nodes:
        for sub in ir.subgraphs(node):
            found.extend(_saturating(sub, types))
        for output, dtype in zip(node.outputs, _output_dtypes(node, types)):
            if dtype is not None:
                types.setdefault(output, np.dtype(dtype))
        for a, b in _INTEGER_PRODUCTS.get((node.domain, node.op_type), ()):
            if b >= len(node.inputs) or (a is not None and a >= len(node.inputs)):
                continue
            a_name = node.inputs[a] if a is not None else node.inputs[0]
            a_type = types.get(a_name) if a is not None else _U8
            b_type = types.get(node.inputs[b])
            if {a_type, b_type} != {_U8, _S8}:
                continue
            largest = 2 * _magnitude(graph, a_name if a is not None else None, a_type)
            largest *= _magnitude(graph, node.inputs[b], b_type)
            if largest > _PAIR_LIMIT:
                names = (a_name, node.inputs[b])
                found.append(SaturatingProduct(node.label, node.op_type, names, largest))
    return found


def _output_dtypes(node: ir.Node, types: Mapping[str, np.dtype]) -> list[Any]:
    """The output dtypes of the ops that make integer operands, where the node says them."""
    if node.op_type == "DynamicQuantizeLinear":
        return [_U8]
    if node.op_type == "QuantizeLinear":
        zero = types.get(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
        target = node.attrs.get("output_dtype", 0)
        return [zero if zero is not None else (dtypes.from_onnx(target) if target else _U8)]
    if node.op_type == "Cast":
        return [dtypes.from_onnx(node.attrs["to"])]
    if node.op_type in ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity"):
        return [types.get(node.inputs[0])]
    return []


def _magnitude(graph: ir.Graph, name: str | None, dtype: np.dtype) -> int:
    """The largest |value| `name` can hold: its own largest where it is an initializer."""
    value = graph.initializers.get(name) if name else None
    if value is not None and value.size:
        return int(np.abs(value.astype(np.int32)).max())
    return 255 if dtype == _U8 else 128
