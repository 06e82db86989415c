"""image-text-to-text with Florence-2 (make_florence2.py's tiny random-weight model in
onnx-community's four-part layout) against transformers: Florence2Processor's prompts and
pixel values, greedy generate()'s tokens (no_repeat_ngram_size=3 as the repo asks; num_beams=1
asked for, where the repo's default is 3 beams), and post_process_generation's parsing, of generated texts and of fixed ones a trained model
writes. Decoding compiles a program per step ("past" decoding) for each batch size, so the full
12-token comparisons are slow-marked, all on batches of the two images (whose programs they
share), and the quick ones stop at 4 tokens."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from conftest import REPOS, expected
from frontend.test_hub import hub  # noqa: F401  (the loopback Hub fixture)

import transmuter
from transmuter.errors import InputError
from transmuter.pipelines.generation.seq2seq import _no_repeat
from transmuter.pipelines.vision.florence2 import Florence2Captioner, construct_prompt
from transmuter.pipelines.vision.processors import preprocess

Image = pytest.importorskip("PIL.Image")

REPO = REPOS / "florence2"
EOS = 2  # generation_config.json's forced_eos_token_id


@pytest.fixture(scope="module")
def florence():
    # Greedy, as the expected tokens were made; the repo's default is 3 beams (test_beams_*).
    return transmuter.pipeline("image-text-to-text", REPO, max_new_tokens=12, num_beams=1)


def images() -> list[np.ndarray]:
    with np.load(REPO / "images.npz") as found:
        return [found[f"arr_{i}"] for i in range(len(found))]


def cases():
    """(task, image, expected row) for each task and image."""
    for task, rows in expected("florence2")["tasks"].items():
        yield from ((task, image, row) for image, row in zip(images(), rows))


def test_prompts_and_pixels_are_the_processors(florence):
    for task, image, row in cases():
        assert construct_prompt(task) == row["prompt"]
        assert florence.prompt_ids(task) == row["input_ids"]
        pixels = preprocess(image, florence.images).astype(np.float64)
        assert pixels.shape == (3, 64, 64) and row["image_tokens"] == 65
        np.testing.assert_allclose(pixels.sum(), row["pixel_sum"], rtol=1e-5, atol=1e-3)
        np.testing.assert_allclose(np.abs(pixels).sum(), row["pixel_abs_sum"], rtol=1e-6)


def test_parsing_is_post_process_generations(florence):
    # Boxes, quad boxes (one under the area threshold), phrases (one banned), polygons, region
    # proposals, open-vocabulary detection, and a detection that found nothing.
    for case in expected("florence2")["parsing"]:
        got = florence.parse(case["text"], case["task"], tuple(case["image_size"]))
        assert got == case["parsed"], case["text"]
    for task, image, row in cases():  # the random model's texts, in its two image sizes
        size = (image.shape[1], image.shape[0])
        assert florence.parse(row["text"], task, size) == row["parsed"]


def test_a_batch_of_two_image_sizes_first_tokens(florence):
    """Both images (landscape and portrait, resized to the processor's 64 x 64) in one batch:
    transformers' first tokens, the fourth forced to the end of sequence."""
    rows = expected("florence2")["tasks"]["<OD>"]
    pixels = np.stack([preprocess(image, florence.images) for image in images()])
    got = florence.generate(pixels, [rows[0]["input_ids"]] * 2, max_new_tokens=4)
    assert got == [row["new_tokens"][:3] + [EOS] for row in rows]
    found = florence(images(), text="<OD>", max_new_tokens=4)
    assert [list(f) for f in found] == [["<OD>"], ["<OD>"]]
    assert all(set(f["<OD>"]) == {"bboxes", "labels"} for f in found)


def test_call_forms(florence):
    """transformers' image-text-to-text forms: images and text, images= and a text per image,
    {"image", "text"} dicts, a generator; a wide image's boxes are in its own frame."""

    pictures = images()
    want = florence(pictures, text="<OD>", max_new_tokens=4)
    dicts = [{"image": p, "text": "<OD>"} for p in pictures]
    assert florence(dicts, max_new_tokens=4) == want
    assert florence(images=pictures, text=["<OD>", "<OD>"], max_new_tokens=4) == want
    assert florence(dicts[0], max_new_tokens=4) == want[0]
    streamed = florence(iter(dicts), max_new_tokens=4)
    assert not isinstance(streamed, list) and list(streamed) == want
    wide = np.asarray(Image.fromarray(pictures[0]).resize((400, 20)))
    found = florence([wide, pictures[1]], text="<OD>", max_new_tokens=4)[0]["<OD>"]
    for box in found["bboxes"]:
        assert all(0 <= x <= 400 for x in box[0::2]) and all(0 <= y <= 20 for y in box[1::2])
    with pytest.raises(InputError, match="images given twice"):
        florence(pictures, images=pictures, text="<OD>")


def test_a_wide_image_under_an_aspect_keeping_processor_is_named(tmp_path):
    """<OD> on a wide image ended in an error inside the vision tower: with a processor that
    keeps the aspect ratio (a shortest_edge, no center crop) and an export taking any image
    size, the wide image's feature map is wider than the tower's 2-D position table (torch's
    Florence2ForConditionalGeneration raises IndexError on it, on this fixture's config). It is
    an InputError naming the sizes and the config before the model runs; a square image under
    the same processor answers as under the fixture's own."""
    import json
    import shutil

    import onnx

    shutil.copytree(REPO, tmp_path / "repo")
    tower = tmp_path / "repo" / "onnx" / "vision_encoder.onnx"
    proto = onnx.load(str(tower))
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "height", "width"
    onnx.save(proto, str(tower))
    config = tmp_path / "repo" / "preprocessor_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "size": {"shortest_edge": 64}}))
    florence = transmuter.pipeline("image-text-to-text", tmp_path / "repo", max_new_tokens=4)
    square = np.asarray(Image.fromarray(images()[0]).resize((64, 64)))
    assert list(florence(square, text="<OD>")) == ["<OD>"]
    wide = np.zeros((40, 200, 3), np.uint8)
    with pytest.raises(InputError, match=r"200 x 40 pixels .* resizes to 320 x 64 .* 64 x 64"):
        florence(wide, text="<OD>")


def test_no_repeat_ngram_bans_what_transformers_bans():
    rng = np.random.default_rng(0)
    history = rng.integers(0, 4, (3, 12))
    logits = np.zeros((3, 4), np.float32)
    ban = jax.jit(_no_repeat, static_argnums=3)  # a program per n-gram size
    for length in range(1, 13):
        for size in (2, 3):
            got = np.isinf(np.asarray(ban(logits, history, np.int32(length), size)))
            for row in range(3):
                tokens = history[row, :length].tolist()
                grams = zip(*[tokens[i:] for i in range(size)])
                tail = tuple(tokens[length - size + 1 :]) if length >= size - 1 else None
                banned = {g[-1] for g in grams if g[:-1] == tail}
                assert set(np.flatnonzero(got[row])) == banned, (row, length, size)


def test_bad_inputs(florence):
    image = images()[0]
    with pytest.raises(InputError, match="give text="):
        florence(image)
    with pytest.raises(InputError, match="text has 1 entries, one per item"):
        florence([image, image], text=["<OD>"])
    with pytest.raises(InputError, match="must be the whole prompt"):
        florence(image, text="<OD> cars")
    with pytest.raises(InputError, match=r"has no option \['num_return_sequences'\]"):
        florence(image, text="<OD>", num_return_sequences=2)
    with pytest.raises(InputError, match="cannot be combined with"):
        florence(image, text="<OD>", num_beams=3, do_sample=True)
    with pytest.raises(InputError, match="height, width, channels"):
        florence(np.zeros((8, 8), np.uint8), text="<OD>")
    with pytest.raises(InputError, match="non-empty list"):
        florence([], text="<OD>")
    with pytest.raises(InputError, match=r"has no option \['beams'\]"):
        florence(image, text="<OD>", beams=2)


def test_beams_default_to_generation_configs():
    """generation_config.json's num_beams=3, early_stopping and no_repeat_ngram_size are the
    defaults, as transformers' generate() takes them (the differential harness replays
    transformers' beam-searched answers)."""
    defaults = transmuter.pipeline("image-text-to-text", REPO).defaults
    assert (defaults["num_beams"], defaults["early_stopping"]) == (3, True)
    assert defaults["no_repeat_ngram_size"] == 3


def test_image_to_text_hands_florence2_to_the_caption_task():
    caption = transmuter.pipeline("image-to-text", REPO)
    assert isinstance(caption, Florence2Captioner) and caption.defaults["num_beams"] == 3
    with pytest.raises(InputError, match=r"has no option \['decoding'\]"):
        transmuter.pipeline("image-to-text", REPO, decoding="padded")


def test_a_hub_repo_loads_its_four_parts_and_parsing_rules(hub, florence):  # noqa: F811
    files = {
        path.relative_to(REPO).as_posix(): path.read_bytes()
        for path in REPO.rglob("*")
        if path.is_file() and path.name not in ("expected.json", "images.npz")
    }
    hub.publish("org/florence2", files)
    remote = transmuter.pipeline("image-text-to-text", "hf://org/florence2")
    assert set(remote.repo.onnx) == {"vision_encoder", "embed_tokens", "encoder", "decoder_merged"}
    assert remote.parsing == florence.parsing and remote.parsing["ocr"]["AREA_THRESHOLD"] > 0
    assert remote.prompt_ids("<OCR>") == florence.prompt_ids("<OCR>")


@pytest.mark.slow
def test_each_task_on_each_image_is_transformers(florence):
    pixels = np.stack([preprocess(image, florence.images) for image in images()])
    for task, rows in expected("florence2")["tasks"].items():
        got = florence.generate(pixels, [row["input_ids"] for row in rows])
        assert got == [row["new_tokens"] for row in rows]
        assert florence(images(), text=task) == [row["parsed"] for row in rows]


@pytest.mark.slow
def test_a_batch_of_different_prompts(florence, tmp_path):
    from PIL import Image

    path = tmp_path / "image.png"
    Image.fromarray(images()[1]).save(path)
    want = expected("florence2")["tasks"]
    tasks = ["<OCR_WITH_REGION>", "<CAPTION>"]  # 13 and 8 tokens: one padded to the other
    got = florence([Image.fromarray(images()[0]), path], text=tasks)
    assert got == [want[tasks[0]][0]["parsed"], want[tasks[1]][1]["parsed"]]


@pytest.mark.slow
def test_image_to_text_captions_are_transformers(florence):
    caption = transmuter.pipeline("image-to-text", REPO, max_new_tokens=12, num_beams=1)
    # The same repo's decoder as `florence`'s, whose compiled programs it takes over: what is
    # the captioner's own is its prompt and its text without special tokens.
    caption.decoder = florence.decoder
    rows = expected("florence2")["tasks"]["<CAPTION>"]
    assert caption(images()) == [[{"generated_text": row["caption"]}] for row in rows]
