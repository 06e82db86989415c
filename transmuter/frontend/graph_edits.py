"""Graph edits for text-to-speech exports that predict durations (Kokoro-82M's, and any graph
torch.onnx exported with torch.atan2 and `round(duration).clamp(min=1).long()`), made on the
ModelProto before loading, and `load_speech_model`, which loads the edited graph.

- `fix_atan2_quadrant`: torch.onnx writes torch.atan2(y, x) as atan(y / x) corrected by
  Where(x < 0, Where(y > 0, +pi, -pi)). For y == 0 and x < 0 (the DC bin of an STFT, whose
  imaginary part is exactly 0) that gives -pi where torch gives +pi; the Greater of that pattern
  becomes GreaterOrEqual. Found by structure, so other Greater nodes are left alone.
- `pad_durations`: the predicted durations' total rounded up (to a multiple of a step, or to the
  next total of a ladder), the extra frames on the last real token (the end marker, so the
  padding is trailing audio); the unpadded durations become the output `predicted_durations`.
  The expansion after the durations has a data-dependent length, where the graph breaks:
  padding makes nearby lengths share the compiled program after the break. What mixes frames
  after the durations is made to see only the real ones: LSTMs that read every step get the
  real frame count as sequence_lens, instance norms (Kokoro's AdaIN) take their statistics over
  the real steps, and 1-D convolutions read zeros on the padding, as past the real end.
- `take_token_count`: the number of real tokens becomes an input, `input_lengths`, so that the
  token ids can be padded at the end to a bucket. Kokoro's forward takes its lengths from
  input_ids' shape (`torch.full(..., shape[-1])`) and masks by them (`text_mask` for PL-BERT's
  attention and the encoders, pack_padded_sequence as LSTM sequence_lens); the edit feeds those
  the input, gives the duration LSTM (which reads every token) sequence_lens, and with
  `pad_durations(real_tokens=)` the padding tokens last 0 frames.
- `mask_padded_tokens`: the same input for a graph that takes its token count from the ids'
  shape and masks nothing (kokoro-onnx's kokoro-v1.0.int8.onnx): what mixes tokens before the
  durations is made to see the real ones only, or the edit refuses. The token axes come from
  `token_axes`, which exports that part of the graph with a symbolic token count.

Together, every real token and frame gets what the unpadded graph gives, up to float rounding,
except near the end, where the vocoder's convolutions reach into the padding frames (which the
caller cuts).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from transmuter.errors import ModelLoadError

DURATIONS_OUTPUT = "predicted_durations"


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


def _durations_cast(proto: onnx.ModelProto) -> tuple[int, onnx.NodeProto]:
    """The predicted durations and their index in the graph: the one Cast to int64 of a Clip (or
    Max) of a Round, how torch exports `torch.round(duration).clamp(min=1).long()`."""
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
    return found[0]


def pad_durations(
    proto: onnx.ModelProto, frames: int | Sequence[int], real_tokens: str | None = None
) -> str:
    """Round the predicted durations' total up, adding the frames to the last token; the
    unpadded durations become the extra output `predicted_durations`. Returns the name of the
    durations node that was padded. `frames`: an int rounds up to a multiple of it; a sequence
    of totals (ascending) rounds up to the first that holds the durations, and past the last
    to a multiple of the last.

    `real_tokens` (after `take_token_count`): the tokens from there on are padding; their
    durations become 0 and the frames go on the last real token. LSTMs after the durations that
    read every frame (Kokoro's F0/N branch) get the real frame count as sequence_lens, so that
    the padding frames do not reach the real ones through their backward direction."""
    if {o.domain: o.version for o in proto.opset_import}.get("", 0) < 15:
        raise GraphEditError(
            "pad_durations writes CastLike and ReduceSum's axes input: opset >= 15"
        )
    index, cast = _durations_cast(proto)
    padded = cast.output[0]
    raw = cast.output[0] = f"{padded}/unpadded"
    after = _downstream(proto.graph, padded)

    def const(name: str, value) -> str:
        proto.graph.initializer.append(numpy_helper.from_array(np.array(value, np.int64), name))
        return name

    p = "pad_durations/"
    node = helper.make_node
    ladder = [frames] if isinstance(frames, int) else list(frames)
    if not ladder or ladder != sorted(ladder) or ladder[0] < 1:
        raise ValueError(f"frames must be a positive int or ascending totals; got {frames!r}")
    step, one, last_axis = const(p + "step", ladder[-1]), const(p + "one", 1), [-1]
    nodes = [
        # positions 0 .. T-1 along the durations' last axis
        node("Shape", [raw], [p + "shape"]),
        node("Gather", [p + "shape", const(p + "last", -1)], [p + "count"]),
        node("Range", [const(p + "zero", 0), p + "count", one], [p + "positions"]),
    ]
    durations = raw
    if real_tokens is not None:
        durations = p + "real"
        nodes += [
            node("Less", [p + "positions", real_tokens], [p + "is_real"]),
            node("Cast", [p + "is_real"], [p + "real_mask"], to=TensorProto.INT64),
            node("Mul", [raw, p + "real_mask"], [durations]),
        ]
    count = real_tokens or p + "count"
    nodes += [
        node(
            "ReduceSum", [durations, const(p + "last_axis", last_axis)], [p + "total"], keepdims=1
        ),
        node("Add", [p + "total", step], [p + "total_and_step"]),
        node("Sub", [p + "total_and_step", one], [p + "up"]),
        node("Div", [p + "up", step], [p + "steps"]),  # integer division
        node("Mul", [p + "steps", step], [p + "multiple"]),
        # the first total of the ladder that holds the durations, else the multiple of the last
        node("GreaterOrEqual", [const(p + "ladder", ladder), p + "total"], [p + "holds"]),
        node("Where", [p + "holds", p + "ladder", p + "multiple"], [p + "candidates"]),
        node("ReduceMin", [p + "candidates"], [p + "padded_total"], keepdims=1),
        node("Sub", [p + "padded_total", p + "total"], [p + "extra"]),
        node("Sub", [count, one], [p + "last_index"]),
        node("Equal", [p + "positions", p + "last_index"], [p + "is_last"]),
        node("Cast", [p + "is_last"], [p + "last_mask"], to=TensorProto.INT64),
        node("Mul", [p + "extra", p + "last_mask"], [p + "extra_on_last"]),
        node("Add", [durations, p + "extra_on_last"], [padded]),
        node("Identity", [durations], [DURATIONS_OUTPUT]),
    ]
    frame_lstms = [n for n in after if _reads_every_step(n)]
    if frame_lstms:
        frames = p + "frames"
        nodes += [
            node("Reshape", [p + "total", const(p + "vector", [1])], [p + "frames_int64"]),
            node("Cast", [p + "frames_int64"], [frames], to=TensorProto.INT32),
        ]
        for lstm in frame_lstms:
            _set_sequence_lens(lstm, frames)
    for offset, new in enumerate(nodes):
        new.name = new.output[0]
        proto.graph.node.insert(index + 1 + offset, new)
    _only_real_steps(proto, after, p + "total", p + "padded_total")
    proto.graph.output.append(
        helper.make_tensor_value_info(DURATIONS_OUTPUT, TensorProto.INT64, None)
    )
    return cast.name or raw


class _RealSteps:
    """Builds, for a [N, C, L] value after the durations, the mask of its real time steps.

    Each stage of the decoder runs at a fixed rate of frames (x2, x10, x6 upsampling, a
    reflection pad's extra step), so a value of L steps over `padded` frames has
    rate = L // padded steps a frame, and its last (padded - real) * rate steps are padding."""

    CONSTANTS = {"zero": 0, "one": 1, "time_axis": 2, "time_axes": [2], "channel_axes": [-1]}

    def __init__(self, proto: onnx.ModelProto, real: str, padded: str):
        self.proto, self.q = proto, "real_steps/"
        for name, value in self.CONSTANTS.items():
            self.initializer(self.q + name, np.array(value, np.int64))
        self.initializer(self.q + "float_zero", np.array(0.0, np.float32))
        self.initializer(self.q + "scalar", np.array([], np.int64))
        node = helper.make_node
        self.head = [
            node("Reshape", [padded, self.q + "scalar"], [self.q + "padded"]),
            node("Reshape", [real, self.q + "scalar"], [self.q + "real"]),
            node("Sub", [self.q + "padded", self.q + "real"], [self.q + "padding"]),
        ]

    def initializer(self, name: str, value: np.ndarray) -> None:
        self.proto.graph.initializer.append(numpy_helper.from_array(value, name))

    def mask(self, x: str, r: str) -> list[onnx.NodeProto]:
        """Nodes computing r + "is_real" (bool, [L]), r + "count" (the real steps, in x's
        dtype) and r + "zero" (0 in x's dtype). Padding is set to 0 by Where, not by a
        multiplication: it may hold NaN (an atan2 of 0 / 0 on silent padding)."""
        node, q = helper.make_node, self.q
        return [
            node("Shape", [x], [r + "shape"]),
            node("Gather", [r + "shape", q + "time_axis"], [r + "length"]),
            node("Div", [r + "length", q + "padded"], [r + "rate"]),  # integer division
            node("Mul", [q + "padding", r + "rate"], [r + "padding"]),
            node("Sub", [r + "length", r + "padding"], [r + "real_length"]),
            node("Range", [q + "zero", r + "length", q + "one"], [r + "steps"]),
            node("Less", [r + "steps", r + "real_length"], [r + "is_real"]),
            node("CastLike", [r + "real_length", x], [r + "count"]),
            node("CastLike", [q + "float_zero", x], [r + "zero"]),
        ]

    def instance_norm(self, old: onnx.NodeProto) -> list[onnx.NodeProto]:
        """InstanceNormalization with its mean and variance over the real steps only."""
        node, q = helper.make_node, self.q
        x, scale, bias = old.input
        y = old.output[0]
        r = f"{y}/real_steps/"
        epsilon = next((a.f for a in old.attribute if a.name == "epsilon"), 1e-5)
        self.initializer(r + "epsilon", np.array(epsilon, np.float32))
        return self.mask(x, r) + [
            node("Where", [r + "is_real", x, r + "zero"], [r + "x_real"]),
            node("ReduceSum", [r + "x_real", q + "time_axes"], [r + "sum"], keepdims=1),
            node("Div", [r + "sum", r + "count"], [r + "mean"]),
            node("Sub", [x, r + "mean"], [r + "centered"]),
            node("Where", [r + "is_real", r + "centered", r + "zero"], [r + "centered_real"]),
            node("Mul", [r + "centered_real", r + "centered_real"], [r + "squares"]),
            node("ReduceSum", [r + "squares", q + "time_axes"], [r + "square_sum"], keepdims=1),
            node("Div", [r + "square_sum", r + "count"], [r + "variance"]),
            node("CastLike", [r + "epsilon", x], [r + "epsilon_x"]),
            node("Add", [r + "variance", r + "epsilon_x"], [r + "variance_eps"]),
            node("Sqrt", [r + "variance_eps"], [r + "deviation"]),
            node("Div", [r + "centered", r + "deviation"], [r + "normalized"]),
            node("Unsqueeze", [scale, q + "channel_axes"], [r + "scale"]),
            node("Unsqueeze", [bias, q + "channel_axes"], [r + "bias"]),
            node("Mul", [r + "normalized", r + "scale"], [r + "scaled"]),
            node("Add", [r + "scaled", r + "bias"], [y]),
        ]

    def zero_padding(self, x: str) -> tuple[list[onnx.NodeProto], str]:
        """Nodes setting x's padding steps to 0, and the name of the result."""
        r = f"{x}/real_steps/"
        return self.mask(x, r) + [
            helper.make_node("Where", [r + "is_real", x, r + "zero"], [r + "zeroed"]),
        ], r + "zeroed"


def _only_real_steps(
    proto: onnx.ModelProto, after: list[onnx.NodeProto], real: str, padded: str
) -> None:
    """Make the ops after the durations that mix time steps see only the real ones: instance
    norms take their statistics over the real steps (Kokoro's AdaIN layers), and 1-D
    convolutions (float, or ConvInteger through its DynamicQuantizeLinear) read zeros on the
    padding steps, as on their own zero padding past the real end. The padding steps then
    reach the real ones through nothing but those convolutions' edges, at the end."""
    g = _Graph(proto.graph)
    steps = _RealSteps(proto, real, padded)
    norms = {id(n) for n in after if n.op_type == "InstanceNormalization"}
    zeroed: set[str] = set()  # conv inputs to read zeroed
    for n in after:
        weight = g.initializers.get(n.input[1]) if len(n.input) > 1 else None
        if n.op_type not in ("Conv", "ConvTranspose", "ConvInteger") or weight is None:
            continue
        if len(weight.dims) != 3:
            continue
        source = n.input[0]
        if n.op_type == "ConvInteger":
            quantize = g.node(source, "DynamicQuantizeLinear")
            if quantize is None:
                continue
            source = quantize.input[0]
        zeroed.add(source)
    rebuilt = list(steps.head)
    renamed: dict[str, str] = {}
    for old in proto.graph.node:
        if id(old) in norms:
            rebuilt += steps.instance_norm(old)
            continue
        old.input[:] = [renamed.get(i, i) for i in old.input]
        rebuilt.append(old)
        for out in old.output:
            if out in zeroed:
                nodes, renamed[out] = steps.zero_padding(out)
                rebuilt += nodes
    for new in rebuilt:
        new.name = new.name or new.output[0]
    del proto.graph.node[:]
    proto.graph.node.extend(rebuilt)


TOKEN_COUNT_INPUT = "input_lengths"
LSTMS = ("LSTM", "DynamicQuantizeLSTM")  # sequence_lens is input 4 of both


def _reads_every_step(node: onnx.NodeProto) -> bool:
    """An LSTM without sequence_lens: it reads padding as if it were input."""
    return node.op_type in LSTMS and (len(node.input) <= 4 or not node.input[4])


def _set_sequence_lens(lstm: onnx.NodeProto, lengths: str) -> None:
    while len(lstm.input) <= 4:
        lstm.input.append("")
    lstm.input[4] = lengths


def _reads(node: onnx.NodeProto) -> set[str]:
    """The values a node reads: its inputs and what its subgraphs (Loop, If, Scan bodies) read
    from outside them (torch.onnx's repeat_interleave Loop reads the durations that way)."""
    read = set(node.input)
    for attr in node.attribute:
        for body in [attr.g] if attr.HasField("g") else list(attr.graphs):
            inner = {i.name for i in body.input} | {t.name for t in body.initializer}
            for sub in body.node:
                read.update(_reads(sub) - inner)
                inner.update(sub.output)
    return read


def _downstream(graph: onnx.GraphProto, value: str) -> list[onnx.NodeProto]:
    """The nodes that read `value`, directly or through other nodes, in graph order."""
    reached, found = {value}, []
    for node in graph.node:
        if reached.intersection(_reads(node)):
            reached.update(node.output)
            found.append(node)
    return found


def _upstream(graph: onnx.GraphProto, value: str) -> list[onnx.NodeProto]:
    """The nodes whose outputs `value` is computed from."""
    needed, found = {value}, []
    for node in reversed(graph.node):
        if needed.intersection(node.output):
            needed.update(node.input)
            found.append(node)
    return found


def take_token_count(proto: onnx.ModelProto) -> str:
    """Make the number of real tokens the graph input `input_lengths` (int64 [1]): the token ids
    may then be padded at the end, and every real token's result is the unpadded graph's. Run
    `pad_durations` after it with `real_tokens=` the returned name, which zeroes the padding's
    durations. Returns the input's name.

    Kokoro's forward takes `input_lengths` from input_ids' shape and builds
    `text_mask = arange(max(input_lengths)) + 1 > input_lengths[:, None]` from it, which masks
    PL-BERT's attention and the encoders, and it packs the encoders' LSTMs by it. That value
    is found as the one tensor read both by a ReduceMax that sets a Range's length and by an
    Unsqueeze compared by a Greater; all its readers but the ReduceMax (the Range keeps the
    padded length) then read the input. LSTMs the durations are computed from that read every
    step (the duration LSTM) get it as sequence_lens."""
    g = _Graph(proto.graph)
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in proto.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)

    def reaches_range_limit(value: str) -> bool:
        for reader in readers.get(value, []):
            if reader.op_type == "Range" and reader.input[1] == value:
                return True
            if reader.op_type == "Cast" and reaches_range_limit(reader.output[0]):
                return True
        return False

    def compared_by_greater(value: str) -> bool:
        return any(
            reader.op_type == "Greater" and reader.input[1] == unsqueeze.output[0]
            for unsqueeze in readers.get(value, [])
            if unsqueeze.op_type == "Unsqueeze"
            for reader in readers.get(unsqueeze.output[0], [])
        )

    found = {
        node.input[0]: node
        for node in proto.graph.node
        if node.op_type == "ReduceMax"
        and reaches_range_limit(node.output[0])
        and compared_by_greater(node.input[0])
    }
    if len(found) != 1:
        raise GraphEditError(
            f"expected one token-length mask (input_lengths -> ReduceMax -> Range, "
            f"Unsqueeze -> Greater), found {len(found)}: this graph does not mask its tokens "
            "as Kokoro's export does"
        )
    ((lengths, reduce_max),) = found.items()
    for node in readers[lengths]:
        if node is not reduce_max:
            node.input[:] = [TOKEN_COUNT_INPUT if n == lengths else n for n in node.input]
    _, cast = _durations_cast(proto)
    round_ = g.node(g.producer[cast.input[0]].input[0], "Round")
    as_int32 = f"{TOKEN_COUNT_INPUT}/int32"
    for lstm in _upstream(proto.graph, round_.output[0]):
        if _reads_every_step(lstm):
            _set_sequence_lens(lstm, as_int32)
    proto.graph.node.insert(
        0, helper.make_node("Cast", [TOKEN_COUNT_INPUT], [as_int32], as_int32, to=TensorProto.INT32)
    )
    proto.graph.input.append(
        helper.make_tensor_value_info(TOKEN_COUNT_INPUT, TensorProto.INT64, [1])
    )
    return TOKEN_COUNT_INPUT


TOKENS = "tokens"  # the symbolic token count's name in `token_shapes`
# Ops whose result at a token is computed from that token's values alone, on whatever axis the
# tokens are (elementwise ops, casts, layout changes that keep the axis whole): padding cannot
# reach a real token through them. The ops that do mix tokens are checked in `_why_unmaskable`.
POSITION_WISE = frozenset(
    {
        *("Abs", "Add", "And", "Cast", "CastLike", "Ceil", "Clip", "DequantizeLinear", "Div"),
        *("Equal", "Erf", "Exp", "Expand", "FastGelu", "Floor", "Gelu", "Greater"),
        *("GreaterOrEqual", "Identity", "LeakyRelu", "Less", "LessOrEqual", "Log", "Max"),
        *("Min", "Mul", "Neg", "Not", "Or", "Pow", "Reciprocal", "Relu", "Reshape", "Round"),
        *("Shape", "Sigmoid", "Softplus", "Sqrt", "Squeeze", "Sub", "Tanh", "Transpose"),
        *("Unsqueeze", "Where"),
    }
)


def _before_durations(proto: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes not computed from the predicted durations: the token encoders, including those
    the durations do not read (Kokoro's text encoder, read with the alignment after them)."""
    _, cast = _durations_cast(proto)
    after = {out for n in _downstream(proto.graph, cast.output[0]) for out in n.output}
    return [n for n in proto.graph.node if not after.intersection(n.output)]


def token_shapes(proto: onnx.ModelProto, tokens: str) -> dict[str, tuple]:
    """The shape of each value computed before the durations, the token count written as
    `TOKENS`: that part of the graph exported (transmuter.export) with `tokens` [1, TOKENS] for
    a symbolic TOKENS. Tracing follows every reshape, which the ONNX shape inference does not
    (it loses the symbol through an attention's Reshapes, and knows no com.microsoft op). A dim
    derived from the count (TOKENS - 1, 2 * TOKENS) cannot be masked, and is refused."""
    import transmuter  # the public API sits above the front end: imported when called

    nodes = _before_durations(proto)
    read = set().union(*(_reads(n) for n in nodes))
    values = list(dict.fromkeys(out for n in nodes for out in n.output if out))
    part = helper.make_model(
        helper.make_graph(
            nodes,
            "before_durations",
            [i for i in proto.graph.input if i.name in read],
            [helper.make_empty_tensor_value_info(v) for v in values],
            [t for t in proto.graph.initializer if t.name in read],
        ),
        opset_imports=proto.opset_import,
        ir_version=proto.ir_version,
    )
    try:
        model = transmuter.load(part, optimize=False)
        exported = transmuter.export(model, {tokens: (1, TOKENS)})
    except transmuter.TransmuterError as error:
        raise GraphEditError(f"the token axes could not be traced: {error}") from error
    shapes = dict(zip(model.inputs, (aval.shape for aval in exported.in_avals)))
    shapes.update(zip(model.outputs, (aval.shape for aval in exported.out_avals)))
    named = {}
    for value, shape in shapes.items():
        dims = tuple(d if isinstance(d, int) else str(d) for d in shape)
        derived = [d for d in dims if isinstance(d, str) and d != TOKENS and TOKENS in d]
        if derived:
            raise GraphEditError(f"{value} has a dim {derived[0]} computed from the token count")
        named[value] = dims
    return named


def _axes(shapes: Mapping[str, tuple], value: str) -> tuple[int, ...]:
    """The axes of `value` that are the tokens' (none for a value `shapes` does not hold)."""
    return _token_axes(shapes.get(value, ()))


def _token_axes(shape: tuple) -> tuple[int, ...]:
    return tuple(i for i, d in enumerate(shape) if d == TOKENS)


def _attribute(node: onnx.NodeProto, name: str, default):
    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else helper.get_attribute_value(found)


def _why_unmaskable(
    node: onnx.NodeProto, shapes: Mapping[str, tuple], g: _Graph, masked: set[str]
) -> str | None:
    """Why padding would reach the real tokens through `node` after `mask_padded_tokens`, or
    None. `masked`: the values computed from the attention mask of ones by position-wise ops
    (a softmax over the tokens must read one, so that the padding keys weigh 0), and the
    probabilities of such a softmax (a product over the tokens must read those)."""
    op, x = node.op_type, node.input[0] if node.input else ""
    axes = [_axes(shapes, i) for i in node.input]
    rank = len(shapes.get(x, ()))

    def axis(name: str, default: int) -> int:
        return _attribute(node, name, default) % max(rank, 1)

    if op in POSITION_WISE or op == "DynamicQuantizeLinear" or not any(axes):
        return None
    if op in LSTMS:
        time_axis = 1 if _attribute(node, "layout", 0) else 0
        if axes[0] != (time_axis,) or any(axes[1:]):
            return f"an LSTM with the tokens on axes {axes[0]}, not its time axis {time_axis}"
        return None if _reads_every_step(node) else "an LSTM that already has sequence_lens"
    if op in ("Conv", "ConvInteger"):
        if any(a < 2 for a in axes[0]) or any(axes[1:]):
            return "a convolution over the tokens' axis as a batch or channel axis"
        quantize = g.node(x, "DynamicQuantizeLinear")
        if op == "ConvInteger" and (quantize is None or node.input[2:3] != quantize.output[2:3]):
            return (
                "a ConvInteger whose input is not a DynamicQuantizeLinear's (with its zero point)"
            )
        return None
    if op in ("Softmax", "LogSoftmax"):
        over_tokens = axis("axis", -1) in axes[0]
        return (
            "a softmax over the tokens without an attention mask"
            if over_tokens and x not in masked
            else None
        )
    if op in ("MatMul", "MatMulInteger"):
        b_rank = len(shapes.get(node.input[1], ()))
        over_tokens = rank - 1 in axes[0] or max(b_rank - 2, 0) in axes[1]
        return (
            "a product over the tokens not weighted by masked attention"
            if over_tokens and x not in masked
            else None
        )
    if op in ("LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization"):
        normalized = range(axis("axis", -1), rank)
        return "a normalization over the tokens" if set(normalized) & set(axes[0]) else None
    if op.startswith("Reduce"):
        listed = _attribute(node, "axes", None)
        if listed is None and len(node.input) > 1 and node.input[1]:
            listed = g.constant(node.input[1])
            if listed is None:
                return "a reduction over axes computed at run time"
        listed = range(rank) if listed is None or len(listed) == 0 else listed
        return "a reduction over the tokens" if {a % rank for a in listed} & set(axes[0]) else None
    if op in ("Concat", "Split", "Gather"):
        return f"a {op} along the tokens" if axis("axis", 0) in axes[0] else None
    return f"{op} is not known to keep tokens apart"


def mask_padded_tokens(proto: onnx.ModelProto, tokens: str, shapes: Mapping[str, tuple]) -> str:
    """`take_token_count` for a graph that takes its token count from the ids' shape and masks
    nothing: kokoro-onnx's kokoro-v1.0.int8.onnx, whose BERT's attention mask is a
    ConstantOfShape of ones and whose LSTMs have no sequence_lens. The count becomes the input
    `input_lengths` (int64 [1]), and before the durations:
    - an attention mask of ones over the tokens (a ConstantOfShape of 1) is 1 on the real tokens
      and 0 on the padding;
    - LSTMs over the tokens get the count as sequence_lens;
    - the inputs of DynamicQuantizeLinear and of convolutions over the tokens are 0 on the
      padding: a quantization range is then the real tokens' (it always holds 0), and a
      convolution reads zeros past the real end, as on its own padding.
    Every other op that reads the tokens' axis must keep tokens apart (`_why_unmaskable`);
    where one does not, GraphEditError names it and nothing is changed. `shapes`: from
    `token_shapes`. Run `pad_durations` after it with `real_tokens=` the returned name."""
    g = _Graph(proto.graph)
    ones, zeroed, lstms, masked = {}, {}, set(), set()
    for node in _before_durations(proto):
        if node.op_type == "ConstantOfShape" and _axes(shapes, node.output[0]):
            value = _attribute(node, "value", None)
            if value is not None and (numpy_helper.to_array(value) == 1).all():
                ones[node.output[0]] = numpy_helper.to_array(value).reshape(())
                masked.add(node.output[0])
            continue
        why = _why_unmaskable(node, shapes, g, masked)
        if why is not None:
            raise GraphEditError(
                f"{node.name or node.op_type}: {why}; padding would reach the real tokens"
            )
        x = node.input[0] if node.input else ""
        if node.op_type in LSTMS:
            lstms.add(tuple(node.output))
        elif node.op_type in ("Conv", "DynamicQuantizeLinear") and _axes(shapes, x):
            zeroed[x] = _axes(shapes, x)
        # the mask reaches a softmax through position-wise ops; its probabilities reach a
        # product over the tokens through casts and quantizers
        if node.op_type in POSITION_WISE | {"Softmax", "LogSoftmax", "DynamicQuantizeLinear"}:
            if masked.intersection(node.input):
                masked.update(node.output)
    if not (ones or zeroed or lstms):
        raise GraphEditError("nothing before the durations reads the tokens")

    node, p = helper.make_node, "mask_tokens/"
    token_axis = _axes(shapes, tokens)
    if len(token_axis) != 1:
        raise GraphEditError(f"{tokens} has the tokens on {len(token_axis)} axes, not one")

    def const(name: str, value) -> str:
        proto.graph.initializer.append(numpy_helper.from_array(np.asarray(value), p + name))
        return p + name

    head = [
        node("Shape", [tokens], [p + "shape"]),
        node("Gather", [p + "shape", const("token_axis", np.int64(token_axis[0]))], [p + "count"]),
        node(
            "Range",
            [const("zero", np.int64(0)), p + "count", const("one", np.int64(1))],
            [p + "positions"],
        ),
        node("Less", [p + "positions", TOKEN_COUNT_INPUT], [p + "real"]),
        node("Cast", [TOKEN_COUNT_INPUT], [p + "count_int32"], to=TensorProto.INT32),
    ]

    masks: dict[tuple, str] = {}

    def real_mask(shape: tuple) -> str:
        """A bool mask of `shape`'s rank, True where each of its token axes is a real token
        (an attention's scores have two)."""
        key = (len(shape), _token_axes(shape))
        if key not in masks:
            mask = None
            for a in key[1]:
                others = [i for i in range(len(shape)) if i != a]
                axis_mask = f"{p}real/{len(shape)}/{a}"
                axes = const(f"others/{len(shape)}/{a}", np.array(others, np.int64))
                head.append(node("Unsqueeze", [p + "real", axes], [axis_mask]))
                if mask is not None:
                    head.append(node("And", [mask, axis_mask], [axis_mask + "/and"]))
                    axis_mask += "/and"
                mask = axis_mask
            masks[key] = mask
        return masks[key]

    float_zero = const("float_zero", np.float32(0))
    rebuilt, renamed = [], {}
    for old in proto.graph.node:
        old.input[:] = [renamed.get(i, i) for i in old.input]
        out = old.output[0] if old.output else ""
        if out in ones:  # the mask of ones becomes the real tokens' mask
            one = const(f"one/{out}", ones[out])
            mask = real_mask(shapes[out])
            rebuilt += [
                node("CastLike", [mask, one], [f"{out}/real"]),
                node("Expand", [f"{out}/real", old.input[0]], [out]),
            ]
            continue
        if tuple(old.output) in lstms:
            _set_sequence_lens(old, p + "count_int32")
        rebuilt.append(old)
        for value in old.output:
            if value in zeroed:
                zero = f"{value}/padding_zeroed"
                rebuilt += [
                    node("CastLike", [float_zero, value], [f"{value}/zero"]),
                    node("Where", [real_mask(shapes[value]), value, f"{value}/zero"], [zero]),
                ]
                renamed[value] = zero
    for new in head + rebuilt:
        new.name = new.name or new.output[0]
    del proto.graph.node[:]
    proto.graph.node.extend(head + rebuilt)
    proto.graph.input.append(
        helper.make_tensor_value_info(TOKEN_COUNT_INPUT, TensorProto.INT64, [1])
    )
    return TOKEN_COUNT_INPUT


def load_speech_model(
    path: str | os.PathLike,
    *,
    fix_atan2: bool,
    frames: int | Sequence[int],
    token_inputs: Sequence[str],
):
    """The ONNX file at `path` (external data read in) with the token count as an input:
    `take_token_count` where the graph masks its tokens as Kokoro's does, else
    `mask_padded_tokens` on the first of `token_inputs` the graph has (with a warning where
    neither can: its token count then cannot be padded); `pad_durations` to `frames` and, when
    `fix_atan2`, `fix_atan2_quadrant`; loaded by `transmuter.load`. Whether the token count was
    taken shows in the model's inputs (`TOKEN_COUNT_INPUT`)."""
    import transmuter  # the public API sits above the front end: imported when called

    proto = onnx.load(os.fspath(path))
    if fix_atan2:
        fix_atan2_quadrant(proto)
    try:
        real_tokens = take_token_count(proto)
    except GraphEditError as no_mask:
        real_tokens = _mask_padded_tokens_or_warn(proto, token_inputs, no_mask, path)
    pad_durations(proto, frames, real_tokens)
    model = transmuter.load(proto)
    model.source = f"{path} (edited)"  # what its compile notices and errors name
    return model


def _mask_padded_tokens_or_warn(
    proto: onnx.ModelProto, token_inputs: Sequence[str], no_mask: GraphEditError, path
) -> str | None:
    names = [i.name for i in proto.graph.input]
    tokens = next((n for n in token_inputs if n in names), None)
    try:
        if tokens is None:
            raise GraphEditError(f"no token input {list(token_inputs)} among {names}")
        return mask_padded_tokens(proto, tokens, token_shapes(proto, tokens))
    except GraphEditError as error:
        warnings.warn(
            f"{path}: {no_mask}; nor can its tokens be masked: {error}; each token count "
            "compiles its own programs",
            stacklevel=3,
        )
        return None
