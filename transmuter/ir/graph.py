"""The typed graph Transmuter lowers: values with dtypes and symbolic shapes, nodes, subgraphs.

Plain data, no onnx and no jax: the front end builds it, the lowering reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SymbolicDim:
    """A dimension known only by name (`batch`, `sequence`); bound by the shapes of a call."""

    name: str

    def __repr__(self) -> str:
        return self.name


Dim = int | SymbolicDim


@dataclass(frozen=True)
class TensorType:
    """A tensor's element dtype and shape; `shape` is None when even the rank is unknown."""

    dtype: np.dtype
    shape: tuple[Dim, ...] | None

    def __str__(self) -> str:
        dims = "?" if self.shape is None else ", ".join(str(d) for d in self.shape)
        return f"tensor({np.dtype(self.dtype).name})[{dims}]"


@dataclass(frozen=True)
class SequenceType:
    """An ONNX sequence: a Python list of values of `elem` type at run time."""

    elem: ValueType | None

    def __str__(self) -> str:
        return f"sequence({self.elem})"


@dataclass(frozen=True)
class OptionalType:
    """An ONNX optional: None or a value of `elem` type at run time."""

    elem: ValueType | None

    def __str__(self) -> str:
        return f"optional({self.elem})"


@dataclass(frozen=True)
class MapType:
    """An ONNX map: a Python dict at run time, keys `key` (int64 as Python ints, or strings),
    values of `value` type (numpy scalars or arrays)."""

    key: np.dtype
    value: ValueType | None

    def __str__(self) -> str:
        return f"map({np.dtype(self.key).name}, {self.value})"


ValueType = TensorType | SequenceType | OptionalType | MapType


@dataclass(frozen=True)
class ValueInfo:
    """A named value with its declared type (None when the file declares none)."""

    name: str
    type: ValueType | None


@dataclass
class Node:
    """One operator application. A missing optional input or output is the empty name ''."""

    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""

    @property
    def label(self) -> str:
        """How errors name this node: its name, or its op type and first output."""
        return self.name or f"{self.op_type}->{self.outputs[0] if self.outputs else '?'}"


@dataclass
class Graph:
    """A topologically sorted graph. Subgraphs (If/Loop/Scan bodies) may read outer values by
    name; those appear in `outer_names`."""

    nodes: list[Node]
    inputs: list[ValueInfo]
    outputs: list[ValueInfo]
    initializers: dict[str, np.ndarray] = field(default_factory=dict)
    value_info: dict[str, ValueInfo] = field(default_factory=dict)
    name: str = ""

    @property
    def outer_names(self) -> set[str]:
        """Names read by this graph (or its subgraphs) that it does not define itself."""
        defined = {v.name for v in self.inputs} | set(self.initializers)
        needed: set[str] = set()
        for node in self.nodes:
            needed.update(n for n in node.inputs if n and n not in defined)
            for sub in subgraphs(node):
                needed.update(sub.outer_names - defined)
            defined.update(node.outputs)
        return needed


@dataclass
class Model:
    """A loaded model: its main graph, the opset of each domain it imports, and its metadata."""

    graph: Graph
    opsets: dict[str, int]
    ir_version: int = 0
    producer: str = ""
    metadata: dict[str, str] = field(default_factory=dict)


def subgraphs(node: Node) -> list[Graph]:
    """The graphs held in a node's attributes (If branches, Loop/Scan bodies)."""
    found: list[Graph] = []
    for value in node.attrs.values():
        if isinstance(value, Graph):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, Graph))
    return found
