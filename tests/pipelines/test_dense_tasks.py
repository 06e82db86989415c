"""Call forms of depth-estimation, image-segmentation and mask-generation that transformers'
pipelines take, tested on the mechanism rather than on one recorded model (the recorded
answers are replayed in differential/test_diff_dense.py)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REPOS

import transmuter
from transmuter.errors import InputError

Image = pytest.importorskip("PIL.Image")


@pytest.mark.parametrize(
    "task, repo, key",
    [
        ("depth-estimation", "depth-anything", "predicted_depth"),
        ("image-segmentation", "segformer", "label"),
    ],
)
def test_batch_size_per_call_is_taken_and_checked(task, repo, key):
    """transformers' pipelines take batch_size per call (test_pipelines_image_segmentation's
    run_pipeline_test: a list with batch_size=2): an image task takes it, checks it, and
    answers as without it."""
    pipe = transmuter.pipeline(task, REPOS / repo)
    images = [Image.new("RGB", (20 + 8 * i, 12), (i * 40, 90, 200 - i * 30)) for i in range(3)]
    plain = pipe(images)
    batched = pipe(images, batch_size=2)
    assert len(plain) == len(batched) == 3
    for a, b in zip(plain, batched):
        if key == "label":
            assert [s["label"] for s in a] == [s["label"] for s in b]
        else:
            np.testing.assert_array_equal(a[key], b[key])
    for wrong in (0, 1.5, "2", True):
        with pytest.raises(InputError, match="batch_size must be an integer of at least 1"):
            pipe(images, batch_size=wrong)


def _decode_rle(rle: dict) -> np.ndarray:
    """COCO's uncompressed RLE back to a mask (runs alternate 0s and 1s, column-major)."""
    height, width = rle["size"]
    values = np.concatenate(
        [np.full(n, i % 2, bool) for i, n in enumerate(rle["counts"])] or [np.zeros(0, bool)]
    )
    return values.reshape(width, height).T


@pytest.mark.parametrize(
    "mask",
    [
        np.zeros((3, 4), bool),
        np.ones((3, 4), bool),
        np.eye(4, 6, dtype=bool),
        ~np.eye(5, 3, dtype=bool),
        np.random.default_rng(0).random((7, 9)) > 0.5,
        np.array([[True]]),
    ],
    ids=["empty", "full", "diagonal", "starts-inside", "noise", "one-pixel"],
)
def test_rle_round_trips_in_column_major_order(mask):
    """output_rle_mask's encoding, as transformers' _mask_to_rle: {"size", "counts"} over the
    pixels in Fortran order, the first run one of zeros (0 where the mask starts inside)."""
    from transmuter.pipelines.vision.mask_generation import _rle

    rle = _rle(mask)
    assert rle["size"] == list(mask.shape)
    assert sum(rle["counts"]) == mask.size
    assert all(isinstance(n, int) for n in rle["counts"])
    assert all(n > 0 for n in rle["counts"][1:])
    np.testing.assert_array_equal(_decode_rle(rle), mask)
    if mask.flat[0]:
        assert rle["counts"][0] == 0


def test_mask_generation_extra_outputs_are_checked():
    """output_rle_mask / output_bboxes_mask are booleans (a string was taken as a threshold)."""
    from transmuter.pipelines.vision.mask_generation import GENERATION, _generation_options

    assert _generation_options(GENERATION, {"output_rle_mask": True})["output_rle_mask"] is True
    for name in ("output_rle_mask", "output_bboxes_mask"):
        with pytest.raises(InputError, match=f"{name} must be True or False"):
            _generation_options(GENERATION, {name: "yes"})
