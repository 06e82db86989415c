"""The text-generation task: prompts in, [{"generated_text": ...}] out, as transformers'
pipeline returns them; defaults from generation_config.json, decoding in generation.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.generation.decoder import Decoder, Settings, warn_exact
from transmuter.pipelines.repo import Repo

# A decoder that takes its past, in order of preference: merged (one file serves the prompt and
# the steps), then Optimum's with-past file, then a model.onnx with past inputs.
_DECODER_ROLES = ("decoder_merged", "decoder_with_past", "model")
# transformers' GenerationConfig defaults, for what generation_config.json leaves out.
GENERATION_DEFAULTS = {
    "max_new_tokens": 20,
    "min_new_tokens": 0,
    "do_sample": False,
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
    "repetition_penalty": 1.0,
}


class TextGeneration:
    """Continue prompts. Options, given here or per call: max_new_tokens, min_new_tokens,
    do_sample, temperature, top_k, top_p, repetition_penalty, eos_token_id (an id or a list;
    default generation_config.json's), stop (strings that end a row once generated),
    on_token (called as on_token(row, text) with each new piece of text), return_full_text;
    per call also key (a jax.random key; by default each call draws a new one from seed 0)."""

    task = "text-generation"

    def __init__(self, repo: Repo, **options: Any):
        self.repo = repo
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
        """The options' defaults (generation_config.json's, then transformers'), updated with
        the options given."""
        repo = self.repo
        config = repo.generation_config
        self.defaults = {k: config.get(k, v) for k, v in GENERATION_DEFAULTS.items()}
        self.defaults.update(
            eos_token_id=config.get("eos_token_id", repo.config.get("eos_token_id")),
            stop=(),
            on_token=None,
            **more,
        )
        self._check(options)
        self.defaults.update(options)
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

    def __call__(self, inputs: str | Sequence[str], *, key: Any = None, **options: Any) -> Any:
        if isinstance(inputs, str):
            return self([inputs], key=key, **options)[0]
        if (
            not isinstance(inputs, Sequence)
            or not inputs
            or not all(isinstance(p, str) for p in inputs)
        ):
            raise InputError(f"give a prompt string or a non-empty list of them; got {inputs!r}")
        prompts = [self.tokenizer.encode(p).ids for p in inputs]
        rows = self.generate(prompts, key=key, **options)
        full = {**self.defaults, **options}["return_full_text"]
        return [
            [{"generated_text": (text if full else "") + self._text(row)}]
            for text, row in zip(inputs, rows)
        ]

    def generate(self, prompts: Sequence[Sequence[int]], *, key: Any = None, **options: Any):
        """The new token ids of each prompt (lists of token ids), up to and including its end
        of sequence token."""
        given, key = self._given(options, key)
        settings = self._settings(given)
        self._check_positions(prompts, int(given["max_new_tokens"]))
        return self._streamed(
            len(prompts),
            given,
            lambda on_token: self.decoder.generate(
                prompts,
                pad_id=self._pad_id(settings),
                max_new_tokens=int(given["max_new_tokens"]),
                settings=settings,
                key=key,
                on_token=on_token,
            ),
        )

    def _given(self, options: dict[str, Any], key: Any) -> tuple[dict[str, Any], Any]:
        """The call's options over the defaults (checked), and its PRNG key (the pipeline's
        next one unless given)."""
        self._check(options)
        if key is None:
            self._keys, key = jax.random.split(self._keys)
        return {**self.defaults, **options}, key

    def _streamed(self, batch: int, given: dict[str, Any], decode: Callable) -> list:
        """`decode(on_token)`'s rows, streaming text and watching for stop strings as asked."""
        watcher = self._watch(batch, given["stop"], given["on_token"])
        rows = decode(watcher)
        if watcher is not None:
            watcher.flush()
        return rows

    def _check_positions(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
        """Positions past the model's table would be clamped inside the program, silently."""
        config = self.repo.config
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
