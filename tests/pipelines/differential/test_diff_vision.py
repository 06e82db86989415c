"""transformers' answers to the call forms of its image-classification,
image-feature-extraction, zero-shot-image-classification, image-to-text and
image-text-to-text (Florence-2) pipeline tests, replayed on exports made as users get them
(tests/fixtures/differential/make_vision.py: ViT, DINOv2, CLIP, SigLIP and ViT-GPT2 with past
through Optimum; Florence-2 in onnx-community's four-part layout, which Optimum does not
export). The generating repos compile a decode program per token: marked slow."""

from __future__ import annotations

import pytest
from replay import cases, check, check_transformers_js

REPOS = ("vision-vit", "vision-vit-features", "vision-dinov2", "vision-clip", "vision-siglip")
GENERATING = ("vision-vit-gpt2", "vision-florence2")
_VIT_POOLER = (
    "Optimum's ViT feature-extraction export has last_hidden_state only: transformers' "
    "pool=True is ViTPooler's dense layer and tanh on the CLS token, weights the export "
    "leaves out, so transmuter refuses pool=True on it (InputError naming the outputs)"
)
_FLORENCE_PIPELINE = (
    "transmuter's image-text-to-text answers Florence2Processor.post_process_generation's "
    "parse ({task: answer}, the parsed-* calls, which pass); transformers' pipeline answers "
    "[{input_text, generated_text}] (the prompt and the tokens decoded without special "
    "tokens): that answer shape is not offered"
)
REFUSED = {
    "vision-vit-features/pool": _VIT_POOLER,
    "vision-vit-features/pool-tensors": _VIT_POOLER,
    "vision-vit-features/batch": _VIT_POOLER,
    "vision-vit-features/pipeline-pool": _VIT_POOLER,
    "vision-florence2/pipeline-od": _FLORENCE_PIPELINE,
    "vision-florence2/pipeline-caption": _FLORENCE_PIPELINE,
    "vision-florence2/pipeline-list": _FLORENCE_PIPELINE,
}


def _refused(repos: tuple[str, ...]) -> dict[str, str]:
    return {name: why for name, why in REFUSED.items() if name.split("/")[0] in repos}


@pytest.mark.parametrize("repo, call", cases(*REPOS, refused=_refused(REPOS)))
def test_call(repo, call):
    check(repo, call)


@pytest.mark.slow
@pytest.mark.parametrize("repo, call", cases(*GENERATING, refused=_refused(GENERATING)))
def test_generation_call(repo, call):
    check(repo, call)


@pytest.mark.parametrize("repo", REPOS)
def test_transformers_js_layout(repo, tmp_path):
    check_transformers_js(repo, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("repo", GENERATING)
def test_generation_transformers_js_layout(repo, tmp_path):
    check_transformers_js(repo, tmp_path)
