"""The text2text-generation task (T5, BART): texts in, [{"generated_text": ...}] out, as
transformers' pipeline returns them; the options and their checks are text-generation's,
decoding in seq2seq.py. summarization and translation (`translation_xx_to_yy` too) are the
same with the task's prefix from config.json's task_specific_params ("summarize: ",
"translate English to German: ", as T5's configs give them), answering [{"summary_text"}] and
[{"translation_text"}] as transformers 4's pipelines did (transformers 5 removed them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.base import positive_int
from transmuter.pipelines.generation.choice import Settings
from transmuter.pipelines.generation.seq2seq import seq2seq_decoder
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.text.text_generation import TextGeneration


class Text2TextGeneration(TextGeneration):
    """Generate from texts with an encoder-decoder export: a text gives [{"generated_text"}],
    a list of texts a list of {"generated_text"} (transformers flattens the lists of one), a
    generator a generator of [{"generated_text"}]. Options as text-generation's
    (max_new_tokens, max_length, min_new_tokens, min_length, do_sample, temperature, top_k,
    top_p, repetition_penalty, no_repeat_ngram_size, eos_token_id, stop, on_token; per call
    key), without return_full_text. generation_config.json's decoder_start_token_id starts each output, and
    its forced_bos_token_id, forced_eos_token_id, suppress_tokens and begin_suppress_tokens
    apply as in transformers. `decoding` ("past" or "padded", seq2seq.py) trades the first
    generation's compiles (a program per token with "past") against each step's work."""

    task = "text2text-generation"
    output_key = "generated_text"

    def __init__(self, repo: Repo, *, decoding: str = "past", batch_size: int = 8, **options: Any):
        self._load(repo, decoding, batch_size)
        self.prefix = task_prefix(repo, self.task)
        self._set_defaults(options)

    def _load(
        self, repo: Repo, decoding: str, batch_size: int, feeds: list[str] | None = None
    ) -> None:
        """The repo, its tokenizer and `decoding`'s decoder; `feeds`: the encoder's inputs the
        task gives (a ModelLoadError where the encoder takes others)."""
        self.repo = repo
        self.batch_size = positive_int(batch_size, "batch_size")
        self.tokenizer = repo.require_tokenizer(self.task)
        self.decoder = seq2seq_decoder(repo, self.task, decoding)
        if feeds is not None and self.decoder.encoder.inputs != feeds:
            raise ModelLoadError(
                f"{repo.source}: {self.task} feeds {feeds} to the encoder; it takes "
                f"{self.decoder.encoder.inputs}"
            )

    def __call__(self, inputs: Any, **options: Any) -> Any:
        results = super().__call__(inputs, **options)
        # transformers answers a list of texts with each text's one answer, not a list of it.
        return [r[0] for r in results] if isinstance(inputs, list) else results

    def describe_items(self) -> str:
        return "give a text, a list of texts or a generator of them"

    def run_items(self, items: list, *, key: Any = None, **options: Any) -> list:
        if not all(isinstance(t, str) for t in items):
            raise InputError(f"{self.describe_items()}; got {items!r}")
        encoded = [self.tokenizer.encode(self.prefix + t).ids for t in items]
        rows = self.generate(encoded, key=key, **options)
        return [[{self.output_key: self._text(row)}] for row in rows]

    def generate(self, inputs: Sequence[Sequence[int]], *, key: Any = None, **options: Any):
        """The new token ids for each input (lists of token ids), up to and including its end
        of sequence token."""
        if not inputs or any(len(r) == 0 for r in inputs):
            raise InputError("give at least one input of at least one token")
        return self.decode(
            lambda settings: self.decoder.text_inputs(
                [list(r) for r in inputs], self._pad_id(settings)
            ),
            start_tokens(self.repo),
            len(inputs),
            options,
            key,
        )

    def decode(
        self,
        encoder_inputs: Mapping[str, Any] | Any,
        prompt: list[int],
        batch: int,
        options: dict[str, Any],
        key: Any = None,
    ) -> list[list[int]]:
        """What every encoder-decoder task's `generate` shares: the options in force, the
        lengths counted after the decoder's `prompt`, the token choice with
        generation_config.json's forced and suppressed tokens, streaming and stop strings,
        and `self.decoder`'s decoding of `batch` rows from `encoder_inputs` (a mapping, or a
        function of the Settings giving it)."""
        given, key = self._given(options, key)
        max_new, settings = self._lengths(given, len(prompt))
        self._check_length(len(prompt) + max_new)
        settings = seq2seq_settings(self.repo, settings, len(prompt))
        if callable(encoder_inputs):
            encoder_inputs = encoder_inputs(settings)
        return self._streamed(
            batch,
            given,
            lambda on_token: self.decoder.generate(
                encoder_inputs,
                prompt,
                max_new_tokens=max_new,
                settings=settings,
                key=key,
                on_token=on_token,
                no_repeat_ngram_size=int(given["no_repeat_ngram_size"] or 0),
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


def task_prefix(repo: Repo, task: str) -> str:
    """`task`'s prefix: task_specific_params[task]["prefix"], else config.json's "prefix", as
    transformers takes it (the task's other settings are option defaults:
    text_generation.generation_defaults)."""
    params = (repo.config.get("task_specific_params") or {}).get(task) or {}
    prefix = params.get("prefix", repo.config.get("prefix")) or ""
    if not isinstance(prefix, str):
        raise ModelLoadError(f"{repo.source}: the {task} prefix must be a string; got {prefix!r}")
    return prefix


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
