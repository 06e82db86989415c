"""Run a graph's float tensors in another float type (`transmuter.load(..., compute_type=...)`).

float16, bfloat16 and float32 tensors inside the graph become the compute type: initializers,
tensor attributes, the dtype attributes of Cast / EyeLike / random / window ops, and declared
types. The model's interface keeps the file's types: a Cast after each float input and before
each float output converts at the boundary, so callers feed and receive what the file declares.
float64 and the 8-bit and smaller float types are left alone: they are deliberate choices
(quantization formats, double precision), not the precision a graph happens to be stored in.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from transmuter import dtypes
from transmuter.ir.graph import (
    Graph,
    Model,
    Node,
    OptionalType,
    SequenceType,
    TensorType,
    ValueInfo,
    ValueType,
)

COMPUTE_TYPES = ("float16", "bfloat16", "float32")

# Attributes holding an ONNX element type that decides the dtype of a float result.
_DTYPE_ATTRS = {
    "Cast": "to",
    "EyeLike": "dtype",
    "Bernoulli": "dtype",
    "RandomNormal": "dtype",
    "RandomNormalLike": "dtype",
    "RandomUniform": "dtype",
    "RandomUniformLike": "dtype",
    "SequenceEmpty": "dtype",
    "DequantizeLinear": "output_dtype",
    "BlackmanWindow": "output_datatype",
    "HammingWindow": "output_datatype",
    "HannWindow": "output_datatype",
    "MelWeightMatrix": "output_datatype",
}
# Cast-1 names its target type with a string.
_CAST_V1_NAMES = {"FLOAT16": 10, "BFLOAT16": 16, "FLOAT": 1}


def with_compute_type(model: Model, compute_type: str, *, keep_storage: bool = False) -> Model:
    """`model` with its float16 / bfloat16 / float32 tensors computed in `compute_type`.

    keep_storage=True leaves the main graph's initializers in the file's type, each converted
    by a Cast where the graph starts: the weights stay half precision in memory (and as params)
    while the arithmetic runs in `compute_type`."""
    if compute_type not in COMPUTE_TYPES:
        raise ValueError(f"compute_type must be one of {COMPUTE_TYPES}, got {compute_type!r}")
    rewrite = _Rewrite(_numpy_dtype(compute_type))
    graph = rewrite.graph(model.graph)
    graph = rewrite.boundary(model.graph, graph)
    if keep_storage:
        graph = rewrite.stored(model.graph, graph)
    return dataclasses.replace(model, graph=graph)


def runs_half_in_float32(model: Model) -> bool:
    """Whether `transmuter.load` runs this graph in float32 with its half-precision weights kept
    (its default): the main graph stores or declares float16 / bfloat16 tensors, and declares
    every output's type. The rewrite keeps the interface by casting outputs back to their
    declared types, which an undeclared output lacks (it would come out in float32); such a
    graph runs with every op rounding to half precision instead."""
    halves = {np.dtype(np.float16), _numpy_dtype("bfloat16")}
    graph = model.graph
    if any(v.type is None for v in graph.outputs):
        return False
    declared = [*graph.inputs, *graph.outputs, *graph.value_info.values()]
    return any(a.dtype in halves for a in graph.initializers.values()) or any(
        isinstance(v.type, TensorType) and v.type.dtype in halves for v in declared
    )


def _numpy_dtype(name: str) -> np.dtype:
    return np.dtype(dtypes.ONNX_TO_NUMPY[16]) if name == "bfloat16" else np.dtype(name)


class _Rewrite:
    def __init__(self, target: np.dtype):
        self.target = target
        self.sources = {_numpy_dtype(n) for n in COMPUTE_TYPES} - {target}
        self.target_code = dtypes.to_onnx(target)
        self.source_codes = {dtypes.to_onnx(d) for d in self.sources}

    def graph(self, graph: Graph) -> Graph:
        return Graph(
            nodes=[self.node(n) for n in graph.nodes],
            inputs=[self.value_info(v) for v in graph.inputs],
            outputs=[self.value_info(v) for v in graph.outputs],
            initializers={k: self.array(v) for k, v in graph.initializers.items()},
            value_info={k: self.value_info(v) for k, v in graph.value_info.items()},
            name=graph.name,
        )

    def node(self, node: Node) -> Node:
        attrs = {k: self.attr(v) for k, v in node.attrs.items()}
        which = _DTYPE_ATTRS.get(node.op_type) if node.domain == "" else None
        if which in attrs:
            attrs[which] = self.dtype_attr(attrs[which])
        if node.op_type == "Constant" and node.domain == "":
            # value_float(s) always make float32; as a tensor they can take the compute type.
            for name in ("value_float", "value_floats"):
                if name in attrs:
                    attrs["value"] = self.array(np.asarray(attrs.pop(name), np.float32))
        return dataclasses.replace(node, attrs=attrs)

    def attr(self, value: Any) -> Any:
        if isinstance(value, Graph):
            return self.graph(value)
        if isinstance(value, np.ndarray):
            return self.array(value)
        if isinstance(value, tuple) and any(isinstance(v, (Graph, np.ndarray)) for v in value):
            return tuple(self.attr(v) for v in value)
        return value

    def dtype_attr(self, value: Any) -> Any:
        if isinstance(value, str):
            if _CAST_V1_NAMES.get(value.upper()) in self.source_codes:
                return next(k for k, v in _CAST_V1_NAMES.items() if v == self.target_code)
            return value
        return self.target_code if value in self.source_codes else value

    def array(self, array: np.ndarray) -> np.ndarray:
        return array.astype(self.target) if array.dtype in self.sources else array

    def value_info(self, info: ValueInfo) -> ValueInfo:
        return ValueInfo(info.name, self.type(info.type))

    def type(self, t: ValueType | None) -> ValueType | None:
        if isinstance(t, TensorType):
            return TensorType(self.target, t.shape) if t.dtype in self.sources else t
        if isinstance(t, SequenceType):
            return SequenceType(self.type(t.elem))
        if isinstance(t, OptionalType):
            return OptionalType(self.type(t.elem))
        return t

    def boundary(self, declared: Graph, graph: Graph) -> Graph:
        """Keep the declared interface: float inputs and outputs of a source type are cast
        between their declared type and the compute type, under renamed internal values."""
        renames: dict[str, str] = {}
        head, tail = [], []
        for info in declared.inputs:
            if self._converted(info.type):
                inner = renames[info.name] = f"{info.name}__compute"
                head.append(Node("Cast", "", (info.name,), (inner,), {"to": self.target_code}))
        for info in declared.outputs:
            # An input passed straight through as an output already has its declared type.
            if self._converted(info.type) and info.name not in renames:
                inner = renames[info.name] = f"{info.name}__compute"
                code = dtypes.to_onnx(info.type.dtype)
                tail.append(Node("Cast", "", (inner,), (info.name,), {"to": code}))
        body = _renamed(graph, renames)
        return dataclasses.replace(
            body,
            nodes=head + body.nodes + tail,
            inputs=list(declared.inputs),
            outputs=list(declared.outputs),
        )

    def stored(self, declared: Graph, graph: Graph) -> Graph:
        """`graph` with the initializers `declared` holds in a source type kept in that type,
        each read through a Cast to the compute type."""
        kept = {k: v for k, v in declared.initializers.items() if v.dtype in self.sources}
        renames = {name: f"{name}__compute" for name in kept}
        body = _renamed(graph, renames)
        casts = [
            Node("Cast", "", (name,), (renames[name],), {"to": self.target_code}) for name in kept
        ]
        # Graph outputs keep their names: one that is an initializer is read as stored.
        return dataclasses.replace(
            body,
            nodes=casts + body.nodes,
            initializers={**body.initializers, **kept},
            outputs=graph.outputs,
        )

    def _converted(self, t: ValueType | None) -> bool:
        return isinstance(t, TensorType) and t.dtype in self.sources


def _renamed(graph: Graph, renames: dict[str, str]) -> Graph:
    """`graph` with every use and definition of the renamed values, subgraphs included."""

    def name(n: str) -> str:
        return renames.get(n, n)

    def node(n: Node) -> Node:
        attrs = {k: _renamed_attr(v, renames) for k, v in n.attrs.items()}
        return dataclasses.replace(
            n,
            inputs=tuple(name(i) for i in n.inputs),
            outputs=tuple(name(o) for o in n.outputs),
            attrs=attrs,
        )

    return dataclasses.replace(
        graph,
        nodes=[node(n) for n in graph.nodes],
        outputs=[ValueInfo(name(v.name), v.type) for v in graph.outputs],
        value_info={name(k): ValueInfo(name(k), v.type) for k, v in graph.value_info.items()},
    )


def _renamed_attr(value: Any, renames: dict[str, str]) -> Any:
    if isinstance(value, Graph):
        return _renamed(value, renames)
    if isinstance(value, tuple):
        return tuple(_renamed_attr(v, renames) for v in value)
    return value
