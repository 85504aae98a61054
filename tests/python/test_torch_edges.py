"""Edges of the PyTorch front: zero-size batch, heads or sequences (empty outputs, o = 0 and
lse = -inf where there are no keys, zero gradients; D = 0 still refused), integers that do
not fit the library's types (ValueError naming the argument, never a wrapped value),
threads= per call, and dtype errors that say which dtypes work."""
import contextlib

import pytest

torch = pytest.importorskip("torch")

import flashattn.torch as fat  # noqa: E402
from flashattn import _native  # noqa: E402


@pytest.mark.parametrize("B, Hq, Hk, Sq, Sk", [(0, 4, 2, 5, 7), (2, 0, 0, 5, 7), (2, 4, 2, 0, 7),
                                                (2, 4, 2, 5, 0), (2, 4, 2, 0, 0)])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_zero_sizes_give_empty_results(B, Hq, Hk, Sq, Sk, layout):
    def mk(*shape):
        x = torch.randn(*shape)
        return (x.transpose(1, 2).contiguous() if layout == "bshd" else x).requires_grad_()
    q, k, v = mk(B, Hq, Sq, 16), mk(B, Hk, Sk, 16), mk(B, Hk, Sk, 8)
    bias = torch.randn(1, Hq, Sq, Sk, requires_grad=True)
    o, lse = fat.attention(q, k, v, causal=True, bias=bias, return_lse=True, layout=layout)
    want = (B, Hq, Sq, 8) if layout == "bhsd" else (B, Sq, Hq, 8)
    assert o.shape == want and lse.shape == (B, Hq, Sq)
    assert (o == 0).all() and (lse == float("-inf")).all()
    grads = torch.autograd.grad(o.sum() + lse[lse.isfinite()].sum(), (q, k, v, bias), allow_unused=True)
    for g, x in zip(grads, (q, k, v, bias)):
        assert g.shape == x.shape and (g == 0).all()


def test_zero_sizes_keep_other_errors():
    q = torch.randn(0, 2, 5, 16)
    with pytest.raises(ValueError, match="head_dim"):
        fat.attention(torch.randn(0, 2, 5, 0), torch.randn(0, 2, 5, 0), torch.randn(0, 2, 5, 0))
    with pytest.raises(ValueError, match="softcap"):
        fat.attention(q, q, q, softcap=-1.0)


def test_zero_sizes_do_not_reach_the_library(monkeypatch):
    def refuse(self, args):
        raise AssertionError("the library was called for an empty problem")
    monkeypatch.setattr(_native.PlanHandle, "forward", refuse)
    monkeypatch.setattr(_native.PlanHandle, "backward", refuse)
    q = torch.randn(2, 2, 0, 16, requires_grad=True)
    torch.autograd.grad(fat.attention(q, q, q).sum(), q)


@pytest.mark.parametrize("kw, name", [
    ({"window": (2**64, 0)}, "window left"), ({"window": (0, 2**63)}, "window right"),
    ({"diag_offset": 2**64}, "diag_offset"), ({"diag_offset": -(2**63) - 1}, "diag_offset"),
    ({"threads": 2**32 + 1}, "threads"),
])
def test_integers_beyond_int64_name_the_argument(kw, name):
    q = torch.randn(1, 2, 5, 16)
    with pytest.raises(ValueError, match=name):
        fat.attention(q, q, q, **kw)


def test_varlen_and_kvcache_integers_beyond_range():
    q = torch.randn(6, 2, 16)
    cu = torch.tensor([0, 6], dtype=torch.int32)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        fat.varlen_attention(q, q, q, cu, cu, max_seqlen_q=2**64)
    with pytest.raises(ValueError, match="cu_seqlens_k must fit int32"):
        fat.varlen_attention(q, q, q, cu, torch.tensor([0, 2**32 + 6]))
    qd, cache = torch.randn(1, 1, 2, 16), torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match="cache_seqlens must fit int32"):
        fat.kvcache_attention(qd, cache, cache, cache_seqlens=torch.tensor([2**32 + 3]))
    with pytest.raises(ValueError, match="window left"):
        fat.kvcache_attention(qd, cache, cache, window=(2**64, 0))


@pytest.mark.parametrize("value", [2**31, -(2**31) - 1])
def test_segment_ids_beyond_int32_do_not_wrap(value):
    q = torch.randn(1, 2, 4, 16)
    q_seg = torch.tensor([[0, 0, value, value]])     # would wrap to other ids as int32
    kv_seg = torch.tensor([[0, 0, 0, 0]])
    with pytest.raises(ValueError, match="q_segment_ids must fit int32"):
        fat.attention(q, q, q, q_segment_ids=q_seg, kv_segment_ids=kv_seg)


def test_threads_per_call_reach_the_options(monkeypatch):
    seen = []
    real = _native.cached_plan

    def spy(problem, options):
        seen.append(options.threads)
        return real(problem, options)
    monkeypatch.setattr(_native, "cached_plan", spy)
    q = torch.randn(1, 2, 9, 16, requires_grad=True)
    o1 = fat.attention(q, q, q, threads=1)
    torch.autograd.grad(o1.sum(), q)
    o0 = fat.attention(q, q, q)
    torch.testing.assert_close(o1, o0, rtol=0, atol=0)
    cu = torch.tensor([0, 9], dtype=torch.int32)
    fat.varlen_attention(q[0].transpose(0, 1), q[0].transpose(0, 1), q[0].transpose(0, 1), cu, cu, threads=2)
    assert seen == [1, 1, 0, 2]


@pytest.mark.parametrize("fn", ["attention", "varlen_attention", "kvcache_attention",
                                "scaled_dot_product_attention"])
def test_float64_says_which_dtypes_work(fn):
    q = torch.randn(1, 2, 5, 16, dtype=torch.float64)
    args = {"attention": (q, q, q), "scaled_dot_product_attention": (q, q, q),
            "varlen_attention": (q[0], q[0], q[0], torch.tensor([0, 2], dtype=torch.int32),
                                 torch.tensor([0, 2], dtype=torch.int32)),
            "kvcache_attention": (q, q, q)}[fn]
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        getattr(fat, fn)(*args)


@pytest.mark.parametrize("total_q, total_k, H, cu_q, cu_k", [
    (0, 0, 2, [0], [0]), (0, 0, 2, [0, 0], [0, 0]), (5, 7, 0, [0, 5], [0, 7]), (5, 0, 2, [0, 2, 5], [0, 0, 0]),
    (0, 7, 2, [0, 0], [0, 7])])
def test_varlen_zero_sizes_give_empty_results(total_q, total_k, H, cu_q, cu_k):
    q = torch.randn(total_q, H, 16, requires_grad=True)
    k, v = torch.randn(total_k, H, 16, requires_grad=True), torch.randn(total_k, H, 8, requires_grad=True)
    cq, ck = torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32)
    o, lse = fat.varlen_attention(q, k, v, cq, ck, causal=True, return_lse=True)
    assert o.shape == (total_q, H, 8) and lse.shape == (H, total_q)
    assert (o == 0).all() and (lse == float("-inf")).all()
    for g, x in zip(torch.autograd.grad(o.sum(), (q, k, v)), (q, k, v)):
        assert g.shape == x.shape and (g == 0).all()
    with pytest.raises(ValueError, match="softcap"):
        fat.varlen_attention(q, k, v, cq, ck, softcap=-1.0)


@pytest.mark.parametrize("q_shape, cache_shape", [((0, 1, 2, 16), (0, 8, 2, 16)), ((2, 0, 2, 16), (2, 8, 2, 16)),
                                                  ((2, 1, 0, 16), (2, 8, 0, 16))])
def test_kvcache_zero_sizes_give_empty_results(q_shape, cache_shape):
    q, kc, vc = torch.randn(q_shape), torch.randn(cache_shape), torch.randn(cache_shape[:3] + (8,))
    before = kc.clone()
    k_new = torch.randn(q_shape[0], q_shape[1], cache_shape[2], 16)
    v_new = torch.randn(q_shape[0], q_shape[1], cache_shape[2], 8)
    o, lse = fat.kvcache_attention(q, kc, vc, k_new, v_new, cache_seqlens=0, return_lse=True)
    assert o.shape == q_shape[:3] + (8,) and lse.shape == (q_shape[0], q_shape[2], q_shape[1])
    assert (o == 0).all() and (lse == float("-inf")).all() and torch.equal(kc, before)
    with pytest.raises(ValueError, match="softcap"):
        fat.kvcache_attention(q, kc, vc, softcap=-1.0)


@pytest.mark.parametrize("name", ["scale", "softcap", "bias_scale", "dropout_p"])
def test_tensor_scalars_are_taken_as_sdpa_takes_them(name):
    """A learnable temperature passed as scale= would get no gradient (the library takes a
    float): TypeError, as F.scaled_dot_product_attention gives for a tensor scale that
    requires grad (or has dims), rather than a silent float() that detaches it; a 0-dim
    tensor that requires none is its value there, and here (it was refused too)."""
    q = torch.randn(1, 2, 5, 8)
    for t in (torch.nn.Parameter(torch.tensor(0.5)), torch.tensor([0.5])):
        kw = {name: t, "bias": torch.randn(1, 2, 5, 5)} if name == "bias_scale" else {name: t}
        with pytest.raises(TypeError, match=f"{name} must be a number or a 0-dim tensor that requires no grad"):
            fat.attention(q, q, q, **kw)
        if name == "scale":
            with pytest.raises(TypeError, match="scale must be a number or a 0-dim tensor"):
                fat.scaled_dot_product_attention(q, q, q, scale=t)
    kw[name] = 0.5  # a number works, and a 0-dim tensor without grad is that number
    seed = {"seed": 3} if name == "dropout_p" else {}
    want = fat.attention(q, q, q, **kw, **seed)
    for t in (torch.tensor(0.5), torch.tensor(0.5, dtype=torch.float64), torch.nn.Parameter(torch.tensor(0.5))):
        kw[name] = t
        with torch.no_grad() if t.requires_grad else contextlib.nullcontext():  # no grad mode: a value
            assert torch.equal(fat.attention(q, q, q, **kw, **seed), want)
    if name == "scale":
        assert torch.equal(fat.scaled_dot_product_attention(q, q, q, scale=torch.tensor(0.5)),
                           fat.scaled_dot_product_attention(q, q, q, scale=0.5))


def test_alibi_slopes_that_require_grad_are_refused():
    """The library computes no gradient for ALiBi slopes: learnable slopes were detached and
    their .grad silently stayed None. Now TypeError; detached slopes, or any under no_grad, run."""
    q = torch.randn(1, 2, 5, 8, requires_grad=True)
    slopes = torch.nn.Parameter(torch.tensor([0.5, 0.25]))
    with pytest.raises(TypeError, match="alibi_slopes requires grad"):
        fat.attention(q, q, q, alibi_slopes=slopes)
    with pytest.raises(TypeError, match="alibi_slopes requires grad"):
        fat.varlen_attention(q[0].transpose(0, 1), q[0].transpose(0, 1), q[0].transpose(0, 1),
                             torch.tensor([0, 5], dtype=torch.int32), torch.tensor([0, 5], dtype=torch.int32),
                             alibi_slopes=slopes)
    o = fat.attention(q, q, q, alibi_slopes=slopes.detach())
    o.sum().backward()
    assert q.grad is not None and slopes.grad is None
    with torch.no_grad():
        assert torch.equal(fat.attention(q, q, q, alibi_slopes=slopes), o)
