"""The public API: load sources, input checks, params, and run under jit / grad / vmap."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from opcheck import ort_run

import transmuter
from transmuter import ir


def small_mlp(rng, features=4, hidden=80) -> onnx.ModelProto:
    """y = relu(x @ W + b), plus the shape of x: a float output and an int64 output."""
    w = rng.standard_normal((features, hidden)).astype(np.float32)
    b = rng.standard_normal((hidden,)).astype(np.float32)
    scale = np.array(0.5, np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["xw"], name="matmul"),
        helper.make_node("Add", ["xw", "b"], ["xwb"], name="add"),
        helper.make_node("Mul", ["xwb", "scale"], ["scaled"], name="mul"),
        helper.make_node("Relu", ["scaled"], ["y"], name="relu"),
        helper.make_node("Shape", ["x"], ["x_shape"], name="shape"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", features])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", hidden]),
            helper.make_tensor_value_info("x_shape", TensorProto.INT64, [2]),
        ],
        [
            numpy_helper.from_array(w, "W"),
            numpy_helper.from_array(b, "b"),
            numpy_helper.from_array(scale, "scale"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture
def proto(rng):
    return small_mlp(rng)


@pytest.fixture
def x(rng):
    return rng.standard_normal((3, 4)).astype(np.float32)


def test_sources_path_bytes_and_proto_agree(proto, x, tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(proto, path)
    expected = ort_run(proto, {"x": x})
    for source in (proto, proto.SerializeToString(), path, str(path)):
        out = transmuter.run(transmuter.load(source), {"x": x})
        np.testing.assert_allclose(out["y"], expected[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(out["x_shape"], expected[1])
        assert out["x_shape"].dtype == np.int64


def test_specs_keep_the_files_names(proto):
    model = transmuter.load(proto)
    assert model.inputs == ["x"] and model.outputs == ["y", "x_shape"]
    spec = model.input_specs["x"]
    assert spec.dtype == np.float32 and spec.shape == (ir.SymbolicDim("batch"), 4)
    assert model.output_specs["x_shape"].shape == (2,)


def test_params_hold_large_float_initializers(proto):
    assert set(transmuter.load(proto).params) == {"W", "b"}
    assert set(transmuter.load(proto, trainable=True).params) == {"W", "b", "scale"}


def test_external_data_loads_and_refuses_escapes(proto, x, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    expected = ort_run(proto, {"x": x})[0]  # before saving: onnx.save moves the data out
    onnx.save(
        proto,
        folder / "m.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="m.bin",
        size_threshold=0,
    )
    out = transmuter.run(transmuter.load(folder / "m.onnx"), {"x": x})
    np.testing.assert_allclose(out["y"], expected, rtol=1e-5, atol=1e-6)

    escaped = onnx.load(folder / "m.onnx", load_external_data=False)
    for tensor in escaped.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../m.bin"
    (tmp_path / "m.bin").write_bytes((folder / "m.bin").read_bytes())
    onnx.save(escaped, folder / "escape.onnx")
    with pytest.raises(transmuter.ModelLoadError, match="outside the model's folder"):
        transmuter.load(folder / "escape.onnx")


def test_missing_external_data_and_bytes_source(proto, tmp_path):
    onnx.save(
        proto, tmp_path / "m.onnx", save_as_external_data=True, location="m.bin", size_threshold=0
    )
    with pytest.raises(transmuter.ModelLoadError, match="file path"):
        transmuter.load((tmp_path / "m.onnx").read_bytes())
    (tmp_path / "m.bin").write_bytes(b"\0" * 8)
    with pytest.raises(transmuter.ModelLoadError, match="fewer bytes"):
        transmuter.load(tmp_path / "m.onnx")


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.97])
def test_truncated_file_is_a_clear_error(proto, tmp_path, cut):
    data = proto.SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(transmuter.ModelLoadError):
        transmuter.load(path)


def test_not_a_model(tmp_path):
    with pytest.raises(transmuter.ModelLoadError):
        transmuter.load(b"\x08\x96\x01garbage\xff\xff")
    with pytest.raises(transmuter.ModelLoadError, match="no ONNX file"):
        transmuter.load(tmp_path / "absent.onnx")
    with pytest.raises(TypeError):
        transmuter.load(42)


def test_unsupported_op_names_everything():
    graph = helper.make_graph(
        [helper.make_node("FrobnicateX", ["a"], ["b"], name="the_node", domain="com.example")],
        "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 3)]
    )
    with pytest.raises(transmuter.UnsupportedOpError) as info:
        transmuter.load(model)
    message = str(info.value)
    for part in ("com.example", "FrobnicateX", "opset 3", "the_node"):
        assert part in message


def test_domains_do_not_fall_back():
    graph = helper.make_graph(
        [helper.make_node("Relu", ["a"], ["b"], domain="com.microsoft")],
        "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    with pytest.raises(transmuter.UnsupportedOpError, match="com.microsoft::Relu"):
        transmuter.load(model)


@pytest.mark.parametrize(
    "inputs, match",
    [
        ({}, r"missing \['x'\]"),
        ({"x": np.zeros((2, 4), np.float32), "z": 1}, r"unknown \['z'\]"),
        ({"x": np.zeros((2, 4), np.float64)}, "expects tensor\\(float32\\)"),
        ({"x": np.zeros((2, 4, 1), np.float32)}, "expects rank 2"),
        ({"x": np.zeros((2, 5), np.float32)}, "axis 1"),
        ({"x": [[True] * 4]}, "expects float32"),
    ],
)
def test_bad_inputs_name_the_input(proto, inputs, match):
    model = transmuter.load(proto)
    with pytest.raises(transmuter.InputError, match=match):
        transmuter.run(model, inputs)
    # The compiled callable's hot path (inputs of the example's shapes) refuses them too.
    compiled = transmuter.compile(model, {"x": np.zeros((2, 4), np.float32)})
    with pytest.raises(transmuter.InputError, match=match):
        compiled(inputs)


def test_compiled_call_takes_any_array_form_at_the_example_shape(proto, x):
    model = transmuter.load(proto)
    compiled = transmuter.compile(model, {"x": x})
    want = np.asarray(compiled({"x": x})["y"])
    np.testing.assert_allclose(want, transmuter.run(model, {"x": x})["y"], rtol=1e-5, atol=1e-6)
    for given in (x, x.astype(">f4"), jnp.asarray(x), x.tolist(), np.asfortranarray(x)):
        np.testing.assert_array_equal(np.asarray(compiled({"x": given})["y"]), want)


def test_python_values_take_the_declared_dtype(proto):
    model = transmuter.load(proto)
    out = transmuter.run(model, {"x": [[1, 2, 3, 4]]})
    assert out["y"].dtype == np.float32 and out["y"].shape == (1, 80)


def test_run_inside_jit_grad_and_vmap(proto, x):
    model = transmuter.load(proto)
    eager = transmuter.run(model, {"x": x})["y"]

    jitted = jax.jit(lambda p, v: transmuter.run(model, {"x": v}, params=p)["y"])
    np.testing.assert_allclose(jitted(model.params, x), eager, rtol=1e-6)

    def loss(params):
        return jnp.sum(transmuter.run(model, {"x": x}, params=params)["y"] ** 2)

    grads = jax.grad(loss)(model.params)
    w, b = np.asarray(model.params["W"]), np.asarray(model.params["b"])
    pre = (x @ w + b) * 0.5
    expected_db = np.sum(2 * np.maximum(pre, 0) * (pre > 0) * 0.5, axis=0)
    np.testing.assert_allclose(grads["b"], expected_db, rtol=1e-4, atol=1e-5)

    batched = jax.vmap(lambda v: transmuter.run(model, {"x": v})["y"])(np.stack([x, 2 * x]))
    np.testing.assert_allclose(batched[1], transmuter.run(model, {"x": 2 * x})["y"], rtol=1e-6)


def test_int64_outputs_inside_a_user_jit_with_x64_off(proto, x):
    """Transmuter enables x64 for its own trace only: the caller's program gets int64 outputs
    where ONNX says int64, while the caller's own arrays stay 32-bit."""
    assert not jax.config.jax_enable_x64
    model = transmuter.load(proto)
    shape = jax.jit(lambda v: transmuter.run(model, {"x": v})["x_shape"])(x)
    assert shape.dtype == np.int64
    assert jnp.arange(3).dtype == np.int32


def test_params_must_match(proto, x):
    model = transmuter.load(proto)
    with pytest.raises(transmuter.InputError, match="missing \\['b'\\]"):
        transmuter.run(model, {"x": x}, params={"W": model.params["W"]})


def test_a_cache_hit_at_another_signature_is_counted_and_matches(proto, rng):
    model = transmuter.load(proto)
    fn = transmuter.compile(model, {"x": rng.standard_normal((2, 4)).astype(np.float32)})
    x = rng.standard_normal((3, 4)).astype(np.float32)
    first = np.asarray(fn({"x": x})["y"])
    hits = []
    transmuter.telemetry.attach("hits", ["transmuter.cache.hit"], lambda *event: hits.append(1))
    try:
        again = fn({"x": x})
    finally:
        transmuter.telemetry.detach("hits")
    np.testing.assert_array_equal(np.asarray(again["y"]), first)
    np.testing.assert_array_equal(again["x_shape"], [3, 4])
    assert len(hits) == 1


def test_the_example_run_answers_a_first_call_with_the_same_inputs(proto, rng, monkeypatch):
    """compile runs the example; a first call with equal inputs gets that run's outputs instead
    of running again (a pipeline's first result), and no other call does."""
    model = transmuter.load(proto)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    fn = transmuter.compile(model, {"x": x})
    runs = []
    for path in ("_run", "_run_fast", "_run_program"):  # every way a call runs the model
        run = getattr(fn, path)
        monkeypatch.setattr(fn, path, lambda *a, run=run, **k: runs.append(1) or run(*a, **k))
    first = fn({"x": x.copy()})  # equal values, another array
    assert not runs
    # Eager ops and the compiled program may take different dot kernels (xla_options).
    np.testing.assert_allclose(
        first["y"], transmuter.run(model, {"x": x})["y"], rtol=1e-5, atol=1e-6
    )
    again = fn({"x": x})
    assert runs
    np.testing.assert_array_equal(again["y"], first["y"])

    changed = transmuter.compile(model, {"x": x})
    x[0, 0] += 1  # changed in place after compiling: the example's outputs do not answer
    np.testing.assert_allclose(
        changed({"x": x})["y"], transmuter.run(model, {"x": x})["y"], rtol=1e-5, atol=1e-6
    )


def test_compile_caches_per_signature(proto, rng):
    model = transmuter.load(proto)
    make = lambda n: rng.standard_normal((n, 4)).astype(np.float32)  # noqa: E731
    fn = transmuter.compile(model, {"x": make(2)}, cache_size=2)
    for n in (2, 3, 2, 5):
        x = make(n)
        out = fn({"x": x})
        want = transmuter.run(model, {"x": x})["y"]
        np.testing.assert_allclose(out["y"], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(out["x_shape"], [n, 4])
        assert out["x_shape"].dtype == np.int64
    # Calls at the compile-time shape (2) bypass the cache (the callable keeps that program), so
    # the LRU saw 2, 3, 5 and evicted 2.
    assert [key[0][0][1][0] for key in fn.runner.caches[0]] == [(3, 4), (5, 4)]
