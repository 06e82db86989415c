"""image-segmentation's DETR panoptic, instance and semantic and Mask2Former's panoptic and
semantic against transformers' pipeline (make_panoptic.py's tiny DetrForSegmentation and
Mask2FormerForUniversalSegmentation, on detection_images.py's seeded images of four sizes and
aspect ratios)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import REPOS, expected

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.vision import segmentation

sys.path.insert(0, str(REPOS.parent))
from detection_images import images  # noqa: E402  (the images the fixture was recorded on)

Image = pytest.importorskip("PIL.Image")

NAME = "detr-panoptic"
M2F = "mask2former-panoptic"


@pytest.fixture(scope="module")
def segment():
    return transmuter.pipeline("image-segmentation", REPOS / NAME)


@pytest.fixture(scope="module")
def masks():
    with np.load(REPOS / NAME / "masks.npz") as found:
        return dict(found)


@pytest.fixture(scope="module")
def m2f_masks():
    with np.load(REPOS / M2F / "masks.npz") as found:
        return dict(found)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / max((a | b).sum(), 1))


def assert_same(
    row: list, run: str, i: int, masks: dict, name: str = NAME, ties: np.ndarray | None = None
) -> None:
    """Image i's transformers' labels in order, scores within 1e-4, masks of IoU >= 0.999;
    `ties`: pixels whose class rounding decides (left out of the IoU)."""
    want = expected(name)[run]
    assert [r["label"] for r in row] == want["labels"][i]
    assert all(list(r) == ["score", "label", "mask"] for r in row)
    if run == "semantic":
        assert all(r["score"] is None for r in row)
    else:
        assert all(isinstance(r["score"], float) for r in row)
        np.testing.assert_allclose([r["score"] for r in row], want["scores"][i], atol=1e-4)
    for j, r in enumerate(row):
        assert r["mask"].mode == "L" and r["mask"].size == images()[i].shape[1::-1]
        mask = np.asarray(r["mask"])
        assert set(np.unique(mask)) <= {0, 255}
        decided = np.ones(mask.shape, bool) if ties is None else ~ties
        assert iou((mask > 0) & decided, masks[f"{run}_{i}_{j}"] & decided) >= 0.999


@pytest.mark.slow  # four programs (one per resized size): 8-14 s to compile on 2 cores
@pytest.mark.parametrize("run", ["panoptic", "instance", "semantic", "default"])
def test_segments_are_transformers(segment, masks, run, tmp_path, monkeypatch):
    options = expected(NAME)["options"][run]
    batch = images()
    path = tmp_path / "image.png"
    Image.fromarray(batch[3]).save(path)
    # Semantic maps of random weights have pixels where two classes' upsampled scores tie to
    # within float rounding (7e-7 against a median margin of 0.07): the CPU's kernels (AVX2 or
    # AVX-512) decide those, here and in torch, so they are left out of the IoU.
    maps = []

    def resize_maps(found, size, mode):
        maps.append(resize(found, size, mode))
        return maps[-1]

    resize = segmentation.resize_maps
    monkeypatch.setattr(segmentation, "resize_maps", resize_maps)
    got = segment([batch[0], Image.fromarray(batch[1]), batch[2], path], **options)
    assert len(got) == 4
    for i, row in enumerate(got):
        top = np.sort(maps[i], 0)[-2:] if run == "semantic" else None
        ties = None if top is None else top[1] - top[0] < 1e-5
        assert_same(row, run, i, masks, ties=ties)


def test_options_at_load_single_image_and_nothing_found(masks):
    options = expected(NAME)["options"]["instance"]
    segment = transmuter.pipeline("image-segmentation", REPOS / NAME, **options)
    assert segment(images()[3]) == []  # nothing above the threshold
    assert_same(segment(images()[1]), "instance", 1, masks)  # one image: its list
    # Per call options win over the load's.
    assert segment(images()[1], threshold=0.95) == []
    assert len(segment.model._compiled.signatures) == 2  # a program per resized size


def test_errors(segment):
    with pytest.raises(InputError, match="'panoptic', 'instance', 'semantic'"):
        segment(images()[0], subtask="panoptc")
    with pytest.raises(InputError, match="'panoptic', 'instance', 'semantic'"):
        transmuter.pipeline("image-segmentation", REPOS / NAME, subtask="depth")
    with pytest.raises(InputError, match="non-empty list"):
        segment([])
    # DETR without the mask head: object detection's export.
    with pytest.raises(ModelLoadError, match="reads logits and pred_masks"):
        transmuter.pipeline("image-segmentation", REPOS / "detr")
    with pytest.raises(ModelLoadError, match="supports SegformerImageProcessor, Detr.*'Yolos"):
        transmuter.pipeline("image-segmentation", REPOS / "yolos")


def test_overlap_ratio_is_float32(segment):
    """A query keeps 4 of its 5 pixels: transformers' ratio is float32's 4 / 5, above 0.8."""
    probabilities = np.full((2, 5), 0.0125, np.float32)
    probabilities[0, 0] = probabilities[1, 1] = 0.95
    # Mask logits: sigmoids of about 1 and 0.9 for the first query, 1 at the last pixel for the
    # second (which takes that pixel).
    masks = np.asarray([[[10, 10, 10, 10, 2.2]], [[-10, -10, -10, -10, 10]]], np.float32)
    options = {"threshold": 0.9, "mask_threshold": 0.5}
    found = segment._panoptic(
        probabilities, masks, (1, 5), overlap_mask_area_threshold=0.8, **options
    )
    assert [r["label"] for r in found] == ["cat", "dog"]
    assert np.asarray(found[0]["mask"]).tolist() == [[255, 255, 255, 255, 0]]
    found = segment._panoptic(
        probabilities, masks, (1, 5), overlap_mask_area_threshold=0.81, **options
    )
    assert [r["label"] for r in found] == ["dog"]


# --- Mask2Former --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def m2f():
    return transmuter.pipeline("image-segmentation", REPOS / M2F)


@pytest.mark.parametrize("run", ["panoptic", "semantic", "default", "high"])
def test_mask2former_is_transformers(m2f, m2f_masks, run):
    got = m2f(images(), **expected(M2F)["options"][run])
    assert len(got) == 4
    for i, row in enumerate(got):
        assert_same(row, run, i, m2f_masks, M2F)
    assert len(m2f.model._compiled.signatures) == 1  # every image resized to 64 x 96


def test_mask2former_resize_and_instance():
    segment = transmuter.pipeline("image-segmentation", REPOS / M2F)
    resized = expected(M2F)["resized"]
    segment.model.config["size"] = resized["size"]  # sides rounded up to multiples of 32
    assert segment.model.config["size_divisor"] == resized["size_divisor"]
    assert [list(segment.model.pixels(p).shape[1:]) for p in images()] == resized["shapes"]
    with pytest.raises(InputError, match="'panoptic', 'semantic' .*unsorted top-k"):
        segment(images()[0], subtask="instance")
