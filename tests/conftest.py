import os

# XLA:CPU's backend compile is most of the suite's time, and LLVM's optimization passes much of
# that: at -O1 a generation case compiles in 17% less time than at the default -O3 (NOTES.md,
# "The suite compiles at LLVM's -O1"); -O0 was measured and refused (it miscompiles a gradient).
# Set before JAX starts its backend and inherited by the tests' subprocesses; a level in
# XLA_FLAGS wins.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=1"
    ).strip()

import jax  # noqa: E402
import pytest  # noqa: E402

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
