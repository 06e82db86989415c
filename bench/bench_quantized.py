"""Time the MiniLM-sized BERT quantized to int8 and to 4-bit weights, in Transmuter and ORT.

    python bench/make_minilm.py && python bench/bench_quantized.py
    python bench/bench_quantized.py --batches 1 --repeat 20 --no-rss --json results.json

Models, all from bench/.cache/minilm.onnx (bench/make_minilm.py) and written next to it when
missing (--force rewrites them):

- fp32: the export itself;
- int8: onnxruntime.quantization.quantize_dynamic, QInt8 weights (MatMulInteger with
  DynamicQuantizeLinear activations; the word embedding through DequantizeLinear);
- 4-bit: MatMulNBitsQuantizer, symmetric, block 32, accuracy_level 0 (ORT dequantizes the
  weights and multiplies in float32, as Transmuter does), MatMul and Gather (MatMulNBits,
  GatherBlockQuantized for the word embedding);
- 4-bit acc4: the same file with accuracy_level 4, which lets ORT quantize activations to int8
  (what onnxruntime-genai's builder writes for CPU); timed in ORT only, for reference.

Each (model, batch) row is timed with bench_models.bench: Transmuter load + compile + one run
against ORT session creation (default graph optimizations) + one run, then blocks of runs
alternating between Transmuter and ORT with the same number of threads; medians, T/ORT, and each engine's median over
its own fp32 median on that batch. Memory: file size, the weights Transmuter holds (params and
device constants), and the peak resident memory of a fresh process that loads, compiles and runs
the model once at batch 1 (one process per engine and model, Linux /proc; --no-rss skips them).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_models  # noqa: E402  (sets JAX_PLATFORMS=cpu before jax is imported)
from bench_models import MINILM, MINILM_SEQ, Result, Workload  # noqa: E402

import transmuter  # noqa: E402

CACHE = MINILM.parent
MODELS = {
    "fp32": MINILM,
    "int8": CACHE / "minilm_int8.onnx",
    "4-bit": CACHE / "minilm_q4.onnx",
}
ACC4 = CACHE / "minilm_q4_acc4.onnx"
BATCHES = (1, 32)
VOCAB = 30522


def make_quantized(force: bool) -> None:
    """Write the int8, 4-bit and 4-bit accuracy_level 4 files next to the fp32 export."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.disable(logging.WARNING)  # the quantizers log a line per tensor
    if force or not MODELS["int8"].exists():
        quantize_dynamic(MINILM, MODELS["int8"], weight_type=QuantType.QInt8)
    if force or not MODELS["4-bit"].exists():
        quantizer = MatMulNBitsQuantizer(
            onnx.load(MINILM),
            bits=4,
            block_size=32,
            is_symmetric=True,
            accuracy_level=0,
            op_types_to_quantize=("MatMul", "Gather"),
        )
        quantizer.process()
        onnx.save(quantizer.model.model, MODELS["4-bit"])
    if force or not ACC4.exists():
        model = onnx.load(MODELS["4-bit"])
        for node in model.graph.node:
            if node.op_type == "MatMulNBits":
                kept = [a for a in node.attribute if a.name != "accuracy_level"]
                del node.attribute[:]
                node.attribute.extend([*kept, onnx.helper.make_attribute("accuracy_level", 4)])
        onnx.save(model, ACC4)
    logging.disable(logging.NOTSET)


def inputs_for(batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch)
    shape = (batch, MINILM_SEQ)
    return {
        "input_ids": rng.integers(0, VOCAB, size=shape, dtype=np.int64),
        "attention_mask": np.ones(shape, dtype=np.int64),
        "token_type_ids": np.zeros(shape, dtype=np.int64),
    }


def ort_only(work: Workload, repeat: int) -> Result:
    """ORT alone, with bench_models' protocol: session + first run, warm-up, median of runs."""
    result = Result(work.model, work.case, repeat=repeat)
    start = time.perf_counter_ns()
    session = bench_models.ort_session(work.path)
    session.run(None, work.inputs)
    result.ort_first_ms = bench_models.ms_since(start)
    for _ in range(bench_models.WARMUP):
        session.run(None, work.inputs)
    for _ in range(repeat):
        start = time.perf_counter_ns()
        session.run(None, work.inputs)
        result.ort_ms.append(bench_models.ms_since(start))
    result.ort_median_ms = statistics.median(result.ort_ms)
    return result


def weight_bytes(path: Path) -> int:
    """Bytes of the arrays Transmuter passes to its compiled programs: params + device constants."""
    model = transmuter.load(path)
    arrays = [*model.params.values(), *model.device_constants.values()]
    return sum(a.nbytes for a in arrays)


def peak_rss_child(path: str, engine: str) -> None:
    """In a fresh process: load, compile (or open a session) and run once; print peak RSS MiB."""
    inputs = inputs_for(1)
    if engine == "transmuter":
        compiled = transmuter.compile(transmuter.load(path), inputs)
        bench_models.to_host(compiled(inputs))
    elif engine == "ort":
        bench_models.ort_session(Path(path)).run(None, inputs)
    # engine "none": the interpreter with jax, transmuter and onnxruntime imported, nothing run
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over from the parent through
    # fork and exec, so a child would report the benchmark process's own peak.
    status = Path("/proc/self/status").read_text().splitlines()
    kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    print(json.dumps(kib / 1024))


def peak_rss(path: Path | None, engine: str) -> float:
    command = [sys.executable, __file__, "--rss-child", str(path or ""), engine]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


COLUMNS = [
    ("model", 10, "<"),
    ("batch", 5, ">"),
    ("T first ms", 10, ">"),
    ("ORT first ms", 12, ">"),
    ("T median ms", 11, ">"),
    ("ORT median ms", 13, ">"),
    ("T/ORT", 6, ">"),
    ("T/T fp32", 8, ">"),
    ("ORT/ORT fp32", 12, ">"),
    ("max|diff|", 9, ">"),
    ("runs", 4, ">"),
]


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}"


def row(r: Result, batch: int, fp32: Result) -> str:
    cells = [
        r.model,
        str(batch),
        bench_models.fmt_ms(r.transmuter_first_ms),
        bench_models.fmt_ms(r.ort_first_ms),
        bench_models.fmt_ms(r.transmuter_median_ms),
        bench_models.fmt_ms(r.ort_median_ms),
        ratio(r.transmuter_median_ms, r.ort_median_ms),
        ratio(r.transmuter_median_ms, fp32.transmuter_median_ms),
        ratio(r.ort_median_ms, fp32.ort_median_ms),
        "-" if r.max_abs_diff is None else f"{r.max_abs_diff:.1e}",
        str(r.repeat or "-"),
    ]
    return "  ".join(f"{c:{a}{w}}" for c, (_, w, a) in zip(cells, COLUMNS, strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="e.g. 1,32")
    parser.add_argument("--repeat", type=int, help="timed runs per row (default: ~3 s per row)")
    parser.add_argument("--force", action="store_true", help="rewrite the quantized files")
    parser.add_argument("--no-rss", action="store_true", help="skip the peak-memory processes")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--rss-child", nargs=2, metavar=("PATH", "ENGINE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_child:
        peak_rss_child(*args.rss_child)
        return 0
    if not MINILM.exists():
        print(f"{MINILM} is missing: run python bench/make_minilm.py first")
        return 2
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    make_quantized(args.force)

    env = bench_models.environment()
    print(
        f"MiniLM quantized: Transmuter vs ONNX Runtime  {env['date']}  {env['machine']}  "
        f"jax {env['jax']}  onnxruntime {env['onnxruntime']}  threads {env['threads']}  "
        f"load average {env['load_average_1min']:.2f}"
    )
    print(f"sequence {MINILM_SEQ}; T = Transmuter compiled; ratios < 1: the numerator is faster")
    print("  ".join(f"{name:{a}{w}}" for name, w, a in COLUMNS))
    results = []
    for batch in batches:
        inputs = inputs_for(batch)
        fp32 = None
        for name, path in MODELS.items():
            result = bench_models.bench(Workload(name, f"batch {batch}", path, inputs), args.repeat)
            if name == "fp32":
                fp32 = result
            results.append((batch, result))
            print(row(result, batch, fp32), flush=True)
            if result.error:
                print(f"    {result.error}", flush=True)
        repeat = args.repeat or len(results[-1][1].ort_ms)  # as many runs as the 4-bit row
        result = ort_only(Workload("4-bit acc4", f"batch {batch}", ACC4, inputs), repeat)
        results.append((batch, result))
        print(row(result, batch, fp32), flush=True)

    print(
        f"\n{'model':<10} {'file MiB':>9} {'T weights MiB':>14} {'T peak RSS MiB':>15} {'ORT peak RSS MiB':>17}"
    )
    memory = {}
    baseline = None if args.no_rss else peak_rss(None, "none")
    for name, path in MODELS.items():
        entry = {
            "file_bytes": path.stat().st_size,
            "transmuter_weight_bytes": weight_bytes(path),
        }
        if not args.no_rss:
            entry["transmuter_peak_rss_mib"] = peak_rss(path, "transmuter")
            entry["ort_peak_rss_mib"] = peak_rss(path, "ort")
        memory[name] = entry
        rss = [entry.get(k) for k in ("transmuter_peak_rss_mib", "ort_peak_rss_mib")]
        print(
            f"{name:<10} {entry['file_bytes'] / 2**20:>9.1f} "
            f"{entry['transmuter_weight_bytes'] / 2**20:>14.1f} "
            + " ".join(f"{'-' if v is None else f'{v:.0f}':>{w}}" for v, w in zip(rss, (15, 17)))
        )
    if baseline is not None:
        print(f"(a process that only imports jax, transmuter and onnxruntime: {baseline:.0f} MiB)")

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        rows = [{"batch": b, **asdict(r)} for b, r in results]
        payload = {
            "environment": env,
            "results": rows,
            "memory": memory,
            "baseline_rss_mib": baseline,
        }
        args.json.write_text(json.dumps(payload, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
