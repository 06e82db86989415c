"""Transmuter's intermediate representation: a typed graph with symbolic shapes."""

from transmuter.ir.graph import (
    Dim,
    Graph,
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
