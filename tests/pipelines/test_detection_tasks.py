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
