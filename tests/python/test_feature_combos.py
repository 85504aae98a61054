"""The features of issues 19-21 combined with each other, through the torch front: a
flashattn.masks mask, attention sinks, dropout, a bias broadcast over query rows
(bias_seq_q = 1), GQA and softcap, forward and gradients (q, k, v, bias, sinks) against a
float64 reference written here in eager torch from the definitions in docs/semantics.md
and docs/masks.md (the dropout keep mask is the library's own, flashattn.dropout_keep_mask,
as the test hook docs/semantics.md names). Each branch was tested alone; this catches a
path that forgets a rule another keeps once they share the kernels."""
import itertools
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import flashattn  # noqa: E402
import flashattn.torch as ft  # noqa: E402
from flashattn import masks  # noqa: E402

SEED = int(os.environ.get("FA_TEST_SEED", "20261202"))


def reference(q, k, v, attend, sinks, keep, p_drop, bias, softcap, scale):
    """o [B, H, Sq, Dv] in float64: scores, softcap, bias, mask, sink column, softmax, dropout."""
    B, H, Sq, D = q.shape
    Hk = k.shape[1]
    kk, vv = (t.repeat_interleave(H // Hk, dim=1) for t in (k, v))
    s = torch.einsum("bhid,bhjd->bhij", q, kk) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    s = s.masked_fill(~attend, float("-inf"))
    if sinks is not None:
        col = sinks.view(1, H, 1, 1).expand(B, H, Sq, 1)
        p = torch.softmax(torch.cat([s, col], -1), -1)[..., :-1]
    else:
        p = torch.softmax(s, -1)
    p = torch.nan_to_num(p, nan=0.0)  # a row with no key and no sink
    if keep is not None:
        p = p * keep / (1.0 - p_drop)
    return torch.einsum("bhij,bhjd->bhid", p, vv)


CASES = list(itertools.product(["causal&window", "chunked|documents", "array"], [False, True], [0.0, 0.2],
                               [False, True]))


@pytest.mark.parametrize("mask_kind,sinks_on,p_drop,bias_row", CASES)
def test_combination_matches_reference(mask_kind, sinks_on, p_drop, bias_row):
    print(f"FA_TEST_SEED={SEED}")
    rng = np.random.default_rng([SEED, CASES.index((mask_kind, sinks_on, p_drop, bias_row))])
    B, H, Hk, Sq, Sk, D = 2, 4, 2, 37, 53, 16
    softcap, scale = 20.0, 0.3
    off = Sk - Sq
    if mask_kind == "causal&window":
        m = masks.causal() & masks.window(9, 3)
        i, j = np.arange(Sq)[:, None] + off, np.arange(Sk)[None, :]
        attend = np.broadcast_to((j <= i) & (j >= i - 9) & (j <= i + 3), (B, H, Sq, Sk))
    elif mask_kind == "chunked|documents":
        m = masks.chunked(8) | masks.documents([20, 33])  # documents need Sq == Sk: sizes below
        Sq = Sk = 53
        i, j = np.arange(Sq)[:, None], np.arange(Sk)[None, :]
        doc = lambda x: (x >= 20).astype(int)  # noqa: E731
        attend = np.broadcast_to(((j <= i) & (j // 8 == i // 8)) | (doc(i) == doc(j)), (B, H, Sq, Sk))
    else:
        attend = rng.random((B, H, Sq, Sk)) < 0.6
        attend[0, 1, 3] = False  # a row that sees no key
        m = masks.from_array(attend)
    attend = torch.from_numpy(np.ascontiguousarray(attend))
    t = lambda *s: torch.from_numpy(rng.standard_normal(s))  # noqa: E731
    q, k, v = t(B, Sq, H, D), t(B, Sk, Hk, D), t(B, Sk, Hk, D)
    bias = t(B, H, 1, Sk) if bias_row else None
    sinks = t(H) if sinks_on else None
    do = t(B, Sq, H, D)
    leaves = [x for x in (q, k, v, bias, sinks) if x is not None]

    ours = [x.float().requires_grad_() for x in leaves]
    it = iter(ours)
    oq, ok_, ov = next(it), next(it), next(it)
    ob = next(it) if bias_row else None
    osk = next(it) if sinks_on else None
    kw = dict(mask=m, softcap=softcap, scale=scale, bias=ob, sinks=osk, layout="bshd")
    if p_drop:
        kw.update(dropout_p=p_drop, seed=1234)
    o = ft.attention(oq, ok_, ov, **kw)
    o.backward(do.float())

    keep = None
    if p_drop:
        keep = torch.from_numpy(np.stack([np.stack([flashattn.dropout_keep_mask(p_drop, 1234, b, h, Sq, Sk)
                                                    for h in range(H)]) for b in range(B)])).double()
    refs = [x.clone().requires_grad_() for x in leaves]
    it = iter(refs)
    rq, rk, rv = (next(it).transpose(1, 2) for _ in range(3))
    rb = next(it) if bias_row else None
    rs = next(it) if sinks_on else None
    ro = reference(rq, rk, rv, attend, rs, keep, p_drop, rb, softcap, scale).transpose(1, 2)
    ro.backward(do)

    tol = 2e-5 * (1 + ro.abs().max().item())
    assert torch.allclose(o.double(), ro, atol=tol, rtol=0), (o.double() - ro).abs().max()
    names = ["dq", "dk", "dv"] + ["dbias"] * bias_row + ["dsink"] * sinks_on
    for name, a, r in zip(names, ours, refs):
        g, rg = a.grad.double(), r.grad
        assert g.shape == rg.shape, name
        err = (g - rg).abs().max().item()
        assert err <= 1e-4 * (1 + rg.abs().max().item()), f"{name}: {err}"


@pytest.mark.parametrize("bias_scale", [-0.7, 0.3])
def test_masked_scaled_dbias_same_bits_in_numpy_and_torch(rng, bias_scale):
    """A bias of the call's full shape with a boolean mask and bias_scale: numpy's dbias is
    bias_scale times the library's, as torch's autograd gives it, to the bit, signed zeros at
    the hidden keys included (numpy once summed over no axis, which makes -0.0 +0.0, and
    scaled before it summed)."""
    import torch
    q, do = (rng.standard_normal((1, 2, 5, 8)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((1, 2, 7, 8)).astype(np.float32) for _ in range(2))
    bias = rng.standard_normal((1, 2, 5, 7)).astype(np.float32)
    mask = rng.random((5, 7)) < 0.7
    mask[:, 0] = True
    kw = dict(bias_scale=bias_scale, mask=mask)
    o, lse = flashattn.attention(q, k, v, bias=bias, return_lse=True, **kw)
    db_np = flashattn.attention_backward(q, k, v, o, lse, do, bias=bias, bias_grad=True, **kw)[3]
    tb = torch.from_numpy(bias).requires_grad_()
    ft.attention(*(torch.from_numpy(x) for x in (q, k, v)), bias=tb, bias_scale=bias_scale,
                 mask=torch.from_numpy(mask)).backward(torch.from_numpy(do))
    assert np.array_equal(db_np.view(np.uint32), tb.grad.numpy().view(np.uint32))


def test_bias_scale_without_a_bias_is_refused_by_every_front():
    """bias_scale scales a bias: without one the library refuses it, and a boolean mask alone
    (which the fronts pass as a bias) made it vanish without a word in every front. ValueError
    naming bias_scale and the bias, in numpy, torch, JAX and the plan."""
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    import flashattn.jax as fj
    import flashattn.torch as fat
    q = np.random.default_rng(SEED).standard_normal((1, 2, 4, 8)).astype(np.float32)
    m = np.tril(np.ones((4, 4), bool))
    calls = {"numpy": lambda **kw: flashattn.attention(q, q, q, **kw),
             "torch": lambda **kw: fat.attention(*(torch.from_numpy(q),) * 3,
                                                 **{k: torch.from_numpy(v) if k == "mask" else v for k, v in kw.items()}),
             "jax": lambda **kw: fj.attention(*(jnp.asarray(q),) * 3, layout="bhsd", **kw),
             "plan": lambda **kw: flashattn.plan(batch=1, heads=2, seq_q=4, head_dim=8,
                                                 **{"mask_shape" if k == "mask" else k: (4, 4) if k == "mask" else v
                                                    for k, v in kw.items()})}
    for name, f in calls.items():
        for kw in ({"bias_scale": 2.0}, {"bias_scale": 2.0, "mask": m}):
            with pytest.raises(ValueError, match="bias_scale.*needs a bias"):
                f(**kw)
        f(mask=m)  # without bias_scale the mask runs
