"""The ONNX front end: protobuf -> transmuter.ir. The only code that imports onnx."""

from transmuter.frontend.loader import load_model

__all__ = ["load_model"]
