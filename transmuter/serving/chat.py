"""Chat templates and stop strings, as OpenAI's endpoints need them.

A repository's chat template (tokenizer_config.json's `chat_template`) renders as the pipelines
render it (pipelines/text/chat_template.py: Jinja in a sandbox with transformers' settings), with
`add_generation_prompt=True`; a bad chat or a template that refuses it is a 400 on "messages".
Part of `transmuter serve`: `pip install transmuter[serve]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transmuter.errors import InputError
from transmuter.pipelines.text import chat_template
from transmuter.serving.api import ApiError


def render_chat(tokenizer_config: dict, messages: Any) -> str:
    """The prompt text for `messages` ([{"role", "content"}]) by the repo's chat template."""
    if chat_template.template_of(tokenizer_config) is None:
        raise ApiError(400, "this model's tokenizer_config.json has no chat_template: use "
                       "/v1/completions", param="messages")  # fmt: skip
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    try:
        return chat_template.render_chat(tokenizer_config, messages, add_generation_prompt=True)
    except InputError as error:
        raise ApiError(400, str(error), param="messages") from None


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
