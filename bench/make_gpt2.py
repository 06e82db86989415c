"""Export a GPT-2-small-sized decoder with random weights to bench/.cache/gpt2-small/ (~0.5 GB).

    /tmp/torchenv/bin/python bench/make_gpt2.py            # skips the export when it exists
    /tmp/torchenv/bin/python bench/make_gpt2.py --force    # rebuild it

Shape of gpt2 (12 layers, hidden 768, 12 heads, 1024 positions, vocab 50257), random weights
from a fixed seed: nothing is downloaded. The repo is the tiny GPT-2 fixture's layout
(tests/fixtures/make_pipelines.py exports it the same way): model.onnx with past key values
and position_ids, at opset 17, beside config.json, generation_config.json and the fixture's
tokenizer.json with a plain token "<id>" added for every id past its own. Needs torch and transformers
(torch 2.13.0+cpu, transformers 5.24.0).
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATH = ROOT / "bench" / ".cache" / "gpt2-small"
FIXTURE = ROOT / "tests" / "fixtures" / "pipelines" / "gpt2"
SEED = 0


def build():
    import torch
    import transformers

    warnings.filterwarnings("ignore")
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    transformers.logging.set_verbosity_error()
    torch.manual_seed(SEED)
    eos = 0  # the fixture tokenizer's <|endoftext|>
    config = transformers.GPT2Config(bos_token_id=eos, eos_token_id=eos,
                                     attn_implementation="eager")  # fmt: skip
    return transformers.GPT2LMHeadModel(config).eval()


def save_tokenizer(vocab_size: int, path: Path) -> None:
    """The fixture's tokenizer with a plain token for every other id, so that each id the
    model picks decodes to text (streaming shows it)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(FIXTURE / "tokenizer.json"))
    tokenizer.add_tokens([f"<{i}>" for i in range(tokenizer.get_vocab_size(), vocab_size)])
    tokenizer.save(str(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true")
    if (PATH / "model.onnx").exists() and not parser.parse_args().force:
        print(f"{PATH} exists")
        return
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    import make_pipelines

    model = build()
    # make_pipelines names the past inputs of its fixtures' layer count.
    make_pipelines.LAYERS = model.config.n_layer
    PATH.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(PATH)
    model.generation_config.save_pretrained(PATH)
    save_tokenizer(model.config.vocab_size, PATH / "tokenizer.json")
    make_pipelines.export_decoder(model, PATH / "model.onnx", with_past=True)
    print(f"wrote {PATH}")


if __name__ == "__main__":
    main()
