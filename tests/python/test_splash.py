"""Splash attention's masks in flashattn.jax: each mask class (and & / |, MultiHeadMask) as the
library builds it against the splash mask's own dense array (mask[...]); flashattn.jax.attention
with splash masks against the float64 reference on that array; splash_cost_estimate against an
independent count of the blocks splash's own mask processing keeps (process_mask). Random
cases draw from the run's seed (FA_TEST_SEED)."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy
sm = pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_mask")
mask_info = pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_mask_info")
splash_kernel = pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_kernel")

import flashattn.jax as fj  # noqa: E402
import reference as ref  # noqa: E402
from conftest import FWD_TOL, BWD_TOL, SEED, rel_err  # noqa: E402
from flashattn.jax._splash import from_splash  # noqa: E402


def _masks(rng, Sq, Sk):
    """(name, splash mask) for every class, random parameters."""
    arr = rng.random((Sq, Sk)) < 0.3
    arr[:, 0] = True
    out = [
        ("causal", sm.CausalMask((Sq, Sk))),
        ("causal+off", sm.CausalMask((Sq, Sk), offset=int(rng.integers(-5, 20)))),
        ("local", sm.LocalMask((Sq, Sk), (int(rng.integers(0, 40)), int(rng.integers(0, 9))), offset=0)),
        ("local-left", sm.LocalMask((Sq, Sk), (None, 3), offset=int(rng.integers(0, 9)))),
        ("local-right", sm.LocalMask((Sq, Sk), (17, None), offset=-2)),
        # a negative side (all keys on one side of the diagonal; flashattn's window reads -1
        # as unbounded, which these once became): bounded, half-open, and empty
        ("local-neg-left", sm.LocalMask((Sq, Sk), (-1, int(rng.integers(1, 9))), offset=int(rng.integers(-3, 4)))),
        ("local-neg-right", sm.LocalMask((Sq, Sk), (int(rng.integers(2, 12)), -1), offset=0)),
        ("local-neg-2", sm.LocalMask((Sq, Sk), (-2, 5), offset=1)),
        ("local-neg-open", sm.LocalMask((Sq, Sk), (None, -3), offset=2)),
        ("local-neg-open-right", sm.LocalMask((Sq, Sk), (-4, None), offset=0)),
        ("local-empty", sm.LocalMask((Sq, Sk), (-3, 1), offset=0)),
        ("numpy", sm.NumpyMask(arr)),
        ("full", sm.FullMask((Sq, Sk))),
        ("and", sm.CausalMask((Sq, Sk)) & sm.NumpyMask(arr)),
        ("or", sm.LocalMask((Sq, Sk), (4, 0), offset=0) | sm.NumpyMask(arr)),
    ]
    if hasattr(sm, "ChunkedCausalMask"):
        out.append(("chunked", sm.ChunkedCausalMask((Sq, Sk), chunk_size=int(rng.integers(3, 40)))))
    return out


def _dense(m):
    return np.asarray(m[:, :, :] if isinstance(m, sm.MultiHeadMask) else m[:, :], bool)


@pytest.mark.parametrize("Sq,Sk", [(96, 96), (40, 72)])
def test_masks_as_built(rng, Sq, Sk):
    print(f"seed {SEED}")
    ms = _masks(rng, Sq, Sk)
    for name, m in ms:
        fm, shape = from_splash(m)
        assert shape == (None, Sq, Sk)
        for block in ((0, 0), (16, 8), (7, 5)):
            got = fm.build(1, 1, Sq, Sk, diag_offset=0, block=block).to_dense()[0, 0]
            assert np.array_equal(got, _dense(m)), (name, block)
    heads = sm.MultiHeadMask([m for _, m in ms[:4]])  # causal, causal+off, local, local-left
    fm, shape = from_splash(heads)
    assert shape == (4, Sq, Sk)
    assert np.array_equal(fm.build(1, 4, Sq, Sk, diag_offset=0).to_dense()[0], _dense(heads))


def _reference(q, k, v, attend, do=None):
    """float64 reference on [B, S, H, D] arrays, attend [H or 1, Sq, Sk]."""
    t = lambda x: np.swapaxes(np.asarray(x, np.float64), 1, 2)  # noqa: E731
    bias = np.where(attend, 0.0, -np.inf)[None]
    o, _, _ = ref.forward(t(q), t(k), t(v), bias=bias)
    if do is None:
        return np.swapaxes(o, 1, 2)
    g = ref.backward(t(q), t(k), t(v), t(do), bias=bias)
    return np.swapaxes(o, 1, 2), [np.swapaxes(x, 1, 2) for x in g[:3]]


def test_attention_with_splash_masks(rng):
    B, S, H, D = 1, 48, 2, 16
    q, k, v = (rng.standard_normal((B, S, H, D)).astype(np.float32) for _ in range(3))
    for name, m in _masks(rng, S, S):
        o = fj.attention(q, k, v, mask=m)
        assert rel_err(o, _reference(q, k, v, _dense(m)[None])) <= FWD_TOL["f32"], name
    heads = sm.MultiHeadMask([sm.CausalMask((S, S)), sm.LocalMask((S, S), (5, 5), offset=0)])
    do = rng.standard_normal((B, S, H, D)).astype(np.float32)

    def loss(q, k, v):
        return (fj.attention(q, k, v, mask=heads) * do).sum()

    o_ref, g_ref = _reference(q, k, v, _dense(heads), do)
    assert rel_err(fj.attention(q, k, v, mask=heads), o_ref) <= FWD_TOL["f32"]
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    for g, w in zip(grads, g_ref):
        assert rel_err(g, w) <= BWD_TOL["f32"]
    with pytest.raises(ValueError, match="Sq"):
        fj.attention(q[:, :40], k, v, mask=sm.CausalMask((S, S)))


def _splash_blocks(m, block):
    """The blocks splash's own mask processing keeps, over all query heads."""
    heads = m if isinstance(m, sm.MultiHeadMask) else sm.MultiHeadMask([m])
    info, _ = mask_info.process_mask(heads, block)
    if info.block_mask is None:  # nothing masked: every block runs
        n = heads.shape[1] // block[0] * (heads.shape[2] // block[1])
        return n * len(heads.masks)
    per = len(heads.masks) // info.block_mask.shape[0]
    return int(np.count_nonzero(info.block_mask)) * per


def test_splash_cost_estimate(rng):
    S, H, D, Dv = 512, 2, 64, 32
    q = jax.ShapeDtypeStruct((H, S, D), jnp.bfloat16)
    v = jax.ShapeDtypeStruct((H, S, Dv), jnp.bfloat16)
    sizes = [None, splash_kernel.BlockSizes(block_q=64, block_kv=256, block_kv_compute=128)]
    for name, m in _masks(rng, S, S) + [("heads", sm.MultiHeadMask([sm.CausalMask((S, S)),
                                                                     sm.LocalMask((S, S), (100, 0), offset=0)]))]:
        if name == "local-empty":  # splash's own process_mask refuses a mask with no block
            continue
        heads = m if isinstance(m, sm.MultiHeadMask) else sm.MultiHeadMask([m] * H)
        for bs in sizes:
            b = splash_kernel.BlockSizes.get_default() if bs is None else bs
            n = _splash_blocks(heads, (b.block_q, b.block_kv))
            est = fj.splash_cost_estimate(m, q, q, v, block_sizes=bs)
            assert est.flops == n * 2 * b.block_q * b.block_kv * (D + Dv), (name, bs)
            steps = b.block_kv // b.block_kv_compute
            assert est.transcendentals == n * b.block_q * (b.block_kv + steps * 128), (name, bs)
            assert est.bytes_accessed > 0
            batched = fj.splash_cost_estimate(m, jax.ShapeDtypeStruct((3, H, S, D), jnp.bfloat16),
                                              jax.ShapeDtypeStruct((3, H, S, D), jnp.bfloat16),
                                              jax.ShapeDtypeStruct((3, H, S, Dv), jnp.bfloat16), block_sizes=bs)
            assert (batched.flops, batched.transcendentals) == (3 * est.flops, 3 * est.transcendentals)
    with pytest.raises(ValueError, match="divide"):
        fj.splash_cost_estimate(sm.CausalMask((500, 500)), jax.ShapeDtypeStruct((H, 500, D), jnp.bfloat16),
                                jax.ShapeDtypeStruct((H, 500, D), jnp.bfloat16),
                                jax.ShapeDtypeStruct((H, 500, D), jnp.bfloat16))


def test_cost_estimate_with_splash_mask():
    """flashattn's own cost_estimate with a splash mask is exact: fewer flops than dense, and
    flops_useful the popcount of the mask."""
    S, H, D = 256, 2, 32
    q = jax.ShapeDtypeStruct((1, S, H, D), jnp.float32)
    m = sm.LocalMask((S, S), (31, 0), offset=0)
    p = fj.plan(q, q, q, mask=m, backend="cpu")
    assert p.exact
    assert p.forward["flops_useful"] == 4 * H * D * int(_dense(m).sum())
    assert fj.cost_estimate(q, q, q, mask=m, backend="cpu").flops < fj.cost_estimate(q, q, q, backend="cpu").flops


def test_attention_with_flashattn_masks(rng):
    """mask= a flashattn.masks mask in flashattn.jax.attention, under jit and grad."""
    from flashattn import masks
    B, S, H, D = 2, 40, 2, 8
    q, k, v = (rng.standard_normal((B, S, H, D)).astype(np.float32) for _ in range(3))
    lens = [[13, 27], [40]]
    m = masks.documents(lens) & masks.causal()
    doc = [np.repeat(np.arange(len(r)), r) for r in lens]
    want = np.stack([d[:, None] == d[None, :] for d in doc])[:, None] & np.tril(np.ones((S, S), bool))
    t = lambda x: np.swapaxes(np.asarray(x, np.float64), 1, 2)  # noqa: E731
    bias = np.where(want, 0.0, -np.inf)
    o_ref, _, _ = ref.forward(t(q), t(k), t(v), bias=bias)
    o = jax.jit(lambda q, k, v: fj.attention(q, k, v, mask=m))(q, k, v)
    assert rel_err(np.swapaxes(np.asarray(o), 1, 2), o_ref) <= FWD_TOL["f32"]
    g = jax.grad(lambda q: fj.attention(q, k, v, mask=m).sum())(q)
    g_ref = ref.backward(t(q), t(k), t(v), np.ones((B, H, S, D)), bias=bias)[0]
    assert rel_err(np.swapaxes(np.asarray(g), 1, 2), g_ref) <= BWD_TOL["f32"]


def test_readme_figures():
    """README.md's splash_cost_estimate rows on the seed's shape are what it returns today."""
    import os
    import re
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")).read()
    S = 16384
    q = jax.ShapeDtypeStruct((18, 32, S, 256), jnp.bfloat16)
    for name, m in (("causal", sm.CausalMask((S, S))), ("local(1024)", sm.LocalMask((S, S), (1024, 0), offset=0)),
                    ("chunked(8192)", sm.ChunkedCausalMask((S, S), chunk_size=8192))):
        row = re.search(rf"^\| {re.escape(name)} \| `splash_cost_estimate` \| [^|]+ \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$",
                        readme, re.M)
        assert row, f"README.md: the splash_cost_estimate row for {name} is gone or reworded"
        c = fj.splash_cost_estimate(m, q, q, q)
        assert [x.strip() for x in row.groups()] == [f"{c.flops:.4g}", f"{c.transcendentals:.4g}",
                                                     f"{c.bytes_accessed:.4g}"], name


def test_and_of_multi_head_masks_is_refused_saying_how():
    """& of two MultiHeadMasks (a LogicalAnd of shape [H, Sq, Sk], which splash refuses too):
    the message named that shape as one it takes; it now says to combine per head."""
    S = 128
    a = sm.MultiHeadMask([sm.CausalMask((S, S))] * 2)
    b = sm.MultiHeadMask([sm.LocalMask((S, S), (8, 8), offset=0)] * 2)
    q = jax.numpy.ones((1, S, 2, 16), jax.numpy.float32)
    with pytest.raises(ValueError, match="not a MultiHeadMask.*combine per head"):
        fj.attention(q, q, q, mask=a & b)
