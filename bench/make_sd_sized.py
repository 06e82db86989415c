"""Export a Stable-Diffusion-1.5-sized repo with random weights to bench/.cache/sd15/ (~3.8 GiB),
in the layout of tests/fixtures/pipelines/tiny-sd (Optimum's ONNX layout), for
bench/bench_text_to_image_ort.py.

    /tmp/torchenv/bin/python bench/make_sd_sized.py            # skips a repo that exists
    /tmp/torchenv/bin/python bench/make_sd_sized.py --force    # rebuild it

Needs torch, diffusers, transformers and onnx (torch 2.13.0+cpu, diffusers 0.42.1, transformers
5.24.0, onnx 1.23.2: the venv /tmp/torchenv); nothing is downloaded. Seeded random weights
(torch's and diffusers' own initialization), the shapes of runwayml/stable-diffusion-v1-5:

- unet/: UNet2DConditionModel with SD 1.5's config (block_out_channels 320/640/1280/1280,
  layers_per_block 2, three CrossAttnDownBlock2D and a DownBlock2D, cross_attention_dim 768,
  attention_head_dim 8, sample_size 64; 859,520,964 parameters). Its 3.4 GB of float32 go to
  unet/model.onnx_data (ONNX external data, one file, as Optimum writes it);
- text_encoder/: CLIPTextModel at CLIP ViT-L/14's text size (hidden 768, intermediate 3072,
  12 layers, 12 heads, 77 positions, quick_gelu) over the small vocabulary below;
- vae_decoder/, vae_encoder/: AutoencoderKL with SD 1.5's config (block_out_channels
  128/256/512/512, 2 layers per block, 4 latent channels, scaling 0.18215: a factor of 8); the
  encoder's log-variance is pinned low as in the tiny fixture;
- tokenizer/: the tiny fixture's byte-level CLIP BPE (its words, a few merges), with
  model_max_length 77; scheduler/ (Euler, SD 1.x's settings), configs, model_index.json.

The exports are make_diffusion.py's: the legacy TorchScript exporter, opset 14, the same
input and output names and dynamic batch, height and width (traced at 256 x 256). About 2
minutes and 8 GB of memory at its peak on two cores (the UNet's trace and external data).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / ".cache" / "sd15"
MAX_LENGTH = 77
SEED = 0
# Above this many bytes of initializers a model's weights go to external data (protobuf's
# limit is 2 GB).
EXTERNAL_BYTES = 1 << 30


def build():
    import make_diffusion
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    vocab, merges = make_diffusion.tokenizer_files()
    pairs = [tuple(m.split(" ")) for m in merges]
    tokenizer = CLIPTokenizer(vocab=vocab, merges=pairs, model_max_length=MAX_LENGTH)
    torch.manual_seed(SEED)
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(vocab),
            hidden_size=768,
            intermediate_size=3072,
            num_hidden_layers=12,
            num_attention_heads=12,
            max_position_embeddings=MAX_LENGTH,
            hidden_act="quick_gelu",
            bos_token_id=vocab["<|startoftext|>"],
            eos_token_id=vocab["<|endoftext|>"],
            pad_token_id=vocab["<|endoftext|>"],
        )
    ).eval()
    torch.manual_seed(SEED + 1)
    unet = UNet2DConditionModel(
        sample_size=64,
        in_channels=4,
        out_channels=4,
        block_out_channels=(320, 640, 1280, 1280),
        layers_per_block=2,
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
        cross_attention_dim=768,
        attention_head_dim=8,
        norm_num_groups=32,
    ).eval()
    torch.manual_seed(SEED + 2)
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(128, 256, 512, 512),
        layers_per_block=2,
        latent_channels=4,
        norm_num_groups=32,
        sample_size=512,
        scaling_factor=0.18215,
    ).eval()
    with torch.no_grad():
        # As make_diffusion.py: the posterior's sample is its mean (image-to-image).
        vae.quant_conv.weight[4:] = 0
        vae.quant_conv.bias[4:] = -40
    return tokenizer, text_encoder, unet, vae, vocab, merges


def export(module, args, path: Path, inputs, outputs, axes) -> None:
    """make_diffusion.py's export; weights over EXTERNAL_BYTES go to one model.onnx_data."""
    import onnx
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        # Over 2 GB the exporter writes a file per tensor; gather them into one below.
        first = Path(scratch) / "model.onnx"
        torch.onnx.export(
            module,
            args,
            str(first),
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=axes,
            opset_version=14,
            dynamo=False,
        )
        proto = onnx.load(str(first))
        size = sum(len(t.raw_data) for t in proto.graph.initializer)
        large = size > EXTERNAL_BYTES
        onnx.save_model(
            proto,
            str(path),
            save_as_external_data=large,
            all_tensors_to_one_file=True,
            location="model.onnx_data",
            size_threshold=1024,
        )
    onnx.checker.check_model(str(path))
    print(f"  {path.relative_to(OUT)}: {size / 2**20:.0f} MiB of weights", flush=True)


def export_all(text_encoder, unet, vae) -> None:
    import make_diffusion
    import torch

    image = {0: "batch_size", 2: "height", 3: "width"}
    latent = {0: "batch_size", 2: "height_latent", 3: "width_latent"}
    export(
        make_diffusion.TextEncoder(text_encoder),
        (torch.zeros(1, MAX_LENGTH, dtype=torch.int32),),
        OUT / "text_encoder" / "model.onnx",
        ["input_ids"],
        ["last_hidden_state", "pooler_output"],
        {
            "input_ids": {0: "batch_size", 1: "sequence_length"},
            "last_hidden_state": {0: "batch_size", 1: "sequence_length"},
            "pooler_output": {0: "batch_size"},
        },
    )
    # Traced at 32 x 32 latents (256 pixels): the graph is the same at every size.
    export(
        make_diffusion.UNet(unet),
        (torch.randn(2, 4, 32, 32), torch.tensor(999.0), torch.randn(2, MAX_LENGTH, 768)),
        OUT / "unet" / "model.onnx",
        ["sample", "timestep", "encoder_hidden_states"],
        ["out_sample"],
        {
            "sample": image,
            "encoder_hidden_states": {0: "batch_size", 1: "sequence_length"},
            "out_sample": image,
        },
    )
    export(
        make_diffusion.VaeDecoder(vae),
        (torch.randn(1, 4, 32, 32),),
        OUT / "vae_decoder" / "model.onnx",
        ["latent_sample"],
        ["sample"],
        {"latent_sample": latent, "sample": image},
    )
    export(
        make_diffusion.VaeEncoder(vae),
        (torch.randn(1, 3, 256, 256),),
        OUT / "vae_encoder" / "model.onnx",
        ["sample"],
        ["latent_parameters"],
        {"sample": image, "latent_parameters": latent},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args()
    if (OUT / "model_index.json").exists() and not args.force:
        print(f"{OUT} exists")
        return
    # Nothing here needs torchvision, and a build that does not match torch's (as one installed
    # in /tmp/torchenv has been: a CUDA wheel beside torch+cpu) fails transformers' imports.
    sys.modules.setdefault("torchvision", None)
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    import make_diffusion  # quiets torch.onnx's, transformers' and diffusers' logging
    import torch

    shutil.rmtree(OUT, ignore_errors=True)
    tokenizer, text_encoder, unet, vae, vocab, merges = build()
    print(f"unet: {sum(p.numel() for p in unet.parameters()):,} parameters", flush=True)
    with torch.no_grad():
        export_all(text_encoder, unet, vae)
    # model_index.json last: its presence says the repo is complete.
    make_diffusion.OUT = OUT
    make_diffusion.write_configs(tokenizer, text_encoder, unet, vae, vocab, merges)
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"wrote {OUT} ({total / 2**30:.2f} GiB)")


if __name__ == "__main__":
    main()
