"""Pipelines: whole Hugging Face repositories as tasks, on top of Transmuter's public API.

`load_repo(source)` reads a repository's configs, tokenizer and ONNX files; `pipeline(task,
repo_or_source, **options)` returns a callable for the task (TASKS lists them).
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from transmuter.errors import InputError
from transmuter.pipelines.audio_classification import AudioClassification
from transmuter.pipelines.encoders import FeatureExtraction, TextClassification, TokenClassification
from transmuter.pipelines.image_to_text import ImageToText
from transmuter.pipelines.images import ImageClassification
from transmuter.pipelines.repo import Repo, load_repo
from transmuter.pipelines.speech_recognition import AutomaticSpeechRecognition
from transmuter.pipelines.text2text_generation import Text2TextGeneration
from transmuter.pipelines.text_generation import TextGeneration

TASKS = {
    "feature-extraction": FeatureExtraction,
    "text-classification": TextClassification,
    "token-classification": TokenClassification,
    "text-generation": TextGeneration,
    "text2text-generation": Text2TextGeneration,
    "automatic-speech-recognition": AutomaticSpeechRecognition,
    "image-classification": ImageClassification,
    "audio-classification": AudioClassification,
    "image-to-text": ImageToText,
}

__all__ = ["TASKS", "Repo", "load_repo", "pipeline"]


def pipeline(task: str, repo: Repo | str | os.PathLike, *, dtype: str | None = None, **options):
    """A callable for `task` on `repo` (a `Repo`, a local folder or `hf://org/repo[@revision]`;
    `dtype` picks transformers.js weight files, see `load_repo`). The options are the task's
    (see its class in TASKS)."""
    if task not in TASKS:
        raise InputError(f"unknown task {task!r}; the tasks are {', '.join(TASKS)}")
    if not isinstance(repo, Repo):
        repo = load_repo(repo, dtype=dtype)
    elif dtype is not None:
        raise InputError("dtype chooses files when loading: give a source, not a loaded Repo")
    factory = TASKS[task]
    accepted = _options(factory)
    unknown = sorted(set(options) - set(accepted)) if accepted is not None else []
    if unknown:
        raise InputError(f"{task} has no option {unknown}; it takes {sorted(accepted)}")
    return factory(repo, **options)


def _options(factory: Any) -> list[str] | None:
    """The keyword options a task takes; None where it checks them itself (**options)."""
    parameters = list(inspect.signature(factory).parameters.values())[1:]
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters]
