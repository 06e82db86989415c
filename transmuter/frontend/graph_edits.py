"""Graph edits for text-to-speech exports that predict durations (Kokoro-82M's, and any graph
torch.onnx exported with torch.atan2 and `round(duration).clamp(min=1).long()`), made on the
ModelProto before loading, and `load_speech_model`, which loads the edited graph.

- `fix_atan2_quadrant`: torch.onnx writes torch.atan2(y, x) as atan(y / x) corrected by
  Where(x < 0, Where(y > 0, +pi, -pi)). For y == 0 and x < 0 (the DC bin of an STFT, whose
  imaginary part is exactly 0) that gives -pi where torch gives +pi; the Greater of that pattern
  becomes GreaterOrEqual. Found by structure, so other Greater nodes are left alone.
- `pad_durations`: the predicted durations' total rounded up to a multiple of a step, the extra
  frames on the last token (the end marker, so the padding is trailing audio); the unpadded
  durations become the output `predicted_durations`. The expansion after the durations has a
  data-dependent length, where the graph breaks: padding makes nearby lengths share the
  compiled program after the break.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from transmuter.errors import ModelLoadError

DURATIONS_OUTPUT = "predicted_durations"
INT64_MAX = np.iinfo(np.int64).max


class GraphEditError(ModelLoadError):
    """The ONNX graph does not contain the pattern an edit needs."""


class _Graph:
    """Who produces and who reads each value of a graph, and the constants' values."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        self.producer = {out: node for node in graph.node for out in node.output}
        self.readers: dict[str, int] = {}
        for node in graph.node:
            for name in node.input:
                self.readers[name] = self.readers.get(name, 0) + 1
        self.initializers = {t.name: t for t in graph.initializer}

    def node(self, name: str, op_type: str) -> onnx.NodeProto | None:
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None

    def constant(self, name: str) -> np.ndarray | None:
        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name])
        node = self.node(name, "Constant")
        if node is None:
            return None
        for attr in node.attribute:
            if attr.name == "value":
                return numpy_helper.to_array(attr.t)
            if attr.name in ("value_float", "value_int"):
                return np.array(helper.get_attribute_value(attr))
        return None

    def is_scalar(self, name: str, value: float) -> bool:
        found = self.constant(name)
        return found is not None and found.size == 1 and np.isclose(float(found.ravel()[0]), value)


def fix_atan2_quadrant(proto: onnx.ModelProto) -> list[str]:
    """Make each exported torch.atan2 return +pi at y == 0, x < 0, as torch does; returns the names
    of the Greater nodes changed to GreaterOrEqual.

    The pattern (torch.onnx's atan2): a = Atan(Div(y, x));
    out = Where(Less(x, 0), Where(Greater(y, 0), Add(a, pi), Sub(a, pi)), a).
    Only a Greater read by nothing but its Where is changed, so no other computation moves."""
    g = _Graph(proto.graph)
    changed = []
    for outer in proto.graph.node:
        if outer.op_type != "Where" or len(outer.input) != 3:
            continue
        less = g.node(outer.input[0], "Less")
        inner = g.node(outer.input[1], "Where")
        atan = g.node(outer.input[2], "Atan")
        div = atan and g.node(atan.input[0], "Div")
        if not (less and inner and div):
            continue
        y, x = div.input
        if less.input[0] != x or not g.is_scalar(less.input[1], 0.0):
            continue
        greater = g.node(inner.input[0], "Greater")
        plus, minus = g.node(inner.input[1], "Add"), g.node(inner.input[2], "Sub")
        a = atan.output[0]
        if not (greater and plus and minus) or greater.input[0] != y:
            continue
        pi_term = [n for n in plus.input if n != a]  # Add(a, pi) or Add(pi, a)
        if not (
            g.is_scalar(greater.input[1], 0.0)
            and len(pi_term) == 1
            and g.is_scalar(pi_term[0], np.pi)
            and minus.input[0] == a
            and g.is_scalar(minus.input[1], np.pi)
            and g.readers.get(greater.output[0]) == 1
        ):
            continue
        greater.op_type = "GreaterOrEqual"
        changed.append(greater.name or greater.output[0])
    return changed


def pad_durations(proto: onnx.ModelProto, frames_per_step: int) -> str:
    """Round the predicted durations' total up to a multiple of `frames_per_step`, adding the
    frames to the last token; the unpadded durations become the extra output
    `predicted_durations`. Returns the name of the durations node that was padded.


    The durations are the one Cast to int64 of a Clip (or Max) of a Round: how torch exports
    `torch.round(duration).clamp(min=1).long()`."""
    if {o.domain: o.version for o in proto.opset_import}.get("", 0) < 13:
        raise GraphEditError("pad_durations writes ReduceSum with axes as an input: opset >= 13")
    g = _Graph(proto.graph)
    found = []
    for index, node in enumerate(proto.graph.node):
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        if node.op_type != "Cast" or to != TensorProto.INT64:
            continue
        clamp = g.node(node.input[0], "Clip") or g.node(node.input[0], "Max")
        if clamp is not None and g.node(clamp.input[0], "Round") is not None:
            found.append((index, node))
    if len(found) != 1:
        raise GraphEditError(
            f"expected one duration node (Round -> Clip -> Cast to int64), found {len(found)}: "
            "this graph does not predict durations as Kokoro's export does"
        )
    index, cast = found[0]
    padded = cast.output[0]
    raw = cast.output[0] = f"{padded}/unpadded"

    def const(name: str, value) -> str:
        proto.graph.initializer.append(numpy_helper.from_array(np.array(value, np.int64), name))
        return name

    p = "pad_durations/"
    total = helper.make_node(
        "ReduceSum", [raw, const(p + "last_axis", [-1])], [p + "total"], keepdims=1
    )
    step = const(p + "step", frames_per_step)
    nodes = [
        total,
        helper.make_node("Add", [p + "total", step], [p + "total_and_step"]),
        helper.make_node("Sub", [p + "total_and_step", const(p + "one", 1)], [p + "up"]),
        helper.make_node("Div", [p + "up", step], [p + "steps"]),  # integer division
        helper.make_node("Mul", [p + "steps", step], [p + "padded_total"]),
        helper.make_node("Sub", [p + "padded_total", p + "total"], [p + "extra"]),
        helper.make_node(
            "Slice",
            [raw, const(p + "zero", [0]), const(p + "minus_1", [-1]), p + "last_axis"],
            [p + "head"],
        ),
        helper.make_node(
            "Slice",
            [raw, p + "minus_1", const(p + "end", [INT64_MAX]), p + "last_axis"],
            [p + "last"],
        ),
        helper.make_node("Add", [p + "last", p + "extra"], [p + "last_padded"]),
        helper.make_node("Concat", [p + "head", p + "last_padded"], [padded], axis=-1),
        helper.make_node("Identity", [raw], [DURATIONS_OUTPUT]),
    ]
    for offset, node in enumerate(nodes):
        node.name = node.output[0]
        proto.graph.node.insert(index + 1 + offset, node)
    proto.graph.output.append(
        helper.make_tensor_value_info(DURATIONS_OUTPUT, TensorProto.INT64, None)
    )
    return cast.name or raw


def load_speech_model(
    path: str | os.PathLike,
    *,
    fix_atan2: bool,
    frames_per_step: int,
):
    """The ONNX file at `path` (external data read in) with `pad_durations` and, when
    `fix_atan2`, `fix_atan2_quadrant`, loaded by `transmuter.load`."""
    import transmuter  # the public API sits above the front end: imported when called

    proto = onnx.load(os.fspath(path))
    if fix_atan2:
        fix_atan2_quadrant(proto)
    pad_durations(proto, frames_per_step)
    return transmuter.load(proto)
