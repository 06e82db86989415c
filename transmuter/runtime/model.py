"""`Model`: a loaded graph, its weights split into params and host constants, and its plan."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transmuter import dtypes, ir
from transmuter.errors import InputError
from transmuter.ir.arrays import shareable
from transmuter.runtime import trace_cache
from transmuter.runtime.analysis import Break, graph_breaks
from transmuter.runtime.execute import to_device, x64_scope
from transmuter.runtime.interpreter import Plan

# Float initializers with more elements than this are params (jit arguments); smaller ones stay
# host constants, so that scalars and small tables fold on the host while tracing.
PARAM_MIN_SIZE = 64
# Non-float initializers this large are passed as arguments too rather than embedded in programs.
DEVICE_CONSTANT_MIN_SIZE = 1 << 16
# The float types params may have. float8/float6/float4 initializers are quantized weights,
# read through DequantizeLinear: constants like the integer ones, never trained.
PARAM_DTYPES = frozenset(np.dtype(t) for t in (np.float16, jnp.bfloat16, np.float32, np.float64))


class Model:
    """A loaded ONNX model, ready to run.

    inputs / outputs: the ONNX names in order. input_specs / output_specs: name -> declared type
    (`ir.TensorType` with dtype and dims, symbolic dims named as in the file). params: the
    initializers that are arguments of the traced program (a dict pytree; `jax.grad` w.r.t. it):
    with trainable=True every initializer of a PARAM_DTYPES type, else only the large ones. An
    initializer that a node (in a subgraph too) reads directly as a host input, such as Resize's
    scales, is never a param but a host constant, even when trainable: traced, it could not
    decide a shape.
    origin: what the model was loaded from, as the front end recorded it for `transmuter.save`
    (opaque here; None for a model not loaded by `transmuter.load`).
    place: `(name, array) -> jax.Array` putting each param and device constant on its devices
    (runtime/sharding.py, for a mesh); by default the whole array goes to the default device.
    Where that is the CPU, the device arrays run on `ir.graph`'s own arrays, copied first into
    aligned read-only memory where they are not so already (`ir.arrays.shareable`; the caller's
    `model` is left as it is): each weight is held once.
    """

    def __init__(
        self,
        model: ir.Model,
        *,
        trainable: bool = False,
        source: str = "",
        origin: Any = None,
        place: Callable[[str, np.ndarray], jax.Array] | None = None,
    ):
        self.source = source
        self.origin = origin
        self.trainable = trainable
        if place is None and _default_platform() == "cpu":
            # The weights are held once: the device arrays run on the graph's own host arrays.
            model = _with_shareable_initializers(model)
            place = _alias
        place = place or (lambda _, array: to_device(array))
        self.ir = model
        graph = model.graph
        self.inputs: list[str] = [v.name for v in graph.inputs]
        self.outputs: list[str] = [v.name for v in graph.outputs]
        self.input_specs: dict[str, ir.ValueType | None] = {v.name: v.type for v in graph.inputs}
        self.output_specs: dict[str, ir.ValueType | None] = {v.name: v.type for v in graph.outputs}
        self.plan = Plan.build(graph, model.opsets)
        params, device_constants, host_constants = {}, {}, {}
        host_reads = _host_reads(self.plan)
        for name, array in graph.initializers.items():
            if name in host_reads:
                host_constants[name] = np.asarray(array)
            elif array.dtype in PARAM_DTYPES and (trainable or array.size > PARAM_MIN_SIZE):
                params[name] = array
            elif array.size >= DEVICE_CONSTANT_MIN_SIZE and array.dtype != object:
                device_constants[name] = array
            else:
                host_constants[name] = np.asarray(array)
        with x64_scope():
            self.params: dict[str, jax.Array] = {k: place(k, v) for k, v in params.items()}
            self.device_constants = {k: place(k, v) for k, v in device_constants.items()}
        self.host_constants: dict[str, np.ndarray] = host_constants
        # Inputs that index a table of known size: checked per call (check_inputs).
        self.index_ranges: dict[str, list[IndexRange]] = index_ranges(graph)

    def part(self, model: ir.Model, source: str) -> Model:
        """A model of `model`, part of this one's graph (`transmuter.split`'s head or tail),
        running on this one's device arrays as they are placed (nothing copied)."""
        placed = {**self.params, **self.device_constants}
        return Model(
            model,
            trainable=self.trainable,
            source=source,
            place=lambda name, array: placed[name] if name in placed else to_device(array),
        )

    @functools.cached_property
    def fingerprint(self) -> str:
        """A digest of what a trace of this model depends on besides its arguments (the graph,
        opsets, host constants' values): part of the key of traced segments kept on disk."""
        return trace_cache.fingerprint(self)

    @property
    def opsets(self) -> dict[str, int]:
        return dict(self.ir.opsets)

    def graph_breaks(self, static_inputs: Iterable[str] = ()) -> list[Break]:
        """Where `transmuter.compile` splits the main graph (or may), found from the operators'
        registrations without running it, with the inputs other than `static_inputs` as data."""
        return graph_breaks(self, frozenset(static_inputs))

    def __repr__(self) -> str:
        ins = ", ".join(f"{n}: {self.input_specs[n]}" for n in self.inputs)
        outs = ", ".join(f"{n}: {self.output_specs[n]}" for n in self.outputs)
        return f"Model({self.source or 'in memory'}; inputs {ins}; outputs {outs})"

    def check_inputs(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """The inputs as arrays in input order, each checked against its declared type."""
        if not isinstance(inputs, Mapping):
            raise InputError(f"inputs must be a dict of name -> array; got {type(inputs).__name__}")
        extra = [k for k in inputs if k not in self.input_specs]
        missing = [k for k in self.inputs if k not in inputs]
        if extra or missing:
            parts = []
            if missing:
                parts.append(f"missing {missing}")
            if extra:
                parts.append(f"unknown {extra}")
            raise InputError(f"{'; '.join(parts)}. The model's inputs are {self._spec_list()}")
        arrays = {
            name: _check_input(name, inputs[name], self.input_specs[name]) for name in self.inputs
        }
        self.check_index_ranges(arrays)
        return arrays

    def check_index_ranges(self, arrays: Mapping[str, Any]) -> None:
        """Raise an InputError for an integer input holding an index outside a table it reads."""
        for name, ranges in self.index_ranges.items():
            _check_range(name, arrays[name], ranges)

    def check_input(self, name: str, value: Any) -> Any:
        """One input as an array, checked against its declared type."""
        if name not in self.input_specs:
            raise InputError(
                f"{name!r} is not an input. The model's inputs are {self._spec_list()}"
            )
        value = _check_input(name, value, self.input_specs[name])
        _check_range(name, value, self.index_ranges.get(name, ()))
        return value

    def _spec_list(self) -> str:
        return ", ".join(f"{n}: {self.input_specs[n]}" for n in self.inputs)


def _alias(_: str, array: np.ndarray) -> jax.Array:
    return jax.device_put(array, may_alias=True)


def _default_platform() -> str:
    """The platform `jax.device_put` places on: `jax.default_device`'s, else the default backend's."""
    device = jax.config.jax_default_device
    if device is None:
        return jax.default_backend()
    return device if isinstance(device, str) else device.platform


def _with_shareable_initializers(model: ir.Model) -> ir.Model:
    """`model` with its main graph's initializers `shareable` (the caller's model untouched)."""
    initializers = {
        name: array if array.dtype == object else shareable(array)
        for name, array in model.graph.initializers.items()
    }
    return replace(model, graph=replace(model.graph, initializers=initializers))


def _host_reads(plan: Plan) -> set[str]:
    """The names that the plan's nodes, subgraphs included, read as host inputs (every input of
    a data-dependent op); a name a subgraph defines itself is its own value, not the outer one."""
    found: set[str] = set()
    for step in plan.steps:
        node = step.node
        found.update(node.inputs[i] for i in step.opdef.host_input_indices(node.inputs))
        for sub in ir.subgraphs(node):
            local = {v.name for v in sub.inputs} | set(sub.initializers)
            local.update(name for inner in sub.nodes for name in inner.outputs)
            found.update(_host_reads(plan.subplans[id(sub)]) - local)
    return found


@dataclass(frozen=True)
class IndexRange:
    """A model input that reaches the indices of `node` (a lookup into the table `table` of
    `rows` rows) unchanged: its values must lie in [low, high)."""

    low: int
    high: int
    node: str
    op_type: str
    table: str


# Ops that pass an integer input's values on unchanged (input 0), so that the values reaching a
# lookup are the input's own. Cast is one only when it widens or keeps a signed integer type.
_PASS_THROUGH = frozenset({"Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand"})
# (op type, domain) -> [(indices input, table input, attribute naming the table axis or None,
# whether negative indices count from the end)]. ORT's EmbedLayerNormalization kernels reject
# negative ids; Gather, GatherElements and GatherBlockQuantized take [-rows, rows).
_LOOKUPS = {
    ("Gather", ""): [(1, 0, "axis", True)],
    ("GatherElements", ""): [(1, 0, "axis", True)],
    ("GatherBlockQuantized", "com.microsoft"): [(1, 0, "gather_axis", True)],
    ("EmbedLayerNormalization", "com.microsoft"): [
        (0, 2, None, False),
        (1, 4, None, False),
        (8, 3, None, False),
    ],
    ("QEmbedLayerNormalization", "com.microsoft"): [(0, 2, None, False), (1, 4, None, False)],
}


def index_ranges(graph: ir.Graph) -> dict[str, list[IndexRange]]:
    """The main graph's integer inputs whose values reach a lookup's indices through
    `_PASS_THROUGH` ops (and widening casts), with the range each lookup allows; only lookups
    into initializers, whose size is known. An input reaching a node anywhere else is still
    checked for the lookups it reaches unchanged."""
    dtypes_of = {
        v.name: v.type.dtype
        for v in graph.inputs
        if isinstance(v.type, ir.TensorType) and np.dtype(v.type.dtype).kind in "iu"
    }
    carried = {name: name for name in dtypes_of}  # value name -> the input it carries
    found: dict[str, list[IndexRange]] = {}
    for node in graph.nodes:
        source = carried.get(node.inputs[0]) if node.inputs else None
        if source is not None and node.domain == "" and _passes(node, dtypes_of[node.inputs[0]]):
            for out in node.outputs[:1]:
                carried[out] = source
                cast = node.op_type == "Cast"
                dtypes_of[out] = (
                    dtypes.from_onnx(node.attrs["to"]) if cast else dtypes_of[node.inputs[0]]
                )
        for position, table_at, axis_attr, negative in _LOOKUPS.get(
            (node.op_type, node.domain), ()
        ):
            if max(position, table_at) >= len(node.inputs) or node.inputs[position] not in carried:
                continue
            table = graph.initializers.get(node.inputs[table_at])
            if table is None or not np.ndim(table):
                continue
            axis = int(node.attrs.get(axis_attr, 0)) if axis_attr else 0
            if not -table.ndim <= axis < table.ndim:
                continue
            rows = int(table.shape[axis])
            low = -rows if negative else 0
            found.setdefault(carried[node.inputs[position]], []).append(
                IndexRange(low, rows, node.label, node.op_type, node.inputs[table_at])
            )
    return found


def _passes(node: ir.Node, dtype: np.dtype) -> bool:
    if node.op_type in _PASS_THROUGH:
        return True
    if node.op_type != "Cast" or "to" not in node.attrs:
        return False
    try:
        target = np.dtype(dtypes.from_onnx(node.attrs["to"]))
    except Exception:  # an unknown type code: not a pass-through
        return False
    source = np.dtype(dtype)
    wider = target.itemsize > source.itemsize
    return target.kind == "i" and (
        wider or (source.kind == "i" and target.itemsize == source.itemsize)
    )


def _check_range(name: str, value: Any, ranges) -> None:
    """Raise an InputError when the integer input `value` holds an index outside a range it
    must keep; one min and max per call (traced values are not checked: they cannot be)."""
    if not ranges or isinstance(value, jax.core.Tracer) or not np.size(value):
        return
    # On the host even for a JAX array: ids are small, and a jitted min/max would compile once
    # per new shape of them.
    value = np.asarray(value)
    low, high = int(value.min()), int(value.max())
    for r in ranges:
        if low >= r.low and high < r.high:
            continue
        array = np.asarray(value)
        bad = (array < r.low) | (array >= r.high)
        position = np.unravel_index(int(np.argmax(bad)), array.shape)
        raise InputError(
            f"input {name!r} holds {int(array[position])} at {list(map(int, position))}, outside "
            f"the valid range [{r.low}, {r.high - 1}]: it indexes {r.table!r} ({r.high} rows) in "
            f"node {r.node!r} ({r.op_type})"
        )


def _check_input(name: str, value: Any, spec: ir.ValueType | None) -> Any:
    if isinstance(spec, ir.MapType):
        return _check_map(name, value, spec)
    if isinstance(spec, ir.SequenceType) and isinstance(spec.elem, ir.MapType):
        if not isinstance(value, (list, tuple)):
            raise InputError(f"input {name!r} expects {spec} (a list of dicts), got {type(value)}")
        return [_check_map(f"{name}[{i}]", v, spec.elem) for i, v in enumerate(value)]
    if isinstance(spec, ir.SequenceType) and _holds_strings(spec.elem):
        if isinstance(value, (list, tuple)):  # numpy string arrays become object arrays
            return [_as_array(f"{name}[{i}]", v, spec.elem.dtype) for i, v in enumerate(value)]
    if not isinstance(spec, ir.TensorType):
        return value  # other sequences, optionals and undeclared types are taken as given
    value = _as_array(name, value, spec.dtype)
    if value.dtype != spec.dtype and _narrowed_by_jax(value, spec.dtype):
        with x64_scope():
            value = value.astype(spec.dtype)
    if value.dtype != spec.dtype:
        raise InputError(
            f"input {name!r} expects {spec}, got {_got(value)}: cast it to {spec.dtype.name}"
        )
    if spec.shape is not None:
        if len(value.shape) != len(spec.shape):
            raise InputError(
                f"input {name!r} expects rank {len(spec.shape)} ({spec}), got {_got(value)}"
            )
        for axis, (want, have) in enumerate(zip(spec.shape, value.shape)):
            if isinstance(want, int) and want != have:
                raise InputError(f"input {name!r} expects {spec}, got {_got(value)} (axis {axis})")
    return value


def _narrowed_by_jax(value: Any, dtype: np.dtype) -> bool:
    """Whether `value` is a JAX array (a caller's tracer included) of the 32-bit type that JAX,
    with x64 off, makes of `dtype`: a caller's `jax.jit` turns int64 ids into int32 ones before
    Transmuter sees them. Such a value is widened back, as it could hold nothing wider."""
    if not isinstance(value, jax.Array) or jax.config.jax_enable_x64:
        return False
    return np.dtype(value.dtype) == jax.dtypes.canonicalize_dtype(dtype) != dtype


def _holds_strings(spec: ir.ValueType | None) -> bool:
    return isinstance(spec, ir.TensorType) and spec.dtype == np.dtype(object)


def _got(value: Any) -> str:
    return f"{np.dtype(value.dtype).name}{list(value.shape)}"


def _check_map(name: str, value: Any, spec: ir.MapType) -> dict:
    """A map input as a dict with Python int or str keys and values of the declared type: numpy
    scalars (strings stay str), or arrays where the values are tensors of rank 1 or more."""
    if not isinstance(value, Mapping):
        raise InputError(f"input {name!r} expects {spec} (a dict), got {type(value).__name__}")
    strings = np.dtype(spec.key) == np.dtype(object)
    value_spec = spec.value if isinstance(spec.value, ir.TensorType) else None
    out = {}
    for key, item in value.items():
        if strings != isinstance(key, str):
            raise InputError(f"input {name!r} expects {spec}, got the key {key!r}")
        key = key if strings else int(key)
        if value_spec is None:
            out[key] = item
        elif value_spec.dtype == np.dtype(object):
            if not isinstance(item, str):
                raise InputError(f"input {name!r} expects {spec}, got the value {item!r}")
            out[key] = item
        else:
            array = np.asarray(_as_array(name, item, value_spec.dtype), value_spec.dtype)
            out[key] = array[()] if array.ndim == 0 else array
    return out


# Which kinds of Python value may take a declared dtype of which kind ("f": any float type).
_COMPATIBLE = {"b": "b", "i": "iufc", "u": "iufc", "f": "fc", "c": "c", "O": "O"}


def _as_array(name: str, value: Any, dtype: np.dtype) -> Any:
    if dtype == np.dtype(object) and not isinstance(value, jax.Array):
        array = np.asarray(value)
        if array.dtype.kind in _STRING_KINDS:
            return _as_str(name, array)
    if isinstance(value, np.ndarray) and not value.dtype.isnative:
        # A big-endian array (read from a file, say) holds the same values: make it native.
        return value.astype(value.dtype.newbyteorder("="))
    if isinstance(value, (jax.Array, np.ndarray)):
        return value
    array = np.asarray(value)
    if isinstance(value, np.generic):
        return array
    # Python scalars and nested lists take the declared dtype when their kind allows it.
    target = "f" if dtypes.is_float(dtype) else np.dtype(dtype).kind
    if target not in _COMPATIBLE.get(array.dtype.kind, ""):
        raise InputError(
            f"input {name!r} expects {np.dtype(dtype).name}, got a Python {type(value).__name__}"
        )
    return array.astype(dtype)


# numpy's string arrays: fixed-width unicode ("U"), fixed-width bytes ("S") and numpy 2's
# StringDType ("T"). A string tensor holds Python str (an object array), so they are converted.
_STRING_KINDS = ("U", "S", "T")


def _as_str(name: str, array: np.ndarray) -> np.ndarray:
    """A numpy string array as an object array of the same str. Bytes are UTF-8, as ONNX Runtime
    reads them (it copies them raw and decodes its string outputs as UTF-8); numpy drops the
    trailing NULs of fixed-width items, as ONNX Runtime does."""
    if array.dtype.kind != "S":
        return array.astype(object)
    out = np.empty(array.shape, object)
    for index, item in np.ndenumerate(array):
        try:
            out[index] = item.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InputError(
                f"input {name!r} holds {bytes(item)!r} at {list(index)}, which is not UTF-8 "
                f"({error.reason}): string tensors hold text; pass str, decoding the bytes with "
                "their encoding"
            ) from None
    return out
