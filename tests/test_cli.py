"""The `transmuter` command line, on fixture models and small graphs built here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_checking import int8_matmul_model

from transmuter import checking, cpu
from transmuter.checking import comparison
from transmuter.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "models"
BERT = str(FIXTURES / "bert.onnx")


def _detector(path: Path) -> str:
    """scores -> Greater -> NonZero -> Gather: one certain break."""
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["scores"], ["r"]),
            helper.make_node("Greater", ["r", "t"], ["keep"]),
            helper.make_node("NonZero", ["keep"], ["idx"], name="nonzero"),
            helper.make_node("Gather", ["r", "idx"], ["picked"]),
        ],
        "det",
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["boxes"])],
        [helper.make_tensor_value_info("picked", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.array(0.5, np.float32), "t")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def test_info_lists_interface_ops_and_no_breaks(capsys):
    assert main(["info", BERT]) == 0
    out = capsys.readouterr().out
    assert "input_ids: tensor(int64)[batch, sequence]" in out
    assert "last_hidden_state: tensor(float32)[batch, sequence, 32]" in out
    assert "opsets: ai.onnx 17" in out
    assert "LayerNormalization" in out and "unsupported: none" in out
    assert "graph breaks: none" in out


def test_info_names_break_nodes(tmp_path, capsys):
    assert main(["info", _detector(tmp_path / "det.onnx")]) == 0
    out = capsys.readouterr().out
    assert "nonzero (NonZero) breaks: 'keep' is data" in out


def test_info_names_unsupported_ops(tmp_path, capsys):
    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"], domain="com.example")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
    )
    path = tmp_path / "custom.onnx"
    onnx.save(model, path)
    assert main(["info", str(path)]) == 1
    assert "unsupported: com.example::NoSuchOp" in capsys.readouterr().out


def test_run_with_given_and_made_inputs_saves_outputs(tmp_path, capsys):
    ids = np.array([[1, 2, 3, 4]], np.int64)
    np.save(tmp_path / "ids.npy", ids)
    out_dir = tmp_path / "out"
    argv = ["run", BERT, "--input", f"input_ids={tmp_path / 'ids.npy'}", "--output-dir"]
    assert main([*argv, str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert "last_hidden_state: float32[1, 4, 32]" in out
    saved = np.load(out_dir / "last_hidden_state.npy")
    assert saved.shape == (1, 4, 32)
    # The stored fixture outputs were made with masks of ones and token types 0 as well.
    ref = checking.reference_outputs(
        BERT,
        {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": 0 * ids},
    )
    np.testing.assert_allclose(saved, ref["last_hidden_state"], rtol=1e-4, atol=1e-5)


def test_check_passes_on_a_fixture(capsys):
    assert main(["check", str(FIXTURES / "gpt2.onnx"), "--dim", "sequence=5"]) == 0
    out = capsys.readouterr().out
    assert "present.1.value" in out and "all 5 outputs match" in out


def replace_reference(monkeypatch, outputs):
    """ONNX Runtime's outputs made by `outputs`, for the CLI and the divergence search."""
    monkeypatch.setattr(checking, "reference_outputs", outputs)
    monkeypatch.setattr(comparison, "reference_outputs", outputs)


def test_check_reports_the_first_diverging_node(monkeypatch, capsys):
    real = checking.reference_outputs
    target = "/model/encoder/layer.0/attention/self/Softmax_output_0"

    def skewed(source, inputs, *, expose_intermediates=False):
        values = real(source, inputs, expose_intermediates=expose_intermediates)
        if expose_intermediates:
            values[target] = values[target] + 0.1
        else:
            values["last_hidden_state"] = values["last_hidden_state"] + 0.1
        return values

    replace_reference(monkeypatch, skewed)
    assert main(["check", BERT]) == 1
    out = capsys.readouterr().out
    assert "last_hidden_state" in out and "MISMATCH" in out
    assert f"output '{target}'" in out and "(Softmax)" in out


def test_config_sizes_made_up_inputs(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text('{"vision_config": {"image_size": 64}}')
    assert main(["run", str(FIXTURES / "resnet.onnx"), "--config", str(config)]) == 0
    # 64 x 64 pixels (224 without the config) through resnet's stride 8.
    assert "last_hidden_state: float32[1, 32, 8, 8]" in capsys.readouterr().out


def test_bench_prints_both_and_a_ratio(capsys):
    assert main(["bench", BERT, "--runs", "2", "--dim", "sequence=4"]) == 0
    out = capsys.readouterr().out
    assert "transmuter" in out and "onnxruntime" in out and "ratio" in out


def test_errors_are_one_line_with_a_hint(tmp_path, capsys):
    assert main(["info", str(tmp_path / "missing.onnx")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-2].startswith("error: ModelLoadError: no ONNX file at")
    assert err[-1].startswith("hint: ")
    with pytest.raises(Exception, match="no ONNX file"):
        main(["--debug", "info", str(tmp_path / "missing.onnx")])


def test_bad_option_values_are_errors(capsys):
    assert main(["run", BERT, "--dim", "sequence"]) == 1
    assert "--dim 'sequence': write NAME=SIZE" in capsys.readouterr().err


def test_console_entry_point_runs():
    done = subprocess.run(
        [sys.executable, "-m", "transmuter.cli", "info", BERT],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "graph breaks: none" in done.stdout


@pytest.mark.slow
def test_export_writes_an_artifact_with_constraints(tmp_path, capsys):
    out = tmp_path / "bert_export"
    argv = ["export", BERT, "-o", str(out), "--constraint", "sequence <= 64"]
    assert main([*argv, "--platform", "cpu", "--platform", "cuda"]) == 0
    assert {p.name for p in out.iterdir()} >= {"model.jax_exported", "model.mlir", "manifest.json"}
    assert "wrote" in capsys.readouterr().out


def test_export_derives_the_bound_the_graph_states(tmp_path, capsys):
    # bert slices a 64-row position table: "sequence <= 64" is derived, not asked for.
    assert main(["export", BERT, "-o", str(tmp_path / "x"), "--int64-inputs", "int32"]) == 0
    assert "derived constraint: sequence <= 64" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "x" / "manifest.json").read_text())
    assert manifest["derived_constraints"] == ["sequence <= 64"] and not manifest["x64"]


def test_export_shape_error_no_bound_explains_says_so(tmp_path, capsys):
    # x's last dim (5) cannot meet the table's (4): no constraint would help.
    graph = helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["shape"]),
            helper.make_node("Slice", ["shape", "one", "two"], ["length"]),
            helper.make_node("Slice", ["table", "zero", "length"], ["rows"]),
            helper.make_node("Add", ["x", "rows"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["sequence", 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            onnx.numpy_helper.from_array(np.ones((16, 4), np.float32), "table"),
            onnx.numpy_helper.from_array(np.array([0], np.int64), "zero"),
            onnx.numpy_helper.from_array(np.array([0], np.int64), "one"),
            onnx.numpy_helper.from_array(np.array([1], np.int64), "two"),
        ],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert main(["export", str(path), "-o", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-2].startswith("error: ExportError") and "no bound the graph states" in err[-2]
    assert err[-1].startswith("hint: ") and "--constraint" in err[-1]


def test_export_shape_option_is_checked(tmp_path, capsys):
    assert main(["export", BERT, "-o", str(tmp_path / "x"), "--shape", "input_ids"]) == 1
    assert "--shape 'input_ids': write NAME=VALUE" in capsys.readouterr().err


def saturating_u8_s8_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """u8 [M, K] x s8 [K, N] as vpmaddubsw computes it (ONNX Runtime's kernels without VNNI):
    each pair of adjacent products summed in a saturating int16 lane, then the lanes in int32."""
    a, b = a.astype(np.int32), b.astype(np.int32)
    if a.shape[1] % 2:
        a, b = np.pad(a, ((0, 0), (0, 1))), np.pad(b, ((0, 1), (0, 0)))
    pairs = a[:, 0::2, None] * b[None, 0::2] + a[:, 1::2, None] * b[None, 1::2]
    return np.clip(pairs, -(2**15), 2**15 - 1).sum(1).astype(np.int32)


def test_check_says_where_the_reference_may_saturate(tmp_path, monkeypatch, capsys):
    # The reference as ORT computes it on an AVX2 CPU: the mismatch is ORT's, and check says so.
    rng = np.random.default_rng(0)
    weight = rng.integers(-128, 128, (16, 4)).astype(np.int8)
    path = tmp_path / "int8.onnx"
    onnx.save(int8_matmul_model(weight), path)
    real = checking.reference_outputs

    def saturated(source, inputs, *, expose_intermediates=False):
        values = real(source, inputs, expose_intermediates=True)
        zero_point_sums = int(values["zero"]) * weight.astype(np.int32).sum(0)
        values["y"] = saturating_u8_s8_matmul(values["q"], weight) - zero_point_sums
        return values if expose_intermediates else {"y": values["y"]}

    replace_reference(monkeypatch, saturated)
    monkeypatch.setattr(cpu, "has_vnni", lambda: False)
    x = tmp_path / "x.npy"
    np.save(x, (rng.standard_normal((3, 16)) * 4).astype(np.float32))
    assert main(["check", str(path), "--input", f"x={x}"]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "output 'y'" in out
    assert "may saturate on this CPU" in out
    assert "int8_matmul (MatMulInteger): q x w, pairs up to 65280" in out
    assert "the first divergence is one of them" in out


def _graph_file(path: Path, nodes: list, constants: dict[str, np.ndarray]) -> str:
    """A float32 x [3] -> y [3] model of `nodes`, with `constants` as initializers."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        [onnx.numpy_helper.from_array(v, k) for k, v in constants.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def test_check_noise_is_the_references_own_movement(tmp_path, monkeypatch, capsys):
    # Round(x * 1e6) moves by round(x) when x moves by 1e-6 of itself, as a quantized model's
    # outputs move by whole steps: a reference that rounded the other way is within that noise.
    path = _graph_file(
        tmp_path / "round.onnx",
        [helper.make_node("Mul", ["x", "scale"], ["s"]), helper.make_node("Round", ["s"], ["y"])],
        {"scale": np.array(1e6, np.float32)},
    )
    np.save(tmp_path / "x.npy", np.array([1.0, 2.0, 0.25], np.float32))
    argv = ["check", path, "--input", f"x={tmp_path / 'x.npy'}", "--rtol", "0", "--atol", "0.5"]
    real = checking.reference_outputs
    for step, verdict in ((1.0, 0), (5.0, 1)):

        def stepped(source, inputs, *, expose_intermediates=False, step=step):
            values = real(source, inputs, expose_intermediates=expose_intermediates)
            values["y"] = values["y"] + np.float32(step)
            return values

        replace_reference(monkeypatch, stepped)
        assert main(argv) == 1
        assert "MISMATCH" in capsys.readouterr().out
        assert main([*argv, "--noise"]) == verdict
        out = capsys.readouterr().out
        if verdict == 0:
            assert "within the model's noise (the reference moves by 2)" in out
            assert "all 1 outputs match or within the model's noise (rtol 0, atol 0.5)" in out
        else:
            assert "MISMATCH  (the reference moves by 2)" in out


def test_check_finds_where_a_non_finite_value_starts(tmp_path, monkeypatch, capsys):
    # x / (x - x) is infinite in Transmuter; a reference that kept it finite (as ORT keeps the
    # selected branch of a Where finite) and differs earlier by rounding: the search for the
    # first divergence would stop at the Sub, the search for a non-finite value at the Div.
    path = _graph_file(
        tmp_path / "div.onnx",
        [
            helper.make_node("Sub", ["x", "x"], ["zero"], name="sub"),
            helper.make_node("Div", ["x", "zero"], ["q"], name="div"),
            helper.make_node("Relu", ["q"], ["y"], name="relu"),
        ],
        {},
    )
    real = checking.reference_outputs

    def finite(source, inputs, *, expose_intermediates=False):
        values = real(source, inputs, expose_intermediates=expose_intermediates)
        for name in ("zero", "q", "y"):
            if name in values:
                values[name] = np.full_like(values[name], 0.5)
        return values

    replace_reference(monkeypatch, finite)
    np.save(tmp_path / "x.npy", np.array([1.0, 2.0, 3.0], np.float32))
    assert main(["check", path, "--input", f"x={tmp_path / 'x.npy'}"]) == 1
    out = capsys.readouterr().out
    assert "first non-finite value: node 'div' (Div) output 'q': 3 of 3 elements" in out
    assert "its inputs: x, zero" in out
