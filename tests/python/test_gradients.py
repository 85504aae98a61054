"""Gradients against finite differences of the float64 reference's forward (the library
has no f64, so torch.autograd.gradcheck does not apply). Central differences in f64 are
good to ~1e-9 here; the library's f32 gradients must be within the f32 backward bound."""
import numpy as np
import pytest

import flashattn
import reference as ref
from conftest import BWD_TOL, check


def fd_grad(f, x, h=1e-6):
    """d sum(f(x) * do) / dx by central differences, one element at a time."""
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + h
        up = f(x)
        x[i] = old - h
        down = f(x)
        x[i] = old
        g[i] = (up - down) / (2 * h)
    return g


CASES = {
    "plain": {},
    "causal_gqa": {"causal": True, "Hk": 1},
    "softcap": {"softcap": 1.5, "scale": 1.0},
    "window_alibi": {"window": (2, 1), "alibi_slopes": np.array([0.3, 0.7], np.float32)},
    "bias": {"bias": True},
    "segments": {"q_segment_ids": np.array([[0, 0, 1, 1, 2]], np.int32),
                 "kv_segment_ids": np.array([[0, 1, 1, 1, 2, 2]], np.int32)},
}


@pytest.mark.parametrize("case", list(CASES))
def test_gradients_match_finite_differences(rng, case):
    opts = dict(CASES[case])
    Hk = opts.pop("Hk", 2)
    B, Hq, Sq, Sk, D = 1, 2, 5, 6, 4
    q = rng.standard_normal((B, Hq, Sq, D)).astype(np.float32)
    k = rng.standard_normal((B, Hk, Sk, D)).astype(np.float32)
    v = rng.standard_normal((B, Hk, Sk, D)).astype(np.float32)
    if opts.pop("bias", False):
        opts["bias"] = rng.standard_normal((1, Hq, Sq, Sk)).astype(np.float32)
    do = rng.standard_normal((B, Hq, Sq, D))
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))

    def loss(qq, kk, vv):
        return (ref.forward(qq, kk, vv, **opts)[0] * do).sum()

    fq = fd_grad(lambda x: loss(x, k64, v64), q64.copy())
    fk = fd_grad(lambda x: loss(q64, x, v64), k64.copy())
    fv = fd_grad(lambda x: loss(q64, k64, x), v64.copy())
    # the reference's analytic backward first (it checks the other fronts' gradients)
    rq, rk, rv, _ = ref.backward(q64, k64, v64, do, **opts)
    for name, g, f in (("ref dq", rq, fq), ("ref dk", rk, fk), ("ref dv", rv, fv)):
        check(name, g, f, 1e-7)
    o, lse = flashattn.attention(q, k, v, return_lse=True, **opts)
    dq, dk, dv = flashattn.attention_backward(q, k, v, o, lse, do.astype(np.float32), **opts)
    for name, g, f in (("dq", dq, fq), ("dk", dk, fk), ("dv", dv, fv)):
        check(name, g, f, BWD_TOL["f32"])


def test_torch_gradients_match_finite_differences(rng):
    torch = pytest.importorskip("torch")
    import flashattn.torch as fat
    q = rng.standard_normal((1, 2, 4, 4))
    k = rng.standard_normal((1, 2, 7, 4))
    v = rng.standard_normal((1, 2, 7, 4))
    do = rng.standard_normal((1, 2, 4, 4))
    opts = dict(causal=True, softcap=2.0)
    tq, tk, tv = (torch.tensor(a, dtype=torch.float32, requires_grad=True) for a in (q, k, v))
    o = fat.attention(tq, tk, tv, **opts)
    got = torch.autograd.grad(o, (tq, tk, tv), torch.tensor(do, dtype=torch.float32))
    q64, k64, v64 = (a.astype(np.float32).astype(np.float64) for a in (q, k, v))

    def loss(qq, kk, vv):
        return (ref.forward(qq, kk, vv, **opts)[0] * do.astype(np.float32)).sum()

    want = (fd_grad(lambda x: loss(x, k64, v64), q64.copy()),
            fd_grad(lambda x: loss(q64, x, v64), k64.copy()),
            fd_grad(lambda x: loss(q64, k64, x), v64.copy()))
    for name, g, f in zip(("dq", "dk", "dv"), got, want):
        check(name, g.numpy(), f, BWD_TOL["f32"])
