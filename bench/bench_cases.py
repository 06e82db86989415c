"""The optimizer's benchmark: real-sized models against ONNX Runtime, and MiniLM against plain JAX.

    python bench/make_minilm.py && /path/to/torch/python bench/make_cases.py
    python bench/bench_cases.py                      # --cases resnet50,minilm --passes none
    python bench/bench_cases.py --repeat 20 --json bench/.cache/cases.json

Cases (random weights; the files are made by bench/make_minilm.py, bench/make_cases.py and, for
the quantized MiniLM, bench_quantized.make_quantized; a missing file skips its case with a note):

- minilm at batch 1 and 32, sequence 128, also timed against bench/jax_bert.py, the same weights
  as a hand-written JAX BERT jitted whole (T/JAX: what the lowering costs over plain XLA);
- minilm_int8 and minilm_q4 (MatMulInteger and MatMulNBits) at batch 1, and minilm_q4 once more
  with the `dequantize` pass (the 4-bit weights held as float32 from load: 8x their memory);
- minilm_fp16: the export with float16 weights and float32 inputs and outputs
  (onnxruntime.transformers.float16, keep_io_types; written here when missing), at batch 1;
- resnet50, mobilenet, vit_small at 224 px, yolo at 320 px, audio1d on 1 s of 16 kHz audio, and
  gpt2_step: one token of a GPT-2-small-shaped decoder with 128 cached positions, batch 1.

Each case is timed with bench_models.bench (load + compile + one run against ORT session creation
+ one run; then blocks of runs alternating between the engines; medians), the MiniLM cases once
more in blocks alternating Transmuter with the JAX BERT. Printed: a row per case and the
geometric mean of T/ORT.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_models  # noqa: E402  (sets JAX_PLATFORMS=cpu before jax is imported)
import jax_bert  # noqa: E402
from bench_models import MINILM, Result, Workload  # noqa: E402

import transmuter  # noqa: E402
from transmuter.ir import passes  # noqa: E402

CACHE = MINILM.parent
CASES = CACHE / "cases"
WEIGHTS = CACHE / "minilm_weights.npz"
FP16 = CACHE / "minilm_fp16.onnx"
SEQ = 128
PAST = 128  # gpt2_step's cached positions
GPT2_LAYERS, GPT2_HEADS, GPT2_HEAD = 12, 12, 64
# Cases that load with other passes than --passes gives.
CASE_PASSES = {"minilm_q4_dequantized": [*passes.DEFAULT, "dequantize"]}


def minilm_inputs(batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    shape = (batch, SEQ)
    return {
        "input_ids": rng.integers(0, 30522, size=shape, dtype=np.int64),
        "attention_mask": np.ones(shape, dtype=np.int64),
        "token_type_ids": np.zeros(shape, dtype=np.int64),
    }


def image(size: int, name: str = "pixel_values") -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {name: rng.standard_normal((1, 3, size, size), dtype=np.float32)}


def audio() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"input_values": rng.standard_normal((1, 16000), dtype=np.float32)}


def gpt2_step() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    inputs = {
        "input_ids": rng.integers(0, 50257, size=(1, 1), dtype=np.int64),
        "position_ids": np.full((1, 1), PAST, dtype=np.int64),
        "attention_mask": np.zeros((1, 1, 1, PAST + 1), dtype=np.float32),
    }
    cache = (1, GPT2_HEADS, PAST, GPT2_HEAD)
    for i in range(GPT2_LAYERS):
        inputs[f"past_key_{i}"] = rng.standard_normal(cache, dtype=np.float32)
        inputs[f"past_value_{i}"] = rng.standard_normal(cache, dtype=np.float32)
    return inputs


def workloads() -> list[Workload]:
    return [
        Workload("minilm", "batch 1, seq 128", MINILM, minilm_inputs(1)),
        Workload("minilm", "batch 32, seq 128", MINILM, minilm_inputs(32)),
        Workload("minilm_int8", "batch 1, seq 128", CACHE / "minilm_int8.onnx", minilm_inputs(1)),
        Workload("minilm_q4", "batch 1, seq 128", CACHE / "minilm_q4.onnx", minilm_inputs(1)),
        Workload(
            "minilm_q4_dequantized", "batch 1, seq 128", CACHE / "minilm_q4.onnx", minilm_inputs(1)
        ),
        Workload("minilm_fp16", "batch 1, seq 128", FP16, minilm_inputs(1)),
        Workload("resnet50", "batch 1, 224x224", CASES / "resnet50.onnx", image(224)),
        Workload("mobilenet", "batch 1, 224x224", CASES / "mobilenet.onnx", image(224)),
        Workload("yolo", "batch 1, 320x320", CASES / "yolo.onnx", image(320, "images")),
        Workload("vit_small", "batch 1, 224x224", CASES / "vit_small.onnx", image(224)),
        Workload("audio1d", "batch 1, 16000 samples", CASES / "audio1d.onnx", audio()),
        Workload(
            "gpt2_step", f"batch 1, 1 token, past {PAST}", CASES / "gpt2_step.onnx", gpt2_step()
        ),
    ]


def make_fp16() -> None:
    """minilm.onnx with float16 weights, as fp16 exports store them (inputs and outputs kept)."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    onnx.save(convert_float_to_float16(onnx.load(MINILM), keep_io_types=True), FP16)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - start) / 1e6


def against_jax(work: Workload, repeat: int) -> tuple[float, float, float, float]:
    """(JAX BERT first ms, its median, Transmuter's median, max|diff|), in alternating blocks."""
    start = time.perf_counter_ns()
    reference = jax_bert.compiled(WEIGHTS)
    inputs = [work.inputs[name] for name in ("input_ids", "attention_mask", "token_type_ids")]
    expected = np.asarray(reference(*inputs))
    first = (time.perf_counter_ns() - start) / 1e6
    fn = transmuter.compile(transmuter.load(work.path, optimize=bench_models.OPTIMIZE), work.inputs)
    diff = float(np.abs(bench_models.to_host(fn(work.inputs))[0] - expected).max())

    runs: dict[str, list[float]] = {"jax": [], "ours": []}
    engines = {
        "jax": lambda: np.asarray(reference(*inputs)),
        "ours": lambda: bench_models.to_host(fn(work.inputs)),
    }
    for _ in range(bench_models.WARMUP):
        for run in engines.values():
            run()
    for done in range(0, repeat, bench_models.BLOCK):
        for name, run in engines.items():
            run()
            runs[name].extend(timed(run) for _ in range(min(bench_models.BLOCK, repeat - done)))
    return first, statistics.median(runs["jax"]), statistics.median(runs["ours"]), diff


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", help="comma-separated case names; default: all")
    parser.add_argument("--repeat", type=int, help="timed runs per engine (default: ~3 s a case)")
    parser.add_argument("--passes", help="as bench_models.py: names, 'none', default pipeline")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument(
        "--ort-provider",
        choices=("cpu", "cuda"),
        default="cpu",
        help="ONNX Runtime's execution provider (cuda: for a GPU run, bench/gpu.sh)",
    )
    args = parser.parse_args(argv)
    if args.ort_provider == "cuda":
        bench_models.ORT_PROVIDERS = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    if args.passes is not None:
        names = [n.strip() for n in args.passes.split(",") if n.strip()]
        bench_models.OPTIMIZE = False if names == ["none"] else names

    todo = workloads()
    if args.cases:
        wanted = {name.strip() for name in args.cases.split(",")}
        unknown = wanted - {w.model for w in todo}
        if unknown:
            parser.error(f"unknown cases {sorted(unknown)}")
        todo = [w for w in todo if w.model in wanted]
    if any(w.model.startswith(("minilm_int8", "minilm_q4")) for w in todo) and MINILM.exists():
        import bench_quantized

        bench_quantized.make_quantized(force=False)
    if any(w.model == "minilm_fp16" for w in todo) and MINILM.exists() and not FP16.exists():
        make_fp16()

    env = bench_models.environment()
    print(
        f"{env['date']}  {env['machine']}  jax {env['jax']}  onnxruntime {env['onnxruntime']}  "
        f"threads {env['threads']}  load average {env['load_average_1min']:.2f}  "
        f"passes {env['passes']}  jax on {env['jax_backend']}  ORT {args.ort_provider}"
    )
    header = (
        "| case | workload | T first ms | ORT first ms | T ms | ORT ms | T/ORT | max\\|diff\\| |"
    )
    print(header + " JAX ms | T/JAX |")
    print("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    rows = []
    for work in todo:
        if not work.path.exists():
            print(f"| {work.model} | {work.case} | skipped: {work.path.name} is missing |")
            continue
        given = bench_models.OPTIMIZE
        bench_models.OPTIMIZE = CASE_PASSES.get(work.model, given)
        result: Result = bench_models.bench(work, args.repeat)
        bench_models.OPTIMIZE = given
        row = asdict(result)
        jax_cells = ["-", "-"]
        if work.model == "minilm" and WEIGHTS.exists() and result.error is None:
            first, jax_ms, ours_ms, diff = against_jax(work, result.repeat)
            row.update(jax_first_ms=first, jax_ms=jax_ms, ours_vs_jax_ms=ours_ms, jax_diff=diff)
            jax_cells = [bench_models.fmt_ms(jax_ms), f"{ours_ms / jax_ms:.2f}"]
        rows.append(row)
        cells = bench_models.row_cells(result)[:-1] + jax_cells
        print("| " + " | ".join(cells) + " |", flush=True)
        if result.error:
            print(f"    {bench_models.shorten(result.error, 160)}", flush=True)

    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    if ratios:
        print(f"\ngeometric mean T/ORT over {len(ratios)} cases: {geomean(ratios):.2f}")
    if args.json:
        args.json.write_text(json.dumps({"environment": env, "results": rows}, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
