"""The graph passes (transmuter/ir/passes): each rewrites a graph built with onnx.helper, and
the optimized and unoptimized models agree on random inputs; the rewrite itself is checked on
the node list (the pass did fire)."""

from __future__ import annotations

import numpy as np
import pytest
from layered import layered_inputs, layered_model
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import transmuter
from transmuter.ir import passes

RNG = np.random.default_rng(0)


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, T.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, T.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in initializers],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _weights(*shape):
    return (RNG.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)


def _agree(proto, inputs, names, *, rtol=1e-5, atol=1e-5):
    """The model run unoptimized and with `names` agree; returns the optimized model."""
    plain = transmuter.load(proto, optimize=False)
    optimized = transmuter.load(proto, optimize=names)
    want = transmuter.compile(plain, inputs)(inputs)
    got = transmuter.compile(optimized, inputs)(inputs)
    for name in plain.outputs:
        np.testing.assert_allclose(np.asarray(got[name]), np.asarray(want[name]), rtol, atol)
    eager = transmuter.run(optimized, inputs)
    for name in plain.outputs:
        np.testing.assert_allclose(np.asarray(eager[name]), np.asarray(want[name]), rtol, atol)
    return optimized


def _ops(model) -> list[str]:
    return [n.op_type for n in model.ir.graph.nodes]


def test_dce_drops_dead_nodes_and_their_weights():
    w = _weights(8, 8)
    proto = _model(
        [
            helper.make_node("Relu", ["x"], ["y"]),
            helper.make_node("MatMul", ["x", "w"], ["dead"]),
            helper.make_node("Sigmoid", ["dead"], ["dead2"]),
        ],
        [("x", [2, 8])],
        ["y"],
        [("w", w)],
    )
    optimized = _agree(proto, {"x": RNG.standard_normal((2, 8), np.float32)}, ["dce"])
    assert _ops(optimized) == ["Relu"]
    assert not optimized.params and "w" not in optimized.ir.graph.initializers


def test_dce_keeps_random_nodes_and_trainable_weights():
    proto = _model(
        [
            helper.make_node("RandomNormal", [], ["noise"], shape=[2]),
            helper.make_node("Relu", ["x"], ["y"]),
            helper.make_node("MatMul", ["x", "w"], ["dead"]),
        ],
        [("x", [2, 8])],
        ["y"],
        [("w", _weights(8, 8))],
    )
    trained = transmuter.load(proto, optimize=["dce"], trainable=True)
    assert "RandomNormal" in _ops(trained) and "w" in trained.params


def test_cse_merges_repeated_shape_chains():
    chain = []
    for i in range(3):  # one shape chain per "layer", as exporters write them
        chain += [
            helper.make_node("Shape", ["x"], [f"s{i}"]),
            helper.make_node("Constant", [], [f"i{i}"], value=numpy_helper.from_array(np.array(0))),
            helper.make_node("Gather", [f"s{i}", f"i{i}"], [f"b{i}"]),
            helper.make_node("Unsqueeze", [f"b{i}", "axes"], [f"u{i}"]),
            helper.make_node("Concat", [f"u{i}", "rest"], [f"shape{i}"], axis=0),
            helper.make_node("Reshape", ["x", f"shape{i}"], [f"r{i}"]),
        ]
    nodes = chain + [
        helper.make_node("Add", ["r0", "r1"], ["a"]),
        helper.make_node("Add", ["a", "r2"], ["y"]),
    ]
    proto = _model(
        nodes,
        [("x", ["batch", 4, 6])],
        ["y"],
        [("axes", np.array([0], np.int64)), ("rest", np.array([6, 4], np.int64))],
    )
    x = RNG.standard_normal((3, 4, 6)).astype(np.float32)
    optimized = _agree(proto, {"x": x}, ["cse", "dce"])
    assert _ops(optimized).count("Reshape") == 1 and _ops(optimized).count("Shape") == 1


def test_fold_turns_weight_chains_into_initializers():
    w = _weights(8, 16)  # stored transposed, as some exporters leave a Linear's weight
    proto = _model(
        [
            helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
            helper.make_node("Constant", [], ["two"], value_float=2.0),
            helper.make_node("Mul", ["wt", "two"], ["w2"]),
            helper.make_node("MatMul", ["x", "w2"], ["y"]),
        ],
        [("x", ["batch", 16])],
        ["y"],
        [("w", w)],
    )
    optimized = _agree(proto, {"x": RNG.standard_normal((3, 16), np.float32)}, ["fold", "dce"])
    assert _ops(optimized) == ["MatMul"]
    (name,) = optimized.params  # the folded weight is a param, as the original was
    np.testing.assert_allclose(np.asarray(optimized.params[name]), w.T * 2, rtol=1e-6)


def test_fold_leaves_chains_of_constants_to_the_tracer():
    """A shape computed from constants alone is not folded at load (the tracer computes it on
    the host at no cost per call, or in the program): it still decides the Reshape, no float
    result of host values becomes a param, and the graph does not break."""
    proto = _model(
        [
            helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.ones(100, np.float32))),
            helper.make_node("ReduceSum", ["c"], ["n"], keepdims=1),
            helper.make_node("Cast", ["n"], ["ni"], to=T.INT64),
            helper.make_node("Concat", ["minus_one", "ni"], ["shape"], axis=0),
            helper.make_node("Mul", ["c", "c"], ["cc"]),
            helper.make_node("Reshape", ["x", "shape"], ["r"]),
            helper.make_node("Add", ["r", "cc"], ["y"]),
        ],
        [("x", ["batch", 100])],
        ["y"],
        [("minus_one", np.array([-1], np.int64))],
    )  # fmt: skip
    optimized = _agree(proto, {"x": RNG.standard_normal((2, 100), np.float32)}, ["fold", "dce"])
    assert _ops(optimized).count("Constant") == 1 and "ReduceSum" in _ops(optimized)
    assert not optimized.params and not optimized.graph_breaks()


def test_fold_leaves_trainable_weights_and_widening_casts():
    w16 = _weights(64, 64).astype(np.float16)
    proto = _model(
        [
            helper.make_node("Cast", ["w"], ["w32"], to=T.FLOAT),
            helper.make_node("MatMul", ["x", "w32"], ["y"]),
        ],
        [("x", ["batch", 64])],
        ["y"],
        [("w", w16)],
    )
    for trainable in (False, True):
        model = transmuter.load(proto, optimize=["fold"], trainable=trainable)
        # fp16 storage stays fp16 (half the memory), read through its Cast
        assert "Cast" in _ops(model)
        assert {a.dtype for a in model.ir.graph.initializers.values()} == {np.dtype(np.float16)}


def _conv_model(tail: str):
    c_in, c_out = 3, 4
    inits = [
        ("w", _weights(c_out, c_in, 3, 3)),
        ("b", RNG.standard_normal(c_out).astype(np.float32)),
    ]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])]
    if tail == "bn":
        inits += [
            ("gamma", RNG.uniform(0.5, 2, c_out).astype(np.float32)),
            ("beta", RNG.standard_normal(c_out).astype(np.float32)),
            ("mean", RNG.standard_normal(c_out).astype(np.float32)),
            ("var", RNG.uniform(0.5, 2, c_out).astype(np.float32)),
        ]
        nodes.append(
            helper.make_node(
                "BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["n"], epsilon=1e-3
            )
        )
    else:
        inits.append(("k", RNG.uniform(0.5, 2, (c_out, 1, 1)).astype(np.float32)))
        nodes.append(helper.make_node(tail, ["k", "c"], ["n"]))  # the constant first: either side
    nodes.append(helper.make_node("Relu", ["n"], ["y"]))
    return _model(nodes, [("x", ["batch", c_in, 8, 8])], ["y"], inits)  # fmt: skip


@pytest.mark.parametrize("tail", ["bn", "Mul", "Add"])
def test_conv_fold(tail):
    proto = _conv_model(tail)
    x = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    optimized = _agree(proto, {"x": x}, ["conv_fold", "dce"])
    assert _ops(optimized) == ["Conv", "Relu"]
    trained = transmuter.load(proto, optimize=["conv_fold"], trainable=True)
    assert len(_ops(trained)) == 3


def test_conv_fold_leaves_a_conv_output_read_twice():
    proto = _conv_model("bn")
    proto.graph.output.append(helper.make_tensor_value_info("c", T.FLOAT, None))
    model = transmuter.load(proto, optimize=["conv_fold"])
    assert "BatchNormalization" in _ops(model)


@pytest.mark.parametrize("opset", [11, 17])
@pytest.mark.parametrize("bias", [True, False])
def test_qkv_fuses_projections_of_one_input(opset, bias):
    nodes, inits, outs = [], [], []
    for i, cols in enumerate((8, 8, 4)):
        inits.append((f"w{i}", _weights(8, cols)))
        nodes.append(helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"]))
        last = f"m{i}"
        if bias:
            inits.append((f"b{i}", RNG.standard_normal(cols).astype(np.float32)))
            nodes.append(helper.make_node("Add", [last, f"b{i}"], [f"a{i}"]))
            last = f"a{i}"
        nodes.append(helper.make_node("Relu", [last], [f"y{i}"]))
        outs.append(f"y{i}")
    proto = _model(nodes, [("x", ["batch", 5, 8])], outs, inits, opset)
    x = RNG.standard_normal((2, 5, 8)).astype(np.float32)
    optimized = _agree(proto, {"x": x}, ["qkv", "dce"])
    assert _ops(optimized).count("MatMul") == 1 and "Split" in _ops(optimized)
    assert _ops(optimized).count("Add") == int(bias)


def test_pipeline_names():
    assert set(passes.DEFAULT) <= set(passes.PASSES)
    with pytest.raises(ValueError, match="unknown optimization passes"):
        transmuter.load(_conv_model("bn"), optimize=["nope"])


def test_optimize_default_and_every_pass_agree():
    """The default pipeline, and all passes at once, on a graph where several fire."""
    proto = _conv_model("bn")
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    _agree(proto, {"x": x}, list(passes.DEFAULT))
    every = _agree(proto, {"x": x}, list(passes.PASSES))
    assert _ops(every) == ["Transpose", "Transpose", "NhwcConv", "Relu", "Transpose"]
    assert (
        transmuter.load(proto).ir.graph.nodes
        == transmuter.load(proto, optimize=list(passes.DEFAULT)).ir.graph.nodes
    )


def test_subgraph_outer_reads_survive_cse():
    """A value an If branch reads by outer name is renamed there too when CSE merges it."""
    then = helper.make_graph(
        [helper.make_node("Neg", ["r2"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", T.FLOAT, None)],
    )
    other = helper.make_graph(
        [helper.make_node("Abs", ["r2"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", T.FLOAT, None)],
    )
    proto = _model(
        [
            helper.make_node("Relu", ["x"], ["r1"]),
            helper.make_node("Relu", ["x"], ["r2"]),
            helper.make_node("ReduceSum", ["r1"], ["s"], keepdims=0),
            helper.make_node("Greater", ["s", "zero"], ["cond"]),
            helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other),
        ],
        [("x", [2, 3])],
        ["y"],
        [("zero", np.array(0, np.float32))],
    )  # fmt: skip
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    optimized = _agree(proto, {"x": x}, ["cse", "dce"])
    assert _ops(optimized).count("Relu") == 1


@pytest.mark.parametrize("opset", [11, 17, 18])
@pytest.mark.parametrize("masked", [True, False])
def test_attention_reorders_the_softmax(opset, masked):
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Div", ["s", "c"], ["s2"]),
    ]
    last = "s2"
    if masked:
        nodes.append(helper.make_node("Add", ["s2", "mask"], ["s3"]))
        last = "s3"
    nodes += [
        helper.make_node("Softmax", [last], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    shape = ["batch", 2, 5, 4]
    inputs = [("q", shape), ("k", shape), ("v", shape)] + ([("mask", ["batch", 1, 1, 5])] * masked)
    proto = _model(nodes, inputs, ["y"], [("c", np.array(2.0, np.float32))], opset)
    feeds = {n: RNG.standard_normal((3, 2, 5, 4)).astype(np.float32) for n in "qkv"}
    if masked:
        mask = np.zeros((3, 1, 1, 5), np.float32)
        mask[..., -2:] = -1e9  # padded keys, as BERT's extended mask writes them
        feeds["mask"] = mask
    optimized = _agree(proto, feeds, ["attention"])
    assert "Softmax" not in _ops(optimized) and "Div" in _ops(optimized)


# ---- transposed_matmul: Q K^T as one Einsum -------------------------------------------------


@pytest.mark.parametrize("rows", [1, 4])
def test_transposed_matmul_reads_the_keys_untransposed(rows):
    """A decoder step's scores (one query row, keys grown by the cache's Concat) and a prefill's;
    the query's rank is known through the Mul that scales it, and the batch broadcasts."""
    nodes = [
        helper.make_node("Concat", ["past", "new"], ["k"], axis=2),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("Mul", ["q", "c"], ["qs"]),
        helper.make_node("MatMul", ["qs", "kt"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["y"], axis=-1),
    ]
    inputs = [("q", [1, 2, rows, 4]), ("past", [3, 2, 5, 4]), ("new", [3, 2, rows, 4])]
    proto = _model(nodes, inputs, ["y", "kt"], [("c", np.array(0.5, np.float32))])
    feeds = {
        "q": RNG.standard_normal((1, 2, rows, 4)).astype(np.float32),
        "past": RNG.standard_normal((3, 2, 5, 4)).astype(np.float32),
        "new": RNG.standard_normal((3, 2, rows, 4)).astype(np.float32),
    }
    optimized = _agree(proto, feeds, ["transposed_matmul"])
    einsum = next(n for n in optimized.ir.graph.nodes if n.op_type == "Einsum")
    assert einsum.inputs == ("qs", "k") and einsum.attrs["equation"] == "...qd,...kd->...qk"
    assert "MatMul" not in _ops(optimized) and "Transpose" in _ops(optimized)  # kt is an output


@pytest.mark.parametrize(
    "case",
    ["other_perm", "vector_query", "unknown_rank", "opset_11"],
)
def test_transposed_matmul_left_alone(case):
    """Not a swap of the last two axes; a 1-D query (MatMul makes it a row, Einsum's ellipsis
    would not); a query whose rank nothing states; an opset without Einsum."""
    perm = [0, 2, 3, 1] if case == "other_perm" else [0, 1, 3, 2]
    rows = [4 if case == "other_perm" else 3, 1, 4]  # batch dims that broadcast with k's
    query = {"vector_query": [4], "unknown_rank": None}.get(case, rows)
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=perm),
        helper.make_node("MatMul", ["q", "kt"], ["y"]),
    ]
    proto = _model(
        nodes, [("q", query), ("k", [2, 3, 4, 4])], ["y"], (), 11 if case == "opset_11" else 17
    )
    optimized = transmuter.load(proto, optimize=["transposed_matmul"])
    assert _ops(optimized) == ["Transpose", "MatMul"]
    if query is not None:
        shape = (4,) if case == "vector_query" else tuple(rows)
        feeds = {"q": RNG.standard_normal(shape).astype(np.float32),
                 "k": RNG.standard_normal((2, 3, 4, 4)).astype(np.float32)}  # fmt: skip
        _agree(proto, feeds, ["transposed_matmul"])


# ---- dequantize: MatMulNBits weights once, at load ---------------------------------------------


def _nbits_model(bias: bool, opset: int = 17):
    """x [batch, 5, 32] @ a 4-bit weight [32, 8] (blocks of 16, packed zero points), + bias."""
    n, k, block = 8, 32, 16
    q = RNG.integers(0, 16, (n, k))
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8).reshape(n, k // block, block // 2)
    zeros = RNG.integers(0, 16, (n, k // block))
    inits = [
        ("B", packed),
        ("scales", RNG.uniform(0.01, 0.1, (n, k // block)).astype(np.float32)),
        ("zp", (zeros[:, 0] | (zeros[:, 1] << 4)).astype(np.uint8).reshape(n, 1)),
    ]
    inputs = ["x", "B", "scales", "zp"]
    if bias:
        inits.append(("bias", RNG.standard_normal(n).astype(np.float32)))
        inputs += ["", "bias"]
    nodes = [
        helper.make_node(
            "MatMulNBits", inputs, ["m"], domain="com.microsoft", K=k, N=n, bits=4, block_size=block
        ),
        helper.make_node("Relu", ["m"], ["y"]),
    ]
    proto = _model(nodes, [("x", ["batch", 5, k])], ["y"], inits, opset)
    proto.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return proto


@pytest.mark.parametrize("bias", [True, False])
def test_dequantize_makes_matmul_nbits_a_float_matmul(bias):
    x = RNG.standard_normal((2, 5, 32)).astype(np.float32)
    optimized = _agree(_nbits_model(bias), {"x": x}, ["dequantize", "dce"])
    ops = _ops(optimized)
    assert "MatMulNBits" not in ops and ops.count("MatMul") == 1 and ops.count("Add") == bias
    (weight,) = [a for a in optimized.ir.graph.initializers.values() if a.shape == (32, 8)]
    assert weight.dtype == np.float32


def test_dequantize_leaves_trainable_models_and_old_opsets():
    for model in (
        transmuter.load(_nbits_model(True), optimize=["dequantize"], trainable=True),
        transmuter.load(_nbits_model(True, opset=13), optimize=["dequantize"]),  # no CastLike
    ):
        assert "MatMulNBits" in _ops(model)


# ---- layout: convolution chains channels last ------------------------------------------------


def _chain_model():
    """A CNN's shapes in small: convolutions (dense, depthwise, 1x1 strided) with the ops
    between them that may run channels last, and ops that may not (MaxPool, Flatten)."""
    c = 4
    inits = [
        ("w1", _weights(c, 3, 3, 3)),
        ("b1", RNG.standard_normal(c).astype(np.float32)),
        ("wd", _weights(c, 1, 3, 3)),
        ("w2", _weights(2 * c, c, 1, 1)),
        ("w3", _weights(2 * c, c, 3, 3)),
        ("k", RNG.uniform(0.5, 2, (2 * c, 1, 1)).astype(np.float32)),
        ("lo", np.array(0, np.float32)),
        ("hi", np.array(6, np.float32)),
        ("fc", _weights(10, 4 * c)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "wd"], ["d"], group=c, pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["d", "lo", "hi"], ["d6"]),
        helper.make_node("Add", ["d6", "r1"], ["res"]),  # two channels-last values
        helper.make_node("Conv", ["res", "w2"], ["p"]),
        helper.make_node("Mul", ["p", "k"], ["pk"]),  # a per-channel constant
        helper.make_node("Conv", ["res", "w3"], ["q"], auto_pad="SAME_UPPER"),
        helper.make_node("Concat", ["pk", "q"], ["cat"], axis=1),
        helper.make_node("Sigmoid", ["cat"], ["s"]),
        helper.make_node("MaxPool", ["s"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["m"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1),
    ]
    return _model(nodes, [("x", ["batch", 3, 16, 16])], ["y", "res"], inits)


def test_layout_runs_a_convolution_chain_channels_last():
    proto = _chain_model()
    x = RNG.standard_normal((2, 3, 16, 16)).astype(np.float32)
    optimized = _agree(proto, {"x": x}, ["layout", "dce"], rtol=1e-4, atol=1e-5)
    ops = _ops(optimized)
    assert "Conv" not in ops and ops.count("NhwcConv") == 4
    moved = [n for n in optimized.ir.graph.nodes if n.op_type == "Transpose"]
    activations = [n for n in moved if n.inputs[0] not in optimized.ir.graph.initializers]
    # One into the chain; out of it, to MaxPool and to the graph output `res`.
    assert [n.attrs["perm"] for n in activations] == [(0, 2, 3, 1), (0, 3, 1, 2), (0, 3, 1, 2)]
    gemm = next(n for n in optimized.ir.graph.nodes if n.op_type == "Gemm")
    assert gemm.attrs["transB"] == 0
    assert optimized.ir.opsets["com.microsoft"] == 1


def test_layout_runs_a_1d_convolution_channels_last():
    proto = _model(
        [
            helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1]),
            helper.make_node("Erf", ["c"], ["e"]),
            helper.make_node("Conv", ["e", "w2"], ["y"], strides=[2]),
        ],
        [("x", ["batch", 4, 15])],
        ["y"],
        [("w1", _weights(6, 4, 3)), ("w2", _weights(5, 6, 1))],
    )
    x = RNG.standard_normal((3, 4, 15)).astype(np.float32)
    optimized = _agree(proto, {"x": x}, ["layout", "dce"])
    assert _ops(optimized).count("NhwcConv") == 2


def test_layout_takes_half_precision_kernels_read_in_float32():
    """A float16 graph computes in float32 (compute_type's Casts): its kernels reach Conv
    through a Cast, which the pass moves after the kernel's transpose."""
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT16, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", T.FLOAT16, None)],
        [numpy_helper.from_array(_weights(4, 3, 3, 3).astype(np.float16), "w")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = RNG.standard_normal((2, 3, 8, 8)).astype(np.float16)
    optimized = _agree(proto, {"x": x}, ["layout", "dce"], rtol=1e-3, atol=1e-3)
    assert "NhwcConv" in _ops(optimized) and "Conv" not in _ops(optimized)
    (kernel,) = [a for a in optimized.ir.graph.initializers.values() if a.ndim == 4]
    assert kernel.dtype == np.float16 and kernel.shape == (3, 3, 3, 4)  # stored as it was


def test_layout_leaves_trainable_and_non_constant_kernels():
    proto = _chain_model()
    assert "NhwcConv" not in _ops(transmuter.load(proto, optimize=["layout"], trainable=True))
    proto = _model(
        [helper.make_node("Conv", ["x", "w"], ["y"])],
        [("x", [1, 2, 5, 5]), ("w", [3, 2, 1, 1])],
        ["y"],
    )
    assert _ops(transmuter.load(proto, optimize=["layout"])) == ["Conv"]


def test_layout_rewrites_loop_bodies_with_kernels_laid_out_outside():
    """A Loop body's convolutions run channels last; its constant kernel is stored in the main
    graph as the convolution reads it, and a kernel the main graph computes (here an input) is
    transposed there, once, before the Loop."""

    def body(kernel):
        nodes = [
            helper.make_node("Conv", ["x_in", kernel], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("Conv", ["r", kernel], ["x_out"], pads=[1, 1, 1, 1]),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
        ]
        return helper.make_graph(
            nodes,
            "body",
            [
                helper.make_tensor_value_info("i", T.INT64, []),
                helper.make_tensor_value_info("c_in", T.BOOL, []),
                helper.make_tensor_value_info("x_in", T.FLOAT, None),
            ],
            [
                helper.make_tensor_value_info("c_out", T.BOOL, []),
                helper.make_tensor_value_info("x_out", T.FLOAT, None),
            ],
        )

    x = RNG.standard_normal((2, 4, 6, 6)).astype(np.float32)
    w = _weights(4, 4, 3, 3)
    for kernel, inputs in (("w", {"x": x}), ("k", {"x": x, "k": w})):
        proto = _model(
            [helper.make_node("Loop", ["M", "", "x"], ["y"], body=body(kernel))],
            [(name, list(value.shape)) for name, value in inputs.items()],
            ["y"],
            [("w", w), ("M", np.array(3, np.int64))],
        )
        optimized = _agree(proto, inputs, ["layout", "dce"], rtol=1e-4, atol=1e-4)
        graph = optimized.ir.graph
        (loop,) = [n for n in graph.nodes if n.op_type == "Loop"]
        inner = [n.op_type for n in loop.attrs["body"].nodes]
        assert inner.count("NhwcConv") == 2 and "Conv" not in inner
        # In the body: the activation into and out of the chain, and the kernel's order for
        # NhwcConv, which the lowering's transpose back cancels.
        assert inner.count("Transpose") == 3
        if kernel == "w":
            assert graph.initializers["w__spatial_first"].shape == (3, 3, 4, 4)
        else:
            assert [n.attrs["perm"] for n in graph.nodes if n.op_type == "Transpose"] == [
                (2, 3, 1, 0)
            ]


# ---- layers: repeated blocks as one Scan -----------------------------------------------------

LAYERS = ["fold", "cse", "layers", "dce"]


def _scans(model):
    return [n for n in model.ir.graph.nodes if n.op_type == "Scan"]


@pytest.mark.parametrize("layers", [18, 21])
def test_layers_scan_repeated_blocks(layers):
    proto, shapes = layered_model(layers)
    optimized = _agree(proto, layered_inputs(shapes), LAYERS)
    (scan,) = _scans(optimized)
    body = scan.attrs["body"]
    # One state (the hidden state between layers) and the five weights, stacked per layer.
    assert len(scan.inputs) - scan.attrs["num_scan_inputs"] == 1
    assert scan.attrs["num_scan_inputs"] == 5
    stacked = [optimized.ir.graph.initializers[n] for n in scan.inputs[1:]]
    scanned = stacked[0].shape[0]
    assert scanned >= layers - 2 and {a.shape[0] for a in stacked} == {scanned}
    assert len(body.nodes) == 15  # the three Constants each layer had are one after CSE
    # Another shape of the same program: the reshape chain inside the body follows it.
    other = layered_inputs(shapes, batch=3, seq=2)
    want = transmuter.run(transmuter.load(proto, optimize=False), other)["y"]
    np.testing.assert_allclose(np.asarray(transmuter.run(optimized, other)["y"]), want, 1e-5, 1e-5)


def test_layers_with_every_hidden_state_read_after():
    proto, shapes = layered_model(18, every_output=True)
    optimized = _agree(proto, layered_inputs(shapes), LAYERS)
    (scan,) = _scans(optimized)
    assert len(scan.outputs) == 2  # the final state and the stacked per-layer states
    assert _ops(optimized).count("Gather") >= 2


@pytest.mark.parametrize("case", ["per_layer_input", "random", "shared"])
def test_layers_left_alone(case):
    """Per-layer graph inputs (a KV cache) would have to be stacked on every call; a random
    operator in a Scan body would draw the same values in every layer; layers without weights
    of their own (one set shared, ALBERT's) are not told apart from chains of cheap ops."""
    proto, shapes = layered_model(18, **{case: True})
    model = transmuter.load(proto, optimize=LAYERS)
    assert not _scans(model)
    if case == "per_layer_input":
        _agree(proto, layered_inputs(shapes), LAYERS)


def test_layers_keep_a_trainable_models_params():
    proto, _ = layered_model(18)
    trained = transmuter.load(proto, optimize=LAYERS, trainable=True)
    assert not _scans(trained) and "w3_up" in trained.params


def test_layers_whose_state_changes_shape_run_unrolled():
    """Blocks of the same nodes and weight shapes that each pad the state by a row and a
    column: the Scan's lowering sees the state change shape and unrolls the loop (lax.scan
    cannot carry it)."""
    c = 4
    nodes, inits, h = [], [("grow", np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64))], "x"
    for j in range(16):  # the fewest layers and nodes a layer the pass folds into a Scan
        p = f"b{j}_"
        nodes += [
            helper.make_node("Conv", [h, p + "w", p + "b"], [p + "conv"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [p + "conv"], [p + "relu"]),
            helper.make_node("Add", [p + "relu", h], [p + "res"]),
            helper.make_node("Pad", [p + "res", "grow"], [p + "s0"]),
        ]
        nodes += [
            helper.make_node("Sigmoid" if k % 2 else "Neg", [p + f"s{k}"], [p + f"s{k + 1}"])
            for k in range(4)
        ]
        h = p + "s4"
        inits += [(p + "w", _weights(c * 9, c).T.reshape(c, c, 3, 3)), (p + "b", _weights(c))]
    proto = _model(nodes, [("x", [1, c, 8, 8])], [h], inits)
    optimized = _agree(proto, {"x": RNG.standard_normal((1, c, 8, 8), np.float32)}, LAYERS)
    assert _scans(optimized)


def test_layers_export_with_symbolic_dims():
    proto, shapes = layered_model(18)
    model = transmuter.load(proto, optimize=LAYERS)
    assert _scans(model)
    exported = transmuter.export(model)
    for batch, seq in ((1, 3), (4, 7)):
        feeds = layered_inputs(shapes, batch, seq)
        (got,) = exported.call(*(feeds[n] for n in model.inputs))
        want = transmuter.run(transmuter.load(proto, optimize=False), feeds)["y"]
        np.testing.assert_allclose(np.asarray(got), want, 1e-5, 1e-5)
