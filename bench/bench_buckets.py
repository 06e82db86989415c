"""Shape churn: compiles and total time for traffic whose shapes change on every call.

    python bench/make_minilm.py && python bench/bench_buckets.py [--requests 200] [--json PATH]

1. Sentence embedding: `--requests` calls at batch 1 with lengths drawn uniformly from 5..128
   (seeded), on the MiniLM-sized BERT: without buckets (cache_size 8, the default) and with
   `"sequence": "pow2"` buckets. ONNX Runtime runs the same calls for scale.
2. Variable batch: 100 calls with batches drawn from 1..32 at sequence 128, without buckets and
   with `"batch": [1, 2, 4, 8, 16, 32]`: compiles and rows per second.
3. Generation: 30 greedy tokens, one call per token with the past growing by one, on the tiny
   Llama fixture (tests/fixtures/models/llama.onnx, its mask and present dims renamed
   `past_sequence + sequence` as Optimum names them): without buckets and with
   `"past_sequence": ("multiple", 16)`.
4. A new shape's cost split: tracing (Transmuter's graph walk), lowering (JAX to StableHLO) and
   XLA's compile, from the `transmuter.segment.compile.stop` telemetry of a cold compile.

Compiles are counted from `transmuter.segment.compile.stop` events; "compiling" is the sum of
their durations, "running" the rest of the total.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import transmuter
from transmuter import cpu

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_models  # noqa: E402  (the ORT session and host-copy helpers)
from make_minilm import PATH as MINILM  # noqa: E402

SEQUENCE_BUCKETS = {"sequence": "pow2"}
BATCH_BUCKETS = {"batch": [1, 2, 4, 8, 16, 32]}


class Compiles:
    """Counts segment compiles and sums their time while attached."""

    def __init__(self):
        self.events: list[dict] = []

    def __enter__(self) -> Compiles:
        transmuter.telemetry.attach(id(self), ["transmuter.segment.compile.stop"], self._take)
        return self

    def __exit__(self, *exc) -> None:
        transmuter.telemetry.detach(id(self))

    def _take(self, event, measurements, metadata) -> None:
        self.events.append({"duration_s": measurements["duration"] / 1e9, **metadata})

    @property
    def seconds(self) -> float:
        return sum(e["duration_s"] for e in self.events)


def encoder_inputs(batch: int, sequence: int, rng) -> dict[str, np.ndarray]:
    shape = (batch, sequence)
    return {
        "input_ids": rng.integers(0, 30522, shape, dtype=np.int64),
        "attention_mask": np.ones(shape, np.int64),
        "token_type_ids": np.zeros(shape, np.int64),
    }


def traffic(model, calls: list[dict], buckets) -> dict:
    """Compile on the first call's shapes, then serve every call; compiles and times."""
    with Compiles() as compiles:
        start = time.perf_counter()
        compiled = transmuter.compile(model, calls[0], buckets=buckets)
        for inputs in calls:
            bench_models.to_host(compiled(inputs))
        total = time.perf_counter() - start
    return {
        "buckets": buckets,
        "compiles": len(compiles.events),
        "total_s": round(total, 2),
        "compiling_s": round(compiles.seconds, 2),
        "running_s": round(total - compiles.seconds, 2),
        "calls": len(calls),
    }


def ort_traffic(path: Path, calls: list[dict]) -> dict:
    start = time.perf_counter()
    session = bench_models.ort_session(path)
    for inputs in calls:
        session.run(None, inputs)
    return {"engine": "onnxruntime", "total_s": round(time.perf_counter() - start, 2)}


LLAMA = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "models" / "llama.onnx"


def optimum_llama():
    import onnx

    proto = onnx.load(LLAMA)
    for value in [*proto.graph.input, *proto.graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == "total_sequence":
                dim.dim_param = "past_sequence + sequence"
    return transmuter.load(proto)


def generate(model, tokens: int, buckets) -> dict:
    """Greedy decoding of `tokens` tokens from a 4-token prompt, a compiled call per step."""
    layers = sorted({n.split(".")[1] for n in model.inputs if n.startswith("past_key_values")})
    spec = model.input_specs["past_key_values.0.key"].shape
    past = {
        f"past_key_values.{i}.{kv}": np.zeros((1, spec[1], 0, spec[3]), np.float32)
        for i in layers
        for kv in ("key", "value")
    }
    ids = np.array([[1, 5, 9, 3]], np.int64)
    compiled, length = None, 0
    with Compiles() as compiles:
        start = time.perf_counter()
        for _ in range(tokens):
            inputs = {
                "input_ids": ids,
                "attention_mask": np.ones((1, length + ids.shape[1]), np.int64),
                "position_ids": np.arange(length, length + ids.shape[1])[None],
                **past,
            }
            if compiled is None:
                compiled = transmuter.compile(model, inputs, buckets=buckets)
            out = compiled(inputs)
            length += ids.shape[1]
            past = {k: np.asarray(out[k.replace("past_key_values", "present")]) for k in past}
            ids = np.asarray(out["logits"])[:, -1:].argmax(-1)
        total = time.perf_counter() - start
    return {
        "buckets": buckets,
        "tokens": tokens,
        "compiles": len(compiles.events),
        "total_s": round(total, 2),
        "compiling_s": round(compiles.seconds, 2),
    }


def split(model, inputs: dict) -> dict:
    """A cold compile of one new shape: where its time goes."""
    with Compiles() as compiles:
        start = time.perf_counter()
        transmuter.compile(model, inputs)
        total = time.perf_counter() - start
    (event,) = compiles.events
    return {
        "nodes": len(model.ir.graph.nodes),
        "trace_s": event["trace_s"],
        "lower_s": event["lower_s"],
        "xla_s": event["xla_s"],
        "compile_total_s": round(total, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not MINILM.exists():
        print(f"{MINILM} is missing: run python bench/make_minilm.py first")
        return 1
    model = transmuter.load(MINILM)
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 129, args.requests)
    sentences = [encoder_inputs(1, int(n), rng) for n in lengths]
    batches = [encoder_inputs(int(b), 128, rng) for b in rng.integers(1, 33, 100)]
    report = {
        "cpu": cpu.describe(),
        "new_shape": [split(model, encoder_inputs(1, n, rng)) for n in (16, 128)],
        "sentences": [
            traffic(model, sentences, None),
            traffic(model, sentences, SEQUENCE_BUCKETS),
            ort_traffic(MINILM, sentences),
        ],
        "batches": [
            traffic(model, batches, None),
            traffic(model, batches, BATCH_BUCKETS),
            ort_traffic(MINILM, batches),
        ],
    }
    llama = optimum_llama()
    report["generation"] = [
        generate(llama, 30, None),
        generate(llama, 30, {"past_sequence": ("multiple", 16)}),
    ]
    rows = sum(next(iter(b.values())).shape[0] for b in batches)
    for row in report["batches"]:
        row["rows_per_s"] = round(rows / row["total_s"], 1)
    for section in ("new_shape", "sentences", "batches", "generation"):
        print(section)
        for row in report[section]:
            print("  " + ", ".join(f"{k}={v}" for k, v in row.items()))
    lengths_median = statistics.median(lengths.tolist())
    print(f"{args.requests} sentences, median length {lengths_median}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
