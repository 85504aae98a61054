"""flashattn.masks given traced JAX values: a mask is built when the call is traced, so its
values must be static. Traced prefix_lm / documents lengths and a traced from_array array
raised JAX's TracerArrayConversionError from inside masks.py; they now raise ValueError
naming the argument. A from_fn predicate written with jnp ran eagerly but failed inside
jax.jit the same way; it now runs concretely there (jax.ensure_compile_time_eval), and one
that depends on a traced value is refused in words. masks.py imports no jax."""
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import flashattn.jax as fj  # noqa: E402
from flashattn import masks  # noqa: E402

from conftest import SEED  # noqa: E402


def _q():
    return jnp.asarray(np.random.default_rng(SEED).standard_normal((1, 8, 2, 4)), jnp.float32)


@pytest.mark.parametrize("make, value, name", [
    (masks.from_array, np.tril(np.ones((8, 8), bool)), "from_array's bool_array"),
    (masks.prefix_lm, np.array([3]), "prefix_lm's prefix_lengths"),
    (masks.documents, np.array([3, 5]), "documents' lengths"),
    (lambda x: masks.documents([x, 5]), 3, "documents' lengths"),
])
def test_traced_mask_values_are_refused_naming_them(make, value, name):
    q = _q()
    f = jax.jit(lambda q, x: fj.attention(q, q, q, mask=make(x)))
    with pytest.raises(ValueError, match=f"^{name} must be static"):
        f(q, jnp.asarray(value))
    with pytest.raises(ValueError, match=f"^{name} must be static"):  # vmap's tracers too
        jax.vmap(lambda x: make(x), axis_size=1)(jnp.asarray(value)[None])
    # concrete values, JAX arrays made outside the traced function included, work as before
    want = fj.attention(q, q, q, mask=make(np.asarray(value)))
    concrete = jnp.asarray(value)
    got = jax.jit(lambda q: fj.attention(q, q, q, mask=make(concrete)))(q)
    assert np.array_equal(np.asarray(got), np.asarray(want))


def test_a_jnp_predicate_runs_inside_jit():
    q = _q()
    m = masks.from_fn(lambda b, h, i, j: jnp.asarray(j <= i))
    want = fj.attention(q, q, q, causal=True)
    assert np.array_equal(np.asarray(jax.jit(lambda q: fj.attention(q, q, q, mask=m))(q)), np.asarray(want))
    assert np.array_equal(np.asarray(fj.attention(q, q, q, mask=m)), np.asarray(want))


def test_a_predicate_of_a_traced_value_is_refused_in_words():
    q = _q()
    f = jax.jit(lambda q, n: fj.attention(q, q, q, mask=masks.from_fn(lambda b, h, i, j: j <= i + n)))
    with pytest.raises(ValueError, match="^from_fn's fn returned a traced JAX value"):
        f(q, 1)


def test_masks_import_no_jax():
    code = ("import sys, numpy as np; from flashattn import masks; "
            "m = masks.from_fn(lambda b, h, i, j: j <= i); m.build(1, 1, 8, 8); "
            "masks.from_array(np.ones((8, 8), bool)).build(1, 1, 8, 8); "
            "assert 'jax' not in sys.modules, 'jax imported'; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
