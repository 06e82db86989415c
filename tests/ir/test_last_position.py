"""`transmuter.load(..., last_position=[...])` and `at_position={...}` (transmuter/ir/
last_position.py): graphs built with onnx.helper in the shapes decoders end with (Optimum's and
transformers.js's: a last MatMul, BART's bias after it, the merged decoders' If), each run by
ONNX Runtime whole and compared at its last position (or the one chosen at run time); the edit
is checked on the node list (the MatMul reads one row, or a Gather follows where it cannot)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import transmuter
from transmuter.errors import InputError

RNG = np.random.default_rng(0)
HIDDEN, VOCAB = 8, 11


def _model(nodes, outputs, initializers=(), inputs=(("h", ["batch", "positions", HIDDEN]),)):
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info(n, T.BOOL if n == "cond" else T.FLOAT, s)
            for n, s in inputs
        ],
        [helper.make_tensor_value_info(n, T.FLOAT, s) for n, s in outputs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in initializers],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


LOGITS = [("logits", ["batch", "positions", VOCAB])]
TABLE = ("table", RNG.standard_normal((HIDDEN, VOCAB)).astype(np.float32))
HIDDEN_STATES = RNG.standard_normal((2, 5, HIDDEN)).astype(np.float32)


def _at_last_position(proto, feed, names=("logits",)):
    """The model loaded with `names` at their last position, checked against ONNX Runtime's
    whole outputs there; returns the loaded graph."""
    model = transmuter.load(proto, last_position=list(names), optimize=False)
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in proto.graph.output], want.run(None, feed)))
    got = transmuter.run(model, feed)
    for name in model.outputs:
        expected = want[name][:, -1:] if name in names else want[name]
        np.testing.assert_allclose(np.asarray(got[name]), expected, rtol=1e-5, atol=1e-6)
    for name in names:
        assert model.output_specs[name].shape[-2] == 1
    return model.ir.graph


def _at_chosen_positions(proto, feed, positions=(0, 3, -1)):
    """The model loaded with its logits at the position of a new input, checked against ONNX
    Runtime's whole logits at each of `positions`; returns the loaded graph."""
    model = transmuter.load(proto, at_position={"logits": "position"}, optimize=False)
    assert model.input_specs["position"].shape == (1,)
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    logits = want.run(["logits"], feed)[0]
    for position in positions:
        got = transmuter.run(model, {**feed, "position": np.array([position], np.int64)})
        expected = logits[:, position : position + 1 or None]
        np.testing.assert_allclose(np.asarray(got["logits"]), expected, rtol=1e-5, atol=1e-6)
    return model.ir.graph


def _reads_one_row(graph) -> bool:
    matmul = next(n for n in graph.nodes if n.op_type == "MatMul")
    gather = next((n for n in graph.nodes if n.outputs == (matmul.inputs[0],)), None)
    return gather is not None and gather.op_type == "Gather"


def test_a_last_matmul_multiplies_the_last_row_only():
    proto = _model([helper.make_node("MatMul", ["h", "table"], ["logits"])], LOGITS, [TABLE])
    assert _reads_one_row(_at_last_position(proto, {"h": HIDDEN_STATES}))


def test_a_row_bias_and_unary_ops_after_the_matmul_keep_the_rows_apart():
    # BART's final_logits_bias [1, vocabulary], then a softcap-like Tanh.
    bias = ("bias", RNG.standard_normal((1, VOCAB)).astype(np.float32))
    nodes = [
        helper.make_node("MatMul", ["h", "table"], ["product"]),
        helper.make_node("Add", ["bias", "product"], ["biased"]),
        helper.make_node("Tanh", ["biased"], ["logits"]),
    ]
    proto = _model(nodes, LOGITS, [TABLE, bias])
    assert _reads_one_row(_at_last_position(proto, {"h": HIDDEN_STATES}))


def test_each_branch_of_a_merged_decoders_if_is_edited():
    def branch(name, scale):
        nodes = [
            helper.make_node("Mul", ["h", f"{name}_scale"], [f"{name}_h"]),
            helper.make_node("MatMul", [f"{name}_h", "table"], [f"{name}_logits"]),
        ]
        value = helper.make_tensor_value_info(f"{name}_logits", T.FLOAT, None)
        scale = numpy_helper.from_array(np.float32(scale), f"{name}_scale")
        return helper.make_graph(nodes, name, [], [value], [scale])

    node = helper.make_node(
        "If", ["cond"], ["logits"], then_branch=branch("past", 2.0), else_branch=branch("no", 3.0)
    )
    proto = _model([node], LOGITS, [TABLE], inputs=[("h", [2, 5, HIDDEN]), ("cond", [1])])
    for cond in (True, False):
        graph = _at_last_position(proto, {"h": HIDDEN_STATES, "cond": np.array([cond])})
    edited = next(n for n in graph.nodes if n.op_type == "If")
    assert all(_reads_one_row(edited.attrs[b]) for b in ("then_branch", "else_branch"))
    # A position chosen at run time, which each branch reads from the outer graph's input.
    for cond in (True, False):
        graph = _at_chosen_positions(proto, {"h": HIDDEN_STATES, "cond": np.array([cond])})
    edited = next(n for n in graph.nodes if n.op_type == "If")
    assert all(_reads_one_row(edited.attrs[b]) for b in ("then_branch", "else_branch"))


def test_a_position_chosen_at_run_time_multiplies_that_row_only():
    # seq2seq's padded decoding: the last real position of a right-padded sequence.
    bias = ("bias", RNG.standard_normal((1, VOCAB)).astype(np.float32))
    nodes = [
        helper.make_node("MatMul", ["h", "table"], ["product"]),
        helper.make_node("Add", ["bias", "product"], ["logits"]),
    ]
    proto = _model(nodes, LOGITS, [TABLE, bias])
    assert _reads_one_row(_at_chosen_positions(proto, {"h": HIDDEN_STATES}))
    softmax = _model(
        [
            helper.make_node("MatMul", ["h", "table"], ["product"]),
            helper.make_node("Softmax", ["product"], ["logits"], axis=-1),
        ],
        LOGITS,
        [TABLE],
    )
    graph = _at_chosen_positions(softmax, {"h": HIDDEN_STATES})  # the fallback: a Gather after
    assert next(n for n in graph.nodes if n.outputs == ("logits",)).inputs[1] == "position"


@pytest.mark.parametrize(
    "why",
    ["softmax over the row", "bias of the result's rank", "product read twice", "3-D table"],
)
def test_elsewhere_a_gather_follows_the_output(why):
    table, bias = TABLE, ("bias", np.ones((1, 1, VOCAB), np.float32))
    outputs, after = LOGITS, []
    if why == "softmax over the row":
        after = [helper.make_node("Softmax", ["product"], ["logits"], axis=-1)]
    elif why == "bias of the result's rank":  # it could broadcast a lower-rank product up
        after = [helper.make_node("Add", ["product", "bias"], ["logits"])]
    elif why == "product read twice":
        after = [helper.make_node("Relu", ["product"], ["logits"])]
        outputs = [*LOGITS, ("product", ["batch", "positions", VOCAB])]
    else:
        table = ("table", np.broadcast_to(TABLE[1], (2, HIDDEN, VOCAB)).copy())
    name = "product" if after else "logits"
    nodes = [helper.make_node("MatMul", ["h", "table"], [name]), *after]
    proto = _model(nodes, outputs, [table, bias])
    graph = _at_last_position(proto, {"h": HIDDEN_STATES})
    assert not _reads_one_row(graph)
    assert next(n for n in graph.nodes if n.outputs == ("logits",)).op_type == "Gather"


def test_what_cannot_be_edited_is_refused_by_name():
    proto = _model([helper.make_node("MatMul", ["h", "table"], ["logits"])], LOGITS, [TABLE])
    with pytest.raises(InputError, match="'scores', which is not an output"):
        transmuter.load(proto, last_position=["scores"])
    flat = _model(
        [helper.make_node("ReduceSum", ["h"], ["logits"], keepdims=0)], [("logits", ["batch"])]
    )
    with pytest.raises(InputError, match="known rank 2 or more"):
        transmuter.load(flat, last_position=["logits"])
    read = _model(
        [
            helper.make_node("MatMul", ["h", "table"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1),
        ],
        [*LOGITS, ("probabilities", ["batch", "positions", VOCAB])],
        [TABLE],
    )
    with pytest.raises(InputError, match="also read inside the graph"):
        transmuter.load(read, last_position=["logits"])
    with pytest.raises(InputError, match="input 'h' is already a name in the graph"):
        transmuter.load(proto, at_position={"logits": "h"})
    with pytest.raises(InputError, match="at_position names 'scores', which is not an output"):
        transmuter.load(proto, at_position={"scores": "position"})
