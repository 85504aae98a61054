"""jax.export of flashattn's calls: symbolic shapes are refused with the recipe that works
(concrete shapes and flashattn's custom-call targets allowed through disabled_checks), the
recipe exports forward and gradient calls that give the jitted results, and a call with a
flashattn.masks mask, whose compiled call holds the mask's address in this process, is
refused when exported (a deserialized one crashed a fresh process). docs/python.md,
"jax.export"."""
import ast
import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import export  # noqa: E402

import flashattn.jax as fj  # noqa: E402
from flashattn import masks  # noqa: E402
from jax_reference import seeded_rng  # noqa: E402


def _recipe_targets():
    """The target names the symbolic-shape refusal tells the user to allow."""
    b, = export.symbolic_shape("b")
    with pytest.raises(ValueError) as e:
        export.export(jax.jit(lambda q: fj.attention(q, q, q)))(jax.ShapeDtypeStruct((b, 16, 2, 8), jnp.float32))
    msg = str(e.value)
    assert "export with concrete shapes" in msg and "disabled_checks=" in msg, msg
    assert "jax.export.DisabledSafetyCheck.custom_call(t)" in msg, msg
    found = re.search(r"for t in (\([^)]*\))", msg)
    assert found, msg
    return ast.literal_eval(found.group(1))


def test_the_refusals_recipe_exports_and_runs():
    """The refusal once said only "export with concrete shapes", which JAX then refused too
    ("custom calls whose targets have no compatibility guarantees"). Its recipe, followed as
    written, exports the forward and the gradient (both targets), and the exported calls give
    the jitted results bit for bit."""
    targets = _recipe_targets()
    assert {"flashattn_forward", "flashattn_backward", "flashattn_varlen_forward", "flashattn_varlen_backward",
            "flashattn_kvcache"} <= set(targets)
    checks = [export.DisabledSafetyCheck.custom_call(t) for t in targets]
    rng = seeded_rng("export")
    q = jnp.asarray(rng.standard_normal((2, 16, 2, 8)), jnp.float32)
    spec = jax.ShapeDtypeStruct(q.shape, q.dtype)
    fwd = jax.jit(lambda a: fj.attention(a, a, a, causal=True))
    grad = jax.jit(jax.grad(lambda a: jnp.sum(fj.attention(a, a, a, causal=True) ** 2)))
    with pytest.raises(ValueError, match="no compatibility guarantees"):  # what the old advice led to
        export.export(fwd)(spec)
    for f in (fwd, grad):
        exp = export.export(f, disabled_checks=checks)(spec)
        np.testing.assert_array_equal(np.asarray(exp.call(q)), np.asarray(f(q)))
    # a boolean mask array is an operand of the call: exported like any other
    m = jnp.asarray(rng.random((1, 1, 16, 16)) < 0.7).at[..., 0].set(True)
    fm = jax.jit(lambda a: fj.attention(a, a, a, mask=m))
    exp = export.export(fm, disabled_checks=checks)(spec)
    np.testing.assert_array_equal(np.asarray(exp.call(q)), np.asarray(fm(q)))


def test_a_flashattn_mask_is_refused_when_exported():
    """The compiled call holds the address of the mask the library built in this process, so
    an exported artifact is valid nowhere else: exporting it raises, also when jit's trace
    cache already holds the function (the check is in the lowering), through vmap and grad;
    jit in this process keeps working."""
    checks = [export.DisabledSafetyCheck.custom_call(t) for t in _recipe_targets()]
    rng = seeded_rng("export_mask")
    q = jnp.asarray(rng.standard_normal((1, 64, 2, 16)), jnp.float32)
    spec = jax.ShapeDtypeStruct(q.shape, q.dtype)
    mask = masks.from_fn(lambda b, h, i, j: (i + j) % 3 != 0)
    f = jax.jit(lambda a: fj.attention(a, a, a, mask=mask))
    before = f(q)  # traced and cached: export reuses the trace
    for g, s in ((f, spec),
                 (jax.jit(jax.vmap(lambda a: fj.attention(a, a, a, mask=mask))),
                  jax.ShapeDtypeStruct((2,) + q.shape, q.dtype)),
                 (jax.jit(jax.grad(lambda a: jnp.sum(fj.attention(a, a, a, mask=mask)))), spec),
                 (jax.jit(lambda a: fj.attention(a, a, a, mask=masks.causal())), spec)):
        with pytest.raises(ValueError, match="jax.export of a call with a flashattn.masks mask is not supported"):
            export.export(g, disabled_checks=checks)(s)
    np.testing.assert_array_equal(np.asarray(f(q)), np.asarray(before))
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda a: fj.attention(a, a, a, mask=mask))(q)),
                                  np.asarray(before))
