import numpy as np
import pytest
from onnx import helper

from transmuter import dtypes


@pytest.mark.parametrize("code", sorted(dtypes.ONNX_TO_NUMPY))
def test_table_matches_onnx(code):
    assert dtypes.from_onnx(code) == np.dtype(helper.tensor_dtype_to_np_dtype(code))
    assert dtypes.to_onnx(dtypes.from_onnx(code)) == code


def test_unknown_types_are_errors():
    with pytest.raises(ValueError, match="not supported"):
        dtypes.from_onnx(999)
    with pytest.raises(ValueError, match="no ONNX element type"):
        dtypes.to_onnx(np.dtype("V8"))
