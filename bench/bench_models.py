"""Time `transmuter.compile`d models against ONNX Runtime on CPU, side by side in one process.

    python bench/make_minilm.py && python bench/bench_models.py
    python bench/bench_models.py --models bert,minilm --repeat 50 --json results.json

Workloads: every fixture in tests/fixtures/models/manifest.json with each of its recorded case
inputs, and the MiniLM-sized BERT from bench/make_minilm.py at batch 1 and batch 32, sequence
128 (skipped with a note when the file is missing). For each workload:

- first call: Transmuter load + compile (tracing and XLA compilation) + one run, and ONNX Runtime
  session creation (default graph optimizations) + one run, each until the outputs are on the host;
- steady state: a few warm-up runs of each, then blocks of runs alternating between the engines
  (Transmuter x BLOCK, ORT x BLOCK, ...), so both see the same machine state, each block opening
  after SETTLE_S idle with an untimed run; the median of each, and their ratio (< 1: Transmuter faster). Blocks, not
  single alternating runs: ORT's worker threads spin for a while after a run returns (its default
  allow_spinning), and a run started right after one pays for that (MiniLM batch 1 measured
  17.5 ms alternating vs 11.9 ms in blocks, ORT unchanged at 10.3 ms), and the idle time lets
  those threads stop before the next block;
- max |Transmuter - ORT| over all outputs, as a sanity check that both computed the same thing.

Both engines use os.cpu_count() threads. Every timed Transmuter call ends with its outputs
converted to numpy, which is what ORT returns, so neither side leaves work pending.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# A CPU-against-CPU comparison unless the caller asks otherwise.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import transmuter  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "models"
MINILM = ROOT / "bench" / ".cache" / "minilm.onnx"
MINILM_SEQ = 128
MINILM_BATCHES = (1, 32)
THREADS = os.cpu_count() or 1
WARMUP = 3
BLOCK = 5  # timed runs of one engine before switching to the other
# Idle time at each switch: ORT's worker threads spin for a while after a run (its default
# allow_spinning) and hold a core the next engine needs; an untimed run alone did not absorb it
# (MobileNet measured 10.6 ms right after ORT's block, 6.8 ms alone).
SETTLE_S = 0.05
MIN_REPEAT, MAX_REPEAT = 10, 200
ROW_BUDGET_S = 3.0  # steady-state time per workload when --repeat is not given
OPTIMIZE: bool | list[str] = True  # transmuter.load's optimize= (--passes)
ORT_PROVIDERS = ["CPUExecutionProvider"]  # bench_cases.py --ort-provider cuda puts CUDA first


@dataclass
class Workload:
    model: str  # the name --models selects on
    case: str
    path: Path
    inputs: dict[str, np.ndarray]


@dataclass
class Result:
    model: str
    case: str
    repeat: int = 0
    transmuter_first_ms: float | None = None
    ort_first_ms: float | None = None
    transmuter_median_ms: float | None = None
    ort_median_ms: float | None = None
    ratio: float | None = None
    max_abs_diff: float | None = None
    transmuter_ms: list[float] = field(default_factory=list)
    ort_ms: list[float] = field(default_factory=list)
    error: str | None = None


# ----------------------------------------------------------------------------------------------
# Workloads
# ----------------------------------------------------------------------------------------------


def fixture_workloads() -> list[Workload]:
    manifest = json.loads((FIXTURES / "manifest.json").read_text())
    workloads = []
    for entry in manifest:
        name = entry["name"]
        with np.load(FIXTURES / f"{name}.npz") as data:
            arrays = {key: data[key] for key in data.files}
        for case in entry["cases"]:
            prefix = f"case{case['index']}/in/"
            inputs = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
            workloads.append(Workload(name, case["description"], FIXTURES / entry["onnx"], inputs))
    return workloads


def minilm_workloads() -> list[Workload]:
    rng = np.random.default_rng(0)
    workloads = []
    for batch in MINILM_BATCHES:
        shape = (batch, MINILM_SEQ)
        inputs = {
            "input_ids": rng.integers(0, 30522, size=shape, dtype=np.int64),
            "attention_mask": np.ones(shape, dtype=np.int64),
            "token_type_ids": np.zeros(shape, dtype=np.int64),
        }
        workloads.append(Workload("minilm", f"batch {batch}, seq {MINILM_SEQ}", MINILM, inputs))
    return workloads


# ----------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------


def ort_session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()  # graph optimizations stay at their default (all)
    options.intra_op_num_threads = THREADS
    return ort.InferenceSession(str(path), options, providers=ORT_PROVIDERS)


def to_host(outputs: Any) -> list[np.ndarray]:
    """Outputs in a flat list of numpy arrays; converting waits for the device."""
    if isinstance(outputs, dict):
        outputs = list(outputs.values())
    flat: list[np.ndarray] = []
    for value in outputs:
        if isinstance(value, (list, tuple)):
            flat.extend(to_host(value))
        else:
            flat.append(np.asarray(value))
    return flat


def max_abs_diff(ours: list[np.ndarray], theirs: list[np.ndarray]) -> float:
    if len(ours) != len(theirs):
        raise ValueError(f"{len(ours)} outputs from Transmuter, {len(theirs)} from ORT")
    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        if a.shape != b.shape:
            raise ValueError(f"output shapes differ: {a.shape} vs {b.shape}")
        if a.size == 0:
            continue
        if a.dtype == object or b.dtype == object:
            worst = max(worst, 0.0 if np.array_equal(a, b) else math.inf)
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        same = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))  # equal infs and NaNs count as 0
        worst = max(worst, float(np.max(np.where(same, 0.0, np.abs(a64 - b64)))))
    return worst


def ms_since(start: int) -> float:
    return (time.perf_counter_ns() - start) / 1e6


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def bench(work: Workload, repeat: int | None) -> Result:
    result = Result(work.model, work.case)
    gc.collect()

    fn = None
    start = time.perf_counter_ns()
    try:
        model = transmuter.load(work.path, optimize=OPTIMIZE)
        fn = transmuter.compile(model, work.inputs)
        ours = to_host(fn(work.inputs))
        result.transmuter_first_ms = ms_since(start)
    except Exception as exc:  # a failing model is reported in the table, not fatal
        result.error = first_line(exc)

    start = time.perf_counter_ns()
    try:
        session = ort_session(work.path)
        theirs = session.run(None, work.inputs)
    except Exception as exc:
        result.error = (
            f"{result.error}; ORT: {first_line(exc)}" if result.error else f"ORT: {first_line(exc)}"
        )
        return result
    result.ort_first_ms = ms_since(start)
    if fn is not None:
        try:
            result.max_abs_diff = max_abs_diff(ours, to_host(theirs))
        except ValueError as exc:
            result.error = f"outputs differ: {exc}"

    def run_ours() -> float:
        if fn is None:  # Transmuter failed: ORT is still timed, for reference
            return math.nan
        start = time.perf_counter_ns()
        to_host(fn(work.inputs))
        return ms_since(start)

    def run_theirs() -> float:
        start = time.perf_counter_ns()
        session.run(None, work.inputs)
        return ms_since(start)

    warm = [(run_ours(), run_theirs()) for _ in range(WARMUP)]
    if repeat is None:
        per_pair_ms = statistics.median(b + (0 if math.isnan(a) else a) for a, b in warm)
        repeat = int(ROW_BUDGET_S * 1e3 / max(per_pair_ms, 1e-3))
        repeat = max(MIN_REPEAT, min(MAX_REPEAT, repeat))
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for start in range(0, repeat, BLOCK):
            runs = min(BLOCK, repeat - start)
            for timings, run in ((result.transmuter_ms, run_ours), (result.ort_ms, run_theirs)):
                time.sleep(SETTLE_S)  # the other engine's threads stop spinning
                run()
                timings.extend(run() for _ in range(runs))
    finally:
        if gc_was_enabled:
            gc.enable()
    result.repeat = repeat
    result.ort_median_ms = statistics.median(result.ort_ms)
    if fn is None:
        result.transmuter_ms = []
    else:
        result.transmuter_median_ms = statistics.median(result.transmuter_ms)
        result.ratio = result.transmuter_median_ms / result.ort_median_ms
    return result


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------

COLUMNS = [
    ("model", 16, "<"),
    ("case", 39, "<"),
    ("T first ms", 11, ">"),
    ("ORT first ms", 12, ">"),
    ("T median ms", 12, ">"),
    ("ORT median ms", 13, ">"),
    ("T/ORT", 6, ">"),
    ("max|diff|", 9, ">"),
    ("runs", 5, ">"),
]


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 100 else f"{value:.0f}"


def row_cells(r: Result) -> list[str]:
    diff = "-" if r.max_abs_diff is None else f"{r.max_abs_diff:.1e}"
    ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
    return [
        r.model,
        r.case,
        fmt_ms(r.transmuter_first_ms),
        fmt_ms(r.ort_first_ms),
        fmt_ms(r.transmuter_median_ms),
        fmt_ms(r.ort_median_ms),
        ratio,
        diff,
        str(r.repeat or "-"),
    ]


def shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def format_row(cells: list[str]) -> str:
    return "  ".join(
        f"{c:{align}{width}}" for c, (_, width, align) in zip(cells, COLUMNS, strict=True)
    )


def environment() -> dict[str, Any]:
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {THREADS} cores ({platform.processor() or platform.system()})",
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jax_backend": jax.default_backend(),
        "onnxruntime": ort.__version__,
        "threads": THREADS,
        "load_average_1min": os.getloadavg()[0],  # other work on the machine skews timings
        "passes": OPTIMIZE,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", help="comma-separated model names (fixture names, minilm); default: all"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        help=f"timed runs per engine and workload (default: about {ROW_BUDGET_S:g} s per "
        f"workload, {MIN_REPEAT} to {MAX_REPEAT} runs)",
    )
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument(
        "--passes",
        help="graph passes Transmuter runs at load: comma-separated names (transmuter.ir.passes"
        ".PASSES), 'none', or by default its default pipeline",
    )
    args = parser.parse_args(argv)
    global OPTIMIZE
    if args.passes is not None:
        names = [n.strip() for n in args.passes.split(",") if n.strip()]
        OPTIMIZE = False if names == ["none"] else names
    if args.repeat is not None and args.repeat < 1:
        parser.error("--repeat must be at least 1")

    workloads = fixture_workloads()
    notes = []
    if MINILM.exists():
        workloads += minilm_workloads()
    else:
        notes.append(
            f"minilm skipped: {MINILM.relative_to(ROOT)} is missing; run bench/make_minilm.py"
        )
    if args.models:
        wanted = {name.strip() for name in args.models.split(",") if name.strip()}
        known = {w.model for w in workloads} | {"minilm"}
        unknown = sorted(wanted - known)
        if unknown:
            parser.error(f"unknown models {unknown}; known: {', '.join(sorted(known))}")
        workloads = [w for w in workloads if w.model in wanted]

    env = environment()
    print(
        f"Transmuter vs ONNX Runtime  {env['date']}  {env['machine']}  jax {env['jax']} "
        f"({env['jax_backend']})  onnxruntime {env['onnxruntime']}  threads {THREADS}  "
        f"load average {env['load_average_1min']:.2f}  passes {env['passes']}"
    )
    print(
        "T = Transmuter. first = load/compile or session creation + one run. "
        "T/ORT < 1: Transmuter faster."
    )
    for note in notes:
        print(note)
    print(format_row([name for name, _, _ in COLUMNS]))
    print(format_row(["-" * width for _, width, _ in COLUMNS]))

    results = []
    for work in workloads:
        result = bench(work, args.repeat)
        results.append(result)
        print(format_row(row_cells(result)), flush=True)
        if result.error:
            print(f"    {shorten(result.error, 160)}", flush=True)

    ratios = [r.ratio for r in results if r.ratio is not None]
    if ratios:
        geomean = math.exp(statistics.fmean(math.log(x) for x in ratios))
        print(f"\ngeometric mean T/ORT over {len(ratios)} workloads: {geomean:.2f}")
    failed = [r for r in results if r.error]
    if failed:
        models = ", ".join(dict.fromkeys(r.model for r in failed))
        print(f"{len(failed)} of {len(results)} workloads failed (errors above): {models}")

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"environment": env, "results": [asdict(r) for r in results]}, indent=1)
        )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
