"""A float64 numpy reference for the JAX tests: forward and backward of SPEC section 2,
written from the formulas (no kernel code), in [B, H, S, D] layout.

The pycore helper's numpy suite has its own; this one also covers the options the JAX
fronts pass (diag_offset for top-left masks, bias_scale) and dbias.
"""
import numpy as np


def visible(sq, sk, *, causal=False, window=(-1, -1), diag_offset=None, q_seg=None, kv_seg=None):
    """[B or 1, 1, Sq, Sk] boolean: key j visible to query i."""
    off = sk - sq if diag_offset is None else diag_offset
    i = np.arange(sq)[:, None] + off
    j = np.arange(sk)[None, :]
    m = np.ones((sq, sk), bool)
    if causal:
        m &= j <= i
    left, right = window
    if left >= 0:
        m &= j >= i - left
    if right >= 0:
        m &= j <= i + right
    m = m[None, None]
    if q_seg is not None:
        m = m & (np.asarray(q_seg)[:, None, :, None] == np.asarray(kv_seg)[:, None, None, :])
    return m


def _expand_heads(x, hq):
    return np.repeat(x, hq // x.shape[1], axis=1)


def forward(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, scale=None, bias=None, bias_scale=1.0,
            alibi_slopes=None, q_seg=None, kv_seg=None, diag_offset=None, save=False):
    """o [B, Hq, Sq, Dv] and lse [B, Hq, Sq] in float64; rows with no visible key give
    o = 0, lse = -inf."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, Hq, Sq, D = q.shape
    Sk = k.shape[2]
    kx, vx = _expand_heads(k, Hq), _expand_heads(v, Hq)
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    s = scale * np.einsum("bhqd,bhkd->bhqk", q, kx)
    t = softcap * np.tanh(s / softcap) if softcap else s
    z = t.copy()
    if bias is not None:
        z = z + bias_scale * np.asarray(bias, np.float64)
    if alibi_slopes is not None:
        off = Sk - Sq if diag_offset is None else diag_offset
        dist = np.abs(np.arange(Sq)[:, None] + off - np.arange(Sk)[None, :])
        z = z - np.asarray(alibi_slopes, np.float64)[None, :, None, None] * dist[None, None]
    vis = visible(Sq, Sk, causal=causal, window=window, diag_offset=diag_offset, q_seg=q_seg, kv_seg=kv_seg)
    vis = np.broadcast_to(vis, z.shape) & (z > -np.inf)
    zm = np.where(vis, z, -np.inf)
    m = zm.max(axis=-1, keepdims=True)
    empty = ~vis.any(axis=-1, keepdims=True)
    e = np.where(vis, np.exp(zm - np.where(empty, 0.0, m)), 0.0)
    l = e.sum(axis=-1, keepdims=True)
    p = np.where(empty, 0.0, e / np.where(empty, 1.0, l))
    lse = np.where(empty[..., 0], -np.inf, np.log(np.where(empty, 1.0, l))[..., 0] + np.where(empty, 0.0, m)[..., 0])
    o = np.einsum("bhqk,bhkd->bhqd", p, vx)
    if save:
        return o, lse, dict(p=p, s=s, scale=scale, kx=kx, vx=vx)
    return o, lse


def backward(q, k, v, do, *, softcap=0.0, bias=None, bias_scale=1.0, **kw):
    """dq, dk, dv (and dbias, bias-shaped, when bias is given) of sum(o * do), float64."""
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
    o, _, r = forward(q, k, v, softcap=softcap, bias=bias, bias_scale=bias_scale, save=True, **kw)
    p, s, scale = r["p"], r["s"], r["scale"]
    Hq, Hk = q.shape[1], k.shape[1]
    dp = np.einsum("bhqd,bhkd->bhqk", do, r["vx"])
    dz = p * (dp - (do * o).sum(-1, keepdims=True))
    ds = dz * (1.0 - np.tanh(s / softcap) ** 2) if softcap else dz
    dq = scale * np.einsum("bhqk,bhkd->bhqd", ds, r["kx"])
    dkx = scale * np.einsum("bhqk,bhqd->bhkd", ds, q)
    dvx = np.einsum("bhqk,bhqd->bhkd", p, do)
    g = Hq // Hk
    dk = dkx.reshape(dkx.shape[0], Hk, g, *dkx.shape[2:]).sum(2)
    dv = dvx.reshape(dvx.shape[0], Hk, g, *dvx.shape[2:]).sum(2)
    if bias is None:
        return dq, dk, dv
    bshape = np.shape(bias)
    db = bias_scale * dz
    for axis in (0, 1):
        if bshape[axis] == 1:
            db = db.sum(axis=axis, keepdims=True)
    return dq, dk, dv, db


def seeded_rng(name):
    """A numpy Generator seeded from FA_TEST_SEED or at random; prints the seed (pytest -s,
    or in the failure report) so that a failure can be replayed."""
    import os
    import secrets

    seed = int(os.environ.get("FA_TEST_SEED", secrets.randbelow(2**31)))
    print(f"{name}: FA_TEST_SEED={seed}")
    return np.random.default_rng(seed)


def assert_close(name, got, want, atol, rtol, scale_floor=1e-30):
    """|got - want| <= atol * max|want| + rtol * |want| elementwise (atol relative to the
    tensor's scale, at least scale_floor), NaN never close; the message shows the worst
    element."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    finite = np.isfinite(want)
    assert np.array_equal(np.isneginf(got), np.isneginf(want)), f"{name}: -inf positions differ"
    scale = max(np.abs(want[finite]).max(initial=0.0), scale_floor)
    with np.errstate(invalid="ignore"):  # -inf - -inf where both are -inf (checked above)
        err = np.where(finite, np.abs(got - want), 0.0)
    err = np.where(np.isnan(got), np.inf, err)
    bound = atol * scale + rtol * np.abs(np.where(finite, want, 0.0))
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), (f"{name}: |got - want| = {err[worst]:.3g} at {worst} exceeds {bound[worst]:.3g} "
                                  f"(got {got[worst]:.6g}, want {want[worst]:.6g}, scale {scale:.3g})")
