"""flashattn.jax.attention's seed and dropout_offset as docs/python.md states them: a concrete
negative value is refused, while a traced signed one (which cannot be range-checked at trace
time) is read as its unsigned bits, int32 -1 as 2**32 - 1 (docs/python.md once said only the
first half)."""
import pathlib

import numpy as np
import pytest

from conftest import randn

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

fj = pytest.importorskip("flashattn.jax")


@pytest.mark.parametrize("name", ["seed", "dropout_offset"])
def test_a_traced_signed_value_reads_as_its_unsigned_bits(rng, name):
    q, k, v = (jnp.asarray(randn(rng, (1, 20, 2, 16))) for _ in range(3))
    base = dict(dropout_p=0.4, seed=7, dropout_offset=0)

    def f(x):
        return fj.attention(q, k, v, **{**base, name: x})
    with pytest.raises(ValueError, match=f"{name} = -1 is not in 0 .. 2\\*\\*64 - 1"):
        f(jnp.int32(-1))
    traced = np.asarray(jax.jit(f)(jnp.int32(-1)))
    np.testing.assert_array_equal(traced, np.asarray(f(2**32 - 1)))
    assert not np.array_equal(traced, np.asarray(f(1)))
    # and the documented wording is in docs/python.md's flashattn.jax.attention row
    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md").read_text()
    assert "a traced signed seed or offset is read as its unsigned bits" in doc
