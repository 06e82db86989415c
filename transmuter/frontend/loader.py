"""ONNX protobuf -> transmuter.ir. The only module of Transmuter that imports onnx."""

from __future__ import annotations

import ctypes
import functools
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.inliner
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from transmuter import cpu, dtypes, ir
from transmuter.errors import ModelLoadError
from transmuter.ir import arrays


def load_model(source) -> ir.Model:
    """Read an ONNX model from a path, bytes or a ModelProto into the IR.

    External-data tensors are memory-mapped from files beside the model where their offset is
    aligned (ir/arrays.py), else read; a location that leaves the model's folder is refused.
    """
    model = _converted(source)
    _release_freed_memory()
    return model


def _release_freed_memory() -> None:
    """Give the parsed protobuf's memory back to the system now that it is freed. glibc keeps
    freed blocks for reuse, and a parse makes as many as the model has weights, which then stayed
    resident beside the weights themselves in some runs (tests/runtime/test_weights_held_once.py)."""
    if sys.platform.startswith("linux"):
        trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # absent outside glibc
        if trim is not None:
            trim(0)


def _converted(source) -> ir.Model:
    proto, base_dir = read_proto(source)
    bad = _undecoded_text(proto)
    if bad is not None:
        field, value = bad
        raise ModelLoadError(
            f"the ONNX model is corrupt: its {field} {value[:60]!r} is not UTF-8 text"
        )
    if not proto.HasField("graph"):
        raise ModelLoadError("the ONNX model has no graph (is the file complete?)")
    if proto.functions:
        proto = onnx.inliner.inline_local_functions(proto)
    opsets = {_domain(o.domain): o.version for o in proto.opset_import}
    _check_opsets(opsets)
    # External data may be reached through links only where the model itself leads: a cache
    # that links a model and its data into one store (the Hugging Face cache's blobs/).
    stores = {base_dir.resolve(), Path(source).resolve().parent} if base_dir else set()
    graph = _Converter(base_dir, stores).graph(proto.graph, outer=set())
    return ir.Model(
        graph=graph,
        opsets=opsets,
        ir_version=proto.ir_version,
        producer=f"{proto.producer_name} {proto.producer_version}".strip(),
        metadata={p.key: p.value for p in proto.metadata_props},
    )


def read_proto(source) -> tuple[onnx.ModelProto, Path | None]:
    """The ModelProto of a path, bytes or ModelProto, and the folder its external data is named
    relative to (None unless read from a file)."""
    if isinstance(source, onnx.ModelProto):
        return source, None
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _parse(bytes(source), "the given bytes"), None
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise ModelLoadError(f"no ONNX file at {str(path)!r}")
        # The folder as named, links kept: external data is named relative to it.
        return _parse(path.read_bytes(), str(path)), Path(os.path.abspath(path)).parent
    raise TypeError(
        f"cannot load a model from {type(source).__name__}: give a path, bytes or onnx.ModelProto"
    )


def _parse(data: bytes, what: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise ModelLoadError(
            f"{what} is not a valid ONNX model (corrupt or truncated): {exc}"
        ) from None
    return proto


def _undecoded_text(message) -> tuple[str, bytes] | None:
    """The first string field (a name, an op type, a dim name...) that protobuf left as bytes
    because it is not valid UTF-8, as (Message.field, bytes); None if every one decodes."""
    for field, value in message.ListFields():
        if field.type not in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE):
            continue
        repeated = getattr(field, "is_repeated", None)
        if repeated is None:  # protobuf < 5
            repeated = field.label == FieldDescriptor.LABEL_REPEATED
        for item in value if repeated else (value,):
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                found = _undecoded_text(item)
                if found is not None:
                    return found
            elif isinstance(item, bytes):
                return f"{message.DESCRIPTOR.name}.{field.name}", item
    return None


def _domain(name: str) -> str:
    return "" if name == "ai.onnx" else name


@functools.cache
def _known_opsets() -> dict[str, tuple[int, int]]:
    """domain -> (first, last) opset version the installed onnx defines schemas for."""
    known = {"": (1, onnx.defs.onnx_opset_version())}
    known["ai.onnx.ml"] = (1, onnx.defs.onnx_ml_opset_version())
    version_map = getattr(onnx.defs.C, "schema_version_map", None)
    for domain, (first, last) in (version_map() if version_map else {}).items():
        known[_domain(domain)] = (first, last)
    return known


def _check_opsets(opsets: dict[str, int]) -> None:
    # ONNX Runtime refuses an opset newer than it knows (ValidateOpsetForDomain); a version no
    # schema defines has no semantics to lower. Domains onnx has no schemas for (com.microsoft,
    # custom ones) are left to operator lookup.
    for domain, version in opsets.items():
        if domain not in _known_opsets():
            continue
        first, last = _known_opsets()[domain]
        if not first <= version <= last:
            raise ModelLoadError(
                f"the model imports opset {version} of {domain or 'ai.onnx'}, which the installed "
                f"onnx {onnx.__version__} does not define (it knows versions {first}..{last})"
            )


class _Converter:
    def __init__(self, base_dir: Path | None, stores: set[Path]):
        self.base_dir = base_dir
        self.stores = stores

    def graph(self, g: onnx.GraphProto, outer: set[str]) -> ir.Graph:
        initializers = {t.name: self.tensor(t) for t in g.initializer}
        for sparse in g.sparse_initializer:
            initializers[sparse.values.name] = self.sparse_tensor(sparse)
        inputs = [self.value_info(v) for v in g.input if v.name not in initializers]
        defined = set(outer) | {v.name for v in inputs} | set(initializers)
        # A subgraph may read any value of the enclosing scopes; its own sort needs to know them.
        scope = defined | {o for n in g.node for o in n.output}
        nodes = [self.node(n, scope) for n in g.node]
        nodes = _topological_order(nodes, defined, g.name)
        produced = defined | {o for n in nodes for o in n.outputs}
        for out in g.output:
            if out.name not in produced:
                raise ModelLoadError(f"graph {g.name!r} output {out.name!r} is never computed")
        return ir.Graph(
            nodes=nodes,
            inputs=inputs,
            outputs=[self.value_info(v) for v in g.output],
            initializers=initializers,
            value_info={v.name: self.value_info(v) for v in g.value_info},
            name=g.name,
        )

    def node(self, n: onnx.NodeProto, scope: set[str]) -> ir.Node:
        attrs: dict[str, Any] = {}
        for a in n.attribute:
            if a.ref_attr_name:
                raise ModelLoadError(
                    f"node {n.name!r} refers to a function attribute outside a function"
                )
            try:
                attrs[a.name] = self.attribute(a, scope)
            except UnicodeDecodeError as exc:
                raise ModelLoadError(
                    f"node {n.name!r} ({n.op_type}) attribute {a.name!r} is not UTF-8 text: {exc}"
                ) from None
        return ir.Node(
            op_type=n.op_type,
            domain=_domain(n.domain),
            inputs=tuple(n.input),
            outputs=tuple(n.output),
            attrs=attrs,
            name=n.name,
        )

    def attribute(self, a: onnx.AttributeProto, scope: set[str]) -> Any:
        kind = onnx.AttributeProto
        match a.type:
            case kind.FLOAT:
                return float(a.f)
            case kind.INT:
                return int(a.i)
            case kind.STRING:
                return a.s.decode("utf-8")
            case kind.TENSOR:
                return self.tensor(a.t)
            case kind.SPARSE_TENSOR:
                return self.sparse_tensor(a.sparse_tensor)
            case kind.GRAPH:
                return self.graph(a.g, scope)
            case kind.TYPE_PROTO:
                return _value_type(a.tp)
            case kind.FLOATS:
                return tuple(float(v) for v in a.floats)
            case kind.INTS:
                return tuple(int(v) for v in a.ints)
            case kind.STRINGS:
                return tuple(v.decode("utf-8") for v in a.strings)
            case kind.TENSORS:
                return tuple(self.tensor(t) for t in a.tensors)
            case kind.GRAPHS:
                return tuple(self.graph(g, scope) for g in a.graphs)
            case kind.SPARSE_TENSORS:
                return tuple(self.sparse_tensor(t) for t in a.sparse_tensors)
            case kind.TYPE_PROTOS:
                return tuple(_value_type(t) for t in a.type_protos)
        raise ModelLoadError(f"attribute {a.name!r} has an unknown type {a.type}")

    def tensor(self, t: onnx.TensorProto) -> np.ndarray:
        try:
            dtype = dtypes.from_onnx(t.data_type)
        except ValueError as exc:
            raise ModelLoadError(f"tensor {t.name!r}: {exc}") from None
        _check_dims(t.name, t.dims)
        if t.data_location == onnx.TensorProto.EXTERNAL:
            return self.external_tensor(t, dtype)
        try:
            array = numpy_helper.to_array(t).astype(dtype, copy=False)
        except Exception as exc:  # onnx raises several types for inconsistent tensors
            raise ModelLoadError(f"tensor {t.name!r} cannot be decoded: {exc}") from None
        # Out of the protobuf's bytes (a view of them would keep every weight's bytes alive).
        return array if array.dtype == object else arrays.shareable(array)

    def external_tensor(self, t: onnx.TensorProto, dtype: np.dtype) -> np.ndarray:
        info = {e.key: e.value for e in t.external_data}
        if self.base_dir is None:
            raise ModelLoadError(
                f"tensor {t.name!r} keeps its data in {info.get('location')!r}: load the model "
                "from its file path so the data file can be found beside it"
            )
        if "\x00" in info.get("location", ""):
            raise ModelLoadError(
                f"tensor {t.name!r}: external data location {info['location']!r} holds a NUL byte"
            )
        try:
            return self._read_external(t, dtype, info)
        except OSError as exc:  # a name too long, a folder where a file should be, ...
            raise ModelLoadError(
                f"tensor {t.name!r}: cannot read external data {info.get('location')!r}: {exc}"
            ) from None

    def _read_external(self, t: onnx.TensorProto, dtype: np.dtype, info: dict) -> np.ndarray:
        named = Path(os.path.normpath(self.base_dir / info.get("location", "")))
        path = named.resolve()
        inside = named.is_relative_to(self.base_dir) and named != self.base_dir
        if not inside or not any(path.is_relative_to(store) for store in self.stores):
            raise ModelLoadError(
                f"tensor {t.name!r}: external data location {info.get('location')!r} is outside "
                f"the model's folder {str(self.base_dir)!r}; refusing to read it"
            )
        if not path.is_file():
            raise ModelLoadError(f"tensor {t.name!r}: external data file {str(path)!r} is missing")
        offset = _external_int(t.name, info, "offset", 0)
        shape = tuple(int(d) for d in t.dims)
        count = math.prod(shape)  # Python ints: a product of huge dims must not wrap
        packed = dtype.itemsize == 1 and dtype.name in _SUB_BYTE
        nbytes = (count * _SUB_BYTE[dtype.name] + 7) // 8 if packed else count * dtype.itemsize
        length = _external_int(t.name, info, "length", nbytes)
        if length < nbytes or offset + length > path.stat().st_size:
            raise ModelLoadError(
                f"tensor {t.name!r}: external data file {path.name!r} holds fewer bytes than "
                f"shape {shape} of {dtype.name} needs (truncated?)"
            )
        if packed:  # sub-byte types are unpacked by onnx; read the bytes, then decode
            copy = onnx.TensorProto()
            copy.CopyFrom(t)
            del copy.external_data[:]
            copy.data_location = onnx.TensorProto.DEFAULT
            with open(path, "rb") as f:
                f.seek(offset)
                copy.raw_data = f.read(length)
            return numpy_helper.to_array(copy).astype(dtype, copy=False)
        if count == 0:
            return np.zeros(shape, dtype)
        if offset % arrays.ALIGNMENT == 0:  # mapped, the pages are the weight (arrays.py)
            return arrays.mapped_file(path, offset, nbytes).view(dtype).reshape(shape)
        array = arrays.empty(shape, dtype)
        with open(path, "rb") as f:
            f.seek(offset)
            if f.readinto(memoryview(array.reshape(-1).view(np.uint8))) != nbytes:
                raise ModelLoadError(
                    f"tensor {t.name!r}: external data file {path.name!r} changed while read"
                )
        array.flags.writeable = False
        return array

    def sparse_tensor(self, s: onnx.SparseTensorProto) -> np.ndarray:
        name = s.values.name
        _check_dims(name, s.dims)
        shape = tuple(int(d) for d in s.dims)
        values = self.tensor(s.values)
        indices = self.tensor(s.indices)
        what = f"sparse tensor {name!r} of shape {list(shape)}"
        nnz = values.size
        if values.ndim != 1:
            raise ModelLoadError(f"{what}: its values must be 1-D, got shape {list(values.shape)}")
        if indices.dtype.kind not in "iu":
            raise ModelLoadError(f"{what}: its indices are {indices.dtype.name}, not integers")
        if indices.shape not in ((nnz,), (nnz, len(shape))):
            raise ModelLoadError(
                f"{what}: {nnz} values need indices of shape [{nnz}] (linearized) or "
                f"[{nnz}, {len(shape)}], got {list(indices.shape)}"
            )
        # The dense size comes from the declared dims alone: check it before allocating.
        nbytes = math.prod(shape) * values.dtype.itemsize
        if nbytes > cpu.physical_memory():
            raise ModelLoadError(
                f"{what} of {values.dtype.name} densifies to {nbytes:,} bytes, more than this "
                f"machine's memory ({cpu.physical_memory():,} bytes)"
            )
        bounds = (math.prod(shape),) if indices.ndim == 1 else shape
        for axis, bound in enumerate(bounds):
            column = indices if indices.ndim == 1 else indices[:, axis]
            if column.size and (column.min() < 0 or column.max() >= bound):
                bad = column[(column < 0) | (column >= bound)][0]
                where = "linearized index" if indices.ndim == 1 else f"index on axis {axis}"
                raise ModelLoadError(f"{what}: {where} {int(bad)} is out of range [0, {bound})")
        try:
            dense = np.zeros(shape, values.dtype)
        except MemoryError:
            raise ModelLoadError(f"{what}: no memory for its {nbytes:,} dense bytes") from None
        if indices.ndim == 1:  # linearized indices
            dense.reshape(-1)[indices] = values
        else:
            dense[tuple(indices.T)] = values
        return dense

    def value_info(self, v: onnx.ValueInfoProto) -> ir.ValueInfo:
        value_type = _value_type(v.type, v.name) if v.HasField("type") else None
        return ir.ValueInfo(v.name, value_type)


_SUB_BYTE = {
    "int4": 4,
    "uint4": 4,
    "float4_e2m1fn": 4,
    "int2": 2,
    "uint2": 2,
    "float6_e2m3fn": 6,
    "float6_e3m2fn": 6,
}


def _check_dims(name: str, dims) -> None:
    # Unlike a declared value_info dim (a free dim when negative, see _dim), a stored tensor's
    # dims are its size: ONNX Runtime and onnx.checker refuse a negative one.
    if any(d < 0 for d in dims):
        raise ModelLoadError(f"tensor {name!r} has a negative dim: dims {list(dims)}")


def _external_int(name: str, info: dict[str, str], key: str, default: int) -> int:
    """An external-data field that holds a byte count: decimal digits only."""
    if key not in info:
        return default
    if not re.fullmatch(r"[0-9]+", info[key]):
        raise ModelLoadError(
            f"tensor {name!r}: external data {key} {info[key]!r} is not a non-negative integer"
        )
    return int(info[key])


def _value_type(tp: onnx.TypeProto, owner: str = "") -> ir.ValueType | None:
    which = tp.WhichOneof("value")
    if which == "tensor_type" or which == "sparse_tensor_type":
        tt = getattr(tp, which)
        shape = None
        if tt.HasField("shape"):
            shape = tuple(_dim(d, owner, i) for i, d in enumerate(tt.shape.dim))
        return ir.TensorType(_elem_dtype(tt.elem_type, owner), shape) if tt.elem_type else None
    if which == "sequence_type":
        return ir.SequenceType(_value_type(tp.sequence_type.elem_type, owner))
    if which == "optional_type":
        return ir.OptionalType(_value_type(tp.optional_type.elem_type, owner))
    if which == "map_type":
        key = _elem_dtype(tp.map_type.key_type, owner)
        return ir.MapType(key, _value_type(tp.map_type.value_type, owner))
    return None


def _elem_dtype(elem_type: int, owner: str) -> np.dtype:
    try:
        return dtypes.from_onnx(elem_type)
    except ValueError as exc:
        raise ModelLoadError(f"the declared type of {owner!r}: {exc}") from None


def _dim(d: onnx.TensorShapeProto.Dimension, owner: str, axis: int) -> ir.Dim:
    # Paddle (and some converters) write a dynamic dim as dim_value -1; ONNX Runtime reads any
    # negative dim_value as unknown, so it is a free dim like an unnamed one, not a size.
    if d.HasField("dim_value") and d.dim_value >= 0:
        return int(d.dim_value)
    if d.dim_param:
        return ir.SymbolicDim(d.dim_param)
    return ir.SymbolicDim(f"{owner}_dim{axis}")  # an unnamed dim gets a fresh, stable name


def _topological_order(nodes: list[ir.Node], defined: set[str], graph: str) -> list[ir.Node]:
    """The nodes in an order where each reads only values defined before it. ONNX requires files
    to be sorted already; some are not, so sort them (stably) rather than fail."""
    available = set(defined)
    ordered: list[ir.Node] = []
    pending = list(nodes)
    while pending:
        waiting = []
        for node in pending:
            needed = {i for i in node.inputs if i}
            for sub in ir.subgraphs(node):
                needed |= sub.outer_names
            if needed <= available:
                ordered.append(node)
                available.update(o for o in node.outputs if o)
            else:
                waiting.append(node)
        if len(waiting) == len(pending):
            node = waiting[0]
            missing = sorted({i for i in node.inputs if i} - available)
            raise ModelLoadError(
                f"graph {graph!r}: node {node.label!r} ({node.op_type}) reads {missing}, which no "
                "input, initializer or node defines (or the graph has a cycle)"
            )
        pending = waiting
    return ordered
