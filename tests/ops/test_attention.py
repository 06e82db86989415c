"""Attention, FlexAttention, RotaryEmbedding, TensorScatter, LinearAttention vs ONNX Runtime.

onnx.reference is used where ONNX Runtime lacks a case: LinearAttention, V typed unlike Q, short
masks (opset 24 pads them; ONNX Runtime rejects them) and qk_matmul_output mode 2 with -inf
biases (ONNX Runtime writes the lowest float where the spec and onnx.reference write -inf).
"""

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from opcheck import assert_close, check_node, make_node_model, ort_run, transmuter_runs

from transmuter.errors import TransmuterError

ATTENTION_INPUTS = ["Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen"]
ALL_OUTPUTS = ["Y", "present_key", "present_value", "qk"]
OPSETS = [23, 24, 25]


def _data(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def _attention(inputs, attrs=None, *, opset=23, outputs=1, reference="ort", tol=1e-5):
    names = [n for n in ATTENTION_INPUTS if n in inputs]
    names = ATTENTION_INPUTS[: ATTENTION_INPUTS.index(names[-1]) + 1]
    return check_node(
        "Attention",
        inputs,
        attrs or {},
        opset=opset,
        outputs=outputs,
        input_names=names,
        reference=reference,
        rtol=tol,
        atol=tol,
    )


def _qkv(
    rng, batch=2, heads=4, kv_heads=None, q_len=3, kv_len=5, size=8, v_size=None, dtype=np.float32
):
    kv_heads = kv_heads or heads
    return {
        "Q": _data(rng, (batch, heads, q_len, size), dtype),
        "K": _data(rng, (batch, kv_heads, kv_len, size), dtype),
        "V": _data(rng, (batch, kv_heads, kv_len, v_size or size), dtype),
    }


def _packed(inputs):
    """4-D (batch, heads, seq, size) inputs as 3-D (batch, seq, heads * size)."""
    out = dict(inputs)
    for name in ("Q", "K", "V"):
        b, h, s, d = inputs[name].shape
        out[name] = inputs[name].transpose(0, 2, 1, 3).reshape(b, s, h * d)
    return out


@pytest.mark.parametrize(
    "heads,kv_heads,q_len,kv_len,v_size,packed",
    [
        (4, 4, 3, 5, 8, False),  # multi-head, cross attention
        (4, 2, 3, 5, 8, True),  # grouped-query
        (4, 1, 4, 4, 6, False),  # multi-query, V's head size differs
        (2, 2, 1, 7, 4, True),
        (6, 3, 5, 2, 8, False),
    ],
)
def test_attention_layouts(rng, heads, kv_heads, q_len, kv_len, v_size, packed):
    inputs = _qkv(rng, heads=heads, kv_heads=kv_heads, q_len=q_len, kv_len=kv_len, v_size=v_size)
    attrs = {}
    if packed:
        inputs = _packed(inputs)
        attrs = {"q_num_heads": heads, "kv_num_heads": kv_heads}
    _attention(inputs, attrs, opset=24)


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("packed", [False, True])
def test_attention_versions(rng, opset, packed):
    """GQA with a cache, a causal mask and a boolean mask, at each since-version."""
    inputs = _qkv(rng, kv_heads=2, q_len=3, kv_len=3)
    inputs["attn_mask"] = rng.random((3, 7)) < 0.8
    inputs["attn_mask"][:, 0] = True
    inputs["past_key"] = _data(rng, (2, 2, 4, 8))
    inputs["past_value"] = _data(rng, (2, 2, 4, 8))
    attrs = {"is_causal": 1}
    if packed:
        inputs = _packed(inputs)
        attrs |= {"q_num_heads": 4, "kv_num_heads": 2}
    _attention(inputs, attrs, opset=opset, outputs=ALL_OUTPUTS)


@pytest.mark.parametrize("q_len,kv_len,kv_heads", [(4, 4, 4), (3, 6, 2), (5, 2, 1)])
def test_attention_causal(rng, q_len, kv_len, kv_heads):
    inputs = _qkv(rng, kv_heads=kv_heads, q_len=q_len, kv_len=kv_len)
    _attention(inputs, {"is_causal": 1}, opset=23)


@pytest.mark.parametrize(
    "is_causal,packed,kv_heads", [(0, False, 4), (1, False, 2), (0, True, 2), (1, True, 1)]
)
def test_attention_past_key_value(rng, is_causal, packed, kv_heads):
    inputs = _qkv(rng, kv_heads=kv_heads, q_len=3, kv_len=3, v_size=6)
    inputs["past_key"] = _data(rng, (2, kv_heads, 4, 8))
    inputs["past_value"] = _data(rng, (2, kv_heads, 4, 6))
    attrs = {"is_causal": is_causal}
    if packed:
        inputs = _packed(inputs)
        attrs |= {"q_num_heads": 4, "kv_num_heads": kv_heads}
    _attention(inputs, attrs, opset=23, outputs=3)


def test_attention_decode_step(rng):
    """One new token against a long cache, the autoregressive step."""
    inputs = _qkv(rng, kv_heads=2, q_len=1, kv_len=1)
    inputs["past_key"] = _data(rng, (2, 2, 9, 8))
    inputs["past_value"] = _data(rng, (2, 2, 9, 8))
    _attention(inputs, {"is_causal": 1}, opset=24, outputs=3)


def test_attention_present_without_past(rng):
    _attention(_qkv(rng), opset=23, outputs=3)


@pytest.mark.parametrize(
    "shape,kind,is_causal",
    [
        ((3, 5), "bool", 0),
        ((3, 5), "float", 1),
        ((4, 3, 5), "bool", 1),
        ((4, 3, 5), "float", 0),
        ((2, 1, 3, 5), "bool", 0),
        ((2, 1, 3, 5), "float", 1),
        ((1, 4, 1, 5), "bool", 1),
        ((1, 4, 1, 5), "float", 0),
        ((2, 4, 3, 5), "bool", 1),
    ],
)
def test_attention_masks(rng, shape, kind, is_causal):
    inputs = _qkv(rng)
    if kind == "bool":
        mask = rng.random(shape) < 0.7
        mask[..., 0] = True  # every row keeps a key, so ONNX Runtime and the spec agree
    else:
        mask = _data(rng, shape)
    inputs["attn_mask"] = mask
    if shape[-2] != 1:
        _attention(inputs, {"is_causal": is_causal}, opset=24)
        return
    # ONNX Runtime wants the mask's query axis in full (the spec asks only that it broadcasts),
    # and onnx.reference then builds its causal mask one query long: expect ONNX Runtime's
    # answer for the same mask spelled out.
    full = dict(inputs, attn_mask=np.broadcast_to(mask, shape[:-2] + (3, 5)).copy())
    names = ATTENTION_INPUTS[:4]
    expected = ort_run(
        make_node_model("Attention", full, {"is_causal": is_causal}, opset=24, input_names=names),
        full,
    )
    model = make_node_model(
        "Attention", inputs, {"is_causal": is_causal}, opset=24, input_names=names
    )
    for mode, outputs in transmuter_runs(model, inputs).items():
        assert_close(outputs[0], expected[0], rtol=1e-5, atol=1e-5, what=f"Attention ({mode})")


def test_attention_integer_mask_is_added(rng):
    inputs = _qkv(rng)
    inputs["attn_mask"] = rng.integers(-3, 3, (3, 5)).astype(np.int64)
    _attention(inputs, opset=23)


@pytest.mark.parametrize("kind,mode", [("bool", 3), ("float", 0)])
def test_attention_fully_masked_rows_are_zero(rng, kind, mode):
    inputs = _qkv(rng)
    mask = rng.random((2, 1, 3, 5)) < 0.7
    mask[..., 0] = True
    mask[0, 0, 1] = False
    mask[1, 0, 2] = False
    inputs["attn_mask"] = mask if kind == "bool" else np.where(mask, 0, -np.inf).astype(np.float32)
    outputs = _attention(
        inputs, {"qk_matmul_output_mode": mode}, opset=24, outputs=["Y", "", "", "qk"]
    )
    assert not np.isnan(outputs[0]).any()
    np.testing.assert_array_equal(outputs[0][0, :, 1], 0)


@pytest.mark.parametrize("mode,softcap", [(0, 0.0), (0, 1.5), (1, 1.5), (2, 1.5), (3, 0.0)])
def test_attention_qk_output_modes(rng, mode, softcap):
    inputs = _qkv(rng, kv_heads=2)
    inputs["attn_mask"] = _data(rng, (3, 5))
    attrs = {"qk_matmul_output_mode": mode, "softcap": softcap}
    _attention(inputs, attrs, opset=23, outputs=ALL_OUTPUTS)


@pytest.mark.parametrize("opset", [24, 25])
def test_attention_qk_mode_2_keeps_minus_infinity(rng, opset):
    inputs = _qkv(rng)
    inputs["attn_mask"] = rng.random((3, 5)) < 0.6
    attrs = {"qk_matmul_output_mode": 2, "is_causal": 1}
    _attention(inputs, attrs, opset=opset, outputs=["Y", "", "", "qk"], reference="onnx")


@pytest.mark.parametrize("scale,softcap", [(0.5, 0.0), (0.01, 3.0), (2.0, 3.0)])
def test_attention_scale_softcap(rng, scale, softcap):
    _attention(_qkv(rng), {"scale": scale, "softcap": softcap}, opset=23, tol=1e-5)


@pytest.mark.parametrize("precision", [1, 11])
def test_attention_softmax_precision(rng, precision):
    inputs = _qkv(rng)
    inputs["attn_mask"] = _data(rng, (3, 5))
    _attention(inputs, {"softmax_precision": precision}, opset=23)


@pytest.mark.parametrize("causal,precision", [(0, None), (1, 1)])
def test_attention_float16(rng, causal, precision):
    inputs = _qkv(rng, kv_heads=2, dtype=np.float16)
    inputs["attn_mask"] = _data(rng, (3, 5), np.float16)
    attrs = {"is_causal": causal}
    if precision:
        attrs["softmax_precision"] = precision
    _attention(inputs, attrs, opset=24, outputs=ALL_OUTPUTS, tol=3e-3)


def test_attention_float64(rng):
    inputs = _qkv(rng, kv_heads=2, dtype=np.float64)
    # ONNX Runtime's double kernel is only float32-accurate (errors near 1e-7).
    _attention(inputs, {"is_causal": 1}, opset=23, tol=1e-10, reference="onnx")


def test_attention_bfloat16(rng):
    inputs = _qkv(rng, kv_heads=2)
    inputs["attn_mask"] = _data(rng, (3, 5))
    expected = ort_run(make_node_model("Attention", inputs, {}, opset=24), inputs)[0]
    half = {k: v.astype(ml_dtypes.bfloat16) for k, v in inputs.items()}
    model = make_node_model("Attention", half, {}, opset=24)
    for mode, outputs in transmuter_runs(model, half).items():
        assert outputs[0].dtype == ml_dtypes.bfloat16
        got = np.asarray(outputs[0]).astype(np.float32)
        assert_close(got, expected, rtol=3e-2, atol=3e-2, what=f"Attention bfloat16 ({mode})")


def test_attention_value_type_differs(rng):
    inputs = _qkv(rng)
    inputs["V"] = inputs["V"].astype(np.float16)
    _attention(inputs, opset=24, outputs=3, reference="onnx", tol=1e-3)


@pytest.mark.parametrize("is_causal,lengths", [(0, [6, 3]), (1, [6, 3]), (1, [4, 0]), (1, [6, 6])])
def test_attention_nonpad_kv_seqlen(rng, is_causal, lengths):
    inputs = _qkv(rng, q_len=4, kv_len=6)
    inputs["nonpad_kv_seqlen"] = np.array(lengths, np.int64)
    # [4, 0] leaves rows with no key; zero rows are the spec's answer (onnx.reference's too).
    reference = "onnx" if 0 in lengths else "ort"
    _attention(inputs, {"is_causal": is_causal}, opset=24, reference=reference)


@pytest.mark.parametrize("opset,kind", [(24, "bool"), (25, "float")])
def test_attention_short_mask_is_padded(rng, opset, kind):
    inputs = _qkv(rng, q_len=3, kv_len=6)
    inputs["attn_mask"] = rng.random((3, 4)) < 0.8 if kind == "bool" else _data(rng, (3, 4))
    inputs["attn_mask"][..., 0] = 1
    _attention(inputs, {}, opset=opset, reference="onnx")


def test_attention_short_mask_is_an_error_at_23(rng):
    inputs = _qkv(rng, q_len=3, kv_len=6)
    inputs["attn_mask"] = _data(rng, (3, 4))
    with pytest.raises(TransmuterError, match="attn_mask"):
        transmuter_runs(make_node_model("Attention", inputs, {}, opset=23), inputs)


@pytest.mark.parametrize(
    "left,right,is_causal,past",
    [(1, 0, 0, 0), (2, 1, 0, 3), (0, -1, 0, 3), (1, 3, 1, 0)],
)
def test_attention_sliding_window(rng, left, right, is_causal, past):
    inputs = _qkv(rng, kv_heads=2, q_len=4, kv_len=4 if past else 6)
    if past:
        inputs["past_key"] = _data(rng, (2, 2, past, 8))
        inputs["past_value"] = _data(rng, (2, 2, past, 8))
    attrs = {"left_window_size": left, "right_window_size": right, "is_causal": is_causal}
    _attention(inputs, attrs, opset=25, outputs=1 if not past else 3)


def test_attention_sliding_window_with_nonpad(rng):
    inputs = _qkv(rng, q_len=2, kv_len=6)
    inputs["nonpad_kv_seqlen"] = np.array([5, 3], np.int64)
    attrs = {"left_window_size": 1, "is_causal": 1}
    _attention(inputs, attrs, opset=25, reference="onnx")


def test_attention_head_counts_with_4d_inputs(rng):
    inputs = _qkv(rng, kv_heads=2)
    _attention(inputs, {"q_num_heads": 4, "kv_num_heads": 2}, opset=24)
    with pytest.raises(TransmuterError, match="4-D"):
        model = make_node_model(
            "Attention", inputs, {"q_num_heads": 4, "kv_num_heads": 2}, opset=25
        )
        transmuter_runs(model, inputs, compiled=False)


@pytest.mark.parametrize(
    "shapes,attrs",
    [
        (((2, 4, 3, 8), (2, 3, 5, 8), (2, 3, 5, 8)), {}),  # 4 heads over 3
        (((2, 4, 3, 8), (2, 4, 5, 6), (2, 4, 5, 8)), {}),  # head sizes differ
        (((2, 3, 12), (2, 5, 12), (2, 5, 12)), {"q_num_heads": 4}),  # kv_num_heads missing
        (((2, 3, 12), (2, 5, 12), (2, 5, 12)), {"q_num_heads": 5, "kv_num_heads": 4}),
    ],
)
def test_attention_bad_shapes(rng, shapes, attrs):
    inputs = {n: _data(rng, s) for n, s in zip("QKV", shapes)}
    with pytest.raises(TransmuterError):
        transmuter_runs(
            make_node_model("Attention", inputs, attrs, opset=23), inputs, compiled=False
        )


def test_attention_symbolic_batch(rng):
    inputs = _qkv(rng, kv_heads=2)
    inputs["attn_mask"] = rng.random((3, 5)) < 0.8
    inputs["attn_mask"][:, 0] = True
    check_node(
        "Attention",
        inputs,
        {"is_causal": 1},
        opset=23,
        input_names=ATTENTION_INPUTS[:4],
        symbolic={"Q": [0], "K": [0], "V": [0]},
    )


def test_attention_zero_length_query(rng):
    inputs = _qkv(rng, q_len=0)
    _attention(inputs, {"is_causal": 1}, opset=24, outputs=3, reference="onnx")


# FlexAttention (ai.onnx.preview; ONNX Runtime 1.32 has no kernel: onnx.reference)


def _modifier(name, op_type, constant):
    """A one-node subgraph (x) -> op_type(x, constant) over a float32 rank-4 tensor."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    c = numpy_helper.from_array(np.asarray(constant, np.float32), "c")
    return helper.make_graph([helper.make_node(op_type, ["x", "c"], ["y"])], name, [x], [y], [c])


@pytest.mark.parametrize(
    "kv_heads,dtype,attrs",
    [
        (4, np.float32, {}),
        (2, np.float32, {"scale": 0.3}),
        (1, np.float64, {}),
        (2, np.float16, {"softmax_precision": 1}),
    ],
)
@pytest.mark.parametrize("mods", [False, True])
def test_flex_attention(rng, kv_heads, dtype, attrs, mods):
    inputs = _qkv(rng, kv_heads=kv_heads, v_size=6, dtype=dtype)
    attrs = dict(attrs)
    if mods and dtype != np.float64:
        # A causal score_mod (-inf above the diagonal) and a prob_mod that halves.
        causal = np.triu(np.full((3, 5), -np.inf, np.float32), 1)
        attrs["score_mod"] = _modifier("score_mod", "Add", causal)
        attrs["prob_mod"] = _modifier("prob_mod", "Mul", 0.5)
    tol = 2e-3 if dtype == np.float16 else 1e-5
    check_node(
        "FlexAttention",
        inputs,
        attrs,
        opset=1,
        domain="ai.onnx.preview",
        reference="onnx",
        rtol=tol,
        atol=tol,
    )


# RotaryEmbedding


def _rotary_inputs(rng, shape, half, *, positions=True, dtype=np.float32, max_pos=16):
    batch, seq = shape[0], shape[2] if len(shape) == 4 else shape[1]
    angles = rng.uniform(0, 6.3, (max_pos, half))
    inputs = {"X": _data(rng, shape, dtype)}
    if positions:
        inputs["cos_cache"] = np.cos(angles).astype(dtype)
        inputs["sin_cache"] = np.sin(angles).astype(dtype)
        inputs["position_ids"] = rng.integers(0, max_pos, (batch, seq)).astype(np.int64)
    else:
        picked = angles[rng.integers(0, max_pos, (batch, seq))]
        inputs["cos_cache"] = np.cos(picked).astype(dtype)
        inputs["sin_cache"] = np.sin(picked).astype(dtype)
    return inputs


@pytest.mark.parametrize("layout", ["4d", "3d"])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rotary_dim,positions", [(0, True), (4, False)])
def test_rotary_embedding(rng, layout, interleaved, rotary_dim, positions):
    heads, size = 3, 8
    shape = (2, heads, 5, size) if layout == "4d" else (2, 5, heads * size)
    inputs = _rotary_inputs(rng, shape, (rotary_dim or size) // 2, positions=positions)
    attrs = {"interleaved": interleaved}
    if rotary_dim:
        attrs["rotary_embedding_dim"] = rotary_dim
    if layout == "3d":
        attrs["num_heads"] = heads
    check_node("RotaryEmbedding", inputs, attrs, opset=23)


def test_rotary_embedding_float16(rng):
    inputs = _rotary_inputs(rng, (2, 2, 4, 8), 2, dtype=np.float16)
    attrs = {"interleaved": 1, "rotary_embedding_dim": 4}
    check_node("RotaryEmbedding", inputs, attrs, opset=23, rtol=2e-3, atol=2e-3)


def test_rotary_embedding_bfloat16(rng):
    inputs = _rotary_inputs(rng, (2, 5, 16), 4)
    attrs = {"num_heads": 2, "rotary_embedding_dim": 8}
    expected = ort_run(make_node_model("RotaryEmbedding", inputs, attrs, opset=23), inputs)[0]
    half = {
        k: v.astype(ml_dtypes.bfloat16) if v.dtype == np.float32 else v for k, v in inputs.items()
    }
    model = make_node_model("RotaryEmbedding", half, attrs, opset=23)
    for mode, outputs in transmuter_runs(model, half).items():
        got = np.asarray(outputs[0])
        assert got.dtype == ml_dtypes.bfloat16
        assert_close(got.astype(np.float32), expected, rtol=3e-2, atol=3e-2, what=mode)


def test_rotary_embedding_symbolic_batch(rng):
    inputs = _rotary_inputs(rng, (2, 2, 4, 8), 4)
    check_node("RotaryEmbedding", inputs, {}, opset=23, symbolic={"X": [0], "position_ids": [0]})


def test_rotary_embedding_bad_cache(rng):
    inputs = _rotary_inputs(rng, (2, 2, 4, 8), 3)
    with pytest.raises(TransmuterError, match="cos_cache"):
        model = make_node_model("RotaryEmbedding", inputs, {}, opset=23)
        transmuter_runs(model, inputs, compiled=False)


# TensorScatter


@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize(
    "axis,cache_shape,seq,with_indices",
    [
        (-2, (2, 3, 6, 4), 2, True),
        (2, (2, 3, 6, 4), 1, False),
        (1, (3, 5, 2), 3, True),
        (-1, (2, 4, 7), 7, True),
    ],
)
def test_tensor_scatter(rng, mode, axis, cache_shape, seq, with_indices):
    update_shape = list(cache_shape)
    update_shape[axis] = seq
    inputs = {"past_cache": _data(rng, cache_shape), "update": _data(rng, tuple(update_shape))}
    size = cache_shape[axis]
    if with_indices:
        high = size if mode == "circular" else size - seq + 1
        inputs["write_indices"] = rng.integers(0, high, (cache_shape[0],)).astype(np.int64)
    check_node("TensorScatter", inputs, {"mode": mode, "axis": axis}, opset=24)


@pytest.mark.parametrize("dtype", [np.float16, np.int64, np.bool_, ml_dtypes.bfloat16])
def test_tensor_scatter_dtypes(rng, dtype):
    inputs = {
        "past_cache": (rng.standard_normal((2, 2, 5, 3)) * 4).astype(dtype),
        "update": (rng.standard_normal((2, 2, 2, 3)) * 4).astype(dtype),
        "write_indices": np.array([4, 1], np.int64),
    }
    reference = "onnx" if dtype == ml_dtypes.bfloat16 else "ort"
    check_node("TensorScatter", inputs, {"mode": "circular"}, opset=24, reference=reference)


def test_tensor_scatter_strings():
    inputs = {
        "past_cache": np.array([["a", "b", "c"], ["d", "e", "f"]], dtype=object)[..., None],
        "update": np.array([["x"], ["y"]], dtype=object)[..., None],
        "write_indices": np.array([2, 0], np.int64),
    }
    check_node(
        "TensorScatter",
        inputs,
        {},
        opset=24,
        reference="onnx",
        constants=list(inputs),
        compiled=False,
    )


def test_tensor_scatter_empty_update(rng):
    inputs = {"past_cache": _data(rng, (2, 5, 3)), "update": _data(rng, (2, 0, 3))}
    check_node("TensorScatter", inputs, {}, opset=24, reference="onnx")


def test_tensor_scatter_rejects_batch_axis(rng):
    inputs = {"past_cache": _data(rng, (2, 5, 3)), "update": _data(rng, (1, 5, 3))}
    with pytest.raises(TransmuterError, match="axis"):
        model = make_node_model("TensorScatter", inputs, {"axis": 0}, opset=24)
        transmuter_runs(model, inputs, compiled=False)


# LinearAttention (ONNX Runtime 1.32 has no kernel: onnx.reference)


def _linear_inputs(
    rng,
    rule,
    *,
    batch=2,
    steps=5,
    hq=4,
    hkv=2,
    d_k=4,
    d_v=3,
    past=True,
    decay_per_key=False,
    beta_per_head=True,
    dtype=np.float32,
):
    inputs = {
        "query": _data(rng, (batch, steps, hq * d_k), dtype),
        "key": _data(rng, (batch, steps, hkv * d_k), dtype) / 2,
        "value": _data(rng, (batch, steps, hkv * d_v), dtype),
        "past_state": _data(rng, (batch, hkv, d_k, d_v), dtype) if past else None,
        "decay": None,
        "beta": None,
    }
    if rule in ("gated", "gated_delta"):
        width = hkv * d_k if decay_per_key else hkv
        inputs["decay"] = -rng.uniform(0.01, 0.5, (batch, steps, width)).astype(dtype)
    if rule in ("delta", "gated_delta"):
        inputs["beta"] = rng.uniform(0.1, 0.9, (batch, steps, hkv if beta_per_head else 1)).astype(
            dtype
        )
    return inputs


def _linear(inputs, attrs, tol=1e-5):
    check_node(
        "LinearAttention",
        inputs,
        attrs,
        opset=27,
        outputs=2,
        reference="onnx",
        rtol=tol,
        atol=tol,
        input_names=["query", "key", "value", "past_state", "decay", "beta"],
    )


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("heads,past", [((4, 2), True), ((3, 1), False)])
def test_linear_attention(rng, rule, heads, past):
    hq, hkv = heads
    inputs = _linear_inputs(rng, rule, hq=hq, hkv=hkv, past=past)
    _linear(inputs, {"update_rule": rule, "q_num_heads": hq, "kv_num_heads": hkv})


@pytest.mark.parametrize("decay_per_key,beta_per_head", [(False, False), (True, True)])
def test_linear_attention_gate_shapes(rng, decay_per_key, beta_per_head):
    inputs = _linear_inputs(
        rng, "gated_delta", decay_per_key=decay_per_key, beta_per_head=beta_per_head
    )
    _linear(inputs, {"q_num_heads": 4, "kv_num_heads": 2, "scale": 0.3})


def test_linear_attention_decode_step(rng):
    inputs = _linear_inputs(rng, "gated", steps=1, decay_per_key=True)
    _linear(inputs, {"update_rule": "gated", "q_num_heads": 4, "kv_num_heads": 2})


def test_linear_attention_float16(rng):
    inputs = _linear_inputs(rng, "gated_delta", dtype=np.float16)
    _linear(inputs, {"q_num_heads": 4, "kv_num_heads": 2}, tol=5e-3)


def test_linear_attention_rejects_unused_gate(rng):
    inputs = _linear_inputs(rng, "gated")
    with pytest.raises(TransmuterError, match="decay"):
        model = make_node_model(
            "LinearAttention",
            inputs,
            {"update_rule": "linear", "q_num_heads": 4, "kv_num_heads": 2},
            opset=27,
            outputs=2,
            input_names=["query", "key", "value", "past_state", "decay", "beta"],
        )
        transmuter_runs(model, inputs, compiled=False)
