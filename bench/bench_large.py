"""Large graphs: time to the first result and per call, Transmuter against ONNX Runtime.

    /work/torch-venv/bin/python tests/fixtures/make_large.py   # the three exports (once)
    python bench/bench_large.py                 # every workload, each in a fresh process
    python bench/bench_large.py --only chain4000,detector --profile   # + cProfile of our part

Workloads: `chain1000` / `chain4000` (synthetic, made here with onnx.helper: blocks of MatMul,
Add, Relu and a Shape -> Gather -> Concat -> Reshape, 8 nodes a block), and `encoder24`,
`decoder32` (and the same with 6 and 8 layers, `encoder6`, `decoder8`), `detector` from
bench/.cache/large/ (tests/fixtures/make_large.py). The detector
runs twice: its text inputs as data (a NonZero on input_ids breaks the graph) and as
`static_inputs` (one program).

Per workload, in a process of its own (JAX's caches start empty): load s, compile s (the
`transmuter.compile` call, which runs the example once) split into trace (our graph walk, with
host evaluation and JAX's tracing of each op), lower (JAX to StableHLO) and XLA, from
`transmuter.segment.compile.stop`; "ours" = load + compile - XLA, and per node; the first
result (load + compile + one call, outputs as numpy); `--passes` picks load's graph passes
(`default`, `none`, or names: `fold,cse,layers,dce`); the median call; ONNX Runtime's session +
first run and median run; max|diff| against ORT.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "bench" / ".cache" / "large"
STATIC = ("input_ids", "token_type_ids", "attention_mask")
WORKLOADS = [
    "chain1000",
    "chain4000",
    "encoder6",
    "encoder24",
    "decoder8",
    "decoder32",
    "detector",
    "detector-static",
]


def chain(nodes: int):
    """A synthetic graph of `nodes` nodes: x [4, 16] through blocks of MatMul (a 16x16 param),
    Add (a host-constant bias), Relu, and a Reshape to Shape(x)[0] x 16 computed in the graph."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    blocks = nodes // 8
    made, inits = [], []
    x = "x"
    minus = numpy_helper.from_array(np.array([16], np.int64), "sixteen")
    zero = numpy_helper.from_array(np.array(0, np.int64), "zero")
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes0")
    inits += [minus, zero, axes]
    for b in range(blocks):
        w = numpy_helper.from_array((rng.standard_normal((16, 16)) / 4).astype(np.float32), f"w{b}")
        bias = numpy_helper.from_array((rng.standard_normal(16) / 4).astype(np.float32), f"b{b}")
        inits += [w, bias]
        p = f"n{b}_"
        made += [
            helper.make_node("MatMul", [x, f"w{b}"], [p + "mm"]),
            helper.make_node("Add", [p + "mm", f"b{b}"], [p + "add"]),
            helper.make_node("Relu", [p + "add"], [p + "relu"]),
            helper.make_node("Shape", [p + "relu"], [p + "shape"]),
            helper.make_node("Gather", [p + "shape", "zero"], [p + "rows"], axis=0),
            helper.make_node("Unsqueeze", [p + "rows", "axes0"], [p + "rows1"]),
            helper.make_node("Concat", [p + "rows1", "sixteen"], [p + "target"], axis=0),
            helper.make_node("Reshape", [p + "relu", p + "target"], [p + "out"]),
        ]
        x = p + "out"
    graph = helper.make_graph(
        made,
        f"chain{nodes}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", 16])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    inputs = {"x": rng.standard_normal((4, 16)).astype(np.float32)}
    return model.SerializeToString(), inputs


def workload(name: str):
    """(model bytes or path, inputs, static input names)."""
    if name.startswith("chain"):
        data, inputs = chain(int(name[5:]))
        return data, inputs, ()
    base = name.split("-")[0]
    path = CACHE / f"{base}.onnx"
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: run /work/torch-venv/bin/python tests/fixtures/make_large.py"
        )
    arrays = np.load(CACHE / f"{base}.npz")
    inputs = {k[3:]: arrays[k] for k in arrays.files if k.startswith("in/")}
    static = STATIC if name.endswith("-static") else ()
    return str(path), inputs, static


def one(name: str, repeat: int, profile: bool, passes: list[str] | bool = True) -> dict:
    """Time one workload in this process."""
    source, inputs, static = workload(name)
    import onnxruntime as ort

    import transmuter
    from transmuter import telemetry

    segments, breaks = [], []
    telemetry.attach(
        "bench",
        ["transmuter.segment.compile.stop", "transmuter.break.stop"],
        lambda e, m, md: (segments if "segment" in e else breaks).append((m, md)),
    )
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    began = time.perf_counter()
    model = transmuter.load(source, optimize=passes)
    loaded = time.perf_counter()
    compiled = transmuter.compile(
        model, inputs, static_inputs={k: inputs[k] for k in static} or None
    )
    compiled_at = time.perf_counter()
    first = {k: np.asarray(v) for k, v in compiled(inputs).items()}
    first_at = time.perf_counter()
    if profiler is not None:
        profiler.disable()
        import pstats

        out = CACHE / f"profile-{name}.txt"
        with open(out, "w") as f:
            pstats.Stats(profiler, stream=f).sort_stats("cumulative").print_stats(60)
            pstats.Stats(profiler, stream=f).sort_stats("tottime").print_stats(40)
    nodes = len(model.plan.steps)
    import onnx

    proto = onnx.load(source) if isinstance(source, str) else onnx.load_from_string(source)
    file_nodes = len(proto.graph.node)
    trace = sum(md["trace_s"] for _, md in segments)
    lower = sum(md["lower_s"] for _, md in segments)
    xla = sum(md["xla_s"] for _, md in segments)
    seg_total = sum(m["duration"] for m, _ in segments) / 1e9
    load_s, compile_s = loaded - began, compiled_at - loaded
    ours = load_s + compile_s - xla

    def timed(fn, runs):
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return float(np.median(times))

    call = timed(lambda: [np.asarray(v) for v in compiled(inputs).values()], repeat)
    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count()
    t = time.perf_counter()
    session = ort.InferenceSession(
        source if isinstance(source, str) else source, options, providers=["CPUExecutionProvider"]
    )
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))
    ort_first = time.perf_counter() - t
    ort_call = timed(lambda: session.run(None, inputs), repeat)
    diff = 0.0
    for k, ref in want.items():
        got = first[k]
        both = np.isfinite(ref) & np.isfinite(got)
        if not np.array_equal(np.isfinite(ref), np.isfinite(got)):
            diff = float("inf")
        elif both.any():
            diff = max(diff, float(np.abs(got[both].astype(float) - ref[both]).max()))
    return {
        "name": name,
        "nodes": nodes,
        "file_nodes": file_nodes,
        "segments": len(compiled.segments),
        "compiled_segments": sum(1 for s in compiled.segments if s[2]),
        "breaks": len(breaks),
        "load_s": load_s,
        "compile_s": compile_s,
        "trace_s": trace,
        "lower_s": lower,
        "xla_s": xla,
        "other_s": compile_s - seg_total,
        "ours_s": ours,
        "ours_ms_per_node": 1e3 * ours / file_nodes,
        "first_s": first_at - began,
        "call_ms": 1e3 * call,
        "ort_first_s": ort_first,
        "ort_call_ms": 1e3 * ort_call,
        "max_diff": diff,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(WORKLOADS))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--profile", action="store_true", help="cProfile load + compile")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument(
        "--passes", default="default", help='graph passes: "default", "none" or names, "a,b"'
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        passes = {"default": True, "none": False}.get(args.passes) or args.passes.split(",")
        print("RESULT " + json.dumps(one(args.one, args.repeat, args.profile, passes)))
        return
    rows = []
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    for name in args.only.split(","):
        command = [sys.executable, __file__, "--one", name, "--repeat", str(args.repeat)]
        command += ["--passes", args.passes]
        done = subprocess.run(
            command + (["--profile"] if args.profile else []),
            capture_output=True,
            text=True,
            env=env,
        )
        line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
        if not line:
            print(f"{name}: failed\n{done.stderr[-2000:]}")
            continue
        rows.append(json.loads(line[0][7:]))
    print(
        "| workload | file nodes | nodes | segments (compiled) | load s | trace s | lower s | "
        "XLA s | ours s | ours ms/file node | first s | ORT first s | call ms | ORT call ms | "
        "max\\|diff\\| |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        print(
            f"| {r['name']} | {r['file_nodes']} | {r['nodes']} | {r['segments']} ({r['compiled_segments']}) | "
            f"{r['load_s']:.2f} | {r['trace_s']:.2f} | {r['lower_s']:.2f} | {r['xla_s']:.2f} | "
            f"{r['ours_s']:.2f} | {r['ours_ms_per_node']:.3f} | {r['first_s']:.2f} | "
            f"{r['ort_first_s']:.2f} | {r['call_ms']:.2f} | {r['ort_call_ms']:.2f} | "
            f"{r['max_diff']:.1e} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
