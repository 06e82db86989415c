"""Stream text from a tiny random-weight Llama (tests/fixtures/make_pipelines.py made it, in
Optimum's layout), greedy, then a batch of prompts of different lengths, and count programs.

Run: python examples/generate.py
"""

from pathlib import Path

import transmuter

REPO = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "pipelines" / "llama"


def main() -> None:
    generate = transmuter.pipeline("text-generation", REPO, max_new_tokens=32)
    # The weights are random, so the text is too: byte-level pieces, not words.
    stream = generate.generate(
        [generate.tokenizer.encode("Once upon a time").ids],
        on_token=lambda row, text: print(f"{text!r}", end=" ", flush=True),
    )
    print()
    print("token ids:", stream[0])
    batch = generate(["Hello", "The capital of France is", "A tiny model writes"])
    for rows in batch:
        print(repr(rows[0]["generated_text"][:60]))
    print("programs compiled:", generate.programs)


if __name__ == "__main__":
    main()
