"""Export a Whisper-tiny-sized encoder-decoder with random weights to bench/.cache/whisper-tiny/.

    /tmp/torchenv/bin/python bench/make_whisper_tiny.py            # skips it when it exists
    /tmp/torchenv/bin/python bench/make_whisper_tiny.py --force    # rebuild it

Shape of openai/whisper-tiny (d_model 384, 4 + 4 layers of 6 heads, feed-forward 1536, 80 mel
bins, vocabulary 51865, 30 s of audio: 1500 encoder positions, 448 decoder positions), random
weights from a fixed seed: nothing is downloaded (~0.3 GB). The repo is the tiny Whisper
fixture's layout (tests/fixtures/make_pipelines.py's `export_seq2seq`): encoder_model.onnx,
decoder_model.onnx and decoder_with_past_model.onnx, with the fixture's tokenizer.json and
generation_config.json (its special tokens) and a feature extractor of 30-second chunks. The
tokenizer covers the fixture's ids only: `generate` returns ids, which is what the benchmark
reads. Needs torch and transformers (torch 2.13.0+cpu, transformers 5.24.0).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATH = ROOT / "bench" / ".cache" / "whisper-tiny"
FIXTURE = ROOT / "tests" / "fixtures" / "pipelines" / "whisper"
SEED = 0


def build():
    import torch
    import transformers

    warnings.filterwarnings("ignore")
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    transformers.logging.set_verbosity_error()
    generation = json.loads((FIXTURE / "generation_config.json").read_text())
    eot = generation["eos_token_id"]
    config = transformers.WhisperConfig(
        vocab_size=51865,
        num_mel_bins=80,
        d_model=384,
        encoder_layers=4,
        decoder_layers=4,
        encoder_attention_heads=6,
        decoder_attention_heads=6,
        encoder_ffn_dim=1536,
        decoder_ffn_dim=1536,
        max_source_positions=1500,
        max_target_positions=448,
        pad_token_id=eot,
        bos_token_id=eot,
        eos_token_id=eot,
        decoder_start_token_id=generation["decoder_start_token_id"],
        attn_implementation="eager",
    )
    torch.manual_seed(SEED)
    return transformers.WhisperForConditionalGeneration(config).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true")
    if (PATH / "encoder_model.onnx").exists() and not parser.parse_args().force:
        print(f"{PATH} exists")
        return
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    import make_pipelines

    model = build()
    make_pipelines.LAYERS = model.config.decoder_layers  # it names the pasts of this many
    PATH.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(PATH)
    for name in ("generation_config.json", "tokenizer.json"):
        shutil.copy(FIXTURE / name, PATH / name)
    features = json.loads((FIXTURE / "preprocessor_config.json").read_text())
    features.update(chunk_length=30, n_samples=480000, nb_max_frames=3000)
    (PATH / "preprocessor_config.json").write_text(json.dumps(features, indent=2))
    make_pipelines.export_seq2seq(model, PATH, merged=False, audio=True)
    print(f"wrote {PATH}")


if __name__ == "__main__":
    main()
