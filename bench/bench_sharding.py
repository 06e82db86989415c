"""Many devices: per-device param memory of the sharded fixture models, and data-parallel
throughput against ONNX Runtime.

    python bench/bench_sharding.py                 # memory: fixture models on 8 CPU devices
    python bench/bench_sharding.py --throughput    # rows/s, data-parallel over 1, 2, 4, ... devices

On a CPU only memory and correctness mean something (the eight devices share the cores); on
accelerators (bench/gpu.sh) the throughput rows record the scaling. Without XLA_FLAGS set, the
CPU is split into eight devices.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType  # noqa: E402

import transmuter  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "fixtures" / "models"
MINILM = ROOT / "bench" / ".cache" / "minilm.onnx"  # bench/make_minilm.py


def mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> jax.sharding.Mesh:
    devices = np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape)
    return jax.sharding.Mesh(devices, names, axis_types=(AxisType.Auto,) * len(names))


def memory_rows() -> list[dict]:
    """Each fixture model loaded for a (2, 4) and an (8,) mesh, weights split over "model":
    the params' bytes in all and the most any one device holds."""
    rows = []
    for name in ("bert", "gpt2", "resnet"):
        for shape, names in (((2, 4), ("data", "model")), ((8,), ("model",))):
            model = transmuter.load(
                MODELS / f"{name}.onnx", mesh=mesh(shape, names), model_axis="model"
            )
            total = sum(a.nbytes for a in model.params.values())
            per_device: dict[int, int] = {}
            for array in model.params.values():
                for shard in array.addressable_shards:
                    per_device[shard.device.id] = (
                        per_device.get(shard.device.id, 0) + shard.data.nbytes
                    )
            most = max(per_device.values())
            rows.append(
                {"model": name, "mesh": list(shape), "model_shards": shape[-1], "total": total,
                 "per_device": most, "fraction": round(most / total, 3)}
            )  # fmt: skip
    return rows


def throughput_rows(rows_per_device: int, sequence: int, seconds: float) -> list[dict]:
    """MiniLM (bench/make_minilm.py) or the BERT fixture, batch split over 1, 2, 4, ...
    devices, against ONNX Runtime on the whole batch (its CUDA provider when installed)."""
    import onnxruntime as ort

    path = MINILM if MINILM.exists() else MODELS / "bert.onnx"
    model = transmuter.load(path)
    vocab = min(r.high for r in model.index_ranges["input_ids"])
    providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider")
                 if p in ort.get_available_providers()]  # fmt: skip
    session = ort.InferenceSession(str(path), providers=providers)
    rows, count = [], 1
    while count <= len(jax.devices()):
        batch = rows_per_device * count
        ids = np.random.default_rng(0).integers(0, vocab, (batch, sequence))
        inputs = {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids),
            "token_type_ids": np.zeros_like(ids),
        }
        compiled = transmuter.compile(
            model, inputs, mesh=mesh((count,), ("data",)), data_axis="data"
        )
        ours = _rate(compiled, inputs, batch, seconds)
        theirs = _rate(functools.partial(session.run, None), inputs, batch, seconds)
        rows.append({"model": path.stem, "devices": count, "batch": batch, "sequence": sequence,
                     "transmuter_rows_s": round(ours, 1), "onnxruntime_rows_s": round(theirs, 1),
                     "ratio": round(ours / theirs, 2), "onnxruntime": session.get_providers()[0]})  # fmt: skip
        count *= 2
    return rows


def _rate(call, inputs: dict, batch: int, seconds: float) -> float:
    """Rows per second over repeated calls for about `seconds`, after one warm-up call."""
    jax.block_until_ready(call(inputs))
    began, calls = time.perf_counter(), 0
    while time.perf_counter() - began < seconds:
        jax.block_until_ready(call(inputs))
        calls += 1
    return batch * calls / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--throughput", action="store_true", help="data-parallel rows/s")
    parser.add_argument("--rows-per-device", type=int, default=32)
    parser.add_argument(
        "--sequence", type=int, default=64, help="the BERT fixture has 64 positions"
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="timing per row")
    parser.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {len(jax.devices())} {jax.devices()[0].platform} devices")
    if args.throughput:
        rows = throughput_rows(args.rows_per_device, args.sequence, args.seconds)
    else:
        rows = memory_rows()
    for row in rows:
        print("  ".join(f"{k}={v}" for k, v in row.items()))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
