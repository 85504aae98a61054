"""flashattn.jax.cost_estimate (the library's plan as a Pallas CostEstimate, shapes only) and
the seed example's promises: lowering plus compiling the seed problem in under 2 s, in a
process under 300 MiB, with nothing of the problem's size allocated."""
import os
import re
import subprocess
import sys
import time

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import flashattn  # noqa: E402
import flashattn.jax as fj  # noqa: E402

SEED = (18, 32, 16384, 256)  # B, H, S, D


def _sds(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pass_", ["forward", "backward"])
def test_seed_estimate_is_the_plan(causal, pass_):
    from jax.experimental import pallas as pl

    b, h, s, d = SEED
    q = _sds((b, h, s, d))
    est = fj.cost_estimate(q, q, q, causal=causal, layout="bhsd", pass_=pass_, backend="cpu")
    assert isinstance(est, pl.CostEstimate)
    plan = flashattn.plan(batch=b, heads=h, seq_q=s, head_dim=d, dtype="bf16", causal=causal, backend="cpu")
    want = getattr(plan, pass_)
    assert (est.flops, est.transcendentals, est.bytes_accessed) == (
        want["flops"], want["transcendentals"], want["bytes_accessed"])
    if causal:  # the causal plan skips the masked half: about half the dense flops
        dense = fj.cost_estimate(q, q, q, layout="bhsd", pass_=pass_, backend="cpu")
        assert 0.49 < est.flops / dense.flops < 0.51


def test_arrays_and_structs_agree_and_options_count():
    rng_key = jax.random.PRNGKey(0)
    q = jax.random.normal(rng_key, (2, 512, 4, 32), jnp.float32)
    k = jax.random.normal(rng_key, (2, 600, 2, 32), jnp.float32)
    bias = jnp.zeros((1, 4, 512, 600), jnp.float32)
    a = fj.cost_estimate(q, k, k, causal=True, window=(16, 0), softcap=10.0, bias=bias)
    s = fj.cost_estimate(_sds(q.shape, q.dtype), _sds(k.shape, k.dtype), _sds(k.shape, k.dtype), causal=True,
                         window=(16, 0), softcap=10.0, bias=_sds(bias.shape, bias.dtype))
    assert a == s
    plain = fj.cost_estimate(q, k, k)
    assert a.flops < plain.flops  # the window skips tiles
    assert a.transcendentals > 0 and a.bytes_accessed > 0
    seg = fj.cost_estimate(q, k, k, q_segment_ids=True, kv_segment_ids=True)
    assert seg.flops == plain.flops  # segment ids: the upper bound (plan.exact is False)
    assert not fj.plan(q, k, k, q_segment_ids=True, kv_segment_ids=True).exact


def test_takes_microseconds():
    q = _sds((18, 16384, 32, 256))
    fj.cost_estimate(q, q, q, causal=True)  # imports jax.experimental.pallas once
    n = 50
    t = time.perf_counter()
    for _ in range(n):
        fj.cost_estimate(q, q, q, causal=True)
    per_call = (time.perf_counter() - t) / n
    print(f"cost_estimate: {per_call * 1e6:.0f} us per call")
    assert per_call < 0.02  # ~0.2 ms measured; a generous bound for a loaded machine


def test_bad_arguments_raise():
    q = _sds((1, 8, 2, 8), jnp.float32)
    with pytest.raises(ValueError, match="pass_"):
        fj.cost_estimate(q, q, q, pass_="both")
    with pytest.raises(ValueError, match="k has head_dim 4 but q has 8"):
        fj.cost_estimate(q, _sds((1, 8, 2, 4), jnp.float32), q)
    with pytest.raises(ValueError, match="expected an array or jax.ShapeDtypeStruct"):
        fj.cost_estimate(q, q, q, bias=3.0)


def test_true_stands_for_the_fixed_shape_tensors_only():
    """alibi_slopes, segment ids and sinks may be True (their shapes follow from q and k);
    bias and mask may not: their broadcast shape changes the plan's memory figures, so True is refused
    naming them (bias=True once crashed with AttributeError "'bool' object has no attribute
    'dtype'")."""
    q = _sds((1, 32, 2, 16), jnp.float32)
    for kw in (dict(alibi_slopes=True), dict(q_segment_ids=True, kv_segment_ids=True), dict(sinks=True)):
        assert fj.plan(q, q, q, **kw) is not None
        fj.cost_estimate(q, q, q, **kw)
    # False is absent, as None (it was an AttributeError), and numpy's plan says its flags are flags
    plain = fj.plan(q, q, q).forward
    for kw in (dict(alibi_slopes=False), dict(q_segment_ids=False, kv_segment_ids=False), dict(sinks=False)):
        assert fj.plan(q, q, q, **kw).forward == plain
        fj.cost_estimate(q, q, q, **kw)
    import numpy as np
    with pytest.raises(ValueError, match="segment_ids is a flag here"):
        flashattn.plan(batch=1, heads=2, seq_q=32, head_dim=16, segment_ids=np.zeros((1, 32), np.int32))
    for fn in (fj.plan, fj.cost_estimate):
        with pytest.raises(TypeError, match=r"bias must be an array or a jax.ShapeDtypeStruct, got True"):
            fn(q, q, q, bias=True)
        with pytest.raises(TypeError, match=r"mask must be a boolean array, a jax.ShapeDtypeStruct"):
            fn(q, q, q, mask=True)
    # what to pass instead: a ShapeDtypeStruct of the bias, whose shape changes the plan
    small = fj.plan(q, q, q, bias=_sds((1, 1, 1, 32), jnp.float32)).forward
    full = fj.plan(q, q, q, bias=_sds((1, 2, 32, 32), jnp.float32)).forward
    assert full["min_bytes"] > small["min_bytes"] and full["peak_bytes"] > small["peak_bytes"]


def test_takes_attentions_keyword_arguments():
    """"Arguments as flashattn.jax.attention": dropout_p, seed, dropout_offset, return_lse and
    (cost_estimate) threads raised TypeError. They are checked as attention checks them and
    change no figure; a seed may be a ShapeDtypeStruct (or True)."""
    q = _sds((1, 128, 2, 64))
    base, base_plan = fj.cost_estimate(q, q, q), fj.plan(q, q, q)
    for kw in (dict(dropout_p=0.1, seed=0), dict(dropout_p=0.1, seed=_sds((), jnp.uint32), dropout_offset=3),
               dict(dropout_p=0.1, seed=jax.random.key(1), dropout_offset=True), dict(seed=5), dict(threads=2),
               dict(return_lse=True)):
        for pass_ in ("forward", "backward"):
            assert fj.cost_estimate(q, q, q, pass_=pass_, **kw) == fj.cost_estimate(q, q, q, pass_=pass_), kw
        assert fj.plan(q, q, q, **kw).forward == base_plan.forward, kw
    assert fj.cost_estimate(q, q, q, threads=2) == base
    assert fj.plan(q, q, q, threads=2).threads == 2
    for fn in (fj.plan, fj.cost_estimate):
        with pytest.raises(ValueError, match="dropout_p > 0 needs seed="):
            fn(q, q, q, dropout_p=0.1)
        with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
            fn(q, q, q, dropout_p=1.0, seed=0)
        with pytest.raises(ValueError, match=r"seed = -1 is not in 0 .. 2\*\*64 - 1"):
            fn(q, q, q, dropout_p=0.1, seed=-1)
        with pytest.raises(ValueError, match=r"dropout_offset = 18446744073709551616"):
            fn(q, q, q, dropout_p=0.1, seed=0, dropout_offset=2**64)
        with pytest.raises(ValueError, match="threads"):
            fn(q, q, q, threads=-1)


EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "seed_jax.py")


@pytest.mark.skipif(not os.path.exists(EXAMPLE), reason="examples/seed_jax.py is not beside this test tree")
@pytest.mark.parametrize("causal", [False, True])
def test_seed_example_compiles_fast_and_small(causal):
    args = [sys.executable, EXAMPLE, "--seed-only"] + (["--causal"] if causal else [])
    out = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    print(out.stdout)
    m = re.search(r"lower ([\d.]+) s \+ compile ([\d.]+) s = ([\d.]+) s; peak RSS so far (\d+) MiB; "
                  r"live jax arrays: (\d+)", out.stdout)
    assert m, out.stdout
    seconds, rss, live = float(m.group(3)), int(m.group(4)), int(m.group(5))
    assert seconds < 2.0 and rss < 300 and live == 0, m.group(0)
