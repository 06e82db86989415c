"""transformers' object-detection and zero-shot-object-detection answers, replayed.

The repos (tests/fixtures/differential/make_detection.py): DETR, YOLOS and RT-DETR exported
with Optimum's main_export (task "object-detection"), OWL-ViT and OWLv2 with it (task
"zero-shot-object-detection"), Grounding DINO in transformers.js's layout (Optimum cannot
export it). Each call form of transformers' test_pipelines_object_detection.py and
test_pipelines_zero_shot_object_detection.py, and of the pipelines' __call__, is recorded
once per repo with transformers' answer.
"""

from __future__ import annotations

import pytest
from replay import cases, check, check_transformers_js

DETECTORS = ["det-detr", "det-yolos", "det-rtdetr"]
ZERO_SHOT = ["det-owlvit", "det-owlv2", "det-grounding-dino"]

REFUSED: dict[str, str] = {}


@pytest.mark.parametrize("repo, call", cases(*DETECTORS, *ZERO_SHOT, refused=REFUSED))
def test_call(repo, call):
    check(repo, call)


# det-grounding-dino is already in transformers.js's layout (onnx/model.onnx): every call above
# loads it from there.
@pytest.mark.parametrize("repo", [*DETECTORS, "det-owlvit", "det-owlv2"])
def test_transformers_js_layout(repo, tmp_path):
    check_transformers_js(repo, tmp_path)
