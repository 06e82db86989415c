"""The first node where Transmuter and ONNX Runtime disagree on a model.

    python coverage/find_divergence.py MODEL.onnx INPUTS.npz [--rtol 1e-4 --atol 1e-5]

INPUTS.npz holds the model's inputs by name, or under a prefix given with --prefix (the fixture
files use `case0/in/`). ONNX Runtime (optimizations off) exposes every intermediate as an output; Transmuter runs
eagerly and keeps every value. Nodes are compared in graph order and the first whose output
differs beyond tolerance is printed with its inputs' agreement, so the cause is that node.
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
import onnxruntime as ort

import transmuter
from transmuter.runtime.execute import intermediates


def reference_values(proto: onnx.ModelProto, inputs: dict) -> dict[str, np.ndarray]:
    exposed = onnx.ModelProto()
    exposed.CopyFrom(proto)
    known = {o.name for o in exposed.graph.output}
    for node in exposed.graph.node:
        for name in node.output:
            if name and name not in known:
                exposed.graph.output.append(onnx.ValueInfoProto(name=name))
                known.add(name)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        exposed.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs)))


def first_divergence(proto, inputs, rtol, atol):
    ours = intermediates(transmuter.load(proto), inputs)
    theirs = reference_values(proto, inputs)
    for node in proto.graph.node:
        for name in node.output:
            if not name or name not in theirs:
                continue
            a, b = np.asarray(ours[name]), np.asarray(theirs[name])
            if a.shape != b.shape or a.dtype != b.dtype:
                return (
                    node,
                    name,
                    f"shape/dtype {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}",
                )
            if a.dtype.kind in "fc" and not np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
                return node, name, f"max abs diff {np.nanmax(np.abs(a - b)):.3e}"
            if a.dtype.kind not in "fc" and not np.array_equal(a, b):
                return node, name, f"{int(np.sum(a != b))} elements differ"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("inputs")
    parser.add_argument("--rtol", type=float, default=1e-4)
    parser.add_argument("--atol", type=float, default=1e-5)
    parser.add_argument("--prefix", default="", help="key prefix of the inputs in the .npz")
    args = parser.parse_args()
    proto = onnx.load(args.model)
    stored = np.load(args.inputs)
    wanted = {i.name for i in proto.graph.input}
    inputs = {
        k[len(args.prefix) :]: stored[k]
        for k in stored
        if k.startswith(args.prefix) and k[len(args.prefix) :] in wanted
    }
    found = first_divergence(proto, inputs, args.rtol, args.atol)
    if found is None:
        print("no divergence: every intermediate agrees within tolerance")
        return
    node, name, detail = found
    print(f"first divergence: node {node.name!r} ({node.op_type}) output {name!r}: {detail}")
    print(f"  inputs: {list(node.input)}")
    print(f"  attributes: {[(a.name, onnx.helper.get_attribute_value(a)) for a in node.attribute]}")


if __name__ == "__main__":
    main()
