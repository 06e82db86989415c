"""Export benchmark models with random weights to bench/.cache/cases/<name>.onnx.

    python bench/make_cases.py                     # builds the missing ones
    python bench/make_cases.py --only yolo,audio1d # just these
    python bench/make_cases.py --force             # rebuild even when a file exists

Cases: resnet50, mobilenet (MobileNetV2), yolo (YOLOv5s-style at 320 px, decoded detections),
vit_small (transformers ViTModel, 384 wide), audio1d (wav2vec2-style conv feature encoder with a
keyword head) and gpt2_step (a hand-written GPT-2-small decode step with past key/values as
explicit inputs and outputs, ~620 MB). Weights come from a fixed seed: nothing is downloaded.
Exported with the legacy TorchScript exporter at opset 17 with a dynamic "batch" axis on every
input and output (gpt2_step adds sequence, past_sequence and total_sequence). Needs torch and
transformers; architectures are plain torch.nn, so no timm or torchvision.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

CASES = Path(__file__).resolve().parent / ".cache" / "cases"
SEED = 0


@dataclass
class Case:
    model: nn.Module
    example: tuple[Tensor, ...]
    inputs: list[str]
    outputs: list[str]
    axes: dict[str, dict[int, str]]


def batch_axes(*names: str) -> dict[str, dict[int, str]]:
    return {name: {0: "batch"} for name in names}


def randomize_norms(model: nn.Module) -> nn.Module:
    # Fresh BatchNorm is an identity in eval mode; random statistics make folding it matter.
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.normal_(0, 0.1)
    return model


def conv_bn(cin: int, cout: int, k: int, s: int = 1, groups: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]


def image_case(model: nn.Module, size: int, name: str, output: str) -> Case:
    example = (torch.randn(1, 3, size, size),)
    return Case(randomize_norms(model), example, [name], [output], batch_axes(name, output))


# ResNet-50 ------------------------------------------------------------------------------------


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(
            *conv_bn(cin, width, 1),
            nn.ReLU(),
            *conv_bn(width, width, 3, stride),  # stride on the 3x3, as torchvision's v1.5
            nn.ReLU(),
            *conv_bn(width, cout, 1),
        )
        needs_proj = stride != 1 or cin != cout
        self.skip = nn.Sequential(*conv_bn(cin, cout, 1, stride)) if needs_proj else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.body(x) + self.skip(x))


def resnet50() -> Case:
    layers: list[nn.Module] = [*conv_bn(3, 64, 7, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for i, (width, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3))):
        for j in range(blocks):
            layers.append(Bottleneck(cin, width, 2 if i > 0 and j == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
    return image_case(nn.Sequential(*layers), 224, "pixel_values", "logits")


# MobileNetV2 ----------------------------------------------------------------------------------


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, t: int) -> None:
        super().__init__()
        hidden = cin * t
        expand = [*conv_bn(cin, hidden, 1), nn.ReLU6()] if t != 1 else []
        self.body = nn.Sequential(
            *expand,
            *conv_bn(hidden, hidden, 3, stride, groups=hidden),
            nn.ReLU6(),
            *conv_bn(hidden, cout, 1),  # linear bottleneck: no activation
        )
        self.residual = stride == 1 and cin == cout

    def forward(self, x: Tensor) -> Tensor:
        return x + self.body(x) if self.residual else self.body(x)


def mobilenet() -> Case:
    table = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1)]
    table += [(6, 160, 3, 2), (6, 320, 1, 1)]
    layers: list[nn.Module] = [*conv_bn(3, 32, 3, 2), nn.ReLU6()]
    cin = 32
    for t, c, n, s in table:
        for i in range(n):
            layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
            cin = c
    layers += [*conv_bn(cin, 1280, 1), nn.ReLU6(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    layers.append(nn.Linear(1280, 1000))
    return image_case(nn.Sequential(*layers), 224, "pixel_values", "logits")


# YOLOv5s --------------------------------------------------------------------------------------


def cbs(cin: int, cout: int, k: int = 1, s: int = 1, p: int | None = None) -> nn.Sequential:
    conv = nn.Conv2d(cin, cout, k, s, k // 2 if p is None else p, bias=False)
    return nn.Sequential(conv, nn.BatchNorm2d(cout), nn.SiLU())


class YoloBottleneck(nn.Module):
    def __init__(self, c: int, shortcut: bool) -> None:
        super().__init__()
        self.body = nn.Sequential(cbs(c, c, 1), cbs(c, c, 3))
        self.shortcut = shortcut

    def forward(self, x: Tensor) -> Tensor:
        return x + self.body(x) if self.shortcut else self.body(x)


class C3(nn.Module):
    def __init__(self, cin: int, cout: int, n: int, shortcut: bool = True) -> None:
        super().__init__()
        hidden = cout // 2
        self.a = nn.Sequential(
            cbs(cin, hidden), *(YoloBottleneck(hidden, shortcut) for _ in range(n))
        )
        self.b = cbs(cin, hidden)
        self.out = cbs(2 * hidden, cout)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(torch.cat([self.a(x), self.b(x)], 1))


class SPPF(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.inp, self.out = cbs(c, c // 2), cbs(c * 2, c)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x: Tensor) -> Tensor:
        y0 = self.inp(x)
        y1 = self.pool(y0)
        y2 = self.pool(y1)
        return self.out(torch.cat([y0, y1, y2, self.pool(y2)], 1))


class Yolo(nn.Module):
    # YOLOv5's default anchors, in pixels, for strides 8, 16, 32.
    ANCHORS = [[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119], [116, 90, 156, 198, 373, 326]]
    STRIDES = (8, 16, 32)

    def __init__(self, size: int = 320, classes: int = 80) -> None:
        super().__init__()
        self.size, self.no = size, classes + 5
        self.p3 = nn.Sequential(
            cbs(3, 32, 6, 2, 2),  # YOLOv5's 6x6 stem, padding 2
            cbs(32, 64, 3, 2),
            C3(64, 64, 1),
            cbs(64, 128, 3, 2),
            C3(128, 128, 2),
        )
        self.p4 = nn.Sequential(cbs(128, 256, 3, 2), C3(256, 256, 3))
        self.p5 = nn.Sequential(cbs(256, 512, 3, 2), C3(512, 512, 1), SPPF(512), cbs(512, 256))
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.td4 = nn.Sequential(C3(512, 256, 1, False), cbs(256, 128))
        self.td3 = C3(256, 128, 1, False)
        self.down3, self.bu4 = cbs(128, 128, 3, 2), C3(256, 256, 1, False)
        self.down4, self.bu5 = cbs(256, 256, 3, 2), C3(512, 512, 1, False)
        self.heads = nn.ModuleList(nn.Conv2d(c, 3 * self.no, 1) for c in (128, 256, 512))

    def decode(self, x: Tensor, i: int) -> Tensor:
        stride = self.STRIDES[i]
        n = self.size // stride
        y = x.reshape(-1, 3, self.no, n, n).permute(0, 1, 3, 4, 2).sigmoid()
        # The grid depends only on the fixed input size, so the exporter folds it to a constant.
        gy, gx = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
        grid = torch.stack([gx, gy], -1).float().reshape(1, 1, n, n, 2) - 0.5
        anchors = torch.tensor(self.ANCHORS[i], dtype=torch.float32).reshape(1, 3, 1, 1, 2)
        xy = (y[..., :2] * 2 + grid) * stride
        wh = (y[..., 2:4] * 2) ** 2 * anchors
        return torch.cat([xy, wh, y[..., 4:]], -1).reshape(-1, 3 * n * n, self.no)

    def forward(self, images: Tensor) -> Tensor:
        p3 = self.p3(images)
        p4 = self.p4(p3)
        h5 = self.p5(p4)
        h4 = self.td4(torch.cat([self.up(h5), p4], 1))
        o3 = self.td3(torch.cat([self.up(h4), p3], 1))
        o4 = self.bu4(torch.cat([self.down3(o3), h4], 1))
        o5 = self.bu5(torch.cat([self.down4(o4), h5], 1))
        outs = [
            self.decode(head(o), i) for i, (head, o) in enumerate(zip(self.heads, (o3, o4, o5)))
        ]
        return torch.cat(outs, 1)


def yolo() -> Case:
    return image_case(Yolo(320), 320, "images", "detections")


# ViT-Small ------------------------------------------------------------------------------------


class LastHiddenState(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, pixel_values: Tensor) -> Tensor:
        return self.inner(pixel_values=pixel_values).last_hidden_state


def vit_small() -> Case:
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.ViTConfig(
        hidden_size=384,
        num_hidden_layers=12,
        num_attention_heads=6,
        intermediate_size=1536,
        image_size=224,
        patch_size=16,
        attn_implementation="eager",
    )
    vit = LastHiddenState(transformers.ViTModel(config, add_pooling_layer=False))
    return image_case(vit, 224, "pixel_values", "last_hidden_state")


# Audio (wav2vec2 feature encoder) -------------------------------------------------------------


class Audio1d(nn.Module):
    def __init__(self, classes: int = 35) -> None:
        super().__init__()
        convs: list[nn.Module] = []
        for i, (k, s) in enumerate(zip((10, 3, 3, 3, 3, 2, 2), (5, 2, 2, 2, 2, 2, 2))):
            convs.append(nn.Conv1d(1 if i == 0 else 512, 512, k, s, bias=False))
            if i == 0:
                convs.append(nn.GroupNorm(512, 512))  # wav2vec2-base normalizes the first only
            convs.append(nn.GELU())
        self.encoder = nn.Sequential(*convs)
        self.norm, self.proj = nn.LayerNorm(512), nn.Linear(512, 768)
        self.classifier = nn.Linear(768, classes)

    def forward(self, input_values: Tensor) -> Tensor:
        features = self.encoder(input_values.unsqueeze(1)).transpose(1, 2)  # [batch, time, 512]
        return self.classifier(self.proj(self.norm(features)).mean(1))


def audio1d() -> Case:
    example = (torch.randn(1, 16000),)
    return Case(
        Audio1d(), example, ["input_values"], ["logits"], batch_axes("input_values", "logits")
    )


# GPT-2 decode step ----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU("tanh"), nn.Linear(4 * d, d))

    def forward(
        self, x: Tensor, mask: Tensor, past_k: Tensor, past_v: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        b, s, d = x.shape
        q, k, v = (
            t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)
            for t in self.c_attn(self.ln_1(x)).split(d, -1)
        )
        k, v = torch.cat([past_k, k], 2), torch.cat([past_v, v], 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads) + mask
        attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, d)
        x = x + self.c_proj(attn)
        return x + self.mlp(self.ln_2(x)), k, v


class Gpt2Step(nn.Module):
    def __init__(self, layers: int = 12, d: int = 768, heads: int = 12) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(50257, d), nn.Embedding(1024, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for m in self.modules():
            if isinstance(m, nn.Linear | nn.Embedding):
                nn.init.normal_(m.weight, 0, 0.02)

    def forward(
        self, input_ids: Tensor, position_ids: Tensor, attention_mask: Tensor, *past: Tensor
    ) -> tuple[Tensor, ...]:
        x = self.wte(input_ids) + self.wpe(position_ids)
        presents: list[Tensor] = []
        for i, block in enumerate(self.blocks):
            x, k, v = block(x, attention_mask, past[2 * i], past[2 * i + 1])
            presents += [k, v]
        # lm_head tied to wte. The exporter folds the transpose into a second 147 MiB copy of the
        # table, as exports of GPT-2 do; an Einsum on the table itself would keep one copy, but
        # ORT's Einsum transposes it on every call (99 ms a token against 26 ms for ours).
        logits = self.ln_f(x) @ self.wte.weight.T
        return (logits, *presents)


def gpt2_step(past_len: int = 8) -> Case:
    model = Gpt2Step()
    layers = len(model.blocks)
    pasts = [f"past_{kv}_{i}" for i in range(layers) for kv in ("key", "value")]
    presents = [f"present_{kv}_{i}" for i in range(layers) for kv in ("key", "value")]
    tokens = {0: "batch", 1: "sequence"}
    axes = {"input_ids": tokens, "position_ids": tokens, "logits": tokens}
    axes["attention_mask"] = {0: "batch", 2: "sequence", 3: "total_sequence"}
    axes |= {name: {0: "batch", 2: "past_sequence"} for name in pasts}
    axes |= {name: {0: "batch", 2: "total_sequence"} for name in presents}
    example = (
        torch.tensor([[464]]),
        torch.tensor([[past_len]]),
        torch.zeros(1, 1, 1, past_len + 1),
        *(torch.randn(1, 12, past_len, 64) for _ in pasts),
    )
    inputs = ["input_ids", "position_ids", "attention_mask", *pasts]
    return Case(model, example, inputs, ["logits", *presents], axes)


BUILDERS: dict[str, Callable[[], Case]] = {
    f.__name__: f for f in (resnet50, mobilenet, yolo, vit_small, audio1d, gpt2_step)
}


def build_and_export(name: str, path: Path) -> None:
    import onnx

    torch.manual_seed(SEED)
    case = BUILDERS[name]()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.onnx")
    with torch.no_grad():
        torch.onnx.export(
            case.model.eval(),
            case.example,
            str(tmp),
            dynamo=False,
            opset_version=17,
            input_names=case.inputs,
            output_names=case.outputs,
            dynamic_axes=case.axes,
            do_constant_folding=True,
        )
        outs = case.model(*case.example)
    outs = outs if isinstance(outs, tuple) else (outs,)
    model = onnx.load(str(tmp))
    # The exporter leaves static dims it cannot infer symbolic (yolo's 6300 becomes
    # "Concatdetections_dim_1"); pin every axis not declared dynamic to the example's size.
    for out, value in zip(model.graph.output, outs):
        for axis, dim in enumerate(out.type.tensor_type.shape.dim):
            if axis not in case.axes.get(out.name, {}):
                dim.dim_value = value.shape[axis]
    # One self-contained file: the largest case (gpt2_step) is well under protobuf's 2 GB limit.
    onnx.save(model, str(path), save_as_external_data=False)
    tmp.unlink()
    for leftover in path.parent.glob(tmp.name + ".data"):
        leftover.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if a file exists")
    parser.add_argument("--only", help=f"comma-separated subset of: {','.join(BUILDERS)}")
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else list(BUILDERS)
    unknown = [name for name in names if name not in BUILDERS]
    if unknown:
        parser.error(f"unknown case(s) {','.join(unknown)}; choose from {','.join(BUILDERS)}")

    warnings.filterwarnings("ignore")
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    for name in names:
        path = CASES / f"{name}.onnx"
        if path.exists() and not args.force:
            print(f"{path} exists; skipping (use --force to rebuild)")
            continue
        start = time.perf_counter()
        build_and_export(name, path)
        took = time.perf_counter() - start
        print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB, {took:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
