"""Object detection with a NonMaxSuppression graph break, on a detector built in place.

    python examples/object_detection.py                 # synthetic 64x64 images
    python examples/object_detection.py --image a.png   # your image (needs Pillow), resized

The detector finds bright 16x16 squares on a dark background. Its weights are set by hand, so it
needs no download, but it has the shape of a real single-stage detector's ONNX export:
a Conv backbone (grayscale, threshold) -> per-anchor scores (mean brightness over 64 anchors of
16x16 pixels on a stride-8 grid) and box offsets (the brightness centroid, a Conv with a ramp
kernel) -> NonMaxSuppression -> Gather of the kept boxes. How many boxes NMS keeps depends on the
image, so Transmuter breaks the graph there: the part before NMS is one compiled program, NMS runs
on the host, and the part after it runs for the number of boxes kept.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import transmuter

SIZE = 64  # input images are 64x64 RGB
ANCHOR, STRIDE = 16, 8
GRID = SIZE // STRIDE  # 8x8 anchors
BRIGHT = 0.3  # pixels above this count as object
OBJECT = 0.9  # brightness of the synthetic squares
# Squares (top, left) of the two synthetic images: 3 objects, then 5.
SCENES = [[(6, 10), (34, 38), (42, 2)], [(2, 2), (2, 40), (26, 20), (46, 4), (44, 46)]]


def anchors() -> np.ndarray:
    """[1, 64, 4] anchor boxes (y1, x1, y2, x2): the window each score averages over."""
    start = np.arange(GRID) * STRIDE - (ANCHOR - STRIDE) // 2
    y1, x1 = np.meshgrid(start, start, indexing="ij")
    boxes = np.stack([y1, x1, y1 + ANCHOR, x1 + ANCHOR], axis=-1).reshape(1, -1, 4)
    return boxes.astype(np.float32)


def build():
    """The detector graph (opset 17): image [1, 3, 64, 64] -> boxes [kept, 4], scores [kept]."""
    window = dict(strides=[STRIDE, STRIDE], pads=[4, 4, 4, 4])
    ramp = np.arange(ANCHOR, dtype=np.float32) - (ANCHOR - 1) / 2
    kernels = {
        "to_gray": np.full((1, 3, 1, 1), 1 / 3, np.float32),
        "window_sum": np.ones((1, 1, ANCHOR, ANCHOR), np.float32),
        # A 16x16 square overlapping a window on one side has its visible part's centroid half
        # way to its own centre: twice the centroid offset moves the anchor onto the square.
        "ramp_y": np.broadcast_to(2 * ramp[:, None], (ANCHOR, ANCHOR)).reshape(
            1, 1, ANCHOR, ANCHOR
        ),
        "ramp_x": np.broadcast_to(2 * ramp[None, :], (ANCHOR, ANCHOR)).reshape(
            1, 1, ANCHOR, ANCHOR
        ),
    }
    nodes = [
        # Backbone: grayscale, then the part of each pixel above the background.
        helper.make_node("Conv", ["image", "to_gray"], ["gray"]),
        helper.make_node("Sub", ["gray", "bright"], ["lifted"]),
        helper.make_node("Relu", ["lifted"], ["mass"]),
        # Head: per anchor, the fraction of the window covered, and the centroid offsets.
        helper.make_node("Conv", ["mass", "window_sum"], ["total"], **window),
        helper.make_node("Conv", ["mass", "ramp_y"], ["moment_y"], **window),
        helper.make_node("Conv", ["mass", "ramp_x"], ["moment_x"], **window),
        helper.make_node("Div", ["total", "full_window"], ["covered"]),
        helper.make_node("Sub", ["covered", "half"], ["margin"]),
        helper.make_node("Mul", ["margin", "sharpness"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["score_map"]),
        helper.make_node("Reshape", ["score_map", "score_shape"], ["anchor_scores"]),  # [1, 1, 64]
        helper.make_node("Add", ["total", "epsilon"], ["safe_total"]),
        helper.make_node("Div", ["moment_y", "safe_total"], ["dy_map"]),
        helper.make_node("Div", ["moment_x", "safe_total"], ["dx_map"]),
        helper.make_node("Reshape", ["dy_map", "offset_shape"], ["dy"]),  # [1, 64, 1]
        helper.make_node("Reshape", ["dx_map", "offset_shape"], ["dx"]),
        helper.make_node("Concat", ["dy", "dx", "dy", "dx"], ["offsets"], axis=2),
        helper.make_node("Add", ["anchors", "offsets"], ["candidates"]),  # [1, 64, 4]
        # The break: how many boxes survive depends on the image.
        helper.make_node(
            "NonMaxSuppression",
            ["candidates", "anchor_scores", "max_boxes", "iou", "min_score"],
            ["selected"],
            name="nms",
        ),
        helper.make_node("Gather", ["selected", "two"], ["kept_index"], axis=1),
        helper.make_node("Squeeze", ["candidates", "zero"], ["all_boxes"]),
        helper.make_node("Gather", ["all_boxes", "kept_index"], ["kept_boxes"], axis=0),
        helper.make_node("Clip", ["kept_boxes", "origin", "side"], ["boxes"]),
        helper.make_node("Reshape", ["anchor_scores", "flat"], ["all_scores"]),
        helper.make_node("Gather", ["all_scores", "kept_index"], ["scores"], axis=0),
    ]
    constants = {
        **kernels,
        "bright": np.array(BRIGHT, np.float32),
        "full_window": np.array(ANCHOR * ANCHOR * (OBJECT - BRIGHT), np.float32),
        "half": np.array(0.5, np.float32),
        "sharpness": np.array(12.0, np.float32),
        "epsilon": np.array(1e-6, np.float32),
        "score_shape": np.array([1, 1, GRID * GRID], np.int64),
        "offset_shape": np.array([1, GRID * GRID, 1], np.int64),
        "anchors": anchors(),
        "max_boxes": np.array([10], np.int64),
        "iou": np.array([0.3], np.float32),
        "min_score": np.array([0.5], np.float32),
        "two": np.array(2, np.int64),
        "zero": np.array([0], np.int64),
        "origin": np.array(0.0, np.float32),
        "side": np.array(float(SIZE), np.float32),
        "flat": np.array([-1], np.int64),
    }
    graph = helper.make_graph(
        nodes,
        "detector",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
        [
            helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["kept", 4]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["kept"]),
        ],
        [numpy_helper.from_array(np.array(v), k) for k, v in constants.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def synthetic_image(squares: list[tuple[int, int]], seed: int = 0) -> np.ndarray:
    """A dark noisy [1, 3, 64, 64] image with bright 16x16 squares at the given (top, left)."""
    rng = np.random.default_rng(seed)
    image = rng.uniform(0.0, 0.1, (1, 3, SIZE, SIZE)).astype(np.float32)
    for top, left in squares:
        image[:, :, top : top + ANCHOR, left : left + ANCHOR] = OBJECT
    return image


def read_image(path: Path) -> np.ndarray:
    try:
        from PIL import Image
    except ImportError:
        raise SystemExit("--image needs Pillow: pip install pillow") from None
    with Image.open(path) as picture:
        rgb = np.asarray(picture.convert("RGB").resize((SIZE, SIZE)), np.float32) / 255
    return rgb.transpose(2, 0, 1)[None].copy()


def describe(boxes: np.ndarray, scores: np.ndarray) -> list[str]:
    """One line per kept box, as x1, y1, x2, y2 in pixels, most confident first."""
    return [
        f"  box ({x1:5.1f}, {y1:5.1f}) - ({x2:5.1f}, {y2:5.1f})  score {score:.3f}"
        for (y1, x1, y2, x2), score in zip(boxes.tolist(), scores.tolist())
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", type=Path, action="append", help="image file(s); needs Pillow")
    args = parser.parse_args(argv)
    if args.image:
        images = {str(path): read_image(path) for path in args.image}
    else:
        images = {f"{len(s)} squares": synthetic_image(s, seed) for seed, s in enumerate(SCENES)}

    breaks = []
    transmuter.telemetry.attach(
        "object_detection", ["transmuter.break.stop"], lambda e, m, meta: breaks.append(meta)
    )
    try:
        model = transmuter.load(build())
        first = next(iter(images.values()))
        # This detector's segments are a dozen nodes; a real backbone before NMS has hundreds.
        # The default eager_threshold (20) would run segments this short op by op after a break.
        detect = transmuter.compile(model, {"image": first}, eager_threshold=8)
        for name, image in images.items():
            out = detect({"image": image})
            boxes, scores = np.asarray(out["boxes"]), np.asarray(out["scores"])
            print(f"{name}: {len(boxes)} boxes kept")
            print("\n".join(describe(boxes, scores)))
    finally:
        transmuter.telemetry.detach("object_detection")
    nodes = model.ir.graph.nodes
    print("\nsegment plan (start, stop, compiled):", detect.segments)
    for start, stop, compiled in detect.segments:
        last = len(nodes) if stop == "end" else stop
        how = "compiled" if compiled else "run op by op"
        print(
            f"  nodes {start}..{last - 1}: {how}"
            + (f", then a break at {nodes[stop].op_type}" if stop != "end" else "")
        )
    print(
        f"graph breaks run on the host: {len(breaks)} ({', '.join(sorted({b['op_type'] for b in breaks}))})"
    )


if __name__ == "__main__":
    main()
