"""text-generation's per-call options as transformers' TextGenerationPipeline takes them, on the
differential harness's Optimum exports (tests/fixtures/differential/gen-*). The token ids are
transformers 5.25's answers (greedy) on the same weights: generation_config.json sets
max_new_tokens=6, model_max_length is 64. Chats use a tiny template written here; the renderings
asserted are transformers 5.25 apply_chat_template's for the same templates and messages."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import transmuter
from transmuter.errors import InputError
from transmuter.pipelines.text.chat_template import render_chat

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "differential"
# transformers' generated_token_ids for "This is a test" on gen-gpt2 (8 prompt tokens, 6 new).
THIS_IS_A_TEST = [52, 72, 273, 301, 258, 257, 264, 84, 228, 85, 304, 85, 304, 304]
# ... and the prompt "Another test" (9 tokens).
ANOTHER = [33, 78, 79, 84, 72, 260, 257, 264, 84]
LONG = "This is a test" * 40  # 320 tokens on gen-gpt2, past model_max_length (64)


@pytest.fixture(scope="module")
def gpt2():
    return transmuter.pipeline("text-generation", FIXTURES / "gen-gpt2")


@pytest.fixture(scope="module")
def llama():
    return transmuter.pipeline("text-generation", FIXTURES / "gen-llama")


def _copy(tmp_path, repo: str, **edits: dict) -> Path:
    """A copy of a differential repo with some keys of its JSON files dropped or set."""
    for path in (FIXTURES / repo).iterdir():
        if path.name not in ("calls.json", "inputs.npz", "expected.npz"):
            shutil.copy(path, tmp_path / path.name)
    for name, changes in edits.items():
        path = tmp_path / f"{name}.json"
        data = json.loads(path.read_text())
        for key, value in changes.items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        path.write_text(json.dumps(data))
    return tmp_path


def test_batch_size_per_call_is_checked_and_changes_nothing(gpt2):
    prompts = ["This is a test", "Another test", "Hello world! How are"]
    assert gpt2(prompts, batch_size=2) == gpt2(prompts)
    for bad in (0, "2", True, 1.5):
        with pytest.raises(InputError, match=r"batch_size must be an integer of at least 1"):
            gpt2(prompts, batch_size=bad)


def test_max_new_tokens_wins_over_max_length_wherever_set(gpt2, tmp_path):
    # generation_config.json's max_new_tokens=6 over a call's max_length=9 (transformers warns
    # "Both max_new_tokens and max_length seem to have been set"), and over the pipeline's.
    answer = gpt2("This is a test", max_length=9, return_tensors=True)
    assert answer == [{"generated_token_ids": THIS_IS_A_TEST}]
    repo = FIXTURES / "gen-gpt2"
    assert transmuter.pipeline("text-generation", repo, max_length=9)(
        "This is a test", return_tensors=True
    ) == [{"generated_token_ids": THIS_IS_A_TEST}]
    # Where nothing sets max_new_tokens, max_length counts the prompt and the new tokens.
    unset = transmuter.pipeline(
        "text-generation", _copy(tmp_path, "gen-gpt2", generation_config={"max_new_tokens": None})
    )
    assert unset("Another test", max_length=12, return_tensors=True) == [
        {"generated_token_ids": [*ANOTHER, 178, 287, 287]}
    ]


def test_return_type_options(gpt2):
    full = gpt2("Another test")
    assert full == [{"generated_text": "Another test\ufffdededededed"}]
    assert gpt2("Another test", return_text=True) == full
    assert gpt2("Another test", return_full_text=False) == [{"generated_text": "\ufffdededededed"}]
    new = [178, 287, 287, 287, 287, 287]
    assert gpt2("Another test", return_tensors=True) == [{"generated_token_ids": ANOTHER + new}]
    listed = gpt2(["Another test"], return_tensors=True)
    assert listed == [[{"generated_token_ids": ANOTHER + new}]]
    with pytest.raises(InputError, match="return_full_text cannot be given with return_text"):
        gpt2("Another test", return_text=True, return_full_text=False)
    with pytest.raises(InputError, match="return_full_text cannot be given with return_text"):
        gpt2("Another test", return_tensors=True, return_full_text=True)
    with pytest.raises(InputError, match="give return_text or return_tensors, not both"):
        gpt2("Another test", return_tensors=True, return_text=True)
    with pytest.raises(InputError, match="return_tensors must be True or False; got 'pt'"):
        gpt2("Another test", return_tensors="pt")


def test_prefix_is_tokenized_before_the_prompt_and_not_answered(gpt2, tmp_path):
    # "Hello " is 4 tokens: the answer continues "Hello Another test", the text starts at the
    # prompt, the token ids at the prefix.
    assert gpt2("Another test", prefix="Hello ") == [{"generated_text": "Another test\ufffdu333-"}]
    assert gpt2("Another test", prefix="Hello ", return_full_text=False) == [
        {"generated_text": "\ufffdu333-"}
    ]
    ids = [316, 76, 79, 221, 33, 78, 79, 84, 72, 260, 257, 264, 84, 109, 85, 19, 19, 19, 13]
    assert gpt2("Another test", prefix="Hello ", return_tensors=True) == [
        {"generated_token_ids": ids}
    ]
    # A max_length counts without the prefix (transformers adds its length), after the
    # tokenizer cut prefix and prompt to max_length: 12 tokens, then 12 + 4 - 12 new ones.
    unset = transmuter.pipeline(
        "text-generation", _copy(tmp_path, "gen-gpt2", generation_config={"max_new_tokens": None})
    )
    assert unset("Another test", prefix="Hello ", max_length=12, return_tensors=True) == [
        {"generated_token_ids": [*ids[:12], 132, 54, 287, 287]}
    ]
    with pytest.raises(InputError, match="prefix must be a string"):
        gpt2("Another test", prefix=3)


def test_tokenizer_options(gpt2, llama):
    # Llama's tokenizer adds <s> (1) unless add_special_tokens=False.
    assert llama("Another test", return_tensors=True)[0]["generated_token_ids"][:2] == [1, 35]
    assert llama("Another test", add_special_tokens=True, padding=False) == llama("Another test")
    bare = [35, 80, 81, 86, 74, 262, 259, 266, 86, 101, 101, 101, 226, 199, 173]
    assert llama("Another test", add_special_tokens=False, return_tensors=True) == [
        {"generated_token_ids": bare}
    ]
    # A max_length given alone cuts the prompt too (transformers' tokenizers' old default),
    # where max_new_tokens still says how many new tokens.
    cut = [84, 264, 84, 259, 71, 257, 79, 75, 289, 73, 287, 287, 85, 220, 13, 19]
    text = "testing tokenizer kwargs. using truncation must result in a different text."
    assert gpt2(text, max_length=10, return_tensors=True) == [{"generated_token_ids": cut}]
    assert gpt2(text, max_length=10, truncation=True, return_tensors=True) == [
        {"generated_token_ids": cut}
    ]
    # ... not with padding asked or truncation refused; truncation=True alone cuts at
    # model_max_length, here beyond the positions left for any new token.
    for kept in ({"truncation": False}, {"padding": True}):
        whole = gpt2(text, max_length=10, return_tensors=True, **kept)
        assert len(whole[0]["generated_token_ids"]) == 58 + 6
    with pytest.raises(InputError, match="a prompt of 64 tokens and max_new_tokens=6 need 70"):
        gpt2(LONG, truncation=True)
    with pytest.raises(InputError, match="'max_length' padding is not supported"):
        gpt2(text, padding="max_length")
    with pytest.raises(InputError, match="truncation must be one of"):
        gpt2(text, truncation="only_second")
    with pytest.raises(InputError, match="add_special_tokens must be True or False"):
        gpt2(text, add_special_tokens="no")
    with pytest.raises(InputError, match="max_length must be an integer of at least 1"):
        gpt2(text, truncation=True, max_length=0)


def test_empty_prompt_starts_from_bos(gpt2, tmp_path):
    # generate() starts an empty prompt from bos_token_id (GPT-2's <|endoftext|>, 0), which the
    # text then skips as a special token.
    assert gpt2("", return_tensors=True) == [
        {"generated_token_ids": [0, 137, 137, 270, 13, 13, 13]}
    ]
    assert gpt2("") == [{"generated_text": "\ufffd\ufffd the---"}]
    qwen2 = transmuter.pipeline("text-generation", FIXTURES / "gen-qwen2")
    assert qwen2("", return_tensors=True) == [{"generated_token_ids": [0] * 7}]
    assert qwen2("") == [{"generated_text": ""}]
    no_bos = transmuter.pipeline(
        "text-generation",
        _copy(
            tmp_path,
            "gen-gpt2",
            generation_config={"bos_token_id": None},
            config={"bos_token_id": None},
        ),
    )
    with pytest.raises(InputError, match="an empty prompt starts from bos_token_id"):
        no_bos("")


def test_handle_long_generation_hole(gpt2):
    # 320 tokens cut to their last 64 - 5, so that the 5 new ones fit model_max_length.
    ids = gpt2(LONG, handle_long_generation="hole", max_new_tokens=5, return_tensors=True)
    ids = ids[0]["generated_token_ids"]
    assert len(ids) == 64 and ids[-8:] == [257, 264, 84, 165, 19, 19, 234, 160]
    text = gpt2(LONG, handle_long_generation="hole", max_new_tokens=5)[0]["generated_text"]
    assert text.startswith(LONG) and len(text) > len(LONG)  # the whole prompt's text
    with pytest.raises(InputError, match="leaves no room for the prompt: 64 new tokens"):
        gpt2(LONG, handle_long_generation="hole", max_new_tokens=64)
    with pytest.raises(InputError, match="handle_long_generation must be None or 'hole'"):
        gpt2(LONG, handle_long_generation="cut")


# A tiny chat template written here (not a repo's): the special tokens, each message on its line,
# the assistant's opening where add_generation_prompt.
TINY_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)
CHAT = [{"role": "user", "content": "Hello world!"}]
PREFILLED = [*CHAT, {"role": "assistant", "content": "How are"}]


def test_chat_templates_render_as_transformers_applies_them():
    config = {"chat_template": TINY_TEMPLATE, "bos_token": {"content": "<s>"}}
    assert render_chat(config, CHAT) == "<s>[user] Hello world!\n"
    assert render_chat(config, CHAT, add_generation_prompt=True) == (
        "<s>[user] Hello world!\n[assistant]"
    )
    # continue_final_message: the text stops right after the last message's content, also
    # where the template strips it (then at its stripped end).
    assert render_chat(config, PREFILLED, continue_final_message=True) == (
        "<s>[user] Hello world!\n[assistant] How are"
    )
    trimmed = {"chat_template": "{% for m in messages %}<{{ m.content | trim }}>{% endfor %}"}
    spaced = [{"role": "assistant", "content": "How are "}]
    assert render_chat(trimmed, spaced, continue_final_message=True) == "<How are"
    # named templates: "default"; a {% generation %} block renders its body; unset special
    # tokens are undefined (empty), not "None".
    named = {"chat_template": [{"name": "default", "template": "{{ eos_token }}{% generation %}"
                                "{{ messages[0].content }}{% endgeneration %}"}]}  # fmt: skip
    assert render_chat(named, CHAT) == "Hello world!"


@pytest.mark.parametrize(
    "config, messages, options, match",
    [
        ({}, CHAT, {}, "has no chat_template"),
        ({"chat_template": TINY_TEMPLATE}, [], {}, "non-empty list"),
        ({"chat_template": TINY_TEMPLATE}, [{"role": "user"}], {}, "message 0 .* has no 'content'"),
        ({"chat_template": TINY_TEMPLATE}, [*CHAT, {"role": 1, "content": "x"}], {},
         "message 1 .* non-string 'role'"),
        ({"chat_template": TINY_TEMPLATE}, [*CHAT, "hi"], {}, "message 1 .* not a"),
        ({"chat_template": "{{ raise_exception('roles must alternate') }}"}, CHAT, {},
         "refused the messages: roles must alternate"),
        ({"chat_template": "{% for %}"}, CHAT, {}, "does not parse"),
        ({"chat_template": TINY_TEMPLATE}, CHAT,
         {"add_generation_prompt": True, "continue_final_message": True}, "cannot both"),
        ({"chat_template": "{% for m in messages[:-1] %}{{ m.content }}{% endfor %}"}, PREFILLED,
         {"continue_final_message": True}, "drops part of the final message"),
    ],
)  # fmt: skip
def test_bad_chats_and_templates_are_input_errors(config, messages, options, match):
    with pytest.raises(InputError, match=match):
        render_chat(config, messages, **options)


def test_chats_render_tokenize_and_answer_as_transformers(gpt2, tmp_path):
    tiny = transmuter.pipeline(
        "text-generation",
        _copy(tmp_path, "gen-gpt2", tokenizer_config={"chat_template": TINY_TEMPLATE}),
    )
    # A chat ending with the user's message: a new assistant message; the prompt is the
    # rendered text tokenized without special tokens (the template writes them).
    opened = "<|endoftext|>[user] Hello world!\n[assistant]"  # bos_token, as the template writes
    (answer,) = tiny(CHAT)
    new = gpt2(opened, add_special_tokens=False, return_full_text=False)[0]["generated_text"]
    assert answer == {"generated_text": [*CHAT, {"role": "assistant", "content": new}]}
    assert tiny(CHAT, return_tensors=True) == gpt2(
        opened, add_special_tokens=False, return_tensors=True
    )
    assert tiny(CHAT, return_full_text=False) == [{"generated_text": new}]
    # Ending with the assistant's: its content continued (continue_final_message's default),
    # or a new message after it where continue_final_message=False.
    prefix = "<|endoftext|>[user] Hello world!\n[assistant] How are"
    more = gpt2(prefix, return_full_text=False)[0]["generated_text"]
    assert tiny(PREFILLED) == [
        {"generated_text": [*CHAT, {"role": "assistant", "content": "How are" + more}]}
    ]
    after = gpt2(prefix + "\n[assistant]", return_full_text=False)[0]["generated_text"]
    assert tiny(PREFILLED, continue_final_message=False) == [
        {"generated_text": [*PREFILLED, {"role": "assistant", "content": after}]}
    ]
    # A list of chats (and of chats and strings) answers each; so does a generator of chats.
    assert tiny([CHAT, PREFILLED]) == [tiny(CHAT), tiny(PREFILLED)]
    assert tiny(["Hello", CHAT]) == [gpt2("Hello"), tiny(CHAT)]
    assert list(tiny(iter([CHAT, PREFILLED]))) == [tiny(CHAT), tiny(PREFILLED)]


def test_malformed_chats_are_input_errors(tmp_path):
    tiny = transmuter.pipeline(
        "text-generation",
        _copy(tmp_path, "gen-gpt2", tokenizer_config={"chat_template": TINY_TEMPLATE}),
    )
    with pytest.raises(InputError, match="message 0 of the chat has no 'content'"):
        tiny([{"role": "user"}])
    with pytest.raises(InputError, match="content parts are not taken"):
        tiny([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    with pytest.raises(InputError, match="message 1 of the chat is not a"):
        tiny([[*CHAT, "hi"]])
    with pytest.raises(InputError, match="continue_final_message must be True or False"):
        tiny(CHAT, continue_final_message="yes")
    with pytest.raises(InputError, match=r"a chat \(a list of"):
        tiny([CHAT, 3])
    gpt2 = transmuter.pipeline("text-generation", FIXTURES / "gen-gpt2")
    with pytest.raises(InputError, match="has no chat_template"):
        gpt2(CHAT)
