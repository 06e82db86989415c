"""Text to speech with Kokoro-82M's ONNX export, run by Transmuter, written as WAV files.

    python examples/kokoro_tts.py                     # the test stand-in (offline), speeds 1, 1.1, 0.8
    python examples/kokoro_tts.py --model hf://onnx-community/Kokoro-82M-v1.0-ONNX/onnx/model.onnx \\
        --voice af_heart.bin --tokens "50 156 86 54 16 102 81 43" --out speech.wav

The phonemes are given as token ids of Kokoro's vocabulary (its config.json maps each phoneme
character to an id; the example adds the 0 that Kokoro puts at both ends). `--voice` is one of the
repo's voices/*.bin files (float32 [510, 1, 256]); the row for the number of tokens is the style
vector. Without --model, the stand-in tests/fixtures/tts_standin.onnx (same interface, random
weights; see tests/fixtures/make_tts_standin.py) runs with a seeded random style vector, so the
sound is noise-like: the point there is the pipeline.

Before loading, the ONNX graph gets two edits:
1. atan2's quadrant: torch.onnx writes torch.atan2(y, x) as atan(y / x) corrected by
   Where(x < 0, Where(y > 0, +pi, -pi)). For y == 0 and x < 0 (the DC bin of the STFT in Kokoro's
   iSTFTNet, whose imaginary part is exactly 0) that gives -pi where torch gives +pi, and Kokoro
   feeds the phase to a Conv, so the audio changes. The Greater of that pattern becomes
   GreaterOrEqual. The node is found by its structure, not its name, so that other Greater nodes
   (a LeakyReLU written as Where(x > 0, ...), say) are left alone.
2. durations padded to 200 ms: the predicted durations (Round -> Clip -> Cast to int64) get
   extra frames on the last token (Kokoro's end marker, so the padding is trailing silence) until
   their sum is a multiple of 200 ms. The expansion after them has a data-dependent length, so
   Transmuter breaks the graph there and compiles the vocoder for the number of frames: padding
   puts nearby lengths in one bucket, which reuses the compiled vocoder instead of compiling a
   new one per utterance length.
"""

from __future__ import annotations

import argparse
import time
import wave
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import transmuter

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "tests" / "fixtures" / "tts_standin.onnx"
SAMPLE_RATE = 24000
FRAME_SAMPLES = 600  # Kokoro: a duration frame is 600 samples (25 ms at 24 kHz)
BUCKET_SECONDS = 0.2
STYLE_SIZE = 256
# Arbitrary ids of Kokoro's vocabulary (a phrase's worth of phonemes) for the default run.
DEFAULT_TOKENS = [50, 156, 86, 54, 16, 102, 81, 43, 61, 88, 57, 135]
DURATIONS_OUTPUT = "predicted_durations"
INT64_MAX = np.iinfo(np.int64).max


class GraphEditError(Exception):
    """The ONNX graph does not contain the pattern an edit needs."""


def model_file(source: str) -> Path:
    """A local path for `source`: a file path, or an hf://org/repo[@revision]/path URI fetched
    (with its external data) into the Hugging Face cache as transmuter.load would."""
    from transmuter.frontend import hub

    file = hub.hub_file(source)
    return Path(source) if file is None else hub.fetch(file)


# ------------------------------------------------------------------------------------------------
# Graph edits
# ------------------------------------------------------------------------------------------------


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
    step = const(p + "step", frames_per_step)
    nodes = [
        helper.make_node(
            "ReduceSum", [raw, const(p + "last_axis", [-1])], [p + "total"], keepdims=1
        ),
        helper.make_node(
            "Add", [p + "total", const(p + "step_less_1", frames_per_step - 1)], [p + "up"]
        ),
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


def prepare(source: str) -> tuple[onnx.ModelProto, list[str]]:
    """The model's ONNX graph with both edits; and the names of the atan2 nodes fixed."""
    proto = onnx.load(model_file(source))
    fixed = fix_atan2_quadrant(proto)
    pad_durations(proto, round(BUCKET_SECONDS * SAMPLE_RATE / FRAME_SAMPLES))
    return proto, fixed


# ------------------------------------------------------------------------------------------------
# Synthesis
# ------------------------------------------------------------------------------------------------


def style_vector(voice: Path | None, tokens: list[int]) -> np.ndarray:
    """Kokoro's style for an utterance: the voice pack's row for its number of tokens; without a
    voice, a seeded random vector (the stand-in has no trained voices)."""
    if voice is None:
        return np.random.default_rng(0).standard_normal((1, STYLE_SIZE)).astype(np.float32)
    pack = np.fromfile(voice, dtype=np.float32).reshape(-1, 1, STYLE_SIZE)
    return pack[min(len(tokens), len(pack) - 1)]


def inputs_for(tokens: list[int], style: np.ndarray, speed: float) -> dict[str, np.ndarray]:
    return {
        "input_ids": np.array([[0, *tokens, 0]], np.int64),
        "style": style,
        "speed": np.array([speed], np.float32),
    }


def write_wav(path: Path, waveform: np.ndarray) -> None:
    """16-bit mono PCM at Kokoro's 24 kHz."""
    pcm = (np.clip(waveform, -1.0, 1.0) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(SAMPLE_RATE)
        out.writeframes(pcm.tobytes())


class CompileCounter:
    """Counts segment compiles and cache hits through Transmuter's telemetry."""

    EVENTS = ("transmuter.segment.compile.stop", "transmuter.cache.hit")

    def __enter__(self) -> CompileCounter:
        self.compiled = self.hits = 0
        transmuter.telemetry.attach(id(self), self.EVENTS, self._count)
        return self

    def _count(self, event: str, measurements: dict, metadata: dict) -> None:
        if event == "transmuter.cache.hit":
            self.hits += 1
        elif metadata.get("compiled"):
            self.compiled += 1

    def __exit__(self, *exc) -> None:
        transmuter.telemetry.detach(id(self))


def output_path(out: Path, speed: float, several: bool) -> Path:
    return out.with_name(f"{out.stem}_{speed:g}x{out.suffix}") if several else out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(STANDIN), help="path or hf://org/repo/file.onnx")
    parser.add_argument("--voice", type=Path, help="a Kokoro voices/*.bin file")
    parser.add_argument("--tokens", help="phoneme token ids, space-separated")
    parser.add_argument("--speed", type=float, nargs="+", default=[1.0, 1.1, 0.8])
    parser.add_argument("--out", type=Path, default=Path("speech.wav"))
    args = parser.parse_args(argv)
    tokens = [int(t) for t in args.tokens.split()] if args.tokens else DEFAULT_TOKENS

    proto, fixed = prepare(args.model)
    print(f"atan2 quadrant fixed on {len(fixed)} node(s): {', '.join(fixed) or 'none found'}")
    print(f"durations padded to multiples of {BUCKET_SECONDS * 1000:.0f} ms")
    model = transmuter.load(proto)
    style = style_vector(args.voice, tokens)
    start = time.perf_counter()
    speak = transmuter.compile(model, inputs_for(tokens, style, args.speed[0]))
    print(f"compiled in {time.perf_counter() - start:.1f} s; segment plan {speak.segments}")

    for speed in args.speed:
        inputs = inputs_for(tokens, style, speed)
        with CompileCounter() as counter:
            start = time.perf_counter()
            out = speak(inputs)
            call_ms = (time.perf_counter() - start) * 1e3
        waveform = np.asarray(out["waveform"]).reshape(-1)
        predicted = int(np.asarray(out[DURATIONS_OUTPUT]).sum())
        path = output_path(args.out, speed, len(args.speed) > 1)
        write_wav(path, waveform)
        print(
            f"speed {speed:g}: {predicted} frames predicted ({predicted * FRAME_SAMPLES / SAMPLE_RATE:.3f} s)"
            f" -> {waveform.size / SAMPLE_RATE:.3f} s of audio in {call_ms:.0f} ms, "
            f"{counter.compiled} segment(s) compiled, {counter.hits} cache hit(s) -> {path}"
        )
    try:
        import onnxruntime as ort
    except ImportError:
        return
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    reference = session.run(["waveform"], inputs)[0].reshape(-1)
    print(
        f"max |transmuter - onnxruntime| on the last waveform: {np.abs(waveform - reference).max():.2e}"
    )


if __name__ == "__main__":
    main()
