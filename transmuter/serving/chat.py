"""Chat templates and stop strings, as OpenAI's endpoints need them.

A repository's chat template (tokenizer_config.json's `chat_template`) renders with Jinja in a
sandbox with transformers' settings: trim_blocks, lstrip_blocks, the loop-controls extension,
`raise_exception`, a `tojson` that keeps non-ASCII, the messages, `add_generation_prompt=True`
and the special tokens (bos_token, eos_token, ...) as strings.
Part of `transmuter serve`: `pip install transmuter[serve]`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from transmuter.serving.api import ApiError

_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token")


def render_chat(tokenizer_config: dict, messages: Any) -> str:
    """The prompt text for `messages` ([{"role", "content"}]) by the repo's chat template."""
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # named templates: transformers uses "default"
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if not template:
        raise ApiError(400, "this model's tokenizer_config.json has no chat_template: use "
                       "/v1/completions", param="messages")  # fmt: skip
    _check_messages(messages)
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    environment.globals["raise_exception"] = _raise
    environment.filters["tojson"] = lambda x, indent=None: json.dumps(
        x, ensure_ascii=False, indent=indent
    )
    special = {name: _content(tokenizer_config.get(name)) for name in _SPECIAL}
    try:
        return environment.from_string(template).render(
            messages=messages, add_generation_prompt=True, **special
        )
    except jinja2.TemplateError as error:
        raise ApiError(400, f"the chat template refused the messages: {error}",
                       param="messages") from None  # fmt: skip


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    for i, message in enumerate(messages):
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise ApiError(400, f"'messages'[{i}] must have a string 'role' and 'content' "
                           "(content parts are not accepted)", param="messages")  # fmt: skip


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _content(token: Any) -> str | None:
    """A special token as tokenizer_config.json gives it: a string or an AddedToken dict."""
    return token.get("content") if isinstance(token, dict) else token


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """`text` up to the first stop string (OpenAI returns the text before it), and whether one
    was found."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[: min(found)], True) if found else (text, False)


class StopStream:
    """A streamed row's text, cut before its first stop string: a piece is held back while it
    could still be the start of one."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(stops)
        self.text = ""
        self.sent = 0
        self.stopped = False

    def feed(self, piece: str) -> str:
        """What of the text so far can be sent now."""
        if self.stopped:
            return ""
        self.text += piece
        kept, self.stopped = cut_at_stop(self.text, self.stops)
        if not self.stopped:
            kept = self.text[: len(self.text) - self._held()]
        out = kept[self.sent :]
        self.sent = max(self.sent, len(kept))
        return out

    def finish(self) -> str:
        """The rest once the row has ended."""
        if self.stopped:
            return ""
        out = self.text[self.sent :]
        self.sent = len(self.text)
        return out

    def _held(self) -> int:
        """The longest end of the text that begins a stop string."""
        return max(
            (k for s in self.stops for k in range(len(s) - 1, 0, -1) if self.text.endswith(s[:k])),
            default=0,
        )
