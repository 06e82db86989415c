"""ONNX files prepared for a reference run: what `transmuter check` and the coverage tools hand
to ONNX Runtime so that its results can be compared with Transmuter's value by value."""

from __future__ import annotations

import os

import onnx

from transmuter.errors import ModelLoadError
from transmuter.frontend.loader import _read_proto


def reference_model(source, *, expose_intermediates: bool = False) -> bytes:
    """The model as bytes, external data included, with two changes for a fair comparison:
    MatMulNBits nodes at accuracy_level 0 (Transmuter never quantizes activations, so ONNX
    Runtime must not either), and, when asked, every node output of the main graph listed as a
    graph output so that intermediates can be compared."""
    proto, base_dir = _read_proto(source)
    proto = _copy(proto)  # never edit the caller's ModelProto
    if base_dir is not None and any(_external(t) for t in proto.graph.initializer):
        onnx.external_data_helper.load_external_data_for_model(proto, os.fspath(base_dir))
    for node in _all_nodes(proto.graph):
        if node.domain == "com.microsoft" and node.op_type == "MatMulNBits":
            kept = [a for a in node.attribute if a.name != "accuracy_level"]
            del node.attribute[:]
            node.attribute.extend(kept)
            node.attribute.append(onnx.helper.make_attribute("accuracy_level", 0))
    if expose_intermediates:
        known = {o.name for o in proto.graph.output} | {i.name for i in proto.graph.input}
        for node in proto.graph.node:
            for name in node.output:
                if name and name not in known:
                    proto.graph.output.append(onnx.ValueInfoProto(name=name))
                    known.add(name)
    if proto.ByteSize() >= 2**31:
        raise ModelLoadError(
            f"{source}: over 2 GB with its weights, too large to hand to the reference in memory"
        )
    return proto.SerializeToString()


def _external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def _all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield from _all_nodes(sub)


def _copy(proto: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    return copy
