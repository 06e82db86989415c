"""examples/object_detection.py: the hand-set detector finds its squares, breaks at
NonMaxSuppression, and agrees with ONNX Runtime."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from opcheck import ort_run

import transmuter

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "object_detection.py"


@pytest.fixture(scope="module")
def detection():
    spec = importlib.util.spec_from_file_location("object_detection", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def by_position(boxes: np.ndarray) -> np.ndarray:
    """Rows sorted by (y1, x1) to the pixel: NMS orders equal scores by their rounding, in which
    runtimes differ."""
    key = np.round(boxes)
    return boxes[np.lexsort((key[:, 1], key[:, 0]))]


def test_detector_finds_each_square_and_matches_onnx_runtime(detection):
    proto = detection.build()
    model = transmuter.load(proto)
    images = [detection.synthetic_image(s, seed) for seed, s in enumerate(detection.SCENES)]
    detect = transmuter.compile(model, {"image": images[0]}, eager_threshold=8)
    for squares, image in zip(detection.SCENES, images):
        out = detect({"image": image})
        boxes = by_position(np.asarray(out["boxes"]))
        expected = by_position(np.array([(y, x, y + 16, x + 16) for y, x in squares], np.float32))
        np.testing.assert_allclose(boxes, expected, atol=1e-4)
        reference_boxes, reference_scores = ort_run(proto, {"image": image})
        np.testing.assert_allclose(boxes, by_position(reference_boxes), atol=1e-4)
        np.testing.assert_allclose(
            np.sort(np.asarray(out["scores"])), np.sort(reference_scores), rtol=1e-5
        )
    (start, stop, compiled), (after, end, _) = detect.segments
    assert (start, compiled, after, end) == (0, True, stop + 1, "end")
    assert model.ir.graph.nodes[stop].op_type == "NonMaxSuppression"


def test_main_prints_boxes_and_the_segment_plan(detection, capsys):
    detection.main([])
    printed = capsys.readouterr().out
    assert "3 squares: 3 boxes kept" in printed and "5 squares: 5 boxes kept" in printed
    assert "box ( 10.0,   6.0) - ( 26.0,  22.0)" in printed
    assert "then a break at NonMaxSuppression" in printed
