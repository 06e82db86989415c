"""ImageDecoder against the pixels encoded, onnx.reference and the spec's own test data.

ONNX Runtime 1.32 has no ImageDecoder kernel, so the references are: the image itself for
lossless formats, onnx.reference (Pillow too) for JPEG and grayscale, and the frozen outputs of
the ONNX backend tests.
"""

import io
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.backend.test.case.node import _image_decoder_data as spec_data
from opcheck import assert_close, check_node, make_node_model, transmuter_runs
from PIL import Image

import transmuter
from transmuter.errors import TransmuterError

rng = np.random.default_rng(0)
PIXELS = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)


def encode(image, fmt, **options) -> np.ndarray:
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return np.frombuffer(buffer.getvalue(), dtype=np.uint8).copy()


def luma(rgb: np.ndarray) -> np.ndarray:
    """ITU-R 601-2 luma in Pillow's fixed point, [H, W, 1]."""
    r, g, b = (rgb[..., i].astype(np.uint32) for i in range(3))
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).astype(np.uint8)[..., None]


def decode(stream, pixel_format="RGB", *, compiled=True):
    """Transmuter's output, eager and compiled, which must agree."""
    inputs = {"encoded_stream": stream}
    model = make_node_model("ImageDecoder", inputs, {"pixel_format": pixel_format}, opset=20)
    runs = transmuter_runs(model, inputs, compiled=compiled, eager=True)
    eager = np.asarray(runs["eager"][0])
    for mode, (out,) in runs.items():
        assert_close(out, eager, rtol=0, atol=0, what=f"ImageDecoder ({mode})")
    return eager


LOSSLESS = [("PNG", {}), ("BMP", {}), ("TIFF", {}), ("WEBP", {"lossless": True}), ("PPM", {})]


@pytest.mark.parametrize("fmt, options", LOSSLESS, ids=[f for f, _ in LOSSLESS])
def test_lossless_formats_give_the_pixels(fmt, options):
    stream = encode(PIXELS, fmt, **options)
    np.testing.assert_array_equal(decode(stream, "RGB"), PIXELS)
    np.testing.assert_array_equal(decode(stream, "BGR"), PIXELS[..., ::-1])
    np.testing.assert_array_equal(decode(stream, "Grayscale"), luma(PIXELS))


@pytest.mark.parametrize("pixel_format", ["RGB", "BGR", "Grayscale"])
@pytest.mark.parametrize(
    "options",
    [{}, {"quality": 95, "subsampling": 0}, {"quality": 50, "progressive": True}],
    ids=["420", "444", "progressive"],
)
def test_jpeg(pixel_format, options):
    # Both sides decode with libjpeg-turbo through Pillow, so they agree exactly; the frozen
    # spec outputs below check the decoder against the one that made them.
    stream = encode(PIXELS, "JPEG", **options)
    check_node(
        "ImageDecoder", {"X": stream}, {"pixel_format": pixel_format}, opset=20, reference="onnx"
    )


def test_grayscale_against_reference():
    stream = encode(PIXELS, "PNG")
    check_node(
        "ImageDecoder", {"X": stream}, {"pixel_format": "Grayscale"}, opset=20, reference="onnx"
    )


@pytest.mark.parametrize(
    "name",
    sorted(n for n in dir(spec_data) if n.startswith("image_decoder_decode_")),
)
def test_spec_test_data(name):
    data = getattr(spec_data, name)
    pixel_format = "BGR" if "bgr" in name else "Grayscale" if "grayscale" in name else "RGB"
    np.testing.assert_array_equal(decode(data.data, pixel_format, compiled=False), data.output)


def test_alpha_is_dropped_and_gray_images_expand():
    rgba = np.concatenate([PIXELS, rng.integers(0, 256, (5, 7, 1), dtype=np.uint8)], axis=-1)
    np.testing.assert_array_equal(decode(encode(rgba, "PNG")), PIXELS)
    gray = PIXELS[..., 0]
    np.testing.assert_array_equal(decode(encode(gray, "PNG")), np.repeat(gray[..., None], 3, -1))
    np.testing.assert_array_equal(decode(encode(gray, "PNG"), "Grayscale"), gray[..., None])


def test_palette_and_bilevel_images():
    palette = Image.fromarray(PIXELS).quantize(colors=4)
    expected = np.asarray(palette.convert("RGB"))
    np.testing.assert_array_equal(decode(encode(palette, "PNG")), expected)
    bits = Image.fromarray(PIXELS[..., 0] > 127)
    expected = np.where(PIXELS[..., :1] > 127, 255, 0).astype(np.uint8)
    np.testing.assert_array_equal(decode(encode(bits, "PNG"), "Grayscale"), expected)


def test_16_bit_grayscale_keeps_the_high_byte():
    wide = np.array([[0, 255, 256, 1000, 65535]], dtype=np.uint16)
    out = decode(encode(wide, "PNG"), "Grayscale")
    np.testing.assert_array_equal(out[..., 0], [[0, 0, 1, 3, 255]])


@pytest.mark.parametrize("pixel_format, channels", [("RGB", 3), ("Grayscale", 1)])
def test_undecodable_streams_give_an_empty_image(pixel_format, channels):
    # The spec: a corrupt stream or an unknown format gives an empty matrix.
    png = encode(PIXELS, "PNG")
    for stream in (np.frombuffer(b"not an image", np.uint8), png[: png.size // 2]):
        out = decode(stream, pixel_format)
        assert out.shape == (0, 0, channels) and out.dtype == np.uint8


def test_decoded_image_feeds_device_ops():
    # The decoder is a graph break; the pixels go on to the device, into the next segment.
    nodes = [
        helper.make_node("ImageDecoder", ["stream"], ["image"], pixel_format="BGR"),
        helper.make_node("Cast", ["image"], ["floats"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["floats", "scale"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "decode_and_scale",
        [
            helper.make_tensor_value_info("stream", TensorProto.UINT8, ["bytes"]),
            helper.make_tensor_value_info("scale", TensorProto.FLOAT, []),
        ],
        [helper.make_value_info("out", helper.TypeProto())],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    loaded = transmuter.load(model)
    compiled = None
    for pixels in (PIXELS, PIXELS[:3, :2]):
        inputs = {"stream": encode(pixels, "PNG"), "scale": np.float32(0.5)}
        want = pixels[..., ::-1].astype(np.float32) * np.float32(0.5)
        compiled = compiled or transmuter.compile(loaded, inputs)
        for out in (transmuter.run(loaded, inputs), compiled(inputs)):
            assert_close(out["out"], want, rtol=0, atol=0, what="decoded and scaled")


def run_eager(stream, attrs=None):
    inputs = {"encoded_stream": stream}
    return transmuter_runs(
        make_node_model("ImageDecoder", inputs, attrs, opset=20), inputs, compiled=False
    )


def test_unsupported_inputs_raise():
    stream = encode(PIXELS, "PNG")
    with pytest.raises(TransmuterError, match="pixel_format must be RGB, BGR or Grayscale"):
        run_eager(stream, {"pixel_format": "RGBA"})
    with pytest.raises(TransmuterError, match=r"1-D uint8 .* got uint8\[2, "):
        run_eager(stream.reshape(2, -1))
    floats = encode(Image.fromarray(np.ones((2, 2), np.float32)), "TIFF")
    with pytest.raises(TransmuterError, match="cannot reduce a 'F' image"):
        run_eager(floats)


def test_missing_pillow_says_how_to_install(monkeypatch):
    stream = encode(PIXELS, "PNG")
    # A None entry in sys.modules makes `from PIL import Image` raise ImportError.
    monkeypatch.setitem(sys.modules, "PIL", None)
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(TransmuterError, match="pip install pillow"):
        run_eager(stream)
