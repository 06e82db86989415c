"""The image-to-text task with VisionEncoderDecoder exports (ViT-GPT2 captioners, TrOCR):
images in, [{"generated_text": ...}] out per image, as transformers' image-to-text pipeline
returns them. The image processor is processors.py's; decoding is seq2seq.py's, the encoder taking
pixel_values (every image resized to the processor's one size, so the batch dim is the only one
that varies). Florence-2 repositories (config.json's model_type florence2) caption with
florence2.py's model and its "<CAPTION>" task, the same output."""

from __future__ import annotations

from typing import Any

import numpy as np

from transmuter.errors import ModelLoadError
from transmuter.pipelines.base import Task
from transmuter.pipelines.generation.seq2seq import seq2seq_decoder
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.text.text2text_generation import (
    GREEDY_DEFAULTS,
    Text2TextGeneration,
    grouped,
    start_tokens,
)
from transmuter.pipelines.vision.florence2 import Florence2Captioner, call_options
from transmuter.pipelines.vision.image_tasks import ImageTask
from transmuter.pipelines.vision.processors import preprocess


def image_to_text(repo: Repo, **options: Any) -> Any:
    """The image-to-text task on `repo`: Florence-2 captions through its own model (a prompt,
    image features merged into the encoder's input: image-text-to-text's, with the "<CAPTION>"
    task); VisionEncoderDecoder exports through `ImageToText`."""
    if repo.config.get("model_type") == "florence2":
        return Florence2Captioner(repo, **options)
    return ImageToText(repo, **options)


class ImageToText(Text2TextGeneration, ImageTask):
    """Caption images (paths, Pillow images or numpy arrays; one, a list or a generator): a
    list of {"generated_text"} per image, one unless num_return_sequences asks for more. The
    options are text2text-generation's, per call also inside `generate_kwargs` (a dict), and
    `batch_size` as transformers' pipelines take it (checked; each image's caption does not
    depend on it). Greedy unless generation_config.json or the call gives num_beams > 1 (beam
    search), as transformers' image-to-text pipeline, which adds no default of its own."""

    task = "image-to-text"
    own_defaults = GREEDY_DEFAULTS

    def __init__(self, repo: Repo, *, decoding: str = "past", **options: Any):
        self.repo = repo
        self.tokenizer = repo.require_tokenizer(self.task)
        self.decoder = seq2seq_decoder(repo, self.task, decoding)
        if self.decoder.encoder.inputs != ["pixel_values"]:
            raise ModelLoadError(
                f"{repo.source}: image-to-text feeds pixel_values to the encoder; it takes "
                f"{self.decoder.encoder.inputs}"
            )
        if self.decoder.positions is None:
            # VisionEncoderDecoder keeps the decoder's position table in its own config.
            decoder = repo.config.get("decoder") or {}
            limit = decoder.get("max_position_embeddings", decoder.get("n_positions"))
            self.decoder.positions = limit if isinstance(limit, int) else None
        self.images = repo.preprocessor_config
        self._set_defaults(options)

    # The item and the call are the image task's (ImageTask's), not text2text-generation's.
    def is_item(self, value: Any) -> bool:
        return ImageTask.is_item(self, value)

    def describe_items(self) -> str:
        return ImageTask.describe_items(self)

    def __call__(self, inputs: Any, **options: Any) -> Any:
        return Task.__call__(self, inputs, **call_options(options))

    def run_items(self, items: list, *, key: Any = None, **options: Any) -> list:
        pixels = np.stack([preprocess(image, self.images) for image in items])
        rows = self.generate(pixels, key=key, **options)
        return grouped([{"generated_text": self._text(row)} for row in rows], len(items))

    def generate(self, pixels: np.ndarray, *, key: Any = None, **options: Any):
        """The new token ids of each image's caption, from pixel values [batch, 3, h, w]."""
        encoder_inputs = {"pixel_values": pixels.astype(np.float32)}
        return self.decode(encoder_inputs, start_tokens(self.repo), len(pixels), options, key)
