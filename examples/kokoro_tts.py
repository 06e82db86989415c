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

Before loading, the ONNX graph gets two edits (transmuter/frontend/graph_edits.py):
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
from pathlib import Path

import numpy as np
import onnx

import transmuter
from transmuter.frontend.graph_edits import (  # noqa: F401  (GraphEditError: for callers)
    DURATIONS_OUTPUT,
    GraphEditError,
    fix_atan2_quadrant,
    pad_durations,
)
from transmuter.pipelines.audio.text_to_speech import write_wav

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "tests" / "fixtures" / "tts_standin.onnx"
SAMPLE_RATE = 24000
FRAME_SAMPLES = 600  # Kokoro: a duration frame is 600 samples (25 ms at 24 kHz)
BUCKET_SECONDS = 0.2
STYLE_SIZE = 256
# Arbitrary ids of Kokoro's vocabulary (a phrase's worth of phonemes) for the default run.
DEFAULT_TOKENS = [50, 156, 86, 54, 16, 102, 81, 43, 61, 88, 57, 135]


def model_file(source: str) -> Path:
    """A local path for `source`: a file path, or an hf://org/repo[@revision]/path URI fetched
    (with its external data) into the Hugging Face cache as transmuter.load would."""
    from transmuter.frontend import hub

    file = hub.hub_file(source)
    return Path(source) if file is None else hub.fetch(file)


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
        write_wav(path, waveform, SAMPLE_RATE)
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
