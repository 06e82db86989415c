"""mask-generation against transformers' SamModel + SamProcessor and mask-generation pipeline
(make_sam.py's tiny SAM, in transformers.js's two-part layout)."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from conftest import REPOS, expected
from frontend.test_hub import hub  # noqa: F401  (the loopback Hub fixture)

import transmuter
from transmuter.errors import InputError

Image = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def segment():
    return transmuter.pipeline("mask-generation", REPOS / "sam")


def images() -> list[np.ndarray]:
    return [np.load(REPOS / "sam" / f"image{i}.npy") for i in range(2)]  # 48 x 80, 72 x 40


def unpacked(packed: dict) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(base64.b64decode(packed["bits"]), np.uint8))
    return bits[: np.prod(packed["shape"])].reshape(packed["shape"]).astype(bool)


def assert_masks(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == bool and got.shape == want.shape
    got = got.reshape(-1, *got.shape[-2:])
    for ours, theirs in zip(got, want.reshape(got.shape)):
        union = (ours | theirs).sum()
        assert union == 0 or (ours & theirs).sum() / union >= 0.999


def assert_prompted(result: dict, case: dict) -> None:
    np.testing.assert_allclose(result["iou_scores"], case["iou_scores"], atol=1e-4)
    assert_masks(result["masks"], unpacked(case["masks"]))


def prompts(cases: list[dict]) -> dict:
    """The cases' prompts as one call's, one entry per image."""
    keys = {key for case in cases for key in case["prompts"]}
    return {key: [case["prompts"].get(key) for case in cases] for key in sorted(keys)}


def test_point_prompts_are_transformers(segment):
    cases = expected("sam")["points"]
    pictures = images()
    for case in cases:
        result = segment(pictures[case["image"]], **prompts([case]))
        assert list(result) == ["masks", "iou_scores"]
        assert result["masks"].shape[:2] == (2, 3)  # prompts, SAM's three masks
        assert_prompted(result, case)
    # A batch, a Pillow image and float pixels: the cached embeddings serve every call.
    batch = segment(
        [Image.fromarray(pictures[0]), pictures[1] / 255.0], **prompts(cases), multimask_output=True
    )
    for result, case in zip(batch, cases):
        assert_prompted(result, case)
    assert len(segment._embeddings) == 2


def test_automatic_mask_generation_is_transformers(segment):
    for case in expected("sam")["generation"]:
        result = segment(images()[0], **case["options"])
        assert list(result) == case["keys"] == ["masks", "scores"]
        assert len(result["masks"]) == len(case["masks"])
        np.testing.assert_allclose(result["scores"], case["scores"], atol=1e-4)
        assert all(isinstance(score, float) for score in result["scores"])
        for mask, want in zip(result["masks"], case["masks"]):
            assert_masks(mask, unpacked(want))
    assert expected("sam")["generation"][-1]["masks"] == []  # the defaults keep nothing here


def test_bad_inputs(segment):
    image = images()[0]
    with pytest.raises(InputError, match="same number of points"):
        segment(image, input_points=[[[[1, 2]], [[3, 4], [5, 6]]]])
    with pytest.raises(InputError, match="one label per point"):
        segment(image, input_points=[[[[1, 2], [3, 4]]]], input_labels=[[[1]]])
    with pytest.raises(InputError, match="one entry per image"):
        segment([image, image], input_points=[[[[1, 2]]]])
    with pytest.raises(InputError, match="takes no input_boxes"):
        segment(image, input_boxes=[[[1, 2, 30, 40]]])
    with pytest.raises(InputError, match="give the points too"):
        segment(image, input_labels=[[[1]]])
    with pytest.raises(InputError, match="crops_n_layers=1 is not supported"):
        segment(image, crops_n_layers=1)
    with pytest.raises(InputError, match=r"has no option \['points_per_side'\]"):
        transmuter.pipeline("mask-generation", REPOS / "sam", points_per_side=4)
    case = expected("sam")["points"][0]
    with pytest.raises(InputError, match="returns 3 mask"):
        segment(image, **prompts([case]), multimask_output=False)
    with pytest.raises(InputError, match="height, width, channels"):
        segment(np.zeros((8, 8), np.uint8))
    for name, bad in [("points_per_batch", "x"), ("points_per_crop", 0), ("pred_iou_thresh", "x")]:
        with pytest.raises(InputError, match=name):
            segment(image, **{name: bad})
    with pytest.raises(InputError, match=r"has no option \['points'\]"):
        segment(image, points=[[1, 2]])


@pytest.mark.slow
def test_box_prompts_are_transformers():
    segment = transmuter.pipeline("mask-generation", REPOS / "sam-boxes", multimask_output=False)
    pictures = images()
    for case in expected("sam-boxes")["boxes"]:  # boxes alone, and a box with two points
        result = segment(pictures[case["image"]], **prompts([case]))
        assert result["masks"].shape[1] == 1
        assert_prompted(result, case)
    with pytest.raises(InputError, match="needs input_boxes"):
        segment(pictures[0], input_points=[[[[1, 2]]]])


@pytest.mark.slow
def test_a_hub_repo_segments(hub):  # noqa: F811
    folder = REPOS / "sam"
    files = {
        path.relative_to(folder).as_posix(): path.read_bytes()
        for path in folder.rglob("*")
        if path.is_file() and path.suffix in (".json", ".onnx") and path.name != "expected.json"
    }
    hub.publish("org/sam", files)
    segment = transmuter.pipeline("mask-generation", "hf://org/sam")
    case = expected("sam")["points"][0]
    assert_prompted(segment(images()[0], **prompts([case])), case)
