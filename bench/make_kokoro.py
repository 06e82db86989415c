"""Export a Kokoro-82M-sized TTS model with random weights, float and int8, to bench/.cache/.

    python3 -m venv /tmp/kokoroenv
    /tmp/kokoroenv/bin/pip install torch==2.13.0 onnx onnxruntime attrs loguru \\
        huggingface_hub transformers numpy scipy
    /tmp/kokoroenv/bin/pip install --no-deps kokoro==0.9.4
    OMP_NUM_THREADS=1 /tmp/kokoroenv/bin/python bench/make_kokoro.py           # skips existing
    OMP_NUM_THREADS=1 /tmp/kokoroenv/bin/python bench/make_kokoro.py --force   # rebuild

Builds the `kokoro` package's KModel with hexgrad/Kokoro-82M's config.json written out below
(ALBERT PL-BERT 12 layers / hidden 768, prosody predictor, text encoder, iSTFTNet decoder; 81.8M
parameters), random weights from a fixed seed: nothing is downloaded (KModel gets an empty state
dict file, so it never calls hf_hub_download and keeps its seeded initialisation). The duration
head's bias is set so that a token lasts 4 frames (100 ms) rather than random weights' ~25.
`kokoro` is installed without its dependencies because its G2P front end (misaki, spacy, espeak)
is not needed: the script stubs the `misaki` import.

Writes:

- bench/.cache/kokoro.onnx: float32, the way kokoro-onnx users get it: torch.onnx.export (legacy
  TorchScript exporter), opset 20, KModel(disable_complex=True) so that nothing is complex, the
  analysis STFT as torch.stft (an ONNX STFT node, as in the real file), weight norm folded;
  inputs input_ids int64 [1, T], style float32 [1, 256], speed float32 [1]; outputs waveform
  float32 [samples] and duration int64 [T] (frames of 600 samples per token); T and the audio
  length are dynamic (the token-to-frame expansion is data dependent). Names and settings follow
  Kokoro's own ONNX export script.
- bench/.cache/kokoro-int8.onnx: onnxruntime.quantization.quantize_dynamic of the above with int8
  weights: MatMul -> MatMulInteger, Conv -> ConvInteger, LSTM -> DynamicQuantizeLSTM, each fed by
  DynamicQuantizeLinear; this is the layout of kokoro-onnx's kokoro-v1.0.int8.onnx.

Prints the parameter count and the op histogram of the int8 file.
"""

from __future__ import annotations

import argparse
import collections
import logging
import sys
import types
import warnings
from pathlib import Path

CACHE = Path(__file__).resolve().parent / ".cache"
FLOAT_PATH = CACHE / "kokoro.onnx"
INT8_PATH = CACHE / "kokoro-int8.onnx"
SEED = 0
INPUTS = ["input_ids", "style", "speed"]
OUTPUTS = ["waveform", "duration"]
# Ops that tell the int8 Kokoro graph apart, with their counts in the real kokoro-v1.0.int8.onnx
# where known (3,614 nodes in all).
REAL_COUNTS = {"ConvInteger": 87, "MatMulInteger": 148}
WATCHED = [
    "MatMulInteger",
    "ConvInteger",
    "DynamicQuantizeLinear",
    "DynamicQuantizeLSTM",
    "STFT",
    "Atan",
    "NonZero",
    "Range",
    "Loop",  # torch's repeat_interleave by the durations: where Transmuter breaks the graph
    "LSTM",
    "ConvTranspose",
]

# hexgrad/Kokoro-82M config.json, without the vocab (made up below).
CONFIG = {
    "n_token": 178,
    "hidden_dim": 512,
    "style_dim": 128,
    "n_layer": 3,
    "max_dur": 50,
    "dim_in": 64,
    "max_conv_dim": 512,
    "n_mels": 80,
    "dropout": 0.2,
    "text_encoder_kernel_size": 5,
    "multispeaker": True,
    "plbert": {
        "hidden_size": 768,
        "num_attention_heads": 12,
        "intermediate_size": 2048,
        "max_position_embeddings": 512,
        "num_hidden_layers": 12,
        "dropout": 0.1,
    },
    "istftnet": {
        "upsample_kernel_sizes": [20, 12],
        "upsample_rates": [10, 6],
        "gen_istft_hop_size": 5,
        "gen_istft_n_fft": 20,
        "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
        "resblock_kernel_sizes": [3, 7, 11],
        "upsample_initial_channel": 512,
    },
}

# Random weights make the duration head predict about max_dur / 2 = 25 frames (0.6 s) per token,
# 6x longer audio than real speech. A bias on its logits brings it to about 4 frames per token
# (100 ms per phoneme), so the decoder runs on a realistic number of frames.
DURATION_BIAS = -2.5


def stub_misaki() -> None:
    """Let `import kokoro` succeed without misaki (the G2P front end KPipeline imports)."""

    def missing(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})

    package = sys.modules.setdefault("misaki", types.ModuleType("misaki"))
    for name in ("en", "espeak"):
        module = types.ModuleType(f"misaki.{name}")
        module.__getattr__ = missing  # any class it names (en.MToken in annotations)
        setattr(package, name, sys.modules.setdefault(module.__name__, module))


def build():
    import torch

    stub_misaki()
    from kokoro import KModel

    warnings.filterwarnings("ignore")
    torch.manual_seed(SEED)
    # Any 178-symbol mapping will do: the model only sees token ids.
    config = dict(CONFIG, vocab={chr(0x100 + i): i for i in range(1, CONFIG["n_token"])})
    empty = CACHE / "kokoro-empty.pth"
    empty.parent.mkdir(parents=True, exist_ok=True)
    torch.save({}, empty)  # no weights to load: keep the seeded initialisation
    model = KModel(
        repo_id="hexgrad/Kokoro-82M", config=config, model=str(empty), disable_complex=True
    )
    empty.unlink()
    with torch.no_grad():
        model.predictor.duration_proj.linear_layer.bias.fill_(DURATION_BIAS)
    remove_weight_norm(model)
    analysis_as_stft_op(model.decoder.generator.stft)
    return model.eval()


def analysis_as_stft_op(stft) -> None:
    """Compute the harmonic source's STFT with torch.stft, which exports as an ONNX STFT node.

    kokoro 0.9.4's CustomSTFT (disable_complex=True) computes it as two strided Convs with cosine
    and sine kernels; kokoro-v1.0.int8.onnx has an STFT node there (and so two ConvIntegers
    fewer). Real-valued in and out (return_complex=False), so the legacy exporter takes it; the
    magnitude, atan2 phase and its quadrant fix are CustomSTFT's. The inverse STFT stays
    CustomSTFT's ConvTranspose pair, as in the real file.
    """
    import torch

    def transform(waveform):
        spectrum = torch.stft(
            waveform,
            stft.n_fft,
            stft.hop_length,
            stft.win_length,
            window=stft.window,
            center=stft.center,
            pad_mode=stft.pad_mode,
            return_complex=False,
        )
        real, imag = spectrum[..., 0], spectrum[..., 1]
        magnitude = torch.sqrt(real**2 + imag**2 + 1e-14)
        phase = torch.atan2(imag, real)
        phase[(imag == 0) & (real < 0)] = torch.pi  # ONNX's atan2 pattern gives -pi there
        return magnitude, phase

    stft.transform = transform


def remove_weight_norm(module) -> None:
    """Fold weight_norm's g * v / |v| into plain weights, as Kokoro's own export script does.

    Otherwise each Conv's weight is computed in the graph, and quantize_dynamic, which needs
    weights as initializers, leaves those Convs in float.
    """
    import torch

    for child in module.children():
        if hasattr(child, "weight_v"):
            torch.nn.utils.remove_weight_norm(child)
        else:
            remove_weight_norm(child)


def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def export(model, path: Path) -> None:
    import onnx
    import torch
    from kokoro.model import KModelForONNX

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    generator = torch.Generator().manual_seed(SEED)
    tokens = torch.randint(1, CONFIG["n_token"], (1, 24), generator=generator)
    tokens[0, 0] = tokens[0, -1] = 0  # KModel.forward pads utterances with token 0
    style = torch.randn(1, 256, generator=generator)
    speed = torch.ones(1)
    axes = {"input_ids": {1: "tokens"}, "waveform": {0: "samples"}, "duration": {0: "tokens"}}
    tmp = path.with_suffix(".tmp.onnx")
    with torch.no_grad():
        torch.onnx.export(
            KModelForONNX(model).eval(),
            (tokens, style, speed),
            str(tmp),
            dynamo=False,
            opset_version=20,
            input_names=INPUTS,
            output_names=OUTPUTS,
            dynamic_axes=axes,
            do_constant_folding=True,
        )
    onnx.save(onnx.load(str(tmp)), str(path), save_as_external_data=False)
    tmp.unlink()
    for leftover in path.parent.glob(tmp.name + ".data"):
        leftover.unlink()


def quantize(source: Path, path: Path) -> None:
    from onnxruntime.quantization import QuantType, quant_pre_process, quantize_dynamic

    logging.getLogger().setLevel(logging.ERROR)
    # ORT's recommended preparation, as in Kokoro's export script: graph optimizations (which also
    # drop the Identity nodes through which ALBERT's shared layers reach their weights, so that
    # those MatMuls see initializers) and ONNX shape inference.
    prepared = path.with_suffix(".pre.onnx")
    quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
    quantize_dynamic(
        str(prepared),
        str(path),
        op_types_to_quantize=["MatMul", "Conv", "LSTM"],
        weight_type=QuantType.QInt8,
    )
    prepared.unlink()


def histogram(path: Path) -> collections.Counter:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return collections.Counter(node.op_type for node in graph.node)


def report(path: Path) -> None:
    counts = histogram(path)
    print(f"{path.name}: {sum(counts.values())} nodes (real kokoro-v1.0.int8.onnx: 3614)")
    for op in WATCHED:
        real = REAL_COUNTS.get(op)
        print(f"  {op:22s} {counts.get(op, 0):5d}" + (f"   (real: {real})" if real else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if the files exist")
    args = parser.parse_args(argv)
    if args.force or not FLOAT_PATH.exists():
        model = build()
        print(f"parameters: {parameter_count(model):,}")
        export(model, FLOAT_PATH)
        print(f"wrote {FLOAT_PATH} ({FLOAT_PATH.stat().st_size / 2**20:.1f} MiB)")
    if args.force or not INT8_PATH.exists():
        quantize(FLOAT_PATH, INT8_PATH)
        print(f"wrote {INT8_PATH} ({INT8_PATH.stat().st_size / 2**20:.1f} MiB)")
    else:
        print(f"{INT8_PATH} exists; skipping (use --force to rebuild)")
    report(INT8_PATH)
    return 0


if __name__ == "__main__":
    sys.exit(main())
