"""transformers' text-generation, text2text-generation, summarization and translation call forms
replayed on Optimum's exports of GPT-2, Llama, Qwen2, Phi-3 (model.onnx with past) and T5, BART
(encoder + merged decoder); tests/fixtures/differential/make_generation.py records them."""

from __future__ import annotations

import pytest
from replay import cases, check, check_transformers_js

DECODERS = ("gen-gpt2", "gen-llama", "gen-qwen2", "gen-phi3")
SEQ2SEQ = ("gen-t5", "gen-bart")

REFUSED: dict[str, str] = {
    "gen-llama/stop-sequence": "stop_sequence here holds U+FFFD (a word of a byte-level answer cut inside a character): transmuter matches stop strings on the decoded text, where the replacement character appears, and stops; transformers' stop_strings match the tokens' own strings, which never hold it, so it runs on",
    "gen-qwen2/stop-sequence": "stop_sequence here holds U+FFFD (a word of a byte-level answer cut inside a character): transmuter matches stop strings on the decoded text, where the replacement character appears, and stops; transformers' stop_strings match the tokens' own strings, which never hold it, so it runs on",
    "gen-gpt2/batch-size": "kept: transformers refuses batch_size > 1 where the tokenizer has no pad token (its tokenizer pads the batch); transmuter pads inside the decoder with a masked id and answers, as it answers a list at the pipeline's batch_size",
    "gen-phi3/stop-sequence": "stop_sequence here holds U+FFFD (a word of a byte-level answer cut inside a character): transmuter matches stop strings on the decoded text, where the replacement character appears, and stops; transformers' stop_strings match the tokens' own strings, which never hold it, so it runs on",
}


_CASES = cases(*DECODERS, *SEQ2SEQ, refused=REFUSED)


@pytest.mark.parametrize("repo, call", [c for c in _CASES if c.values[0] in DECODERS])
def test_call(repo, call):
    check(repo, call)


# The encoder-decoders' "past" decoding compiles a program per token: minutes on a loaded CPU.
@pytest.mark.slow
@pytest.mark.parametrize("repo, call", [c for c in _CASES if c.values[0] in SEQ2SEQ])
def test_seq2seq_call(repo, call):
    check(repo, call)


@pytest.mark.parametrize("repo", DECODERS + SEQ2SEQ)
def test_transformers_js_layout(repo, tmp_path):
    check_transformers_js(repo, tmp_path)
