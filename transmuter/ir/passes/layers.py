"""Repeated layers become one Scan: a run of c blocks of the same nodes (same ops and attributes,
each block reading the one before it, weights of the same shapes that differ per block) turns
into a Scan over the weights stacked along a new first axis, so the block is traced and
compiled once instead of c times (a 32-layer decoder's compile is then about one layer's).

Found positionally: exporters write a layer's nodes together, so block j is nodes [s + j p,
s + (j + 1) p) for a period p. The first layer usually differs (common-subexpression
elimination leaves the chains all layers share in it), so the run starts at the second. What a
block reads is then classified against the block after it, and the run is taken only where
every block agrees: values of its own block (by position), of the block before (the state
carried), shared values read by every block, and initializers that differ per block (stacked).
Anything else (a value two blocks back, per-block graph inputs such as a KV cache, a node that
would need a carried or stacked value on the host, random operators, subgraphs) leaves the
graph as it is. The Scan's lowering unrolls the loop again where the state would change shape
(control_flow.py), so shapes need not be known here.

The stacked weights replace the per-layer ones (`model.params` names change): the pass runs
only where weights may change (not for a trainable model).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from transmuter.ir import arrays
from transmuter.ir.graph import Graph, Model, Node, ValueInfo, subgraphs
from transmuter.ir.passes.common import Context, Names, constants

# A layer worth a Scan: at least this many nodes, repeated at least this many times, with
# weights of its own. Smaller blocks trace in no time; blocks without weights are chains of
# cheap ops (and layers that share one set of weights, as ALBERT's, which stay unrolled). A
# scanned layer also costs a little per call (each step slices its weights out of the stacked
# ones: ViT-small's 12 layers ran 61.8 ms scanned against 60.5 ms unrolled), and below 16
# layers compiling the loop saves little or nothing (ViT-small's first result: 0.79 s either
# way; 6 scanned layers of a Llama compiled in 0.52 s against 0.40 s unrolled), where 22 of a
# BERT compiled in 0.37 s against 0.52-0.61 s (bench/README.md).
MIN_NODES = 8
MIN_LAYERS = 16
# The longest period searched: the search compares the graph with itself shifted by each.
MAX_PERIOD = 4096
# Runs whose blocks turn out not to agree, tried before giving up on the rest.
MAX_TRIES = 8


@dataclasses.dataclass(frozen=True)
class Run:
    """Blocks [start + j period, start + (j + 1) period) for j < count."""

    start: int
    period: int
    count: int

    @property
    def stop(self) -> int:
        return self.start + self.period * self.count


def run(model: Model, context: Context) -> Model:
    if not context.weights or context.opset() < 9:  # Scan's attributes are Scan-9's
        return model
    graph = model.graph
    tried: set[tuple[int, int]] = set()
    while len(tried) < MAX_TRIES:
        found = _longest_run(graph, tried)
        if found is None:
            break
        tried.add((found.start, found.period))
        aligned = _aligned(graph, found)
        rewritten = _as_scan(graph, aligned, context) if aligned.count >= MIN_LAYERS else None
        if rewritten is not None:
            graph, tried = rewritten, set()
    return model if graph is model.graph else dataclasses.replace(model, graph=graph)


def _longest_run(graph: Graph, tried: set[tuple[int, int]]) -> Run | None:
    """The run of repeated blocks covering the most nodes (the shortest period among those
    covering as many), not yet tried."""
    keys: dict[Any, int] = {}
    codes = np.array([keys.setdefault(_key(n), len(keys)) for n in graph.nodes], np.int64)
    n = len(codes)
    best: Run | None = None
    for period in range(MIN_NODES, min(n // MIN_LAYERS, MAX_PERIOD) + 1):
        same = np.concatenate([[False], codes[:-period] == codes[period:], [False]])
        edges = np.flatnonzero(np.diff(same.astype(np.int8)))
        for begin, end in zip(edges[::2], edges[1::2]):
            count = (end - begin) // period + 1
            if count < MIN_LAYERS or (begin, period) in tried:
                continue
            # A period that only ties with a shorter one is the shorter one repeated.
            if best is None or count * period > best.count * best.period * 1.05:
                best = Run(int(begin), period, int(count))
    return best


def _aligned(graph: Graph, found: Run) -> Run:
    """`found` with its blocks starting where the fewest values cross from one block to the
    next: between two layers only the hidden state does, while a boundary inside a layer also
    cuts its shape chains, which as carried state would lose their values on the host."""
    period, start = found.period, found.start
    stop = found.stop
    # Values made in one interior period, and the last position inside the run reading each.
    made = {o: a for a in range(start, start + period) for o in graph.nodes[a].outputs if o}
    last = dict(made)
    for b in range(start, stop):
        for name in graph.nodes[b].inputs:
            if name in last:
                last[name] = max(last[name], b)
    # A boundary before position t (phase (t - start) mod period) is crossed by a value made at
    # a and read at b when a < t <= b.
    # Counted as differences: +1 where a value's phases begin, -1 past where they end.
    crossing = np.zeros(period + 1, np.int64)
    for name, a in made.items():
        b = last[name]
        if b == a or b - a >= period:
            continue  # read by no later node of the run, or crossing every phase alike
        first, end = (a + 1 - start) % period, (b - start) % period + 1
        crossing[first] += 1
        crossing[end] -= 1
        if first >= end:  # the phases wrap past the period's end
            crossing[0] += 1
            crossing[period] -= 1
    counts = np.cumsum(crossing[:period])
    phase = int(np.argmin(counts))
    count = (stop - start - phase) // period
    return Run(start + phase, period, count)


def _key(node: Node) -> Any:
    """What two nodes must share to be the same node of two layers."""
    if subgraphs(node):
        return id(node)  # bodies are not compared: never part of a layer
    return (
        node.domain,
        node.op_type,
        tuple(bool(i) for i in node.inputs),
        tuple(bool(o) for o in node.outputs),
        tuple(sorted((k, _attr_key(v)) for k, v in node.attrs.items())),
    )


def _attr_key(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(_attr_key(v) for v in value)
    return value


def _as_scan(graph: Graph, found: Run, context: Context) -> Graph | None:
    """`graph` with the run `found` as one Scan, or None where its blocks do not agree."""
    nodes = graph.nodes
    blocks = [
        nodes[found.start + j * found.period : found.start + (j + 1) * found.period]
        for j in range(found.count)
    ]
    if any(context.random(node) for node in blocks[0]):
        return None  # a Scan body draws the same key in every iteration (NOTES.md)
    where = {
        o: (j, r, k)
        for j, block in enumerate(blocks)
        for r, node in enumerate(block)
        for k, o in enumerate(node.outputs)
        if o
    }
    refs = [
        [[_ref(name, j, where) for name in node.inputs] for node in b] for j, b in enumerate(blocks)
    ]
    template = refs[1]
    carried: dict[tuple[int, int], str] = {}  # (offset, output) -> its value before block 0
    per_block: dict[tuple[str, ...], None] = {}  # names of what differs per block, in order
    for r, node_refs in enumerate(template):
        for i, ref in enumerate(node_refs):
            kind = ref[0]
            if any(refs[j][r][i][0] == "far" for j in range(len(blocks))):
                return None
            if kind in ("local", "carry", "none"):
                if any(refs[j][r][i] != ref for j in range(2, len(blocks))):
                    return None
            if kind == "local" or kind == "none":
                if refs[0][r][i] != ref:
                    return None
            elif kind == "carry":
                first = refs[0][r][i]
                if first[0] != "outer" or carried.setdefault(ref[1:], first[1]) != first[1]:
                    return None
            else:
                names = tuple(
                    refs[j][r][i][1] if refs[j][r][i][0] == "outer" else None
                    for j in range(len(blocks))
                )
                if None in names:
                    return None
                if len(set(names)) > 1:
                    per_block[names] = None
    if not per_block:
        return None  # no weights of their own: a chain of cheap ops, not layers
    if len({names[1] for names in per_block}) != len(per_block):
        return None  # one block reading a name that stands for two different weights
    known = constants(graph, context)
    for names in per_block:
        values = [known.get(name) for name in names]
        if any(a is None for a in values):
            return None  # per-layer graph inputs (a KV cache): stacking them costs every call
        if len({(a.dtype.str, a.shape) for a in values}) != 1:
            return None
        if values[0].dtype == object:
            return None  # strings live on the host
    # In the Scan the state and the stacked weights are traced, whatever they were before.
    traced = {blocks[0][r].outputs[k] for r, k in carried} | {names[1] for names in per_block}
    if not _traceable(blocks[1], traced, context):
        return None
    return _rewritten(graph, found, blocks, carried, list(per_block), known)


def _traceable(block, traced: set[str], context: Context) -> bool:
    """Whether `block` traces with the values `traced` (and what they reach) traced: no node
    would need one of them on the host, as a Reshape target computed from a per-layer constant
    would. The shape chains a layer computes from its activations stay host values."""
    traced = set(traced)
    for node in block:
        outputs = context.traces(
            node, frozenset(i for i, n in enumerate(node.inputs) if n in traced)
        )
        if outputs is None:
            return False
        if outputs:
            traced.update(o for o in node.outputs if o)
    return True


def _ref(name: str, block: int, where: Mapping[str, tuple[int, int, int]]) -> tuple:
    """What a value read by `block` is: ("local", offset, output) of its own block, ("carry",
    offset, output) of the block before, ("outer", name) from outside the run, ("none",) for a
    missing optional input, ("far",) from any other block."""
    if not name:
        return ("none",)
    found = where.get(name)
    if found is None:
        return ("outer", name)
    j, r, k = found
    if j == block:
        return ("local", r, k)
    return ("carry", r, k) if j == block - 1 else ("far",)


def _rewritten(graph, found: Run, blocks, carried, per_block, known) -> Graph:
    """The graph with the blocks replaced by one Scan and, for each per-block value read after
    the run, a Gather of its layer from the Scan's stacked output."""
    names = Names(graph)
    count = found.count
    carries = sorted(carried)
    read_outside = _read_outside(graph, blocks)

    def output(j: int, position: tuple[int, int]) -> str:
        r, k = position
        return blocks[j][r].outputs[k]

    def read_after(j: int, p: tuple[int, int]) -> bool:
        # The last block's state is the Scan's final state, not a stacked output.
        return output(j, p) in read_outside and not (j == count - 1 and p in carried)

    produced = sorted(
        {(r, k) for r, n in enumerate(blocks[0]) for k, o in enumerate(n.outputs) if o}
    )
    stacked_out = [p for p in produced if any(read_after(j, p) for j in range(count))]

    initializers = dict(graph.initializers)
    scan_inputs, slices = [], {}
    for group in per_block:
        stacked = names.fresh(group[0], "layers")
        parts = [known[n] for n in group]
        initializers[stacked] = arrays.stack(parts)
        for part in parts:  # the file's pages they were read from, if any
            arrays.release(part)
        scan_inputs.append(stacked)
        slices[group[1]] = names.fresh(group[1], "slice")
    body = _body(blocks, carries, slices, stacked_out, names, f"layers_{found.start}")
    all_layers = {p: names.fresh(output(0, p), "all_layers") for p in stacked_out}
    scan = Node(
        "Scan",
        "",
        tuple(carried[p] for p in carries) + tuple(scan_inputs),
        tuple(output(count - 1, p) for p in carries) + tuple(all_layers[p] for p in stacked_out),
        {"body": body, "num_scan_inputs": len(scan_inputs)},
        name=f"layers_{found.start}_x{count}",
    )
    picks = []
    for j in range(count):
        for p in stacked_out:
            if read_after(j, p):
                at = names.fresh(all_layers[p], f"at{j}")
                initializers[at] = np.asarray(j, np.int64)
                picks.append(Node("Gather", "", (all_layers[p], at), (output(j, p),), {"axis": 0}))
    nodes = graph.nodes[: found.start] + [scan, *picks] + graph.nodes[found.stop :]
    return dataclasses.replace(graph, nodes=nodes, initializers=initializers)


def _read_outside(graph: Graph, blocks) -> set[str]:
    """The names read by nodes outside the blocks (their subgraphs too) and the graph outputs."""
    inside = {id(n) for block in blocks for n in block}
    read = {v.name for v in graph.outputs}
    for node in graph.nodes:
        if id(node) not in inside:
            read.update(node.inputs)
            for sub in subgraphs(node):
                read.update(sub.outer_names)
    return read


def _body(blocks, carries, slices: dict[str, str], stacked_out, names: Names, name: str) -> Graph:
    """The Scan body: the second block, reading its state and its weights' slices as inputs
    (`slices`: the weight name it read -> the slice input), its values renamed apart from the
    main graph's; outputs the next state, then the values stacked per layer."""
    template = blocks[1]
    local = {o: names.fresh(o, "layer") for n in template for o in n.outputs if o}
    state = {p: names.fresh(blocks[0][p[0]].outputs[p[1]], "state") for p in carries}
    renames = {**local, **slices}
    renames.update((blocks[0][r].outputs[k], state[(r, k)]) for r, k in carries)
    nodes = [
        Node(
            n.op_type,
            n.domain,
            tuple(renames.get(i, i) for i in n.inputs),
            tuple(local.get(o, o) for o in n.outputs),
            n.attrs,
            n.name,
        )
        for n in template
    ]
    outputs = [local[template[r].outputs[k]] for r, k in carries]
    for r, k in stacked_out:
        value = local[template[r].outputs[k]]
        if value in outputs:  # the state, also stacked: each output its own value
            copy = names.fresh(value, "out")
            nodes.append(Node("Identity", "", (value,), (copy,)))
            value = copy
        outputs.append(value)
    return Graph(
        nodes,
        [ValueInfo(state[p], None) for p in carries]
        + [ValueInfo(x, None) for x in slices.values()],
        [ValueInfo(v, None) for v in outputs],
        name=name,
    )
