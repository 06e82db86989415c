"""Export a DETR-ResNet-50-sized detector and a SAM-ViT-B-sized segmenter with random weights to
bench/.cache/detr-r50/ (~170 MB) and bench/.cache/sam-vit-b/ (~380 MB), for bench_tasks.py.

    /tmp/torchenv/bin/python bench/make_vision_large.py            # skips a repo that exists
    /tmp/torchenv/bin/python bench/make_vision_large.py --force    # rebuild them

Random weights from fixed seeds (transformers' own initialization): nothing is downloaded. Each
repo has the layout of its tiny fixture, exported by the fixtures' own helpers:

- detr-r50/ (tests/fixtures/make_detection.py's): DetrForObjectDetection of the shape of
  facebook/detr-resnet-50 without timm (use_timm_backbone=False, a transformers ResNetConfig of
  ResNet-50: stem 64, bottleneck stages of 3, 4, 6, 3 blocks, 256 to 2048 channels), d_model
  256, 6 encoder and 6 decoder layers, 8 heads, 100 queries, COCO's 91 labels;
  DetrImageProcessor's config with shortest edge 800 and longest 1333; model.onnx takes
  pixel_values and pixel_mask of dynamic batch, height and width.
- sam-vit-b/ (tests/fixtures/make_sam.py's transformers.js layout): SamModel of
  facebook/sam-vit-base's shape (hidden 768, 12 layers, 12 heads, global attention at layers 2,
  5, 8 and 11, windows of 14, patches of 16 on 1024 x 1024, 256 output channels; the default
  prompt encoder and mask decoder); SamProcessor's config with longest edge 1024, padded to 1024 x
  1024; onnx/vision_encoder.onnx and onnx/prompt_encoder_mask_decoder.onnx (points only).

Needs torch and transformers (torch 2.13.0+cpu, transformers 5.24.0, onnx; no timm). A few
minutes on two cores.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "bench" / ".cache"
SEED = 0
# facebook/detr-resnet-50's id2label: COCO's 91 category ids, "N/A" where COCO 2017 has none.
COCO = (
    "N/A person bicycle car motorcycle airplane bus train truck boat traffic_light fire_hydrant "
    "N/A stop_sign parking_meter bench bird cat dog horse sheep cow elephant bear zebra giraffe "
    "N/A backpack umbrella N/A N/A handbag tie suitcase frisbee skis snowboard sports_ball kite "
    "baseball_bat baseball_glove skateboard surfboard tennis_racket bottle N/A wine_glass cup fork "
    "knife spoon bowl banana apple sandwich orange broccoli carrot hot_dog pizza donut cake chair "
    "couch potted_plant bed N/A dining_table N/A N/A toilet N/A tv laptop mouse remote keyboard "
    "cell_phone microwave oven toaster sink refrigerator N/A book clock vase scissors teddy_bear "
    "hair_drier toothbrush"
).split()


def detr(folder: Path) -> None:
    import make_detection
    import torch
    import transformers

    labels = {i: name.replace("_", " ") for i, name in enumerate(COCO)}
    backbone = transformers.ResNetConfig(
        embedding_size=64,
        hidden_sizes=[256, 512, 1024, 2048],
        depths=[3, 4, 6, 3],
        layer_type="bottleneck",
        out_features=["stage4"],
    )
    config = transformers.DetrConfig(
        use_timm_backbone=False,
        backbone_config=backbone,
        use_pretrained_backbone=False,
        d_model=256,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=2048,
        decoder_ffn_dim=2048,
        num_queries=100,
        id2label=labels,
        label2id={v: k for k, v in labels.items() if v != "N/A"},
    )
    torch.manual_seed(SEED)
    model = transformers.DetrForObjectDetection(config).eval()
    processor = transformers.DetrImageProcessorPil(
        size={"shortest_edge": 800, "longest_edge": 1333}
    )
    make_detection.OUT = folder.parent
    make_detection.folder_for(folder.name, model, processor, "DetrImageProcessor")
    batch, height, width = "batch_size", "height", "width"
    make_detection.export(
        make_detection.Detector(model, mask=True),
        [torch.randn(1, 3, 800, 1066), torch.ones(1, 800, 1066, dtype=torch.int64)],
        folder / "model.onnx",
        ["pixel_values", "pixel_mask"],
        ["logits", "pred_boxes"],
        {
            "pixel_values": {0: batch, 2: height, 3: width},
            "pixel_mask": {0: batch, 1: height, 2: width},
            "logits": {0: batch},
            "pred_boxes": {0: batch},
        },
    )


def sam(folder: Path) -> None:
    import make_sam
    import torch
    import transformers

    vision = transformers.SamVisionConfig(
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        global_attn_indexes=[2, 5, 8, 11],
        window_size=14,
        image_size=1024,
        patch_size=16,
        output_channels=256,
        mlp_dim=3072,
    )
    config = transformers.SamConfig(vision_config=vision.to_dict(), attn_implementation="eager")
    torch.manual_seed(SEED)
    model = transformers.SamModel(config).eval()
    processor = transformers.SamProcessor(
        transformers.SamImageProcessorPil(
            size={"longest_edge": 1024}, pad_size={"height": 1024, "width": 1024}
        )
    )
    make_sam.OUT, make_sam.SIZE = folder.parent, 1024
    make_sam.write_repo(folder.name, model, processor, boxes=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    import make_detection  # noqa: F401  (quiets torch.onnx's and transformers' logging)

    for name, build, done in [
        ("detr-r50", detr, "model.onnx"),
        ("sam-vit-b", sam, "onnx/prompt_encoder_mask_decoder.onnx"),
    ]:
        folder = CACHE / name
        if (folder / done).exists() and not args.force:
            print(f"{folder} exists")
            continue
        build(folder)
        print(f"wrote {folder}")


if __name__ == "__main__":
    main()
