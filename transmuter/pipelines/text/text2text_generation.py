"""The text2text-generation task (T5, BART): texts in, [{"generated_text": ...}] out, as
transformers' pipeline returns them; the options and their checks are text-generation's,
decoding in seq2seq.py. summarization and translation (`translation_xx_to_yy` too) are the
same with the task's prefix from config.json's task_specific_params ("summarize: ",
"translate English to German: ", as T5's configs give them), answering [{"summary_text"}] and
[{"translation_text"}] as transformers 4's pipelines did (transformers 5 removed them)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.base import positive_int
from transmuter.pipelines.generation.choice import Settings
from transmuter.pipelines.generation.seq2seq import seq2seq_decoder
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.text.text_generation import TextGeneration

# Beam search's options (generation/beams.py) and transformers' GenerationConfig defaults for
# them: one beam, greedy, unless generation_config.json or task_specific_params give num_beams.
GREEDY_DEFAULTS = {
    "num_beams": 1,
    "num_return_sequences": 1,
    "length_penalty": 1.0,
    "early_stopping": False,
}
# transformers' text2text-generation, summarization and translation pipelines' own default:
# 4 beams where generation_config.json sets no num_beams.
BEAM_DEFAULTS = {**GREEDY_DEFAULTS, "num_beams": 4}


class Text2TextGeneration(TextGeneration):
    """Generate from texts with an encoder-decoder export: a text gives [{"generated_text"}],
    a list of texts a list of {"generated_text"} (transformers flattens the lists of one), a
    generator a generator of [{"generated_text"}]. Options as text-generation's
    (max_new_tokens, max_length, min_new_tokens, min_length, do_sample, temperature, top_k,
    top_p, repetition_penalty, no_repeat_ngram_size, eos_token_id, stop, on_token; per call
    key), without return_full_text, and beam search's num_beams, num_return_sequences,
    length_penalty and early_stopping (BEAM_DEFAULTS: 4 beams unless generation_config.json or
    task_specific_params say otherwise, as in transformers' pipeline; num_beams=1 is greedy
    decoding, or sampling with do_sample=True). generation_config.json's
    decoder_start_token_id starts each output, and its forced_bos_token_id,
    forced_eos_token_id, suppress_tokens and begin_suppress_tokens apply as in transformers.
    `decoding` ("past" or "padded", seq2seq.py) trades the first generation's compiles (a
    program per token with "past") against each step's work. num_return_sequences > 1 answers
    each text with that many {"generated_text"}, best first."""

    task = "text2text-generation"
    output_key = "generated_text"
    own_defaults = BEAM_DEFAULTS

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
        if isinstance(inputs, list) and all(len(r) == 1 for r in results):
            return [r[0] for r in results]
        return results

    def describe_items(self) -> str:
        return "give a text, a list of texts or a generator of them"

    def run_items(
        self,
        items: list,
        *,
        key: Any = None,
        batch_size: int | None = None,
        truncation: bool | None = None,
        return_tensors: bool | None = None,
        return_text: bool | None = None,
        clean_up_tokenization_spaces: bool | None = None,
        **options: Any,
    ) -> list:
        """transformers' per-call options beside the generation ones: batch_size (checked;
        answers do not depend on it), truncation (cut each text at the tokenizer's
        model_max_length), return_tensors (each answer's token ids, the decoder's start
        included, under "..._token_ids" instead of its text; return_text changes nothing, as
        in transformers 4) and clean_up_tokenization_spaces (default tokenizer_config.json's)."""
        if not all(isinstance(t, str) for t in items):
            raise InputError(f"{self.describe_items()}; got {items!r}")
        if batch_size is not None:
            positive_int(batch_size, "batch_size")
        for name, value in (
            ("truncation", truncation),
            ("return_tensors", return_tensors),
            ("return_text", return_text),
            ("clean_up_tokenization_spaces", clean_up_tokenization_spaces),
        ):
            if value is not None and not isinstance(value, bool):
                raise InputError(f"{name} must be True or False; got {value!r}")
        encoded = self._encode(items, bool(truncation))
        rows = self.generate(encoded, key=key, **options)
        if return_tensors:
            answers = self._token_ids(rows, len(rows) // len(items))
        else:
            if clean_up_tokenization_spaces is None:
                clean_up_tokenization_spaces = bool(
                    self.repo.tokenizer_config.get("clean_up_tokenization_spaces")
                )
            texts = [self._text(row) for row in rows]
            if clean_up_tokenization_spaces:
                texts = [clean_up_tokenization(t) for t in texts]
            answers = [{self.output_key: t} for t in texts]
        return grouped(answers, len(items))

    def _encode(self, texts: list[str], truncation: bool) -> list[list[int]]:
        """Each text's token ids after the task's prefix; with `truncation` cut at the
        tokenizer's model_max_length (its special tokens kept), else refused past an encoder's
        learned position table (transformers' model fails there with an IndexError)."""
        limit = self.repo.max_length()
        tokenizer = self._truncating if truncation and limit else self.tokenizer
        rows = [e.ids for e in tokenizer.encode_batch([self.prefix + t for t in texts])]
        positions = self.repo.config.get("max_position_embeddings")
        for text, row in zip(texts, rows):
            if isinstance(positions, int) and len(row) > positions:
                raise InputError(
                    f"{text[:40]!r}... has {len(row)} tokens; the encoder has {positions} "
                    f"positions: pass truncation=True to cut it at {limit}"
                )
        return rows

    @functools.cached_property
    def _truncating(self) -> Any:
        """A copy of the tokenizer that cuts at the repo's max_length (made once)."""
        tokenizer = self.repo.require_tokenizer(self.task)
        tokenizer.enable_truncation(self.repo.max_length())
        return tokenizer

    def _token_ids(self, rows: list[list[int]], each: int) -> list[dict[str, list[int]]]:
        """Each answer's ids as transformers' generate() returns them: the decoder's start,
        then the new tokens, the answers of one text padded to their longest."""
        start = start_tokens(self.repo)
        key = self.output_key.replace("_text", "_token_ids")
        pad = self._pad_id(Settings())
        answers = []
        for first in range(0, len(rows), each):
            group = rows[first : first + each]
            width = max(map(len, group))
            for row in group:
                answers.append({key: [*start, *row, *[pad] * (width - len(row))]})
        return answers

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
        settings = beam_settings(given, settings)
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

    def run_items(
        self, items: list, *, src_lang: str | None = None, tgt_lang: str | None = None, **options
    ) -> list:
        """transformers' src_lang and tgt_lang: the languages of this pipeline's task, which a
        tokenizer without language codes (T5's) takes from its prefix; others are refused
        (transformers would translate as the prefix says, whatever they name)."""
        parts = self.task.split("_")
        languages = (parts[1], parts[3]) if len(parts) == 4 else (None, None)
        for name, given, own in zip(("src_lang", "tgt_lang"), (src_lang, tgt_lang), languages):
            if given is not None and given != own:
                raise InputError(
                    f"{name}={given!r}: this pipeline's task is {self.task} (from "
                    "task_specific_params); make a pipeline for the languages wanted"
                )
        return super().run_items(items, **options)


def clean_up_tokenization(text: str) -> str:
    """transformers' clean_up_tokenization_spaces: the spaces a word-level tokenizer leaves
    before punctuation and English contractions removed."""
    for spaced, joined in (
        (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
        (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
    ):  # fmt: skip
        text = text.replace(spaced, joined)
    return text


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


def grouped(answers: list[Any], items: int) -> list[list[Any]]:
    """The answers of `items` inputs, num_return_sequences each in order, as a list per input."""
    each = len(answers) // items
    return [answers[i : i + each] for i in range(0, len(answers), each)]


def start_tokens(repo: Repo) -> list[int]:
    """The decoder's first token: decoder_start_token_id (generation_config.json's, then
    config.json's)."""
    for source in (repo.generation_config, repo.config):
        start = source.get("decoder_start_token_id")
        if isinstance(start, int):
            return [start]
    raise InputError(f"{repo.source}: no decoder_start_token_id in generation_config.json")


def beam_settings(given: Mapping[str, Any], settings: Settings) -> Settings:
    """`settings` with the beam search options in force (checked), as transformers' generate()
    takes them: num_return_sequences up to num_beams, and no sampling, streaming or stop
    strings with beams."""
    beams = positive_int(given["num_beams"], "num_beams")
    count = positive_int(given.get("num_return_sequences", 1), "num_return_sequences")
    if count > beams:
        raise InputError(
            f"num_return_sequences={count} needs at least as many beams; got num_beams={beams}"
        )
    penalty = given["length_penalty"]
    if isinstance(penalty, bool) or not isinstance(penalty, (int, float)):
        raise InputError(f"length_penalty must be a number; got {penalty!r}")
    early = given["early_stopping"]
    if early not in (True, False, "never"):
        raise InputError(f"early_stopping must be True, False or 'never'; got {early!r}")
    if beams > 1:
        beside = [k for k in ("stop", "on_token") if given[k]] + ["do_sample"] * settings.sample
        if beside:
            raise InputError(
                f"num_beams={beams} (beam search) cannot be combined with {beside}: give "
                "num_beams=1 to sample, stream or stop at strings"
            )
    return replace(
        settings,
        num_beams=beams,
        num_return_sequences=count,
        length_penalty=float(penalty),
        early_stopping=early,
    )


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
