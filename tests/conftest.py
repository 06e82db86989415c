import jax
import pytest

# Accidental dtype promotion inside an operator fails loudly instead of changing results.
jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(0)


def pytest_report_header(config):
    # Results that depend on the CPU (summation order, ORT's u8 x s8 kernels) show as such.
    from transmuter import cpu

    return cpu.describe()


# Directories of whole models and pipelines (seconds a test) run before the op tests (a tenth of
# a second each), so that two workers end on small tests together instead of one waiting for
# the other's last pipeline.
MODEL_LEVEL_FIRST = ("pipelines", "models", "grad", "serving", "runtime", "examples", "fuzz")


def pytest_addoption(parser):
    parser.addoption(
        "--every-nth-case",
        type=int,
        default=1,
        metavar="N",
        help="keep the first and every Nth case of each parametrized test: every test "
        "function still runs, on a slice of its cases (the second CI platform's subset)",
    )


def pytest_collection_modifyitems(config, items):
    n = config.getoption("--every-nth-case")
    if n > 1:
        seen: dict[str, int] = {}
        kept, dropped = [], []
        for item in items:
            function = item.nodeid.split("[", 1)[0]
            index = seen[function] = seen.get(function, -1) + 1
            (kept if index % n == 0 else dropped).append(item)
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept

    def rank(item) -> int:
        parts = item.nodeid.split("/")
        directory = parts[1] if len(parts) > 2 else ""
        return MODEL_LEVEL_FIRST.index(directory) if directory in MODEL_LEVEL_FIRST else 99

    items.sort(key=rank)  # stable: each directory keeps its own order
