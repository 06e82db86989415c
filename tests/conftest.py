import jax
import pytest

# Accidental dtype promotion inside an operator fails loudly instead of changing results.
jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(0)
