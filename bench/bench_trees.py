"""Tree ensembles: a 100-tree, depth-8 forest on 100,000 rows of 20 features, Transmuter
(compiled) against ONNX Runtime in one process.

    python bench/bench_trees.py [--trees 100] [--depth 8] [--rows 100000] [--repeat 10]

The forest is synthetic (onnx.helper, seeded): full binary trees of BRANCH_LEQ nodes on random
features and thresholds, as a random forest regressor (TreeEnsembleRegressor, AVERAGE) and a
3-class classifier (TreeEnsembleClassifier, the legacy ai.onnx.ml ops skl2onnx writes). After
warm-up, blocks of runs alternate between the engines (bench/README.md says why blocks); each
Transmuter run is timed until its outputs are numpy arrays. Prints medians and the ratio.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

import transmuter

FEATURES = 20


def forest(trees: int, depth: int, classes: int, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    interior, leaves = 2**depth - 1, 2**depth
    per_tree = interior + leaves
    ids = np.arange(per_tree)
    nodes = {
        "nodes_treeids": np.repeat(np.arange(trees), per_tree).tolist(),
        "nodes_nodeids": np.tile(ids, trees).tolist(),
        "nodes_featureids": rng.integers(0, FEATURES, trees * per_tree).tolist(),
        "nodes_values": rng.standard_normal(trees * per_tree).astype(np.float32).tolist(),
        "nodes_modes": (["BRANCH_LEQ"] * interior + ["LEAF"] * leaves) * trees,
        "nodes_truenodeids": np.tile(np.where(ids < interior, 2 * ids + 1, 0), trees).tolist(),
        "nodes_falsenodeids": np.tile(np.where(ids < interior, 2 * ids + 2, 0), trees).tolist(),
    }
    leaf_ids = np.tile(np.arange(interior, per_tree), trees)
    leaf_trees = np.repeat(np.arange(trees), leaves)
    if classes:
        prefix, outputs = "class", classes
        weights = rng.random((trees * leaves, classes)).astype(np.float32)
        extra = {"classlabels_int64s": list(range(classes)), "post_transform": "NONE"}
        op_type = "TreeEnsembleClassifier"
        graph_outputs = [
            helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", classes]),
        ]
    else:
        prefix, outputs = "target", 1
        weights = rng.standard_normal((trees * leaves, 1)).astype(np.float32)
        extra = {"n_targets": 1, "aggregate_function": "AVERAGE"}
        op_type = "TreeEnsembleRegressor"
        graph_outputs = [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 1])]
    nodes[f"{prefix}_treeids"] = np.repeat(leaf_trees, outputs).tolist()
    nodes[f"{prefix}_nodeids"] = np.repeat(leaf_ids, outputs).tolist()
    nodes[f"{prefix}_ids"] = np.tile(np.arange(outputs), trees * leaves).tolist()
    nodes[f"{prefix}_weights"] = weights.reshape(-1).tolist()
    node = helper.make_node(
        op_type, ["X"], [o.name for o in graph_outputs], domain="ai.onnx.ml", **nodes, **extra
    )
    graph = helper.make_graph(
        [node], "forest",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", FEATURES])], graph_outputs,
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("ai.onnx.ml", 3)]
    )
    model.ir_version = 10
    return model


def measure(model: onnx.ModelProto, x: np.ndarray, repeat: int, block: int = 3) -> dict:
    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    start = time.perf_counter()
    compiled = transmuter.compile(transmuter.load(model), {"X": x})
    compile_s = time.perf_counter() - start

    def ours():
        return {k: np.asarray(v) for k, v in compiled({"X": x}).items()}

    def theirs():
        return session.run(None, {"X": x})

    got, want = ours(), theirs()
    diff = max(
        float(np.max(np.abs(np.asarray(got[o.name], np.float64) - w)))
        for o, w in zip(session.get_outputs(), want)
    )
    times: dict[str, list[float]] = {"transmuter": [], "ort": []}
    gc.disable()
    try:
        for _ in range(max(1, repeat // block)):
            for name, fn in (("transmuter", ours), ("ort", theirs)):
                fn()  # untimed: the other engine's threads may still be spinning
                for _ in range(block):
                    t = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t)
    finally:
        gc.enable()
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return {**med, "ratio": med["transmuter"] / med["ort"], "compile_s": compile_s, "diff": diff}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", type=int, default=100)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    import jax

    x = np.random.default_rng(1).standard_normal((args.rows, FEATURES)).astype(np.float32)
    print(
        f"{args.trees} trees, depth {args.depth}, {args.rows} rows x {FEATURES} features; "
        f"jax {jax.__version__} ({jax.default_backend()}), onnxruntime {ort.__version__}, "
        f"{os.cpu_count()} CPUs"
    )
    print(f"{'model':<12} {'Transmuter ms':>14} {'ORT ms':>10} {'T/ORT':>7} {'compile s':>10} "
          f"{'max|diff|':>10}")  # fmt: skip
    for name, classes in (("regressor", 0), ("classifier", 3)):
        r = measure(forest(args.trees, args.depth, classes), x, args.repeat)
        print(f"{name:<12} {r['transmuter']:>14.1f} {r['ort']:>10.1f} {r['ratio']:>7.2f} "
              f"{r['compile_s']:>10.1f} {r['diff']:>10.2g}")  # fmt: skip


if __name__ == "__main__":
    main()
