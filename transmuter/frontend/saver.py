"""IR weights -> ONNX protobuf: write a loaded model back with new initializer values.

The graph is not rebuilt from the IR: the model is read again from what it was loaded from (a
file, bytes or a ModelProto), the given arrays replace the main graph's initializers of the same
names, and everything else (nodes, functions, metadata, unchanged initializers) is written as it
was.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from transmuter import dtypes
from transmuter.errors import InputError, ModelLoadError, TransmuterError
from transmuter.frontend.loader import read_proto

# Protobuf cannot serialize a message over 2 GiB; past this many bytes of initializers the
# weights go to a separate file, leaving room for the graph itself.
INLINE_LIMIT = 1_800_000_000


class Origin:
    """What a model was loaded from, kept so that `save_model` can read it again.

    A file is read again when saving; its size and modification time at load tell whether it
    changed since. Bytes and a ModelProto are kept by reference (so a ModelProto changed after
    loading is saved as changed).
    """

    def __init__(self, source):
        self.path: Path | None = None
        self.stamp: tuple[int, int] | None = None
        self.data: bytes | onnx.ModelProto | None = None
        if isinstance(source, (str, os.PathLike)):
            # As named, links kept: the loader finds external data relative to this folder.
            self.path = Path(os.path.abspath(source))
            self.stamp = _stamp(self.path)
        elif isinstance(source, (bytes, bytearray, memoryview)):
            self.data = bytes(source)
        else:
            self.data = source

    def read(self) -> tuple[onnx.ModelProto, Path | None]:
        """The source model as a ModelProto of our own (safe to change) and its folder."""
        if isinstance(self.data, onnx.ModelProto):
            proto = onnx.ModelProto()
            proto.CopyFrom(self.data)
            return proto, None
        if self.path is None:
            return read_proto(self.data)
        try:
            stamp = _stamp(self.path)
        except FileNotFoundError:
            stamp = None
        if stamp != self.stamp:
            raise ModelLoadError(
                f"{str(self.path)!r} changed or was removed since the model was loaded from it; "
                "saving writes the source file's graph with new weights, so load it again first"
            )
        return read_proto(self.path)


def save_model(
    origin: Origin,
    path: str | os.PathLike,
    arrays: Mapping[str, np.ndarray],
    *,
    external_data: bool | None = None,
) -> None:
    """Write the model `origin` names to `path`, `arrays` replacing initializers by name.

    Each array must have its initializer's dtype and shape. A sparse initializer that is
    replaced is written dense (training fills its zeros). external_data=None moves the weights
    to `<file name>_data` beside the model when they exceed INLINE_LIMIT bytes; True always
    does, False never does.
    """
    proto, base_dir = origin.read()
    _replace_initializers(proto.graph, arrays)
    _inline_external_data(proto, base_dir)
    size = sum(t.ByteSize() for t in proto.graph.initializer)
    size += sum(s.ByteSize() for s in proto.graph.sparse_initializer)
    if external_data is None:
        external_data = size > INLINE_LIMIT
    elif not external_data and size > INLINE_LIMIT:
        raise TransmuterError(
            f"the model's initializers take {size / 1e9:.2f} GB, too much for one protobuf "
            "file (2 GB at most): save with external_data=True (or None, the default)"
        )
    target = Path(os.path.abspath(path))
    _write(proto, target, external_data)
    if origin.path is not None and target.resolve() == origin.path.resolve():
        # The model's source is now the file just written: later saves read that one.
        origin.stamp = _stamp(target)


def _stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def _replace_initializers(graph: onnx.GraphProto, arrays: Mapping[str, np.ndarray]) -> None:
    dense = {t.name: t for t in graph.initializer}
    sparse = {s.values.name: s for s in graph.sparse_initializer}
    unknown = sorted(set(arrays) - set(dense) - set(sparse))
    if unknown:
        raise InputError(
            f"{len(unknown)} of the params to save are not initializers of the model's main "
            f"graph: {unknown[:5]}; load's graph passes stack and fold the weights of a model "
            "that is not trainable: load with trainable=True (which keeps the file's "
            "initializers as the params) to save"
        )
    for name, array in arrays.items():
        original = dense[name] if name in dense else sparse[name].values
        shape = tuple(int(d) for d in (original.dims if name in dense else sparse[name].dims))
        want = dtypes.from_onnx(original.data_type)
        if np.dtype(array.dtype) != want or tuple(array.shape) != shape:
            raise InputError(
                f"param {name!r} is {np.dtype(array.dtype).name}{list(array.shape)} but the "
                f"initializer it replaces is {want.name}{list(shape)}: cast or reshape it to "
                "match, or load a model with that initializer"
            )
        tensor = numpy_helper.from_array(np.asarray(array, order="C"), name)
        if original.HasField("doc_string"):
            tensor.doc_string = original.doc_string
        tensor.metadata_props.extend(original.metadata_props)
        if name in dense:
            dense[name].CopyFrom(tensor)
        else:
            graph.sparse_initializer.remove(sparse[name])
            graph.initializer.append(tensor)


def _inline_external_data(proto: onnx.ModelProto, base_dir: Path | None) -> None:
    """Read into the proto the tensors still kept in files beside the source model, so that the
    saved model does not depend on them. The loader checked these files when it loaded the model
    (only a model loaded from a path can have them); links are followed, as the loader follows
    them from caches that link a model and its data into one store, which onnx's own reader
    refuses."""
    for tensor in _all_tensors(proto):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = info.get("location", "")
        path = Path(os.path.normpath(base_dir / location)) if base_dir is not None else None
        if path is None or not path.is_relative_to(base_dir) or not path.is_file():
            raise ModelLoadError(
                f"tensor {tensor.name!r}: its external data {location!r} is not a file in the "
                f"source model's folder {str(base_dir)!r}; load the model from its path again"
            )
        with open(path, "rb") as f:
            f.seek(int(info.get("offset", 0)))
            # Without a length the data runs to the end of the file, as onnx reads it.
            tensor.raw_data = f.read(int(info["length"])) if "length" in info else f.read()
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]


def _all_tensors(proto: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of the model: initializers, sparse ones, and node attributes, in the main
    graph, its subgraphs and the model's functions."""
    yield from _graph_tensors(proto.graph)
    for function in proto.functions:
        yield from _node_tensors(function.node)


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    yield from _node_tensors(graph.node)


def _node_tensors(nodes) -> Iterator[onnx.TensorProto]:
    for node in nodes:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            sparse = [attr.sparse_tensor] if attr.HasField("sparse_tensor") else []
            for s in [*sparse, *attr.sparse_tensors]:
                yield from (s.values, s.indices)
            if attr.HasField("g"):
                yield from _graph_tensors(attr.g)
            for graph in attr.graphs:
                yield from _graph_tensors(graph)


def _write(proto: onnx.ModelProto, target: Path, external_data: bool) -> None:
    """Write into a fresh folder beside `target`, then move the files into place: onnx appends
    to an existing data file, and a model running from the old files keeps reading them (its
    memory maps hold the replaced files, not the new ones)."""
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".transmuter-save-") as folder:
        staged = Path(folder) / target.name
        if external_data:
            onnx.save_model(
                proto,
                staged,
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=target.name + "_data",
            )
        else:
            onnx.save_model(proto, staged)
        for written in sorted(Path(folder).iterdir()):
            os.replace(written, target.parent / written.name)
