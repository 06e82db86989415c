"""The text-to-speech pipeline over sentences of random lengths: programs compiled, time to the
first result, seconds per sentence, against ONNX Runtime running the same graph unpadded.

    .venv/bin/python bench/bench_tts_pipeline.py [--sentences 50] [--kokoro-sized 12]

Two repos in onnx-community's layout:
- the tiny Kokoro the tests use (tests/fixtures/pipelines/kokoro: the `kokoro` package's model at
  hidden size 16), `--sentences` phoneme strings of 10 to 120 phonemes;
- the Kokoro-82M-sized int8 model of bench/make_kokoro.py (bench/.cache/kokoro-int8.onnx; skipped
  when missing), as a repo under bench/.cache/kokoro-repo (its vocabulary, a seeded voice pack),
  `--kokoro-sized` strings of 10 to 100 phonemes (every token lasts about 4 frames there, so a
  sentence is 0.3 to 2.6 s of audio and costs seconds a call).

Phonemes are drawn from the repo's vocabulary with spaces, seeded; the voice is one pack, its row
chosen by length as the pipeline does. The pipeline pads token ids to 32/128/512 and frames to
FRAME_BUCKETS, half an octave apart (transmuter/pipelines/audio/text_to_speech.py). A cold pass
over the sentences counts the programs Transmuter compiles (telemetry) and times the first
result and the pass; a warm pass then runs each sentence with Transmuter and with ORT (1
intra-op thread, then 2; each sentence at its own length, unpadded), in turn, and sums their
times.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

import transmuter  # noqa: E402
from transmuter.pipelines.audio.text_to_speech import FRAME_BUCKETS  # noqa: E402

HERE = Path(__file__).resolve().parent
TINY = HERE.parent / "tests" / "fixtures" / "pipelines" / "kokoro"
INT8 = HERE / ".cache" / "kokoro-int8.onnx"
SIZED_REPO = HERE / ".cache" / "kokoro-repo"
SEED = 0
N_TOKEN = 178  # bench/make_kokoro.py's vocabulary: chr(0x100 + i) for ids 1..177
SPACE_ID = 16  # Kokoro's id for " "


def kokoro_sized_repo() -> Path:
    """bench/.cache/kokoro-repo: the int8 model (linked), its vocabulary, one voice."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    (SIZED_REPO / "onnx").mkdir(parents=True, exist_ok=True)
    (SIZED_REPO / "voices").mkdir(exist_ok=True)
    model = SIZED_REPO / "onnx" / "model.onnx"
    if not model.exists():
        model.symlink_to(INT8)
    vocab = {
        "$": 0,
        **{chr(0x100 + i): i for i in range(1, N_TOKEN) if i != SPACE_ID},
        " ": SPACE_ID,
    }
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="$"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    (SIZED_REPO / "tokenizer.json").write_text(tokenizer.to_str())
    (SIZED_REPO / "config.json").write_text(json.dumps({"model_type": "style_text_to_speech_2"}))
    pack = np.random.default_rng(SEED).standard_normal((510, 1, 256)).astype(np.float32)
    pack.tofile(SIZED_REPO / "voices" / "af_bench.bin")
    return SIZED_REPO


def sentences(repo: Path, count: int, lengths: tuple[int, int]) -> list[str]:
    vocab = json.loads((repo / "tokenizer.json").read_text())["model"]["vocab"]
    letters = [c for c, i in vocab.items() if i and c.strip() and c not in ".!?;"]
    rng = np.random.default_rng(SEED)
    out = []
    for n in rng.integers(lengths[0], lengths[1] + 1, count):
        chars = rng.choice(letters, n)
        chars[rng.random(n) < 0.15] = " "
        out.append("".join(chars).strip() or letters[0])
    return out


def ort_runner(repo: Path, threads: int):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(repo / "onnx" / "model.onnx"), options)
    names = {i.name for i in session.get_inputs()}
    token_input = "input_ids" if "input_ids" in names else "tokens"

    def run(ids: list[int], style: np.ndarray) -> None:
        session.run(
            None,
            {
                token_input: np.array([[0, *ids, 0]], np.int64),
                "style": style.reshape(1, 256),
                "speed": np.ones(1, np.float32),
            },
        )

    return run


def measure(repo: Path, voice: str, texts: list[str]) -> dict[str, object]:
    """Two passes over `texts`: the first cold (programs compiled, first result, its total), the
    second warm, each sentence run by Transmuter and by ORT with 1 and 2 threads in turn."""
    compiled = []
    transmuter.telemetry.attach(
        "bench_tts_pipeline",
        ["transmuter.segment.compile.stop"],
        lambda event, measurements, metadata: compiled.append(bool(metadata.get("compiled"))),
    )
    try:
        began = time.perf_counter()
        speak = transmuter.pipeline("text-to-speech", str(repo), voice=voice)
        speak(texts[0], phonemes=True)
        first_s = time.perf_counter() - began
        for text in texts[1:]:
            speak(text, phonemes=True)
        cold_s = time.perf_counter() - began
    finally:
        transmuter.telemetry.detach("bench_tts_pipeline")
    pack = speak._voice(voice)
    ort_runs = {f"ORT {t} thr": ort_runner(repo, t) for t in (1, 2)}
    warm: dict[str, list[float]] = {"Transmuter": [], **{name: [] for name in ort_runs}}
    audio_s = padded_s = 0.0
    for text in texts:
        start = time.perf_counter()
        out = speak(text, phonemes=True)
        warm["Transmuter"].append(time.perf_counter() - start)
        frames = int(out["durations"].sum())
        audio_s += frames * 600 / out["sampling_rate"]
        padded_s += next(b for b in FRAME_BUCKETS if b >= frames) * 600 / out["sampling_rate"]
        ids = speak._ids(text)
        style = pack[min(max(len(ids) - 1, 0), len(pack) - 1)]
        for name, run in ort_runs.items():
            start = time.perf_counter()
            run(ids, style)
            warm[name].append(time.perf_counter() - start)
    totals = {name: sum(values) for name, values in warm.items()}
    return {
        "sentences": len(texts),
        "token counts": len({len(t) for t in texts}),
        "programs compiled": sum(compiled),
        "first result s": first_s,
        "cold pass s": cold_s,
        "audio s (padded to frame buckets)": f"{audio_s:.1f} ({padded_s:.1f})",
        **{f"warm pass s, {name}": seconds for name, seconds in totals.items()},
        "Transmuter / ORT 1 thr": totals["Transmuter"] / totals["ORT 1 thr"],
        "Transmuter / ORT 2 thr": totals["Transmuter"] / totals["ORT 2 thr"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=50, help="tiny repo's sentences")
    parser.add_argument("--kokoro-sized", type=int, default=12, help="Kokoro-sized sentences")
    args = parser.parse_args(argv)
    columns = {"tiny Kokoro": measure(TINY, "af_tiny", sentences(TINY, args.sentences, (10, 120)))}
    print(columns)
    if INT8.exists() and args.kokoro_sized:
        repo = kokoro_sized_repo()
        texts = sentences(repo, args.kokoro_sized, (10, 100))
        columns["Kokoro-82M-sized int8"] = measure(repo, "af_bench", texts)
    else:
        print(f"{INT8} missing (bench/make_kokoro.py makes it): the Kokoro-sized column is skipped")
    names = list(columns)
    print(f"\n{os.cpu_count()} CPUs\n\n| | " + " | ".join(names) + " |")
    print("|---|" + "--:|" * len(names))
    for key in columns[names[0]]:
        cells = [columns[n][key] for n in names]
        shown = [f"{c:.3g}" if isinstance(c, float) else str(c) for c in cells]
        print(f"| {key} | " + " | ".join(shown) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
