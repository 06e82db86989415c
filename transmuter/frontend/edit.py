"""ONNX files prepared for a reference run: what `transmuter check` and the coverage tools hand
to ONNX Runtime so that its results can be compared with Transmuter's value by value."""

from __future__ import annotations

import os
from dataclasses import dataclass

import onnx

from transmuter.errors import ModelLoadError
from transmuter.frontend.loader import read_proto

# Protobuf refuses to serialize a message of 2 GB or more.
PROTOBUF_LIMIT = 2**31


@dataclass(frozen=True)
class ReferenceModel:
    """A model ready for ONNX Runtime: its bytes and, when the bytes still name external data
    files (models too large to hold in one protobuf), the folder those files lie in."""

    data: bytes
    data_dir: str | None = None


def reference_model(source, *, expose_intermediates: bool = False) -> ReferenceModel:
    """The model with the changes `reference_edits` lists made, and, when asked, every node
    output of the main graph listed as a graph output so that intermediates can be compared.

    External data is read into the bytes when the whole fits in a protobuf, so that files
    reached through links (the Hugging Face cache's blobs/, which ONNX Runtime refuses to follow)
    work; larger models keep naming their files, which ONNX Runtime reads from `data_dir`."""
    proto, base_dir = read_proto(source)
    proto = _copy(proto)  # never edit the caller's ModelProto
    for node in _quantizing_nodes(proto.graph):
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
    data_dir = None
    if base_dir is not None and (files := _external_files(proto.graph)):
        data_bytes = sum(os.path.getsize(base_dir / f) for f in files if (base_dir / f).is_file())
        if proto.ByteSize() + data_bytes < PROTOBUF_LIMIT:
            onnx.external_data_helper.load_external_data_for_model(proto, os.fspath(base_dir))
        else:
            data_dir = os.fspath(base_dir)
    if proto.ByteSize() >= PROTOBUF_LIMIT:
        raise ModelLoadError(
            f"{source}: its graph is over 2 GB without its weights, too large to hand to the "
            "reference in memory"
        )
    return ReferenceModel(proto.SerializeToString(), data_dir)


def reference_edits(source) -> list[str]:
    """What `reference_model` changes so that ONNX Runtime computes what the graph means, one
    line per kind of change (empty when it changes nothing): records of a reference list them.

    com.microsoft MatMulNBits with a nonzero accuracy_level lets ORT's CPU kernel quantize the
    activations to int8 before multiplying; the node's definition (dequantize B, then MatMul)
    does not, and Transmuter never does. ORT has no session option that overrides the level of
    nodes already in a file (session.qdq_matmulnbits_accuracy_level applies only when its
    optimizer fuses DequantizeLinear + MatMul, and a reference runs without optimizations), so
    the reference runs on a copy with every accuracy_level set to 0."""
    proto, _ = read_proto(source)
    pinned = sum(1 for _ in _quantizing_nodes(proto.graph))
    return [f"MatMulNBits accuracy_level -> 0 on {pinned} nodes"] if pinned else []


def _quantizing_nodes(graph: onnx.GraphProto):
    """MatMulNBits nodes whose accuracy_level (default 0) lets ORT quantize activations."""
    for node in _all_nodes(graph):
        if node.domain == "com.microsoft" and node.op_type == "MatMulNBits":
            level = next((a.i for a in node.attribute if a.name == "accuracy_level"), 0)
            if level != 0:
                yield node


def _external_files(graph: onnx.GraphProto) -> set[str]:
    """The external data files named by the initializers of `graph` and its subgraphs."""
    graphs = [graph, *(sub for node in _all_nodes(graph) for sub in _subgraphs(node))]
    return {
        entry.value
        for g in graphs
        for tensor in g.initializer
        if tensor.data_location == onnx.TensorProto.EXTERNAL
        for entry in tensor.external_data
        if entry.key == "location"
    }


def _all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for sub in _subgraphs(node):
            yield from _all_nodes(sub)


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    return [g for attr in node.attribute for g in ([attr.g] if attr.HasField("g") else attr.graphs)]


def _copy(proto: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    return copy
