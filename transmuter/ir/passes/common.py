"""What the passes share: the `Context` the runtime gives them, op sets, use counts, renaming,
names."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from transmuter import dtypes
from transmuter.ir.graph import Graph, Node, subgraphs

# The ONNX operators that draw random numbers; without an evaluator's facts, these are never
# removed or merged (each draw advances the call's key stream).
RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli",
     "Multinomial", "Dropout"}
)  # fmt: skip
# Ops applied element by element to their first input, the others (if any) scalars.
UNARY = frozenset(
    {"Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu", "Selu",
     "Celu", "Softplus", "Softsign", "Mish", "Gelu", "ThresholdedRelu", "Erf", "Exp", "Log",
     "Sqrt", "Reciprocal", "Neg", "Abs", "Floor", "Ceil", "Round", "Identity", "Cast", "Clip"}
)  # fmt: skip
# Elementwise ops that broadcast their operands against each other.
BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "PRelu"})


@dataclass(frozen=True)
class Context:
    """What a pass may do, and the runtime's help.

    opsets: the model's opsets (a rewrite emitting an op picks the form its opset has).
    weights: whether float initializers may be rewritten (folded, fused); False for a trainable
    model, whose params must stay the file's.
    evaluate: `(node, {input name: numpy array}) -> [numpy array per output] | None`, computing
    a node on known values as the runtime would on the host (None: it cannot, e.g. random ops).
    random: whether a node draws random numbers (the registry's fact).
    device_bound: whether an initializer is a device value at run time (a param or device
    constant) rather than a host constant: folded results of host values stay host values.
    traces: `(node, positions of its inputs that are traced) -> whether its outputs are traced`,
    or None where the node would need one of those inputs on the host (a Reshape's target
    computed from traced data): the registry's facts. Without them, no traced input is allowed.
    weight: `(node, {input name: numpy array}) -> float32 [K, N] | None`, the weight a matmul
    whose weight is stored quantized (MatMulNBits) multiplies its activation by, computed from
    those constant inputs (the registry's `weight`); None for any other node.
    """

    opsets: Mapping[str, int] = field(default_factory=dict)
    weights: bool = True
    evaluate: Callable[[Node, dict[str, np.ndarray]], list[Any] | None] | None = None
    random: Callable[[Node], bool] = lambda node: node.domain == "" and node.op_type in RANDOM_OPS
    device_bound: Callable[[np.ndarray], bool] = lambda array: array.size > 64
    traces: Callable[[Node, frozenset[int]], bool | None] = lambda node, traced: (
        None if traced else False
    )
    weight: Callable[[Node, dict[str, np.ndarray]], np.ndarray | None] = lambda node, values: None

    def opset(self, domain: str = "") -> int:
        return int(self.opsets.get(domain, 0))


def constants(graph: Graph, context: Context) -> dict[str, np.ndarray]:
    """The initializers a pass may treat as known: not overridable graph inputs, and no float
    initializer of a trainable model."""
    inputs = {v.name for v in graph.inputs}
    return {
        name: array
        for name, array in graph.initializers.items()
        if name not in inputs and (context.weights or not dtypes.is_float(array.dtype))
    }


def use_counts(graph: Graph) -> Counter:
    """How often each value is read: by nodes, by subgraphs (outer names) and as an output."""
    counts: Counter = Counter()
    for node in graph.nodes:
        counts.update(n for n in node.inputs if n)
        for sub in subgraphs(node):
            counts.update(sub.outer_names)
    counts.update(v.name for v in graph.outputs)
    return counts


def producers(graph: Graph) -> dict[str, Node]:
    return {o: node for node in graph.nodes for o in node.outputs if o}


def renamed_inputs(node: Node, renames: Mapping[str, str]) -> Node:
    """`node` reading `renames[name]` for each renamed input, its subgraphs' outer reads too."""
    inputs = tuple(renames.get(n, n) for n in node.inputs)
    attrs = node.attrs
    if subgraphs(node):
        attrs = {k: _renamed_attr(v, renames) for k, v in node.attrs.items()}
    if inputs == node.inputs and attrs is node.attrs:
        return node
    return Node(node.op_type, node.domain, inputs, node.outputs, attrs, node.name)


def _renamed_attr(value: Any, renames: Mapping[str, str]) -> Any:
    if isinstance(value, Graph):
        local = {v.name for v in value.inputs} | set(value.initializers)
        local.update(o for n in value.nodes for o in n.outputs)
        inner = {k: v for k, v in renames.items() if k not in local}
        return Graph(
            [renamed_inputs(n, inner) for n in value.nodes],
            value.inputs,
            value.outputs,
            value.initializers,
            value.value_info,
            value.name,
        )
    if isinstance(value, (list, tuple)):
        return type(value)(_renamed_attr(v, renames) for v in value)
    return value


class Names:
    """Fresh value names for a graph: `base__suffix`, numbered when taken."""

    def __init__(self, graph: Graph):
        self.taken = set(graph.initializers) | {v.name for v in graph.inputs}
        self.taken.update(v.name for v in graph.outputs)
        for node in _all_nodes(graph):
            self.taken.update(node.inputs)
            self.taken.update(node.outputs)

    def fresh(self, base: str, suffix: str) -> str:
        name, n = f"{base}__{suffix}", 1
        while name in self.taken:
            n += 1
            name = f"{base}__{suffix}{n}"
        self.taken.add(name)
        return name


def _all_nodes(graph: Graph) -> Iterable[Node]:
    for node in graph.nodes:
        yield node
        for sub in subgraphs(node):
            yield from _all_nodes(sub)


def per_channel(array: np.ndarray, channels: int, rank: int, axis: int = 1) -> np.ndarray | None:
    """`array` as a vector of `channels` values (or one value for all) when, broadcast against
    a tensor of `rank` dims, it varies along `axis` only; None otherwise."""
    if array.ndim > rank:
        return None
    shape = (1,) * (rank - array.ndim) + tuple(array.shape)
    if any(d != 1 for i, d in enumerate(shape) if i != axis) or shape[axis] not in (1, channels):
        return None
    return np.broadcast_to(array.reshape(-1), (channels,)) if array.size else None


def known_values(graph: Graph, context: Context) -> dict[str, np.ndarray]:
    """`constants` and the values of the graph's Constant nodes that hold a tensor."""
    known = constants(graph, context)
    for node in graph.nodes:
        if node.op_type == "Constant" and node.domain == "" and node.outputs:
            value = node.attrs.get("value")
            if "value_float" in node.attrs:
                value = np.asarray(node.attrs["value_float"], np.float32)
            if isinstance(value, np.ndarray):
                known[node.outputs[0]] = value
    return known
