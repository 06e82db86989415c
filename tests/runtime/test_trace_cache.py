"""Traced segments on disk (runtime/trace_cache.py): with cache_dir on, a later process runs each
segment from its stored `jax.export` program instead of walking the graph again, with the same
answers, breaks included; a model that differs only in a constant is traced anew; a damaged
entry is traced again and written afresh; `transmuter.export` reads its program back."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from opcheck import make_model
from test_breaks import if_model
from test_export import position_table_model

import transmuter
from transmuter.runtime import trace_cache
from transmuter.runtime.segments import _exported

F = TensorProto.FLOAT

# Compiles two models that differ only in the threshold of their break, calls each at a second
# shape, and prints per segment compile (trace cache, disk cache, compiled) and the outputs.
SCRIPT = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np
    import transmuter

    folder, cache = sys.argv[1], sys.argv[2]
    seen = []
    transmuter.telemetry.attach("t", ["transmuter.segment.compile.stop"], lambda e, m, md: seen.append(
        [md["position"], md["trace_cache"], md["disk_cache"], md["compiled"]]))
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    outputs = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name in ("low", "high"):
            model = transmuter.load(f"{folder}/{name}.onnx")
            compiled = transmuter.compile(model, {"x": x}, cache_dir=cache)
            outputs[name] = [compiled({"x": x})["y"].tolist(), compiled({"x": x[:3]})["y"].tolist()]
    warned = [str(w.message) for w in caught if "cache" in str(w.message)]
    print(json.dumps({"events": seen, "outputs": outputs, "warned": warned}))
""")


def negations(prefix: str, x: str, n: int, out: str) -> list[onnx.NodeProto]:
    names = [x, *(f"{prefix}{i}" for i in range(n - 1)), out]
    return [helper.make_node("Neg", [a], [b]) for a, b in zip(names, names[1:])]


def break_model(threshold: float) -> onnx.ModelProto:
    """x -> 24 negations -> NonZero(h > threshold) -> gather those values -> 4 negations -> y:
    a compiled segment, a break, and a segment short enough to run op by op (20 nodes or
    fewer); y is x's values over the threshold."""
    nodes = negations("a", "x", 24, "h")
    nodes += [
        helper.make_node("Greater", ["h", "threshold"], ["over"]),
        helper.make_node("NonZero", ["over"], ["where"]),
        helper.make_node("Transpose", ["where"], ["where_t"]),
        helper.make_node("GatherND", ["h", "where_t"], ["picked"]),
    ]
    nodes += negations("b", "picked", 4, "y")
    return make_model(
        nodes,
        [helper.make_tensor_value_info("x", F, ["n", 3])],
        [helper.make_tensor_value_info("y", F, ["k"])],
        [numpy_helper.from_array(np.array(threshold, np.float32), "threshold")],
    )


def run_process(folder, cache) -> dict:
    command = [sys.executable, "-c", SCRIPT, str(folder), str(cache)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def processes(tmp_path_factory):
    """The script run twice on one cache folder: writing it, then reading it."""
    folder = tmp_path_factory.mktemp("trace_cache")
    onnx.save(break_model(0.0), folder / "low.onnx")
    onnx.save(break_model(0.5), folder / "high.onnx")
    return folder, [run_process(folder, folder / "cache") for _ in range(2)]


def test_a_second_process_runs_its_segments_untraced(processes):
    _, (first, second) = processes
    # Per model: the first segment compiled, the short one after the break run op by op, for
    # two shapes each. The second model (another threshold) is a miss in the first process.
    shapes = [[0, "miss", "miss", True], [26, "miss", None, False]] * 4
    assert first["events"] == shapes
    assert second["events"] == [[p, "hit", disk and "hit", c] for p, _, disk, c in shapes]
    assert second["outputs"] == first["outputs"]
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    for name, threshold in (("low", 0.0), ("high", 0.5)):
        got = first["outputs"][name]
        assert got == [x[x > threshold].tolist(), x[:3][x[:3] > threshold].tolist()]
    assert first["warned"] == second["warned"] == []


@pytest.mark.slow
def test_a_damaged_entry_is_traced_again_and_written_afresh(processes, tmp_path):
    folder, (first, _) = processes
    cache = tmp_path / "cache"
    shutil.copytree(folder / "cache", cache)
    entries = sorted((cache / "transmuter-traces").iterdir(), key=lambda p: p.stat().st_size)
    assert len(entries) == 8  # two models, two shapes, two segments each
    damaged = entries[-1]  # a compiled segment's, which holds a program
    damaged.write_bytes(damaged.read_bytes()[:1000])  # truncated, as by a full disk
    repaired = run_process(folder, cache)
    assert [e[1] for e in repaired["events"]].count("miss") == 1
    assert repaired["warned"] == [
        f"removed a damaged traced program from the compile cache {str(damaged.parent)!r}; "
        "it is traced again and written afresh"
    ]
    assert repaired["outputs"] == first["outputs"]
    again = run_process(folder, cache)
    assert {e[1] for e in again["events"]} == {"hit"} and again["warned"] == []


EXPORT = textwrap.dedent("""
    import sys
    import transmuter
    from transmuter.runtime import export

    transmuter.use_persistent_cache(sys.argv[2])
    model = transmuter.load(sys.argv[1])
    if sys.argv[3] == "untraced":
        def refuse(*args):
            raise AssertionError("traced")
        export._trace = refuse
    exported = transmuter.export(model)
    print(transmuter.derived_constraints(exported))
    print(exported.mlir_module())
""")


def test_export_reads_its_program_back(rng, tmp_path):
    """The second process's export is read from the cache (tracing would raise there), with the
    constraint the first derived from the graph."""
    onnx.save(position_table_model(rng), tmp_path / "table.onnx")

    def export_in_a_new_process(how: str) -> str:
        command = [sys.executable, "-c", EXPORT, str(tmp_path / "table.onnx"), str(tmp_path), how]
        done = subprocess.run(command, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    first = export_in_a_new_process("traced")
    assert first.startswith("('sequence <= 16',)\n") and "stablehlo" in first
    assert export_in_a_new_process("untraced") == first


def test_a_segment_jax_cannot_export_or_serialize_is_not_kept():
    """A host callback has no exported form, a 2-bit type no serialized one: such segments
    compile from their trace alone."""

    def callback(args, key):
        shape = jax.ShapeDtypeStruct(args["x"].shape, args["x"].dtype)
        return {"y": jax.pure_callback(np.sin, shape, args["x"])}

    def two_bits(args, key):
        return {"y": args["x"].astype(ml_dtypes.int2)}

    x = jnp.ones((2,), jnp.float32)
    assert _exported(jax.jit(callback), {"x": x}, None, "cpu") == (None, None)
    assert _exported(jax.jit(two_bits), {"x": x}, None, "cpu") == (None, None)
    exported, blob = _exported(jax.jit(lambda a, k: {"y": a["x"] + 1}), {"x": x}, None, "cpu")
    assert jax.export.deserialize(bytearray(blob)).call({"x": x}, None)["y"].tolist() == [2, 2]
    assert exported.call({"x": x}, None)["y"].tolist() == [2, 2]


def test_constants_of_equal_bits_and_other_types_key_apart():
    """int4 and uint4 share numpy's type string (|V1): the fingerprint reads the type's name, or
    a uint4 zero point would run an int4 program read from disk."""
    fingerprints = []
    for dtype in (TensorProto.INT4, TensorProto.UINT4):
        zero = helper.make_tensor("z", dtype, [], [3])
        model = make_model(
            [
                helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
            ],
            [helper.make_tensor_value_info("x", F, [4])],
            [helper.make_tensor_value_info("y", F, [4])],
            [numpy_helper.from_array(np.float32(4.0), "s"), zero],
            opset=21,
        )
        fingerprints.append(transmuter.load(model).fingerprint)
    assert fingerprints[0] != fingerprints[1]


def test_subgraph_constants_count_in_the_fingerprint():
    """A branch's own initializers are constants of the trace: two Ifs that reshape to other
    shapes must not share an entry (one would run the other's program, or break where it
    should not)."""
    same = transmuter.load(if_model([3, 8], [3, 8])).fingerprint
    assert transmuter.load(if_model([3, 8], [2, 12])).fingerprint != same
    assert transmuter.load(if_model([3, 8], [3, 8])).fingerprint == same


def test_the_dot_precision_setting_keys_apart():
    """A process that asks JAX for another default dot precision traces other programs."""
    model = transmuter.load(if_model([3, 8], [3, 8]))
    default = trace_cache.key(model, "segment", 0)
    with jax.default_matmul_precision("highest"):
        assert trace_cache.key(model, "segment", 0) != default
    assert trace_cache.key(model, "segment", 0) == default
