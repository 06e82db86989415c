"""What an operator that asks for it (`@op(..., context=True)`) sees of the runtime."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import jax
import numpy as np

from transmuter import ir
from transmuter.errors import HostValueNeeded


@dataclass
class OpContext:
    """The node being lowered, its opset, and the runtime services an op may need.

    run_graph(graph, inputs) evaluates a subgraph (If/Loop/Scan bodies) with the enclosing
    scope visible and returns its outputs in order. next_key() returns a fresh PRNG key for
    random ops. recompute(names, feeds) evaluates the named values of the graph this node is in
    again, from `feeds` (name -> value) in place of those values, by the nodes between them
    (what Gradient differentiates). asks_host: the op's registration lets it ask for host
    values while tracing (`need_host`).
    """

    node: ir.Node
    opset: int
    run_graph: Callable[[ir.Graph, Sequence[Any]], list[Any]]
    next_key: Callable[[], Any]
    recompute: Callable[[Sequence[str], Mapping[str, Any]], list[Any]]
    asks_host: bool = False

    def need_host(self, index: int, reason: str) -> NoReturn:
        """Ask for input `index` as a concrete value: the compiling runtime breaks the graph
        here and runs the node with that input on the host. Only an op registered with
        `may_need_host` or `strings_on_host` may ask, so that graph analysis knows every node
        that can."""
        if not self.asks_host:
            raise TypeError(
                f"{self.node.op_type} asks for a host value but its registration declares no "
                "may_need_host or strings_on_host"
            )
        raise HostValueNeeded(self.node.label, self.node.op_type, self.node.inputs[index], reason)

    def host_value(self, index: int, value: Any, reason: str) -> np.ndarray:
        """Input `index`, `value`, as a numpy array. A traced value cannot be one, so it asks for
        the input on the host (`need_host`): compiled, the graph breaks here and the node runs on
        the concrete value, as it does eagerly, so both take the same path."""
        if isinstance(value, jax.core.Tracer):
            self.need_host(index, reason)
        return np.asarray(value)

    @property
    def num_outputs(self) -> int:
        """How many outputs the node lists (optional trailing outputs may be absent)."""
        return len(self.node.outputs)

    def wants(self, index: int) -> bool:
        """True when the node asks for output `index` (present and not the empty name)."""
        return index < len(self.node.outputs) and bool(self.node.outputs[index])
