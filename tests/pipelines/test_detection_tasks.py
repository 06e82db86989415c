"""object-detection and zero-shot-object-detection against transformers' pipelines
(make_detection.py's tiny DETR, YOLOS, RT-DETR, OWL-ViT and OWLv2, on detection_images.py's
seeded images of four sizes and aspect ratios)."""

from __future__ import annotations

import shutil
import sys

import numpy as np
import pytest
from conftest import REPOS, expected
from frontend.test_hub import hub  # noqa: F401  (the loopback Hub fixture)

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.vision.processors import padded_size

sys.path.insert(0, str(REPOS.parent))
from detection_images import images  # noqa: E402  (the images the fixture was recorded on)

pytest.importorskip("PIL.Image")


def assert_same(got: list, want: list) -> None:
    """transformers' detections: labels in order, scores within 1e-4, int boxes equal."""
    assert [d["label"] for d in got] == [d["label"] for d in want]
    np.testing.assert_allclose([d["score"] for d in got], [d["score"] for d in want], atol=1e-4)
    assert [d["box"] for d in got] == [d["box"] for d in want]
    assert all(list(d) == ["score", "label", "box"] for d in got)
    assert all(list(d["box"]) == ["xmin", "ymin", "xmax", "ymax"] for d in got)


def assert_float_boxes(detect, image: np.ndarray, threshold: float, want: list) -> None:
    """The boxes before the pipeline truncates them, within 1e-3 pixels."""
    found = detect.run(detect.pixels(image))
    scores, _, corners = detect.scored(found["logits"], found["pred_boxes"], image.shape[1::-1])
    np.testing.assert_allclose(corners[scores > threshold], np.reshape(want, (-1, 4)), atol=1e-3)


@pytest.fixture(scope="module")
def yolos():
    return transmuter.pipeline("object-detection", REPOS / "yolos")


@pytest.fixture(scope="module")
def owlvit():
    return transmuter.pipeline("zero-shot-object-detection", REPOS / "owlvit")


def test_yolos_sizes_batch_and_nothing_found(yolos):
    want = expected("yolos")
    threshold = want["threshold"]
    got = yolos(images(), threshold=threshold)  # four sizes: four programs
    assert got[1] == []  # nothing above the threshold
    for row, wanted in zip(got, want["results"]):
        assert_same(row, wanted)
    single = yolos(images()[0], threshold=threshold)
    assert_same(single, want["results"][0])
    assert_same(yolos(images()[0]), [])  # transformers' default threshold of 0.5
    # top_k: the best of the same detections, best first (transformers' order is the queries').
    best = sorted(want["results"][3], key=lambda d: -d["score"])[:1]
    assert len(want["results"][3]) == 2
    assert_same(yolos(images()[3], threshold=threshold, top_k=1), best)
    for image, boxes in zip(images(), want["float_boxes"]):
        assert_float_boxes(yolos, image, threshold, boxes)
    assert len(yolos._compiled.signatures) == 4


@pytest.mark.parametrize("name", ["detr", "yolos", "rtdetr", "owlvit", "owlv2"])
def test_processors_are_transformers(name):
    task = "zero-shot-object-detection" if name.startswith("owl") else "object-detection"
    detect = transmuter.pipeline(task, REPOS / name)  # compiles on the first call only
    pixels = detect.pixels(images()[0])
    np.testing.assert_allclose(pixels, np.load(REPOS / name / "pixel_values.npy"), atol=1e-5)


def test_owlvit_labels_top_k_and_requests(owlvit):
    want = expected("owlvit")
    queries, threshold = want["queries"], want["threshold"]
    got = owlvit(images(), candidate_labels=queries, threshold=threshold)  # 4 labels: 1 program
    assert got[1] == []
    for row, wanted in zip(got, want["results"]):
        assert_same(row, wanted)
    case = want["top_k"]
    top = owlvit(  # 3 labels padded to 4: the same program
        images()[0], candidate_labels=",".join(case["queries"]), threshold=0.0, top_k=5
    )
    assert_same(top, case["results"])
    asked = owlvit({"image": images()[2], "candidate_labels": queries}, threshold=threshold)
    assert_same(asked, want["results"][2])
    assert len(owlvit._compiled.signatures) == 1


def test_bad_inputs(yolos, owlvit, tmp_path):
    with pytest.raises(InputError, match="height, width, channels"):
        yolos(np.zeros((32, 32), np.uint8))
    with pytest.raises(InputError, match="non-empty list"):
        yolos([])
    with pytest.raises(InputError, match="needs candidate_labels"):
        owlvit(images()[0])
    with pytest.raises(InputError, match='has "image"'):
        owlvit([{"candidate_labels": ["cat"]}])
    with pytest.raises(InputError, match="pad_to_multiple_of needs an export taking pixel_mask"):
        transmuter.pipeline("object-detection", REPOS / "yolos", pad_to_multiple_of=32)
    with pytest.raises(ModelLoadError, match="object detection supports detr"):
        transmuter.pipeline("object-detection", REPOS / "owlvit")
    with pytest.raises(ModelLoadError, match="zero-shot object detection supports owlvit"):
        transmuter.pipeline("zero-shot-object-detection", REPOS / "yolos")
    with pytest.raises(InputError, match="top_k must be an integer of at least 1"):
        owlvit(images()[0], ["cat"], top_k=0)
    with pytest.raises(InputError, match="top_k must be an integer of at least 1"):
        yolos(images()[0], top_k=0)
    for name in ("config.json", "model.onnx"):
        shutil.copy(REPOS / "yolos" / name, tmp_path / name)
    with pytest.raises(ModelLoadError, match="needs preprocessor_config.json"):
        transmuter.pipeline("object-detection", tmp_path)


def test_older_configs_give_size_as_an_int():
    detect = transmuter.pipeline("object-detection", REPOS / "detr")
    detect.config["size"], detect.config["max_size"] = 64, 96  # as facebook/detr-resnet-50's
    np.testing.assert_allclose(
        detect.pixels(images()[0]), np.load(REPOS / "detr" / "pixel_values.npy"), atol=1e-5
    )
    detect.config["size"] = {"shortest_edge": 64}
    with pytest.raises(ModelLoadError, match="size of .* is not supported"):
        detect.pixels(images()[0])


def test_padded_sizes():
    assert padded_size({}, None, 64, 85) == (64, 85)
    assert padded_size({}, 32, 64, 85) == (64, 96) and padded_size({}, 32, 26, 96) == (32, 96)
    pad_size = {"pad_size": {"height": 96, "width": 96}}  # transformers pads every image to it
    assert padded_size(pad_size, 32, 26, 96) == (96, 96)
    assert padded_size({**pad_size, "do_pad": False}, None, 26, 96) == (26, 96)
    with pytest.raises(InputError, match="larger than the processor's pad_size"):
        padded_size(pad_size, None, 100, 64)


def test_rf_detr_export_is_refused(tmp_path):
    onnx = pytest.importorskip("onnx")
    value = onnx.helper.make_tensor_value_info
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("Identity", ["input"], ["dets"]),
            onnx.helper.make_node("Identity", ["input"], ["labels"]),
        ],
        "rf_detr",
        [value("input", onnx.TensorProto.FLOAT, [1, 3, 4, 4])],
        [value(n, onnx.TensorProto.FLOAT, [1, 3, 4, 4]) for n in ("dets", "labels")],
    )
    onnx.save(onnx.helper.make_model(graph), tmp_path / "model.onnx")
    shutil.copy(REPOS / "detr" / "config.json", tmp_path / "config.json")
    with pytest.raises(ModelLoadError, match="RF-DETR's own export"):
        transmuter.pipeline("object-detection", tmp_path)


def test_a_hub_repo_detects(hub):  # noqa: F811
    files = {p.name: p.read_bytes() for p in (REPOS / "owlvit").iterdir()}
    hub.publish("org/owlvit", {n: b for n, b in files.items() if n.endswith((".json", ".onnx"))})
    want = expected("owlvit")
    detect = transmuter.pipeline(
        "zero-shot-object-detection", "hf://org/owlvit", threshold=want["threshold"]
    )
    assert_same(detect(images()[2], want["queries"]), want["results"][2])


@pytest.mark.slow
def test_detr_exact_and_padded():
    want = expected("detr")
    threshold = want["threshold"]
    detect = transmuter.pipeline("object-detection", REPOS / "detr", threshold=threshold)
    got = detect(images())
    assert got[0] == []
    for row, wanted in zip(got, want["results"]):
        assert_same(row, wanted)
    for image, boxes in zip(images(), want["float_boxes"]):
        assert_float_boxes(detect, image, threshold, boxes)
    padded = want["padded"]
    buckets = transmuter.pipeline(
        "object-detection",
        REPOS / "detr",
        threshold=threshold,
        pad_to_multiple_of=padded["multiple"],
    )
    for row, wanted in zip(buckets(images()), padded["results"]):
        assert_same(row, wanted)
    # Resized to 64 x 85, 96 x 48, 64 x 64 and 26 x 96: padded to 64 x 96, 96 x 64, 64 x 64
    # and 32 x 96.
    assert len(buckets._compiled.signatures) == 4


@pytest.mark.slow
def test_rtdetr_top_k_over_queries_and_classes():
    want = expected("rtdetr")
    detect = transmuter.pipeline("object-detection", REPOS / "rtdetr")
    got = detect(images(), threshold=want["threshold"])
    assert got[0] == []
    for row, wanted in zip(got, want["results"]):
        assert_same(row, wanted)
    for image, boxes in zip(images(), want["float_boxes"]):
        assert_float_boxes(detect, image, want["threshold"], boxes)
    assert len(detect._compiled.signatures) == 1  # every image is resized to 64 x 64


@pytest.mark.slow
def test_owlv2_boxes_relative_to_the_padded_square():
    want = expected("owlv2")
    detect = transmuter.pipeline(
        "zero-shot-object-detection", REPOS / "owlv2", threshold=want["threshold"]
    )
    got = detect(images(), candidate_labels=want["queries"])
    assert got[1] == []
    for row, wanted in zip(got, want["results"]):
        assert_same(row, wanted)
    top = detect(images()[0], want["top_k"]["queries"], threshold=0.0, top_k=5)
    assert_same(top, want["top_k"]["results"])


# --- call forms and their checks (issue 41) ----------------------------------------------------


def only(results: list, labels: list) -> list:
    """transformers' answer for a subset of the labels: it runs each label on its own and
    sorts the detections stably by score, so the subset's answer is the full one filtered."""
    return [d for d in results if d["label"] in labels]


def test_zero_shot_detection_call_forms(owlvit):
    want = expected("owlvit")
    queries, threshold, results = want["queries"], want["threshold"], want["results"]
    pictures = images()
    # A list of images with a list of label lists: transformers zips them, one list per image.
    zipped = owlvit(
        pictures[:3], candidate_labels=[queries, queries[:2], queries[1:]], threshold=threshold
    )
    assert len(zipped) == 3
    for got, wanted, labels in zip(zipped, results, [queries, queries[:2], queries[1:]]):
        assert_same(got, only(wanted, labels))
    # {"image", "candidate_labels"} dicts: one, a list, a generator; a dict's labels win.
    requests = [{"image": p, "candidate_labels": queries} for p in pictures[:2]]
    assert_same(owlvit(requests[0], threshold=threshold), results[0])
    for got, wanted in zip(owlvit(requests, threshold=threshold), results, strict=False):
        assert_same(got, wanted)
    streamed = owlvit(iter(requests), threshold=threshold)
    assert not isinstance(streamed, list)
    for got, wanted in zip(streamed, results[:2], strict=True):
        assert_same(got, wanted)
    # transformers' older keyword.
    assert_same(owlvit(pictures[2], text_queries=queries, threshold=threshold), results[2])


def test_zero_shot_detection_refusals(owlvit):
    image = images()[0]
    with pytest.raises(InputError, match="candidate_labels has 2 entries, one per item"):
        owlvit([image] * 3, candidate_labels=[["cat"], ["dog"]])
    for labels in ([], [[]], [3]):
        with pytest.raises(InputError, match="candidate_labels"):
            owlvit(image, candidate_labels=labels)
    # "" is one empty label to transformers ("".split(",")), its prompt the special tokens.
    assert {d["label"] for d in owlvit(image, candidate_labels="", threshold=0.0)} == {""}
    for bad in ("x", float("nan"), [0.1]):
        with pytest.raises(InputError, match="threshold must be a number"):
            owlvit(image, ["cat"], threshold=bad)
    for bad in (0, -1, 1.5, "3"):
        with pytest.raises(InputError, match="top_k must be an integer of at least 1"):
            owlvit(image, ["cat"], top_k=bad)
    with pytest.raises(InputError, match="candidate_labels given twice"):
        owlvit(image, ["cat"], candidate_labels=["dog"])


def test_detection_bad_options_and_odd_images(yolos):
    image = images()[0]
    with pytest.raises(InputError, match="threshold must be a number"):
        yolos(image, threshold="x")
    with pytest.raises(InputError, match="top_k must be an integer of at least 1"):
        yolos(image, top_k=0)
    with pytest.raises(InputError, match="threshold must be a number"):
        transmuter.pipeline("object-detection", REPOS / "yolos", threshold="high")
    # A 1 x 1 image resizes to the shortest edge (64 x 64) as any other; RGBA is made RGB.
    assert yolos(np.zeros((1, 1, 3), np.uint8), threshold=0.0) is not None
    rgba = np.concatenate([image, np.full(image.shape[:2] + (1,), 255, np.uint8)], -1)
    assert yolos(rgba, threshold=0.0) == yolos(image, threshold=0.0)
    with pytest.raises(InputError, match="under YOLOS's 16 pixels a side"):
        yolos(np.zeros((1, 400, 3), np.uint8))


def test_owlv2_resize_is_scipys():
    # Owlv2ImageProcessor resizes with scipy.ndimage (a Gaussian, then a linear zoom, both
    # mirrored); processors.py does it in numpy so that no extra needs scipy. Wide, tall,
    # tiny and upsampled images against scipy itself where it is installed.
    ndimage = pytest.importorskip("scipy.ndimage")
    from transmuter.pipelines.vision.processors import CLIP_MEAN, CLIP_STD, owl_pixels

    def scipys(image, side):
        pixels = (image.astype(np.float64) / 255).astype(np.float32)
        square = max(pixels.shape[:2])
        pad = ((0, square - pixels.shape[0]), (0, square - pixels.shape[1]), (0, 0))
        pixels = np.pad(pixels, pad)
        factors = np.divide(pixels.shape, (side, side, 3))
        filtered = ndimage.gaussian_filter(pixels, np.maximum(0, (factors - 1) / 2), mode="mirror")
        zoomed = ndimage.zoom(filtered, 1 / factors, order=1, mode="mirror", grid_mode=True)
        zoomed = np.clip(zoomed, pixels.min(), pixels.max())
        normal = (zoomed - np.float32(CLIP_MEAN)) / np.float32(CLIP_STD)
        return normal.transpose(2, 0, 1)

    rng = np.random.default_rng(3)
    config = {"image_mean": CLIP_MEAN, "image_std": CLIP_STD}
    for height, width, side in [(24, 90, 32), (200, 37, 32), (1, 1, 32), (7, 5, 48), (60, 300, 96)]:
        image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        got = owl_pixels(image, "owlv2", {**config, "size": {"height": side, "width": side}})
        np.testing.assert_allclose(got, scipys(image, side), atol=1e-5)


def test_vision_tasks_import_no_scipy():
    # The image extra declares Pillow only: no vision module may import scipy.
    import ast
    from pathlib import Path

    import transmuter.pipelines.vision as vision

    for path in Path(vision.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not any(n.split(".")[0] == "scipy" for n in names), path.name


def test_object_detection_takes_images_keyword(yolos):
    # transformers' ObjectDetectionPipeline takes the images as images= (was Python's
    # TypeError here: a missing positional argument).
    image = images()[0]
    assert yolos(images=[image], threshold=0.0) == [yolos(image, threshold=0.0)]
    assert yolos(images=image, threshold=0.0) == yolos(image, threshold=0.0)
    with pytest.raises(InputError, match="given twice"):
        yolos(image, images=image)
    with pytest.raises(InputError, match="give an image"):
        yolos(threshold=0.0)


def test_comma_separated_labels_keep_their_spaces(owlvit):
    # transformers' zero-shot-object-detection splits a label string at commas and strips
    # nothing: "a cat, couch" is "a cat" and " couch" (zero-shot classification strips).
    image = images()[0]
    found = owlvit(image, candidate_labels="a cat, couch", threshold=0.0)
    assert {d["label"] for d in found} == {"a cat", " couch"}
    assert found == owlvit(image, candidate_labels=["a cat", " couch"], threshold=0.0)
