"""Operator lowerings: one JAX function per ONNX operator, found through the registry."""

from transmuter.lowering.context import OpContext
from transmuter.lowering.registry import OpDef, lookup, op, registered

from transmuter.lowering import ops as _ops  # noqa: E402,F401  (registers every op family)

__all__ = ["OpContext", "OpDef", "lookup", "op", "registered"]
