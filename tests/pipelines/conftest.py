import json
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")

REPOS = Path(__file__).resolve().parents[1] / "fixtures" / "pipelines"


def expected(name: str) -> dict:
    return json.loads((REPOS / name / "expected.json").read_text())


@pytest.fixture(scope="session")
def repos() -> Path:
    return REPOS
