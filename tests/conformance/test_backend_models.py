"""ONNX's backend model suites that ship inside the onnx wheel, each case run through
`transmuter.compile` by `TransmuterBackend`:

- Simple: small multi-node graphs (expand, sequences, shrink, ...), with stored test data;
- PyTorchConverted / PyTorchOperator: old PyTorch exports of layers and operators, with data;
- Real: the "light" variants of nine classic CNNs (AlexNet ... ZFNet-512). onnx stores them in
  the wheel with their expected outputs; the runner writes their inputs under $ONNX_HOME, which
  is pointed at a temporary folder so the suite leaves nothing in the home folder.

Known failures are strict xfails listed in expected_failures.py.
"""

import pytest
from conformance_suite import suite_classes

CLASSES = suite_classes(
    __name__, ["SimpleModel", "PyTorchConvertedModel", "PyTorchOperatorModel", "RealModel"]
)
# The nine CNNs are model-level tests (5-20 s each to compile): `-m 'not slow'` leaves them out.
pytest.mark.slow(CLASSES["OnnxBackendRealModelTest"])
globals().update(CLASSES)


@pytest.fixture(autouse=True)
def _onnx_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("ONNX_HOME", str(tmp_path_factory.getbasetemp() / "onnx_home"))
    monkeypatch.delenv("ONNX_MODELS", raising=False)
