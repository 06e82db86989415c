"""The text-generation task: prompts in, [{"generated_text": ...}] out, as transformers'
pipeline returns them; decoding in generation/decoder.py.

The options' defaults are read where transformers' pipelines read them, in this order (later
wins): GenerationConfig's own defaults, generation_config.json, config.json's
task_specific_params[task] (a pipeline applies its own task's, as transformers' Pipeline does
for every generating task), the pipeline's options, the call's. `max_length` and `min_length`
count the decoder's whole sequence, as in transformers: the prompt for a decoder-only model, the
decoder's start tokens for an encoder-decoder; `max_new_tokens` / `min_new_tokens` win over them
wherever they are set (generation_config.json's max_new_tokens over a call's max_length, as in
transformers' generate()). Without any length, a generation makes DEFAULT_NEW_TOKENS tokens.

text-generation's own options (PROMPT_OPTIONS) are transformers' TextGenerationPipeline's: how a
prompt is tokenized (prefix, add_special_tokens, padding, truncation with max_length as the
tokenizer's limit, handle_long_generation="hole") and what is answered (return_full_text,
return_text, return_tensors). An empty prompt starts from bos_token_id, as generate() starts it.

A chat (a list of {"role", "content"} messages) is a prompt too, as transformers takes it:
rendered by tokenizer_config.json's chat_template (text/chat_template.py), tokenized without
adding special tokens (the template writes them), and answered as the chat with the reply
appended: a new assistant message, or, where continue_final_message (default: the last message
is the assistant's), the last message's content continued.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.base import Task, positive_int
from transmuter.pipelines.generation.decoder import Decoder, Settings, warn_exact
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.text.chat_template import check_chat, is_chat, render_chat

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
# text-generation's own options and their defaults (transformers' TextGenerationPipeline's;
# not options of the encoder-decoder tasks built on this class). None: the tokenizer's own
# special tokens, no padding or truncation asked, the full text answered, and a chat's last
# message continued where it is the assistant's.
PROMPT_OPTIONS = {
    "prefix": "",
    "add_special_tokens": None,
    "padding": None,
    "truncation": None,
    "handle_long_generation": None,
    "return_full_text": None,
    "return_text": None,
    "return_tensors": None,
    "continue_final_message": None,
}
# The tokenizer options' values that change nothing for one prompt at a time (prompts are
# left-padded to their batch's longest, the padding masked, whatever `padding` says).
_PADDING = (None, True, False, "longest", "do_not_pad")
_TRUNCATION = (None, True, False, "longest_first", "only_first", "do_not_truncate")
# transformers' tokenizers write a huge model_max_length where a tokenizer sets no limit.
_NO_LIMIT = 1_000_000
# The new tokens of a generation when nothing sets a length (transformers' GenerationConfig
# says max_length=20, its pipelines max_new_tokens=256: kept at 20 new tokens here).
DEFAULT_NEW_TOKENS = 20


class TextGeneration(Task):
    """Continue prompts: a prompt gives [{"generated_text"}], a list of prompts a list of them,
    a generator of prompts a generator of them. A prompt is a string or a chat (a list of
    {"role", "content"} messages, rendered by the repo's chat template), whose
    "generated_text" is the chat with the reply appended. Options, given here or per call:
    max_new_tokens, max_length, min_new_tokens, min_length, do_sample, temperature, top_k,
    top_p, repetition_penalty, no_repeat_ngram_size, eos_token_id (an id or a list; default
    generation_config.json's), stop (strings that end a row once generated; stop_sequence is
    transformers' name), on_token (called as on_token(row, text) with each new piece of text),
    and PROMPT_OPTIONS: prefix (tokenized before the prompt, not answered), add_special_tokens,
    padding, truncation (with max_length, also the tokenizer's limit where given here or per
    call, as transformers passes it), handle_long_generation ("hole": the prompt's start cut so
    that it and the new tokens fit tokenizer_config.json's model_max_length), return_full_text
    (default True), return_text, return_tensors ({"generated_token_ids": prompt and new ids}),
    continue_final_message (a chat's reply continues its last message instead of opening a new
    assistant message; default: where that message is the assistant's);
    per call also key (a jax.random key; by default each call draws a new one from seed 0) and
    batch_size (checked; answers do not depend on it). `batch_size`: the prompts of a
    generator decoded together."""

    task = "text-generation"
    own_defaults: Mapping[str, Any] = {}  # a subclass's options beyond GENERATION_DEFAULTS

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
        # Generation reads the last position's logits: a prefill's vocabulary product is then
        # one row's, not every prompt token's (a fifth of GPT-2-small's prefill).
        model = repo.model(role, last_position=("logits",))
        self.decoder = Decoder(model, merged="use_cache_branch" in model.inputs)
        if not self.decoder.positions:
            warn_exact(repo.source)
        # transformers gives the tokenizer the pipeline's or the call's max_length, never
        # generation_config.json's.
        self._tokenizer_max_length = options.get("max_length")
        self._set_defaults(options, **PROMPT_OPTIONS)

    def _set_defaults(self, options: dict[str, Any], **more: Any) -> None:
        """The options' defaults (GenerationConfig's, generation_config.json's, the task's
        task_specific_params), updated with the options given."""
        repo = self.repo
        self.defaults = generation_defaults(repo, self.task, self.own_defaults)
        self.defaults.update(stop=(), on_token=None, **more)
        self._check(options)
        self.defaults.update(options)
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
        return isinstance(value, str) or is_chat(value)

    def describe_items(self) -> str:
        return (
            'give a prompt string, a chat (a list of {"role", "content"} messages), a list of '
            "either or a generator of them"
        )

    def run_items(
        self, items: list, *, key: Any = None, batch_size: Any = None, **options: Any
    ) -> list:
        wrong = next((p for p in items if not (isinstance(p, str) or is_chat(p))), None)
        if wrong is not None:
            raise InputError(f"{self.describe_items()}; got {wrong!r} among the prompts")
        if batch_size is not None:  # transformers' per-call batching; answers do not depend on it
            positive_int(batch_size, "batch_size")
        if "stop_sequence" in options:  # transformers' name for stop strings
            if "stop" in options:
                raise InputError("give stop or stop_sequence, not both")
            options["stop"] = options.pop("stop_sequence")
        self._check(options)
        answer = _return_type(options) or _return_type(self.defaults) or "full"
        prompts, starts, prefix_length = self._prompts(items, options)
        rows = self._generate(prompts, key, options, prefix_length)
        if answer == "tensors":
            return [
                [{"generated_token_ids": [int(t) for t in (*prompt, *row)]}]
                for prompt, row in zip(prompts, rows)
            ]
        # transformers decodes the tokens after the prompt (all of them after an empty prompt,
        # the bos_token_id it started from included) and puts the prompt's text (without the
        # prefix) before them.
        texts = [self._text([*p[start:], *row]) for p, start, row in zip(prompts, starts, rows)]
        if answer == "full":
            given = self._in_force(options)
            texts = [_full(item, text, given) for item, text in zip(items, texts)]
        return [[{"generated_text": text}] for text in texts]

    def _prompts(
        self, items: list, options: dict[str, Any]
    ) -> tuple[list[list[int]], list[int], int]:
        """Each prompt's token ids as transformers' preprocess makes them, where its answer's
        text starts among them, and the prefix's length (which a max_length does not count).
        A chat is rendered by the chat template and tokenized without special tokens (the
        template writes them; transformers ignores add_special_tokens and the prefix there)."""
        given = self._in_force(options)
        prefix = given["prefix"]
        if not isinstance(prefix, str):
            raise InputError(f"prefix must be a string (put before each prompt); got {prefix!r}")
        special = _flag(given, "add_special_tokens")
        tokenizer = self.tokenizer
        tokenizer.no_truncation()
        # transformers counts the prefix without the special tokens unless the call asks.
        prefix_length = (
            len(tokenizer.encode(prefix, add_special_tokens=bool(special)).ids) if prefix else 0
        )
        texts = [
            (prefix + item, special is not False) if isinstance(item, str)
            else (self._render(item, given), False)
            for item in items
        ]  # fmt: skip
        limit = self._truncation(given, options.get("max_length"))
        try:
            if limit is not None:
                side = self.repo.tokenizer_config.get("truncation_side", "right")
                tokenizer.enable_truncation(limit, direction=side)
            prompts = [tokenizer.encode(text, add_special_tokens=adds).ids for text, adds in texts]
        except Exception as error:  # the tokenizers library's: a limit below its special tokens
            raise InputError(f"truncation to max_length={limit} failed: {error}") from None
        finally:
            tokenizer.no_truncation()
        if given["handle_long_generation"] is not None:
            if given["handle_long_generation"] != "hole":
                raise InputError(
                    "handle_long_generation must be None or 'hole'; got "
                    f"{given['handle_long_generation']!r}"
                )
            prompts = [self._hole(p, given) for p in prompts]
        starts = [len(p) for p in prompts]
        if not all(prompts):
            bos = self._bos_id()
            prompts = [p or [bos] for p in prompts]
        return prompts, starts, prefix_length

    def _render(self, chat: Any, given: dict[str, Any]) -> str:
        """A chat's prompt text: the template's opening of a new assistant message after it,
        or its last message left open to be continued."""
        continues = _continues(chat, given)
        return render_chat(
            self.repo.tokenizer_config,
            chat,
            add_generation_prompt=not continues,
            continue_final_message=continues,
        )

    def _truncation(self, given: dict[str, Any], call_max_length: Any) -> int | None:
        """The tokens a prompt is cut to, as transformers' tokenizers decide: where truncation
        is asked, or where a max_length comes without padding or truncation (their old
        default), at that max_length, else at tokenizer_config.json's model_max_length."""
        truncation, padding = given["truncation"], given["padding"]
        if truncation not in _TRUNCATION:
            raise InputError(
                f"truncation must be one of {list(_TRUNCATION)} for a prompt; got {truncation!r}"
            )
        if padding not in _PADDING:
            raise InputError(
                f"padding must be one of {list(_PADDING)} (prompts are padded to their batch's "
                f"longest, the padding masked; 'max_length' padding is not supported); "
                f"got {padding!r}"
            )
        max_length = call_max_length
        if max_length is None:
            max_length = self._tokenizer_max_length
        if max_length is not None:
            max_length = positive_int(max_length, "max_length")
        if truncation in (None, False, "do_not_truncate"):
            if max_length is None or truncation is not None or padding not in (None, False):
                return None
        return max_length if max_length is not None else self._model_max_length()

    def _hole(self, prompt: list[int], given: dict[str, Any]) -> list[int]:
        """handle_long_generation="hole": the prompt's last tokens, as many as fit
        model_max_length with the new tokens."""
        total = self._model_max_length()
        new = given["max_new_tokens"]
        if new is None:
            max_length = given["max_length"]
            new = DEFAULT_NEW_TOKENS if max_length is None else int(max_length) - len(prompt)
            if new < 0:
                raise InputError(
                    f"handle_long_generation='hole' cannot tell the new tokens: max_length="
                    f"{max_length} is below the prompt's {len(prompt)} tokens; pass "
                    "max_new_tokens"
                )
        if total is None or len(prompt) + new <= total:
            return prompt
        keep = total - new
        if keep <= 0:
            raise InputError(
                f"handle_long_generation='hole' leaves no room for the prompt: {new} new tokens "
                f"and model_max_length={total}"
            )
        return prompt[-keep:]

    def _model_max_length(self) -> int | None:
        """tokenizer_config.json's model_max_length (None where absent or transformers' huge
        sentinel for no limit)."""
        limit = self.repo.tokenizer_config.get("model_max_length")
        return limit if isinstance(limit, int) and 0 < limit < _NO_LIMIT else None

    def _bos_id(self) -> int:
        """The token an empty prompt starts from (generate()'s bos_token_id)."""
        for source in (self.repo.generation_config, self.repo.config):
            if isinstance(source.get("bos_token_id"), int):
                return source["bos_token_id"]
        raise InputError(
            f"an empty prompt starts from bos_token_id, and {self.repo.source} has none "
            "(generation_config.json, config.json): give a prompt of at least one token"
        )

    def generate(self, prompts: Sequence[Sequence[int]], *, key: Any = None, **options: Any):
        """The new token ids of each prompt (lists of token ids), up to and including its end
        of sequence token."""
        return self._generate(prompts, key, options, 0)

    def _generate(
        self,
        prompts: Sequence[Sequence[int]],
        key: Any,
        options: dict[str, Any],
        prefix_length: int,
    ) -> list:
        if not prompts or any(len(p) == 0 for p in prompts):
            raise InputError("text generation needs at least one prompt of at least one token")
        given, key = self._given(options, key)
        # transformers counts max_length and min_length over the (left-padded) prompt, less a
        # prefix (its pipeline adds the prefix's length to them).
        max_new, settings = self._lengths(given, max(map(len, prompts)) - prefix_length)
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
        return self._in_force(options), key

    def _in_force(self, options: dict[str, Any]) -> dict[str, Any]:
        """The call's options over the defaults. A max_new_tokens (min_new_tokens) set anywhere
        wins over a max_length (min_length), as in transformers' generate(); only where none
        is set does a max_length (min_length) given now count."""
        given = {**self.defaults, **options}
        for new in self._unset:
            if new not in options:
                given[new] = None if given[_TOTAL[new]] else self.defaults[new]
        return given

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


def generation_defaults(
    repo: Repo, task: str, more: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The generation options' defaults for `task` on `repo`, as transformers' pipelines build
    their generation config: GenerationConfig's defaults (and the task's `more` options with
    theirs), then generation_config.json's values, then config.json's
    task_specific_params[task] (less its "prefix"). Settings that are not options of the task
    (beam search's num_beams, length_penalty, ... where it has none) are not applied: a
    warning names them, and generation_config.json's num_beams past 1 too."""
    config = repo.generation_config
    defaults = {**GENERATION_DEFAULTS, **(more or {})}
    defaults.update({k: config[k] for k in defaults if config.get(k) is not None})
    defaults["eos_token_id"] = config.get("eos_token_id", repo.config.get("eos_token_id"))
    params = dict((repo.config.get("task_specific_params") or {}).get(task) or {})
    params.pop("prefix", None)
    known = {k: v for k, v in params.items() if k in defaults}
    defaults.update(known)
    ignored = {k for k in set(params) - set(known) if not _inert(k, params[k])}
    if "num_beams" not in defaults and not _inert("num_beams", config.get("num_beams", 1)):
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


def _flag(options: dict[str, Any], name: str) -> bool | None:
    """A True / False option (None: not given)."""
    value = options.get(name)
    if value is not None and not isinstance(value, bool):
        raise InputError(f"{name} must be True or False; got {value!r}")
    return value


def _continues(chat: Any, given: dict[str, Any]) -> bool:
    """Whether the reply continues the chat's last message (continue_final_message; by
    default where that message is the assistant's, as transformers decides)."""
    messages = check_chat(chat)
    continues = _flag(given, "continue_final_message")
    return messages[-1]["role"] == "assistant" if continues is None else continues


def _full(item: Any, text: str, given: dict[str, Any]) -> Any:
    """The full answer of a prompt: its text and the new text, or a chat with the new text
    as a new assistant message or appended to its last message's content."""
    if isinstance(item, str):
        return item + text
    messages = [dict(m) for m in item]
    if _continues(item, given):
        last = messages.pop()
        return [*messages, {"role": last["role"], "content": last["content"] + text}]
    return [*messages, {"role": "assistant", "content": text}]


def _return_type(options: dict[str, Any]) -> str | None:
    """What `options` ask text-generation to answer, as transformers' ReturnType: "tensors"
    (the prompt's and the new token ids), "new" (the new text) or "full" (the prompt's text
    and the new text); None where they ask nothing. return_full_text is refused beside
    return_text or return_tensors, as transformers refuses it."""
    full = _flag(options, "return_full_text")
    text = _flag(options, "return_text")
    tensors = _flag(options, "return_tensors")
    if full is not None and (text or tensors):
        raise InputError(
            "return_full_text cannot be given with return_text or return_tensors: give one"
        )
    if text and tensors:
        raise InputError("give return_text or return_tensors, not both")
    if tensors:
        return "tensors"
    if full is not None:
        return "full" if full else "new"
    return "full" if text else None
