"""Many devices: a model's weights and inputs placed on a `jax.sharding.Mesh`.

A model is a JAX function of its weights, so sharding it is placement: weights and inputs are put
on the mesh as `NamedSharding`s and `jit`'s partitioner (GSPMD) inserts the collectives. Nothing
here is per model; the rules read the graph:

- data parallelism: each input's batch dim (the dim name that leads every input, or the one given)
  is split over the mesh's data axis;
- tensor parallelism (the model axis): the 2-D weights of MatMul / Gemm (and the 4-D ones of Conv,
  the packed [N, blocks, bytes] ones of MatMulNBits) are split in Megatron's column / row pairs:
  a weight whose result reaches another weight's input through ops that keep features apart
  (elementwise ops, reshapes, attention's softmax and activation matmuls) is split by its outputs
  (a column), the one it reaches by its inputs (a row), so the pair needs one all-reduce. A weight
  in no pair is split by its outputs (an LM head by vocabulary); an embedding table a Gather reads
  is split by rows (vocabulary); a KV-cache input by heads; everything else (biases, norms, a
  weight whose dim the axis does not divide) is replicated;
- `param_sharding={regex: PartitionSpec}` places the weights whose names a pattern matches (the
  first that `re.search` finds), over the default.

Repeated layers that load's `layers` pass made one Scan read their weights stacked along a new
first axis (named after the first layer's weight, `...__layers`): the rules above apply inside
the Scan's body, to one layer's slice, and a `param_sharding` spec matching a stacked weight
places each slice (the layer axis is never split). The branches of an If or a Loop (Optimum's
merged decoders) read the enclosing graph's weights by name, and the same rules apply there.

Placement is never a matter of correctness (the partitioner computes the same function for any
placement), only of the collectives it needs.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from transmuter import ir
from transmuter.errors import InputError
from transmuter.runtime.execute import x64_scope

# Ops a weight's result passes through without its features being mixed: from a column-split
# weight to the row-split one that closes the pair, every op keeps each device's share of the
# features to itself (attention's score and value matmuls and its softmax act per head).
_KEEPS_FEATURES = frozenset(
    {
        "Abs", "Add", "BatchNormalization", "BiasGelu", "Cast", "Celu", "Clip", "Concat", "Div",
        "Dropout", "Elu", "Erf", "Exp", "FastGelu", "Gelu", "HardSigmoid", "HardSwish",
        "Identity", "LeakyRelu", "Log", "MatMul", "MaxPool", "AveragePool", "Mish", "Mul", "Neg",
        "Pow", "QuickGelu", "Relu", "Reshape", "Selu", "Sigmoid", "Softmax", "Softplus",
        "Softsign", "Split", "Sqrt", "Squeeze", "Sub", "Tanh", "Transpose", "Unsqueeze", "Where",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Linear:
    """A node applying a weight: the weight's name and the axes of its outputs and inputs."""

    node: ir.Node
    weight: str
    column: int  # splitting this axis splits the node's outputs
    row: int  # splitting this axis splits the contraction: partial sums, one all-reduce


def linears(graph: ir.Graph) -> list[Linear]:
    """The main graph's nodes whose second input is a weight (an initializer) they contract
    with an activation: MatMul and Gemm on 2-D weights, Conv without groups, MatMulNBits, and
    NhwcConv without groups, its weight also behind a Transpose (the layout pass's)."""
    weights = graph.initializers
    transposed = {
        node.outputs[0]: node
        for node in graph.nodes
        if node.op_type == "Transpose" and node.domain == "" and node.inputs[0] in weights
    }
    found = []
    for node in graph.nodes:
        if len(node.inputs) < 2 or node.inputs[0] in weights:
            continue
        if node.op_type == "NhwcConv" and node.domain == "com.microsoft":
            if node.attrs.get("group", 1) == 1:
                found.extend(_nhwc_conv(node, weights, transposed))
            continue
        if node.inputs[1] not in weights:
            continue
        weight, rank = node.inputs[1], np.ndim(weights[node.inputs[1]])
        if node.op_type == "MatMul" and node.domain == "" and rank == 2:
            found.append(Linear(node, weight, column=1, row=0))
        elif node.op_type == "Gemm" and node.domain == "" and rank == 2:
            if not node.attrs.get("transA", 0):
                trans = bool(node.attrs.get("transB", 0))  # B is [N, K] when transposed
                found.append(Linear(node, weight, column=0 if trans else 1, row=1 if trans else 0))
        elif node.op_type == "Conv" and node.domain == "" and rank >= 3:
            if node.attrs.get("group", 1) == 1:
                found.append(Linear(node, weight, column=0, row=1))
        elif node.op_type == "MatMulNBits" and node.domain == "com.microsoft" and rank == 3:
            found.append(Linear(node, weight, column=0, row=1))  # B: [N, K blocks, bytes]
    return found


def _nhwc_conv(node: ir.Node, weights, transposed: dict[str, ir.Node]) -> list[Linear]:
    """NhwcConv's W (M, k1, ..., C): outputs split along M, the contraction along C; through a
    Transpose, the stored weight's axes those come from."""
    if node.inputs[1] in weights:
        rank = np.ndim(weights[node.inputs[1]])
        return [Linear(node, node.inputs[1], column=0, row=rank - 1)]
    source = transposed.get(node.inputs[1])
    if source is None:
        return []
    perm = source.attrs.get("perm")
    rank = np.ndim(weights[source.inputs[0]])
    if perm is None or len(perm) != rank:
        return []
    return [Linear(node, source.inputs[0], column=int(perm[0]), row=int(perm[-1]))]


def find_splits(graph: ir.Graph) -> dict[str, int]:
    """Weight name -> the axis the default rules split it along (module docstring): column /
    row pairs found by walking each weight's result forward, embeddings by rows, and the column
    axis for weights in no pair. A weight read by several nodes keeps the first axis found."""
    found = linears(graph)
    by_input: dict[str, list[Linear]] = {}
    for linear in found:
        by_input.setdefault(linear.node.inputs[0], []).append(linear)
    consumers: dict[str, list[ir.Node]] = {}
    for node in graph.nodes:
        for name in node.inputs:
            consumers.setdefault(name, []).append(node)
    role: dict[int, str] = {}  # id(node) -> "column" | "row"
    for linear in found:
        if id(linear.node) in role:
            continue
        reached = _reached(linear.node, by_input, consumers)
        partners = [r for r in reached if role.get(id(r.node)) != "column"]
        if partners:
            role[id(linear.node)] = "column"
            for partner in partners:
                role[id(partner.node)] = "row"
    splits: dict[str, int] = {}
    for linear in found:
        axis = linear.row if role.get(id(linear.node)) == "row" else linear.column
        splits.setdefault(linear.weight, axis)
    for node in graph.nodes:
        table = node.inputs[0] if node.inputs else ""
        if node.op_type == "Gather" and node.domain == "" and table in graph.initializers:
            if np.ndim(graph.initializers[table]) == 2 and node.attrs.get("axis", 0) == 0:
                splits.setdefault(table, 0)
    for node in graph.nodes:
        for stacked, axis in _layer_splits(graph, node).items():
            splits.setdefault(stacked, axis)
        for branch in _branches(node):
            # The branch reads the weights by their outer names (a merged decoder's If).
            scope = {**graph.initializers, **branch.initializers}
            inner = ir.Graph(branch.nodes, branch.inputs, branch.outputs, scope)
            for name, axis in find_splits(inner).items():
                if name in graph.initializers:
                    splits.setdefault(name, axis)
    return splits


def _branches(node: ir.Node) -> list[ir.Graph]:
    """The subgraphs of an If or a Loop, which see the enclosing graph's weights."""
    if node.op_type not in ("If", "Loop") or node.domain != "":
        return []
    return [value for value in node.attrs.values() if isinstance(value, ir.Graph)]


def _stacked_layers(graph: ir.Graph, node: ir.Node) -> dict[str, str]:
    """For a Scan over weights stacked along their first axis (the `layers` graph pass's, or
    an exporter's): the name each body reads one layer's slice by -> the stacked initializer."""
    if node.op_type != "Scan" or node.domain != "" or "num_scan_inputs" not in node.attrs:
        return {}
    body, m = node.attrs["body"], node.attrs["num_scan_inputs"]
    n = len(node.inputs) - m
    axes = node.attrs.get("scan_input_axes") or [0] * m
    directions = node.attrs.get("scan_input_directions") or [0] * m
    return {
        inner.name: outer
        for outer, inner, axis, direction in zip(
            node.inputs[n:], body.inputs[n:], axes, directions, strict=True
        )
        if outer in graph.initializers and axis == 0 and direction == 0
    }


def _layer_splits(graph: ir.Graph, node: ir.Node) -> dict[str, int]:
    """The default rules inside a Scan body, one layer's slice standing for each stacked
    weight: the same column / row pairs as unrolled layers, one axis further."""
    slices = _stacked_layers(graph, node)
    if not slices:
        return {}
    body = node.attrs["body"]
    # Zero-stride views: the slices' shapes without their memory.
    views = {
        inner: np.broadcast_to(
            np.zeros((), graph.initializers[outer].dtype), graph.initializers[outer].shape[1:]
        )
        for inner, outer in slices.items()
    }
    layer = ir.Graph(body.nodes, body.inputs, body.outputs, {**body.initializers, **views})
    return {slices[name]: axis + 1 for name, axis in find_splits(layer).items() if name in slices}


def _reached(start: ir.Node, by_input, consumers) -> list[Linear]:
    """The weight nodes that `start`'s result reaches as their activation input, through ops
    that keep features apart only (`_KEEPS_FEATURES`); the walk stops at each one reached."""
    reached, seen = [], set()
    pending = list(start.outputs)
    while pending:
        name = pending.pop()
        if name in seen or not name:
            continue
        seen.add(name)
        for linear in by_input.get(name, ()):
            reached.append(linear)
        weight_nodes = {id(linear.node) for linear in by_input.get(name, ())}
        for node in consumers.get(name, ()):
            if id(node) not in weight_nodes and node.op_type in _KEEPS_FEATURES:
                pending.extend(node.outputs)
    return reached


def weight_specs(
    graph: ir.Graph,
    names: list[str],
    mesh: Mesh,
    model_axis: str | None,
    rules: Mapping[str, PartitionSpec] | None,
) -> dict[str, PartitionSpec]:
    """The PartitionSpec of each weight in `names`: the first of `rules` whose pattern
    `re.search`es its name, else the default rules over `model_axis` (replicated without one,
    or where the axis does not divide the weight's dim evenly)."""
    patterns = _compiled_rules(rules, mesh)
    splits = find_splits(graph) if model_axis is not None else {}
    size = mesh.shape[model_axis] if model_axis is not None else 1
    stacked = {w for node in graph.nodes for w in _stacked_layers(graph, node).values()}
    specs = {}
    for name in names:
        shape = np.shape(graph.initializers[name])
        rule = next(((p, s) for p, s in patterns if p.search(name)), None)
        if rule is not None:
            # A rule for a layer's weight places each layer's slice of a stacked one.
            spec = PartitionSpec(None, *rule[1]) if name in stacked else rule[1]
            specs[name] = _checked_spec(
                name, shape, spec, mesh, f"param_sharding[{rule[0].pattern!r}]"
            )
        elif name in splits and shape[splits[name]] % size == 0:
            spec = [None] * len(shape)
            spec[splits[name]] = model_axis
            specs[name] = PartitionSpec(*spec)
        else:
            specs[name] = PartitionSpec()
    return specs


def _compiled_rules(rules, mesh: Mesh) -> list[tuple[re.Pattern, PartitionSpec]]:
    if rules is None:
        return []
    if not isinstance(rules, Mapping):
        raise InputError(
            f"param_sharding must be a dict of regex -> PartitionSpec; got {type(rules).__name__}"
        )
    compiled = []
    for pattern, spec in rules.items():
        if not isinstance(spec, PartitionSpec):
            raise InputError(
                f"param_sharding[{pattern!r}] must be a jax.sharding.PartitionSpec; got {spec!r}"
            )
        try:
            compiled.append((re.compile(pattern), spec))
        except (re.error, TypeError) as exc:
            raise InputError(f"param_sharding key {pattern!r} is not a regex: {exc}") from None
    return compiled


def _checked_spec(name: str, shape, spec: PartitionSpec, mesh: Mesh, where: str) -> PartitionSpec:
    """`spec` for a value of `shape`, or an InputError saying why it cannot place it."""
    if len(spec) > len(shape):
        raise InputError(
            f"{where} = {spec} has {len(spec)} entries but {name!r} has rank {len(shape)}"
        )
    for axis, entry in enumerate(spec):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        unknown = [a for a in axes if a not in mesh.shape]
        if unknown:
            raise InputError(
                f"{where} = {spec} names mesh axes {unknown}; the mesh has {list(mesh.axis_names)}"
            )
        devices = int(np.prod([mesh.shape[a] for a in axes]))
        if shape[axis] % devices:
            raise InputError(
                f"{where} = {spec} splits axis {axis} of {name!r} (shape {list(shape)}) over "
                f"{devices} devices, which do not divide {shape[axis]}"
            )
    return spec


def placer(
    graph: ir.Graph,
    mesh: Mesh,
    model_axis: str | None,
    rules: Mapping[str, PartitionSpec] | None,
) -> Callable[[str, np.ndarray], jax.Array]:
    """`(name, array) -> jax.Array` placing each weight of `graph` as `weight_specs` says, for
    `Model`: every device gets its own shard, read from the numpy array (a memory map for
    external data) by `jax.make_array_from_callback`, so the whole weight never sits on one
    device, and with several processes each reads only the shards of its own devices."""
    mesh = checked_mesh(mesh, model_axis=model_axis)
    specs = weight_specs(graph, list(graph.initializers), mesh, model_axis, rules)

    def place(name: str, array: np.ndarray) -> jax.Array:
        sharding = NamedSharding(mesh, specs[name])
        return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])

    return place


def checked_mesh(mesh: Any, **axes: str | tuple[str, ...] | None) -> Mesh:
    """`mesh` with every axis of the partitioner's Auto type, or an InputError unless it is a
    Mesh holding every axis named in `axes`. Operators are written as plain jax.numpy, which
    Explicit axes (`jax.make_mesh`'s default) would make name an output sharding for each
    gather; under Auto axes GSPMD chooses and adds the collectives."""
    if not isinstance(mesh, Mesh):
        raise InputError(f"mesh must be a jax.sharding.Mesh; got {type(mesh).__name__}")
    for what, names in axes.items():
        for name in () if names is None else (names,) if isinstance(names, str) else names:
            if name not in mesh.shape:
                raise InputError(
                    f"{what}={names!r}: the mesh has no axis {name!r}; its axes are "
                    f"{dict(mesh.shape)}"
                )
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


class Placement:
    """How `compile(..., mesh=)` places a model: its weights, each call's inputs, the outputs.

    `model` is a copy of the given model whose params and device constants sit on the mesh;
    `inputs` splits a call's inputs but `static_inputs` (batch over `data_axis`, KV caches by
    heads over `model_axis`); `outputs` gathers the outputs onto every device when asked to."""

    def __init__(
        self,
        model,
        mesh: Mesh,
        *,
        data_axis: str | tuple[str, ...] | None,
        model_axis: str | None,
        param_sharding: Mapping[str, PartitionSpec] | None,
        batch_axis: str | None,
        gather_outputs: bool,
        static_inputs: frozenset[str] = frozenset(),
    ):
        mesh = checked_mesh(mesh, data_axis=data_axis, model_axis=model_axis)
        if data_axis is None and model_axis is None and param_sharding is None:
            raise InputError(
                "compile(..., mesh=) needs data_axis (split the batch), model_axis (split the "
                "weights) or param_sharding: with none of them nothing is placed on the mesh"
            )
        data_axes = (data_axis,) if isinstance(data_axis, str) else tuple(data_axis or ())
        if model_axis is not None and model_axis in data_axes:
            raise InputError(f"model_axis={model_axis!r} is also in data_axis={data_axis!r}")
        if batch_axis is not None and data_axis is None:
            raise InputError("batch_axis without data_axis: there is no mesh axis to split it over")
        self.mesh = mesh
        self.data_axis = data_axis
        self.data_size = int(np.prod([mesh.shape[a] for a in data_axes]))
        self.gather_outputs = gather_outputs
        self.model = self._placed(model, model_axis, param_sharding)
        tensors = {
            name: spec.shape
            for name, spec in model.input_specs.items()
            if isinstance(spec, ir.TensorType) and spec.shape and name not in static_inputs
        }  # static inputs stay host values: they key programs by value
        self.batch_dim = _batch_dim(tensors, batch_axis) if data_axis is not None else None
        heads = kv_cache_heads(model.ir.graph) if model_axis is not None else {}
        self.specs = {
            name: self._input_spec(shape, heads.get(name), model_axis)
            for name, shape in tensors.items()
        }

    def _placed(self, model, model_axis, rules):
        """A copy of `model` with its weights on the mesh. Without rules, a weight already on this
        mesh (`transmuter.load(..., mesh=)`) keeps its placement; the others are replicated."""
        names = [*model.params, *model.device_constants]
        specs = weight_specs(model.ir.graph, names, self.mesh, model_axis, rules)
        keep = model_axis is None and rules is None

        def place(name, array):
            if (
                keep
                and isinstance(array.sharding, NamedSharding)
                and array.sharding.mesh == self.mesh
            ):
                return array
            return jax.device_put(array, NamedSharding(self.mesh, specs[name]))

        placed = copy.copy(model)
        with x64_scope():
            placed.params = {n: place(n, a) for n, a in model.params.items()}
            placed.device_constants = {n: place(n, a) for n, a in model.device_constants.items()}
        return placed

    def _input_spec(self, shape, heads: int | None, model_axis) -> tuple[PartitionSpec, int | None]:
        """An input's PartitionSpec, and the axis data parallelism splits (None if none)."""
        spec: list[Any] = [None] * len(shape)
        batch = next((a for a, d in enumerate(shape) if d == ir.SymbolicDim(self.batch_dim)), None)
        if batch is not None:
            spec[batch] = self.data_axis
        if heads is not None and isinstance(shape[heads], int):
            if shape[heads] % self.mesh.shape[model_axis] == 0:
                spec[heads] = model_axis
        return PartitionSpec(*spec), batch

    def inputs(self, arrays: Mapping[str, Any]) -> dict[str, Any]:
        """A call's inputs on the mesh. Numpy inputs are placed shard by shard, so that with
        several processes each one passing the same whole batch places only its own shards."""
        placed = dict(arrays)
        with x64_scope():  # int64 ids stay int64, as the programs were compiled for them
            for name, value in arrays.items():
                if name in self.specs:
                    placed[name] = self._placed_input(name, value, *self.specs[name])
        return placed

    def _placed_input(self, name: str, value: Any, spec: PartitionSpec, batch: int | None) -> Any:
        if not isinstance(value, (np.ndarray, jax.Array)) or value.dtype == object:
            return value
        if batch is not None and value.shape[batch] % self.data_size:
            raise InputError(
                f"input {name!r} has {value.shape[batch]} rows along its batch dim "
                f"{self.batch_dim!r} (axis {batch}), which do not split over data_axis="
                f"{self.data_axis!r} ({self.data_size} devices): pass a multiple of "
                f"{self.data_size}, or compile with buckets={{{self.batch_dim!r}: "
                f"('multiple', {self.data_size})}}"
            )
        sharding = NamedSharding(self.mesh, spec)
        if isinstance(value, jax.Array):
            return jax.device_put(value, sharding)
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    def outputs(self, outputs: dict[str, Any]) -> dict[str, Any]:
        """The outputs as the partitioner left them (split by batch where the inputs were), or
        with gather_outputs=True whole on every device (readable in every process)."""
        if not self.gather_outputs:
            return outputs
        everywhere = NamedSharding(self.mesh, PartitionSpec())
        return {
            name: jax.device_put(value, everywhere) if isinstance(value, jax.Array) else value
            for name, value in outputs.items()
        }


def _batch_dim(shapes: Mapping[str, tuple], given: str | None) -> str:
    """The dim name data parallelism splits: `given`, or the name leading every tensor input."""
    names = {
        dim.name for shape in shapes.values() for dim in shape if isinstance(dim, ir.SymbolicDim)
    }
    if given is not None:
        if given not in names:
            raise InputError(
                f"batch_axis={given!r} is no dim of the inputs; their dim names are {sorted(names)}"
            )
        return given
    leading = {shape[0] for shape in shapes.values()}
    if len(leading) == 1 and isinstance(next(iter(leading)), ir.SymbolicDim):
        return next(iter(leading)).name
    raise InputError(
        f"no dim name leads every input (leading dims {sorted(map(str, leading))}): give "
        f"batch_axis=<the dim name to split>; the inputs' dim names are {sorted(names)}"
    )


# Ops a KV-cache input passes through unchanged before its Concat with the new keys or values.
_CARRIES = frozenset({"Identity", "Concat"})


def kv_cache_heads(graph: ir.Graph) -> dict[str, int]:
    """Input name -> its heads axis, for the KV-cache inputs: those that a Concat joins with
    values the graph computes into a graph output (the present keys or values). The heads axis
    is the one that is neither the leading (batch) axis, the joined (sequence) axis, nor the last
    (head size) axis, as in [batch, heads, past, head size]; a cache without one is not split."""
    carried = {v.name: v.name for v in graph.inputs}
    outputs = {v.name for v in graph.outputs}
    ranks = {
        v.name: len(v.type.shape)
        for v in graph.inputs
        if isinstance(v.type, ir.TensorType) and v.type.shape
    }
    found = {}
    for node in graph.nodes:
        sources = [carried[n] for n in node.inputs if n in carried]
        if node.op_type not in _CARRIES or node.domain or not sources:
            continue
        if len(node.inputs) == 1:  # a pass-through (a one-input Concat is a copy)
            carried[node.outputs[0]] = sources[0]
        elif node.op_type == "Concat" and node.outputs[0] in outputs:
            for source in sources:
                rank = ranks.get(source, 0)
                joined = int(node.attrs.get("axis", 0)) % rank if rank else 0
                left = [a for a in range(1, rank - 1) if a != joined]
                if left:
                    found[source] = left[0]
    return found
