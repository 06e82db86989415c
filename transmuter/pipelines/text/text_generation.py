"""The text-generation task: prompts in, [{"generated_text": ...}] out, as transformers'
pipeline returns them; decoding in generation/decoder.py.

The options' defaults are read where transformers' pipelines read them, in this order (later
wins): GenerationConfig's own defaults, generation_config.json, config.json's
task_specific_params[task] (a pipeline applies its own task's, as transformers' Pipeline does
for every generating task), the pipeline's options, the call's. `max_length` and `min_length`
count the decoder's whole sequence, as in transformers: the prompt for a decoder-only model, the
decoder's start tokens for an encoder-decoder; `max_new_tokens` / `min_new_tokens` win over them
where set. Without any length, a generation makes DEFAULT_NEW_TOKENS tokens.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax

from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.base import Task, positive_int
from transmuter.pipelines.generation.decoder import Decoder, Settings, warn_exact
from transmuter.pipelines.repo import Repo

# A decoder that takes its past, in order of preference: merged (one file serves the prompt and
# the steps), then Optimum's with-past file, then a model.onnx with past inputs.
_DECODER_ROLES = ("decoder_merged", "decoder_with_past", "model")
# transformers' GenerationConfig defaults, for what generation_config.json leaves out (None:
# unset; max_length's 20 applies only where no length is set anywhere: see DEFAULT_NEW_TOKENS).
GENERATION_DEFAULTS = {
    "max_new_tokens": None,
    "max_length": None,
    "min_new_tokens": None,
    "min_length": 0,
    "do_sample": False,
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
}
# The new tokens of a generation when nothing sets a length (transformers' GenerationConfig
# says max_length=20, its pipelines max_new_tokens=256: kept at 20 new tokens here).
DEFAULT_NEW_TOKENS = 20


class TextGeneration(Task):
    """Continue prompts: a prompt gives [{"generated_text"}], a list of prompts a list of them,
    a generator of prompts a generator of them. Options, given here or per call:
    max_new_tokens, max_length, min_new_tokens, min_length, do_sample, temperature, top_k,
    top_p, repetition_penalty, no_repeat_ngram_size, eos_token_id (an id or a list; default
    generation_config.json's), stop (strings that end a row once generated), on_token (called
    as on_token(row, text) with each new piece of text), return_full_text; per call also key
    (a jax.random key; by default each call draws a new one from seed 0). `batch_size`: the
    prompts of a generator decoded together."""

    task = "text-generation"

    def __init__(self, repo: Repo, *, batch_size: int = 8, **options: Any):
        self.repo = repo
        self.batch_size = positive_int(batch_size, "batch_size")
        self.tokenizer = repo.require_tokenizer(self.task)
        role = next((r for r in _DECODER_ROLES if r in repo.onnx), None)
        if role is None:
            raise ModelLoadError(
                f"{repo.source}: text generation needs a decoder with past key values "
                f"(decoder_model_merged.onnx, decoder_with_past_model.onnx or model.onnx); "
                f"found {repo.found}"
            )
        model = repo.model(role)
        self.decoder = Decoder(model, merged="use_cache_branch" in model.inputs)
        if not self.decoder.positions:
            warn_exact(repo.source)
        self._set_defaults(options, return_full_text=True)

    def _set_defaults(self, options: dict[str, Any], **more: Any) -> None:
        """The options' defaults (GenerationConfig's, generation_config.json's, the task's
        task_specific_params), updated with the options given."""
        repo = self.repo
        self.defaults = generation_defaults(repo, self.task)
        self.defaults.update(stop=(), on_token=None, **more)
        self._check(options)
        self.defaults.update(_lengths_given(options))
        # Where no length is set anywhere, the defaults say so as numbers (what continuous
        # batching reads); a max_length or min_length given later still applies (`_given`).
        self._unset = {
            new
            for new, total in (("max_new_tokens", "max_length"), ("min_new_tokens", "min_length"))
            if self.defaults[new] is None and not self.defaults[total]
        }
        if "max_new_tokens" in self._unset:
            self.defaults["max_new_tokens"] = DEFAULT_NEW_TOKENS
        if "min_new_tokens" in self._unset:
            self.defaults["min_new_tokens"] = 0
        self._keys = jax.random.key(0)

    def _check(self, options: dict[str, Any]) -> None:
        unknown = sorted(set(options) - set(self.defaults))
        if unknown:
            raise InputError(
                f"{self.task} has no option {unknown}; it takes {sorted(self.defaults)}"
            )

    @property
    def programs(self) -> int:
        """How many programs decoding has compiled so far."""
        return self.decoder.programs

    def is_item(self, value: Any) -> bool:
        return isinstance(value, str)

    def describe_items(self) -> str:
        return "give a prompt string, a list of them or a generator of them"

    def run_items(self, items: list, *, key: Any = None, **options: Any) -> list:
        if not all(isinstance(p, str) for p in items):
            raise InputError(
                f"{self.describe_items()} (chat messages are not supported); got {items!r}"
            )
        if "stop_sequence" in options:  # transformers' name for stop strings
            if "stop" in options:
                raise InputError("give stop or stop_sequence, not both")
            options["stop"] = options.pop("stop_sequence")
        prompts = [self.tokenizer.encode(p).ids for p in items]
        rows = self.generate(prompts, key=key, **options)
        full = {**self.defaults, **options}["return_full_text"]
        return [
            [{"generated_text": (text if full else "") + self._text(row)}]
            for text, row in zip(items, rows)
        ]

    def generate(self, prompts: Sequence[Sequence[int]], *, key: Any = None, **options: Any):
        """The new token ids of each prompt (lists of token ids), up to and including its end
        of sequence token."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise InputError("text generation needs at least one prompt of at least one token")
        given, key = self._given(options, key)
        # transformers counts max_length and min_length over the (left-padded) prompt.
        max_new, settings = self._lengths(given, max(map(len, prompts)))
        if given["no_repeat_ngram_size"]:
            raise InputError(
                "no_repeat_ngram_size is not implemented for decoder-only text generation "
                "(text2text-generation and image-text-to-text apply it)"
            )
        self._check_positions(prompts, max_new)
        return self._streamed(
            len(prompts),
            given,
            lambda on_token: self.decoder.generate(
                prompts,
                pad_id=self._pad_id(settings),
                max_new_tokens=max_new,
                settings=settings,
                key=key,
                on_token=on_token,
            ),
        )

    def _lengths(self, given: dict[str, Any], prompt_length: int) -> tuple[int, Settings]:
        """The new tokens a generation may make after a prompt (or decoder start) of
        `prompt_length` tokens, and its token choice, from the options in force."""
        max_new = given["max_new_tokens"]
        if max_new is None:
            max_length = given["max_length"]
            if max_length is None:
                max_new = DEFAULT_NEW_TOKENS
            else:
                max_new = int(max_length) - prompt_length
                if max_new < 1:
                    raise InputError(
                        f"max_length={max_length} leaves no new token after {prompt_length} "
                        "tokens of prompt: pass max_new_tokens"
                    )
        if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1:
            raise InputError(f"max_new_tokens must be at least 1; got {max_new!r}")
        min_new = given["min_new_tokens"]
        if min_new is None:
            min_new = max(int(given["min_length"] or 0) - prompt_length, 0)
        return max_new, self._settings({**given, "min_new_tokens": min_new})

    def _given(self, options: dict[str, Any], key: Any) -> tuple[dict[str, Any], Any]:
        """The call's options over the defaults (checked), and its PRNG key (the pipeline's
        next one unless given)."""
        self._check(options)
        if key is None:
            self._keys, key = jax.random.split(self._keys)
        given = {**self.defaults, **_lengths_given(options)}
        for new in self._unset:  # a max_length / min_length given now counts
            if new not in options:
                given[new] = None if given[_TOTAL[new]] else self.defaults[new]
        return given, key

    def _streamed(self, batch: int, given: dict[str, Any], decode: Callable) -> list:
        """`decode(on_token)`'s rows, streaming text and watching for stop strings as asked."""
        watcher = self._watch(batch, given["stop"], given["on_token"])
        rows = decode(watcher)
        if watcher is not None:
            watcher.flush()
        return rows

    def _check_positions(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
        """Positions past the model's learned table would be clamped inside the program,
        silently (a rotary model has no table: transformers answers past
        max_position_embeddings, and so does this)."""
        config = self.repo.config
        if any(k in config for k in ("rope_theta", "rope_scaling", "rope_parameters")):
            return  # rotary positions are computed, not looked up: no table to run past
        limit = config.get("max_position_embeddings", config.get("n_positions"))
        longest = max((len(p) for p in prompts), default=0)
        if isinstance(limit, int) and longest + max_new_tokens > limit:
            raise InputError(
                f"a prompt of {longest} tokens and max_new_tokens={max_new_tokens} need "
                f"{longest + max_new_tokens} positions; the model has {limit}"
            )

    def _settings(self, given: dict[str, Any]) -> Settings:
        eos = given["eos_token_id"]
        eos = () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)
        sample = bool(given["do_sample"])
        if sample and not given["temperature"] > 0:
            raise InputError(f"temperature must be above 0 to sample; got {given['temperature']}")
        if not 0 < given["top_p"] <= 1:
            raise InputError(f"top_p must be in (0, 1]; got {given['top_p']}")
        if given["repetition_penalty"] <= 0:
            raise InputError(
                f"repetition_penalty must be above 0; got {given['repetition_penalty']}"
            )
        return Settings(
            sample=sample,
            temperature=float(given["temperature"]) if sample else 1.0,
            top_k=int(given["top_k"] or 0) if sample else 0,
            top_p=float(given["top_p"]) if sample else 1.0,
            repetition_penalty=float(given["repetition_penalty"]),
            eos=eos,
            min_new_tokens=int(given["min_new_tokens"]),
        )

    def _pad_id(self, settings: Settings) -> int:
        for source in (self.repo.generation_config, self.repo.config):
            if isinstance(source.get("pad_token_id"), int):
                return source["pad_token_id"]
        return settings.eos[0] if settings.eos else 0  # masked out: any id in the vocabulary

    def _text(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True)

    def _watch(self, batch: int, stop: Sequence[str] | str, on_token: Callable | None):
        """The per-token callback (None when neither streaming nor stop strings are asked for:
        no decoding per token)."""
        stop = (stop,) if isinstance(stop, str) else tuple(stop)
        if not stop and on_token is None:
            return None
        return _Watcher(self._text, batch, stop, on_token)


class _Watcher:
    """Streams each row's new text to `on_token(row, text)`, and stops a row whose text holds
    a stop string."""

    def __init__(self, decode: Callable, batch: int, stop: tuple[str, ...], on_token):
        self.decode, self.stop, self.on_token = decode, stop, on_token
        self.made: list[list[int]] = [[] for _ in range(batch)]
        self.shown = [""] * batch

    def __call__(self, row: int, token: int) -> bool:
        self.made[row].append(token)
        text = self.decode(self.made[row])
        # A byte-level token can end inside a character: hold it back until it is whole.
        if not text.endswith("\ufffd"):
            self._show(row, text)
        return any(s in text for s in self.stop)

    def flush(self) -> None:
        """Show what was held back (a row that ended inside a character)."""
        for row, tokens in enumerate(self.made):
            self._show(row, self.decode(tokens))

    def _show(self, row: int, text: str) -> None:
        if self.on_token is not None and len(text) > len(self.shown[row]):
            self.on_token(row, text[len(self.shown[row]) :])
            self.shown[row] = text


def generation_defaults(repo: Repo, task: str) -> dict[str, Any]:
    """The generation options' defaults for `task` on `repo`, as transformers' pipelines build
    their generation config: GenerationConfig's defaults, then generation_config.json's
    values, then config.json's task_specific_params[task] (less its "prefix"). Settings that
    are not options here (beam search's num_beams, length_penalty, ...) are not applied: a
    warning names them, and generation_config.json's num_beams past 1 too."""
    config = repo.generation_config
    defaults = dict(GENERATION_DEFAULTS)
    defaults.update({k: config[k] for k in GENERATION_DEFAULTS if config.get(k) is not None})
    defaults["eos_token_id"] = config.get("eos_token_id", repo.config.get("eos_token_id"))
    params = dict((repo.config.get("task_specific_params") or {}).get(task) or {})
    params.pop("prefix", None)
    known = {k: v for k, v in params.items() if k in defaults}
    defaults.update(known)
    ignored = {k for k in set(params) - set(known) if not _inert(k, params[k])}
    if not _inert("num_beams", config.get("num_beams", 1)):
        ignored.add("num_beams")
    ignored = sorted(ignored)
    if ignored:
        warnings.warn(
            f"{repo.source}: {task}'s settings {ignored} are not applied (Transmuter "
            "decodes greedily or by sampling); pass max_new_tokens and the other "
            "text-generation options to choose the decoding",
            stacklevel=4,
        )
    return defaults


def _inert(name: str, value: Any) -> bool:
    """A task setting that changes nothing in greedy or sampled decoding."""
    return (name, value) in {("num_beams", 1), ("early_stopping", False)}


_TOTAL = {"max_new_tokens": "max_length", "min_new_tokens": "min_length"}


def _lengths_given(options: dict[str, Any]) -> dict[str, Any]:
    """`options`, where a max_length (min_length) given without max_new_tokens
    (min_new_tokens) unsets the latter, so that it counts as in transformers."""
    options = dict(options)
    for new, total in _TOTAL.items():
        if options.get(total) is not None and new not in options:
            options[new] = None
    return options
