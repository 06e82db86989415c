"""transformers' depth-estimation, image-segmentation and mask-generation pipelines, replayed:
the call forms of their tests/pipelines/test_pipelines_<task>.py on tiny exports made as users
get them (tests/fixtures/differential/make_dense.py: DPT, SegFormer, DETR and SAM through
Optimum; Depth Anything and Mask2Former with torch.onnx, which Optimum does not export)."""

from __future__ import annotations

import pytest
from replay import cases, check, check_transformers_js

REPOS = (
    "dense-dpt",
    "dense-depth-anything",
    "dense-segformer",
    "dense-detr",
    "dense-mask2former",
    "dense-sam",
)
REFUSED = {
    "dense-mask2former/subtask-instance": "Mask2Former's instance post-processing lists "
    "segments in the order of torch's top-k with sorted=False over (query, class) scores, an "
    "order of torch's CPU kernel that Transmuter does not reproduce: an InputError says so",
}
# Over 5 s each on a loaded 2-core machine: programs of their own (a new pipeline, another
# batch bucket, SAM's partial point batches, its 32 x 32 default grid).
SLOW = {
    "dense-sam/batch-5",
    "dense-sam/defaults",
    "dense-segformer/batch",
    "dense-detr/pipeline-options",
    "dense-mask2former/pipeline-options",
}
SLOW_LAYOUTS = {"dense-sam", "dense-mask2former", "dense-detr"}


def _marked(params: list) -> list:
    return [
        pytest.param(*p.values, id=p.id, marks=(*p.marks, pytest.mark.slow)) if p.id in SLOW else p
        for p in params
    ]


@pytest.mark.parametrize("repo, call", _marked(cases(*REPOS, refused=REFUSED)))
def test_call(repo, call):
    check(repo, call)


@pytest.mark.parametrize(
    "repo",
    [
        pytest.param(repo, marks=pytest.mark.slow) if repo in SLOW_LAYOUTS else repo
        for repo in REPOS
    ],
)
def test_transformers_js_layout(repo, tmp_path):
    check_transformers_js(repo, tmp_path)
