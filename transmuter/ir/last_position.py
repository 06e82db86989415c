"""Outputs computed at one position only: the edits behind `transmuter.load(...,
last_position=[...])` and `transmuter.load(..., at_position={...})`, for generation, which
reads the logits of one position of a sequence (the last, or, where a decoder runs on a padded
sequence, the last real one).

A prefill of a language model computes its vocabulary product for every position of the
prompt and keeps one row, and XLA does not move a slice of a dot's result onto its operand:
GPT-2-small's product for a 64-token prompt took 50.3 ms, against 10.3 ms for the last row
alone, a fifth of a prefill (bench/README.md, "Measured apart").

`last_position(model, names)` gives each named output (of rank r >= 2) only index -1 of its
axis r - 2, the positions of [batch, positions, vocabulary] logits; its declared size there
becomes 1. Where the output is a MatMul's with a 2-D second operand, followed by nothing or by
ops that treat each row alone (`common.UNARY`; Add, Sub, Mul or Div with a constant of one row,
as BART's final_logits_bias), the last position is taken from the MatMul's first operand; an
If's output is edited so in each branch. Anywhere else a Gather of the last position follows
the output's producer: the same answer, nothing saved.

`at_position(model, {output: input})` is the same edit with the index chosen at run time: each
output at the position given by a new int64 input [1] (negative counts from the end), the
row a padded decoding reads (seq2seq's "padded": the sequence so far, right-padded to a bucket).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from transmuter.errors import InputError
from transmuter.ir.graph import Graph, Model, Node, TensorType, ValueInfo
from transmuter.ir.passes.common import UNARY, Names, producers, use_counts

_ROW_WISE_BINARY = frozenset({"Add", "Sub", "Mul", "Div"})


def last_position(model: Model, names: Sequence[str]) -> Model:
    """`model` with each output of `names` at its last position only (see the module)."""
    return _at_positions(model, dict.fromkeys(names), "last_position")


def at_position(model: Model, inputs: Mapping[str, str]) -> Model:
    """`model` with each output named in `inputs` at the position the new input it maps to
    gives at run time (int64 [1], an index on the output's axis before the last)."""
    taken = Names(model.graph).taken
    for index in set(inputs.values()):
        if index in taken:
            raise InputError(
                f"at_position's input {index!r} is already a name in the graph; choose a new one"
            )
    edited = _at_positions(model, dict(inputs), "at_position")
    position = TensorType(np.dtype(np.int64), (1,))
    new = [ValueInfo(index, position) for index in dict.fromkeys(inputs.values())]
    graph = dataclasses.replace(edited.graph, inputs=[*edited.graph.inputs, *new])
    return dataclasses.replace(edited, graph=graph)


def _at_positions(model: Model, indices: Mapping[str, str | None], option: str) -> Model:
    """`model` with each output of `indices` at the position its index input gives (None: the
    last), checked as `option` names them."""
    declared = {v.name: v.type for v in model.graph.outputs}
    graph = model.graph
    for name, index in indices.items():
        if name not in declared:
            raise InputError(
                f"{option} names {name!r}, which is not an output; the outputs are {list(declared)}"
            )
        kind = declared[name]
        if not isinstance(kind, TensorType) or kind.shape is None or len(kind.shape) < 2:
            raise InputError(
                f"{option} needs outputs of known rank 2 or more (their positions are on the "
                f"axis before the last); {name!r} is declared {kind}"
            )
        if name not in producers(graph) or use_counts(graph)[name] > 1:
            raise InputError(
                f"{option}: {name!r} is not made by a node, or is also read inside the "
                "graph, whose other readers need every position"
            )
        graph = _edited(graph, name, len(kind.shape), {}, index)
    return dataclasses.replace(model, graph=graph)


def _edited(
    graph: Graph, output: str, rank: int, outer: Mapping[str, tuple], index: str | None
) -> Graph | None:
    """`graph` with its output `output` (of rank `rank`) at the position of the input `index`
    (None: the last); `outer`: the shapes of the constants of the graphs around it. None where
    `output` is made by no node or is read by one (in an If's branch: the If's output is then
    taken whole)."""
    constants = {**outer, **{n: a.shape for n, a in graph.initializers.items()}}
    made = producers(graph)
    node = made.get(output)
    if node is None or use_counts(graph)[output] > 1:
        return None
    if node.op_type == "If" and node.domain == "":
        edited = _edited_if(graph, node, output, rank, constants, index)
        if edited is not None:
            return edited
    rows = None if node.op_type == "If" else _row_chain(graph, output, rank, made, constants)
    names = Names(graph)
    if rows is None:  # the fallback: the whole output, then its position
        whole = names.fresh(output, "every_position")
        nodes = [_renamed_output(n, output, whole) if n is node else n for n in graph.nodes]
        nodes += _position_of(whole, output, rank, names, index)
        dropped = set()
    else:
        matmul, chain = rows
        row = names.fresh(matmul.inputs[0], "position")
        gather = _position_of(matmul.inputs[0], row, rank, names, index)
        edited = Node(
            "MatMul", "", (row, matmul.inputs[1]), matmul.outputs, matmul.attrs, matmul.name
        )
        nodes = []
        for n in graph.nodes:
            nodes += [*gather, edited] if n is matmul else [n]
        dropped = {v for n in chain for v in n.outputs}  # their declared shapes no longer hold
    return dataclasses.replace(
        graph,
        nodes=nodes,
        outputs=[_at_one_position(v, rank) if v.name == output else v for v in graph.outputs],
        value_info={k: v for k, v in graph.value_info.items() if k not in dropped},
    )


def _edited_if(
    graph: Graph,
    node: Node,
    output: str,
    rank: int,
    constants: Mapping[str, tuple],
    index: str | None,
) -> Graph | None:
    """`graph` with the If `node`'s `output` at the position of `index` in both branches (which
    read an outer `index` by its name), or None where a branch cannot be edited."""
    which = node.outputs.index(output)
    attrs = dict(node.attrs)
    for branch in ("then_branch", "else_branch"):
        body = attrs[branch]
        attrs[branch] = _edited(body, body.outputs[which].name, rank, constants, index)
        if attrs[branch] is None:
            return None
    edited = Node(node.op_type, node.domain, node.inputs, node.outputs, attrs, node.name)
    return dataclasses.replace(
        graph,
        nodes=[edited if n is node else n for n in graph.nodes],
        outputs=[_at_one_position(v, rank) if v.name == output else v for v in graph.outputs],
        value_info={k: v for k, v in graph.value_info.items() if k != output},
    )


def _row_chain(
    graph: Graph,
    output: str,
    rank: int,
    made: Mapping[str, Node],
    constants: Mapping[str, tuple],
) -> tuple[Node, list[Node]] | None:
    """The MatMul whose rows `output` (of rank `rank`) is made of, and the nodes from it to
    `output` (it included), where each row of `output` depends on that row of the MatMul's
    first operand (of rank `rank` too) alone and nothing else reads the values between; else
    None. `constants`: the shapes of the initializers in scope."""
    uses = use_counts(graph)
    ranks = {n: len(shape) for n, shape in constants.items()}
    for info in (*graph.inputs, *graph.value_info.values()):
        if isinstance(info.type, TensorType) and info.type.shape is not None:
            ranks.setdefault(info.name, len(info.type.shape))
    outputs = {v.name for v in graph.outputs}
    chain: list[Node] = []
    value = output
    while True:
        node = made.get(value)
        if node is None or node.domain != "" or (chain and (uses[value] != 1 or value in outputs)):
            return None
        chain.append(node)
        if node.op_type == "MatMul":
            return (node, chain) if ranks.get(node.inputs[1]) == 2 else None
        if node.op_type in UNARY:
            value = node.inputs[0]
        elif node.op_type in _ROW_WISE_BINARY and len(node.inputs) == 2:
            operand = _row_operand(node, constants, rank)
            if operand is None:
                return None
            value = operand
        else:
            return None


def _row_operand(node: Node, constants: Mapping[str, tuple], rank: int) -> str | None:
    """The operand of a binary `node` whose other operand is a constant of one row (every
    axis but the last of size 1) and of rank below `rank`, the result's (so that the operand
    has the result's rank), or None."""
    first, second = node.inputs
    for value, other in ((first, second), (second, first)):
        shape = constants.get(other)
        if shape is not None and len(shape) < rank and all(d == 1 for d in shape[:-1]):
            return value
    return None


def _position_of(
    source: str, target: str, rank: int, names: Names, index: str | None
) -> list[Node]:
    """Nodes making `target`: `source` at the position of the input `index` (None: the last)
    on its axis `rank` - 2, kept (size 1)."""
    if index is not None:
        return [Node("Gather", "", (source, index), (target,), {"axis": rank - 2})]
    last = names.fresh(target, "index")
    return [
        Node("Constant", "", (), (last,), {"value": np.array([-1], np.int64)}),
        Node("Gather", "", (source, last), (target,), {"axis": rank - 2}),
    ]


def _renamed_output(node: Node, old: str, new: str) -> Node:
    outputs = tuple(new if o == old else o for o in node.outputs)
    return Node(node.op_type, node.domain, node.inputs, outputs, node.attrs, node.name)


def _at_one_position(info: ValueInfo, rank: int) -> ValueInfo:
    kind = info.type
    if not isinstance(kind, TensorType) or kind.shape is None or len(kind.shape) != rank:
        return info
    shape = (*kind.shape[: rank - 2], 1, kind.shape[-1])
    return dataclasses.replace(info, type=dataclasses.replace(kind, shape=shape))
