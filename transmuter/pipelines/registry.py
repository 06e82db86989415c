"""The tasks: one table, read by `pipeline()`, the command line's help and `transmuter serve`.

Each task names the module and class that implement it and says in a line what it does; the
module is imported when the task is first asked for, so that `import transmuter.pipelines`
reads no task code (and a task's extra dependencies load only with it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from transmuter.errors import InputError


@dataclass(frozen=True)
class TaskEntry:
    """A task: `module:attribute` of its factory (a class taking `(repo, **options)`) and a
    one-line summary."""

    target: str
    summary: str

    def factory(self) -> Any:
        module, attribute = self.target.split(":")
        return getattr(importlib.import_module(f"transmuter.pipelines.{module}"), attribute)


TASKS: dict[str, TaskEntry] = {
    "feature-extraction": TaskEntry(
        "text.encoders:FeatureExtraction", "text -> embeddings, per token or pooled"
    ),
    "text-classification": TaskEntry(
        "text.encoders:TextClassification", "text or text pairs -> labels and scores"
    ),
    "token-classification": TaskEntry(
        "text.encoders:TokenClassification", "text -> a label per token"
    ),
    "fill-mask": TaskEntry("text.fill_mask:FillMask", "text with masks -> the likeliest tokens"),
    "question-answering": TaskEntry(
        "text.question_answering:QuestionAnswering", "question and context -> answer spans"
    ),
    "zero-shot-classification": TaskEntry(
        "text.zero_shot_classification:ZeroShotClassification",
        "text and candidate labels -> scores (an NLI model)",
    ),
    "text-generation": TaskEntry(
        "text.text_generation:TextGeneration", "a prompt -> its continuation (decoders)"
    ),
    "text2text-generation": TaskEntry(
        "text.text2text_generation:Text2TextGeneration", "text -> text (encoder-decoders)"
    ),
    "summarization": TaskEntry("text.text2text_generation:Summarization", "text -> a summary"),
    "translation": TaskEntry(
        "text.text2text_generation:Translation", "text -> its translation (translation_xx_to_yy)"
    ),
    "automatic-speech-recognition": TaskEntry(
        "audio.speech_recognition:AutomaticSpeechRecognition",
        "speech -> text (Whisper; wav2vec2-style CTC)",
    ),
    "audio-classification": TaskEntry(
        "audio.audio_classification:AudioClassification", "audio -> labels and scores"
    ),
    "text-to-speech": TaskEntry("audio.text_to_speech:TextToSpeech", "text -> speech (Kokoro)"),
    "text-to-audio": TaskEntry("audio.text_to_speech:TextToSpeech", "text -> speech (Kokoro)"),
    "image-classification": TaskEntry(
        "vision.image_classification:ImageClassification", "image -> labels and scores"
    ),
    "image-feature-extraction": TaskEntry(
        "vision.image_features:ImageFeatureExtraction", "image -> embeddings"
    ),
    "zero-shot-image-classification": TaskEntry(
        "vision.zero_shot_image:ZeroShotImageClassification",
        "image and candidate labels -> scores (CLIP, SigLIP)",
    ),
    "object-detection": TaskEntry(
        "vision.detection:ObjectDetection", "image -> boxes, labels, scores"
    ),
    "zero-shot-object-detection": TaskEntry(
        "vision.zero_shot_detection:ZeroShotObjectDetection",
        "image and candidate labels -> boxes (OWL-ViT, OWLv2, Grounding DINO)",
    ),
    "image-segmentation": TaskEntry(
        "vision.segmentation:ImageSegmentation", "image -> masks with labels"
    ),
    "depth-estimation": TaskEntry("vision.depth:DepthEstimation", "image -> a depth map"),
    "mask-generation": TaskEntry(
        "vision.mask_generation:MaskGeneration", "image and prompts -> masks (SAM)"
    ),
    "image-to-text": TaskEntry(
        "vision.image_to_text:image_to_text", "image -> a caption (ViT-GPT2, TrOCR, Florence-2)"
    ),
    "image-text-to-text": TaskEntry(
        "vision.florence2:Florence2", "image and a task prompt -> text, boxes (Florence-2)"
    ),
    "text-to-image": TaskEntry(
        "diffusion.text_to_image:TextToImage", "a prompt -> an image (Stable Diffusion)"
    ),
}


def entry(task: str) -> TaskEntry:
    """The entry of `task`, or an InputError listing the tasks."""
    if task not in TASKS:
        raise InputError(f"unknown task {task!r}; the tasks are {', '.join(TASKS)}")
    return TASKS[task]
