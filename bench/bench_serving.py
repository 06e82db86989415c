"""Serving: requests per second and latency with `transmuter.Serving` batching concurrent
callers, against the same requests served one at a time; embeddings and generation.

    python bench/make_minilm.py && python bench/bench_serving.py [--requests 256] [--rounds 3]
    [--only embeddings|generation]

Two repos: the tiny BERT of tests/fixtures/pipelines/bert and the MiniLM-sized BERT of
bench/make_minilm.py (random weights; the fixture's tokenizer, whose ids fit its vocabulary),
both as feature-extraction with mean pooling. Each request is one text of 5 to 40 words
(seeded). "one at a time": a loop calling the pipeline per request. "Serving, N clients": N
threads sharing the requests, each waiting for its answer before sending the next, through
one `Serving` (batch_size 16, batch_timeout_ms 5). Every program is compiled before timing
(the pipeline's sequence buckets at batch sizes 1..16). Rounds alternate the ways; the table
has each way's median over rounds of requests per second and of its p50 / p99 latency.

Generation: greedy completions of exactly 32 new tokens (min_new_tokens 32) on the GPT-2 and
Llama fixtures (tests/fixtures/pipelines; tiny random weights) and a GPT-2-small-sized decoder
(bench/make_gpt2.py: 124M random weights, when made), 48 prompts (cut to 48 tokens): one at a
time (`TextGeneration.generate`), one at a time on ONNX Runtime (bench_generate.py's
hand-written loop: prefill, then one step per token with the past growing), and 4 and 16
clients of one `ContinuousGeneration` with 16 slots (requests join the running decode batch
and leave when done). Tokens per second, p50 / p99 request latency, and p50 / p99 time per
output token (from a request's first streamed token to its answer, over the 31 after it).

    python bench/bench_serving.py --only generation    # the generation tables alone
    python bench/bench_serving.py --only embeddings --baseline 563546c

`--baseline REF` adds the embedding rows of the `Serving` of transmuter/serving/batching.py at
git revision REF, on the same pipeline, its rounds alternating with the current one's: a
before-and-after of a change to Serving on one machine in one run. Without MiniLM's export the
embeddings table has the tiny BERT alone.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort

import transmuter
from transmuter import cpu
from transmuter.pipelines.generation.continuous import ContinuousGeneration
from transmuter.pipelines.generation.decoder import MIN_PROMPT_BUCKET
from transmuter.pipelines.shapes import pow2

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generate import ort_generate  # noqa: E402
from make_gpt2 import PATH as GPT2_SMALL  # noqa: E402
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


def timed(call, requests: list, clients: int) -> dict:
    """Requests per second and p50 / p99 latency (ms) of `clients` threads sharing requests;
    and p50 / p99 time per output token (ms) where `call` returns it ("tpot", with its
    "latency")."""
    latencies, tpots = [], []

    def one(request) -> None:
        start = time.perf_counter()
        got = call(request)
        latencies.append(time.perf_counter() - start)
        if isinstance(got, dict) and "tpot" in got:
            tpots.append(got["tpot"])

    start = time.perf_counter()
    if clients == 1:
        for request in requests:
            one(request)
    else:
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(one, requests))
    total = time.perf_counter() - start
    ms = np.array(latencies) * 1000
    row = {"requests/s": len(requests) / total, "p50": float(np.median(ms)),
           "p99": float(np.percentile(ms, 99))}  # fmt: skip
    if tpots:
        row["tpot p50 ms"] = float(np.median(tpots)) * 1000
        row["tpot p99 ms"] = float(np.percentile(tpots, 99)) * 1000
    return row


def medians(results: dict[str, list[dict]]) -> dict[str, dict]:
    """Each way's median over rounds of each figure."""
    return {name: {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            for name, rows in results.items()}  # fmt: skip


def print_table(title: str, table: dict[str, dict], rate: str) -> None:
    """A markdown table: each way's `rate`, its ratio to one at a time, p50 / p99 ms, and any
    other figure the rows have."""
    base = table["one at a time"][rate]
    extra = [k for k in next(iter(table.values())) if k not in (rate, "p50", "p99")]
    print(f"\n{title}\n| way | {rate} | x one at a time | p50 ms | p99 ms |"
          + "".join(f" {k} |" for k in extra) + "\n" + "|---" * (5 + len(extra)) + "|")  # fmt: skip
    for way, row in table.items():
        cells = [row[rate], row[rate] / base, row["p50"], row["p99"], *(row[k] for k in extra)]
        print(f"| {way} | " + " | ".join(f"{c:.2f}" if c < 10 else f"{c:.0f}" for c in cells)
              + " |")  # fmt: skip


def serving_at(revision: str):
    """The `Serving` class of transmuter/serving/batching.py at git `revision`."""
    source = subprocess.run(
        ["git", "show", f"{revision}:transmuter/serving/batching.py"],
        cwd=FIXTURE.parents[3], check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / f"batching_{revision}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"batching_{revision}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.Serving


def bench(repo: Path, requests: list[str], rounds: int, baseline: str | None = None) -> dict:
    pipeline = transmuter.pipeline("feature-extraction", repo, pooling="mean", normalize=True,
                                   batch_size=BATCH_SIZE)  # fmt: skip
    batches: list[int] = []
    transmuter.telemetry.attach("bench", ["transmuter.serving.batch"],
                                lambda e, m, meta: batches.append(m["items"]))  # fmt: skip
    results: dict[str, list[dict]] = {}
    old = (
        serving_at(baseline)(pipeline, batch_size=BATCH_SIZE, batch_timeout_ms=5)
        if baseline
        else None
    )
    with transmuter.Serving(pipeline, batch_size=BATCH_SIZE, batch_timeout_ms=5) as serving:
        lengths = sorted({pipeline.batch_key(t) for t in requests})
        examples = [next(t for t in requests if pipeline.batch_key(t) == n) for n in lengths]
        serving.warmup(examples)
        ways = {"one at a time": (pipeline, 1)}
        for n in CLIENTS:
            ways[f"Serving, {n} clients"] = (serving, n)
            if old is not None:
                ways[f"Serving at {baseline}, {n} clients"] = (old, n)
        for round_ in range(rounds):
            names = list(ways)
            if round_ % 2:  # every other round the other way round, so order favours neither
                names = names[:1] + names[:0:-1]
            for name in names:
                call, clients = ways[name]
                batches.clear()
                row = timed(call, requests, clients)
                row["items per call"] = len(requests) / len(batches) if batches else 1.0
                results.setdefault(name, []).append(row)
    transmuter.telemetry.detach("bench")
    if old is not None:
        old.close()
    return medians(results)


def bench_generation(repo: Path, rounds: int) -> dict:
    pipeline = transmuter.pipeline("text-generation", repo)
    export = next(
        repo / f for f in ("decoder_model_merged.onnx", "model.onnx") if (repo / f).exists()
    )
    session = ort.InferenceSession(str(export), providers=["CPUExecutionProvider"])
    pad = pipeline._pad_id(pipeline._settings(pipeline.defaults))
    # At most 48 prompt tokens, so that 32 new ones fit the fixtures' positions.
    prompts = [pipeline.tokenizer.encode(t).ids[:48] for t in texts(48, seed=1)]
    new = 32
    options = {"max_new_tokens": new, "min_new_tokens": new, "do_sample": False}
    engine = ContinuousGeneration(pipeline, slots=16)
    results: dict[str, list[dict]] = {}

    def streamed(run):
        """`run(on_token)` timed: its latency and the time per output token after the first."""
        first = []
        start = time.perf_counter()
        run(lambda *_: first.append(time.perf_counter()) if not first else None)
        end = time.perf_counter()
        return {"latency": end - start, "tpot": (end - first[0]) / (new - 1)}

    def alone(ids):
        return streamed(lambda on_token: pipeline.generate([ids], on_token=on_token, **options))

    def joined(ids):
        return streamed(lambda on_token: engine.submit(ids, on_token=on_token, **options).result())

    def ort_loop(ids):
        return streamed(lambda on_token: ort_generate(session, [ids], new, pad, on_token))

    buckets = {pow2(len(ids), MIN_PROMPT_BUCKET): ids for ids in prompts}
    for ids in buckets.values():  # every prompt bucket compiled, each way
        alone(ids)
        joined(ids)
        ort_loop(ids)
    ways = {"one at a time": (alone, 1), "ONNX Runtime, one at a time": (ort_loop, 1),
            "continuous, 4 clients": (joined, 4), "continuous, 16 clients": (joined, 16)}  # fmt: skip
    for call, clients in ways.values():  # the steps' row counts and windows compiled
        if clients > 1:
            timed(call, prompts, clients)
    for _ in range(rounds):
        for name, (call, clients) in ways.items():
            row = timed(call, prompts, clients)
            row["tokens/s"] = row.pop("requests/s") * new
            results.setdefault(name, []).append(row)
    engine.close()
    return medians(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=("embeddings", "generation"))
    parser.add_argument("--baseline", metavar="REF", help="also time Serving at this git revision")
    args = parser.parse_args()
    print(f"# {cpu.describe()}; median of {args.rounds} rounds")
    if args.only != "generation":
        requests = texts(args.requests)
        with tempfile.TemporaryDirectory() as folder:
            repos = [("tiny BERT", FIXTURE)]
            if MINILM.exists():
                repos.append(("MiniLM-sized", minilm_repo(Path(folder))))
            else:
                print(f"\n{MINILM} is missing (python bench/make_minilm.py): MiniLM not measured")
            for name, repo in repos:
                title = f"{name}, {args.requests} requests"
                table = bench(repo, requests, args.rounds, args.baseline)
                print_table(title, table, "requests/s")
    if args.only == "embeddings":
        return
    repos = [FIXTURE.parent / "gpt2", FIXTURE.parent / "llama"]
    if GPT2_SMALL.exists():
        repos.append(GPT2_SMALL)
    else:
        print(f"\n{GPT2_SMALL} is missing (python bench/make_gpt2.py makes it): not measured")
    for repo in repos:
        table = bench_generation(repo, args.rounds)
        print_table(f"generation, {repo.name}, 32 greedy tokens a request", table, "tokens/s")


if __name__ == "__main__":
    main()
