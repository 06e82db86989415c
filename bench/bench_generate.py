"""Greedy generation: tokens per second and programs compiled, Transmuter's text-generation
pipeline against ONNX Runtime running the same export in a hand-written loop.

    python bench/bench_generate.py [--tokens 200] [--batches 1 8]
    python bench/bench_generate.py --seq2seq-only --whisper bench/.cache/whisper-tiny --tokens 40 --batches 1

Models: the tiny GPT-2 (decoder_model_merged.onnx) and Llama (model.onnx, grouped-query
attention) repos of tests/fixtures/make_pipelines.py; then its encoder-decoder repos (T5, BART,
Whisper), Transmuter alone (cold, warm and programs: their generation_config's forced and
suppressed tokens are not in a hand-written ONNX Runtime loop; `--whisper PATH` runs a Whisper
repo of that layout instead, such as bench/make_whisper_tiny.py's 30-second Whisper-tiny-sized
one, on 3 s of noise padded to its 30 s). Each run generates exactly `--tokens`
new tokens (no end of sequence) from prompts of different lengths (left-padded), timed twice:
cold (compiling included) and warm (the same call again). ONNX Runtime (CPUExecutionProvider,
default optimizations) runs prefill and then one step per token with the past growing by one,
argmax in numpy, the loop any ORT user writes. Its tokens are checked equal to Transmuter's.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

import transmuter
from transmuter.pipelines.generation.seq2seq import DECODINGS

REPOS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "pipelines"
MODELS = {"gpt2": "decoder_model_merged.onnx", "llama": "model.onnx"}
SEQ2SEQ = {
    "t5": "text2text-generation",
    "bart": "text2text-generation",
    "whisper": "automatic-speech-recognition",
}
PROMPTS = ["Once upon a time", "The capital of France is", "Hello", "A tiny model writes tiny"]


def prompts(generate, batch: int) -> list[list[int]]:
    return [generate.tokenizer.encode(PROMPTS[i % len(PROMPTS)]).ids for i in range(batch)]


def ort_generate(session, rows: list[list[int]], tokens: int, pad: int, on_token=None):
    """Greedy: each row's `tokens` new token ids; `on_token(tokens)` sees each step's."""
    names = [i.name for i in session.get_inputs()]
    pasts = [n for n in names if n.startswith("past_key_values.")]
    shape = {i.name: i.shape for i in session.get_inputs()}
    width = max(map(len, rows))
    ids = np.array([[pad] * (width - len(r)) + r for r in rows], np.int64)
    mask = (np.arange(width)[None] >= (width - np.array([len(r) for r in rows]))[:, None]).astype(
        np.int64
    )
    positions = np.where(mask == 1, np.cumsum(mask, 1) - 1, 1)
    past = {n: np.zeros((len(rows), shape[n][1], 0, shape[n][3]), np.float32) for n in pasts}
    out_names = ["logits", *[n.replace("past_key_values.", "present.") for n in pasts]]
    made = []
    for step in range(tokens):
        feed = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, **past}
        if "use_cache_branch" in names:
            feed["use_cache_branch"] = np.array([step > 0])
        logits, *presents = session.run(out_names, feed)
        token = logits[:, -1].argmax(-1)
        made.append(token)
        if on_token is not None:
            on_token(token)
        past = dict(zip(pasts, presents))
        ids = token[:, None].astype(np.int64)
        mask = np.concatenate([mask, np.ones((len(rows), 1), np.int64)], 1)
        positions = positions[:, -1:] + 1
    return np.stack(made, 1).tolist()


def seq2seq(
    tokens: int, batches: list[int], repos: dict[str, tuple[Path, str]], beams: int | None
) -> None:
    """The encoder-decoder `repos` ({name: (path, task)}), each decoding: `tokens` new tokens
    per row (no end of sequence before), with `beams` beams (None: the pipeline's default,
    which is 5 for speech recognition, as transformers' pipeline decodes Whisper)."""
    from transmuter.pipelines.audio.features import log_mel

    print("\nencoder-decoder, Transmuter alone")
    print(
        "model    decoding batch tokens  cold s  warm s  warm tok/s  programs  (warm: median of 3)"
    )
    texts = ["Hello world", "A tiny model writes tiny texts", "Translate this"]
    for name, (path, task) in repos.items():
        for decoding in DECODINGS:
            options = {} if beams is None else {"num_beams": beams}
            generate = transmuter.pipeline(task, path, decoding=decoding, **options)
            limit = generate.decoder.positions or tokens + 8
            for batch in batches:
                before = generate.programs
                if task == "automatic-speech-recognition":
                    rng = np.random.default_rng(0)
                    waves = [
                        rng.standard_normal(16000 * 3).astype(np.float32) for _ in range(batch)
                    ]
                    inputs = log_mel(waves, generate.features)
                else:
                    inputs = [generate.tokenizer.encode(texts[i % 3]).ids for i in range(batch)]
                count = min(tokens, limit - 4)  # Whisper's prompt is 4 tokens
                options = dict(max_new_tokens=count, min_new_tokens=count)
                _, cold = timed(generate.generate, inputs, **options)
                warm = np.median([timed(generate.generate, inputs, **options)[1] for _ in range(3)])
                print(
                    f"{name:8} {decoding:8} {batch:5} {count:6}  {cold:6.2f}  {warm:6.2f}  "
                    f"{batch * count / warm:10.1f}  {generate.programs - before:8}"
                )


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--seq2seq-only", action="store_true", help="skip GPT-2 and Llama")
    parser.add_argument("--whisper", type=Path, help="a Whisper repo in place of the fixtures")
    parser.add_argument("--beams", type=int, help="num_beams (default: each pipeline's own)")
    args = parser.parse_args()
    repos = {name: (REPOS / name, task) for name, task in SEQ2SEQ.items()}
    if args.whisper:
        repos = {args.whisper.name: (args.whisper, "automatic-speech-recognition")}
    if args.seq2seq_only:
        seq2seq(args.tokens, args.batches, repos, args.beams)
        return
    print(f"greedy, {args.tokens} new tokens per row; tokens/s counts every row's tokens")
    header = "model  batch tokens  transmuter cold  warm tok/s  programs  ORT tok/s  warm/ORT  same"
    print(header)
    for name, file in MODELS.items():
        generate = transmuter.pipeline("text-generation", REPOS / name)
        session = ort.InferenceSession(str(REPOS / name / file), providers=["CPUExecutionProvider"])
        pad = generate._pad_id(generate._settings(generate.defaults))
        for batch in args.batches:
            rows = prompts(generate, batch)
            limit = (
                generate.repo.config.get("max_position_embeddings")
                or generate.repo.config["n_positions"]
            )
            tokens = min(args.tokens, limit - max(map(len, rows)))  # the position table's end
            before = generate.programs

            options = dict(max_new_tokens=tokens, eos_token_id=None)
            _, cold = timed(generate.generate, rows, **options)
            got, warm = timed(generate.generate, rows, **options)
            programs = generate.programs - before
            want, ort_time = timed(ort_generate, session, rows, tokens, pad)
            total = batch * tokens
            print(
                f"{name:6} {batch:5} {tokens:6}  {cold:13.2f} s  {total / warm:10.0f}  {programs:8}  "
                f"{total / ort_time:9.0f}  {ort_time / warm:8.2f}  {got == want}"
            )
    seq2seq(args.tokens, args.batches, repos, args.beams)


if __name__ == "__main__":
    main()
