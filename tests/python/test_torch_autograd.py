"""Autograd and torch.func over flashattn.torch: the gradient through a returned lse
(against float64 torch autograd), torch.func.grad / vjp / vmap, forward-mode AD refused by
name, meta and fake tensors, torch.autocast; attention and varlen_attention."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flashattn.torch as fat  # noqa: E402
from conftest import BWD_TOL, SEED, check  # noqa: E402


def f64(x):
    return x.detach().to(torch.float64).numpy()


def math_attention(q, k, v, visible, bias=None, softcap=None):
    """(o, lse) in float64 torch, differentiable; rows with no visible key give o = 0 and
    lse = -inf with zero gradients (docs/nonfinite.md)."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    dead = ~visible.any(-1, keepdim=True)
    s = torch.where(visible & ~dead, s, torch.where(dead, 0.0, float("-inf")))
    lse = torch.logsumexp(s, -1)
    o = torch.where(dead, 0.0, torch.softmax(s, -1) @ v)
    return o, torch.where(dead[..., 0], float("-inf"), lse)


def _inputs(gen, B=2, Hq=4, Hk=2, Sq=9, Sk=13, D=16, Dv=8):
    return tuple(torch.randn(shape, generator=gen, dtype=torch.float64)
                 for shape in ((B, Hq, Sq, D), (B, Hk, Sk, D), (B, Hk, Sk, Dv)))


def _gen():
    return torch.Generator().manual_seed(SEED)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("use_o", [True, False])
def test_gradient_through_lse(layout, use_o):
    gen = _gen()
    q, k, v = _inputs(gen)
    mask = torch.rand(9, 13, generator=gen) < 0.6
    mask[4] = False  # a row with no visible key: lse = -inf, no gradient
    ins32 = [x.float().requires_grad_() for x in (q, k, v)]
    tr = (lambda x: x.transpose(1, 2)) if layout == "bshd" else (lambda x: x)
    o, lse = fat.attention(*(tr(x) for x in ins32), mask=mask, layout=layout, return_lse=True)
    o = tr(o)
    wo = torch.randn(o.shape, generator=gen, dtype=torch.float64)
    wl = torch.randn(lse.shape, generator=gen, dtype=torch.float64)
    fin = torch.isfinite(lse)
    loss = (o * wo.float()).sum() * use_o + (lse[fin] * wl[fin].float()).sum()
    got = torch.autograd.grad(loss, ins32)
    ins64 = [x.clone().requires_grad_() for x in (q, k, v)]
    ro, rl = math_attention(*ins64, mask.expand(2, 4, 9, 13))
    rloss = (ro * wo).sum() * use_o + (rl[fin] * wl[fin]).sum()
    want = torch.autograd.grad(rloss, ins64)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        check(name, f64(g), f64(w), BWD_TOL["f32"])


def test_gradient_through_lse_with_bias_and_softcap():
    """dlse reaches dbias and goes through the softcap's derivative as o's cotangent does."""
    gen = _gen()
    q, k, v = _inputs(gen)
    bias = torch.randn(1, 4, 9, 13, generator=gen, dtype=torch.float64)
    ins32 = [x.float().requires_grad_() for x in (q, k, v, bias)]
    o, lse = fat.attention(*ins32[:3], bias=ins32[3], softcap=3.0, return_lse=True)
    wl = torch.randn(lse.shape, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad(o.sum() + (lse * wl.float()).sum(), ins32)
    ins64 = [x.clone().requires_grad_() for x in (q, k, v, bias)]
    ro, rl = math_attention(*ins64[:3], torch.ones(2, 4, 9, 13, dtype=torch.bool), ins64[3], softcap=3.0)
    want = torch.autograd.grad(ro.sum() + (rl * wl).sum(), ins64)
    for name, g, w in zip(("dq", "dk", "dv", "dbias"), got, want):
        check(name, f64(g), f64(w), BWD_TOL["f32"])


def test_varlen_gradient_through_lse():
    gen = _gen()
    lens = [5, 0, 8]
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)
    q, k, v = (torch.randn(13, h, d, generator=gen) for h, d in ((4, 16), (2, 16), (2, 8)))
    ins = [x.requires_grad_() for x in (q, k, v)]
    o, lse = fat.varlen_attention(*ins, cu, cu, causal=True, return_lse=True)
    wl = torch.randn(lse.shape, generator=gen)
    got = torch.autograd.grad((lse * wl).sum() + o.sum(), ins)
    want = [torch.zeros_like(x, dtype=torch.float64) for x in ins]
    for b in range(3):
        a, e = int(cu[b]), int(cu[b + 1])
        if a == e:
            continue
        part = [x.detach()[a:e].double().transpose(0, 1)[None].requires_grad_() for x in ins]
        vis = torch.ones(e - a, e - a, dtype=torch.bool).tril()
        ro, rl = math_attention(*part, vis.expand(1, 4, e - a, e - a))
        gs = torch.autograd.grad((rl[0] * wl[:, a:e].double()).sum() + ro.sum(), part)
        for w, g in zip(want, gs):
            w[a:e] = g[0].transpose(0, 1)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        check(name, f64(g), f64(w), BWD_TOL["f32"])


def test_func_grad_vjp_and_vmap():
    gen = _gen()
    q, k, v = (x.float() for x in _inputs(gen))

    def loss(q, k, v):
        o, lse = fat.attention(q, k, v, causal=True, return_lse=True)
        return (o ** 2).sum() + lse.sum()

    want = torch.autograd.grad(loss(*(x.requires_grad_() for x in (q, k, v))), (q, k, v))
    q, k, v = (x.detach() for x in (q, k, v))
    got = torch.func.grad(loss, argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    o, pull = torch.func.vjp(lambda q: fat.attention(q, k, v), q)
    do = torch.randn(o.shape, generator=gen)
    torch.testing.assert_close(pull(do)[0], torch.autograd.grad(fat.attention(q.requires_grad_(), k, v), q, do)[0])
    q = q.detach()
    # vmap over a leading dim of q only, and per-sample gradients (vmap of grad)
    qs = torch.randn((3,) + tuple(q.shape), generator=gen)
    got = torch.func.vmap(lambda q: fat.attention(q, k, v))(qs)
    torch.testing.assert_close(got, torch.stack([fat.attention(x, k, v) for x in qs]))
    per = torch.func.vmap(torch.func.grad(lambda q: loss(q, k, v)))(qs)
    torch.testing.assert_close(per, torch.stack([torch.func.grad(lambda q: loss(q, k, v))(x) for x in qs]))
    # a vmapped mask (lowered inside the vmap) and per-example bias gradients
    masks = torch.rand(3, 9, 13, generator=gen) < 0.6
    got = torch.func.vmap(lambda m: fat.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True))(masks)
    torch.testing.assert_close(got, torch.stack([fat.attention(q, k, v, mask=m) for m in masks]))
    biases = torch.randn(3, 9, 13, generator=gen)

    def bias_loss(b):
        return (fat.attention(q, k, v, bias=b) ** 2).sum()
    per = torch.func.vmap(torch.func.grad(bias_loss))(biases)
    torch.testing.assert_close(per, torch.stack([torch.func.grad(bias_loss)(b) for b in biases]))


@pytest.mark.parametrize("fn", ["attention", "scaled_dot_product_attention"])
@pytest.mark.parametrize("how", ["func.jvp", "forward_ad"])
def test_forward_mode_names_the_op(how, fn):
    """Refused naming the op and the function called (the SDPA drop-in's named attention)."""
    q = torch.randn(1, 2, 5, 8)
    f = getattr(fat, fn)
    with pytest.raises(NotImplementedError, match=f"flashattn::attention_fwd .*{fn}"):
        if how == "func.jvp":
            torch.func.jvp(lambda q: f(q, q, q), (q,), (torch.ones_like(q),))
        else:
            import torch.autograd.forward_ad as fwAD
            with fwAD.dual_level():
                f(fwAD.make_dual(q, torch.ones_like(q)), q, q)


def test_meta_and_fake_tensors_give_shapes():
    q, k, v = torch.empty(2, 4, 7, 16, device="meta"), torch.empty(2, 2, 9, 16, device="meta"), \
        torch.empty(2, 2, 9, 24, device="meta")
    o, lse = fat.attention(q, k, v, causal=True, mask=torch.ones(9, dtype=torch.bool, device="meta").expand(7, 9),
                           return_lse=True)
    assert o.shape == (2, 4, 7, 24) and o.device.type == "meta" and lse.shape == (2, 4, 7)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q, k = torch.empty(2, 7, 4, 16), torch.empty(2, 9, 2, 16)
        seg = torch.zeros(2, 7, dtype=torch.int64)
        o, lse = fat.attention(q, k, k, layout="bshd", return_lse=True, q_segment_ids=seg,
                               kv_segment_ids=torch.zeros(2, 9, dtype=torch.int64))
        assert o.shape == (2, 7, 4, 16) and lse.shape == (2, 4, 7) and lse.dtype == torch.float32
        o = fat.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), k.transpose(1, 2),
                                             enable_gqa=True)
        assert o.shape == (2, 4, 7, 16)


def test_autocast_casts_as_sdpa():
    gen = _gen()
    q, k, v = (x.float() for x in _inputs(gen, Hk=4))
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        o = fat.attention(q, k, v)
        r = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        s = fat.scaled_dot_product_attention(q, k, v)
    assert o.dtype == r.dtype == s.dtype == torch.bfloat16
    want = fat.attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    torch.testing.assert_close(o, want, rtol=0, atol=0)


def test_autocast_casts_mixed_dtypes_before_checking(rng):
    """Under autocast SDPA casts q, k, v first, so q f32, k bf16, v f32 are one dtype; so do
    attention, the drop-in and varlen_attention. float64, which autocast leaves as it is,
    stays refused (ValueError naming the dtypes flashattn computes in)."""
    q, k, v = (torch.from_numpy(rng.standard_normal((2, 4, 9, 16)).astype(np.float32)) for _ in range(3))
    k = k.bfloat16()
    want = fat.attention(q.bfloat16(), k, v.bfloat16())
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        r = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        o = fat.attention(q, k, v)
        s = fat.scaled_dot_product_attention(q, k, v)
        cu = torch.tensor([0, 4, 9], dtype=torch.int32)
        ov = fat.varlen_attention(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu, cu)
        for f in (fat.attention, fat.scaled_dot_product_attention):
            with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
                f(q.double(), k.double(), v.double())
    assert o.dtype == r.dtype == s.dtype == ov.dtype == torch.bfloat16
    torch.testing.assert_close(o, want, rtol=0, atol=0)
    torch.testing.assert_close(s, want, rtol=0, atol=0)
    wv = fat.varlen_attention(*(t[0].transpose(0, 1).bfloat16() for t in (q, k, v)), cu, cu)
    torch.testing.assert_close(ov, wv, rtol=0, atol=0)
    with pytest.raises(ValueError, match="one dtype"):  # without autocast, mixed dtypes stay refused
        fat.attention(q, k, v)


def test_compile_fullgraph_with_mask_lse_and_shared_kv():
    """torch.compile(fullgraph=True) through the autograd.Function: a mask, the lse's
    gradient, one tensor passed as both k and v, and the SDPA drop-in."""
    gen = _gen()
    q, k, _ = (x.float().requires_grad_() for x in _inputs(gen, Dv=16))
    mask = torch.rand(2, 1, 1, 13, generator=gen) < 0.7

    def f(q, k):
        o, lse = fat.attention(q, k, k, mask=mask, return_lse=True)
        s = fat.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True)
        return (o * s).sum() + lse[lse.isfinite()].sum()

    want = torch.autograd.grad(f(q, k), (q, k))
    got = torch.autograd.grad(torch.compile(f, fullgraph=True)(q, k), (q, k))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("front", ["attention", "sdpa"])
def test_double_backward_raises(rng, front):
    """A gradient penalty (create_graph=True, then a backward through the gradient): the
    backward kernel is not differentiable, so the second backward raises, as torch's own
    SDPA does, instead of dropping the second-order terms. A first-order create_graph
    gradient still equals the plain one."""
    f = fat.attention if front == "attention" else fat.scaled_dot_product_attention
    q, k, v = (torch.from_numpy(rng.standard_normal((1, 2, 6, 8)).astype(np.float32)).requires_grad_()
               for _ in range(3))
    w = torch.from_numpy(rng.standard_normal((1, 2, 6, 8)).astype(np.float32))
    gq, = torch.autograd.grad((f(q, k, v) * w).sum(), q, create_graph=True)
    plain, = torch.autograd.grad((f(q, k, v) * w).sum(), q)
    assert torch.equal(gq.detach(), plain)
    with pytest.raises(NotImplementedError, match="double backward"):
        ((f(q, k, v) * w).sum() + gq.square().sum()).backward()


@pytest.mark.parametrize("front", ["attention", "varlen"])
def test_compile_fullgraph_dropout_with_lse(front):
    """torch.compile(fullgraph=True) of a call with dropout and return_lse whose lse gets no
    gradient (Dynamo traces the lse refusal's backward ahead of time, and it once raised
    there, failing every such compile): o's gradients equal eager's and the float64
    reference with the kernels' keep mask; a gradient reaching lse still raises
    NotImplementedError, when the backward runs, and o alone beside a returned lse does not."""
    import flashattn
    torch._dynamo.reset()
    p, seed, H, S = 0.25, 3, 2, 8
    gen = _gen()
    q64, k64, v64 = _inputs(gen, B=1, Hq=H, Hk=H, Sq=S, Sk=S, D=16, Dv=16)
    w = torch.randn(1, H, S, 16, generator=gen)
    if front == "attention":
        def call(q, k, v):
            return fat.attention(q, k, v, dropout_p=p, seed=seed, return_lse=True)
    else:  # one sequence, [S, H, D] rows
        cu = torch.tensor([0, S], dtype=torch.int32)

        def call(q, k, v):
            o, lse = fat.varlen_attention(*(x[0].transpose(0, 1) for x in (q, k, v)), cu, cu, dropout_p=p,
                                          seed=seed, return_lse=True)
            return o.transpose(0, 1)[None], lse[None]

    def loss(q, k, v):
        o, lse = call(q, k, v)  # lse unused
        return (o * w).sum()

    ins = [x.float().requires_grad_() for x in (q64, k64, v64)]
    got = torch.autograd.grad(torch.compile(loss, fullgraph=True)(*ins), ins)
    eager = torch.autograd.grad(loss(*ins), ins)
    keep = torch.from_numpy(np.stack([flashattn.dropout_keep_mask(p, seed, 0, h, S, S) for h in range(H)])[None])
    r = [x.clone().requires_grad_() for x in (q64, k64, v64)]
    wts = torch.softmax(r[0] @ r[1].transpose(-1, -2) / 4.0, -1) * keep / (1 - p)
    want = torch.autograd.grad(((wts @ r[2]) * w.double()).sum(), r)
    for name, g, e, ref in zip(("dq", "dk", "dv"), got, eager, want):
        assert torch.equal(g, e), name
        check(name, f64(g), ref.numpy(), BWD_TOL["f32"])
    compiled = torch.compile(call, fullgraph=True)
    o, lse = compiled(*ins)
    with pytest.raises(NotImplementedError, match="through lse with dropout"):
        lse.sum().backward()
    o, lse = compiled(*ins)
    with pytest.raises(NotImplementedError, match="through lse with dropout"):
        ((o * w).sum() + lse.sum()).backward()
    o, lse = compiled(*ins)
    g = torch.autograd.grad((o * w).sum(), ins)  # o alone: lse's zero cotangent passes
    for a, b in zip(g, eager):
        assert torch.equal(a, b)
