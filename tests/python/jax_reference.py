"""The float64 reference (tests/python/reference.py) in the terms the JAX tests use, and
two helpers: a seeded generator that prints its seed, and an elementwise closeness check
for comparisons with JAX's own functions.

Arrays are [B, H, S, D]; forward gives (o, lse); backward gives (dq, dk, dv) and, with a
bias, dbias summed over the bias's broadcast dims (shape as the 4-D bias)."""
import numpy as np

import reference


def forward(q, k, v, *, q_seg=None, kv_seg=None, **kw):
    o, lse, _ = reference.forward(q, k, v, q_segment_ids=q_seg, kv_segment_ids=kv_seg, **kw)
    return o, lse


def backward(q, k, v, do, *, q_seg=None, kv_seg=None, bias=None, **kw):
    dq, dk, dv, db4 = reference.backward(q, k, v, do, q_segment_ids=q_seg, kv_segment_ids=kv_seg, bias=bias, **kw)
    if bias is None:
        return dq, dk, dv
    shape = np.shape(bias)
    shape = (1,) * (4 - len(shape)) + tuple(shape)
    for axis in (0, 1):
        if shape[axis] == 1:
            db4 = db4.sum(axis=axis, keepdims=True)
    return dq, dk, dv, db4


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
