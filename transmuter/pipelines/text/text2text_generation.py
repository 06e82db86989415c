"""The text2text-generation task (T5, BART): texts in, [{"generated_text": ...}] out, as
transformers' pipeline returns them; the options and their checks are text-generation's,
decoding in seq2seq.py. summarization and translation (`translation_xx_to_yy` too) are the
same with the task's prefix from config.json's task_specific_params ("summarize: ",
"translate English to German: ", as T5's configs give them), answering [{"summary_text"}] and
[{"translation_text"}] as transformers 4's pipelines did (transformers 5 removed them)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.generation.decoder import Settings
from transmuter.pipelines.generation.seq2seq import seq2seq_decoder
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.text.text_generation import GENERATION_DEFAULTS, TextGeneration


class Text2TextGeneration(TextGeneration):
    """Generate from texts with an encoder-decoder export. Options as text-generation's
    (max_new_tokens, min_new_tokens, do_sample, temperature, top_k, top_p,
    repetition_penalty, eos_token_id, stop, on_token; per call key), without
    return_full_text. generation_config.json's decoder_start_token_id starts each output, and
    its forced_bos_token_id, forced_eos_token_id, suppress_tokens and begin_suppress_tokens
    apply as in transformers. `decoding` ("past" or "padded", seq2seq.py) trades the first
    generation's compiles (a program per token with "past") against each step's work."""

    task = "text2text-generation"
    output_key = "generated_text"

    def __init__(self, repo: Repo, *, decoding: str = "past", **options: Any):
        self.repo = repo
        self.tokenizer = repo.require_tokenizer(self.task)
        self.decoder = seq2seq_decoder(repo, self.task, decoding)
        self.prefix, task_defaults = task_parameters(repo, self.task)
        self._set_defaults(options, **task_defaults)

    def __call__(self, inputs: str | Sequence[str], *, key: Any = None, **options: Any) -> Any:
        if isinstance(inputs, str):
            return self([inputs], key=key, **options)
        if (
            not isinstance(inputs, Sequence)
            or not inputs
            or not all(isinstance(p, str) for p in inputs)
        ):
            raise InputError(f"give a text or a non-empty list of them; got {inputs!r}")
        encoded = [self.tokenizer.encode(self.prefix + t).ids for t in inputs]
        rows = self.generate(encoded, key=key, **options)
        return [{self.output_key: self._text(row)} for row in rows]

    def generate(self, inputs: Sequence[Sequence[int]], *, key: Any = None, **options: Any):
        """The new token ids for each input (lists of token ids), up to and including its end
        of sequence token."""
        given, key = self._given(options, key)
        max_new = int(given["max_new_tokens"])
        prompt = start_tokens(self.repo)
        self._check_length(len(prompt) + max_new)
        settings = seq2seq_settings(self.repo, self._settings(given), len(prompt))
        encoder_inputs = self.decoder.text_inputs([list(r) for r in inputs], self._pad_id(settings))
        return self._streamed(
            len(inputs),
            given,
            lambda on_token: self.decoder.generate(
                encoder_inputs,
                prompt,
                max_new_tokens=max_new,
                settings=settings,
                key=key,
                on_token=on_token,
            ),
        )

    @property
    def programs(self) -> int:
        return self.decoder.programs

    def _check_length(self, length: int) -> None:
        """Decoder positions past the model's table would be clamped inside the program."""
        limit = self.decoder.positions
        if limit is not None and length > limit:
            raise InputError(
                f"the decoder prompt and max_new_tokens need {length} positions; the model has "
                f"{limit}"
            )


class Summarization(Text2TextGeneration):
    """text2text-generation with task_specific_params["summarization"]'s prefix, answering
    [{"summary_text": ...}]."""

    task = "summarization"
    output_key = "summary_text"


class Translation(Text2TextGeneration):
    """text2text-generation with the prefix of `task` in task_specific_params, answering
    [{"translation_text": ...}]. `task` is "translation_xx_to_yy" (what `pipeline` passes for
    that task name), or "translation": the first translation task the config lists, as
    transformers picks it."""

    output_key = "translation_text"

    def __init__(
        self, repo: Repo, *, task: str = "translation", decoding: str = "past", **options: Any
    ):
        self.task = translation_task(repo, task)
        super().__init__(repo, decoding=decoding, **options)


def translation_task(repo: Repo, task: str) -> str:
    """The translation task whose parameters apply: `task` checked, "translation" resolved to
    the first translation_xx_to_yy in task_specific_params (itself where there is none)."""
    parts = task.split("_") if isinstance(task, str) else []
    if task != "translation" and not (
        len(parts) == 4 and parts[0] == "translation" and parts[2] == "to"
    ):
        raise InputError(
            f"a translation task is 'translation' or 'translation_xx_to_yy'; got {task!r}"
        )
    listed = [
        k for k in repo.config.get("task_specific_params") or {} if k.startswith("translation")
    ]
    if task == "translation":
        return listed[0] if listed else task
    if listed and task not in listed:
        raise InputError(
            f"{repo.source} translates as {', '.join(listed)} (config.json's "
            f"task_specific_params); it has no {task}"
        )
    return task


def task_parameters(repo: Repo, task: str) -> tuple[str, dict[str, Any]]:
    """`task`'s prefix and option defaults from config.json's task_specific_params (the
    prefix: config.json's "prefix" where the task has none, as transformers takes it). Its
    settings that are text-generation options become their defaults; the others (beam
    search's num_beams, length_penalty, ...) are not applied, and a warning names them."""
    params = dict((repo.config.get("task_specific_params") or {}).get(task) or {})
    prefix = params.pop("prefix", repo.config.get("prefix")) or ""
    if not isinstance(prefix, str):
        raise ModelLoadError(f"{repo.source}: the {task} prefix must be a string; got {prefix!r}")
    defaults = {k: v for k, v in params.items() if k in GENERATION_DEFAULTS}
    ignored = sorted(set(params) - set(defaults))
    if ignored:
        warnings.warn(
            f"{repo.source}: {task}'s task_specific_params {ignored} are not applied (Transmuter "
            "decodes greedily or by sampling); pass max_new_tokens and the other "
            "text-generation options to choose the decoding",
            stacklevel=3,
        )
    return prefix, defaults


def start_tokens(repo: Repo) -> list[int]:
    """The decoder's first token: decoder_start_token_id (generation_config.json's, then
    config.json's)."""
    for source in (repo.generation_config, repo.config):
        start = source.get("decoder_start_token_id")
        if isinstance(start, int):
            return [start]
    raise InputError(f"{repo.source}: no decoder_start_token_id in generation_config.json")


def seq2seq_settings(repo: Repo, settings: Settings, prompt_length: int) -> Settings:
    """generation_config.json's forced and suppressed tokens added to `settings`, as
    transformers' logits processors apply them (a forced first token only after a prompt of
    one token)."""

    def ids(name):
        value = repo.generation_config.get(name, repo.config.get(name))
        return () if value is None else (value,) if isinstance(value, int) else tuple(value)

    bos = ids("forced_bos_token_id")
    return replace(
        settings,
        forced_bos=bos[0] if bos and prompt_length == 1 else None,
        forced_eos=ids("forced_eos_token_id"),
        suppress=ids("suppress_tokens"),
        begin_suppress=ids("begin_suppress_tokens"),
    )
