"""The exceptions Transmuter raises. Every one derives from TransmuterError."""

from __future__ import annotations


class TransmuterError(Exception):
    """Base class of every error Transmuter raises on purpose."""


class ModelLoadError(TransmuterError):
    """The model file cannot be read: corrupt, truncated, or refers to data it may not read."""


class UnsupportedOpError(TransmuterError):
    """No lowering is registered for a node's (domain, op type) at the model's opset."""

    def __init__(self, domain: str, op_type: str, opset: int, node: str, detail: str = ""):
        self.domain, self.op_type, self.opset, self.node = domain, op_type, opset, node
        where = f"node {node!r}" if node else "an unnamed node"
        message = f"{domain or 'ai.onnx'}::{op_type} at opset {opset} ({where}) is not supported"
        super().__init__(f"{message}: {detail}" if detail else message)


class InputError(TransmuterError):
    """The inputs given to a model do not match its declared inputs."""


class ShapeError(TransmuterError):
    """A value's shape does not satisfy what an operator requires."""


class NodeError(TransmuterError):
    """An operator failed on a node; the message names the node and the cause."""


class HostValueNeeded(TransmuterError):
    """A value must be known on the host (it decides a shape or a branch) but is only known on the
    device, inside a trace. The compiling runtime breaks the graph here; a user's own `jax.jit`
    cannot, so there it surfaces as this error."""

    def __init__(self, node: str, op_type: str, input_name: str, reason: str):
        self.node, self.op_type, self.input_name, self.reason = node, op_type, input_name, reason
        super().__init__(
            f"{op_type} node {node!r} needs {reason} ({input_name!r}) as a concrete value, but it "
            "is computed from traced data. Run eagerly, use transmuter.compile (which splits the "
            "graph there), or pass the inputs it depends on as static_inputs."
        )


class CacheError(TransmuterError):
    """The persistent compile cache (cache_dir) holds an entry that does not fit its program."""


class Overloaded(TransmuterError):
    """A `Serving` queue is full (max_queue requests waiting): retry later."""


class ServingClosed(TransmuterError):
    """The `Serving` was closed and takes no new requests."""
