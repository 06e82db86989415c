"""image-classification against transformers' pipeline (make_pipelines.py's tiny ViT)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REPOS, expected

import transmuter
from transmuter.errors import InputError
from transmuter.pipelines.vision.processors import preprocess

Image = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def classify():
    return transmuter.pipeline("image-classification", REPOS / "vit", top_k=3)


def images():
    return [np.load(REPOS / "vit" / "images.npy"), np.load(REPOS / "vit" / "image_small.npy")]


def test_labels_and_scores_are_transformers(classify):
    want = expected("vit")["results"]
    got = classify(images())  # a 48 x 40 image (resized) and a 32 x 32 one
    for row, wanted in zip(got, want):
        assert [r["label"] for r in row] == [w["label"] for w in wanted]
        np.testing.assert_allclose(
            [r["score"] for r in row], [w["score"] for w in wanted], atol=1e-5
        )
    pillow = classify(Image.fromarray(images()[0]), top_k=1)
    assert pillow[0]["label"] == want[0][0]["label"] and len(pillow) == 1
    floats = classify(images()[1] / 255.0)
    np.testing.assert_allclose(floats[0]["score"], want[1][0]["score"], atol=1e-5)


def test_shortest_edge_and_center_crop():
    config = {
        "size": {"shortest_edge": 40},
        "do_center_crop": True,
        "crop_size": 32,
        "image_mean": [0.5] * 3,
        "image_std": [0.5] * 3,
    }
    pixels = preprocess(np.zeros((60, 48, 3), np.uint8), config)
    assert pixels.shape == (3, 32, 32) and np.allclose(pixels, -1.0)


def test_bad_images(classify):
    with pytest.raises(InputError, match="height, width, channels"):
        classify(np.zeros((32, 32), np.uint8))
    with pytest.raises(InputError, match="non-empty list"):
        classify([])


def test_an_image_that_resizes_to_nothing_is_named():
    config = {"size": {"shortest_edge": 64, "longest_edge": 96}}  # DETR's rule: 0 x 96
    with pytest.raises(InputError, match="1 x 600 pixels.*too extreme"):
        preprocess(np.zeros((600, 1, 3), np.uint8), config)


def test_generators_options_and_their_checks(classify):
    want = expected("vit")["results"]
    streamed = classify(iter(images()))
    assert not isinstance(streamed, list)
    for row, wanted in zip(streamed, want, strict=True):
        assert [r["label"] for r in row] == [w["label"] for w in wanted]
    # top_k past the label count gives every label, as transformers caps it.
    assert len(classify(images()[0], top_k=100)) == len(classify.repo.config["id2label"])
    logits = classify(images()[0], function_to_apply="none", top_k=1)[0]["score"]
    probability = classify(images()[0], function_to_apply="softmax", top_k=1)[0]["score"]
    assert logits != probability and probability == pytest.approx(want[0][0]["score"], abs=1e-5)
    for bad in (0, -2, "3", 1.5):
        with pytest.raises(InputError, match="top_k must be an integer of at least 1"):
            classify(images()[0], top_k=bad)
    with pytest.raises(InputError, match="function_to_apply must be one of softmax, sigmoid"):
        classify(images()[0], function_to_apply="relu")
    with pytest.raises(InputError, match="batch_size must be an integer of at least 1"):
        transmuter.pipeline("image-classification", REPOS / "vit", batch_size=0)


def test_images_as_transformers_reads_strings(classify, tmp_path):
    import base64
    import io

    buffer = io.BytesIO()
    Image.fromarray(images()[1]).save(buffer, format="PNG")
    encoded = base64.b64encode(buffer.getvalue()).decode()
    want = classify(images()[1])
    assert classify(encoded) == want
    assert classify("data:image/png;base64," + encoded) == want
    with pytest.raises(InputError, match="URLs are not fetched"):
        classify("https://example.com/cat.png")
    with pytest.raises(InputError, match="no such file, and not a base64 image"):
        classify(str(tmp_path / "missing.png"))
    assert transmuter.pipeline("image-classification", REPOS / "vit", top_k=None).top_k == 5
