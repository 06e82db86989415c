"""XLA:CPU's two dot libraries, YNNPACK (single dots) and its own (Eigen), on the benchmark's
models and on single dots of each type: what runtime/xla_options.py chooses by.

    python bench/make_minilm.py && /path/to/torch/python bench/make_cases.py   # the models
    python bench/bench_dot_library.py [--cases minilm,resnet50] [--rounds 15]
    python bench/bench_dot_library.py --dots                                   # no files needed

Models: each bench_cases.py case whose file exists, compiled by `transmuter.compile` twice in
one process, once with each library forced for its programs; calls alternate between the two,
medians. `--dots`: one dot per type (float32, int8 -> int32, bf16 -> float32) and shape (a
decode step's 4 and 16 rows, MiniLM's FFN at 128), jitted under each option, alternating.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_cases  # noqa: E402  (through bench_models: JAX_PLATFORMS=cpu before jax)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import transmuter  # noqa: E402
from transmuter import cpu  # noqa: E402
from transmuter.runtime import xla_options  # noqa: E402

LIBRARIES = {"YNNPACK": xla_options.LIBRARY_DOTS, "Eigen": xla_options.OWN_DOTS}
DOTS = {  # type -> (operand dtype, result dtype)
    "float32": (jnp.float32, jnp.float32),
    "int8": (jnp.int8, jnp.int32),
    "bf16": (jnp.bfloat16, jnp.float32),
}
SHAPES = [(4, 768, 3072), (16, 768, 3072), (128, 384, 1536)]


def alternate(calls: dict, rounds: int) -> dict[str, float]:
    """Median seconds of each call, rounds alternating in order and in reverse."""
    times = {name: [] for name in calls}
    for round_ in range(rounds):
        for name in calls if round_ % 2 == 0 else reversed(list(calls)):
            start = time.perf_counter()
            jax.block_until_ready(calls[name]())
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def report(label: str, calls: dict, rounds: int) -> None:
    """One line: each library's median time for `calls` (library -> call), and their ratio."""
    took = alternate(calls, rounds)
    ynn, own = (took[name] * 1e3 for name in LIBRARIES)
    print(
        f"{label}  YNNPACK {ynn:8.3f} ms  Eigen {own:8.3f} ms  Eigen/YNNPACK {own / ynn:.2f}",
        flush=True,
    )


@contextlib.contextmanager
def with_library(options: dict[str, str]):
    """`transmuter.compile` with its programs' dot library forced to `options`."""
    chosen = xla_options.for_program
    xla_options.for_program = lambda lowered, platform: options
    try:
        yield
    finally:
        xla_options.for_program = chosen


def models(only: list[str] | None, rounds: int) -> None:
    for work in bench_cases.workloads():
        if only and work.model not in only or not work.path.exists():
            continue
        model = transmuter.load(work.path)
        calls = {}
        for name, options in LIBRARIES.items():
            with with_library(options):  # compile runs the example: every program compiles here
                compiled = transmuter.compile(model, work.inputs)
            calls[name] = functools.partial(compiled, work.inputs)
        report(f"{work.model:12s} {work.case:26s}", calls, rounds)


def dots(rounds: int) -> None:
    rng = np.random.default_rng(0)
    for kind, (operand, result) in DOTS.items():
        for m, k, n in SHAPES:
            if kind == "int8":
                a, b = (rng.integers(-128, 128, s).astype(np.int8) for s in ((m, k), (k, n)))
            else:
                a, b = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n)))
            a, b = jnp.asarray(a, operand), jnp.asarray(b, operand)

            dot = functools.partial(jax.lax.dot, preferred_element_type=result)
            calls = {}
            for name, options in LIBRARIES.items():
                calls[name] = functools.partial(jax.jit(dot, compiler_options=options), a, b)
                calls[name]().block_until_ready()
            report(f"{kind:8s} [{m}, {k}] x [{k}, {n}]", calls, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", help="comma-separated bench_cases.py model names")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--dots", action="store_true", help="single dots instead of models")
    args = parser.parse_args()
    print(cpu.describe())
    if args.dots:
        dots(args.rounds)
    else:
        models(args.cases.split(",") if args.cases else None, args.rounds)


if __name__ == "__main__":
    main()
