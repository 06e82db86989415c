"""Where a continuous batch's time goes: bench_serving.py's generation workload (48 prompts cut
to 48 tokens, exactly 32 greedy new tokens each, 16 clients of one ContinuousGeneration with 16
slots) on the GPT-2-small-sized decoder, split into joins (each a prefill) and steps; then the
16-row step alone at each window of past, and the prefill's vocabulary product over every
position against the last one's alone.

    python bench/bench_streams_breakdown.py [--rounds 3]

Needs bench/make_gpt2.py's export. Medians; the first round compiles and is not counted.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import transmuter
from transmuter import cpu
from transmuter.pipelines.generation.continuous import ContinuousGeneration

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import texts, timed  # noqa: E402
from make_gpt2 import PATH as GPT2_SMALL  # noqa: E402

NEW = 32
OPTIONS = {"max_new_tokens": NEW, "min_new_tokens": NEW, "do_sample": False}


def counted(engine, name: str, spent: dict, calls: collections.Counter) -> None:
    """`engine.<name>` timed into `spent` and counted into `calls`."""
    method = getattr(engine, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - start
            calls[name] += 1

    setattr(engine, name, wrapper)


def breakdown(engine, prompts, rounds: int) -> None:
    spent, calls = collections.defaultdict(float), collections.Counter()
    for name in ("_join", "_fill", "_advance"):
        counted(engine, name, spent, calls)
    print("round  wall s  tokens/s  joins: calls, s, ms each  steps: calls, s, ms each")
    for round_ in range(rounds + 1):
        spent.clear()
        calls.clear()
        start = time.perf_counter()
        timed(lambda ids: engine.submit(ids, **OPTIONS).result(), prompts, 16)
        wall = time.perf_counter() - start
        joins, steps = spent["_join"] + spent["_fill"], spent["_advance"]
        join_calls, step_calls = calls["_join"] + calls["_fill"], calls["_advance"]
        print(
            f"{'warm-up' if round_ == 0 else round_:>7}  {wall:6.1f}  {len(prompts) * NEW / wall:8.0f}"
            f"  {join_calls:5d} {joins:6.2f} {1000 * joins / join_calls:7.1f}"
            f"  {step_calls:5d} {steps:6.2f} {1000 * steps / step_calls:7.1f}"
        )


def step_by_window(engine, prompts, windows=(64, 96, 128), repeats: int = 7) -> None:
    """The 16-row step program alone, on the state of a full batch, at each window."""
    captured = {}
    step = engine._step

    def capture(*args, window, **kwargs):
        if len(args[1]) == engine.size and not captured:
            captured["args"] = jax.tree_util.tree_map(_copy, args)
            captured["kwargs"] = kwargs
        return step(*args, window=window, **kwargs)

    engine._step = capture
    timed(lambda ids: engine.submit(ids, **OPTIONS).result(), prompts[: engine.size], 16)
    engine._step = step

    def once(window: int) -> float:
        args = jax.block_until_ready(jax.tree_util.tree_map(_copy, captured["args"]))
        start = time.perf_counter()
        with jax.enable_x64(True):  # as the engine runs it
            jax.block_until_ready(step(*args, window=window, **captured["kwargs"]))
        return time.perf_counter() - start

    times = {w: [] for w in windows}
    for window in windows:
        once(window)  # compiled
    for _ in range(repeats):
        for window in windows:
            times[window].append(once(window))
    print("\n16-row step by window of past (ms): " + ", ".join(
        f"{w}: {1000 * statistics.median(t):.1f}" for w, t in times.items()
    ))  # fmt: skip


def _copy(value):
    """A fresh copy of a device array (the step donates its state), anything else as it is."""
    return value.copy() if isinstance(value, jax.Array) else value


def vocabulary_product(positions: int = 64, repeats: int = 7) -> None:
    """GPT-2-small's tied vocabulary product for a 64-token prefill: every position's logits
    then the last row (as a prefill keeps), against the last position's row alone."""
    rng = np.random.default_rng(0)
    hidden = jnp.asarray(rng.standard_normal((1, positions, 768), np.float32))
    table = jnp.asarray(rng.standard_normal((768, 50257), np.float32))
    ways = {
        "every position, then the last": transmuter.jit(lambda h, w: (h @ w)[:, -1]),
        "the last position alone": transmuter.jit(lambda h, w: h[:, -1] @ w),
    }
    times = {name: [] for name in ways}
    for fn in ways.values():
        fn(hidden, table).block_until_ready()
    for _ in range(repeats):
        for name, fn in ways.items():
            start = time.perf_counter()
            fn(hidden, table).block_until_ready()
            times[name].append(time.perf_counter() - start)
    print(f"\nvocabulary product of a {positions}-token prefill (ms): " + ", ".join(
        f"{name}: {1000 * statistics.median(t):.1f}" for name, t in times.items()
    ))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not GPT2_SMALL.exists():
        sys.exit(f"{GPT2_SMALL} is missing: run bench/make_gpt2.py first")
    print(f"# {cpu.describe()}")
    pipeline = transmuter.pipeline("text-generation", GPT2_SMALL)
    prompts = [pipeline.tokenizer.encode(t).ids[:48] for t in texts(48, seed=1)]
    engine = ContinuousGeneration(pipeline, slots=16)
    try:
        breakdown(engine, prompts, args.rounds)
        step_by_window(engine, prompts)
    finally:
        engine.close()
    vocabulary_product()


if __name__ == "__main__":
    main()
