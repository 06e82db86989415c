"""Chains of convolutions run channels last, transposing only at the chain's ends.

XLA:CPU computes a convolution channels last (NHWC activations, HWIO kernels). Handed ONNX's
NCHW and OIHW, it transposes around each Conv, and it transposes every kernel on every call: the
kernels are arguments of the compiled program, so XLA cannot fold that. This pass rewrites each
Conv whose kernel is a constant, or a Cast of one (a float16 kernel read in float32), into
com.microsoft NhwcConv (X (N, D1, ..., C), W (M, k1, ..., C/group)) on a channels-last twin of
its input. The kernel is stored once in the order XLA reads it, (k1, ..., C/group, M), behind
(the Cast and) a Transpose to NhwcConv's order, which the lowering's transpose back to that
order cancels: the convolution reads the stored array.

Subgraphs (Loop, Scan and If bodies) are rewritten the same way, a kernel read from an outer
scope stored in the graph that holds the constant. That matters most there: XLA:CPU makes a
convolution channels last only at a program's top level, and a transpose of a loop-invariant
kernel left in a while body is redone every iteration (XLA's loop-invariant code motion does not
hoist a lone transpose).
Ops that do not care about the layout then run on the twins too: elementwise ops whose other
operands are twins or constants (transposed once here), and Concat. A value is transposed back
to channels first only where something else reads it (a pool, a Reshape, a graph output), so
between two convolutions of a chain no transpose is left.

For the same reason a Gemm's constant B with transB=1 (a torch Linear's [out, in] weight) is
stored transposed once, with transB=0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from transmuter import dtypes
from transmuter.ir import arrays
from transmuter.ir.graph import Graph, Model, Node, subgraphs
from transmuter.ir.passes.common import BROADCASTING, UNARY, Context, Names, known_values

MS = "com.microsoft"


def to_last(rank: int) -> tuple[int, ...]:
    """The permutation (N, C, D1, ...) -> (N, D1, ..., C)."""
    return (0, *range(2, rank), 1)


def to_first(rank: int) -> tuple[int, ...]:
    """The permutation (N, D1, ..., C) -> (N, C, D1, ...)."""
    return (0, rank - 1, *range(1, rank - 1))


def run(model: Model, context: Context) -> Model:
    if not context.weights:
        return model
    rewrite = _Rewrite(model.graph, context)
    if not rewrite.changed:
        return model
    opsets = dict(model.opsets)
    opsets.setdefault(MS, 1)
    graph = dataclasses.replace(model.graph, nodes=rewrite.nodes, initializers=rewrite.initializers)
    return dataclasses.replace(model, graph=graph, opsets=opsets)


class _Rewrite:
    """One walk over the graph in order, emitting each node as it is or on twins."""

    def __init__(self, graph: Graph, context: Context, parent: _Rewrite | None = None):
        self.context, self.parent = context, parent
        self.local = known_values(graph, context)  # the constants this graph holds
        defined = {v.name for v in graph.inputs} | set(graph.initializers)
        defined.update(o for n in graph.nodes for o in n.outputs if o)
        self.defined = defined
        self.types = {v.name: v.type for v in (*graph.inputs, *graph.value_info.values())}
        self.known, casts = dict(self.local), {}
        if parent is None:
            self.names = Names(graph)
        else:  # a subgraph also sees its outer scopes' constants, where it does not shadow them
            self.names = parent.names
            self.names.taken.update(defined)
            self.known = {k: v for k, v in parent.known.items() if k not in defined} | self.local
            casts = {k: v for k, v in parent.casts.items() if k not in defined}
        self.initializers = dict(graph.initializers)
        self.nodes: list[Node] = []
        self.twins: dict[str, tuple[str, int]] = {}  # value -> (channels-last twin, rank)
        self.present = {v.name for v in graph.inputs} | set(graph.initializers)
        self.stored: dict[tuple[str, str], str] = {}  # (constant, suffix) -> a stored copy
        self.kernels: dict[str, str] = {}  # kernel -> its NhwcConv-ordered value
        self.casts = casts | {  # a Cast's output -> the Cast, where it reads a constant
            n.outputs[0]: n
            for n in graph.nodes
            if n.op_type == "Cast" and n.domain == "" and n.inputs[0] in self.known
        }
        self.changed = False
        for node in graph.nodes:
            if not self._conv(node) and not self._on_twins(node):
                self._as_is(self._gemm(node))
        for value in graph.outputs:
            self._first(value.name)

    def _emit(self, node: Node) -> None:
        self.nodes.append(node)
        self.present.update(o for o in node.outputs if o)

    def _as_is(self, node: Node) -> None:
        if subgraphs(node):
            node = dataclasses.replace(
                node, attrs={k: self._subgraph(v) for k, v in node.attrs.items()}
            )
        for name in (*node.inputs, *(n for g in subgraphs(node) for n in g.outer_names)):
            self._first(name)
        self._emit(node)

    def _subgraph(self, value):
        """An attribute with its graphs rewritten as the main graph is."""
        if isinstance(value, (list, tuple)):
            return type(value)(self._subgraph(v) for v in value)
        if not isinstance(value, Graph):
            return value
        rewrite = _Rewrite(value, self.context, self)
        if not rewrite.changed:
            return value
        self.changed = True
        return dataclasses.replace(value, nodes=rewrite.nodes, initializers=rewrite.initializers)

    def _first(self, name: str) -> None:
        """Make `name` exist channels first: a Transpose of its twin, where it has only that."""
        if name in self.present or name not in self.twins:
            return
        twin, rank = self.twins[name]
        perm = to_first(rank)
        self._emit(Node("Transpose", "", (twin,), (name,), {"perm": perm}, f"{name}__to_first"))

    def _last(self, name: str, rank: int) -> str:
        """`name`'s channels-last twin, made by a Transpose where it has none yet."""
        if name not in self.twins:
            twin = self.names.fresh(name, "last")
            perm = to_last(rank)
            self._emit(Node("Transpose", "", (name,), (twin,), {"perm": perm}, twin))
            self.twins[name] = (twin, rank)
        return self.twins[name][0]

    def _conv(self, node: Node) -> bool:
        if node.op_type != "Conv" or node.domain != "" or len(node.inputs) < 2:
            return False
        source, cast = node.inputs[1], self.casts.get(node.inputs[1])
        if cast is not None:  # a half-precision kernel read in float32 (compute_type's Cast)
            source = cast.inputs[0]
        weight = self.known.get(source)
        if node.inputs[0] in self.known:
            return False
        if weight is None:  # a loop body's kernel computed outside it: laid out there
            rank = self._rank(node)
            if self.parent is None or source in self.defined or rank is None:
                return False
            kernel = self._outer_kernel(source, rank)
        elif weight.ndim < 3 or not dtypes.is_float(weight.dtype):
            return False
        else:
            rank = weight.ndim
            kernel = self._kernel(source, weight, cast)
        x = self._last(node.inputs[0], rank)
        y = self.names.fresh(node.outputs[0], "last")
        inputs = (x, kernel, *node.inputs[2:])
        self._emit(Node("NhwcConv", MS, inputs, (y,), dict(node.attrs), node.name))
        self.twins[node.outputs[0]] = (y, rank)
        self.changed = True
        return True

    def _gemm(self, node: Node) -> Node:
        """`node`, or the Gemm it is with a transposed B stored as it will be read."""
        if node.op_type != "Gemm" or node.domain != "" or not node.attrs.get("transB", 0):
            return node
        weight = self.known.get(node.inputs[1])
        if weight is None or weight.ndim != 2:
            return node
        stored = self._store(node.inputs[1], "transposed", lambda: weight.T)
        self.changed = True
        inputs = (node.inputs[0], stored, *node.inputs[2:])
        return dataclasses.replace(node, inputs=inputs, attrs={**node.attrs, "transB": 0})

    def _kernel(self, name: str, weight: np.ndarray, cast: Node | None) -> str:
        """The kernel (M, C/group, k1, ...) as NhwcConv's (M, k1, ..., C/group): a Transpose of
        a copy stored as (k1, ..., C/group, M), after the `cast` (the lowering transposes back,
        and XLA cancels the two only where nothing stands between them)."""
        if name not in self.kernels:
            rank = weight.ndim
            kernel = self._stored(name, weight)
            if cast is not None:
                widened = self.names.fresh(kernel, "cast")
                self._emit(dataclasses.replace(cast, inputs=(kernel,), outputs=(widened,), name=""))
                kernel = widened
            ordered = self.names.fresh(name, "channels_last")
            perm = (rank - 1, *range(rank - 2), rank - 2)
            self._emit(Node("Transpose", "", (kernel,), (ordered,), {"perm": perm}, ordered))
            self.kernels[name] = ordered
        return self.kernels[name]

    def _outer_kernel(self, name: str, rank: int) -> str:
        """NhwcConv's order of the kernel `name` that an outer graph computes (an input, a
        parameter of a trainable model): a Transpose here of its (k1, ..., C/group, M) copy,
        transposed once in the graph that computes it."""
        if name not in self.kernels:
            hwio = self.parent._spatial_first(name, rank)
            ordered = self.names.fresh(name, "channels_last")
            perm = (rank - 1, *range(rank - 2), rank - 2)
            self._emit(Node("Transpose", "", (hwio,), (ordered,), {"perm": perm}, ordered))
            self.kernels[name] = ordered
        return self.kernels[name]

    def _spatial_first(self, name: str, rank: int) -> str:
        """A Transpose of `name` (M, C/group, k1, ...) to (k1, ..., C/group, M), emitted in the
        outermost graph that sees it, before the node whose subgraph asks."""
        if name not in self.defined and self.parent is not None:
            return self.parent._spatial_first(name, rank)
        if (name, "spatial_first") not in self.stored:
            self._first(name)
            hwio = self.names.fresh(name, "spatial_first")
            perm = (*range(2, rank), 1, 0)
            self._emit(Node("Transpose", "", (name,), (hwio,), {"perm": perm}, hwio))
            self.stored[name, "spatial_first"] = hwio
            self.changed = True
        return self.stored[name, "spatial_first"]

    def _rank(self, node: Node) -> int | None:
        """A Conv's rank, from its kernel_shape or the declared type of its input or kernel."""
        if node.attrs.get("kernel_shape") is not None:
            return len(node.attrs["kernel_shape"]) + 2
        for name in node.inputs[:2]:
            rewrite = self
            while rewrite is not None:
                shape = getattr(rewrite.types.get(name), "shape", None)
                if shape is not None:
                    return len(shape)
                rewrite = rewrite.parent
        return None

    def _stored(self, name: str, weight: np.ndarray) -> str:
        """The constant kernel `name` stored as (k1, ..., C/group, M)."""
        return self._store(
            name, "spatial_first", lambda: weight.transpose(*range(2, weight.ndim), 1, 0)
        )

    def _store(self, name: str, suffix: str, make: Callable[[], np.ndarray]) -> str:
        """A rearranged copy `make()` of the constant `name`, stored once in the graph that holds
        `name`: an outer one for a constant a loop body reads, so nothing is redone per step."""
        if name not in self.local and self.parent is not None:
            return self.parent._store(name, suffix, make)
        if (name, suffix) not in self.stored:
            stored = self.names.fresh(name, suffix)
            rearranged = make()
            self.initializers[stored] = arrays.shareable(rearranged)  # copied once, as held
            arrays.release(rearranged)  # the file's pages it was read from
            self.present.add(stored)
            self.stored[name, suffix] = stored
        return self.stored[name, suffix]

    def _on_twins(self, node: Node) -> bool:
        """Emit `node` on its inputs' twins, where its layout does not matter: a UNARY op on its
        first input's, a BROADCASTING one on operands each a twin or a constant of no higher
        rank, a Concat of twins."""
        if node.domain != "" or len(node.outputs) != 1 or not node.inputs:
            return False
        if node.inputs[0] not in self.twins:
            if node.op_type not in BROADCASTING and node.op_type != "Concat":
                return False
        twinned = [self.twins[n] for n in node.inputs if n in self.twins]
        if not twinned or len({rank for _, rank in twinned}) != 1:
            return False
        rank = twinned[0][1]
        attrs = dict(node.attrs)
        if node.op_type in UNARY and node.inputs[0] in self.twins:
            if any(n in self.twins for n in node.inputs[1:]):
                return False
            inputs = (self.twins[node.inputs[0]][0], *node.inputs[1:])
        elif node.op_type in BROADCASTING:
            inputs = tuple(self._operand(n, rank) for n in node.inputs)
            if None in inputs:
                return False
        elif node.op_type == "Concat" and all(n in self.twins for n in node.inputs):
            axis = int(attrs.get("axis", 0))
            attrs["axis"] = to_last(rank).index(axis % rank)
            inputs = tuple(self.twins[n][0] for n in node.inputs)
        else:
            return False
        twin = self.names.fresh(node.outputs[0], "last")
        self._emit(dataclasses.replace(node, inputs=inputs, outputs=(twin,), attrs=attrs))
        self.twins[node.outputs[0]] = (twin, rank)
        return True

    def _operand(self, name: str, rank: int) -> str | None:
        """A broadcasting operand channels last: its twin, or a constant transposed once."""
        if name in self.twins:
            return self.twins[name][0]
        value = self.known.get(name)
        if value is None or value.ndim > rank:
            return None
        if value.ndim == 0:
            return name
        expanded = value.reshape((1,) * (rank - value.ndim) + value.shape)
        return self._store(name, f"last{rank}", lambda: expanded.transpose(to_last(rank)))
