"""Every task from `hf://` against the loopback Hub: the repo published there answers as the
same repo read from its folder (which the task's own tests check against transformers). Tasks
whose own tests already load from `hf://` are not repeated here."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REPOS
from frontend.test_hub import hub  # noqa: F401  (the loopback Hub fixture)

import transmuter

IMAGE = np.random.default_rng(0).integers(0, 256, (48, 72, 3), np.uint8)
LABELS = {"candidate_labels": ["a cat", "a remote control"]}

# (task, repo, input, call options)
CASES = [
    ("image-classification", "vit", IMAGE, {}),
    ("zero-shot-image-classification", "clip", IMAGE, LABELS),
    ("object-detection", "detr", IMAGE, {"threshold": 0.0}),
    ("zero-shot-object-detection", "owlv2", IMAGE, {**LABELS, "threshold": 0.0}),
    ("depth-estimation", "depth-anything", IMAGE, {}),
    ("image-segmentation", "detr-panoptic", IMAGE, {"threshold": 0.3}),
    ("image-to-text", "vit-gpt2", IMAGE, {"max_new_tokens": 4}),
    ("feature-extraction", "bert", "the cat sat", {}),
    ("text-classification", "bert-sst", {"text": "the cat", "text_pair": "sat"}, {}),
    ("fill-mask", "bert-mlm", "the [MASK] sat", {}),
    ("zero-shot-classification", "bert-nli", "the cat sat", LABELS),
]


def plain(value):
    """Results as comparable values: Pillow images and arrays as nested lists."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "getbands") or isinstance(value, np.ndarray):
        return np.asarray(value).tolist()
    return value


@pytest.mark.slow  # two pipelines, each compiling, per task
@pytest.mark.parametrize("task, name, given, options", CASES, ids=[c[0] for c in CASES])
def test_a_task_runs_from_the_hub_as_from_its_folder(hub, task, name, given, options):  # noqa: F811
    folder = REPOS / name
    files = {
        path.relative_to(folder).as_posix(): path.read_bytes()
        for path in folder.rglob("*")
        if path.is_file()
        and path.suffix in (".json", ".onnx", ".txt")
        and path.name != "expected.json"
    }
    hub.publish(f"org/{name}", files)
    want = transmuter.pipeline(task, folder)(given, **options)
    got = transmuter.pipeline(task, f"hf://org/{name}")(given, **options)
    assert plain(want) not in ([], [[]])  # something to compare
    assert plain(got) == plain(want)
