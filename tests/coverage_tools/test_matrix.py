"""The model coverage scripts in coverage/: select_models against a fake Hub client, and
record_references -> run_cases -> print_matrix -> list_models (and find_divergence on a recorded
case) on fixture models in a tmp folder. Input generation, the reference run and comparison are
transmuter.checking's, tested in tests/test_checking.py."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import transmuter

ROOT = Path(__file__).resolve().parents[2]
COVERAGE = ROOT / "coverage"
FIXTURES = ROOT / "tests" / "fixtures" / "models"
SCRIPTS = [
    "cases",
    "find_divergence",
    "select_models",
    "record_references",
    "run_cases",
    "print_matrix",
    "list_models",
]

# Fixture models and the task each stands for; bert gets a config.json (the Hub layout).
TASKS = {
    "bert": "feature-extraction",
    "gpt2": "text-generation",
    "resnet": "image-classification",
    "whisper_encoder": "automatic-speech-recognition",
}


@pytest.fixture(scope="module")
def tools():
    """The scripts, imported the way `python coverage/X.py` runs import each other: by module
    name, with coverage/ (a folder of scripts, not a package) on sys.path."""
    sys.path.insert(0, str(COVERAGE))
    try:
        yield SimpleNamespace(**{name: importlib.import_module(name) for name in SCRIPTS})
    finally:
        sys.path.remove(str(COVERAGE))


# ------------------------------------------------------------------------------------------------
# select_models against a fake Hub client
# ------------------------------------------------------------------------------------------------


class FakeHub:
    """What select_models uses of huggingface_hub.HfApi, answering from a table."""

    def __init__(self, repos):
        self.repos = repos  # repo id -> (task, downloads, gated, files)
        self.queries = []

    def list_models(self, *, filter, pipeline_tag, sort, limit, expand):
        self.queries.append({"filter": filter, "pipeline_tag": pipeline_tag, "sort": sort})
        found = [
            SimpleNamespace(id=repo, downloads=d, gated=g, sha=f"sha-{repo}", pipeline_tag=t)
            for repo, (t, d, g, _) in self.repos.items()
            if t == pipeline_tag
        ]
        return sorted(found, key=lambda m: -m.downloads)[:limit]

    def list_repo_files(self, repo_id, *, revision):
        assert revision == f"sha-{repo_id}"  # files listed at the commit that was selected
        return self.repos[repo_id][3]


HUB = {
    "a/most-popular": ("fill-mask", 900, False, ["README.md", "model.safetensors"]),  # no ONNX
    "a/gated": ("fill-mask", 800, "manual", ["onnx/model.onnx"]),
    "a/bert-onnx": (
        "fill-mask",
        700,
        False,
        [
            "config.json",
            "onnx/model_quantized.onnx",
            "onnx/model_fp16.onnx",
            "onnx/model.onnx",
            "onnx/model.onnx_data",
            "model.onnx",
        ],
    ),
    "a/quantized-only": (
        "fill-mask",
        600,
        False,
        ["onnx/model_q4f16.onnx", "onnx/model_int8.onnx"],
    ),
    "a/third": ("fill-mask", 500, False, ["model.onnx"]),
    "b/seq2seq": (
        "text2text-generation",
        50,
        False,
        ["onnx/encoder_model.onnx", "onnx/decoder_model.onnx", "onnx/decoder_model_merged.onnx"],
    ),
}


def test_select_models_keeps_the_most_downloaded_repos_with_onnx_files(tools, tmp_path):
    hub = FakeHub(HUB)
    rows = tools.select_models.select(
        hub, ["fill-mask", "text2text-generation"], 2, log=lambda _: None
    )
    assert [(r["repo"], r["file"]) for r in rows] == [
        ("a/bert-onnx", "onnx/model.onnx"),
        ("a/quantized-only", "onnx/model_int8.onnx"),
        ("b/seq2seq", "onnx/decoder_model_merged.onnx"),
    ]
    first = rows[0]
    assert first["task"] == "fill-mask" and first["downloads"] == 700
    assert first["revision"] == "sha-a/bert-onnx"
    assert first["data_files"] == ["onnx/model.onnx_data"] and first["config"] == "config.json"
    assert rows[1]["config"] is None
    assert all(q["filter"] == "onnx" and q["sort"] == "downloads" for q in hub.queries)
    for name in ("models.json", "models.csv"):
        tools.select_models.write(rows, tmp_path / name)
        assert tools.select_models.read(tmp_path / name) == rows


def test_select_models_main_writes_the_list(tools, tmp_path):
    out = tmp_path / "models.json"
    tools.select_models.main(
        ["--tasks", "fill-mask", "--per-task", "5", "--out", str(out)], api=FakeHub(HUB)
    )
    assert [r["repo"] for r in json.loads(out.read_text())] == [
        "a/bert-onnx",
        "a/quantized-only",
        "a/third",
    ]


# ------------------------------------------------------------------------------------------------
# The sweep on fixture models
# ------------------------------------------------------------------------------------------------


def noise_model():
    """out = x + RandomNormal: Transmuter and ONNX Runtime draw different numbers from the same
    seed (each its own generator), a mismatch whose first diverging node is the RandomNormal."""
    nodes = [
        helper.make_node("RandomNormal", [], ["noise"], name="draw", shape=[1, 4], seed=1.0),
        helper.make_node("Add", ["x", "noise"], ["out"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "noise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def unknown_op_model():
    """An op of a domain no runtime knows: ONNX Runtime cannot record a reference."""
    node = helper.make_node("Mystery", ["x"], ["out"], domain="example.custom")
    graph = helper.make_graph(
        [node],
        "mystery",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("example.custom", 1)]
    return helper.make_model(graph, opset_imports=opsets)


@pytest.fixture(scope="module")
def swept(tools, tmp_path_factory):
    """A models folder (four fixtures, the noise model, the unknown-op model, each with a task
    sidecar), recorded and run; returns the cases folder and the scripts' printed outputs."""
    root = tmp_path_factory.mktemp("sweep")
    models = root / "models"
    (models / "extra").mkdir(parents=True)
    for name, task in TASKS.items():
        shutil.copy(FIXTURES / f"{name}.onnx", models / f"{name}.onnx")
        fields = {"task": task}
        if name == "bert":
            (models / "bert_config.json").write_text(json.dumps({"vocab_size": 512}))
            fields["config"] = "bert_config.json"
        tools.cases.write_sidecar(models / f"{name}.onnx", fields)
    onnx.save(noise_model(), models / "extra" / "noise.onnx")
    tools.cases.write_sidecar(models / "extra" / "noise.onnx", {"task": "tabular-regression"})
    onnx.save(unknown_op_model(), models / "extra" / "mystery.onnx")
    tools.cases.write_sidecar(models / "extra" / "mystery.onnx", {"task": "tabular-regression"})
    onnx.save(noise_model(), models / "unlabelled.onnx")  # no sidecar: not a case

    cases_dir = root / "cases"
    tools.record_references.main(["--models", str(models), "--out", str(cases_dir)])
    tools.run_cases.main([str(cases_dir)])
    matrix, table = cases_dir / "matrix.md", cases_dir / "models.md"
    tools.print_matrix.main([str(cases_dir), "--out", str(matrix)])
    tools.list_models.main([str(cases_dir), "--out", str(table)])
    return SimpleNamespace(
        cases=cases_dir,
        manifest=tools.cases.read_manifest(cases_dir),
        results=tools.cases.read_results(cases_dir),
        matrix=matrix.read_text(),
        table=table.read_text(),
    )


def test_recorded_cases_have_references_and_generated_inputs(swept):
    recorded = {c["name"]: c for c in swept.manifest["cases"]}
    assert sorted(recorded) == sorted([*TASKS, "extra__noise", "extra__mystery"])
    gpt2 = recorded["gpt2"]
    assert gpt2["inputs"]["attention_mask"]["shape"] == [1, 8]
    assert gpt2["inputs"]["past_key_values.0.key"]["shape"] == [1, 4, 0, 8]
    assert gpt2["outputs"][0] == "logits" and gpt2["nodes"] == 508
    assert recorded["whisper_encoder"]["inputs"]["input_features"]["shape"] == [1, 8, 32]
    assert recorded["resnet"]["inputs"]["pixel_values"]["shape"] == [1, 3, 224, 224]
    assert recorded["extra__mystery"]["reference_error"].startswith(
        "TransmuterError: ONNX Runtime (the reference) cannot load the model"
    )
    assert "Mystery" in recorded["extra__mystery"]["reference_error"]
    with np.load(swept.cases / recorded["bert"]["arrays"]) as stored:
        assert stored["in/input_ids"].max() < 512
        assert stored["out/last_hidden_state"].shape == (1, 8, 32)


def test_fixture_models_pass_with_small_errors(swept):
    for name in TASKS:
        result = swept.results[name]
        assert result["status"] == "pass", result
        assert result["mode"] == "compiled"
        assert result["max_abs"] < 1e-5 and result["max_rel"] < 1e-5
        assert result["load_s"] > 0 and result["compile_s"] > 0 and result["run_s"] > 0


def test_a_mismatch_names_the_first_diverging_node(swept):
    noise = swept.results["extra__noise"]
    assert noise["status"] == "mismatch"
    assert not noise["outputs"]["out"]["ok"]
    assert (
        noise["divergence"]["node"] == "draw" and noise["divergence"]["op_type"] == "RandomNormal"
    )
    assert swept.results["extra__mystery"]["status"] == "no-reference"


def test_the_recording_cpu_is_kept_and_a_saturating_reference_named(tools, swept):
    # ORT's u8 x s8 kernels are exact only with VNNI: where the references were recorded counts.
    assert swept.manifest["cpu"] == transmuter.cpu.describe()
    assert swept.manifest["vnni"] == transmuter.cpu.has_vnni()
    assert swept.results["extra__noise"]["reference_saturation"] == []
    result = dict(swept.results["extra__noise"], reference_saturation=["int8_matmul"])
    assert "may have saturated (no VNNI where it was recorded) at int8_matmul" in (
        tools.print_matrix.problem(result)
    )


def test_matrix_and_model_table(swept):
    lines = swept.matrix.splitlines()
    assert "| feature-extraction | 1 | 1 | 0 | 0 | 0 |" in lines
    assert "| tabular-regression | 2 | 0 | 1 | 0 | 1 |" in lines
    row = next(line for line in lines if line.startswith("| text-generation | ✅ gpt2 ("))
    assert float(row.split("(")[1].split(")")[0]) < 1e-5
    assert any(
        line.startswith("| tabular-regression | ➖ extra__mystery | ⚠️ extra__noise (")
        for line in lines
    )
    assert any("first diverging node 'draw' (RandomNormal)" in line for line in lines)
    table = swept.table.splitlines()
    assert any(
        line.startswith("| — | gpt2.onnx | text-generation | — | 218.0 KB | 508 | 28 | ✅ pass |")
        for line in table
    )
    assert any("| extra/noise.onnx | tabular-regression |" in line for line in table)
    assert len(table) == 2 + 6


def test_find_divergence_names_the_node_on_a_recorded_case(tools, swept, capsys):
    case = next(c for c in swept.manifest["cases"] if c["name"] == "extra__noise")
    model = str(swept.cases / case["model"])
    arrays = str(swept.cases / case["arrays"])
    assert tools.find_divergence.main([model, arrays, "--prefix", "in/"]) == 1
    out = capsys.readouterr().out
    assert "first divergence: node 'draw' (RandomNormal) output 'noise'" in out
    assert "inputs: []" in out and "'seed': 1.0" in out


def test_an_error_is_recorded_with_its_class_and_first_line(tools, swept, monkeypatch):
    def fail(*args, **kwargs):
        raise transmuter.NodeError("node 'x' failed\nmore detail")

    monkeypatch.setattr(transmuter, "compile", fail)
    monkeypatch.setattr(transmuter, "run", fail)
    case = next(c for c in swept.manifest["cases"] if c["name"] == "resnet")
    result = tools.run_cases.run_case(swept.cases, case, 1e-3, 1e-4)
    assert result["status"] == "error" and result["mode"] is None
    assert result["error"] == result["compile_error"] == "NodeError: node 'x' failed"


def test_downloads_from_a_list_write_sidecars(tools, tmp_path):
    """record_references --list: each listed file fetched into models/<repo>/ as laid out in
    the repo, a sidecar written with the task, and the model recorded."""
    fetched = []

    def download(*, repo_id, filename, revision, local_dir):
        fetched.append((repo_id, filename, revision))
        target = Path(local_dir) / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        if filename == "config.json":
            target.write_text(json.dumps({"vocab_size": 512}))
        else:
            shutil.copy(FIXTURES / "bert.onnx", target)
        return str(target)

    rows = [
        {
            "repo": "org/tiny-bert",
            "file": "onnx/model.onnx",
            "task": "feature-extraction",
            "downloads": 12,
            "revision": "abc123",
            "data_files": [],
            "config": "config.json",
        }
    ]
    listing = tmp_path / "models.json"
    tools.select_models.write(rows, listing)
    out = tmp_path / "cases"
    tools.record_references.main(
        ["--list", str(listing), "--models", str(tmp_path / "models"), "--out", str(out)],
        download=download,
    )
    assert fetched == [
        ("org/tiny-bert", "onnx/model.onnx", "abc123"),
        ("org/tiny-bert", "config.json", "abc123"),
    ]
    sidecar = json.loads(
        (tmp_path / "models" / "org__tiny-bert" / "onnx" / "model.json").read_text()
    )
    assert sidecar["task"] == "feature-extraction" and sidecar["config"] == "../config.json"
    (case,) = tools.cases.read_manifest(out)["cases"]
    assert case["name"] == "org__tiny-bert__onnx__model" and case["downloads"] == 12
    assert case["reference_error"] is None
