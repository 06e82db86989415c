"""ImageDecoder: the bytes of an encoded image to a uint8 [H, W, C] tensor, decoded with Pillow.

The output shape depends on the image, so the op runs on the host (`data_dependent=True`); under
`transmuter.compile` it is a graph break. Pillow is an optional dependency (`transmuter[image]`), imported when the op
first runs, so that models without images never need it.

Where the spec leaves choices open, this follows Pillow (as onnx.reference does; ONNX Runtime
1.32 has no ImageDecoder kernel to compare with):
- Grayscale is ITU-R 601-2 luma of the decoded RGB, (19595 R + 38470 G + 7471 B + 2^15) >> 16.
  OpenCV's fixed-point version of the same weights gives values 1 apart for 0.23% of colours,
  and OpenCV decodes a colour JPEG straight to its luma plane, which also differs slightly.
- An alpha channel is dropped (not blended), a palette is expanded, 16-bit grayscale keeps its
  high byte (as libpng's strip_16 does), the first frame of a multi-frame file is decoded, and
  EXIF orientation is not applied.
- JPEG chroma is upsampled by libjpeg-turbo's default "fancy" upsampling, the method the spec
  describes.
"""

from __future__ import annotations

import io

import numpy as np

from transmuter.errors import ShapeError, TransmuterError
from transmuter.lowering import op

_CHANNELS = {"RGB": 3, "BGR": 3, "Grayscale": 1}


def _pillow():
    try:
        from PIL import Image
    except ImportError:
        raise TransmuterError(
            "ImageDecoder decodes images with Pillow, which is not installed: pip install pillow"
        ) from None
    return Image


@op("ImageDecoder", since=20, data_dependent=True)
def image_decoder(encoded_stream, *, pixel_format="RGB"):
    """ONNX ImageDecoder-20: decode a JPEG/PNG/BMP/TIFF/WebP/... byte stream to uint8 [H, W, C]."""
    if pixel_format not in _CHANNELS:
        raise ValueError(
            f"ImageDecoder pixel_format must be RGB, BGR or Grayscale, got {pixel_format!r}"
        )
    if encoded_stream.ndim != 1 or encoded_stream.dtype != np.uint8:
        raise ShapeError(
            "ImageDecoder input encoded_stream must be 1-D uint8 (the file's bytes), got "
            f"{encoded_stream.dtype.name}{list(encoded_stream.shape)}"
        )
    Image = _pillow()
    try:
        with Image.open(io.BytesIO(encoded_stream.tobytes())) as image:
            image.load()
            pixels = _to_8bit(Image, image).convert("L" if pixel_format == "Grayscale" else "RGB")
    except (OSError, SyntaxError, ValueError, EOFError):
        # The spec: a stream that cannot be decoded (corrupt, unknown format) gives an empty
        # matrix. Pillow reports such streams with these types (SyntaxError for some headers).
        return np.zeros((0, 0, _CHANNELS[pixel_format]), dtype=np.uint8)
    decoded = np.asarray(pixels, dtype=np.uint8)
    if pixel_format == "Grayscale":
        return decoded[:, :, None]
    return np.ascontiguousarray(decoded[:, :, ::-1]) if pixel_format == "BGR" else decoded


def _to_8bit(Image, image):
    """Pillow's own conversion clips 16-bit grayscale to 255; keep the high byte instead."""
    if image.mode.startswith("I;16"):
        high = (np.asarray(image).astype(np.uint32) >> 8).astype(np.uint8)
        return Image.fromarray(high)
    if image.mode in ("I", "F"):
        raise TransmuterError(
            f"ImageDecoder cannot reduce a {image.mode!r} image (32-bit integer or float "
            "pixels) to uint8: no conversion is defined for it"
        )
    return image
