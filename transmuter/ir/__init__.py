"""Transmuter's intermediate representation: a typed graph with symbolic shapes."""

from transmuter.ir.graph import (
    Dim,
    Graph,
    MapType,
    Model,
    Node,
    OptionalType,
    SequenceType,
    SymbolicDim,
    TensorType,
    ValueInfo,
    ValueType,
    subgraphs,
)

__all__ = [
    "Dim",
    "Graph",
    "MapType",
    "Model",
    "Node",
    "OptionalType",
    "SequenceType",
    "SymbolicDim",
    "TensorType",
    "ValueInfo",
    "ValueType",
    "subgraphs",
]
