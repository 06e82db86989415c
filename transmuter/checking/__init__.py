"""Checking Transmuter against ONNX Runtime on one model: inputs made from the model's specs
(and its Hugging Face config when there is one; `inputs`), the reference run with graph
optimizations off (`reference`), per-output errors and the first node where the two disagree
(`comparison`). Used by `transmuter check` and the coverage tools; ONNX Runtime is optional (a test
dependency, never a runtime one)."""

from transmuter.checking.comparison import (
    Difference,
    Divergence,
    compare,
    difference,
    first_divergence,
    first_non_finite,
    made_non_finite,
    reference_noise,
)
from transmuter.checking.inputs import DEFAULT_SIZES, embedding_rows, example_inputs
from transmuter.checking.reference import (
    SaturatingProduct,
    reference_feeds,
    reference_outputs,
    reference_saturation,
    reference_session,
)

__all__ = [
    "DEFAULT_SIZES",
    "Difference",
    "Divergence",
    "SaturatingProduct",
    "compare",
    "difference",
    "embedding_rows",
    "example_inputs",
    "first_divergence",
    "first_non_finite",
    "made_non_finite",
    "reference_feeds",
    "reference_noise",
    "reference_outputs",
    "reference_saturation",
    "reference_session",
]
