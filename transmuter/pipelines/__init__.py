"""Pipelines: whole Hugging Face repositories as tasks, on top of Transmuter's public API.

`load_repo(source)` reads a repository's configs, tokenizer and ONNX files; `pipeline(task,
repo_or_source, **options)` returns a callable for the task (registry.py's TASKS lists
them).
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import transmuter
from transmuter.errors import InputError
from transmuter.pipelines.registry import TASKS, entry
from transmuter.pipelines.repo import Repo, load_repo

__all__ = ["TASKS", "Repo", "load_repo", "pipeline"]


def pipeline(
    task: str,
    repo: Repo | str | os.PathLike,
    *,
    dtype: str | None = None,
    mesh: Any = None,
    model_axis: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    **options,
):
    """A callable for `task` on `repo` (a `Repo`, a local folder or `hf://org/repo[@revision]`;
    `dtype` picks transformers.js weight files, see `load_repo`). `mesh` and `model_axis`
    place the models' params on a `jax.sharding.Mesh`, split over that axis (`Repo.shard`).
    `cache_dir` persists the programs the task compiles on disk, so that a later process skips
    XLA (JAX's persistent compilation cache: a process-wide setting, as `compile`'s).
    The options are the task's (see its class in TASKS)."""
    if cache_dir is not None:
        transmuter.use_persistent_cache(cache_dir)
    if model_axis is not None and mesh is None:
        raise InputError(f"model_axis={model_axis!r} names an axis of a mesh: give mesh= too")
    if task.startswith("translation_"):
        # transformers' translation_xx_to_yy names: the translation task, told its languages.
        task, options = "translation", {**options, "task": task}
    factory = entry(task).factory()
    if not isinstance(repo, Repo):
        # A task whose repos have another layout (diffusers' subfolders) reads them itself.
        repo = getattr(factory, "load_repo", load_repo)(repo, dtype=dtype)
    elif dtype is not None:
        raise InputError("dtype chooses files when loading: give a source, not a loaded Repo")
    if mesh is not None:
        repo.shard(mesh, model_axis)
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
