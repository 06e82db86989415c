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
