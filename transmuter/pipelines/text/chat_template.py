"""Chat templates: a chat (a list of {"role", "content"} messages) rendered to a prompt's text
by tokenizer_config.json's `chat_template`, as transformers' apply_chat_template renders it.

Jinja in a sandbox with transformers' settings: trim_blocks, lstrip_blocks, the loop-controls
extension, `{% generation %}` blocks (rendered as their body), `raise_exception`,
`strftime_now`, a `tojson` that keeps non-ASCII, and as variables the messages,
add_generation_prompt, tools and documents (None) and the special tokens that
tokenizer_config.json sets (bos_token, eos_token, ...) as strings. continue_final_message cuts
the text right after the last message's content, so that a generation continues it. A bad chat,
a repo without a template or a template that refuses the chat is an InputError.
Needs the `pipelines` extra (jinja2): `pip install transmuter[pipelines]`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from transmuter.errors import InputError

# transformers' special_tokens_map: the named special tokens a template may write.
_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
            "mask_token")  # fmt: skip
# Put after the final message's content to find where it ends in the rendered text (the space
# tells a template that keeps the content as it is from one that strips it).
_END_MARK = "\U000f0002END_OF_THE_CONTINUED_MESSAGE "


def template_of(tokenizer_config: Mapping[str, Any]) -> str | None:
    """The repo's chat template (among named templates, "default", as transformers picks it),
    or None where it has none."""
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template if isinstance(template, str) and template else None


def is_chat(value: Any) -> bool:
    """Whether `value` is meant as a chat: a list (or tuple) of messages, i.e. of dicts
    (transformers takes a list whose first entry is a message as one chat)."""
    return isinstance(value, (list, tuple)) and bool(value) and isinstance(value[0], Mapping)


def check_chat(messages: Any) -> list[dict[str, Any]]:
    """The chat's messages as dicts, each with a string "role" and "content" (content parts are
    not taken); an InputError naming the first wrong message otherwise."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InputError(
            f'a chat must be a non-empty list of {{"role", "content"}} messages; got {messages!r}'
        )
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InputError(f'message {i} of the chat is not a {{"role", "content"}} dict: '
                             f"{message!r}")  # fmt: skip
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                what = "has no" if message.get(key) is None else "has a non-string"
                raise InputError(f"message {i} of the chat {what} {key!r} (a string; content "
                                 f"parts are not taken): {dict(message)!r}")  # fmt: skip
    # transformers drops the keys set to None (an OpenAI-style message's tool_calls=None).
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def render_chat(
    tokenizer_config: Mapping[str, Any],
    messages: Any,
    *,
    add_generation_prompt: bool = False,
    continue_final_message: bool = False,
) -> str:
    """The prompt text of `messages` by the repo's chat template. add_generation_prompt: the
    template's opening of the assistant's reply after the chat; continue_final_message: the
    text ends with the last message's content, for a generation to continue it (not both)."""
    template = template_of(tokenizer_config)
    if template is None:
        raise InputError(
            "this repository's tokenizer_config.json has no chat_template: give the prompt as "
            "a string"
        )
    messages = check_chat(messages)
    if add_generation_prompt and continue_final_message:
        raise InputError(
            "add_generation_prompt and continue_final_message cannot both be set: the first "
            "opens a new assistant message, the second continues the last one"
        )
    final = messages[-1]["content"]
    if continue_final_message:
        if "content" not in template:
            raise InputError(
                "continue_final_message is set, but the chat template never reads a message's "
                "content"
            )
        messages[-1] = {**messages[-1], "content": final + _END_MARK}
    special = {
        name: _token_text(tokenizer_config[name])
        for name in _SPECIAL
        if tokenizer_config.get(name) is not None
    }
    try:
        text = _compiled(template).render(
            messages=messages,
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **special,
        )
    except jinja2.TemplateError as error:
        raise InputError(f"the chat template refused the messages: {error}") from None
    if continue_final_message:
        text = _cut_after_final(text, final)
    return text


def _cut_after_final(text: str, final: str) -> str:
    """The rendered text up to the end of the final message's content (the mark put after
    it); where the template stripped the content's end, the mark's space went with it and
    the text is stripped at its end too, as transformers does."""
    mark = _END_MARK.rstrip()
    at = text.rfind(mark)
    if at < 0 or final.strip() not in text:
        raise InputError(
            "continue_final_message is set, but the chat template drops part of the final "
            "message: it cannot be continued (pass continue_final_message=False)"
        )
    return text[:at] if text.startswith(_END_MARK, at) else text[:at].rstrip()


def _token_text(token: Any) -> str:
    """A special token as tokenizer_config.json gives it: a string or an AddedToken dict."""
    return str(token.get("content")) if isinstance(token, Mapping) else str(token)


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # Jinja's own tojson escapes HTML characters: chat templates expect plain JSON.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers marks the assistant's tokens
    with it; rendering writes the body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


_ENVIRONMENT = ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _Generation]
)
_ENVIRONMENT.filters["tojson"] = _tojson
_ENVIRONMENT.globals["raise_exception"] = _raise
_ENVIRONMENT.globals["strftime_now"] = lambda format: datetime.now().strftime(format)


@functools.lru_cache(maxsize=32)
def _compiled(template: str) -> jinja2.Template:
    try:
        return _ENVIRONMENT.from_string(template)
    except jinja2.TemplateError as error:
        raise InputError(f"the chat template does not parse: {error}") from None
