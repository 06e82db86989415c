"""com.microsoft Attention, QAttention, MultiHeadAttention, GroupQueryAttention and
RotaryEmbedding against ONNX Runtime's CPU kernels (optimizations off).

Where ONNX Runtime's CPU kernel rejects a documented form (Attention's 4-D mask, MultiHeadAttention's
packed QKV / KV, QAttention with int8 input) the expected values come from ONNX Runtime on an
equivalent unpacked or dequantized model, or from numpy. Cache rows past each entry's length and
GroupQueryAttention's padded query rows are left unset by ONNX Runtime, so those are compared
only where the operator defines them.
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from opcheck import assert_close, check_node, make_node_model, ort_run, transmuter_runs

from transmuter.errors import TransmuterError

MS = "com.microsoft"
ATTENTION = [
    "input",
    "weights",
    "bias",
    "mask_index",
    "past",
    "attention_bias",
    "past_sequence_length",
]
QATTENTION = [
    "input",
    "weight",
    "bias",
    "input_scale",
    "weight_scale",
    "mask_index",
    "input_zero_point",
    "weight_zero_point",
    "past",
]
MHA = [
    "query",
    "key",
    "value",
    "bias",
    "key_padding_mask",
    "attention_bias",
    "past_key",
    "past_value",
    "past_sequence_length",
    "cache_indirection",
]
GQA = [
    "query",
    "key",
    "value",
    "past_key",
    "past_value",
    "seqlens_k",
    "total_sequence_length",
    "cos_cache",
    "sin_cache",
    "position_ids",
    "attention_bias",
    "head_sink",
    "k_scale",
    "v_scale",
    "q_norm_weight",
    "k_norm_weight",
    "query_seqlens",
]
ROTARY = ["input", "position_ids", "cos_cache", "sin_cache"]


def _data(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def _names(order, inputs):
    last = max(order.index(n) for n, v in inputs.items() if v is not None)
    return order[: last + 1]


def _check(op_type, order, inputs, attrs, *, outputs=1, tol=1e-5, **options):
    return check_node(
        op_type,
        inputs,
        attrs,
        domain=MS,
        outputs=outputs,
        input_names=_names(order, inputs),
        rtol=tol,
        atol=tol,
        **options,
    )


def _model(op_type, order, inputs, attrs, outputs, out_types=None, **options):
    model = make_node_model(
        op_type,
        inputs,
        attrs,
        domain=MS,
        outputs=outputs,
        input_names=_names(order, inputs),
        **options,
    )
    for index, elem_type in (out_types or {}).items():
        name = model.graph.output[index].name
        model.graph.output[index].CopyFrom(helper.make_tensor_value_info(name, elem_type, None))
    return model


def _compare(model, inputs, expected, *, tol, keep=None):
    """Transmuter's eager and compiled outputs against `expected`; `keep(i, x)` selects what
    output i defines."""
    for mode, outputs in transmuter_runs(model, inputs).items():
        assert len(outputs) == len(expected)
        for i, (got, want) in enumerate(zip(outputs, expected)):
            if keep is not None:
                got, want = keep(i, np.asarray(got)), keep(i, np.asarray(want))
            assert_close(got, want, rtol=tol, atol=tol, what=f"output {i} ({mode})")


# ---------------------------------------------------------------- Attention


def _attention_inputs(rng, batch=2, seq=3, hidden=16, heads=2, sizes=None, dtype=np.float32):
    total = sum(sizes) if sizes else 3 * hidden
    return {
        "input": _data(rng, batch, seq, 12, dtype=dtype),
        "weights": (_data(rng, 12, total) * 0.5).astype(dtype),
        "bias": _data(rng, total, dtype=dtype),
    }


@pytest.mark.parametrize("unidirectional,with_bias", [(0, True), (1, False)])
def test_attention_basic(rng, unidirectional, with_bias):
    inputs = _attention_inputs(rng)
    if not with_bias:
        inputs["bias"] = None
    _check("Attention", ATTENTION, inputs, {"num_heads": 2, "unidirectional": unidirectional})


@pytest.mark.parametrize("sizes", [(8, 8, 4), (12, 12, 8)])
def test_attention_qkv_hidden_sizes(rng, sizes):
    inputs = _attention_inputs(rng, sizes=sizes)
    _check("Attention", ATTENTION, inputs, {"num_heads": 2, "qkv_hidden_sizes": sizes})


@pytest.mark.parametrize("seq,unidirectional", [(1, 1), (3, 1), (3, 0)])
def test_attention_past_present(rng, seq, unidirectional):
    inputs = _attention_inputs(rng, seq=seq)
    inputs["past"] = _data(rng, 2, 2, 2, 4, 8)
    _check(
        "Attention",
        ATTENTION,
        inputs,
        {"num_heads": 2, "unidirectional": unidirectional},
        outputs=2,
    )


# (batch=2, seq=3, past=2, total=5)
MASKS = {
    "end": np.array([4, 2], np.int32),
    "end_start": np.array([5, 3, 1, 0], np.int32),
    "3b+2": np.array([4, 2, 1, 0, 3, 5, 5, 4], np.int32),
    "2d": np.array([[1, 0, 1, 1, 1], [1, 1, 1, 0, 0]], np.int32),
    "2d_values": np.array([[2, -1, 1, 5, 1], [1, 3, 0, 1, 0]], np.int32),
    "3d": np.array([[[1, 1, 0, 1, 1], [0, 1, 1, 1, 0], [1, 1, 1, 1, 1]]] * 2, np.int32),
}


@pytest.mark.parametrize(
    "mask,unidirectional",
    [("end", 0), ("end_start", 1), ("3b+2", 0), ("2d", 1), ("2d_values", 0), ("3d", 1)],
)
def test_attention_mask_index(rng, mask, unidirectional):
    inputs = _attention_inputs(rng)
    inputs["mask_index"] = MASKS[mask]
    inputs["past"] = _data(rng, 2, 2, 2, 2, 8)
    attrs = {"num_heads": 2, "unidirectional": unidirectional}
    _check("Attention", ATTENTION, inputs, attrs, outputs=2, tol=1e-5)


def test_attention_fully_masked_row_and_filter_value(rng):
    """A row whose keys are all padding averages them (the filter value is finite); -10000
    added to scores costs float32 about 1e-3 of absolute precision."""
    inputs = _attention_inputs(rng)
    inputs["mask_index"] = np.array([0, 3], np.int32)
    _check("Attention", ATTENTION, inputs, {"num_heads": 2}, tol=2e-3)
    inputs["mask_index"] = np.array([[0, 1, 1], [1, 1, 0]], np.int32)
    attrs = {"num_heads": 2, "mask_filter_value": -3.0, "unidirectional": 1, "scale": 0.3}
    _check("Attention", ATTENTION, inputs, attrs)


@pytest.mark.parametrize("shape", [(2, 2, 3, 3), (1, 2, 3, 3)])
def test_attention_bias(rng, shape):
    inputs = _attention_inputs(rng)
    inputs["mask_index"] = np.array([[0, 1, 1], [1, 1, 0]], np.int32)
    inputs["attention_bias"] = _data(rng, *shape)
    _check("Attention", ATTENTION, inputs, {"num_heads": 2, "unidirectional": 1})


def test_attention_4d_mask(rng):
    """ONNX Runtime's CPU kernel rejects the (batch, 1, max, max) mask: numpy reference, rows
    at the query's absolute position past + i."""
    inputs = _attention_inputs(rng, seq=2)
    past = _data(rng, 2, 2, 2, 3, 8)
    mask = (rng.random((2, 1, 6, 6)) < 0.7).astype(np.int32)
    mask[..., 0] = 1
    inputs |= {"mask_index": mask, "past": past}
    model = _model("Attention", ATTENTION, inputs, {"num_heads": 2}, 2)
    qkv = inputs["input"] @ inputs["weights"] + inputs["bias"]
    q, k, v = (t.reshape(2, 2, 2, 8).transpose(0, 2, 1, 3) for t in np.split(qkv, 3, -1))
    k = np.concatenate([past[0], k], 2)
    v = np.concatenate([past[1], v], 2)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(8) + np.where(mask[:, :, 3:5, :5], 0, -1e4)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    out = (probs / probs.sum(-1, keepdims=True)) @ v
    expected = [out.transpose(0, 2, 1, 3).reshape(2, 2, 16).astype(np.float32), np.stack([k, v])]
    _compare(model, inputs, expected, tol=1e-5)


def test_attention_float16(rng):
    inputs = _attention_inputs(rng, dtype=np.float16)
    inputs["mask_index"] = np.array([3, 2], np.int32)
    inputs["past"] = _data(rng, 2, 2, 2, 1, 8, dtype=np.float16)
    _check(
        "Attention", ATTENTION, inputs, {"num_heads": 2, "unidirectional": 1}, outputs=2, tol=1e-2
    )


def test_attention_symbolic_batch(rng):
    inputs = _attention_inputs(rng)
    inputs["mask_index"] = np.array([[1, 1, 0], [1, 1, 1]], np.int32)
    _check(
        "Attention", ATTENTION, inputs, {"num_heads": 2}, symbolic={"input": [0], "mask_index": [0]}
    )


@pytest.mark.parametrize(
    "attrs,extra,message",
    [
        ({"do_rotary": 1}, {}, "do_rotary"),
        ({"past_present_share_buffer": 1}, {}, "past_present_share_buffer"),
        ({}, {"mask_index": np.array([1, 2, 3], np.int32)}, "mask"),
        ({"qkv_hidden_sizes": (8, 4, 4)}, {}, "qkv_hidden_sizes"),
    ],
)
def test_attention_errors(rng, attrs, extra, message):
    inputs = _attention_inputs(rng) | extra
    model = _model("Attention", ATTENTION, inputs, {"num_heads": 2} | attrs, 1)
    with pytest.raises(TransmuterError, match=message):
        transmuter_runs(model, inputs, compiled=False)


# ---------------------------------------------------------------- QAttention


def _qattention_inputs(rng, weight_type=np.int8, per_column=False, zero_points=True):
    hidden = 16
    w_low, w_high = (-60, 60) if weight_type == np.int8 else (0, 200)
    inputs = {
        "input": rng.integers(0, 120, (2, 3, 12)).astype(np.uint8),
        "weight": rng.integers(w_low, w_high, (12, 3 * hidden)).astype(weight_type),
        "bias": _data(rng, 3 * hidden),
        "input_scale": np.array(0.02, np.float32),
        "weight_scale": np.array(0.01, np.float32),
    }
    if per_column:
        inputs["weight_scale"] = (rng.random(3 * hidden) * 0.02).astype(np.float32)
    if zero_points:
        inputs["input_zero_point"] = np.array(5, np.uint8)
        if per_column:
            low = -3 if weight_type == np.int8 else 98
            zp = rng.integers(low, low + 6, 3 * hidden)
        else:
            zp = 2 if weight_type == np.int8 else 100
        inputs["weight_zero_point"] = np.asarray(zp).astype(weight_type)
    return inputs


@pytest.mark.parametrize(
    "weight_type,per_column,zero_points",
    [(np.int8, False, True), (np.uint8, True, True), (np.int8, True, False)],
)
def test_qattention(rng, weight_type, per_column, zero_points):
    inputs = _qattention_inputs(rng, weight_type, per_column, zero_points)
    _check("QAttention", QATTENTION, inputs, {"num_heads": 2})


@pytest.mark.parametrize("mask", ["end", "end_start", "2d"])
def test_qattention_mask_past(rng, mask):
    inputs = _qattention_inputs(rng)
    inputs["mask_index"] = MASKS[mask]
    inputs["past"] = _data(rng, 2, 2, 2, 2, 8)
    _check("QAttention", QATTENTION, inputs, {"num_heads": 2, "unidirectional": 1}, outputs=2)


def test_qattention_float16(rng):
    inputs = _qattention_inputs(rng)
    for name in ("bias", "input_scale", "weight_scale"):
        inputs[name] = inputs[name].astype(np.float16)
    _check("QAttention", QATTENTION, inputs, {"num_heads": 2}, tol=1e-2)


def test_qattention_int8_input(rng):
    """ONNX Runtime's CPU kernel has no int8 input: compare with its Attention on the
    dequantized values."""
    inputs = _qattention_inputs(rng)
    inputs["input"] = rng.integers(-100, 100, (2, 3, 12)).astype(np.int8)
    inputs["input_zero_point"] = np.array(-4, np.int8)
    x = (inputs["input"].astype(np.float32) + 4) * inputs["input_scale"]
    w = (inputs["weight"].astype(np.float32) - 2) * inputs["weight_scale"]
    float_inputs = {"input": x, "weights": w, "bias": inputs["bias"]}
    expected = ort_run(
        _model("Attention", ATTENTION, float_inputs, {"num_heads": 2}, 1), float_inputs
    )
    model = _model("QAttention", QATTENTION, inputs, {"num_heads": 2}, 1)
    _compare(model, inputs, expected, tol=1e-5)


# ---------------------------------------------------------------- MultiHeadAttention


def _bnsh(x, heads):
    b, s, h = x.shape
    return x.reshape(b, s, heads, h // heads).transpose(0, 2, 1, 3)


def _mha_inputs(rng, batch=2, seq=3, kv_seq=3, heads=2, size=8, v_size=8, dtype=np.float32):
    return {
        "query": _data(rng, batch, seq, heads * size, dtype=dtype),
        "key": _data(rng, batch, kv_seq, heads * size, dtype=dtype),
        "value": _data(rng, batch, kv_seq, heads * v_size, dtype=dtype),
        "bias": _data(rng, heads * (2 * size + v_size), dtype=dtype),
    }


@pytest.mark.parametrize(
    "seq,kv_seq,v_size,with_bias,unidirectional",
    [(3, 3, 8, True, 0), (3, 3, 8, False, 1), (2, 5, 6, True, 0), (4, 1, 8, False, 0)],
)
def test_mha_separate_qkv(rng, seq, kv_seq, v_size, with_bias, unidirectional):
    inputs = _mha_inputs(rng, seq=seq, kv_seq=kv_seq, v_size=v_size)
    if not with_bias:
        inputs["bias"] = None
    _check(
        "MultiHeadAttention",
        MHA,
        inputs,
        {"num_heads": 2, "unidirectional": unidirectional},
        outputs=3,
    )


@pytest.mark.parametrize("with_past", [False, True])
def test_mha_bnsh_key_value(rng, with_past):
    """Cross attention with key/value already in heads: the bias applies to the query only."""
    inputs = _mha_inputs(rng, kv_seq=5)
    inputs["key"] = _bnsh(inputs["key"], 2)
    inputs["value"] = _bnsh(inputs["value"], 2)
    if with_past:
        inputs |= {"past_key": _data(rng, 2, 2, 3, 8), "past_value": _data(rng, 2, 2, 3, 8)}
    inputs["key_padding_mask"] = np.array([4, 8 if with_past else 5], np.int32)
    _check("MultiHeadAttention", MHA, inputs, {"num_heads": 2}, outputs=3)


@pytest.mark.parametrize("seq,unidirectional", [(1, 1), (3, 1), (3, 0)])
def test_mha_past_present(rng, seq, unidirectional):
    inputs = _mha_inputs(rng, seq=seq, kv_seq=seq)
    inputs |= {"past_key": _data(rng, 2, 2, 4, 8), "past_value": _data(rng, 2, 2, 4, 8)}
    _check(
        "MultiHeadAttention",
        MHA,
        inputs,
        {"num_heads": 2, "unidirectional": unidirectional},
        outputs=3,
    )


# (batch=2, seq=3, past=2, total=5)
MHA_MASKS = {k: MASKS[k] for k in ("end", "3b+2", "2d", "2d_values", "3d")}


@pytest.mark.parametrize("mask", list(MHA_MASKS))
def test_mha_key_padding_mask(rng, mask):
    inputs = _mha_inputs(rng)
    inputs |= {"key_padding_mask": MHA_MASKS[mask], "attention_bias": _data(rng, 1, 2, 3, 5)}
    inputs |= {"past_key": _data(rng, 2, 2, 2, 8), "past_value": _data(rng, 2, 2, 2, 8)}
    attrs = {"num_heads": 2, "unidirectional": 1, "mask_filter_value": -50.0, "scale": 0.2}
    _check("MultiHeadAttention", MHA, inputs, attrs, outputs=3)


@pytest.mark.parametrize("shape", [(2, 2, 3, 4), (2, 1, 3, 4)])
def test_mha_attention_bias(rng, shape):
    inputs = _mha_inputs(rng, kv_seq=4)
    inputs["attention_bias"] = _data(rng, *shape)
    _check("MultiHeadAttention", MHA, inputs, {"num_heads": 2}, outputs=3)


@pytest.mark.parametrize("unidirectional", [0, 1])
def test_mha_qk_output(rng, unidirectional):
    inputs = _mha_inputs(rng)
    inputs |= {"key_padding_mask": MASKS["end"], "attention_bias": _data(rng, 2, 2, 3, 5)}
    inputs |= {"past_key": _data(rng, 2, 2, 2, 8), "past_value": _data(rng, 2, 2, 2, 8)}
    attrs = {"num_heads": 2, "unidirectional": unidirectional, "scale": 0.5}
    model = _model("MultiHeadAttention", MHA, inputs, attrs, 4, {3: TensorProto.FLOAT})
    _compare(model, inputs, ort_run(model, inputs), tol=1e-4)


@pytest.mark.parametrize("packing", ["qkv", "kv"])
def test_mha_packed(rng, packing):
    """ONNX Runtime's CPU kernel rejects packed inputs: compare with it on the unpacked ones."""
    inputs = _mha_inputs(rng)
    inputs["bias"] = None
    expected = ort_run(_model("MultiHeadAttention", MHA, inputs, {"num_heads": 2}, 3), inputs)

    def heads_axis(x):  # (batch, seq, heads, 1, size)
        b, s, h = x.shape
        return x.reshape(b, s, 2, 1, h // 2)

    packed = {"query": inputs["query"]}
    if packing == "qkv":
        parts = ("query", "key", "value")
        packed["query"] = np.concatenate([heads_axis(inputs[n]) for n in parts], axis=3)
    else:
        packed["key"] = np.concatenate([heads_axis(inputs[n]) for n in ("key", "value")], axis=3)
    model = _model("MultiHeadAttention", MHA, packed, {"num_heads": 2}, 3)
    _compare(model, packed, expected, tol=1e-5)


def test_mha_float16(rng):
    inputs = _mha_inputs(rng, dtype=np.float16)
    inputs |= {
        "key_padding_mask": MASKS["2d"],
        "past_key": _data(rng, 2, 2, 2, 8, dtype=np.float16),
        "past_value": _data(rng, 2, 2, 2, 8, dtype=np.float16),
    }
    _check(
        "MultiHeadAttention",
        MHA,
        inputs,
        {"num_heads": 2, "unidirectional": 1},
        outputs=3,
        tol=5e-3,
    )


def test_mha_symbolic_batch(rng):
    inputs = _mha_inputs(rng)
    inputs["key_padding_mask"] = np.array([[1, 1, 0], [1, 1, 1]], np.int32)
    symbolic = {n: [0] for n in ("query", "key", "value", "key_padding_mask")}
    _check("MultiHeadAttention", MHA, inputs, {"num_heads": 2}, symbolic=symbolic)


@pytest.mark.parametrize(
    "extra,message",
    [
        ({"key_padding_mask": np.array([3, 3, 0, 0], np.int32)}, "mask"),
        ({"past_sequence_length": np.array([1], np.int32)}, "past_sequence_length"),
        ({"key": None, "value": None}, "key is required"),
    ],
)
def test_mha_errors(rng, extra, message):
    inputs = _mha_inputs(rng) | extra
    model = _model("MultiHeadAttention", MHA, inputs, {"num_heads": 2}, 1)
    with pytest.raises(TransmuterError, match=message):
        transmuter_runs(model, inputs, compiled=False)


# ---------------------------------------------------------------- GroupQueryAttention


def _gqa_inputs(
    rng, *, batch=2, seq=4, heads=4, kv_heads=2, size=16, past=0, seqlens, total, dtype=np.float32
):
    inputs = {
        "query": _data(rng, batch, seq, heads * size, dtype=dtype),
        "key": _data(rng, batch, seq, kv_heads * size, dtype=dtype),
        "value": _data(rng, batch, seq, kv_heads * size, dtype=dtype),
        "past_key": None,
        "past_value": None,
        "seqlens_k": np.array(seqlens, np.int32),
        "total_sequence_length": np.array(total, np.int32),
    }
    if past:
        inputs["past_key"] = _data(rng, batch, kv_heads, past, size, dtype=dtype)
        inputs["past_value"] = _data(rng, batch, kv_heads, past, size, dtype=dtype)
    return inputs


def _gqa(
    inputs,
    attrs,
    *,
    heads=4,
    kv_heads=2,
    outputs=3,
    out_types=None,
    tol=1e-5,
    constants=("total_sequence_length",),
    keep=None,
    **options,
):
    """GroupQueryAttention against ONNX Runtime; present rows at or past seqlens_k + 1 are
    left unset by ONNX Runtime, so they are compared as zeros."""
    attrs = {"num_heads": heads, "kv_num_heads": kv_heads} | attrs
    model = _model(
        "GroupQueryAttention",
        GQA,
        inputs,
        attrs,
        outputs,
        out_types,
        constants=constants,
        **options,
    )
    lengths = inputs["seqlens_k"].astype(np.int64) + 1

    def defined(i, x):
        if i in (1, 2):
            valid = np.arange(x.shape[2])[None, :] < lengths[:, None]
            x = np.where(valid[:, None, :, None], x, 0).astype(x.dtype)
        return x if keep is None else keep(i, x)

    _compare(model, inputs, ort_run(model, inputs), tol=tol, keep=defined)


@pytest.mark.parametrize(
    "heads,kv_heads,seqlens,causal",
    [
        (4, 2, [3, 3], 1),
        (4, 1, [3, 1], 1),
        (2, 2, [3, 0], 1),
        (4, 2, [3, 1], 0),
        (4, 1, [3, 3], 0),
    ],
)
def test_gqa_prompt(rng, heads, kv_heads, seqlens, causal):
    """First prompt; seqlens_k below sequence_length - 1 is a right-padded prompt."""
    inputs = _gqa_inputs(rng, heads=heads, kv_heads=kv_heads, seqlens=seqlens, total=4)
    _gqa(inputs, {"causal": causal}, heads=heads, kv_heads=kv_heads)


def test_gqa_packed_qkv(rng):
    inputs = _gqa_inputs(rng, seqlens=[3, 2], total=4)
    inputs["query"] = np.concatenate(
        [inputs.pop("query"), inputs.pop("key"), inputs.pop("value")], -1
    )
    inputs = {"query": inputs["query"], "key": None, "value": None} | inputs
    _gqa(inputs, {"do_rotary": 0})


@pytest.mark.parametrize(
    "past,seqlens,total,causal",
    [
        (5, [5, 3], 6, 1),  # growing cache, ragged batch
        (8, [5, 2], 6, 1),  # fixed-size cache longer than total_sequence_length
        (8, [7, 7], 8, 0),
    ],
)
def test_gqa_decode(rng, past, seqlens, total, causal):
    inputs = _gqa_inputs(rng, seq=1, past=past, seqlens=seqlens, total=total)
    _gqa(inputs, {"causal": causal})


@pytest.mark.parametrize("seqlens", [[8], [6]])
def test_gqa_subsequent_prompt(rng, seqlens):
    """Several new tokens after a cache (ONNX Runtime allows it only for batch 1)."""
    inputs = _gqa_inputs(rng, batch=1, seq=3, past=6, seqlens=seqlens, total=9)
    _gqa(inputs, {})


@pytest.mark.parametrize("interleaved,rotary_dim", [(0, 16), (1, 32)])
def test_gqa_rotary(rng, interleaved, rotary_dim):
    attrs = {"do_rotary": 1, "rotary_interleaved": interleaved}
    inputs = _gqa_inputs(rng, size=32, seqlens=[3, 2], total=4)
    inputs |= {
        "cos_cache": _data(rng, 16, rotary_dim // 2),
        "sin_cache": _data(rng, 16, rotary_dim // 2),
    }
    _gqa(inputs, attrs)
    decode = _gqa_inputs(rng, seq=1, size=32, past=6, seqlens=[6, 3], total=7)
    decode |= {"cos_cache": inputs["cos_cache"], "sin_cache": inputs["sin_cache"]}
    _gqa(decode, attrs)


def test_gqa_rotary_position_ids(rng):
    attrs = {"do_rotary": 1}
    cos, sin = _data(rng, 16, 8), _data(rng, 16, 8)
    decode = _gqa_inputs(rng, seq=1, past=6, seqlens=[6, 3], total=7)
    decode |= {"cos_cache": cos, "sin_cache": sin, "position_ids": np.array([[9], [2]])}
    _gqa(decode, attrs)
    # On the first prompt ONNX Runtime reads only position_ids[0, 0].
    prompt = _gqa_inputs(rng, seqlens=[3, 3], total=4)
    prompt |= {
        "cos_cache": cos,
        "sin_cache": sin,
        "position_ids": np.array([[2, 3, 4, 5], [0, 1, 2, 3]]),
    }
    _gqa(prompt, attrs)


@pytest.mark.parametrize("window", [0, 2])
def test_gqa_local_window(rng, window):
    prompt = _gqa_inputs(rng, seqlens=[3, 3], total=4)
    _gqa(prompt, {"local_window_size": window})
    decode = _gqa_inputs(rng, seq=1, past=5, seqlens=[5, 2], total=6)
    _gqa(decode, {"local_window_size": window})


@pytest.mark.parametrize(
    "attrs",
    [
        {"softcap": 0.5},
        {"scale": 0.3, "softcap": 2.0},
        {"smooth_softmax": 1, "scale": 0.0},
    ],
)
def test_gqa_score_options(rng, attrs):
    inputs = _gqa_inputs(rng, seqlens=[3, 1], total=4)
    _gqa(inputs, attrs)


@pytest.mark.parametrize("smooth_softmax", [-1, 1])
def test_gqa_head_sink(rng, smooth_softmax):
    inputs = _gqa_inputs(rng, seq=1, past=4, seqlens=[4, 1], total=5)
    inputs["head_sink"] = _data(rng, 4)
    _gqa(inputs, {"smooth_softmax": smooth_softmax, "local_window_size": 2})


@pytest.mark.parametrize("shape", [(2, 1, 4, 4), (1, 4, 4, 4)])
def test_gqa_attention_bias(rng, shape):
    inputs = _gqa_inputs(rng, seqlens=[3, 2], total=4)
    inputs["attention_bias"] = _data(rng, *shape)
    _gqa(inputs, {"softcap": 1.0})


def test_gqa_attention_bias_fixed_cache(rng):
    """attention_bias spans total_sequence_length, not the longer cache."""
    inputs = _gqa_inputs(rng, seq=1, past=8, seqlens=[5, 3], total=6)
    inputs["attention_bias"] = _data(rng, 2, 4, 1, 6)
    _gqa(inputs, {})


@pytest.mark.parametrize("qk_output", [1, 2])
def test_gqa_qk_output(rng, qk_output):
    for inputs in (
        _gqa_inputs(rng, seqlens=[3, 3], total=4),
        _gqa_inputs(rng, seq=1, past=8, seqlens=[5, 2], total=6),
    ):
        inputs["attention_bias"] = _data(
            rng, 1, 1, inputs["query"].shape[1], 4 if inputs["past_key"] is None else 6
        )
        attrs = {"qk_output": qk_output, "softcap": 2.0, "local_window_size": 3}
        _gqa(inputs, attrs, outputs=4, out_types={3: TensorProto.FLOAT})


def test_gqa_float16(rng):
    cos, sin = _data(rng, 16, 8, dtype=np.float16), _data(rng, 16, 8, dtype=np.float16)
    prompt = _gqa_inputs(rng, seqlens=[3, 1], total=4, dtype=np.float16)
    prompt |= {"cos_cache": cos, "sin_cache": sin}
    _gqa(prompt, {"do_rotary": 1}, tol=5e-3)
    decode = _gqa_inputs(rng, seq=1, past=5, seqlens=[5, 3], total=6, dtype=np.float16)
    decode |= {"cos_cache": cos, "sin_cache": sin}
    _gqa(decode, {"do_rotary": 1, "softcap": 1.0}, tol=5e-3)


def test_gqa_symbolic_batch_and_runtime_total(rng):
    """A named batch dim, and total_sequence_length fed at run time (a graph break)."""
    inputs = _gqa_inputs(rng, seq=1, past=5, seqlens=[5, 3], total=6)
    symbolic = {n: [0] for n in ("query", "key", "value", "past_key", "past_value", "seqlens_k")}
    _gqa(inputs, {}, symbolic=symbolic)
    _gqa(inputs, {}, constants=())


def test_gqa_query_seqlens(rng):
    """Right-padded chunks after a cache: rows at or past query_seqlens[b] are unspecified."""
    inputs = _gqa_inputs(rng, seq=3, past=4, seqlens=[4, 1], total=8)
    inputs["query_seqlens"] = np.array([3, 2], np.int32)

    def valid_rows(i, x):
        if i == 0:
            x = np.where((np.arange(3)[None, :] < np.array([[3], [2]]))[..., None], x, 0)
        return x.astype(np.float32)

    _gqa(inputs, {}, keep=valid_rows)


@pytest.mark.parametrize(
    "attrs,extra,message",
    [
        ({"k_quant_type": "PER_TENSOR"}, {}, "k_quant_type"),
        ({}, {"k_scale": np.ones(1, np.float32)}, "k_scale"),
        (
            {},
            {"q_norm_weight": np.ones(16, np.float32), "k_norm_weight": np.ones(16, np.float32)},
            "q_norm_weight",
        ),
        ({"sliding_window_cache": 1, "local_window_size": 2}, {}, "sliding_window_cache"),
        ({"causal": 0, "local_window_size": 2}, {}, "local_window_size"),
        ({"do_rotary": 1}, {}, "cos_cache"),
    ],
)
def test_gqa_errors(rng, attrs, extra, message):
    inputs = _gqa_inputs(rng, seqlens=[3, 3], total=4) | extra
    model = _model(
        "GroupQueryAttention", GQA, inputs, {"num_heads": 4, "kv_num_heads": 2} | attrs, 3
    )
    with pytest.raises(TransmuterError, match=message):
        transmuter_runs(model, inputs, compiled=False)


# ---------------------------------------------------------------- RotaryEmbedding


@pytest.mark.parametrize(
    "interleaved,positions,rank", [(0, "start", 3), (1, "ids", 3), (0, "ids", 4), (1, "start", 4)]
)
def test_rotary_embedding(rng, interleaved, positions, rank):
    x = _data(rng, 2, 3, 16) if rank == 3 else _data(rng, 2, 2, 3, 8)
    ids = np.array([4]) if positions == "start" else np.array([[3, 1, 0], [5, 6, 7]])
    inputs = {
        "input": x,
        "position_ids": ids,
        "cos_cache": _data(rng, 10, 4),
        "sin_cache": _data(rng, 10, 4),
    }
    _check("RotaryEmbedding", ROTARY, inputs, {"interleaved": interleaved})


@pytest.mark.parametrize(
    "attrs",
    [
        {"num_heads": 2, "rotary_embedding_dim": 4},
        {"num_heads": 2, "rotary_embedding_dim": 4, "interleaved": 1},
        {"num_heads": 4},
        {"scale": 2.0, "is_packed_batching": 1, "num_heads": 2, "rotary_embedding_dim": 4},
    ],
)
def test_rotary_embedding_attributes(rng, attrs):
    # Every case rotates 4 features per head: cos_cache holds 2 per position.
    x = _data(rng, 2, 3, 16)
    inputs = {
        "input": x,
        "position_ids": np.array([[3, 1, 0], [5, 6, 7]]),
        "cos_cache": _data(rng, 10, 2),
        "sin_cache": _data(rng, 10, 2),
    }
    _check("RotaryEmbedding", ROTARY, inputs, attrs)


def test_rotary_embedding_float16_symbolic(rng):
    inputs = {
        "input": _data(rng, 2, 3, 16, dtype=np.float16),
        "position_ids": np.array([1]),
        "cos_cache": _data(rng, 10, 4, dtype=np.float16),
        "sin_cache": _data(rng, 10, 4, dtype=np.float16),
    }
    _check("RotaryEmbedding", ROTARY, inputs, {}, tol=2e-3, symbolic={"input": [0]})


def test_rotary_embedding_errors(rng):
    inputs = {
        "input": _data(rng, 2, 3, 16),
        "position_ids": np.array([1]),
        "cos_cache": _data(rng, 10, 2),
        "sin_cache": _data(rng, 10, 2),
    }
    model = _model("RotaryEmbedding", ROTARY, inputs, {"rotary_embedding_dim": 4}, 1)
    with pytest.raises(TransmuterError, match="num_heads"):
        transmuter_runs(model, inputs, compiled=False)


def test_zero_batch():
    f = np.float32
    attention = {
        "input": np.zeros((0, 3, 12), f),
        "weights": np.ones((12, 48), f),
        "bias": np.ones(48, f),
    }
    _check("Attention", ATTENTION, attention, {"num_heads": 2}, outputs=2)
    mha = {n: np.zeros((0, 3, 16), f) for n in ("query", "key", "value")}
    _check("MultiHeadAttention", MHA, mha, {"num_heads": 2}, outputs=3)
    rotary = {
        "input": np.zeros((0, 3, 16), f),
        "position_ids": np.array([1]),
        "cos_cache": np.ones((8, 4), f),
        "sin_cache": np.ones((8, 4), f),
    }
    _check("RotaryEmbedding", ROTARY, rotary, {})


def test_contrib_ops_are_domain_scoped():
    """The com.microsoft ops never resolve to the ai.onnx ones of the same name."""
    from transmuter.lowering import lookup

    assert lookup(MS, "Attention", 1).fn is not lookup("", "Attention", 23).fn
    assert lookup(MS, "RotaryEmbedding", 1).fn is not lookup("", "RotaryEmbedding", 23).fn
    assert onnx.defs.has("Attention")
