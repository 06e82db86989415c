"""A MatMul of a Transpose that swaps the last two axes, as one Einsum of the untransposed
operand:

    MatMul(A, Transpose(X, perm=[0, .., r-3, r-1, r-2]))   ->   Einsum("...qd,...kd->...qk", A, X)

Attention's scores are written so (Q K^T, with K the key cache in a decoder step). Given the
Transpose, XLA:CPU copies all of K into the transposed layout for the dot, on every call; given
the contraction, its dot reads K where it is (bench/README.md: GPT-2's step 2.5-4% faster,
prefill and encoders unchanged). The Transpose stays where something else reads it.

Einsum's ellipsis broadcasts as MatMul does, except that MatMul promotes a 1-D A to a row: A
must be known to have at least two dims (`_rank_lower_bounds`). Einsum exists from opset 12.
"""

from __future__ import annotations

import dataclasses

from transmuter.ir.graph import Graph, Model, Node, TensorType
from transmuter.ir.passes.common import BROADCASTING, UNARY, Context, producers

EQUATION = "...qd,...kd->...qk"

# Beyond common's op sets: an output of at least each input's rank (Where broadcasts its three),
# or of its first input's (these keep its shape).
_MAX_RANK = BROADCASTING | {"Where", "Concat"}
_FIRST_RANK = UNARY | {"Softmax", "LayerNormalization", "Dropout"}


def run(model: Model, context: Context) -> Model:
    if context.opset() < 12:
        return model
    graph = model.graph
    made = producers(graph)
    ranks = _rank_lower_bounds(graph)
    nodes = []
    for node in graph.nodes:
        swapped = _swapped_operand(node, made)
        if swapped is not None and ranks.get(node.inputs[0], 0) >= 2:
            node = Node(
                "Einsum",
                "",
                (node.inputs[0], swapped),
                node.outputs,
                {"equation": EQUATION},
                name=node.name,
            )
        nodes.append(node)
    return dataclasses.replace(model, graph=dataclasses.replace(graph, nodes=nodes))


def _swapped_operand(node: Node, made: dict[str, Node]) -> str | None:
    """X, where `node` is MatMul(A, Transpose(X)) and the Transpose swaps only the last two
    axes; else None."""
    if node.op_type != "MatMul" or node.domain != "" or len(node.inputs) != 2:
        return None
    transpose = made.get(node.inputs[1])
    if transpose is None or transpose.op_type != "Transpose" or transpose.domain != "":
        return None
    perm = list(transpose.attrs.get("perm") or ())  # absent: every axis reversed, rank unknown
    rank = len(perm)
    if rank < 2 or perm != [*range(rank - 2), rank - 1, rank - 2]:
        return None
    return transpose.inputs[0]


def _rank_lower_bounds(graph: Graph) -> dict[str, int]:
    """A lower bound on each value's rank (0: nothing known), from declared types and, in graph
    order, the ops that make each value."""
    known = {n: a.ndim for n, a in graph.initializers.items()}
    for info in (*graph.inputs, *graph.value_info.values()):
        if isinstance(info.type, TensorType) and info.type.shape is not None:
            known[info.name] = len(info.type.shape)
    for node in graph.nodes:
        if node.domain != "" or not node.outputs or node.outputs[0] in known:
            continue
        ranks = [known.get(i, 0) for i in node.inputs if i]
        rank = 0
        if node.op_type == "Transpose" and node.attrs.get("perm"):
            rank = len(node.attrs["perm"])
        elif node.op_type in _MAX_RANK and ranks:
            rank = max(ranks)
        elif node.op_type == "MatMul" and len(ranks) == 2 and min(ranks) >= 2:
            rank = max(ranks)  # a 1-D operand's axis would be dropped from the result
        elif node.op_type in _FIRST_RANK and ranks:
            rank = ranks[0]
        known[node.outputs[0]] = rank
    return known
