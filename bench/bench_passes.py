"""Each graph pass's effect on one model, measured in one process: the model loaded once per
pass configuration, all configurations and ONNX Runtime timed in alternating blocks (as
bench_models.py does), so that every configuration sees the same machine state.

    python bench/bench_passes.py                               # MiniLM b1 and b32, seq 128
    python bench/bench_passes.py --model tests/fixtures/models/resnet.onnx --configs none,default

Configurations: `none` (optimize=False), `default` (transmuter.ir.passes.DEFAULT), and
`+name` / `-name` (the default pipeline with a pass added or removed); --configs picks them.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")


sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_models  # noqa: E402

import transmuter  # noqa: E402
from transmuter.ir import passes  # noqa: E402


def optimize_option(config: str):
    if config == "none":
        return False
    if config == "default":
        return list(passes.DEFAULT)
    names = list(passes.DEFAULT)
    for part in config.split(","):
        sign, name = part[0], part[1:]
        if sign == "+" and name not in names:
            names.append(name)
        elif sign == "-" and name in names:
            names.remove(name)
        elif sign not in "+-":
            names = [n.strip() for n in config.split(",")]
            break
    return names


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=bench_models.MINILM)
    parser.add_argument("--batches", default="1,32", help="MiniLM batches (seq 128)")
    parser.add_argument("--configs", default="none;default;+qkv;+attention;+qkv,+attention")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per configuration")
    args = parser.parse_args(argv)
    configs = list(
        dict.fromkeys(c.strip() for c in args.configs.split(";" if ";" in args.configs else ","))
    )
    # "+qkv,+attention" in --configs means two configurations; "+qkv+attention" is not parsed.
    if args.model == bench_models.MINILM:
        workloads = [w for w in bench_models.minilm_workloads()
                     if w.case.split(",")[0].split()[1] in args.batches.split(",")]  # fmt: skip
    else:
        model = args.model.resolve()
        workloads = [w for w in bench_models.fixture_workloads() if w.path.resolve() == model]
    print(f"{args.model}  load average {os.getloadavg()[0]:.2f}  configs {configs}")
    for work in workloads:
        session = bench_models.ort_session(work.path)
        theirs = bench_models.to_host(session.run(None, work.inputs))
        runners = {}
        for config in configs:
            start = time.perf_counter()
            model = transmuter.load(work.path, optimize=optimize_option(config))
            fn = transmuter.compile(model, work.inputs)
            ours = bench_models.to_host(fn(work.inputs))
            first = (time.perf_counter() - start) * 1e3
            diff = bench_models.max_abs_diff(ours, theirs)
            runners[config] = (fn, first, diff, len(model.ir.graph.nodes))
        times = {c: [] for c in [*configs, "ort"]}
        feeds = work.inputs
        calls = {
            c: (lambda fn=fn, feeds=feeds: bench_models.to_host(fn(feeds)))
            for c, (fn, *_) in runners.items()
        }
        calls["ort"] = lambda session=session, feeds=feeds: session.run(None, feeds)
        gc.disable()
        try:
            for start in range(0, args.repeat, bench_models.BLOCK):
                for config, call in calls.items():
                    call()
                    for _ in range(min(bench_models.BLOCK, args.repeat - start)):
                        began = time.perf_counter_ns()
                        call()
                        times[config].append((time.perf_counter_ns() - began) / 1e6)
        finally:
            gc.enable()
        ort_ms = statistics.median(times["ort"])
        base = statistics.median(times[configs[0]])
        print(
            f"\n{work.model} {work.case}  (ORT {ort_ms:.2f} ms; load average {os.getloadavg()[0]:.2f})"
        )
        print(
            f"{'config':<28} {'nodes':>6} {'first ms':>9} {'median ms':>10} {'vs ' + configs[0]:>10} {'T/ORT':>6} {'max|diff|':>9}"
        )
        for config, (_, first, diff, nodes) in runners.items():
            ms = statistics.median(times[config])
            print(
                f"{config:<28} {nodes:6d} {first:9.0f} {ms:10.2f} {ms / base:10.3f} {ms / ort_ms:6.2f} {diff:9.1e}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
