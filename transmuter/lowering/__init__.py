"""Operator lowerings: one JAX function per ONNX operator, found through the registry."""

from transmuter.lowering.context import OpContext
from transmuter.lowering.registry import REQUIRED, Attribute, OpDef, lookup, op, registered, variant

# isort: split
# The op families import `op` from this package, so they are registered after it exists.
from transmuter.lowering import ops as _ops  # noqa: F401

__all__ = ["REQUIRED", "Attribute", "OpContext", "OpDef", "lookup", "op", "registered", "variant"]
