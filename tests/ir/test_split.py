"""`transmuter.split(model, invariant=[...])` (transmuter/ir/split.py): a decoder step's graph
built with onnx.helper in the shape Optimum's seq2seq decoders have (cross-attention keys and
values from encoder_hidden_states, an additive mask from encoder_attention_mask, reshapes
whose targets come from the states' shape), run as head once and tail per step, against ONNX
Runtime running the whole graph on each step's inputs."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import transmuter
from transmuter.errors import InputError

RNG = np.random.default_rng(0)
D, S = 8, 6


def _constant(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _decoder(extra_nodes=(), extra_outputs=()):
    """hidden [B, T, D] (a step's), states [B, S, D] and mask [B, S] (the encoder's) -> out:
    one cross-attention head, its output reshaped to [B, T * D] by a target read off the
    states' and hidden's shapes."""
    nodes = [
        helper.make_node("MatMul", ["states", "wk"], ["k"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["states", "wv"], ["v"]),
        helper.make_node("Cast", ["mask"], ["mask_f"], to=T.FLOAT),
        helper.make_node("Sub", ["one", "mask_f"], ["masked"]),
        helper.make_node("Mul", ["masked", "minus"], ["bias2d"]),
        helper.make_node("Unsqueeze", ["bias2d", "axis1"], ["bias"]),
        helper.make_node("MatMul", ["hidden", "wq"], ["q"]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Add", ["scores", "bias"], ["biased"]),
        helper.make_node("Softmax", ["biased"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["attended"]),
        # A target from shapes: [batch (the states'), -1].
        helper.make_node("Shape", ["states"], ["states_shape"]),
        helper.make_node("Slice", ["states_shape", "zero", "axis1"], ["batch"]),
        helper.make_node("Concat", ["batch", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["attended", "target"], ["out"]),
        *extra_nodes,
    ]
    initializers = [
        _constant(n, RNG.standard_normal((D, D)).astype(np.float32)) for n in ("wq", "wk", "wv")
    ]
    initializers += [
        _constant("one", np.float32(1)),
        _constant("minus", np.float32(-1e4)),
        _constant("axis1", np.array([1], np.int64)),
        _constant("zero", np.array([0], np.int64)),
        _constant("minus_one", np.array([-1], np.int64)),
    ]
    graph = helper.make_graph(
        nodes,
        "decoder",
        [
            helper.make_tensor_value_info("hidden", T.FLOAT, ["batch", "steps", D]),
            helper.make_tensor_value_info("states", T.FLOAT, ["batch", S, D]),
            helper.make_tensor_value_info("mask", T.INT64, ["batch", S]),
        ],
        [helper.make_tensor_value_info("out", T.FLOAT, None), *extra_outputs],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _encoder_inputs(batch=2):
    states = RNG.standard_normal((batch, S, D)).astype(np.float32)
    mask = np.ones((batch, S), np.int64)
    mask[1, 4:] = 0
    return {"states": states, "mask": mask}


@pytest.mark.parametrize("optimize", [False, True])
def test_head_once_then_tail_per_step_gives_the_whole_graphs_outputs(optimize):
    proto = _decoder()
    head, tail = transmuter.split(transmuter.load(proto, optimize=optimize), ["states", "mask"])
    encoder = _encoder_inputs()
    cached = transmuter.run(head, encoder)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for steps in (1, 3):  # a new sequence length each step: head is not run again
        hidden = RNG.standard_normal((2, steps, D)).astype(np.float32)
        tail_inputs = {n: v for n, v in {**cached, **encoder}.items() if n in tail.inputs}
        got = transmuter.run(tail, {"hidden": hidden, **tail_inputs})["out"]
        want = session.run(["out"], {"hidden": hidden, **encoder})[0]
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    # Head computes the keys, values and mask bias (the passes may fold the keys' transpose
    # into the product that reads them); tail reads them, and the states' shape only.
    assert len(head.outputs) == 3 and "bias" in head.outputs
    assert [n.op_type for n in head.ir.graph.nodes].count("MatMul") == 2
    assert "mask" not in tail.inputs
    readers = [n.op_type for n in tail.ir.graph.nodes if "states" in n.inputs]
    assert readers == ["Shape"]
    assert tail.graph_breaks() == []  # the reshape's target stays a host value


def test_subgraphs_and_random_draws_stay_in_tail():
    # A branch reading the states (as a merged decoder's If does) and a draw shaped like them.
    then = helper.make_graph(
        [helper.make_node("Identity", ["states"], ["branch_out"])],
        "then",
        [],
        [helper.make_tensor_value_info("branch_out", T.FLOAT, None)],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["states"], ["other_out"])],
        "else",
        [],
        [helper.make_tensor_value_info("other_out", T.FLOAT, None)],
    )
    nodes = [
        helper.make_node("ReduceMin", ["mask"], ["smallest"], keepdims=0),
        helper.make_node("Cast", ["smallest"], ["all_real"], to=T.BOOL),
        helper.make_node("If", ["all_real"], ["chosen"], then_branch=then, else_branch=other),
        helper.make_node("RandomUniformLike", ["states"], ["noise"], seed=1.0),
        # A draw nothing reads still advances the call's key stream, as the load's DCE keeps it.
        helper.make_node("RandomNormalLike", ["hidden"], ["unread"], seed=2.0),
    ]
    outputs = [
        helper.make_tensor_value_info("chosen", T.FLOAT, None),
        helper.make_tensor_value_info("noise", T.FLOAT, None),
    ]
    head, tail = transmuter.split(transmuter.load(_decoder(nodes, outputs)), ["states", "mask"])
    tail_ops = {n.op_type for n in tail.ir.graph.nodes}
    assert {"If", "RandomUniformLike", "RandomNormalLike"} <= tail_ops
    assert "states" in tail.inputs  # the branch reads it
    assert "all_real" in head.outputs  # the If's condition is the mask's data
    encoder = _encoder_inputs()
    cached = transmuter.run(head, encoder)
    hidden = RNG.standard_normal((2, 1, D)).astype(np.float32)
    tail_inputs = {n: v for n, v in {**cached, **encoder}.items() if n in tail.inputs}
    got = transmuter.run(tail, {"hidden": hidden, **tail_inputs})
    np.testing.assert_allclose(np.asarray(got["chosen"]), -encoder["states"])  # one row masked


def test_an_input_that_is_not_one_is_refused_by_name():
    model = transmuter.load(_decoder())
    with pytest.raises(InputError, match=r"\['encoder_hidden_states'\] are not inputs"):
        transmuter.split(model, ["encoder_hidden_states"])
