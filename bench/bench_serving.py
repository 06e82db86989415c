"""Serving: requests per second and latency with `transmuter.Serving` batching concurrent
callers, against the same requests served one at a time; embeddings and generation.

    python bench/make_minilm.py && python bench/bench_serving.py [--requests 256] [--rounds 3]

Two repos: the tiny BERT of tests/fixtures/pipelines/bert and the MiniLM-sized BERT of
bench/make_minilm.py (random weights; the fixture's tokenizer, whose ids fit its vocabulary),
both as feature-extraction with mean pooling. Each request is one text of 5 to 40 words
(seeded). "one at a time": a loop calling the pipeline per request. "Serving, N clients": N
threads sharing the requests, each waiting for its answer before sending the next, through
one `Serving` (batch_size 16, batch_timeout_ms 5). Every program is compiled before timing
(the pipeline's sequence buckets at batch sizes 1..16). Rounds alternate the ways; the table
has each way's median over rounds of requests per second and of its p50 / p99 latency.

Generation: greedy completions of 32 new tokens on the GPT-2 and Llama fixtures
(tests/fixtures/pipelines; tiny random weights), 48 prompts, one at a time against 4 and 16
clients through one `Serving` (requests with the same options batch into one generation;
there is no continuous batching yet: a batch runs to its longest answer). Tokens per second
and p50 / p99 request latency.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import transmuter
from transmuter import cpu

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_minilm import PATH as MINILM  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "pipelines" / "bert"
WORDS = "the a quick brown fox jumps over lazy dog cat and sat on mat".split()
BATCH_SIZE = 16
CLIENTS = (1, 8, 64)


def texts(count: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(5, 41))) for _ in range(count)]


def minilm_repo(folder: Path) -> Path:
    """The fixture's tokenizer and config (512 positions) beside the MiniLM export."""
    repo = folder / "minilm"
    repo.mkdir()
    shutil.copy(FIXTURE / "tokenizer.json", repo)
    config = json.loads((FIXTURE / "config.json").read_text())
    config.update(max_position_embeddings=512, hidden_size=384, vocab_size=30522)
    (repo / "config.json").write_text(json.dumps(config))
    (repo / "model.onnx").symlink_to(MINILM)
    return repo


def timed(call, requests: list[str], clients: int) -> dict:
    """Requests per second and p50 / p99 latency (ms) of `clients` threads sharing requests."""
    latencies = []

    def one(text: str) -> None:
        start = time.perf_counter()
        call(text)
        latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    if clients == 1:
        for text in requests:
            one(text)
    else:
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(one, requests))
    total = time.perf_counter() - start
    ms = np.array(latencies) * 1000
    return {"rps": len(requests) / total, "p50": float(np.median(ms)),
            "p99": float(np.percentile(ms, 99))}  # fmt: skip


def bench(repo: Path, requests: list[str], rounds: int) -> dict:
    pipeline = transmuter.pipeline("feature-extraction", repo, pooling="mean", normalize=True,
                                   batch_size=BATCH_SIZE)  # fmt: skip
    batches: list[int] = []
    transmuter.telemetry.attach("bench", ["transmuter.serving.batch"],
                                lambda e, m, meta: batches.append(m["items"]))  # fmt: skip
    results: dict[str, list[dict]] = {}
    with transmuter.Serving(pipeline, batch_size=BATCH_SIZE, batch_timeout_ms=5) as serving:
        lengths = sorted({pipeline.batch_key(t) for t in requests})
        examples = [next(t for t in requests if pipeline.batch_key(t) == n) for n in lengths]
        serving.warmup(examples)
        ways = {"one at a time": (pipeline, 1)}
        ways.update({f"Serving, {n} clients": (serving, n) for n in CLIENTS})
        for _ in range(rounds):
            for name, (call, clients) in ways.items():
                batches.clear()
                row = timed(call, requests, clients)
                row["items per call"] = len(requests) / max(len(batches), 1) if batches else 1.0
                results.setdefault(name, []).append(row)
    transmuter.telemetry.detach("bench")
    return {name: {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            for name, rows in results.items()}  # fmt: skip


def bench_generation(repo: Path, rounds: int) -> dict:
    pipeline = transmuter.pipeline("text-generation", repo)
    prompts = [pipeline.tokenizer.encode(t).ids for t in texts(48, seed=1)]
    options = {"max_new_tokens": 32, "do_sample": False}
    results: dict[str, list[dict]] = {}
    with transmuter.Serving(pipeline.generate, batch_size=16, batch_timeout_ms=5) as serving:
        serving.warmup(prompts[:1], **options)
        alone = lambda ids: pipeline.generate([ids], **options)  # noqa: E731
        batched = lambda ids: serving([ids], **options)  # noqa: E731
        ways = {"one at a time": (alone, 1), "Serving, 4 clients": (batched, 4),
                "Serving, 16 clients": (batched, 16)}  # fmt: skip
        for _ in range(rounds):
            for name, (call, clients) in ways.items():
                row = timed(call, prompts, clients)
                row["tokens/s"] = row.pop("rps") * options["max_new_tokens"]
                results.setdefault(name, []).append(row)
    return {name: {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            for name, rows in results.items()}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not MINILM.exists():
        sys.exit(f"{MINILM} is missing: run python bench/make_minilm.py first")
    print(f"# {cpu.describe()}; {args.requests} requests, median of {args.rounds} rounds")
    requests = texts(args.requests)
    with tempfile.TemporaryDirectory() as folder:
        for name, repo in (("tiny BERT", FIXTURE), ("MiniLM-sized", minilm_repo(Path(folder)))):
            table = bench(repo, requests, args.rounds)
            base = table["one at a time"]["rps"]
            print(f"\n{name}\n| way | requests/s | x one at a time | p50 ms | p99 ms | "
                  "items per call |\n|---|---|---|---|---|---|")  # fmt: skip
            for way, row in table.items():
                print(f"| {way} | {row['rps']:.1f} | {row['rps'] / base:.2f} | {row['p50']:.1f} "
                      f"| {row['p99']:.1f} | {row['items per call']:.1f} |")  # fmt: skip
    pipelines = FIXTURE.parent
    for name in ("gpt2", "llama"):
        table = bench_generation(pipelines / name, args.rounds)
        base = table["one at a time"]["tokens/s"]
        print(f"\ngeneration, {name} fixture, 32 greedy tokens a request\n| way | tokens/s | "
              "x one at a time | p50 ms | p99 ms |\n|---|---|---|---|---|")  # fmt: skip
        for way, row in table.items():
            print(f"| {way} | {row['tokens/s']:.0f} | {row['tokens/s'] / base:.2f} | "
                  f"{row['p50']:.0f} | {row['p99']:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
