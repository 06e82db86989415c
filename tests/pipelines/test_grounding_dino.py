"""zero-shot-object-detection with Grounding DINO against transformers' pipeline
(make_grounding_dino.py's tiny export, on its seeded images: three landscape sizes resized to
one 64 x 85 input, two portrait sizes to 100 x 50)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from conftest import REPOS, expected
from frontend.test_hub import hub  # noqa: F401  (the loopback Hub fixture)

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.vision.detection import corners_scaled

pytest.importorskip("PIL.Image")

REPO = REPOS / "grounding-dino"
TASK = "zero-shot-object-detection"


def pictures(orientation: str) -> list[np.ndarray]:
    found = np.load(REPO / "images.npz")
    sizes = expected("grounding-dino")["sizes"]
    wide = orientation == "landscape"
    return [found[f"{h}x{w}"] for h, w in sizes if (h < w) == wide]


def assert_same(got: list, want: list) -> None:
    """transformers' detections: labels in order, scores within 1e-4, int boxes equal."""
    assert [d["label"] for d in got] == [d["label"] for d in want]
    np.testing.assert_allclose([d["score"] for d in got], [d["score"] for d in want], atol=1e-4)
    assert [d["box"] for d in got] == [d["box"] for d in want]
    assert all(list(d) == ["score", "label", "box"] for d in got)


def assert_float_boxes(detect, image, labels, threshold, want) -> None:
    """The kept boxes before the pipeline truncates them, best first, within 1e-3 pixels."""
    scores, boxes = detect.grounding.scored(detect.pixels(image), labels)
    corners = corners_scaled(boxes, image.shape[1::-1])
    kept = np.flatnonzero(scores.ravel() > threshold)
    kept = kept[np.argsort(-scores.ravel()[kept], kind="stable")]
    np.testing.assert_allclose(corners.reshape(-1, 4)[kept], np.reshape(want, (-1, 4)), atol=1e-3)


@pytest.fixture(scope="module")
def detect():
    return transmuter.pipeline(TASK, REPO)


def test_processor_and_tokenizer_are_transformers(detect):
    want = expected("grounding-dino")
    pixels = detect.pixels(pictures("landscape")[0])
    np.testing.assert_allclose(pixels, np.load(REPO / "pixel_values.npy"), atol=1e-5)
    tokenizer = detect.grounding.tokenizer
    assert [tokenizer.encode(label).ids for label in want["portrait"]["labels"]] == want[
        "input_ids"
    ]
    # Left-padded with [CLS] (a delimiter) to 16-token buckets, capped at max_text_len (32).
    assert detect.grounding.pad_id == 101
    assert [detect.grounding._width(n) for n in (3, 16, 17, 32)] == [16, 16, 32, 32]


def test_exact_lengths_and_a_pad_size():
    detect = transmuter.pipeline(TASK, REPO)  # compiles on the first call only
    grounding = detect.grounding
    grounding.pad_id = None  # a tokenizer whose [CLS] is not one of the model's delimiters
    assert [grounding._width(n) for n in (3, 17)] == [3, 17]
    grounding.config["pad_size"] = {"height": 96, "width": 96}  # transformers pads to it
    image = grounding._image_inputs(np.ones((3, 64, 85), np.float32))
    assert image["pixel_values"].shape == (1, 3, 96, 96)
    assert image["pixel_mask"].sum() == 64 * 85 and image["pixel_mask"][0, :64, :85].all()
    with pytest.raises(InputError, match="larger than the processor's pad_size"):
        grounding._image_inputs(np.ones((3, 100, 50), np.float32))


def test_labels_scores_boxes_and_requests(detect):
    want = expected("grounding-dino")
    labels, threshold = want["labels"], want["threshold"]
    images = pictures("landscape")
    got = detect(images, candidate_labels=labels, threshold=threshold)  # 4 labels: 4 rows
    for row, wanted in zip(got, want["landscape"]["results"]):
        assert_same(row, wanted)
    for image, boxes in zip(images, want["landscape"]["float_boxes"]):
        assert_float_boxes(detect, image, labels, threshold, boxes)
    assert detect(images[0], labels, threshold=want["nothing_above"]) == []
    case = want["top_k"]
    top = detect(  # 3 labels padded to 4 rows: the same program
        images[0], candidate_labels=",".join(case["labels"]), threshold=0.0, top_k=5
    )
    assert_same(top, case["results"])
    asked = detect({"image": images[1], "candidate_labels": labels}, threshold=threshold)
    assert_same(asked, want["landscape"]["results"][1])
    # transformers' zipped form, a label list per image (refused before), and a generator of
    # request dicts.
    zipped = detect(images[:2], candidate_labels=[labels, labels], threshold=threshold)
    streamed = detect(
        iter([{"image": image, "candidate_labels": labels} for image in images[:2]]),
        threshold=threshold,
    )
    for got, again, wanted in zip(zipped, streamed, want["landscape"]["results"][:2], strict=True):
        assert_same(got, wanted)
        assert_same(again, wanted)
    # Three image sizes resized alike, 4 rows, 16 tokens: one program.
    assert len(detect.grounding._compiled.signatures) == 1


def test_images_padded_to_a_multiple_are_transformers_padded_alike():
    """pad_to_multiple_of=32: each answer is transformers' for the image padded to its resized
    size rounded up to 32 (the processor's pad_size); the three sizes share one program."""
    want = expected("grounding-dino")
    case = want["padded"]
    detect = transmuter.pipeline(TASK, REPO, pad_to_multiple_of=case["multiple"])
    for image, padded in zip(pictures("landscape"), case["images"]):
        got = detect(image, candidate_labels=want["labels"], threshold=0.0, top_k=case["top_k"])
        assert_same(got, padded["results"])
        scores, boxes = detect.grounding.scored(detect.grounding.pixels(image), want["labels"])
        best = np.argsort(-scores.ravel(), kind="stable")[: case["top_k"]]
        corners = corners_scaled(boxes, image.shape[1::-1]).reshape(-1, 4)[best]
        np.testing.assert_allclose(corners, padded["float_boxes"], atol=1e-3)
    assert len(detect.grounding._compiled.signatures) == 1
    with pytest.raises(InputError, match="pad_to_multiple_of is Grounding DINO's"):
        transmuter.pipeline(TASK, REPOS / "owlv2", pad_to_multiple_of=32)
    with pytest.raises(InputError, match="pad_to_multiple_of must be an integer of at least 1"):
        transmuter.pipeline(TASK, REPO, pad_to_multiple_of=0)


def test_bad_inputs(detect, tmp_path):
    image = pictures("landscape")[0]
    with pytest.raises(InputError, match="needs candidate_labels"):
        detect(image)
    with pytest.raises(InputError, match="32 at most"):
        detect(image, ["cat " * 40])
    with pytest.raises(InputError, match="top_k must be an integer of at least 1"):
        detect(image, ["cat"], top_k=0)
    with pytest.raises(InputError, match="batch_size must be an integer of at least 1"):
        transmuter.pipeline(TASK, REPO, batch_size=0)
    with pytest.raises(InputError, match="an image array is"):
        detect(np.zeros((8, 8), np.uint8), ["cat"])
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copy(REPOS / "detr" / "model.onnx", tmp_path / "model.onnx")
    with pytest.raises(ModelLoadError, match="Grounding DINO feeds input_ids"):
        transmuter.pipeline(TASK, tmp_path)
    shutil.copy(REPO / "model.onnx", tmp_path / "model.onnx")
    with pytest.raises(ModelLoadError, match="needs preprocessor_config.json"):
        transmuter.pipeline(TASK, tmp_path)


@pytest.mark.slow  # two programs (4 labels of 16 tokens, one of 32)
def test_a_hub_repo_and_a_long_label(hub):  # noqa: F811
    files = {p.name: p.read_bytes() for p in REPO.iterdir() if p.suffix in (".json", ".onnx")}
    hub.publish("org/grounding-dino", {n: b for n, b in files.items() if n != "expected.json"})
    want = expected("grounding-dino")
    case, threshold = want["portrait"], want["threshold"]
    detect = transmuter.pipeline(TASK, "hf://org/grounding-dino", threshold=threshold)
    images = pictures("portrait")
    got = detect(images, candidate_labels=case["labels"])
    for row, wanted in zip(got, case["results"]):
        assert_same(row, wanted)
    assert any(d["label"] == case["labels"][-1] for d in got[0])  # the 17-token label
    for image, boxes in zip(images, case["float_boxes"]):
        assert_float_boxes(detect, image, case["labels"], threshold, boxes)
    assert len(detect.grounding._compiled.signatures) == 2
