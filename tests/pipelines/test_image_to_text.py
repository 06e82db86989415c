"""image-to-text against transformers (make_image_to_text.py's tiny ViT-GPT2 captioner)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REPOS, expected

import transmuter
from transmuter.errors import InputError
from transmuter.pipelines.vision.processors import preprocess

pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def caption():
    # "padded" decoding: 2 programs for 20 tokens where "past" compiles one a token (the
    # decodings themselves are compared in test_seq2seq.py).
    return transmuter.pipeline(
        "image-to-text", REPOS / "vit-gpt2", max_new_tokens=20, decoding="padded"
    )


def images() -> list[np.ndarray]:
    with np.load(REPOS / "vit-gpt2" / "images.npz") as found:
        return [found[f"arr_{i}"] for i in range(len(found))]


def test_captions_are_transformers(caption):
    want = expected("vit-gpt2")
    assert caption(images()) == want["captions"]  # three sizes, resized to one: one batch
    pixels = np.stack([preprocess(image, caption.images) for image in images()])
    eos = caption.repo.config["eos_token_id"]
    cut = [row[: row.index(eos) + 1] if eos in row else row for row in want["new_tokens"]]
    assert caption.generate(pixels) == cut


def test_images_from_files_and_pillow(caption, tmp_path):
    from PIL import Image

    path = tmp_path / "image.png"
    Image.fromarray(images()[1]).save(path)
    given = [Image.fromarray(images()[0]), path, images()[2] / 255.0]  # the batch of 3 again
    assert caption(given) == expected("vit-gpt2")["captions"]


def test_bad_inputs(caption):
    with pytest.raises(InputError, match="non-empty list"):
        caption([])
    with pytest.raises(InputError, match="height, width, channels"):
        caption(np.zeros((8, 8), np.uint8))
    with pytest.raises(InputError, match="positions"):
        caption(images()[0], max_new_tokens=100)


def test_generate_kwargs_and_batch_size(caption):
    """transformers' image-to-text takes generate_kwargs (a dict of generation options) and
    batch_size per call; a length given both ways is refused, as transformers refuses it."""
    image = images()[0]
    want = caption(image, max_new_tokens=3)
    assert caption(image, generate_kwargs={"max_new_tokens": 3}, batch_size=2) == want
    with pytest.raises(InputError, match="given both"):
        caption(image, max_new_tokens=3, generate_kwargs={"max_new_tokens": 4})
    with pytest.raises(InputError, match="generate_kwargs"):
        caption(image, generate_kwargs=["max_new_tokens"])
    with pytest.raises(InputError, match="batch_size"):
        caption(image, batch_size=0)
