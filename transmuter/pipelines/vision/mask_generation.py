"""The mask-generation task with SAM (and SlimSAM) exported in transformers.js's two parts:
onnx/vision_encoder.onnx (pixel_values -> image_embeddings [, image_positional_embeddings]) and
onnx/prompt_encoder_mask_decoder.onnx (image_embeddings [, image_positional_embeddings],
input_points, input_labels [, input_boxes] -> iou_scores, pred_masks).

Two uses, as transformers offers them. With prompts (points with labels, boxes) it is
SamProcessor + SamModel + post_process_masks: {"masks": bool [prompts, masks, height, width],
"iou_scores": [prompts, masks]} per image. Without, it is transformers' mask-generation
pipeline: a grid of single-point prompts, the masks filtered by predicted IoU and stability,
then box non-maximum suppression: {"masks": [bool [height, width]], "scores": [float]}, with
`output_rle_mask` also "rle_mask" (each mask's COCO run lengths: {"size": [height, width],
"counts"} over the pixels in column-major order, starting with a run of zeros) and with
`output_bboxes_mask` "bounding_boxes" (int64 [masks, 4]: x0, y0, x1, y1 of each mask's
pixels, inclusive; zeros for an empty mask).

The image is resized so that its longer side is the processor's `longest_edge`, normalized and
padded bottom-right to `pad_size`: every image is one encoder shape. Its embeddings are kept for
the last few images, so new prompts on an image run only the decoder. The decoder's number of
prompts per call is bucketed to a power of two (padded with copies of the last prompt: SAM
decodes each prompt on its own); the number of points per prompt is not, as padding points
changes SAM's masks, so each point count compiles its own program.

Exports fix what the decoder takes: Optimum's and Xenova's take points only and always return
the three multimask masks; an export with input_boxes needs a box with every prompt (a box
alone is a prompt of zero points), as SamModel's prompt encoder adds its padding point only
when no box is given.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.base import positive_int
from transmuter.pipelines.base import threshold as threshold_option
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.vision.image_tasks import ImageTask
from transmuter.pipelines.vision.processors import (
    interpolation,
    load_image,
    sam_pixels,
    sam_resized_size,
)

CACHED_IMAGES = 4  # images whose embeddings are kept for later prompts
DECODER_INPUTS = (
    "image_embeddings",
    "image_positional_embeddings",
    "input_points",
    "input_labels",
    "input_boxes",
)
# transformers' mask-generation pipeline's options and their defaults.
GENERATION = {
    "points_per_batch": 64,
    "points_per_crop": 32,
    "crops_n_layers": 0,
    "pred_iou_thresh": 0.88,
    "stability_score_thresh": 0.95,
    "stability_score_offset": 1.0,
    "crops_nms_thresh": 0.7,
    "mask_threshold": 0.0,
    "output_rle_mask": False,
    "output_bboxes_mask": False,
}


class MaskGeneration(ImageTask):
    """Segment images (paths, Pillow images or numpy arrays; one, a list or a generator) with
    SAM.

    With `input_points` ([image][prompt][point] = [x, y] in the image's pixels, or
    [image][point] for one prompt), `input_labels` (the same nesting without [x, y]: 1 for a
    point on the object, 0 for one off it; all 1 by default) and/or `input_boxes`
    ([image][prompt] = [x0, y0, x1, y1]), the masks of each prompt. Without prompts, automatic
    mask generation with the options of transformers' pipeline (GENERATION; `crops_n_layers`
    must be 0, as crops are not supported). `multimask_output` says whether the export returns
    SAM's three masks per prompt (True) or its single one (False); None takes what it returns.
    Every option may also be given per call; the prompts are nested per image of the call (a
    generator's images take none)."""

    def __init__(
        self,
        repo: Repo,
        *,
        multimask_output: bool | None = None,
        **options: Any,
    ):
        self.repo = repo
        self.options = _generation_options(GENERATION, options)
        self.multimask_output = multimask_output
        self.encoder = repo.model("vision_encoder")
        self.decoder = repo.model("prompt_encoder_mask_decoder")
        if (
            self.encoder.inputs != ["pixel_values"]
            or "image_embeddings" not in self.encoder.outputs
        ):
            raise ModelLoadError(
                f"{repo.source}: SAM's vision encoder maps pixel_values to image_embeddings; "
                f"it takes {self.encoder.inputs} and returns {self.encoder.outputs}"
            )
        wrong = [name for name in self.decoder.inputs if name not in DECODER_INPUTS]
        needed = ["image_embeddings", "input_points", "input_labels"]
        if wrong or any(name not in self.decoder.inputs for name in needed):
            raise ModelLoadError(
                f"{repo.source}: SAM's prompt decoder takes {', '.join(DECODER_INPUTS)} (the "
                f"positional embeddings and boxes optional); it takes {self.decoder.inputs}"
            )
        self.positional = "image_positional_embeddings" in self.decoder.inputs
        if self.positional and "image_positional_embeddings" not in self.encoder.outputs:
            raise ModelLoadError(
                f"{repo.source}: the prompt decoder takes image_positional_embeddings, which "
                f"the vision encoder does not return ({self.encoder.outputs})"
            )
        self.boxes = "input_boxes" in self.decoder.inputs
        self.processor = _processor(repo)
        self._embeddings: OrderedDict[bytes, dict[str, np.ndarray]] = OrderedDict()
        self._encode = None
        self._decode = None

    def run_items(
        self,
        items: list,
        *,
        input_points: Any = None,
        input_labels: Any = None,
        input_boxes: Any = None,
        multimask_output: bool | None = None,
        **options: Any,
    ) -> list:
        images = [load_image(image) for image in items]
        settings = _generation_options(self.options, options)
        if multimask_output is None:
            multimask_output = self.multimask_output
        if input_points is None and input_boxes is None:
            if input_labels is not None:
                raise InputError("input_labels label input_points; give the points too")
            results = [self._generate(image, settings) for image in images]
        else:
            prompts = _prompts(len(images), input_points, input_labels, input_boxes)
            results = [
                self._segment(image, *prompt, multimask_output, settings["mask_threshold"])
                for image, prompt in zip(images, prompts)
            ]
        return results

    # --- prompted segmentation -------------------------------------------------------------

    def _segment(
        self,
        image: Any,
        points: np.ndarray | None,
        labels: np.ndarray | None,
        boxes: np.ndarray | None,
        multimask_output: bool | None,
        mask_threshold: float,
    ) -> dict[str, Any]:
        """SamModel's masks and IoU scores for one image's prompts, post-processed as
        SamProcessor.post_process_masks does."""
        if boxes is not None and not self.boxes:
            raise InputError(
                f"{self.repo.source}: this export's prompt decoder takes no input_boxes "
                f"(it takes {self.decoder.inputs}); give points"
            )
        if boxes is None and self.boxes:
            raise InputError(
                f"{self.repo.source}: this export's prompt decoder needs input_boxes with "
                "every prompt (the points, if any, go with the box)"
            )
        count = len(boxes) if points is None else len(points)
        if points is None:
            points, labels = np.zeros((count, 0, 2)), np.zeros((count, 0), np.int64)
        if boxes is not None and len(boxes) != count:
            raise InputError(
                f"give as many input_boxes as point prompts per image; got {len(boxes)} and {count}"
            )
        size, resized, embeddings = self._image(image)
        scale = np.array([resized[1] / size[1], resized[0] / size[0]])
        points = (points * scale).astype(np.float32)
        if boxes is not None:
            boxes = (boxes * np.tile(scale, 2)).astype(np.float32)
        scores, low = self._masks(embeddings, points, labels, boxes, multimask_output)
        masks = np.asarray(self._upscale(low, size, resized) > mask_threshold)
        return {"masks": masks, "iou_scores": scores}

    # --- automatic mask generation ---------------------------------------------------------

    def _generate(self, image: Any, settings: dict[str, Any]) -> dict[str, Any]:
        """transformers' mask-generation pipeline on one image, without crops: a grid of
        one-point prompts, each prompt's masks kept where the predicted IoU and the stability
        pass their thresholds, then non-maximum suppression of the masks' boxes."""
        if settings["crops_n_layers"] != 0:
            raise InputError(
                f"crops_n_layers={settings['crops_n_layers']} is not supported (crops of the "
                "image); use 0"
            )
        size, resized, embeddings = self._image(image)
        points = _grid_points(settings["points_per_crop"], size, resized)
        masks, scores, boxes = [], [], []
        for start in range(0, len(points), settings["points_per_batch"]):
            batch = points[start : start + settings["points_per_batch"], None, :]
            iou, low = self._masks(
                embeddings, batch, np.ones(batch.shape[:2], np.int64), None, None
            )
            logits = self._upscale(low, size, resized).reshape(-1, *size)
            kept, kept_scores = _filter(logits, iou.reshape(-1), settings)
            masks.extend(kept)
            scores.append(kept_scores)
            boxes.append(_mask_boxes(kept))
        scores, boxes = np.concatenate(scores), np.concatenate(boxes)
        order = _nms(boxes, scores, settings["crops_nms_thresh"])
        result = {"masks": [masks[i] for i in order], "scores": [float(scores[i]) for i in order]}
        if settings["output_rle_mask"]:
            result["rle_mask"] = [_rle(masks[i]) for i in order]
        if settings["output_bboxes_mask"]:
            result["bounding_boxes"] = boxes[order].reshape(-1, 4)
        return result

    # --- the models ------------------------------------------------------------------------

    def _image(self, image: Any) -> tuple[tuple[int, int], tuple[int, int], dict]:
        """The image's (height, width), its resized (height, width) and its embeddings, which
        are computed once for the last CACHED_IMAGES images."""
        size = (image.height, image.width)
        resized = sam_resized_size(size, self.processor["longest_edge"])
        key = hashlib.sha1(image.tobytes() + repr(size).encode()).digest()
        if key in self._embeddings:
            self._embeddings.move_to_end(key)
            return size, resized, self._embeddings[key]
        pixels = sam_pixels(image, resized, self.processor)
        feeds = {"pixel_values": pixels[None]}
        if self._encode is None:
            self._encode = transmuter.compile(self.encoder, feeds, cache_size=1)
        outputs = self._encode(feeds)
        names = ["image_embeddings"] + ["image_positional_embeddings"] * self.positional
        embeddings = {name: outputs[name] for name in names}
        self._embeddings[key] = embeddings
        if len(self._embeddings) > CACHED_IMAGES:
            self._embeddings.popitem(last=False)
        return size, resized, embeddings

    def _masks(
        self,
        embeddings: dict,
        points: np.ndarray,
        labels: np.ndarray,
        boxes: np.ndarray | None,
        multimask_output: bool | None,
    ) -> tuple[np.ndarray, Any]:
        """The decoder's IoU scores [prompts, masks] and low-resolution masks [prompts, masks,
        h, w] for prompts of the same point count, run at a power-of-two prompt count."""
        count = len(points)
        bucket = 1 << (count - 1).bit_length()
        filler = np.repeat(np.arange(count)[-1:], bucket - count)
        rows = np.concatenate([np.arange(count), filler])
        feeds = dict(embeddings)
        feeds["input_points"] = points[rows][None].astype(np.float32)
        feeds["input_labels"] = labels[rows][None].astype(np.int64)
        if boxes is not None:
            feeds["input_boxes"] = boxes[rows][None].astype(np.float32)
        if self._decode is None:
            self._decode = transmuter.compile(self.decoder, feeds)
        outputs = self._decode(feeds)
        scores = np.asarray(outputs["iou_scores"], np.float32)[0, :count]
        masks = outputs["pred_masks"][0, :count]
        returned = masks.shape[1] > 1
        if multimask_output is not None and multimask_output != returned:
            raise InputError(
                f"{self.repo.source}: this export returns {masks.shape[1]} mask(s) per prompt "
                f"(multimask_output={returned}); SAM's exports fix it, so it cannot be "
                f"{multimask_output}"
            )
        return scores, masks

    def _upscale(self, masks: Any, size: tuple[int, int], resized: tuple[int, int]) -> Any:
        """post_process_masks's float masks: the low-resolution masks resized (bilinear) to the
        padded input, cropped to the resized image, resized to the original size. All three
        steps are linear, so they are one matrix per axis."""
        pad = self.processor["pad_size"]
        low = masks.shape[-2:]
        rows = (
            interpolation(resized[0], size[0], "bilinear")
            @ interpolation(low[0], pad[0], "bilinear")[: resized[0]]
        )
        cols = (
            interpolation(resized[1], size[1], "bilinear")
            @ interpolation(low[1], pad[1], "bilinear")[: resized[1]]
        )
        rows, cols = jnp.asarray(rows, jnp.float32), jnp.asarray(cols, jnp.float32)
        return jnp.einsum("Hh,...hw,Ww->...HW", rows, jnp.asarray(masks, jnp.float32), cols)


def _processor(repo: Repo) -> dict[str, Any]:
    """SamProcessor's settings from preprocessor_config.json: the longest edge, the padded
    size (height, width) and the image processor's rescale and normalize settings."""
    config = repo.preprocessor_config
    size = config.get("size") or {"longest_edge": 1024}
    longest = size.get("longest_edge", size.get("height"))
    pad = config.get("pad_size") or {"height": 1024, "width": 1024}
    if not isinstance(longest, int) or not config.get("do_pad", True):
        raise ModelLoadError(
            f"{repo.source}: preprocessor_config.json: SAM resizes to a longest edge and pads "
            f"(size {size}, do_pad {config.get('do_pad', True)})"
        )
    if longest > min(pad["height"], pad["width"]):
        raise ModelLoadError(
            f"{repo.source}: preprocessor_config.json pads to {pad}, smaller than the longest "
            f"edge {longest}"
        )
    return {
        "longest_edge": longest,
        "pad_size": (int(pad["height"]), int(pad["width"])),
        "do_resize": config.get("do_resize", True),
        "resample": config.get("resample", 2),
        "do_rescale": config.get("do_rescale", True),
        "rescale_factor": config.get("rescale_factor", 1 / 255),
        "do_normalize": config.get("do_normalize", True),
        "image_mean": config.get("image_mean", [0.485, 0.456, 0.406]),
        "image_std": config.get("image_std", [0.229, 0.224, 0.225]),
    }


def _prompts(
    count: int, points: Any, labels: Any, boxes: Any
) -> list[tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]]:
    """Each image's (points [prompts, points, 2], labels [prompts, points], boxes [prompts,
    4]) from SamProcessor's nesting, None where not given."""
    per_image = []
    for name, value in (("input_points", points), ("input_labels", labels), ("input_boxes", boxes)):
        if value is not None and (not isinstance(value, Sequence) or len(value) != count):
            raise InputError(
                f"{name} has one entry per image ({count}); got "
                f"{len(value) if isinstance(value, Sequence) else type(value).__name__}"
            )
        per_image.append([None] * count if value is None else list(value))
    if points is None and labels is not None:
        raise InputError("input_labels label input_points; give the points too")
    prompts = []
    for image_points, image_labels, image_boxes in zip(*per_image):
        prompts.append(_image_prompts(image_points, image_labels, image_boxes))
    return prompts


def _image_prompts(points: Any, labels: Any, boxes: Any):
    if points is not None:
        points = _array(points, "input_points", np.float64)
        if points.ndim == 2:
            points = points[None]
        if points.ndim != 3 or points.shape[-1] != 2 or points.shape[1] == 0:
            raise InputError(
                "input_points holds, per image, [prompts][points][x, y] (or [points][x, y] for "
                f"one prompt), every prompt with the same number of points; got {list(points.shape)}"
            )
        if labels is None:
            labels = np.ones(points.shape[:2], np.int64)
        labels = _array(labels, "input_labels", np.int64)
        if labels.ndim == 1:
            labels = labels[None]
        if labels.shape != points.shape[:2]:
            raise InputError(
                f"input_labels needs one label per point, {list(points.shape[:2])}; got "
                f"{list(labels.shape)}"
            )
    if boxes is not None:
        boxes = _array(boxes, "input_boxes", np.float64)
        if boxes.ndim != 2 or boxes.shape[-1] != 4:
            raise InputError(
                f"input_boxes holds, per image, [boxes][x0, y0, x1, y1]; got {list(boxes.shape)}"
            )
    return points, labels, boxes


def _array(value: Any, name: str, dtype: type) -> np.ndarray:
    try:
        return np.asarray(value, dtype)
    except (TypeError, ValueError):
        raise InputError(
            f"{name}: every prompt of an image needs the same number of points (numbers in "
            "nested lists)"
        ) from None


def _grid_points(per_side: int, size: tuple[int, int], resized: tuple[int, int]) -> np.ndarray:
    """float32 [per_side ** 2, 2]: the mask-generation pipeline's grid, cell centres row by row,
    in the resized image's pixels (computed in float32, as the pipeline does)."""
    if per_side < 1:
        raise InputError(f"points_per_crop must be at least 1; got {per_side}")
    offset = 1 / (2 * per_side)
    side = np.linspace(offset, 1 - offset, per_side, dtype=np.float32)
    grid = np.stack(np.meshgrid(side, side), axis=-1).reshape(-1, 2)
    points = grid * np.array([size[1], size[0]], np.float32)
    return points * np.array([resized[1] / size[1], resized[0] / size[0]], np.float32)


def _filter(logits: Any, scores: np.ndarray, settings: dict[str, Any]):
    """filter_masks: the masks (bool [height, width]) and scores whose predicted IoU and
    stability (the area above threshold + offset over the area above threshold - offset) pass
    their thresholds. Crops are not supported, so no mask is dropped for touching a crop's
    edge."""
    threshold, offset = settings["mask_threshold"], settings["stability_score_offset"]
    keep = np.ones(len(scores), bool)
    if settings["pred_iou_thresh"] > 0:
        keep &= scores > settings["pred_iou_thresh"]
    if settings["stability_score_thresh"] > 0:
        inside = np.asarray(jnp.sum(logits > threshold + offset, axis=(1, 2)))
        outside = np.asarray(jnp.sum(logits > threshold - offset, axis=(1, 2)))
        with np.errstate(invalid="ignore", divide="ignore"):
            stability = inside / outside
        keep &= stability > settings["stability_score_thresh"]
    index = np.flatnonzero(keep)
    masks = np.asarray(logits[index] > threshold) if len(index) else []
    return list(masks), scores[index]


def _rle(mask: np.ndarray) -> dict[str, Any]:
    """A mask's uncompressed COCO run-length encoding, as the mask-generation pipeline gives
    it: run lengths over the pixels in column-major order, the first a run of zeros (0 where
    the first pixel is in the mask)."""
    height, width = mask.shape
    flat = np.asarray(mask, bool).T.ravel()
    edges = np.concatenate([[0], np.flatnonzero(flat[1:] != flat[:-1]) + 1, [flat.size]])
    counts = np.diff(edges).tolist()
    return {"size": [height, width], "counts": [0] * bool(flat[0]) + counts}


def _mask_boxes(masks: list[np.ndarray]) -> np.ndarray:
    """[masks, 4] (x0, y0, x1, y1) of each mask's pixels, inclusive; zeros for an empty mask."""
    boxes = np.zeros((len(masks), 4), np.int64)
    for i, mask in enumerate(masks):
        rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
        if len(rows):
            boxes[i] = cols[0], rows[0], cols[-1], rows[-1]
    return boxes


def _nms(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> list[int]:
    """torchvision's non-maximum suppression: the best score first, then each box whose IoU
    with every kept box is at most `threshold` (an empty box's NaN IoU suppresses nothing)."""
    boxes = boxes.astype(np.float32)
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    kept: list[int] = []
    for i in np.argsort(-scores, kind="stable"):
        if kept:
            low = np.maximum(boxes[kept, :2], boxes[i, :2])
            high = np.minimum(boxes[kept, 2:], boxes[i, 2:])
            inter = np.clip(high - low, 0, None).prod(axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                iou = inter / (area[kept] + area[i] - inter)
            if (iou > threshold).any():
                continue
        kept.append(int(i))
    return kept


def _generation_options(defaults: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(given) - set(GENERATION))
    if unknown:
        raise InputError(
            f"mask-generation has no option {unknown}; it takes multimask_output, "
            f"{', '.join(GENERATION)}"
        )
    settings = {**defaults, **given}
    for name, value in settings.items():
        if name in ("points_per_batch", "points_per_crop"):
            settings[name] = positive_int(value, name)
        elif name in ("output_rle_mask", "output_bboxes_mask"):
            if not isinstance(value, (bool, np.bool_)):
                raise InputError(f"{name} must be True or False; got {value!r}")
            settings[name] = bool(value)
        elif name == "crops_n_layers":
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise InputError(f"crops_n_layers must be an integer; got {value!r}")
        else:
            settings[name] = threshold_option(value, name)
    return settings
