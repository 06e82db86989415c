"""Export a MiniLM-sized BERT with random weights to bench/.cache/minilm.onnx (~90 MB).

    python bench/make_minilm.py            # skips the export when the file exists
    python bench/make_minilm.py --force    # rebuild it

Shape of all-MiniLM-L6-v2 (6 layers, hidden 384, 12 heads, intermediate 1536, vocab 30522, 512
positions), but random weights from a fixed seed: nothing is downloaded. Exported with the legacy
TorchScript exporter at opset 17 with dynamic batch and sequence axes; inputs input_ids,
attention_mask, token_type_ids; output last_hidden_state. Needs torch and transformers.

Also writes the same weights as a state dict to bench/.cache/minilm_weights.npz (torch names,
Linear weights [out, in]), which bench/bench_cases.py's hand-written JAX BERT reads. The seed
makes both files from one model, so either can be rebuilt alone.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path

CACHE = Path(__file__).resolve().parent / ".cache"
PATH = CACHE / "minilm.onnx"
WEIGHTS = CACHE / "minilm_weights.npz"
INPUTS = ["input_ids", "attention_mask", "token_type_ids"]
SEED = 0


def build():
    import torch
    import transformers

    warnings.filterwarnings("ignore")
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    transformers.logging.set_verbosity_error()

    torch.manual_seed(SEED)
    config = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
        type_vocab_size=2,
        attn_implementation="eager",
    )
    return transformers.BertModel(config, add_pooling_layer=False).eval()


def save_weights(bert, path: Path) -> None:
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **{name: t.detach().numpy() for name, t in bert.state_dict().items()})


def export(bert, path: Path) -> None:
    import onnx
    import torch

    config = bert.config

    class LastHiddenState(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.inner(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            )
            return out.last_hidden_state

    generator = torch.Generator().manual_seed(SEED)
    batch, seq = 2, 16
    example = (
        torch.randint(0, config.vocab_size, (batch, seq), generator=generator),
        torch.ones(batch, seq, dtype=torch.int64),
        torch.zeros(batch, seq, dtype=torch.int64),
    )
    axes = {name: {0: "batch", 1: "sequence"} for name in [*INPUTS, "last_hidden_state"]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.onnx")
    with torch.no_grad():
        torch.onnx.export(
            LastHiddenState(bert),
            example,
            str(tmp),
            dynamo=False,
            opset_version=17,
            input_names=INPUTS,
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            do_constant_folding=True,
        )
    # One self-contained file (the weights fit well under protobuf's 2 GB limit).
    onnx.save(onnx.load(str(tmp)), str(path), save_as_external_data=False)
    tmp.unlink()
    for leftover in path.parent.glob(tmp.name + ".data"):
        leftover.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if the file exists")
    args = parser.parse_args(argv)
    writers = ((PATH, export), (WEIGHTS, save_weights))
    todo = [(path, write) for path, write in writers if args.force or not path.exists()]
    if not todo:
        print(f"{PATH} and {WEIGHTS} exist; skipping (use --force to rebuild)")
        return 0
    bert = build()
    for path, write in todo:
        write(bert, path)
        print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
