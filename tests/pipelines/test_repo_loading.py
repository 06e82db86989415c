"""load_repo: Optimum's and transformers.js's layouts, from a folder and from the Hub."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import REPOS, expected
from frontend.test_hub import hub  # noqa: F401  (the loopback Hub fixture)

import transmuter
from transmuter.errors import InputError, ModelLoadError


def test_optimum_decoder_layout():
    repo = transmuter.load_repo(REPOS / "gpt2")
    assert set(repo.onnx) == {"decoder", "decoder_with_past", "decoder_merged"}
    assert repo.config["model_type"] == "gpt2"
    assert repo.generation_config["eos_token_id"] == 0
    assert repo.preprocessor_config == {}
    assert repo.tokenizer.get_vocab_size() == repo.config["vocab_size"]


def test_transformers_js_layout_and_dtype(tmp_path):
    (tmp_path / "onnx").mkdir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(REPOS / "bert" / name, tmp_path / name)
    shutil.copy(REPOS / "bert" / "model.onnx", tmp_path / "onnx" / "model.onnx")
    shutil.copy(REPOS / "bert-sst" / "model.onnx", tmp_path / "onnx" / "model_q4.onnx")
    assert transmuter.load_repo(tmp_path).onnx["model"].name == "model.onnx"
    assert transmuter.load_repo(tmp_path, dtype="q4").onnx["model"].name == "model_q4.onnx"
    with pytest.raises(
        ModelLoadError,
        match=r"dtype='fp16'.*found \['config.json', 'onnx/model.onnx', 'onnx/model_q4.onnx'",
    ):
        transmuter.load_repo(tmp_path, dtype="fp16")
    with pytest.raises(ModelLoadError, match="dtype must be one of"):
        transmuter.load_repo(tmp_path, dtype="int3")


def test_a_repo_of_other_dtypes_says_which_to_pass(tmp_path):
    # onnx-community's Kokoro as the real int8 file is laid out: only onnx/model_quantized.onnx.
    (tmp_path / "onnx").mkdir()
    shutil.copy(REPOS / "bert" / "model.onnx", tmp_path / "onnx" / "model_quantized.onnx")
    with pytest.raises(ModelLoadError, match=r"holds q8 files: pass dtype='q8'$"):
        transmuter.load_repo(tmp_path)
    shutil.copy(REPOS / "bert" / "model.onnx", tmp_path / "onnx" / "model_fp16.onnx")
    with pytest.raises(
        ModelLoadError, match=r"holds fp16 and q8 files: pass dtype='fp16' \(or 'q8'\)"
    ):
        transmuter.load_repo(tmp_path, dtype="q4")
    assert transmuter.load_repo(tmp_path, dtype="q8").onnx["model"].name == "model_quantized.onnx"


def test_a_folder_without_onnx_lists_what_it_found(tmp_path):
    shutil.copy(REPOS / "bert" / "config.json", tmp_path / "config.json")
    with pytest.raises(ModelLoadError, match=r"no ONNX model.*found \['config.json'\]"):
        transmuter.load_repo(tmp_path)
    with pytest.raises(ModelLoadError, match="is not a folder"):
        transmuter.load_repo(tmp_path / "missing")


def test_a_task_without_its_files_says_what_is_missing(tmp_path):
    shutil.copy(REPOS / "bert" / "model.onnx", tmp_path / "model.onnx")
    with pytest.raises(ModelLoadError, match="needs tokenizer.json"):
        transmuter.pipeline("feature-extraction", tmp_path)


def test_unknown_tasks_and_options_are_errors():
    with pytest.raises(InputError, match="unknown task 'summarize'"):
        transmuter.pipeline("summarize", REPOS / "bert")
    # transformers 5 dropped grouped_entities for aggregation_strategy.
    with pytest.raises(InputError, match=r"has no option \['grouped_entities'\]"):
        transmuter.pipeline("token-classification", REPOS / "bert-ner", grouped_entities=True)
    with pytest.raises(InputError, match=r"has no option \['beams'\]"):
        transmuter.pipeline("text-generation", REPOS / "llama", beams=4)


def publish(server, repo: str, folder) -> str:
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.name != "expected.json"}
    return server.publish(repo, files)


def test_a_hub_repo_loads_at_one_commit_and_runs(hub):  # noqa: F811
    commit = publish(hub, "org/bert", REPOS / "bert")
    want = expected("bert")
    embed = transmuter.pipeline(
        "feature-extraction", "hf://org/bert", pooling="mean", normalize=True
    )
    np.testing.assert_allclose(embed(want["texts"]), want["mean"], atol=1e-5)
    repo = transmuter.load_repo(f"hf://org/bert@{commit}")
    assert f"snapshots/{commit}/model.onnx" in repo.onnx["model"].as_posix()
    with pytest.raises(ModelLoadError, match="does not exist"):
        transmuter.load_repo("hf://org/nothing")
    with pytest.raises(ModelLoadError, match="is not a Hub repository"):
        transmuter.load_repo("hf://org/bert/model.onnx")


def test_a_hub_decoder_generates_what_transformers_did(hub):  # noqa: F811
    publish(hub, "org/llama", REPOS / "llama")
    want = expected("llama")["single"]
    generate = transmuter.pipeline("text-generation", "hf://org/llama")
    assert generate.generate(want["input_ids"], max_new_tokens=40) == want["new_tokens"]


def test_cache_dir_lets_a_second_process_skip_xla(tmp_path):
    """pipeline(cache_dir=) persists what the task compiles: a second process reads it back."""
    script = textwrap.dedent(f"""
        import transmuter
        seen = []
        transmuter.telemetry.attach("t", ["transmuter.segment.compile.stop"],
                                    lambda e, m, md: seen.append(md["disk_cache"]))
        classify = transmuter.pipeline("text-classification", {str(REPOS / "bert-sst")!r},
                                       cache_dir={str(tmp_path / "cache")!r})
        classify("a fine film")
        print(",".join(seen))
    """)
    runs = [
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    assert runs[0].stdout.strip() and set(runs[0].stdout.strip().split(",")) == {"miss"}
    assert set(runs[1].stdout.strip().split(",")) == {"hit"}, runs[1].stderr


def test_cache_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="is a file"):
        transmuter.pipeline("text-classification", REPOS / "bert-sst", cache_dir=tmp_path / "file")
