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

# Over 5 s each on a loaded 2-core machine: Grounding DINO compiles a program per resized size,
# row bucket and text bucket (13-55 s a call); DETR's and YOLOS's 7-image lists a program per
# size (6-19 s).
SLOW = {"det-detr/list-mixed", "det-yolos/list-mixed"}


def marked(params: list) -> list:
    return [
        pytest.param(*p.values, id=p.id, marks=(*p.marks, pytest.mark.slow))
        if p.id in SLOW or p.id.startswith("det-grounding-dino/")
        else p
        for p in params
    ]


@pytest.mark.parametrize("repo, call", marked(cases(*DETECTORS, *ZERO_SHOT, refused=REFUSED)))
def test_call(repo, call):
    check(repo, call)


# det-grounding-dino is already in transformers.js's layout (onnx/model.onnx): every call above
# loads it from there.
@pytest.mark.parametrize(
    "repo",
    [
        *(pytest.param(r, marks=pytest.mark.slow) if r == "det-rtdetr" else r for r in DETECTORS),
        "det-owlvit",
        "det-owlv2",
    ],
)
def test_transformers_js_layout(repo, tmp_path):
    check_transformers_js(repo, tmp_path)
