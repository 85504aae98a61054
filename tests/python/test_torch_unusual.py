"""The torch front on unusual shapes and tensors (found by its audit): the SDPA drop-in's
output shape where a transposed 4-d query meets 5-d keys (it returned the folded batch),
a mask with size-1 dims beyond the query's (torch broadcasts them away), its mask-shape
message; quantize_cache's dtype message, meta and fake tensors, and torch.compile."""
import pytest

torch = pytest.importorskip("torch")

import flashattn.torch as fat  # noqa: E402
from conftest import SEED  # noqa: E402


def sdpa64(q, k, v, mask=None):
    return torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                            None if mask is None else mask)


def test_transposed_query_against_5d_keys_keeps_torch_shape():
    g = torch.Generator().manual_seed(SEED)
    q = torch.randn(3, 5, 4, 8, generator=g).transpose(1, 2)  # [B, H, L, E] in [B, L, H, E] memory
    k, v = torch.randn(2, 3, 4, 7, 8, generator=g), torch.randn(2, 3, 4, 7, 8, generator=g)
    o = fat.scaled_dot_product_attention(q, k, v)
    want = sdpa64(q, k, v)
    assert o.shape == want.shape == (2, 3, 4, 5, 8)
    assert (o.double() - want).abs().max() < 1e-5
    o = fat.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert o.shape == (2, 3, 4, 5, 8)


def test_mask_with_size1_dims_beyond_the_query():
    g = torch.Generator().manual_seed(SEED)
    q, k, v = torch.randn(4, 5, 8, generator=g), torch.randn(4, 7, 8, generator=g), torch.randn(4, 7, 8, generator=g)
    mask = torch.rand(1, 4, 5, 7, generator=g) > 0.3
    mask[..., 0] = True
    o = fat.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    want = sdpa64(q, k, v, mask)
    assert o.shape == want.shape == (4, 5, 8)
    assert (o.double() - want).abs().max() < 1e-5


def test_mask_shape_message_names_attn_mask():
    q = torch.randn(2, 4, 5, 8)
    with pytest.raises(RuntimeError, match=r"attn_mask of shape \[2, 4, 5, 8\] does not broadcast"):
        fat.scaled_dot_product_attention(q, q[:, :, :1].expand(2, 4, 7, 8), q[:, :, :1].expand(2, 4, 7, 8),
                                         attn_mask=torch.ones(2, 4, 5, 8, dtype=torch.bool))
    with pytest.raises(RuntimeError, match=r"attn_mask of shape \[2, 1, 5, 5\] does not broadcast"):
        fat.scaled_dot_product_attention(q[0], q[0], q[0], attn_mask=torch.ones(2, 1, 5, 5, dtype=torch.bool))


def test_quantize_cache_dtype_message_meta_fake_and_compile():
    k = torch.randn(2, 9, 2, 8)
    for bad in ("int4", torch.float16, None):
        with pytest.raises(ValueError, match="quantize_cache: dtype must be one of int8, fp8, got"):
            fat.quantize_cache(k, k, bad)
    meta = torch.empty(2, 9, 2, 8, device="meta")
    kq, ks, vq, vs = fat.quantize_cache(meta, meta, "fp8")
    assert (kq.shape, kq.dtype, ks.shape, ks.dtype) == ((2, 9, 2, 8), torch.float8_e4m3fn, (2, 9, 2), torch.float32)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        f = torch.randn(2, 9, 2, 8)
        kq, ks, _, _ = fat.quantize_cache(f, f, "int8")
        assert kq.shape == (2, 9, 2, 8) and kq.dtype == torch.int8 and ks.shape == (2, 9, 2)
    eager = fat.quantize_cache(k, k, "int8")
    compiled = torch.compile(lambda a, b: fat.quantize_cache(a, b, "int8"), backend="aot_eager")(k, k)
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled))  # a graph break, the same results
    with pytest.raises(Exception, match="runs on the host"):
        torch.compile(lambda a, b: fat.quantize_cache(a, b, "int8"), fullgraph=True, backend="aot_eager")(k, k)


def test_bias_shape_message_names_the_callers_shape():
    """A bias that does not broadcast is reported in the shape the caller gave (it showed
    the shape padded to 4 dims, (1, 5, 7, 1) for a (5, 7, 1) bias), as numpy's front does."""
    q = torch.randn(2, 4, 5, 8)
    with pytest.raises(ValueError, match=r"bias shape \(5, 7, 1\) must broadcast"):
        fat.attention(q, q, q, bias=torch.randn(5, 7, 1))


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_unsigned_integer_ids(dtype):
    """Segment ids and prefix sums of unsigned dtypes run (torch has no min or max of them:
    they raised torch's NotImplementedError); values past int32 are refused naming the
    argument, as python.md says."""
    q = torch.randn(1, 2, 8, 16)
    ids = (torch.arange(8) // 3).to(dtype)[None]
    want = fat.attention(q, q, q, q_segment_ids=ids.to(torch.int32), kv_segment_ids=ids.to(torch.int32))
    assert torch.equal(fat.attention(q, q, q, q_segment_ids=ids, kv_segment_ids=ids), want)
    if dtype != torch.uint16:  # which holds no value past int32
        big = ids.clone()
        big[0, 3] = 2**31
        with pytest.raises(ValueError, match=f"q_segment_ids must fit int32, got {2**31}"):
            fat.attention(q, q, q, q_segment_ids=big, kv_segment_ids=ids)
    cu = torch.tensor([0, 3, 8], dtype=dtype)
    packed = q[0].transpose(0, 1).contiguous()
    assert torch.equal(fat.varlen_attention(packed, packed, packed, cu, cu),
                       fat.varlen_attention(packed, packed, packed, cu.to(torch.int32), cu.to(torch.int32)))


def test_decode_output_refuses_a_gradient_in_words():
    """kvcache_attention has no backward: sinks (a gpt-oss Parameter) or a prefix that require
    grad were detached, so their gradient stayed None silently, and q's backward raised torch's
    message about registering an autograd formula. A gradient reaching o or lse now raises in
    words; under no_grad, or from inputs that need none, nothing changes; compiled, as before."""
    q, kc, vc = torch.randn(1, 1, 4, 16), torch.randn(1, 32, 2, 16), torch.randn(1, 32, 2, 16)
    lens = torch.tensor([10], dtype=torch.int32)
    sinks = torch.nn.Parameter(torch.randn(4))
    kp = torch.randn(5, 2, 16, requires_grad=True)
    for kw, qq in ((dict(sinks=sinks), q), (dict(k_prefix=kp, v_prefix=kp.detach()), q),
                   (dict(), q.clone().requires_grad_())):
        o, lse = fat.kvcache_attention(qq, kc, vc, cache_seqlens=lens, return_lse=True, **kw)
        for t in (o, lse):
            with pytest.raises(RuntimeError, match="kvcache_attention has no backward"):
                t.sum().backward(retain_graph=True)
        with torch.no_grad():
            assert not fat.kvcache_attention(qq, kc, vc, cache_seqlens=lens, **kw).requires_grad
    assert sinks.grad is None and kp.grad is None
    # torch.func too (grad met torch's own message; jvp gave a zero tangent without a word)
    with pytest.raises(RuntimeError, match="kvcache_attention has no backward"):
        torch.func.grad(lambda s: fat.kvcache_attention(q, kc, vc, cache_seqlens=lens, sinks=s).sum())(sinks.detach())
    with pytest.raises(NotImplementedError, match="kvcache_attention has no derivatives"):
        torch.func.jvp(lambda q: fat.kvcache_attention(q, kc, vc, cache_seqlens=lens), (q,), (torch.ones_like(q),))
    # appends through the refusing path still write the caches
    kc2, kn = kc.clone(), torch.randn(1, 1, 2, 16, requires_grad=True)
    fat.kvcache_attention(q, kc2, vc.clone(), kn, kn.detach(), cache_seqlens=lens)
    assert torch.equal(kc2[0, 10], kn.detach()[0, 0])
    f = torch.compile(lambda q: fat.kvcache_attention(q, kc, vc, cache_seqlens=lens, sinks=sinks), fullgraph=True)
    assert torch.equal(f(q), fat.kvcache_attention(q, kc, vc, cache_seqlens=lens, sinks=sinks.detach()))


def test_sparse_and_nested_tensors_are_refused_in_words():
    """A sparse or nested tensor is named, in every function (torch's internal errors came back
    from deep in the op: "unsupported memory format option Contiguous", "'NestedIntNode' object
    has no attribute 'mod'")."""
    g = torch.Generator().manual_seed(SEED)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g) for _ in range(3))
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    nested = torch.nested.nested_tensor([q[0], q[1, :, :4]], layout=torch.jagged)
    calls = [lambda x: fat.attention(x, k, v), lambda x: fat.attention(q, k, v, bias=x),
             lambda x: fat.scaled_dot_product_attention(x, k, v),
             lambda x: fat.varlen_attention(x, q[0], q[0], cu, cu),
             lambda x: fat.kvcache_attention(x, k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous(),
                                             cache_seqlens=2),
             lambda x: fat.quantize_cache(x, k, "int8"),
             lambda x: fat.merge_states(x, q[..., 0], q, q[..., 0])]
    for call in calls:
        with pytest.raises(ValueError, match=r"must be a dense \(strided\) tensor, got layout torch.sparse_coo"):
            call(q.to_sparse() if call is not calls[3] else q[0].to_sparse())
    with pytest.raises(ValueError, match="is a nested tensor: flashattn takes dense tensors; sequences of different "
                                         "lengths go to varlen_attention"):
        fat.attention(nested, k, v)
    with pytest.raises(ValueError, match="is a nested tensor"):
        fat.scaled_dot_product_attention(nested, nested, nested)
