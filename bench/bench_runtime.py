"""Runtime overheads: per-call cost of a compiled model on a cache hit against calling the same
jitted JAX function directly, the cost of a telemetry event with no handler, and cold versus
persistent-disk-cache compile time of the MiniLM-sized model.

    python bench/bench_runtime.py [--repeat 200] [--skip-disk]

The disk-cache part needs bench/.cache/minilm.onnx (python bench/make_minilm.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import jax
import numpy as np

import transmuter
from transmuter import telemetry
from transmuter.runtime import x64_scope
from transmuter.runtime.xla_options import compiler_options

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "tests" / "fixtures" / "models"


def fixture_inputs(name: str, case: int = 0) -> dict[str, np.ndarray]:
    stored = np.load(FIXTURES / f"{name}.npz")
    prefix = f"case{case}/in/"
    return {k[len(prefix) :]: stored[k] for k in stored if k.startswith(prefix)}


def alternating_us(fns: dict, repeat: int, block: int = 20) -> dict[str, float]:
    """Median microseconds of each function, timed in alternating blocks of `block` calls so
    that all of them see the same machine state."""
    for fn in fns.values():
        for _ in range(10):
            fn()
    times = {label: [] for label in fns}
    for _ in range(max(1, repeat // block)):
        for label, fn in fns.items():
            for _ in range(block):
                start = time.perf_counter()
                fn()
                times[label].append(time.perf_counter() - start)
    return {label: statistics.median(t) * 1e6 for label, t in times.items()}


def call_overhead(name: str, repeat: int) -> dict:
    """transmuter.compile's callable vs the same program as a plain jitted function."""
    model = transmuter.load(FIXTURES / f"{name}.onnx")
    inputs = fixture_inputs(name)
    compiled = transmuter.compile(model, inputs)
    other = fixture_inputs(name, 1)
    compiled(other)  # a second signature: its calls go through the segment cache

    def forward(params, x):
        return transmuter.run(model, x, params=params)

    with x64_scope():
        lowered = jax.jit(forward).lower(model.params, inputs)
    jitted = jax.jit(forward, compiler_options=compiler_options(lowered, model.params))
    with x64_scope():
        jitted(model.params, inputs)

    def direct(x):
        with x64_scope():
            jax.block_until_ready(jitted(model.params, x))

    direct(other)
    t = alternating_us(
        {
            "ours": lambda: jax.block_until_ready(compiled(inputs)),
            "plain": lambda: direct(inputs),
            "cached": lambda: jax.block_until_ready(compiled(other)),
            "plain_other": lambda: direct(other),
        },
        repeat,
    )
    return {
        "model": name,
        "compiled_call_us": t["ours"],
        "jitted_call_us": t["plain"],
        "ratio": t["ours"] / t["plain"],
        "cache_hit_call_us": t["cached"],
        "jitted_other_shape_us": t["plain_other"],
        "cache_hit_ratio": t["cached"] / t["plain_other"],
    }


def event_cost(repeat: int = 200_000) -> dict:
    """Nanoseconds per event with no handler attached: a guarded emit, and a span."""
    event = "transmuter.cache.hit"
    assert not telemetry.listening(event)

    def guarded():
        for _ in range(repeat):
            if telemetry.listening(event):
                telemetry.emit(event, {"count": 1}, {})

    def spans():
        for _ in range(repeat):
            with telemetry.span("transmuter.call", {}):
                pass

    results = {}
    for label, fn in (("guarded_emit_ns", guarded), ("span_ns", spans)):
        start = time.perf_counter()
        fn()
        results[label] = (time.perf_counter() - start) / repeat * 1e9
    return results


DISK_SCRIPT = textwrap.dedent(
    """
    import sys, time, numpy as np, transmuter
    seen = []
    transmuter.telemetry.attach("t", ["transmuter.segment.compile.stop"],
                                lambda e, m, md: seen.append(md["disk_cache"]))
    model = transmuter.load(sys.argv[1])
    ids = np.ones((1, 128), np.int64)
    inputs = {"input_ids": ids, "attention_mask": ids, "token_type_ids": 0 * ids}
    start = time.perf_counter()
    transmuter.compile(model, inputs, cache_dir=sys.argv[2])
    print(time.perf_counter() - start, ",".join(seen))
    """
)


def disk_cache(model_path: Path) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        runs = []
        for _ in range(2):
            out = subprocess.run(
                [sys.executable, "-c", DISK_SCRIPT, str(model_path), cache],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            runs.append((float(out[0]), out[1]))
    return {
        "cold_s": runs[0][0],
        "cold_disk": runs[0][1],
        "warm_s": runs[1][0],
        "warm_disk": runs[1][1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1000)
    parser.add_argument("--skip-disk", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = {"overhead": [call_overhead(n, args.repeat) for n in ("vit", "bert", "resnet")]}
    results["events"] = event_cost()
    minilm = HERE / ".cache" / "minilm.onnx"
    if not args.skip_disk and minilm.exists():
        results["disk_cache"] = disk_cache(minilm)

    print("per-call overhead (median us): compiled callable vs the same jitted function")
    for r in results["overhead"]:
        print(
            f"  {r['model']:8s} compile-time shape {r['compiled_call_us']:8.1f} vs "
            f"{r['jitted_call_us']:8.1f}  ratio {r['ratio']:.2f}   cache hit "
            f"{r['cache_hit_call_us']:8.1f} vs {r['jitted_other_shape_us']:8.1f}  ratio "
            f"{r['cache_hit_ratio']:.2f}"
        )
    e = results["events"]
    print(
        f"telemetry with no handler: guarded emit {e['guarded_emit_ns']:.0f} ns, "
        f"span {e['span_ns']:.0f} ns"
    )
    if "disk_cache" in results:
        d = results["disk_cache"]
        print(
            f"MiniLM compile: cold {d['cold_s']:.2f} s ({d['cold_disk']}), "
            f"second process {d['warm_s']:.2f} s ({d['warm_disk']})"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
