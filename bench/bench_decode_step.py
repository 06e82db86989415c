"""One decode step of continuous batching (`ContinuousGeneration`'s step program) at 1, 4 and
16 rows against ONNX Runtime's run of the same export, under each XLA:CPU route.

    /tmp/torchenv/bin/python bench/make_gpt2.py     # bench/.cache/gpt2-small (once)
    python bench/bench_decode_step.py [--repo bench/.cache/gpt2-small] [--rounds 7]

Each row has 64 positions of past (the step's smallest window) and one new token. Transmuter
runs the pipeline decoder's `step_past` jitted alone, as the step program runs it, with the
compiler options of each route and as `transmuter.jit` compiles it (the runtime's choice, by the
program's dots); ONNX Runtime (CPUExecutionProvider, default optimizations)
runs the model with the same past, in the same process, rounds alternating between engines.
Routes are XLA:CPU's options for the program only (jax.jit's compiler_options), never XLA_FLAGS.
`--products` times the step's weight shapes as single products instead: ONNX Runtime's MatMul
against XLA's dot with the weight as stored and transposed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import onnxruntime as ort

import transmuter
from transmuter import cpu

ROOT = Path(__file__).resolve().parents[1]
PAST = 64
YNN = "xla_cpu_experimental_ynn_fusion_type"
# Options per route; None is the runtime's own choice (transmuter.jit: by the program's dots).
ROUTES = {
    "the runtime's choice": None,
    "XLA default": {},
    "YNNPACK single dots": {YNN: "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"},
    "no YNNPACK (Eigen)": {YNN: ""},
    "oneDNN": {"xla_cpu_use_onednn": True, YNN: ""},
}


def inputs(rows: int, config: dict, rng) -> tuple:
    heads, layers = config["n_head"], config["n_layer"]
    size = config["n_embd"] // heads
    past = {
        f"past_key_values.{i}.{kind}": rng.standard_normal((rows, heads, PAST, size), np.float32)
        for i in range(layers)
        for kind in ("key", "value")
    }
    tokens = rng.integers(0, config["vocab_size"], rows).astype(np.int64)
    positions = np.full(rows, PAST, np.int64)
    mask = np.ones((rows, PAST), np.int64)
    return tokens, positions, past, mask


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _jitted(fun, options: dict | None):
    return transmuter.jit(fun) if options is None else jax.jit(fun, compiler_options=options)


def step_engines(decoder, params, session, rows: int, config: dict, routes, rng) -> dict:
    """Each route's step and ONNX Runtime's on the same `rows` random rows: name -> a call
    returning the last logits."""
    tokens, positions, past, mask = inputs(rows, config, rng)
    args = (params, jnp.asarray(tokens), jnp.asarray(positions),
            {k: jnp.asarray(v) for k, v in past.items()}, jnp.asarray(mask))  # fmt: skip
    engines = {}
    for route in routes:
        step = _jitted(decoder.step_past, ROUTES[route])

        def run(step=step):
            logits, new = step(*args)
            jax.block_until_ready(new)
            return np.asarray(logits)

        engines[route] = run
    names = {i.name for i in session.get_inputs()}
    feed = {
        "input_ids": tokens[:, None],
        "position_ids": positions[:, None],
        "attention_mask": np.ones((rows, PAST + 1), np.int64),
        **past,
    }
    feed = {k: v for k, v in feed.items() if k in names}
    engines["ONNX Runtime"] = lambda: session.run(["logits"], feed)[0][:, -1]
    return engines


def product_engines(k: int, n: int, rows: int, routes, rng) -> dict:
    """One product [rows, k] x [k, n] (a weight of the step's), as ONNX Runtime's MatMul of an
    initializer and as XLA's dot of the weight stored [k, n] under each route, or transposed,
    [n, k], under the runtime's."""
    from onnx import TensorProto, helper, numpy_helper

    weight = (rng.standard_normal((k, n)) * 0.02).astype(np.float32)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "product",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
        [numpy_helper.from_array(weight, "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    stored, transposed, xd = jnp.asarray(weight), jnp.asarray(weight.T.copy()), jnp.asarray(x)
    engines = {}
    for route in routes:
        plain = _jitted(lambda x, w: x @ w, ROUTES[route])
        engines[route] = lambda plain=plain: np.asarray(plain(xd, stored))
    swapped = transmuter.jit(lambda x, w: jnp.einsum("mk,nk->mn", x, w))
    engines["weight stored [n, k], runtime's"] = lambda: np.asarray(swapped(xd, transposed))
    engines["ONNX Runtime"] = lambda: session.run(None, {"x": x})[0]
    return engines


def compare(title: str, engines: dict, rounds: int) -> None:
    """Compile and check every engine against ONNX Runtime's answer, then time them in
    alternating order; print medians and ratios."""
    reference = engines["ONNX Runtime"]()
    for name, run in engines.items():
        got = run()
        assert np.abs(got - reference).max() < 1e-3, (name, np.abs(got - reference).max())
    times = {name: [] for name in engines}
    for round_ in range(rounds):
        order = list(engines) if round_ % 2 == 0 else list(reversed(engines))
        for name in order:
            times[name].append(timed(engines[name]))
    base = statistics.median(times["ONNX Runtime"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{title} | {name:32s} | {median * 1e3:8.2f} ms | {median / base:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=ROOT / "bench" / ".cache" / "gpt2-small")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--routes", nargs="+", default=list(ROUTES), choices=list(ROUTES))
    parser.add_argument(
        "--products", action="store_true",
        help="time the step's weight shapes as single products instead (no repo needed)",
    )  # fmt: skip
    args = parser.parse_args()
    print(cpu.describe())
    rng = np.random.default_rng(0)
    if args.products:
        for k, n in ((768, 2304), (768, 768), (768, 3072), (3072, 768), (768, 50257)):
            for rows in args.rows:
                compare(
                    f"[{rows}, {k}] x [{k}, {n}]",
                    product_engines(k, n, rows, args.routes, rng),
                    args.rounds,
                )
        return
    pipe = transmuter.pipeline("text-generation", args.repo)
    session = ort.InferenceSession(
        str(args.repo / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    with jax.enable_x64(True):
        for rows in args.rows:
            engines = step_engines(
                pipe.decoder, pipe.decoder.model.params, session, rows, pipe.repo.config,
                args.routes, rng,
            )  # fmt: skip
            compare(f"rows {rows:2d}", engines, args.rounds)


if __name__ == "__main__":
    main()
