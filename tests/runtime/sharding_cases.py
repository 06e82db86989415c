"""Sharded runs for tests/runtime/test_sharding.py, in a process of their own: XLA's device count
is read once, when JAX starts, and the test process must keep its single device.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python sharding_cases.py quick|matrix
    XLA_FLAGS=--xla_force_host_platform_device_count=2 python sharding_cases.py host ID PORT

`quick` runs BERT on a (2, 4) mesh; `matrix` runs each fixture model unsharded and then data- and tensor-parallel on (2, 4) and (8,)
meshes, plus loading for a mesh, `transmuter.run` under the caller's own jit and the fine-tuning
example data-parallel; `host` is one of two processes sharing a loopback coordinator. Each prints
its measurements as the last line of its output, in JSON, which the test asserts on (Gloo
prints lines of its own).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

import transmuter

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "fixtures" / "models"
BATCH = 8
# (mesh shape, axis names, data_axis, model_axis)
LAYOUTS = [
    ((2, 4), ("data", "model"), "data", "model"),
    ((8,), ("data",), "data", None),
    ((8,), ("model",), None, "model"),
]
COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "collective-permute")


def mesh(shape, names):
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(names))


def inputs(model, case: int, batch: int = BATCH, seed: int = 0) -> dict[str, np.ndarray]:
    """The stored case's shapes with `batch` rows of new values, each row its own: token ids in
    their table's range, masks hiding a few trailing positions, floats from a normal."""
    rng = np.random.default_rng(seed)
    with np.load(MODELS / f"{Path(model.source).stem}.npz") as stored:
        shapes = {n: stored[f"case{case}/in/{n}"].shape for n in model.inputs}
    made = {}
    for name in model.inputs:
        shape = (batch, *shapes[name][1:])
        dtype = model.input_specs[name].dtype
        if name in model.index_ranges:
            rows = min(r.high for r in model.index_ranges[name])
            made[name] = rng.integers(0, rows, shape).astype(dtype)
        elif np.dtype(dtype).kind in "iu":
            mask = np.ones(shape, dtype)
            for row, hidden in enumerate(rng.integers(0, max(shape[-1] // 3, 1), batch)):
                mask[row, shape[-1] - hidden :] = 0
            made[name] = mask
        else:
            made[name] = rng.standard_normal(shape).astype(dtype)
    return made


class Compiles:
    """Counts segment compiles and cache hits (telemetry): one compile per signature, and a call
    at the compile-time signature skips the cache (no hit) as it does unsharded."""

    def __init__(self):
        self.count = self.hits = 0
        events = ["transmuter.segment.compile.stop", "transmuter.cache.hit"]
        transmuter.telemetry.attach(id(self), events, self._seen)

    def _seen(self, event, measurements, metadata):
        if event == "transmuter.cache.hit":
            self.hits += 1
        else:
            self.count += 1


def max_error(got: dict, want: dict) -> float:
    """The largest |got - want| over the outputs, relative to each output's largest value."""
    worst = 0.0
    for name, value in want.items():
        value = np.asarray(value)
        scale = max(float(np.abs(value).max(initial=0.0)), 1e-30)
        worst = max(worst, float(np.abs(np.asarray(got[name]) - value).max(initial=0.0)) / scale)
    return worst


def hlo(compiled) -> str:
    return "".join(
        segment.program.as_text()
        for cache in compiled.runner.caches.values()
        for segment in cache.values()
        if segment.program is not None
    )


def param_memory(params: dict) -> dict:
    """Bytes of the params: in all, of those split, and on each device (all, and split ones)."""
    memory = {"total": 0, "split_total": 0, "split_expected_per_device": 0}
    per_device: dict[str, int] = {}
    split_per_device: dict[str, int] = {}
    for array in params.values():
        memory["total"] += array.nbytes
        shards = array.addressable_shards
        pieces = len({tuple((s.start, s.stop) for s in shard.index) for shard in shards})
        if pieces > 1:
            memory["split_total"] += array.nbytes
            memory["split_expected_per_device"] += array.nbytes // pieces
        for shard in shards:
            key = str(shard.device.id)
            per_device[key] = per_device.get(key, 0) + shard.data.nbytes
            if pieces > 1:
                split_per_device[key] = split_per_device.get(key, 0) + shard.data.nbytes
    return {**memory, "per_device": per_device, "split_per_device": split_per_device}


def matrix(names=("bert", "gpt2", "resnet"), layouts=LAYOUTS) -> list[dict]:
    """Each model unsharded, then compiled for each layout: errors against the unsharded
    outputs, compiles (first call, same signature, a second signature), collectives, memory."""
    compiles = Compiles()
    cases = []
    for name in names:
        model = transmuter.load(MODELS / f"{name}.onnx")
        first, second = inputs(model, 1), inputs(model, 0, seed=1)
        plain = transmuter.compile(model, first)
        want_first, want_second = plain(first), plain(second)
        for shape, axes, data_axis, model_axis in layouts:
            began = time.perf_counter()
            before = compiles.count
            compiled = transmuter.compile(
                model, first, mesh=mesh(shape, axes), data_axis=data_axis, model_axis=model_axis
            )
            got = compiled(first)
            at_compile = compiles.count - before
            hits = compiles.hits
            again = compiled(first)
            repeat = compiles.count - before - at_compile
            fast = compiles.hits == hits
            new_shape = compiled(second)
            second_signature = compiles.count - before - at_compile - repeat
            text = hlo(compiled)
            cases.append(
                {
                    "model": name,
                    "mesh": list(shape),
                    "data_axis": data_axis,
                    "model_axis": model_axis,
                    "error": max(max_error(got, want_first), max_error(again, want_first)),
                    "error_second": max_error(new_shape, want_second),
                    "compiles": [at_compile, repeat, second_signature],
                    "fast_path": fast,
                    "collectives": [c for c in COLLECTIVES if c in text],
                    "memory": param_memory(compiled.model.params),
                    "outputs": {k: str(v.sharding.spec) for k, v in got.items()},
                    "seconds": round(time.perf_counter() - began, 2),
                }
            )
    return cases


def loaded_for_mesh() -> dict:
    """GPT-2 loaded for a (2, 4) mesh: no param ever whole on one device; compile keeps the
    placement; and `transmuter.run` under the caller's own jit with the same sharded values."""
    grid = mesh((2, 4), ("data", "model"))
    model = transmuter.load(MODELS / "gpt2.onnx", mesh=grid, model_axis="model")
    shapes = {n: a.shape for n, a in model.params.items() if len(a.sharding.device_set) == 1}
    whole = [
        n
        for a in jax.live_arrays()
        for n, p in model.params.items()
        if a.shape == p.shape and len(a.sharding.device_set) == 1 and p.sharding.spec != ()
    ]
    batch = inputs(model, 1)
    want = transmuter.compile(transmuter.load(MODELS / "gpt2.onnx"), batch)(batch)
    compiled = transmuter.compile(model, batch, mesh=grid, data_axis="data")
    kept = all(compiled.model.params[n] is a for n, a in model.params.items())
    gathered = transmuter.compile(model, batch, mesh=grid, data_axis="data", gather_outputs=True)

    # The pattern for your own jit: sharded params (as loaded) and inputs, then transmuter.run.
    rows = NamedSharding(grid, PartitionSpec("data"))
    forward = jax.jit(lambda params, x: transmuter.run(model, x, params=params))
    with jax.enable_x64(True):  # the ids are int64, as the model declares
        placed = {n: jax.device_put(v, rows) for n, v in batch.items()}
        own = forward(model.params, placed)
        own_hlo = forward.lower(model.params, placed).compile().as_text()
    return {
        "memory": param_memory(model.params),
        "single_device_params": sorted(shapes),
        "whole_copies": whole,
        "kept_placement": kept,
        "error": max_error(compiled(batch), want),
        "gathered": {k: str(v.sharding.spec) for k, v in gathered(batch).items()},
        "gathered_error": max_error(gathered(batch), want),
        "own_jit_error": max_error(own, want),
        "own_jit_collectives": [c for c in COLLECTIVES if c in own_hlo],
    }


def finetune() -> dict:
    """examples/finetune.py for a few steps on one device and data-parallel over eight."""
    spec = importlib.util.spec_from_file_location("finetune", ROOT / "examples" / "finetune.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model = transmuter.load(example.MODEL, trainable=True)
    data = example.batches()
    _, single = example.train(model, data, steps=4)
    _, parallel = example.train(model, data, steps=4, mesh=example.data_mesh())
    return {"single": single, "parallel": parallel}


def layered() -> dict:
    """Ten repeated layers, which load's `layers` pass makes one Scan over stacked weights, on a
    (2, 4) mesh: the stacked weights split inside the layer (never along the layer axis)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from layered import layered_inputs, layered_model

    proto, shapes = layered_model(18)
    model = transmuter.load(proto)
    batch = layered_inputs(shapes, batch=BATCH)
    want = transmuter.compile(model, batch)(batch)
    compiled = transmuter.compile(
        model, batch, mesh=mesh((2, 4), ("data", "model")), data_axis="data", model_axis="model"
    )
    got = compiled(batch)
    scans = [n for n in model.ir.graph.nodes if n.op_type == "Scan"]
    return {
        "scans": len(scans),
        "error": max_error(got, want),
        "specs": {
            n: str(a.sharding.spec) for n, a in compiled.model.params.items() if "__layers" in n
        },
        "collectives": [c for c in COLLECTIVES if c in hlo(compiled)],
    }


def quick() -> dict:
    """BERT over a (2, 4) mesh, both kinds of parallelism, and a batch that does not split."""
    cases = matrix(("bert",), LAYOUTS[:1])
    model = transmuter.load(MODELS / "bert.onnx")
    compiled = transmuter.compile(
        model, inputs(model, 1), mesh=mesh((2, 4), ("data", "model")), data_axis="data"
    )
    try:
        compiled(inputs(model, 1, batch=3))
        refused = None
    except transmuter.InputError as exc:
        refused = str(exc)
    return {"cases": cases, "refused": refused, "layered": layered()}


def host(process: int, port: int) -> dict:
    """One of two processes: BERT data-parallel over both processes' devices, gathered."""
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process)
    model = transmuter.load(MODELS / "bert.onnx")
    batch = inputs(model, 1, batch=2 * len(jax.devices()))  # the same batch in every process
    grid = mesh((len(jax.devices()),), ("data",))
    compiled = transmuter.compile(model, batch, mesh=grid, data_axis="data", gather_outputs=True)
    out = compiled(batch)
    return {
        "process": jax.process_index(),
        "devices": len(jax.devices()),
        "local_devices": len(jax.local_devices()),
        "outputs": {k: np.asarray(v).tolist() for k, v in out.items()},
    }


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "quick":
        result = quick()
    elif mode == "matrix":  # loading first: no other model's arrays are alive yet
        result = {"load": loaded_for_mesh(), "cases": matrix(), "finetune": finetune()}
    else:
        result = host(int(sys.argv[2]), int(sys.argv[3]))
    print(json.dumps(result))
