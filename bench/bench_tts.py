"""Time Transmuter against ONNX Runtime on an int8 Kokoro-82M-sized TTS model, on CPU.

    /tmp/kokoroenv/bin/python bench/make_kokoro.py      # once: writes bench/.cache/kokoro-int8.onnx
    .venv/bin/python bench/bench_tts.py [--rounds 5]

The model (random weights, the layout of kokoro-onnx's kokoro-v1.0.int8.onnx: MatMulInteger,
ConvInteger, DynamicQuantizeLSTM, a data-dependent token-to-frame expansion) is made by
bench/make_kokoro.py; without it this script says so and exits 0.

Workload: one utterance of 24 tokens (0, 22 seeded ids in 1..177, 0, as kokoro-onnx pads them),
a seeded style vector, speed 1; then 48 tokens, to show what a new length costs.

- first result: Transmuter `transmuter.load` + `transmuter.compile` + one call (with its split
  from telemetry: load, trace / lower / XLA per compiled segment, host breaks); ORT
  `InferenceSession` creation + one run.
- per call: medians over `--rounds` rounds, each round one call of Transmuter, ORT with 1
  intra-op thread and ORT with 2 (default graph optimizations), in turn, so that all three see
  the same machine state. One call is seconds long, so ORT's worker spinning after a run (which
  bench_models.py's blocks guard against) is negligible here.
- outputs, by the project's rule for int8 models: durations equal or within one frame (600
  samples); audio by log-mel distance, set against ORT's own distance when the style vector moves
  by 1e-6 relative. The model draws noise (RandomNormalLike, RandomUniformLike in its harmonic
  source), so even ORT against itself differs from run to run; that distance is printed too.
  (Zeroing the draws is no way out: with these random weights both engines' audio then reaches
  1e10.) ORT's STFT leaves rounding noise in the imaginary part of the DC and Nyquist bins where
  torch and Transmuter give exact zeros, so atan2's phase there is +-pi at random in ORT's run:
  the log-mel distance between the engines carries that too.

JAX runs on the CPU (JAX_PLATFORMS=cpu unless set otherwise); XLA sizes its thread pool to the
machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

PATH = Path(__file__).resolve().parent / ".cache" / "kokoro-int8.onnx"
SEED = 0
LENGTHS = (24, 48)
N_TOKEN = 178
SAMPLES_PER_FRAME = 600  # upsample 10 * 6, iSTFT hop 5: one duration frame is 25 ms at 24 kHz
SAMPLE_RATE = 24_000
STYLE_NUDGE = 1e-6  # relative change of the style vector that sets the int8 tolerance
SEGMENT_EVENTS = ["transmuter.segment.compile.stop", "transmuter.break.stop"]


def feeds_for(n_tokens: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    ids = rng.integers(1, N_TOKEN, n_tokens - 2)
    # Drawn after the ids, so each length has its own style, as Kokoro's voice files have a row
    # per utterance length.
    style = rng.standard_normal((1, 256)).astype(np.float32)
    return {
        "input_ids": np.array([[0, *ids, 0]], dtype=np.int64),
        "style": style,
        "speed": np.ones(1, dtype=np.float32),
    }


def nudged(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return dict(feeds, style=(feeds["style"] * (1 + STYLE_NUDGE)).astype(np.float32))


# --- engines -------------------------------------------------------------------------------


def ort_options(threads: int) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return options


def ort_session(threads: int) -> ort.InferenceSession:
    return ort.InferenceSession(str(PATH), ort_options(threads), providers=["CPUExecutionProvider"])


def ort_runner(session: ort.InferenceSession) -> Callable[[dict], dict[str, np.ndarray]]:
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(None, feeds)))


def to_numpy(outputs: dict) -> dict[str, np.ndarray]:
    # Timed until the outputs are numpy arrays, which is what ORT hands back.
    return {name: np.asarray(value) for name, value in outputs.items()}


def timed(run: Callable[[dict], dict], feeds: dict) -> tuple[float, dict[str, np.ndarray]]:
    began = time.perf_counter()
    outputs = to_numpy(run(feeds))
    return time.perf_counter() - began, outputs


@dataclass
class Split:
    """Where Transmuter's time to a first result went, from telemetry."""

    load_s: float = 0.0
    compile_s: float = 0.0  # transmuter.compile, which also runs the example inputs once
    call_s: float = 0.0
    segments: list[dict] = field(default_factory=list)
    breaks: list[tuple[str, float]] = field(default_factory=list)  # (op type, seconds)

    @property
    def total_s(self) -> float:
        return self.load_s + self.compile_s + self.call_s

    def summary(self) -> str:
        compiled = [s for s in self.segments if s["compiled"]]
        trace = sum(s["trace_s"] for s in self.segments)
        lower = sum(s["lower_s"] for s in self.segments)
        xla = sum(s["xla_s"] for s in self.segments)
        ops = sorted({op for op, _ in self.breaks})
        # A break's time includes waiting for the segment before it, which runs asynchronously.
        waited = sum(seconds for _, seconds in self.breaks)
        rest = self.total_s - self.load_s - trace - lower - xla - waited
        parts = [("load", self.load_s), ("compile", self.compile_s), ("call", self.call_s)]
        spent = " + ".join(f"{name} {s:.1f} s" for name, s in parts if s)
        return (
            f"{self.total_s:.1f} s = {spent}; within: trace {trace:.1f} s, lower {lower:.1f} s, "
            f"XLA {xla:.1f} s ({len(compiled)} of {len(self.segments)} segments compiled), "
            f"{len(self.breaks)} host breaks at {', '.join(ops) or '-'} {waited:.1f} s "
            f"(incl. waiting for the segment before), other running {rest:.1f} s"
        )


class Recorder:
    """Collects segment compiles and host breaks while attached."""

    def __init__(self):
        self.split = Split()

    def __call__(self, event: str, measurements: dict, metadata: dict) -> None:
        if event.startswith("transmuter.break"):
            self.split.breaks.append((metadata["op_type"], measurements["duration"] / 1e9))
        else:
            self.split.segments.append(metadata)

    def __enter__(self) -> Split:
        from transmuter import telemetry

        telemetry.attach("bench_tts", SEGMENT_EVENTS, self)
        return self.split

    def __exit__(self, *exc) -> None:
        from transmuter import telemetry

        telemetry.detach("bench_tts")


def transmuter_first(feeds: dict) -> tuple[Callable, dict[str, np.ndarray], Split]:
    """load + compile + first call, timed, with the split."""
    import transmuter

    with Recorder() as split:
        began = time.perf_counter()
        model = transmuter.load(str(PATH))
        split.load_s = time.perf_counter() - began
        fn = transmuter.compile(model, feeds)
        split.compile_s = time.perf_counter() - began - split.load_s
        split.call_s, outputs = timed(fn, feeds)
    return fn, outputs, split


def transmuter_new_shape(fn: Callable, feeds: dict) -> tuple[dict[str, np.ndarray], Split]:
    with Recorder() as split:
        split.call_s, outputs = timed(fn, feeds)
    return outputs, split


def medians(engines: dict[str, Callable], feeds: dict, rounds: int) -> dict[str, float]:
    """Per-call median seconds, engines taking turns within each round."""
    times: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(rounds):
        for name, run in engines.items():
            times[name].append(timed(run, feeds)[0])
    return {name: statistics.median(values) for name, values in times.items()}


# --- output comparison ---------------------------------------------------------------------


def mel_filterbank(n_fft: int = 1024, n_mels: int = 80) -> np.ndarray:
    """Triangular filters on the HTK mel scale, 0 to Nyquist: [n_mels, n_fft // 2 + 1]."""

    def mel(hz):
        return 2595.0 * np.log10(1.0 + np.asarray(hz) / 700.0)

    def hz(m):
        return 700.0 * (10.0 ** (np.asarray(m) / 2595.0) - 1.0)

    edges = hz(np.linspace(mel(0.0), mel(SAMPLE_RATE / 2), n_mels + 2))
    bins = np.linspace(0.0, SAMPLE_RATE / 2, n_fft // 2 + 1)
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins - lower) / (centre - lower)
    falling = (upper - bins) / (upper - centre)
    return np.maximum(0.0, np.minimum(rising, falling))


def log_mel(audio: np.ndarray, n_fft: int = 1024, hop: int = 256) -> np.ndarray:
    audio = np.pad(audio.astype(np.float64).ravel(), n_fft // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(audio, n_fft)[::hop]
    power = np.abs(np.fft.rfft(frames * np.hanning(n_fft + 1)[:-1], axis=-1)) ** 2
    return np.log(power @ mel_filterbank(n_fft).T + 1e-5)


def mel_distance(a: np.ndarray, b: np.ndarray) -> float:
    n = min(a.size, b.size)  # lengths differ only when durations do; that is reported apart
    return float(np.mean(np.abs(log_mel(a.ravel()[:n]) - log_mel(b.ravel()[:n]))))


def compare(ours: dict, theirs: dict, run_ort: Callable, feeds: dict) -> dict[str, object]:
    """The int8 rule: durations within one frame, audio within ORT's own style sensitivity."""
    frames = np.abs(ours["duration"].astype(np.int64) - theirs["duration"].astype(np.int64))
    rerun, moved = run_ort(feeds), run_ort(nudged(feeds))
    return {
        "durations equal": bool(np.array_equal(ours["duration"], theirs["duration"])),
        "max duration diff (frames)": int(frames.max()),
        "samples T / ORT": f"{ours['waveform'].size} / {theirs['waveform'].size}",
        "audio length diff (frames)": length_diff(ours["waveform"], theirs["waveform"]),
        "log-mel T vs ORT": mel_distance(ours["waveform"], theirs["waveform"]),
        "log-mel ORT vs ORT, rerun": mel_distance(rerun["waveform"], theirs["waveform"]),
        "log-mel ORT vs ORT, style 1e-6": mel_distance(moved["waveform"], theirs["waveform"]),
        "max abs audio T vs ORT": max_abs_diff(ours["waveform"], theirs["waveform"]),
    }


def length_diff(a: np.ndarray, b: np.ndarray) -> float:
    return abs(a.size - b.size) / SAMPLES_PER_FRAME


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    n = min(a.size, b.size)
    return float(np.abs(a.ravel()[:n] - b.ravel()[:n]).max())


# --- report --------------------------------------------------------------------------------


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def report_failure(exc: BaseException) -> None:
    print(f"\nTransmuter failed: {first_line(exc)}")
    print("".join(traceback.format_exception(exc)[-12:]))


def table(rows: list[tuple[str, ...]]) -> str:
    head = ("workload", "engine", "first s", "per call ms", "vs ORT 1 thr", "vs ORT 2 thr")
    lines = ["| " + " | ".join(head) + " |", "|---|---|--:|--:|--:|--:|"]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def ort_engines(feeds: dict) -> tuple[dict[str, Callable], dict[str, float], dict]:
    """ORT with 1 and 2 intra-op threads: runners, first-result seconds, 1 thread's outputs."""
    engines, first, outputs = {}, {}, []
    for threads in (1, 2):
        name = f"ORT {threads} thr"
        began = time.perf_counter()
        engines[name] = ort_runner(ort_session(threads))
        outputs.append(to_numpy(engines[name](feeds)))
        first[name] = time.perf_counter() - began
    return engines, first, outputs[0]


def rows_for(label: str, per_call: dict[str, float], first: dict[str, float]) -> list[tuple]:
    rows = []
    for name, seconds in per_call.items():
        ratios = [seconds / per_call[f"ORT {t} thr"] for t in (1, 2)]
        shown = f"{first[name]:.1f}" if name in first else ""
        rows.append((label, name, shown, f"{seconds * 1e3:.0f}", *(f"{r:.2f}" for r in ratios)))
    return rows


def print_checks(columns: dict[str, dict[str, object]]) -> None:
    def cell(value: object) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    names = list(columns)
    print(f"\n| output check, {LENGTHS[0]} tokens | " + " | ".join(names) + " |")
    print("|---|" + "--:|" * len(names))
    for key in columns[names[0]]:
        print(f"| {key} | " + " | ".join(cell(columns[n][key]) for n in names) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per length")
    args = parser.parse_args(argv)
    if not PATH.exists():
        print(f"{PATH} is missing: run bench/make_kokoro.py first (see its docstring); skipping")
        return 0

    short, long = (feeds_for(n) for n in LENGTHS)
    engines, first, reference = ort_engines(short)
    ours = None
    try:
        fn, ours, split = transmuter_first(short)
        engines = {"Transmuter": fn, **engines}
        first["Transmuter"] = split.total_s
        print(f"Transmuter, {LENGTHS[0]} tokens, first result: {split.summary()}")
    except Exception as exc:  # report precisely, time ORT anyway
        report_failure(exc)
    rows = rows_for(f"{LENGTHS[0]} tokens", medians(engines, short, args.rounds), first)

    first = {}  # for a new length ORT has nothing to redo; Transmuter compiles again
    if "Transmuter" in engines:
        _, split = transmuter_new_shape(engines["Transmuter"], long)
        first["Transmuter"] = split.total_s
        print(f"Transmuter, {LENGTHS[1]} tokens, first call: {split.summary()}")
    rows += rows_for(f"{LENGTHS[1]} tokens", medians(engines, long, args.rounds), first)

    print(f"\n{PATH.name}, {args.rounds} rounds, {os.cpu_count()} CPUs\n")
    print(table(rows))
    if ours is not None:
        print_checks({"value": compare(ours, reference, engines["ORT 1 thr"], short)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
