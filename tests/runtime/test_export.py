"""transmuter.export / write_export: one StableHLO program with symbolic dims, compared with
transmuter.run (small graphs built here) and with ONNX Runtime (the fixture models, reloaded in
a process that imports only jax and numpy)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from opcheck import make_model, ort_run

import transmuter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "models"
RTOL, ATOL = 1e-4, 1e-5


def shape_arithmetic_model(rng) -> onnx.ModelProto:
    """x [batch, sequence, 8] and mask [batch, sequence]: the shape chains real exports contain
    (Shape -> Gather -> Unsqueeze -> Concat -> Reshape, Range, ConstantOfShape, Expand, Slice to
    INT64_MAX, Div, a dim cast to float), a weight (a param), and a shape as an output."""
    i64 = lambda name, values: numpy_helper.from_array(np.array(values, np.int64), name)  # noqa: E731
    weight = rng.standard_normal((8, 80)).astype(np.float32)
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["b"], axis=0),
        helper.make_node("Gather", ["shape", "one"], ["s"], axis=0),
        helper.make_node("Mul", ["b", "s"], ["bs"]),
        helper.make_node("Unsqueeze", ["bs", "axes0"], ["bs1"]),
        helper.make_node("Concat", ["bs1", "eight"], ["flat_shape"], axis=0),
        helper.make_node("Reshape", ["x", "flat_shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "W"], ["projected"]),
        helper.make_node("Div", ["s", "two"], ["half"]),
        helper.make_node("Unsqueeze", ["half", "axes0"], ["half1"]),
        helper.make_node("Slice", ["x", "half1", "big", "axes1"], ["tail"]),
        helper.make_node("Range", ["zero_s", "s", "one_s"], ["positions"]),
        helper.make_node("Cast", ["positions"], ["positions_f"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["s"], ["s_f"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["positions_f", "s_f"], ["ramp"]),
        helper.make_node("Shape", ["mask"], ["mask_shape"]),
        helper.make_node(
            "ConstantOfShape",
            ["mask_shape"],
            ["ones"],
            value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0]),
        ),
        helper.make_node("Add", ["ones", "ramp"], ["ramped"]),
        helper.make_node("Unsqueeze", ["ramped", "axes2"], ["ramped3"]),
        helper.make_node("Expand", ["ramped3", "shape"], ["expanded"]),
        helper.make_node("Mul", ["expanded", "x"], ["scaled"]),
    ]
    f32 = TensorProto.FLOAT
    return make_model(
        nodes,
        [
            helper.make_tensor_value_info("x", f32, ["batch", "sequence", 8]),
            helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "sequence"]),
        ],
        [
            helper.make_tensor_value_info("projected", f32, None),
            helper.make_tensor_value_info("tail", f32, None),
            helper.make_tensor_value_info("scaled", f32, None),
            helper.make_tensor_value_info("flat_shape", TensorProto.INT64, None),
        ],
        [
            numpy_helper.from_array(weight, "W"),
            i64("zero", 0),
            i64("one", 1),
            i64("two", 2),
            i64("zero_s", 0),
            i64("one_s", 1),
            i64("axes0", [0]),
            i64("axes1", [1]),
            i64("axes2", [2]),
            i64("eight", [8]),
            i64("big", [np.iinfo(np.int64).max]),
        ],
    )


def call(exported, *args):
    with jax.enable_x64(True):  # the programs take and return int64
        return [np.asarray(v) for v in exported.call(*args)]


def check(got, want, names):
    for name, g, w in zip(names, got, want, strict=True):
        w = np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, (
            f"{name}: {g.dtype}{g.shape} != {w.dtype}{w.shape}"
        )
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=name)


def test_shape_arithmetic_stays_symbolic(rng):
    model = transmuter.load(shape_arithmetic_model(rng))
    exported = transmuter.export(model)
    assert [str(a.shape) for a in exported.in_avals] == [
        "(batch, sequence, 8)",
        "(batch, sequence)",
    ]
    assert str(exported.out_avals[0].shape) == "(batch*sequence, 80)"
    # Serialized and read back: the same program serves every size.
    exported = jax.export.deserialize(exported.serialize())
    for batch, sequence in ((1, 5), (3, 12)):
        x = rng.standard_normal((batch, sequence, 8)).astype(np.float32)
        mask = np.ones((batch, sequence), np.int64)
        want = transmuter.run(model, {"x": x, "mask": mask})
        check(call(exported, x, mask), [want[n] for n in model.outputs], model.outputs)


def test_input_specs_override_and_share_names(rng):
    model = transmuter.load(shape_arithmetic_model(rng))
    # A ShapeDtypeStruct's symbolic dims bring their scope: "sequence" in x is the same dim.
    mask = jax.ShapeDtypeStruct(jax.export.symbolic_shape("2, sequence"), np.int64)
    exported = transmuter.export(model, {"x": (2, "sequence", 8), "mask": mask})
    assert [str(a.shape) for a in exported.in_avals] == ["(2, sequence, 8)", "(2, sequence)"]
    x = rng.standard_normal((2, 7, 8)).astype(np.float32)
    want = transmuter.run(model, {"x": x, "mask": np.ones((2, 7), np.int64)})
    check(
        call(exported, x, np.ones((2, 7), np.int64)),
        [want[n] for n in model.outputs],
        model.outputs,
    )
    with pytest.raises(transmuter.InputError, match="'x'.*declares"):
        transmuter.export(model, {"x": ("batch", "sequence", 9)})
    with pytest.raises(transmuter.InputError, match="not inputs"):
        transmuter.export(model, {"y": (2, 3)})


def test_file_dim_names_become_variables():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch-size", "max", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = transmuter.load(make_model([helper.make_node("Relu", ["x"], ["y"])], [x], [y]))
    exported = transmuter.export(model)
    assert str(exported.in_avals[0].shape) == "(batch_size, d_max, 3)"
    assert str(exported.out_avals[0].shape) == "(batch_size, d_max, 3)"


def test_params_as_argument(rng):
    model = transmuter.load(shape_arithmetic_model(rng))
    exported = jax.export.deserialize(transmuter.export(model, params="argument").serialize())
    scaled = {k: v * 0.5 for k, v in model.params.items()}
    x = rng.standard_normal((2, 6, 8)).astype(np.float32)
    mask = np.ones((2, 6), np.int64)
    want = transmuter.run(model, {"x": x, "mask": mask}, params=scaled)
    check(call(exported, scaled, x, mask), [want[n] for n in model.outputs], model.outputs)


def test_lowers_for_cpu_and_cuda_without_a_gpu(rng, tmp_path):
    model = transmuter.load(shape_arithmetic_model(rng))
    exported = transmuter.export(model, platforms=("cpu", "cuda"))
    transmuter.write_export(exported, tmp_path, model=model)
    assert exported.platforms == ("cpu", "cuda")
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["platforms"] == ["cpu", "cuda"] and manifest["params_mode"] == "embed"
    assert [i["name"] for i in manifest["inputs"]] == ["x", "mask"]
    assert manifest["outputs"][0]["shape"] == ["batch*sequence", 80]
    assert "stablehlo" in (tmp_path / "model.mlir").read_text()
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    mask = np.ones((2, 3), np.int64)
    want = transmuter.run(model, {"x": x, "mask": mask})
    check(call(exported, x, mask), [want[n] for n in model.outputs], model.outputs)


def position_table_model(rng, rows=16) -> onnx.ModelProto:
    """x [batch, sequence, 4] + positions: a `rows`-row table sliced to the sequence length
    (Shape -> Gather -> Unsqueeze -> Slice), as BERT-like exports add position embeddings."""
    i64 = lambda name, values: numpy_helper.from_array(np.array(values, np.int64), name)  # noqa: E731
    table = rng.standard_normal((rows, 4)).astype(np.float32)
    f32 = TensorProto.FLOAT
    return make_model(
        [
            helper.make_node("Shape", ["x"], ["shape"]),
            helper.make_node("Gather", ["shape", "one"], ["length"], axis=0),
            helper.make_node("Unsqueeze", ["length", "axes0"], ["end"]),
            helper.make_node("Slice", ["table", "zero1", "end", "axes0"], ["positions"]),
            helper.make_node("Add", ["x", "positions"], ["y"], name="add_positions"),
        ],
        [helper.make_tensor_value_info("x", f32, ["batch", "sequence", 4])],
        [helper.make_tensor_value_info("y", f32, None)],
        [
            numpy_helper.from_array(table, "table"),
            i64("one", 1),
            i64("zero1", [0]),
            i64("axes0", [0]),
        ],
    )


def test_bounds_the_graph_states_become_constraints(rng, tmp_path):
    model = transmuter.load(position_table_model(rng))
    exported = transmuter.export(model)  # before: ExportError naming min(sequence, 16)
    assert transmuter.derived_constraints(exported) == ("sequence <= 16",)
    transmuter.write_export(exported, tmp_path, model=model)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["constraints"] == manifest["derived_constraints"] == ["sequence <= 16"]
    for sequence in (3, 16):
        x = rng.standard_normal((2, sequence, 4)).astype(np.float32)
        check(call(exported, x), [transmuter.run(model, {"x": x})["y"]], ["y"])
    # A given constraint is kept, and nothing more is derived.
    given = transmuter.export(model, constraints=["sequence <= 8"])
    assert transmuter.derived_constraints(given) == ()


def test_an_unexplained_shape_error_stays_an_error(rng):
    # x's last dim (5) cannot meet the table's (4) whatever the sequence: no bound helps.
    proto = position_table_model(rng)
    proto.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 5
    with pytest.raises(transmuter.ExportError, match="no bound the graph states"):
        transmuter.export(transmuter.load(proto))


def test_int32_ids_run_with_x64_off(tmp_path):
    """A program taking int32 ids (and giving int32 where ONNX gives int64) for a process with
    x64 off; inside, the ids are int64 again."""
    i64 = TensorProto.INT64
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    model = transmuter.load(
        make_model(
            [
                helper.make_node("Gather", ["table", "ids"], ["vectors"]),
                helper.make_node("ArgMax", ["vectors"], ["best"], axis=-1, keepdims=0),
            ],
            [helper.make_tensor_value_info("ids", i64, ["batch", "sequence"])],
            [
                helper.make_tensor_value_info("vectors", TensorProto.FLOAT, None),
                helper.make_tensor_value_info("best", i64, None),
            ],
            [numpy_helper.from_array(table, "table")],
        )
    )
    exported = transmuter.export(model, int64_inputs="int32", int64_outputs="int32")
    transmuter.write_export(exported, tmp_path, model=model)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["x64"] is False
    assert manifest["inputs"][0] == {
        "name": "ids",
        "dtype": "int32",
        "shape": ["batch", "sequence"],
        "model_dtype": "int64",
    }
    assert [o["dtype"] for o in manifest["outputs"]] == ["float32", "int32"]
    script = f"""
import jax, numpy as np
from pathlib import Path
assert not jax.config.jax_enable_x64
exported = jax.export.deserialize(bytearray(Path({str(tmp_path)!r}, "model.jax_exported").read_bytes()))
vectors, best = exported.call(np.array([[1, 9, 3]], np.int32))
assert best.dtype == np.int32 and best.tolist() == [[3, 3, 3]], best
assert vectors.tolist()[0][1] == [36.0, 37.0, 38.0, 39.0]
"""
    subprocess.run([sys.executable, "-c", script], check=True)
    with pytest.raises(transmuter.ExportError, match="int64_inputs"):
        transmuter.export(model, int64_inputs="int16")


def breaking_model() -> onnx.ModelProto:
    """Two graph breaks: NonZero (its output shape depends on data) and a Reshape to a shape
    given as an input."""
    f32 = TensorProto.FLOAT
    return make_model(
        [
            helper.make_node("NonZero", ["x"], ["where"], name="find_nonzero"),
            helper.make_node("Transpose", ["where"], ["indices"]),
            helper.make_node("GatherND", ["x", "indices"], ["picked"]),
            helper.make_node("Reshape", ["picked", "shape"], ["y"], name="reshape_by_data"),
        ],
        [
            helper.make_tensor_value_info("x", f32, ["n"]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", f32, None)],
    )


def test_graph_breaks_are_refused():
    model = transmuter.load(breaking_model())
    with pytest.raises(transmuter.ExportError, match="static_inputs") as error:
        transmuter.export(model)
    assert error.value.nodes == ("find_nonzero", "reshape_by_data")
    assert "'find_nonzero'" in str(error.value) and "reshape_by_data" in str(error.value)


def branch_model() -> onnx.ModelProto:
    """If on an input flag, with branches of different shapes: a break unless the flag is
    static."""
    f32 = TensorProto.FLOAT
    out = lambda name: helper.make_tensor_value_info(name, f32, None)  # noqa: E731
    same = helper.make_graph([helper.make_node("Identity", ["x"], ["a"])], "then", [], [out("a")])
    doubled = helper.make_graph(
        [helper.make_node("Concat", ["x", "x"], ["c"], axis=1)], "else", [], [out("c")]
    )
    return make_model(
        [
            helper.make_node(
                "If", ["flag"], ["y"], then_branch=same, else_branch=doubled, name="pick"
            )
        ],
        [
            helper.make_tensor_value_info("x", f32, ["batch", 4]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
        ],
        [out("y")],
    )


def test_static_inputs_remove_a_break(rng, tmp_path):
    model = transmuter.load(branch_model())
    with pytest.raises(transmuter.ExportError) as error:
        transmuter.export(model)
    assert error.value.nodes == ("pick",)
    static = {"flag": np.array(False)}
    exported = transmuter.export(model, static_inputs=static)
    transmuter.write_export(exported, tmp_path, model=model, static_inputs=static)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert [i["name"] for i in manifest["inputs"]] == ["x"]
    assert manifest["static_inputs"] == {"flag": {"dtype": "bool", "value": False}}
    x = rng.standard_normal((3, 4)).astype(np.float32)
    (y,) = call(exported, x)
    np.testing.assert_array_equal(y, np.concatenate([x, x], axis=1))


# ------------------------------------------------------- optimized graphs with dynamic spatial dims


def strided_cnn_model(rng) -> onnx.ModelProto:
    """x [batch, 3, height, width]: a ResNet's shapes in small. A strided stem, then a
    downsampling block whose shortcut is a strided 1x1 Conv (the 1x1-as-dot path channels last)
    added to a strided 3x3 branch, a depthwise stride-2 Conv, a max pool; the feature map (with
    its symbolic spatial dims) and pooled logits as outputs."""

    def w(name, *shape):
        values = rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
        return numpy_helper.from_array(values.astype(np.float32), name)

    same = {"pads": [1, 1, 1, 1]}
    nodes = [
        helper.make_node("Conv", ["x", "w_stem", "b_stem"], ["stem"], strides=[2, 2], **same),
        helper.make_node("Relu", ["stem"], ["stem_r"]),
        helper.make_node("Conv", ["stem_r", "w_a"], ["a"], strides=[2, 2], **same),
        helper.make_node("Relu", ["a"], ["a_r"]),
        helper.make_node("Conv", ["a_r", "w_b"], ["b"], **same),
        helper.make_node("Conv", ["stem_r", "w_short"], ["short"], strides=[2, 2]),
        helper.make_node("Add", ["b", "short"], ["block"]),
        helper.make_node("Relu", ["block"], ["block_r"]),
        helper.make_node("Conv", ["block_r", "w_dw"], ["dw"], group=16, strides=[2, 2], **same),
        helper.make_node("Conv", ["dw", "w_pw"], ["pw"]),
        helper.make_node("Add", ["pw", "dw"], ["features"]),
        helper.make_node(
            "MaxPool", ["features"], ["pooled"], kernel_shape=[3, 3], strides=[2, 2], **same
        ),
        helper.make_node("GlobalAveragePool", ["pooled"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "w_fc"], ["logits"], transB=1),
    ]
    f32 = TensorProto.FLOAT
    return make_model(
        nodes,
        [helper.make_tensor_value_info("x", f32, ["batch", 3, "height", "width"])],
        [
            helper.make_tensor_value_info("features", f32, None),
            helper.make_tensor_value_info("logits", f32, None),
        ],
        [
            w("w_stem", 8, 3, 3, 3),
            w("b_stem", 8),
            w("w_a", 16, 8, 3, 3),
            w("w_b", 16, 16, 3, 3),
            w("w_short", 16, 8, 1, 1),
            w("w_dw", 16, 1, 3, 3),
            w("w_pw", 16, 16, 1, 1),
            w("w_fc", 10, 16),
        ],
    )


def test_cnn_with_dynamic_spatial_dims_exports_optimized(rng):
    """The default passes (NhwcConv channels last, the strided 1x1 Conv as a dot) keep every
    dim the same expression as the original graph's, so the residual Add after a strided stage
    broadcasts; the program then serves two spatial sizes, odd ones included."""
    proto = strided_cnn_model(rng)
    model = transmuter.load(proto)  # optimize=True: the default passes
    assert "NhwcConv" in {n.op_type for n in model.ir.graph.nodes}
    exported = transmuter.export(model)
    plain = transmuter.export(transmuter.load(proto, optimize=False))
    assert [str(a.shape) for a in exported.out_avals] == [str(a.shape) for a in plain.out_avals]
    assert "height" in str(exported.out_avals[0].shape)
    exported = jax.export.deserialize(exported.serialize())
    for shape in ((1, 3, 17, 23), (2, 3, 32, 40)):
        x = rng.standard_normal(shape).astype(np.float32)
        check(call(exported, x), ort_run(proto, {"x": x}), model.outputs)


# Fixtures no export serves, with or without passes (the reason is not a pass's).
NOT_EXPORTABLE = {
    # Patch embeddings: Reshape to floordiv(height, 8)*floordiv(width, 8) of a Conv output
    # floordiv(height - 8, 8) + 1 by floordiv(width - 8, 8) + 1, equal only for height, width >= 8.
    "vit": "patch Reshape",
    "vit_dynamo": "patch Reshape",
    "clip_vision": "patch Reshape",
    "yolos": "patch Reshape",
    "detr": "Resize to a size computed from symbolic dims",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(p.stem for p in FIXTURES.glob("*.onnx")))
def test_optimized_fixture_exports_where_the_original_does(name):
    """A pass never turns a graph that exports into one that does not: every fixture (all have
    symbolic dims) exports with the default passes as it does unoptimized, to the same symbolic
    output shapes."""
    results = []
    for optimize in (False, True):
        try:
            exported = transmuter.export(
                transmuter.load(FIXTURES / f"{name}.onnx", optimize=optimize)
            )
        except transmuter.ExportError:
            results.append(("error",))
        else:
            results.append(("shapes", [str(a.shape) for a in exported.out_avals]))
    plain, optimized = results
    assert optimized == plain
    assert (plain[0] == "error") == (name in NOT_EXPORTABLE), plain


# ------------------------------------------------------------------------ fixture models, reloaded

# Reads each artifact with jax alone, runs it on the stored inputs, and writes the outputs.
RELOAD = """
import json, sys
from pathlib import Path
import jax, numpy as np
for job in json.loads(Path(sys.argv[1]).read_text()):
    folder = Path(job["artifact"])
    manifest = json.loads((folder / "manifest.json").read_text())
    exported = jax.export.deserialize(bytearray((folder / "model.jax_exported").read_bytes()))
    inputs = np.load(job["inputs"])
    args = [inputs[i["name"]].astype(i["dtype"]) for i in manifest["inputs"]]
    if manifest["params_mode"] == "argument":
        stored = np.load(folder / "params.npz")
        args.insert(0, {p["name"]: stored[p["name"]] * job["scale"] for p in manifest["params"]})
    # x64 only where the manifest asks for it: an int32-ids artifact runs with x64 off.
    with jax.enable_x64(manifest["x64"]):
        outputs = exported.call(*args)
        outs = {o["name"]: np.asarray(v) for o, v in zip(manifest["outputs"], outputs)}
    np.savez(job["outputs"], **outs)
assert "transmuter" not in sys.modules
"""


def stored_cases(name):
    stored = np.load(FIXTURES / f"{name}.npz")
    for index in (0, 1):
        prefix = f"case{index}/"
        inputs = {k[len(prefix) + 3 :]: stored[k] for k in stored if k.startswith(prefix + "in/")}
        outputs = {k[len(prefix) + 4 :]: stored[k] for k in stored if k.startswith(prefix + "out/")}
        if inputs:
            yield inputs, outputs


def decoder_cases(name, rng, past):
    """The stored case with a past of length `past` (0 or 6), and one more size computed with
    ONNX Runtime."""
    stored = [
        case for case in stored_cases(name) if case[0]["past_key_values.0.key"].shape[2] == past
    ]
    yield stored[0]
    inputs = stored[0][0]
    batch, sequence, past = 2, 3, min(past, 2)
    more = {
        "input_ids": rng.integers(0, 256, (batch, sequence)),
        "attention_mask": np.ones((batch, past + sequence), np.int64),
    }
    for key, value in inputs.items():
        if key.startswith("past_key_values"):
            heads, width = value.shape[1], value.shape[3]
            more[key] = rng.standard_normal((batch, heads, past, width)).astype(np.float32)
    proto = onnx.load(FIXTURES / f"{name}.onnx")
    names = [o.name for o in proto.graph.output]
    yield more, dict(zip(names, ort_run(proto, more)))


@pytest.fixture(scope="module")
def reloaded(tmp_path_factory):
    """Every artifact written, then run in one fresh process: key -> (inputs, expected, got)."""
    folder = tmp_path_factory.mktemp("exports")
    rng = np.random.default_rng(0)
    bert = transmuter.load(FIXTURES / "bert.onnx")
    gpt2 = transmuter.load(FIXTURES / "gpt2.onnx")
    models = {
        # bert's position table has 64 rows: export derives "sequence <= 64" from the graph.
        "bert": (bert, list(stored_cases("bert")), {}),
        # int32 ids: runs in a process with x64 off.
        "bert_int32": (bert, list(stored_cases("bert")), {"int64_inputs": "int32"}),
        # past_sequence is symbolic, and so at least 1 (jax.export dims are).
        "gpt2": (gpt2, list(decoder_cases("gpt2", rng, past=6)), {}),
        # The first step, with an empty cache, is an export of its own: past dims 0.
        "gpt2_prefill": (
            gpt2,
            list(decoder_cases("gpt2", rng, past=0)),
            {"input_specs": {n: ("batch", 4, 0, 8) for n in gpt2.inputs if n.startswith("past")}},
        ),
        "convnext": (
            transmuter.load(FIXTURES / "convnext.onnx"),
            list(stored_cases("convnext")),
            {},
        ),
        # Strided 1x1 shortcuts added to strided 3x3 branches, at two spatial sizes.
        "resnet": (transmuter.load(FIXTURES / "resnet.onnx"), list(stored_cases("resnet")), {}),
        "resnet_dynamo": (
            transmuter.load(FIXTURES / "resnet_dynamo.onnx"),
            list(stored_cases("resnet_dynamo")),
            {},
        ),
        "bert_argument": (
            bert,
            list(stored_cases("bert")),
            {"constraints": ["sequence <= 64"], "params": "argument"},
        ),
    }
    jobs, expected = [], {}
    for name, (model, cases, options) in models.items():
        exported = transmuter.export(model, **options)
        written = {k: v for k, v in options.items() if k not in ("input_specs", "int64_inputs")}
        transmuter.write_export(exported, folder / name, model=model, **written)
        for index, (inputs, outputs) in enumerate(cases):
            key = f"{name}-{index}"
            np.savez(folder / f"{key}-in.npz", **inputs)
            scale = 0.9 if options.get("params") == "argument" else 1.0
            if scale != 1.0:
                params = {k: v * scale for k, v in model.params.items()}
                run = jax.jit(lambda p, x, model=model: transmuter.run(model, x, params=p))
                outputs = {k: np.asarray(v) for k, v in run(params, inputs).items()}
            jobs.append(
                {
                    "artifact": str(folder / name),
                    "inputs": str(folder / f"{key}-in.npz"),
                    "outputs": str(folder / f"{key}-out.npz"),
                    "scale": scale,
                }
            )
            expected[key] = (inputs, outputs)
    (folder / "jobs.json").write_text(json.dumps(jobs))
    subprocess.run([sys.executable, "-c", RELOAD, str(folder / "jobs.json")], check=True)
    return {key: (*expected[key], np.load(folder / f"{key}-out.npz")) for key in expected}


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "bert",
        "bert_int32",
        "gpt2",
        "gpt2_prefill",
        "convnext",
        "resnet",
        "resnet_dynamo",
        "bert_argument",
    ],
)
def test_fixture_model_round_trip(name, reloaded):
    runs = [(key, v) for key, v in reloaded.items() if key.rsplit("-", 1)[0] == name]
    assert len(runs) == 2
    shapes = set()
    for key, (inputs, expected, got) in runs:
        shapes.add(tuple(v.shape for v in inputs.values()))
        check([got[n] for n in expected], list(expected.values()), [f"{key} {n}" for n in expected])
    assert len(shapes) == 2  # two sizes through one program
