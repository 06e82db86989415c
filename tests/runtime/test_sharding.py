"""Many devices: the rules that place weights (found from the graph, in this process), and sharded
runs on eight CPU devices and across two processes (in processes of their own, which
tests/runtime/sharding_cases.py is: XLA's device count is fixed when JAX starts, and this
process keeps its single device)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import numpy as np
import pytest
import sharding_cases
from jax.sharding import AxisType, PartitionSpec
from layered import layered_inputs, layered_model

import transmuter
from transmuter import ir
from transmuter.runtime.sharding import find_splits, kv_cache_heads

CASES = Path(__file__).with_name("sharding_cases.py")
MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"


def run_cases(*args: str, devices: int = 8) -> subprocess.Popen:
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
    env = {**os.environ, "XLA_FLAGS": flags.strip()}
    return subprocess.Popen(
        [sys.executable, str(CASES), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def result(process: subprocess.Popen, timeout: int = 600) -> dict:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def check_case(case: dict) -> None:
    """Outputs as unsharded, one compile per signature, the collectives the layout needs, and
    each split param's bytes divided evenly over the devices."""
    where = (
        f"{case['model']} on {case['mesh']} (data {case['data_axis']}, model {case['model_axis']})"
    )
    assert case["error"] < 1e-5 and case["error_second"] < 1e-5, where
    assert case["compiles"] == [1, 0, 1] and case["fast_path"], where
    row_split = {"all-reduce", "reduce-scatter"} & set(case["collectives"])
    memory = case["memory"]
    if case["model_axis"] is None:
        assert not row_split, where  # nothing split: no partial sums to add up
        assert memory["split_total"] == 0, where
    else:
        assert row_split, where
        shards = int(np.prod(case["mesh"])) // (2 if case["data_axis"] else 1)
        assert memory["split_total"] >= 0.95 * memory["total"], where
        assert memory["split_expected_per_device"] == memory["split_total"] // shards, where
        assert set(memory["split_per_device"].values()) == {memory["split_total"] // shards}
    if case["data_axis"] is not None:
        assert all(spec.startswith("P('data'") for spec in case["outputs"].values()), where


def test_bert_data_and_tensor_parallel_on_a_2_by_4_mesh():
    quick = result(run_cases("quick"))
    (case,) = quick["cases"]
    check_case(case)
    assert case["memory"]["split_total"] == case["memory"]["total"]
    assert "3 rows along its batch dim 'batch'" in quick["refused"]
    assert "('multiple', 2)" in quick["refused"]
    layered = quick["layered"]
    assert layered["scans"] == 1 and layered["error"] < 1e-5
    # [layers, D, HIDDEN] by its outputs, [layers, HIDDEN, D] by its inputs: one all-reduce.
    assert layered["specs"]["w1_up__layers"] == "P(None, None, 'model')"
    assert layered["specs"]["w1_down__layers"] == "P(None, 'model', None)"
    assert "all-reduce" in layered["collectives"]


@pytest.mark.slow
def test_models_sharded_every_way_match_one_device():
    run = result(run_cases("matrix"))
    cases = run["cases"]
    assert {(c["model"], tuple(c["mesh"]), c["model_axis"]) for c in cases} == {
        (m, mesh, axis)
        for m in ("bert", "gpt2", "resnet")
        for mesh, axis in (((2, 4), "model"), ((8,), None), ((8,), "model"))
    }
    for case in cases:
        check_case(case)
    gpt2 = next(c for c in cases if c["model"] == "gpt2" and c["mesh"] == [2, 4])
    assert gpt2["outputs"]["present.0.key"] == "P('data', 'model')"  # the KV cache by heads

    load = run["load"]
    assert load["error"] < 1e-5 and load["gathered_error"] < 1e-5 and load["own_jit_error"] < 1e-5
    assert load["kept_placement"] and not load["whole_copies"] and not load["single_device_params"]
    assert set(load["gathered"].values()) == {"P()"}
    assert "all-reduce" in load["own_jit_collectives"]
    memory = load["memory"]
    assert set(memory["split_per_device"].values()) == {memory["split_total"] // 4}

    finetune = run["finetune"]
    np.testing.assert_allclose(finetune["parallel"], finetune["single"], rtol=1e-5)


@pytest.mark.slow
def test_two_processes_data_parallel_agree_with_one():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    processes = [run_cases("host", str(i), port, devices=2) for i in range(2)]
    # Read both at once: each waits for the other at exit, and either may fill its pipe.
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda p: result(p, timeout=300), processes))
    assert sorted(r["process"] for r in results) == [0, 1]
    assert all(r["devices"] == 4 and r["local_devices"] == 2 for r in results)
    model = transmuter.load(MODELS / "bert.onnx")
    batch = sharding_cases.inputs(model, 1, batch=8)
    want = transmuter.compile(model, batch)(batch)
    for r in results:
        got = {name: np.array(value, np.float32) for name, value in r["outputs"].items()}
        assert sharding_cases.max_error(got, want) < 1e-5


def linear_graph(*nodes: ir.Node, weights: dict[str, tuple[int, ...]]) -> ir.Graph:
    x = ir.ValueInfo("x", ir.TensorType(np.dtype("float32"), (ir.SymbolicDim("batch"), 8)))
    y = ir.ValueInfo(nodes[-1].outputs[0], None)
    arrays = {name: np.zeros(shape, np.float32) for name, shape in weights.items()}
    return ir.Graph(list(nodes), [x], [y], arrays)


def test_an_mlp_is_a_column_then_a_row_and_the_head_a_column():
    graph = linear_graph(
        ir.Node("MatMul", "", ("x", "w1"), ("h",)),
        ir.Node("Relu", "", ("h",), ("a",)),
        ir.Node("Gemm", "", ("a", "w2"), ("o",), {"transB": 1}),
        ir.Node("LayerNormalization", "", ("o", "g", "b"), ("n",)),
        ir.Node("MatMul", "", ("n", "head"), ("logits",)),
        weights={"w1": (8, 32), "w2": (8, 32), "head": (8, 64), "g": (8,), "b": (8,)},
    )
    # w2 is [N, K] (transB): its row axis is 1. The head is in no pair: split by outputs.
    assert find_splits(graph) == {"w1": 1, "w2": 1, "head": 1}


def test_weights_read_inside_an_ifs_branches_pair_up_as_outside():
    # Optimum's merged decoders: an If whose branches read the main graph's weights by name.
    def branch(tag):
        nodes = [
            ir.Node("MatMul", "", ("x", "w1"), (f"h{tag}",)),
            ir.Node("Relu", "", (f"h{tag}",), (f"a{tag}",)),
            ir.Node("MatMul", "", (f"a{tag}", "w2"), (f"o{tag}",)),
        ]
        return ir.Graph(nodes, [], [ir.ValueInfo(f"o{tag}", None)], {})

    graph = linear_graph(
        ir.Node("If", "", ("flag",), ("y",), {"then_branch": branch(0), "else_branch": branch(1)}),
        weights={"w1": (8, 32), "w2": (32, 8)},
    )
    assert find_splits(graph) == {"w1": 1, "w2": 0}


def test_matmul_nbits_pairs_split_n_then_the_blocks():
    nbits = {"K": 8, "N": 16, "bits": 4, "block_size": 8}
    graph = linear_graph(
        ir.Node("MatMulNBits", "com.microsoft", ("x", "b1", "s1"), ("h",), nbits),
        ir.Node("Gelu", "", ("h",), ("a",)),
        ir.Node("MatMulNBits", "com.microsoft", ("a", "b2", "s2"), ("o",), nbits),
        weights={"b1": (16, 1, 4), "b2": (8, 2, 4), "s1": (16,), "s2": (16,)},
    )
    assert find_splits(graph) == {"b1": 0, "b2": 1}


def test_convolutions_run_channels_last_pair_up_through_their_stored_kernels():
    """The layout pass stores each kernel (k, k, C, M) behind a Transpose to NhwcConv's
    (M, k, k, C): the first convolution splits its outputs (M, stored axis 3), the second its
    inputs (C, stored axis 2)."""
    conv = {"pads": [1, 1, 1, 1]}
    graph = linear_graph(
        ir.Node("Conv", "", ("x", "w1"), ("h",), conv),
        ir.Node("Relu", "", ("h",), ("a",)),
        ir.Node("Conv", "", ("a", "w2"), ("o",), conv),
        weights={"w1": (16, 3, 3, 3), "w2": (8, 16, 3, 3)},
    )
    model = transmuter.optimize_graph(ir.Model(graph, {"": 17}), ["layout"])
    assert [n.op_type for n in model.graph.nodes].count("NhwcConv") == 2
    assert find_splits(model.graph) == {"w1__spatial_first": 3, "w2__spatial_first": 2}


def test_bert_attention_and_mlp_pairs_and_embeddings_by_vocabulary():
    model = transmuter.load(MODELS / "bert.onnx")
    splits = find_splits(model.ir.graph)
    columns = [n for n, axis in splits.items() if n.startswith("onnx::MatMul") and axis == 1]
    rows = [n for n, axis in splits.items() if n.startswith("onnx::MatMul") and axis == 0]
    assert len(columns) == 2 * 4 and len(rows) == 2 * 2  # per layer: Q, K, V, up; out, down
    assert splits["model.embeddings.word_embeddings.weight"] == 0


def test_gpt2_kv_cache_inputs_split_by_heads():
    model = transmuter.load(MODELS / "gpt2.onnx")
    assert kv_cache_heads(model.ir.graph) == {
        f"past_key_values.{i}.{kind}": 1 for i in range(2) for kind in ("key", "value")
    }


def one_device_mesh(*names: str):
    return jax.make_mesh((1,) * len(names), names, axis_types=(AxisType.Auto,) * len(names))


def test_a_one_device_mesh_runs_as_without_one():
    model = transmuter.load(MODELS / "bert.onnx")
    batch = sharding_cases.inputs(model, 1, batch=2)
    want = transmuter.compile(model, batch)(batch)
    mesh = one_device_mesh("data", "model")
    got = transmuter.compile(model, batch, mesh=mesh, data_axis="data", model_axis="model")(batch)
    assert sharding_cases.max_error(got, want) < 1e-6


def test_param_sharding_rules_place_what_they_match_and_load_keeps_its_placement():
    mesh = one_device_mesh("data", "model")
    rules = {r"word_embeddings": PartitionSpec(None, "model")}
    model = transmuter.load(MODELS / "bert.onnx", mesh=mesh, param_sharding=rules)
    params = model.params
    assert (
        params["model.embeddings.word_embeddings.weight"].sharding.spec == rules["word_embeddings"]
    )
    no_rule = params["model.embeddings.position_embeddings.weight"]
    assert no_rule.sharding.spec == PartitionSpec()  # whole
    batch = sharding_cases.inputs(model, 1, batch=2)
    compiled = transmuter.compile(model, batch, mesh=mesh, data_axis="data")
    assert all(compiled.model.params[name] is array for name, array in params.items())
    assert compiled.model is not model and model.params is params  # the caller's model unchanged


def test_rules_for_a_layers_weight_place_each_slice_of_the_stacked_one():
    proto, shapes = layered_model(18)
    mesh = one_device_mesh("model")
    rules = {r"_up\b|_up__": PartitionSpec("model", None)}
    model = transmuter.load(proto, mesh=mesh, model_axis="model", param_sharding=rules)
    (scan,) = [n for n in model.ir.graph.nodes if n.op_type == "Scan"]
    stacked = [n for n in scan.inputs if n.endswith("_up__layers")]
    assert stacked and model.params[stacked[0]].sharding.spec == PartitionSpec(None, "model", None)
    splits = find_splits(model.ir.graph)
    assert splits[stacked[0].replace("_up_", "_down_")] == 1  # the row of the pair, per layer
    batch = layered_inputs(shapes)
    want = transmuter.compile(transmuter.load(proto, optimize=False), batch)(batch)
    got = transmuter.compile(model, batch, mesh=mesh, model_axis="model")(batch)
    assert sharding_cases.max_error(got, want) < 1e-6


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mesh": "cpu"}, "mesh must be a jax.sharding.Mesh; got str"),
        ({"data_axis": "data"}, "need mesh="),
        ({"mesh": one_device_mesh("data")}, "needs data_axis (split the batch), model_axis"),
        ({"mesh": one_device_mesh("data"), "data_axis": "rows"}, "the mesh has no axis 'rows'"),
        (
            {"mesh": one_device_mesh("data"), "data_axis": "data", "batch_axis": "rows"},
            "batch_axis='rows' is no dim of the inputs; their dim names are ['batch', 'sequence']",
        ),
        (
            {"mesh": one_device_mesh("model"), "param_sharding": {"word": PartitionSpec("x")}},
            "param_sharding['word'] = P('x',) names mesh axes ['x']; the mesh has ['model']",
        ),
        (
            {
                "mesh": one_device_mesh("m"),
                "param_sharding": {"word": PartitionSpec("m", None, None)},
            },
            "has 3 entries but 'model.embeddings.word_embeddings.weight' has rank 2",
        ),
        (
            {"mesh": one_device_mesh("m"), "param_sharding": {"word": "m"}},
            "param_sharding['word'] must be a jax.sharding.PartitionSpec; got 'm'",
        ),
    ],
)
def test_bad_mesh_options_say_what_was_expected(options, message):
    model = transmuter.load(MODELS / "bert.onnx")
    batch = sharding_cases.inputs(model, 1, batch=2)
    with pytest.raises(transmuter.InputError) as raised:
        transmuter.compile(model, batch, **options)
    assert message in str(raised.value)
