"""Shape buckets and warm-up: padded calls agree with unpadded ones and ONNX Runtime, outputs
come back at the caller's shapes, padding the model could see is refused, and warm-up compiles
ahead of traffic. Tests on fixture models are marked slow; small graphs built here are not."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from opcheck import ort_run

import transmuter
from transmuter.errors import InputError
from transmuter.runtime.buckets import Rule, dim_parts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "models"


class Events:
    """Collects telemetry events while attached."""

    def __init__(self, *names: str):
        self.names = names
        self.seen: list[tuple[str, dict]] = []

    def __enter__(self) -> Events:
        transmuter.telemetry.attach(id(self), self.names, self._take)
        return self

    def __exit__(self, *exc) -> None:
        transmuter.telemetry.detach(id(self))

    def _take(self, event, measurements, metadata) -> None:
        self.seen.append((event, metadata))

    def of(self, name: str) -> list[dict]:
        return [m for e, m in self.seen if e == name]


def encoder_inputs(batch: int, sequence: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, sequence), np.int64)
    mask[1:, sequence // 2 :] = 0  # later rows are shorter: real padding of the caller's own
    return {
        "input_ids": rng.integers(0, 100, (batch, sequence)),
        "attention_mask": mask,
        "token_type_ids": np.zeros((batch, sequence), np.int64),
    }


def ort_outputs(proto: onnx.ModelProto, inputs: dict) -> dict[str, np.ndarray]:
    """ONNX Runtime's outputs at the call's own shapes: the unpadded reference."""
    return dict(zip([o.name for o in proto.graph.output], ort_run(proto, inputs)))


def assert_agree(got: dict, want: dict, atol: float = 1e-5) -> None:
    assert got.keys() == want.keys()
    for name in want:
        a, b = np.asarray(got[name]), np.asarray(want[name])
        assert a.shape == b.shape and a.dtype == b.dtype, name
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=atol, err_msg=name)


def test_rules():
    assert [Rule("d", [1, 4, 16]).bucket(n) for n in (0, 1, 2, 16, 17)] == [0, 1, 4, 16, None]
    assert [Rule("d", "pow2").bucket(n) for n in (1, 3, 4, 5, 1000)] == [1, 4, 4, 8, 1024]
    assert Rule("d", ("pow2", 64)).bucket(65) is None
    assert [Rule("d", ("multiple", 8)).bucket(n) for n in (1, 8, 9)] == [8, 8, 16]
    assert Rule("d", ("multiple", 8, 16)).all_sizes() == (8, 16)
    assert Rule("d", ("pow2", 8)).all_sizes() == (1, 2, 4, 8)
    for bad in ["pow3", [], [-1], ("multiple", 0), ("pow2", 4, 8), 3.5]:
        with pytest.raises(InputError, match="buckets"):
            Rule("d", bad)
    with pytest.raises(InputError, match="largest size for 'd'"):
        Rule("d", "pow2").all_sizes()


def test_dim_parts():
    sym = transmuter.ir.SymbolicDim
    assert dim_parts(4) == (4,)
    assert dim_parts(sym("batch")) == ("batch",)
    assert dim_parts(sym("past_sequence_length + 1")) == ("past_sequence_length", 1)
    assert dim_parts(sym("past + sequence")) == ("past", "sequence")
    assert dim_parts(sym("2*sequence")) is None


@pytest.mark.slow
def test_an_encoder_compiles_once_per_bucket_and_matches_unpadded_runs_and_ort():
    proto = onnx.load(FIXTURES / "bert.onnx")
    model = transmuter.load(proto)
    buckets = {"batch": [1, 2, 4], "sequence": "pow2"}
    with Events("transmuter.cache.miss") as events:
        bucketed = transmuter.compile(model, encoder_inputs(1, 5), buckets=buckets)
        for batch, sequence in [(1, 5), (1, 6), (1, 8), (2, 7), (3, 5)]:
            inputs = encoder_inputs(batch, sequence, seed=sequence)
            got = bucketed(inputs)
            assert_agree(got, ort_outputs(proto, inputs))
            assert got["last_hidden_state"].shape == (batch, sequence, 32)
    misses = events.of("transmuter.cache.miss")
    # The first padded call is checked once against the same call unpadded (1, 5).
    assert [m["shapes"][0][1][0] for m in misses] == [(1, 8), (1, 5), (2, 8), (4, 8)]
    assert misses[0]["padded_from"]["input_ids"] == (1, 5) and misses[1]["padding_check"]
    assert bucketed.signatures == [
        {"attention_mask": (b, 8), "input_ids": (b, 8), "token_type_ids": (b, 8)} for b in (1, 2, 4)
    ]
    with np.load(FIXTURES / "bert.npz") as stored:
        for case in (0, 1):
            inputs = {k: stored[f"case{case}/in/{k}"] for k in model.inputs}
            want = {k: stored[f"case{case}/out/{k}"] for k in model.outputs}
            assert_agree(bucketed(inputs), want)


@pytest.mark.slow
def test_past_the_largest_bucket_compiles_the_exact_shape_and_says_so():
    model = transmuter.load(FIXTURES / "bert.onnx")
    compiled = transmuter.compile(model, encoder_inputs(1, 4), buckets={"sequence": [4, 8]})
    with Events("transmuter.bucket.exceeded", "transmuter.cache.miss") as events:
        got = compiled(encoder_inputs(1, 11))
    assert got["last_hidden_state"].shape == (1, 11, 32)
    assert events.of("transmuter.bucket.exceeded")[0]["dims"] == {"sequence": 11}
    assert events.of("transmuter.cache.miss")[0]["shapes"][0][1][0] == (1, 11)


def optimum_decoder(name: str) -> onnx.ModelProto:
    """A fixture decoder with its dims named as Optimum names them: the mask and the present
    key/values span `past_sequence + sequence`."""
    proto = onnx.load(FIXTURES / f"{name}.onnx")
    for value in [*proto.graph.input, *proto.graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == "total_sequence":
                dim.dim_param = "past_sequence + sequence"
    return proto


def decoder_inputs(model, batch: int, sequence: int, past: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    inputs = {
        "input_ids": rng.integers(0, 100, (batch, sequence)),
        "attention_mask": np.ones((batch, past + sequence), np.int64),
    }
    if "position_ids" in model.inputs:
        inputs["position_ids"] = np.tile(np.arange(past, past + sequence), (batch, 1))
    for name in model.inputs:
        if name.startswith("past_key_values"):
            heads, size = model.input_specs[name].shape[1], model.input_specs[name].shape[3]
            inputs[name] = rng.standard_normal((batch, heads, past, size)).astype(np.float32)
    return inputs


@pytest.mark.slow
def test_a_decoder_pads_its_past_inside_the_mask_and_matches_unpadded_runs():
    # The mask spans past + new tokens: each part is padded at its own end, and the present
    # key/values are cut back part by part.
    proto = optimum_decoder("llama")
    model = transmuter.load(proto)
    buckets = {"past_sequence": ("multiple", 8), "sequence": "pow2"}
    compiled = transmuter.compile(model, decoder_inputs(model, 1, 1, 3), buckets=buckets)
    with Events("transmuter.cache.miss") as events:
        for batch, sequence, past in [(1, 1, 4), (1, 1, 7), (2, 3, 5), (1, 5, 0), (1, 1, 9)]:
            inputs = decoder_inputs(model, batch, sequence, past, seed=past)
            got = compiled(inputs)
            assert got["present.0.key"].shape == (batch, 2, past + sequence, 8)
            assert_agree(got, ort_outputs(proto, inputs))
    # (1, 1, 4) and (1, 1, 7) reuse the program compiled for (1, 1, 3): past 8.
    misses = [m for m in events.of("transmuter.cache.miss") if "padding_check" not in m]
    assert len(misses) == 3


@pytest.mark.slow
def test_padding_a_past_the_model_counts_positions_from_is_refused():
    # GPT-2's export takes no position ids: it counts positions from the past length, so a
    # padded past moves every new token. Padding the new tokens alone is exact.
    proto = optimum_decoder("gpt2")
    model = transmuter.load(proto)
    example = decoder_inputs(model, 1, 2, 3)
    with pytest.raises(InputError, match="cannot bucket 'past_sequence'.*no position ids"):
        transmuter.compile(model, example, buckets={"past_sequence": ("multiple", 8)})
    compiled = transmuter.compile(model, example, buckets={"sequence": "pow2", "batch": [4]})
    inputs = decoder_inputs(model, 3, 3, 2, seed=1)
    assert_agree(compiled(inputs), ort_outputs(proto, inputs))


def test_a_dim_no_mask_hides_is_refused():
    model = transmuter.load(FIXTURES / "resnet.onnx")
    pixels = np.zeros((1, 3, 32, 32), np.float32)
    with pytest.raises(InputError, match="cannot bucket 'height': no mask input carries it"):
        transmuter.compile(model, {"pixel_values": pixels}, buckets={"height": "pow2"})


def shape_reader() -> onnx.ModelProto:
    """y = relu(x), and n = the row count of x: an output the padding would show."""
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["y"]),
            helper.make_node("Shape", ["x"], ["n"], start=0, end=1),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]),
            helper.make_tensor_value_info("n", TensorProto.INT64, [1]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_model_that_sees_its_padding_is_refused_on_the_first_padded_call():
    model = transmuter.load(shape_reader())
    compiled = transmuter.compile(model, {"x": np.ones((4, 3), np.float32)}, buckets={"batch": [4]})
    with pytest.raises(InputError, match="buckets change output 'n'.*batch 3 to 4"):
        compiled({"x": np.ones((3, 3), np.float32)})


def masked_sum() -> onnx.ModelProto:
    """total = sum(ids) and kept = ids * mask, over a [batch, n] pair: the sum shows pad values."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["ids", "attention_mask"], ["kept"]),
            helper.make_node("ReduceSum", ["ids"], ["total"], keepdims=0),
        ],
        "g",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "n"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "n"]),
        ],
        [
            helper.make_tensor_value_info("kept", TensorProto.INT64, ["batch", "n"]),
            helper.make_tensor_value_info("total", TensorProto.INT64, []),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_pad_values_reach_the_model_and_masks_pad_with_zero():
    model = transmuter.load(masked_sum())
    inputs = {"ids": np.full((1, 8), 2, np.int64), "attention_mask": np.ones((1, 8), np.int64)}
    compiled = transmuter.compile(model, inputs, buckets={"n": [8]}, pad_values={"ids": 5})
    small = {"ids": np.full((1, 5), 2, np.int64), "attention_mask": np.ones((1, 5), np.int64)}
    compiled._padding_checked = True  # the sum sees the pad values: that is what is tested here
    got = compiled(small)
    assert got["kept"].tolist() == [[2] * 5]
    assert int(got["total"]) == 2 * 5 + 5 * 3
    with pytest.raises(InputError, match="a mask pads with 0"):
        transmuter.compile(model, inputs, buckets={"n": [8]}, pad_values={"attention_mask": 1})
    with pytest.raises(InputError, match="pad_values name \\['nope'\\]"):
        transmuter.compile(model, inputs, buckets={"n": [8]}, pad_values={"nope": 1})
    with pytest.raises(InputError, match="dims no input declares: \\['m'\\]"):
        transmuter.compile(model, inputs, buckets={"m": [8]})


@pytest.mark.slow
def test_warmup_compiles_every_bucket_ahead_of_traffic():
    model = transmuter.load(FIXTURES / "bert.onnx")
    buckets = {"batch": [1, 2], "sequence": ("pow2", 4)}
    compiled = transmuter.compile(model, encoder_inputs(1, 4), buckets=buckets, cache_size=6)
    with Events("transmuter.warmup.stop", "transmuter.cache.miss") as events:
        assert compiled.warmup("buckets") == 6
    assert len(events.of("transmuter.warmup.stop")) == 6
    assert len(events.of("transmuter.cache.miss")) == 5  # (1, 4) was compiled already
    with Events("transmuter.cache.miss") as events:
        for batch, sequence in [(1, 3), (2, 2), (2, 4), (1, 1)]:
            compiled(encoder_inputs(batch, sequence))
    # Nothing compiles but the one check of the first padded call, outside the cache.
    assert [m.get("padding_check") for m in events.of("transmuter.cache.miss")] == [True]
    assert len(compiled.signatures) == 6
    with pytest.raises(ValueError, match="warmup would compile 6 signatures but cache_size is 4"):
        transmuter.compile(model, encoder_inputs(1, 4), buckets=buckets, cache_size=4).warmup()


@pytest.mark.slow
def test_warmup_from_shapes_or_inputs():
    model = transmuter.load(FIXTURES / "bert.onnx")
    compiled = transmuter.compile(model, encoder_inputs(1, 4))
    assert compiled.warmup([{"sequence": 6}, {"batch": 2, "sequence": 3}]) == 2
    assert compiled.warmup([encoder_inputs(3, 2)]) == 1
    assert sorted(s["input_ids"] for s in compiled.signatures) == [(1, 4), (1, 6), (2, 3), (3, 2)]
    with pytest.raises(InputError, match="needs compile\\(..., buckets=...\\)"):
        compiled.warmup("buckets")


@pytest.mark.slow
def test_log_compile_work_shows_padding(caplog):
    model = transmuter.load(FIXTURES / "bert.onnx")
    handler = transmuter.telemetry.log_compile_work()
    try:
        with caplog.at_level(logging.INFO, logger="transmuter"):
            compiled = transmuter.compile(model, encoder_inputs(1, 3), buckets={"sequence": [4]})
            compiled(encoder_inputs(1, 9))
    finally:
        transmuter.telemetry.detach(handler)
    text = caplog.text
    assert "transmuter.cache.miss" in text and "padded_from={'input_ids': (1, 3)" in text
    assert "transmuter.bucket.exceeded" in text and "dims={'sequence': 9}" in text
    # Where a new shape's time goes: our trace, JAX's lowering, XLA's compile.
    assert "trace_s=" in text and "lower_s=" in text and "xla_s=" in text


WARM_FROM_DISK = """
import sys, numpy as np, transmuter
events = []
transmuter.telemetry.attach("t", ["transmuter.segment.compile.stop"], lambda e, m, md: events.append(md["disk_cache"]))
model = transmuter.load(sys.argv[1])
ids = np.zeros((1, 4), np.int64)
inputs = {"input_ids": ids, "attention_mask": ids + 1, "token_type_ids": ids}
compiled = transmuter.compile(model, inputs, buckets={"sequence": [4, 8]}, cache_dir=sys.argv[2])
compiled.warmup("buckets")
print(events)
"""


@pytest.mark.slow
def test_a_second_process_warms_from_disk(tmp_path):
    def warm() -> str:
        command = [sys.executable, "-c", WARM_FROM_DISK, str(FIXTURES / "bert.onnx"), str(tmp_path)]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()

    assert warm() == "['miss', 'miss']"
    assert warm() == "['hit', 'hit']"


@pytest.mark.slow
def test_a_new_shape_compiles_one_program(caplog):
    # Shape arithmetic on host values runs in numpy: through JAX it compiled a small XLA
    # program of its own for each new sequence length (4 for this BERT).
    import jax

    model = transmuter.load(FIXTURES / "bert.onnx")
    compiled = transmuter.compile(model, encoder_inputs(1, 4))
    with caplog.at_level(logging.WARNING, logger="jax"), jax.log_compiles(True):
        compiled(encoder_inputs(1, 13))
    compiles = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
    assert len(compiles) == 1 and "jit(program)" in compiles[0], compiles
