"""zero-shot-image-classification, image-feature-extraction, depth-estimation and
image-segmentation against transformers' pipelines (make_vision_tasks.py's tiny CLIP, SigLIP,
ViT, Depth Anything and SegFormer; images of 48 x 40, 30 x 64, 64 x 64 and 20 x 36)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REPOS, expected
from frontend.test_hub import hub  # noqa: F401  (the loopback Hub fixture)

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.vision.processors import resize_maps

Image = pytest.importorskip("PIL.Image")


def images(name: str) -> list[np.ndarray]:
    with np.load(REPOS / name / "images.npz") as found:
        return [found[f"arr_{i}"] for i in range(len(found))]


def assert_ranked(got: list, want: list) -> None:
    for row, wanted in zip(got, want, strict=True):
        assert [r["label"] for r in row] == [w["label"] for w in wanted]
        assert all(isinstance(r["score"], float) for r in row)
        np.testing.assert_allclose(
            [r["score"] for r in row], [w["score"] for w in wanted], atol=1e-4
        )


# --- zero-shot-image-classification ------------------------------------------------------------


@pytest.fixture(scope="module", params=["clip", "siglip"])
def zero_shot(request):
    return request.param, transmuter.pipeline(
        "zero-shot-image-classification", REPOS / request.param
    )


def test_zero_shot_is_transformers(zero_shot):
    name, classify = zero_shot
    want = expected(name)
    batch = images(name)  # four sizes, resized to one: one image batch
    got = classify(batch, candidate_labels=want["labels"][1:], hypothesis_template=want["template"])
    assert_ranked(got, want["templated"])
    total = sum(r["score"] for r in got[0])
    # CLIP: a softmax over the labels; SigLIP: a sigmoid per label.
    assert total == pytest.approx(1.0) if name == "clip" else total > 1.5


@pytest.mark.slow
def test_zero_shot_label_counts(zero_shot):
    name, classify = zero_shot
    want = expected(name)
    batch = images(name)
    # Three labels padded to four with the four images (the shapes of the templated test's
    # program), five padded to eight with one image.
    assert_ranked(classify(batch, candidate_labels=want["labels"][:3]), want["three"])
    one = classify(Image.fromarray(batch[1]), candidate_labels=want["labels"])
    assert_ranked([one], want["default"][1:2])
    shapes = {(s["input_ids"][0], s["pixel_values"][0]) for s in classify._compiled.signatures}
    assert {(4, 4), (8, 1)} <= shapes


def test_zero_shot_bad_inputs(zero_shot):
    name, classify = zero_shot
    # One string is comma-separated labels, as base.py reads it for every task (this test
    # refused it before; transformers would iterate the string's characters as labels).
    one = classify(images(name)[0], candidate_labels="cat, dog")
    assert one == classify(images(name)[0], candidate_labels=["cat", "dog"])
    with pytest.raises(InputError, match="candidate_labels"):
        classify(images(name)[0], candidate_labels=[])
    with pytest.raises(InputError, match="hypothesis_template"):
        classify(images(name)[0], candidate_labels=["cat"], hypothesis_template="{label}")
    with pytest.raises(InputError, match="non-empty list"):
        classify([], candidate_labels=["cat"])
    with pytest.raises(InputError, match="needs candidate_labels"):
        classify(images(name)[0])


def test_zero_shot_needs_the_whole_model(tmp_path):
    (tmp_path / "onnx").mkdir()
    for name in ("config.json", "tokenizer.json", "preprocessor_config.json"):
        (tmp_path / name).write_bytes((REPOS / "clip" / name).read_bytes())
    (tmp_path / "onnx" / "vision_model.onnx").write_bytes(
        (REPOS / "clip" / "model.onnx").read_bytes()
    )
    with pytest.raises(ModelLoadError, match="runs model.onnx"):
        transmuter.pipeline("zero-shot-image-classification", tmp_path)


# --- image-feature-extraction ------------------------------------------------------------------


@pytest.fixture(scope="module")
def features():
    return transmuter.pipeline("image-feature-extraction", REPOS / "vit-features")


def test_features_are_transformers(features):
    want = expected("vit-features")
    batch = images("vit-features")
    hidden = features(batch)
    assert isinstance(hidden[0], list) and len(hidden[0]) == 1  # a batch dim of 1, as lists
    for got, wanted in zip(hidden, want["hidden"], strict=True):
        np.testing.assert_allclose(got, wanted, atol=1e-4)
    pooled = features(batch, pool=True, return_tensors=True)
    for got, wanted in zip(pooled, want["pooled"], strict=True):
        assert isinstance(got, np.ndarray) and got.shape == (1, 32)
        np.testing.assert_allclose(got, wanted, atol=1e-4)
    assert len(features.model._compiled.signatures) == 1


def test_features_bad_inputs(features):
    with pytest.raises(InputError, match="height, width, channels"):
        features(np.zeros((8, 8), np.uint8))
    with pytest.raises(ModelLoadError, match="pixel_values only"):
        transmuter.pipeline("image-feature-extraction", REPOS / "clip")


def test_features_image_processor_kwargs(features):
    """transformers hands image_processor_kwargs to the image processor: its settings win over
    preprocessor_config.json's, per call and for the pipeline."""
    from transmuter.pipelines.vision.processors import preprocess

    image = images("vit-features")[0]
    plain = np.asarray(features(image, return_tensors=True))
    raw = features(image, return_tensors=True, image_processor_kwargs={"do_normalize": False})
    assert not np.allclose(plain, raw)
    unnormalized = {**features.images, "do_normalize": False}
    assert preprocess(image, unnormalized).max() <= 1.0  # rescaled only
    configured = transmuter.pipeline(
        "image-feature-extraction",
        REPOS / "vit-features",
        image_processor_kwargs={"do_normalize": False},
    )
    np.testing.assert_allclose(configured(image, return_tensors=True), raw, atol=1e-6)
    for bad in ("do_normalize", {1: 2}):
        with pytest.raises(InputError, match="image_processor_kwargs"):
            features(image, image_processor_kwargs=bad)


def test_features_from_a_vision_tower(tmp_path):
    # transformers.js's split exports: the vision tower where there is no model.onnx.
    (tmp_path / "onnx").mkdir()
    for name in ("config.json", "preprocessor_config.json"):
        (tmp_path / name).write_bytes((REPOS / "vit-features" / name).read_bytes())
    tower = tmp_path / "onnx" / "vision_model.onnx"
    tower.write_bytes((REPOS / "vit-features" / "model.onnx").read_bytes())
    extract = transmuter.pipeline("image-feature-extraction", tmp_path)
    assert str(extract.model.model.source).endswith("onnx/vision_model.onnx")
    assert extract.model.model.outputs == ["last_hidden_state", "pooler_output"]


def test_hub_features(hub):  # noqa: F811
    folder = REPOS / "vit-features"
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.name != "expected.json"}
    hub.publish("org/vit-features", files)
    extract = transmuter.pipeline("image-feature-extraction", "hf://org/vit-features", pool=True)
    got = extract(images("vit-features")[2])
    np.testing.assert_allclose(got, expected("vit-features")["pooled"][2], atol=1e-4)


# --- depth-estimation --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def depth():
    return transmuter.pipeline("depth-estimation", REPOS / "depth-anything")


def assert_depth(got: dict, want_depth: list, want_image: list) -> None:
    wanted = np.asarray(want_depth, np.float32)
    assert got["predicted_depth"].shape == wanted.shape
    scale = np.abs(wanted).max()
    np.testing.assert_allclose(got["predicted_depth"], wanted, atol=1e-4 * scale)
    assert got["depth"].mode == "L" and got["depth"].size == wanted.shape[::-1]
    # 8-bit truncation of the same floats: at most a step apart where a value sits on an edge.
    assert np.abs(np.asarray(got["depth"], np.int16) - np.asarray(want_image)).max() <= 1


def test_depth_is_transformers(depth):
    want = expected("depth-anything")
    image = images("depth-anything")[0]  # 48 x 40: 56 x 42 (keep_aspect_ratio, multiples of 14)
    got = depth([image, Image.fromarray(image)])  # one shape: one batch
    for result in got:
        assert list(result) == ["predicted_depth", "depth"]
        assert_depth(result, want["predicted_depth"][0], want["depth"][0])
    assert depth.model._compiled.signatures == [{"pixel_values": (2, 3, 56, 42)}]


@pytest.mark.slow
def test_depth_every_aspect_ratio(depth):
    want = expected("depth-anything")
    got = depth(images("depth-anything"))  # 56 x 42, 14 x 42, 42 x 42, 28 x 42: four programs
    for index, result in enumerate(got):
        assert_depth(result, want["predicted_depth"][index], want["depth"][index])
    shapes = {s["pixel_values"][2:] for s in depth.model._compiled.signatures}
    assert shapes == {tuple(shape[1:]) for shape in want["pixel_shapes"]}


def test_depth_bad_inputs(depth):
    with pytest.raises(InputError, match="non-empty list"):
        depth([])
    with pytest.raises(ModelLoadError, match="DPTImageProcessor"):
        transmuter.pipeline("depth-estimation", REPOS / "segformer")


def test_interpolation_is_torchs():
    # torch.nn.functional.interpolate(..., align_corners=False) outputs, from torch 2.13.
    square = np.array([[[0.0, 1.0], [2.0, 3.0]]])
    bilinear = [[0.0, 0.5, 1.0], [1.0, 1.5, 2.0], [2.0, 2.5, 3.0]]
    np.testing.assert_allclose(resize_maps(square, (3, 3), "bilinear")[0], bilinear, atol=1e-6)
    bicubic = [[-0.2604, 0.3264, 0.9132], [0.9132, 1.5, 2.0868], [2.0868, 2.6736, 3.2604]]
    np.testing.assert_allclose(resize_maps(square, (3, 3), "bicubic")[0], bicubic, atol=1e-4)
    wide = resize_maps(np.arange(20.0).reshape(1, 4, 5), (3, 7), "bicubic")[0]
    np.testing.assert_allclose(
        wide[:, [0, 3, 6]],
        [[0.5521, 2.6308, 4.7095], [7.4213, 9.5, 11.5787], [14.2905, 16.3692, 18.4479]],
        atol=1e-4,
    )


# --- image-segmentation ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def segment():
    return transmuter.pipeline("image-segmentation", REPOS / "segformer")


def iou(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a > 0, b > 0
    return float((a & b).sum() / max((a | b).sum(), 1))


def test_segments_are_transformers(segment, tmp_path):
    want = expected("segformer")
    with np.load(REPOS / "segformer" / "masks.npz") as found:
        masks = iter([found[f"arr_{i}"] for i in range(len(found))])
    batch = images("segformer")
    path = tmp_path / "image.png"
    Image.fromarray(batch[3]).save(path)
    got = segment([batch[0], batch[1], Image.fromarray(batch[2]), path])
    for row, labels in zip(got, want["labels"], strict=True):
        assert [r["label"] for r in row] == labels
        for result in row:
            assert list(result) == ["score", "label", "mask"] and result["score"] is None
            assert result["mask"].mode == "L"
            assert iou(np.asarray(result["mask"]), next(masks)) >= 0.999
    assert len(segment.model._compiled.signatures) == 1


def test_segmentation_subtasks(segment):
    same = segment(images("segformer"), subtask="semantic")  # the batch of four again
    assert [r["label"] for r in same[2]] == expected("segformer")["labels"][2]
    with pytest.raises(InputError, match="'semantic'"):
        segment(images("segformer")[2], subtask="panoptic")
    with pytest.raises(InputError, match="'semantic'"):
        transmuter.pipeline("image-segmentation", REPOS / "segformer", subtask="instance")


# --- call forms and their checks (issue 41) ----------------------------------------------------


def test_zero_shot_answers_once_per_image(zero_shot):
    # Three images padded to the program's batch of four, with four labels: three answers
    # (the padded image row came back as a fourth), each transformers' for that image alone.
    name, classify = zero_shot
    want = expected(name)
    batch, labels = images(name)[:3], want["labels"][1:]
    got = classify(batch, candidate_labels=labels, hypothesis_template=want["template"])
    assert len(got) == 3
    assert_ranked(got, want["templated"][:3])
    streamed = classify(iter(batch), candidate_labels=labels, hypothesis_template=want["template"])
    assert not isinstance(streamed, list)
    assert_ranked(list(streamed), want["templated"][:3])
    # Labels once per image (a list of lists), and positionally.
    per_image = classify(batch[:2], [labels, labels[:3]], hypothesis_template=want["template"])
    assert [len(r) for r in per_image] == [4, 3]
    assert_ranked(per_image[:1], want["templated"][:1])


def test_zero_shot_bad_options(zero_shot):
    name, classify = zero_shot
    image = images(name)[0]
    for labels in ([], [[]], [1, 2], None):
        with pytest.raises(InputError, match="candidate_labels"):
            classify(image, candidate_labels=labels)
    with pytest.raises(InputError, match="candidate_labels has 2 entries"):
        classify([image] * 3, candidate_labels=[["cat"], ["dog"]])
    with pytest.raises(InputError, match=r"give an image \(a path.*got int"):
        classify(3, candidate_labels=["cat"])


@pytest.fixture(scope="module")
def dinov2(tmp_path_factory):
    """vit-features' export as a DINOv2 user gets it: model_type dinov2 and no pooler_output
    (Optimum's DINOv2 export has last_hidden_state only)."""
    import json

    import onnx

    folder = tmp_path_factory.mktemp("dinov2")
    source = REPOS / "vit-features"
    config = json.loads((source / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "dinov2"}))
    (folder / "preprocessor_config.json").write_bytes(
        (source / "preprocessor_config.json").read_bytes()
    )
    proto = onnx.load(str(source / "model.onnx"))
    kept = [o for o in proto.graph.output if o.name != "pooler_output"]
    del proto.graph.output[:]
    proto.graph.output.extend(kept)
    onnx.save(proto, str(folder / "model.onnx"))
    return folder


def test_dinov2_pools_its_cls_token(dinov2):
    # Dinov2Model's pooler_output is last_hidden_state[:, 0] (its layer-normed CLS token), so
    # transformers' pool=True answer is the recorded hidden states' first token.
    want = expected("vit-features")["hidden"]
    extract = transmuter.pipeline("image-feature-extraction", dinov2)
    assert extract.model.model.outputs == ["last_hidden_state"]
    batch = images("vit-features")
    pooled = extract(batch, pool=True)
    for got, wanted in zip(pooled, want, strict=True):
        assert np.shape(got) == (1, 32)
        np.testing.assert_allclose(got, np.asarray(wanted)[:, 0], atol=1e-4)
    one = transmuter.pipeline("image-feature-extraction", dinov2, pool=True)(batch[1])
    np.testing.assert_allclose(one, np.asarray(want[1])[:, 0], atol=1e-4)


def test_pooling_that_cannot_be_derived_is_refused(dinov2, tmp_path):
    # ViT pools with a dense layer and tanh: without pooler_output there is no pooled vector.
    for name in ("model.onnx", "preprocessor_config.json"):
        (tmp_path / name).write_bytes((dinov2 / name).read_bytes())
    (tmp_path / "config.json").write_bytes((REPOS / "vit-features" / "config.json").read_bytes())
    extract = transmuter.pipeline("image-feature-extraction", tmp_path)
    with pytest.raises(InputError, match="'vit' model pools with weights of its own"):
        extract(images("vit-features")[0], pool=True)
    with pytest.raises(InputError, match="pool=True takes"):
        transmuter.pipeline("image-feature-extraction", tmp_path, pool=True)


def test_odd_images(features, segment, depth):
    rgb = images("vit-features")[0]
    want = features(rgb)
    # RGBA (Pillow or array) is converted to RGB, as transformers' processors convert it.
    rgba = np.concatenate([rgb, np.full(rgb.shape[:2] + (1,), 255, np.uint8)], -1)
    np.testing.assert_allclose(features(rgba), want, atol=1e-6)
    np.testing.assert_allclose(features(Image.fromarray(rgba, "RGBA")), want, atol=1e-6)
    gray = rgb[..., :1]
    np.testing.assert_allclose(
        features(gray), features(Image.fromarray(rgb[..., 0]).convert("RGB")), atol=1e-6
    )
    # A 1 x 1 image resizes like any other.
    tiny = np.full((1, 1, 3), 128, np.uint8)
    assert np.shape(features(tiny)) == np.shape(want)
    assert segment(tiny)[0]["mask"].size == (1, 1)
    assert depth(tiny)["predicted_depth"].shape == (1, 1)
    with pytest.raises(InputError, match=r"height, width, channels.*array\[\.\.\., None\]"):
        features(rgb[..., 0])
    with pytest.raises(InputError, match="holds numbers"):
        features(np.full((4, 4, 3), "x"))
    with pytest.raises(InputError, match="an image is a path"):
        features([{"image": rgb}])


def test_generators_answer_as_lists(segment, depth, features):
    batch = images("segformer")[:2]
    streamed = segment(iter(batch))
    assert not isinstance(streamed, list)
    got, want = list(streamed), segment(batch)
    assert [[r["label"] for r in row] for row in got] == [[r["label"] for r in row] for row in want]
    picture = images("depth-anything")[0]
    (one,) = list(depth(iter([picture])))
    np.testing.assert_allclose(one["predicted_depth"], depth(picture)["predicted_depth"], atol=1e-6)
    with pytest.raises(InputError, match="threshold must be a number"):
        segment(batch[0], threshold="x")
    with pytest.raises(
        InputError,
        match=r"has no option \['unknown'\]; it takes \['image_processor_kwargs', 'pool'",
    ):
        features(batch[0], pool=True, unknown=1)
