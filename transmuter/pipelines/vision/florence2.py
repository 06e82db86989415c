"""The image-text-to-text task with Florence-2, in onnx-community's four-part layout:
onnx/vision_encoder.onnx (pixel_values -> image_features), onnx/embed_tokens.onnx (input_ids ->
inputs_embeds), onnx/encoder_model.onnx (inputs_embeds, attention_mask -> last_hidden_state) and
onnx/decoder_model_merged.onnx (inputs_embeds, the encoder's states and mask, the past ->
logits, present.*).

As transformers' Florence2Processor and Florence2ForConditionalGeneration do it: a task token
("<CAPTION>", "<OD>", "<OCR_WITH_REGION>", "<CAPTION_TO_PHRASE_GROUNDING>" + a phrase, ...)
becomes its natural-language prompt, tokenized between <s> and </s>; the image's features go
in front of the prompt's embeddings (transformers scatters them over as many <image> tokens
placed there), and the encoder reads both. Decoding is seq2seq.py's with past key values, the
decoder fed each token's embedding (embed_tokens inside the step) and generation_config.json's
no_repeat_ngram_size applied on the device. The generated text (special tokens kept) is parsed
as Florence2Processor.post_process_generation parses it: <loc_N> bins (1000 per side) to pixels
of the original image, boxes, OCR quad boxes, polygons, labels.

Compiled programs: the image size is the processor's one size; the prompt is right-padded to a
multiple of TEXT_BUCKET tokens (masked), so prompts of similar lengths share the encoder's
program and the cross-attention's shapes; the batch is not bucketed; decoding compiles a
program per step (seq2seq.py's "past").
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.base import Task, per_item, positive_int
from transmuter.pipelines.generation.seq2seq import Seq2SeqDecoder
from transmuter.pipelines.repo import Repo, read_json
from transmuter.pipelines.text.text2text_generation import (
    GREEDY_DEFAULTS,
    Text2TextGeneration,
    start_tokens,
)
from transmuter.pipelines.vision.image_tasks import ImageTask, call_arguments
from transmuter.pipelines.vision.processors import is_image, load_image, preprocess

TEXT_BUCKET = 16  # prompts pad to a multiple of this many tokens
BINS = 1000  # <loc_0> .. <loc_999> per side of the image

# Florence2Processor's tables: each task's parsing, and the prompts its task tokens stand for.
TASK_PARSING = {
    "<OCR>": "pure_text",
    "<OCR_WITH_REGION>": "ocr",
    "<CAPTION>": "pure_text",
    "<DETAILED_CAPTION>": "pure_text",
    "<MORE_DETAILED_CAPTION>": "pure_text",
    "<OD>": "description_with_bboxes",
    "<DENSE_REGION_CAPTION>": "description_with_bboxes",
    "<CAPTION_TO_PHRASE_GROUNDING>": "phrase_grounding",
    "<REFERRING_EXPRESSION_SEGMENTATION>": "polygons",
    "<REGION_TO_SEGMENTATION>": "polygons",
    "<OPEN_VOCABULARY_DETECTION>": "description_with_bboxes_or_polygons",
    "<REGION_TO_CATEGORY>": "pure_text",
    "<REGION_TO_DESCRIPTION>": "pure_text",
    "<REGION_TO_OCR>": "pure_text",
    "<REGION_PROPOSAL>": "bboxes",
}
PROMPTS = {
    "<OCR>": "What is the text in the image?",
    "<OCR_WITH_REGION>": "What is the text in the image, with regions?",
    "<CAPTION>": "What does the image describe?",
    "<DETAILED_CAPTION>": "Describe in detail what is shown in the image.",
    "<MORE_DETAILED_CAPTION>": "Describe with a paragraph what is shown in the image.",
    "<OD>": "Locate the objects with category name in the image.",
    "<DENSE_REGION_CAPTION>": "Locate the objects in the image, with their descriptions.",
    "<REGION_PROPOSAL>": "Locate the region proposals in the image.",
}
PROMPTS_WITH_INPUT = {
    "<CAPTION_TO_PHRASE_GROUNDING>": "Locate the phrases in the caption: {input}",
    "<REFERRING_EXPRESSION_SEGMENTATION>": "Locate {input} in the image with mask",
    "<REGION_TO_SEGMENTATION>": "What is the polygon mask of region {input}",
    "<OPEN_VOCABULARY_DETECTION>": "Locate {input} in the image.",
    "<REGION_TO_CATEGORY>": "What is the region {input}?",
    "<REGION_TO_DESCRIPTION>": "What does the region {input} describe?",
    "<REGION_TO_OCR>": "What text is in the region {input}?",
}


class Florence2Decoder(Seq2SeqDecoder):
    """Seq2SeqDecoder whose encoder input is the image's features followed by the prompt's
    embeddings."""

    def __init__(self, repo: Repo, task: str):
        super().__init__(repo, task)
        self.vision = repo.model("vision_encoder")
        if self.vision.inputs != ["pixel_values"] or "image_features" not in self.vision.outputs:
            raise ModelLoadError(
                f"{self.vision.source}: Florence-2's vision encoder takes pixel_values and "
                f"returns image_features; it takes {self.vision.inputs} and returns "
                f"{self.vision.outputs}"
            )
        if set(self.encoder.inputs) != {"inputs_embeds", "attention_mask"}:
            raise ModelLoadError(
                f"{self.encoder.source}: Florence-2's encoder takes inputs_embeds and "
                f"attention_mask; it takes {self.encoder.inputs}"
            )
        if self.embed is None:
            raise ModelLoadError(
                f"{self.step.source}: Florence-2's decoder takes inputs_embeds; it takes "
                f"{self.step.inputs}"
            )

    def encoder_params(self) -> Any:
        return self.vision.params, self.embed.params, self.encoder.params

    def encode(self, params, encoder_inputs):
        vision_params, embed_params, encoder_params = params
        image = transmuter.run(
            self.vision, {"pixel_values": encoder_inputs["pixel_values"]}, params=vision_params
        )["image_features"]
        text = transmuter.run(
            self.embed, {"input_ids": encoder_inputs["input_ids"]}, params=embed_params
        )["inputs_embeds"]
        prompt_mask = encoder_inputs["attention_mask"]
        embeds = jnp.concatenate([image.astype(text.dtype), text], axis=1)
        mask = jnp.concatenate([jnp.ones(image.shape[:2], prompt_mask.dtype), prompt_mask], axis=1)
        inputs = {"inputs_embeds": embeds, "attention_mask": mask}
        hidden = transmuter.run(self.encoder, inputs, params=encoder_params)
        return hidden["last_hidden_state"], mask


class Florence2(Text2TextGeneration, ImageTask):
    """Run Florence-2 tasks on images (paths, Pillow images or numpy arrays; one, a list or a
    generator): `pipeline(images, text="<OD>")`, `text` a task token (with its input after it,
    for the tasks that take one: "<CAPTION_TO_PHRASE_GROUNDING>a red car"), any other prompt,
    or a list of them, one per image; or {"image", "text"} dicts (`images=` as transformers'
    keyword). Returns, per image, what
    Florence2Processor.post_process_generation returns for the generated text: {task: answer},
    the answer a string (captions, OCR, region tasks), {"bboxes", "labels"} (<OD>, dense region
    captions, region proposals, phrase grounding), {"quad_boxes", "labels"} (<OCR_WITH_REGION>),
    {"polygons", "labels"} (segmentation) or {"bboxes", "bboxes_labels", "polygons",
    "polygons_labels"} (open-vocabulary detection); coordinates in pixels of the original
    image, as integers. The task key is the task token, or the whole text for a free prompt.

    Options are text2text-generation's, less num_return_sequences (one parsed answer per
    image); no_repeat_ngram_size, num_beams and early_stopping default to
    generation_config.json's, as transformers' generate() takes them: Florence-2's asks for
    beam search with 3 beams. num_beams=1 decodes greedily (or samples, with do_sample=True).
    """

    task = "image-text-to-text"
    own_defaults = {k: v for k, v in GREEDY_DEFAULTS.items() if k != "num_return_sequences"}

    def __init__(self, repo: Repo, **options: Any):
        self.repo = repo
        self.tokenizer = repo.require_tokenizer(self.task)
        if repo.config.get("model_type") != "florence2":
            raise ModelLoadError(
                f"{repo.source}: image-text-to-text runs Florence-2 (config.json's model_type "
                f"florence2); this is {repo.config.get('model_type')!r}"
            )
        self.decoder = Florence2Decoder(repo, self.task)
        text_config = repo.config.get("text_config") or {}
        limit = text_config.get("max_position_embeddings")
        self.decoder.positions = limit if isinstance(limit, int) else None
        self.images = repo.preprocessor_config
        if not self.images.get("size"):
            raise ModelLoadError(f"{repo.source}: preprocessor_config.json gives no image size")
        # Florence2Processor puts image_seq_length image tokens before every prompt: the
        # count the vision tower gives at the size a square image is processed to. A
        # processor that keeps the aspect ratio (a shortest_edge without a center crop) gives a
        # wide image another size, whose features the tower cannot place (its 2-D position
        # table is as wide as a square's) and whose count no longer matches the tokens.
        self.pixel_size = preprocess(np.zeros((8, 8, 3), np.uint8), self.images).shape[1:]
        tokens = repo.tokenizer_config
        self.bos, self.eos = _token(tokens, "bos_token"), _token(tokens, "eos_token")
        if self.bos is None or self.eos is None:
            raise ModelLoadError(
                f"{repo.source}: tokenizer_config.json names no bos_token and eos_token, which "
                "Florence-2's prompts are wrapped in"
            )
        self.parsing = read_json(repo, "processor_config.json").get("post_processor_config")
        ngrams = repo.generation_config.get(
            "no_repeat_ngram_size", text_config.get("no_repeat_ngram_size")
        )
        self._set_defaults(options, no_repeat_ngram_size=ngrams or 0)

    # The item and the call are the image task's, not text2text-generation's.
    def is_item(self, value: Any) -> bool:
        return is_image(value) or isinstance(value, Mapping)

    def describe_items(self) -> str:
        return ImageTask.describe_items(self)

    def __call__(self, inputs: Any = None, *args: Any, **options: Any) -> Any:
        inputs, options = call_arguments(self, inputs, args, options, "text", {"images": "inputs"})
        return Task.__call__(self, inputs, **call_options(options))

    def run_items(self, items: list, *, text: Any = None, key: Any = None, **options) -> list:
        shared = None if text is None else per_item(text, items, "text", _is_text)
        images, texts = [], []
        for index, item in enumerate(items):
            given = shared[index] if shared is not None else None
            if isinstance(item, Mapping):
                given = item.get("text", given)
                item = item.get("image", item.get("images"))
            images.append(item)
            texts.append(given)
        if not all(isinstance(t, str) for t in texts):
            raise InputError(
                "give text=: a Florence-2 task prompt such as '<CAPTION>' or '<OD>', or a list "
                f'of one per image ({len(items)}), or {{"image", "text"}} dicts; got {text!r}'
            )
        images, pixels = self._pixels(images)
        prompts = [self.prompt_ids(t) for t in texts]
        rows = self.generate(pixels, prompts, key=key, **options)
        start = start_tokens(self.repo)
        return [
            self.parse(self.tokenizer.decode(start + row, skip_special_tokens=False), t, image.size)
            for row, t, image in zip(rows, texts, images)
        ]

    def _pixels(self, images: Sequence[Any]) -> tuple[list[Any], np.ndarray]:
        """The images as Pillow images (their sizes are the boxes' frame) and their pixel
        values [batch, 3, height, width]."""
        images = [load_image(image) for image in images]
        pixels = [preprocess(image, self.images) for image in images]
        for image, values in zip(images, pixels):
            if values.shape[1:] != self.pixel_size:
                height, width = self.pixel_size
                raise InputError(
                    f"an image of {image.width} x {image.height} pixels (width x height) "
                    f"resizes to {values.shape[2]} x {values.shape[1]} under "
                    f"preprocessor_config.json's size {self.images['size']}; Florence-2 reads "
                    f"its image tokens at the size a square image takes, {width} x {height} "
                    "(transformers' model cannot read it either: its vision tower's position "
                    "table is as wide as a square's); give the repo a "
                    'preprocessor_config.json that resizes to one size ({"height", "width"}, '
                    "or a center crop)"
                )
        return images, np.stack(pixels)

    def prompt_ids(self, text: str) -> list[int]:
        """The prompt's token ids, as Florence2Processor makes them (without its image tokens,
        whose places the image features take)."""
        prompt = f"{self.bos}{construct_prompt(text)}{self.eos}"
        return self.tokenizer.encode(prompt, add_special_tokens=False).ids

    def generate(
        self, pixels: np.ndarray, prompts: Sequence[Sequence[int]], *, key: Any = None, **options
    ) -> list[list[int]]:
        """The new token ids for each image (pixel values [batch, 3, h, w]) and prompt (token
        ids), up to and including its end of sequence token."""
        return self.decode(
            lambda settings: {**_padded(prompts, self._pad_id(settings)), "pixel_values": pixels},
            start_tokens(self.repo),
            len(prompts),
            options,
            key,
        )

    def parse(self, text: str, prompt: str, image_size: tuple[int, int]) -> dict[str, Any]:
        """post_process_generation's result for `text` generated for `prompt` on an image of
        `image_size` (width, height)."""
        task = task_token(prompt) or prompt
        kind = TASK_PARSING.get(task, "pure_text")
        if self.parsing is not None and kind not in self.parsing:
            raise ModelLoadError(
                f"{self.repo.source}: processor_config.json's post_processor_config has no "
                f"{kind!r} rules, which {task} is parsed with"
            )
        # onnx-community's repos predate transformers' Florence-2 and carry no parsing rules:
        # those of an empty config (the default OCR pattern, no banned phrases).
        rules = (self.parsing or {}).get(kind) or {}
        return {task: post_process(text, kind, image_size, rules)}


class Florence2Captioner(Florence2):
    """image-to-text on a Florence-2 repository (image_to_text.py hands them here): the
    "<CAPTION>" task, a list of one {"generated_text"} per image as transformers' image-to-text
    pipeline returns captions (decoded without special tokens). Options as
    image-text-to-text's."""

    task = "image-to-text"

    def is_item(self, value: Any) -> bool:
        return is_image(value)

    def __call__(self, inputs: Any, **options: Any) -> Any:
        return Task.__call__(self, inputs, **call_options(options))

    def run_items(self, items: list, *, key: Any = None, **options: Any) -> list:
        _, pixels = self._pixels(items)
        prompts = [self.prompt_ids("<CAPTION>")] * len(pixels)
        rows = self.generate(pixels, prompts, key=key, **options)
        return [[{"generated_text": self._text(row)}] for row in rows]


def call_options(options: dict[str, Any]) -> dict[str, Any]:
    """A generation call's options as transformers' image-to-text pipeline takes them:
    `generate_kwargs` (a dict of generation options) merged in, a key given both ways an
    InputError as transformers raises for max_new_tokens; `batch_size` checked and dropped."""
    options = dict(options)
    if "batch_size" in options:
        positive_int(options.pop("batch_size"), "batch_size")
    extra = options.pop("generate_kwargs", None)
    if extra is None:
        return options
    if not isinstance(extra, Mapping) or not all(isinstance(k, str) for k in extra):
        raise InputError(f"generate_kwargs must be a dict of generation options; got {extra!r}")
    both = sorted(set(options) & set(extra))
    if both:
        raise InputError(f"{both} given both as options and in generate_kwargs: give them once")
    return {**options, **extra}


def task_token(text: str) -> str | None:
    """The task token `text` holds, if any."""
    return next((t for t in [*PROMPTS, *PROMPTS_WITH_INPUT] if t in text), None)


def construct_prompt(text: str) -> str:
    """Florence2Processor's prompt for `text`: a task token alone becomes its prompt, one that
    takes an input gets the rest of the text in it; any other text is the prompt itself."""
    for token, prompt in PROMPTS.items():
        if token in text:
            if text != token:
                raise InputError(f"the task token {token} must be the whole prompt; got {text!r}")
            return prompt
    for token, prompt in PROMPTS_WITH_INPUT.items():
        if token in text:
            return prompt.format(input=text.replace(token, "").strip())
    return text


# --- post_process_generation ---------------------------------------------------------------

_TEXT_BEFORE_BOXES = r"^\s*(.*?)(?=<od>|</od>|<box>|</box>|<bbox>|</bbox>|<loc_)"
_BOX = r"<loc_(\d+)><loc_(\d+)><loc_(\d+)><loc_(\d+)>"
_QUAD = r"(.+?)" + r"<loc_(\d+)>" * 8


def post_process(text: str, kind: str, size: tuple[int, int], rules: Mapping[str, Any]) -> Any:
    """The answer of one parsing `kind` (Florence2Processor's names) for generated `text`."""
    if kind == "pure_text":
        return text.replace("<s>", "").replace("</s>", "").strip()
    text = text.replace("<s>", "").replace("</s>", "").replace("<pad>", "")
    if kind == "ocr":
        found = _quads(text, rules.get("PATTERN") or _QUAD, size, rules.get("AREA_THRESHOLD", 0.0))
        return {"quad_boxes": [q for q, _ in found], "labels": [t for _, t in found]}
    if kind in ("description_with_bboxes", "bboxes", "phrase_grounding"):
        banned = set(rules.get("banned_grounding_tokens", ())) if kind == "phrase_grounding" else ()
        found = _boxes(text, size, allow_empty=kind == "bboxes", banned=banned)
        return {"bboxes": [b for b, _ in found], "labels": [p for _, p in found]}
    if kind in ("polygons", "description_with_polygons"):
        found = _polygons(text, size, allow_empty=kind == "polygons")
        return {"polygons": [p for p, _ in found], "labels": [p for _, p in found]}
    if kind == "description_with_bboxes_or_polygons":
        if "<poly>" in text:
            polygons, boxes = _polygons(text, size, allow_empty=False), []
        else:
            polygons, boxes = [], _boxes(text, size, allow_empty=False, banned=())
        return {
            "bboxes": [b for b, _ in boxes],
            "bboxes_labels": [p for _, p in boxes],
            "polygons": [p for p, _ in polygons],
            "polygons_labels": [p for _, p in polygons],
        }
    raise ModelLoadError(f"unknown Florence-2 parsing {kind!r}")


def dequantize(bins: Sequence[int], size: tuple[int, int]) -> list[int]:
    """Pixel coordinates (x, y pairs) of <loc_N> bins: each bin's center, truncated, in
    float32 as transformers computes it."""
    width, height = size
    scale = np.asarray([width / BINS, height / BINS], np.float32)
    points = np.asarray(bins, np.float32).reshape(-1, 2) + np.float32(0.5)
    return (points * scale).astype(np.int32).reshape(-1).tolist()


def _quads(text: str, pattern: str, size: tuple[int, int], area_threshold: float):
    """(quad box, text) pairs: a text then 8 bins, the quad's corners; those smaller than
    `area_threshold` of the image left out."""
    width, height = size
    found = []
    for content, *bins in re.findall(pattern, text):
        quad = dequantize([int(b) for b in bins], size)
        if area_threshold > 0:
            # transformers' shoelace sum stops before the edge back to the first corner.
            xs, ys = quad[0::2], quad[1::2]
            area = 0.5 * abs(sum(xs[i] * ys[i + 1] - xs[i + 1] * ys[i] for i in range(3)))
            if area < width * height * area_threshold:
                continue
        found.append((quad, content.strip()))
    return found


def _boxes(text: str, size: tuple[int, int], *, allow_empty: bool, banned) -> list:
    """(box, phrase) pairs: each phrase followed by one or more boxes of 4 bins (a phrase may
    be empty where `allow_empty`; phrases in `banned` are left out)."""
    pattern = r"(?:(?:<loc_\d+>){4,})" if allow_empty else r"([^<]+(?:<loc_\d+>){4,})"
    found = []
    for piece in re.findall(pattern, text):
        piece = piece.replace("<ground>", "", 1).replace("<obj>", "", 1)
        if not piece and not allow_empty:
            continue
        match = re.search(_TEXT_BEFORE_BOXES, piece)
        if not match or match.group().strip() in banned:
            continue
        boxes = [[int(b) for b in m.groups()] for m in re.finditer(_BOX, piece)]
        phrase = match.group().strip().encode("ascii", "ignore").decode("ascii")
        found += [(dequantize(box, size), phrase) for box in boxes]
    return found


def _polygons(text: str, size: tuple[int, int], *, allow_empty: bool) -> list:
    """(polygons, phrase) pairs: a phrase followed by polygons of bins, several between <poly>
    and </poly> or one, their parts separated by <sep>; an odd last bin dropped."""
    marks = r"<loc_\d+>|<sep>|<poly>|</poly>"
    pattern = rf"(?:(?:{marks}){{4,}})" if allow_empty else rf"([^<]+(?:{marks}){{4,}})"
    found = []
    for piece in re.findall(pattern, text):
        rest = re.sub(r"^<loc_\d+>", "", piece, count=1)
        if not rest and not allow_empty:
            continue
        match = re.search(r"^\s*(.*?)(?=<od>|</od>|<box>|</box>|<bbox>|</bbox>|<loc_|<poly>)", rest)
        if not match:
            continue
        if "<poly>" in piece and "</poly>" in piece:
            instances = [m.group(1) for m in re.finditer(r"<poly>(.*?)</poly>", piece)]
        else:
            instances = [piece]
        for instance in instances:
            parts = [m.group(1) for m in re.finditer(r"((?:<loc_\d+>)+)(?:<sep>|$)", instance)]
            if not parts:
                continue
            polygons = []
            for part in parts:
                bins = [int(b) for b in re.findall(r"<loc_(\d+)>", part)]
                polygons.append(dequantize(bins[: len(bins) // 2 * 2], size))
            found.append((polygons, match.group().strip()))
    return found


# --- inputs ------------------------------------------------------------------------------


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


def _padded(rows: Sequence[Sequence[int]], pad_id: int) -> dict[str, np.ndarray]:
    """input_ids and attention_mask of the prompts, right-padded to a multiple of
    TEXT_BUCKET (the encoder and the cross-attention mask out the padding)."""
    width = -(-max(map(len, rows)) // TEXT_BUCKET) * TEXT_BUCKET
    ids = np.full((len(rows), width), pad_id, np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for row, tokens in enumerate(rows):
        ids[row, : len(tokens)], mask[row, : len(tokens)] = tokens, 1
    return {"input_ids": ids, "attention_mask": mask}


def _token(config: Mapping[str, Any], name: str) -> str | None:
    """A special token of tokenizer_config.json: a string, or an AddedToken's dict."""
    value = config.get(name)
    return value.get("content") if isinstance(value, dict) else value
