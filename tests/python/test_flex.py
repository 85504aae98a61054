"""FlexAttention's BlockMask in flashattn.torch: the mask the library builds from it (its listed
blocks, mask_mod on the partial ones) against create_mask restricted to those blocks;
attention(block_mask=bm) against flex_attention(q, k, v, block_mask=bm) in eager mode on the
CPU (forward; FlexAttention has no CPU backward, so the gradients are checked against
autograd through softmax over flex's own create_mask, in float64); flex_cost's flops_useful
against the popcount of the mask.
Random cases draw from the run's seed (FA_TEST_SEED)."""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
flex = pytest.importorskip("torch.nn.attention.flex_attention")

import flashattn.torch as ft  # noqa: E402
from conftest import SEED  # noqa: E402
from flashattn._torch_flex import from_block_mask  # noqa: E402


def _mods(rng, S):
    cut = sorted(rng.choice(np.arange(1, S), 3, replace=False).tolist())
    doc = torch.from_numpy(np.repeat(np.arange(4), np.diff([0] + cut + [S])))
    w = int(rng.integers(8, 64))
    prefix = torch.tensor([int(rng.integers(0, S)), int(rng.integers(0, S))])
    return {
        "causal": lambda b, h, q, kv: q >= kv,
        "sliding": lambda b, h, q, kv: (q >= kv) & (q - kv <= w),
        "documents": lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv),
        "prefix_per_batch": lambda b, h, q, kv: (kv < prefix[b]) | (q >= kv),
        "per_head": lambda b, h, q, kv: ((q + h) % 3 != kv % 2) & (kv <= q + 40 * h),
    }


def _block_mask(fn, B, H, Sq, Sk, block, separate=True):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flex.create_block_mask(fn, B, H, Sq, Sk, device="cpu", BLOCK_SIZE=block,
                                      separate_full_blocks=separate)


def _listed(bm, B, H, Sq, Sk):
    """[B, H, Sq, Sk] bool: the elements of the blocks the BlockMask lists (full or partial)."""
    bq, bk = bm.BLOCK_SIZE
    out = np.zeros((B, H, Sq, Sk), bool)
    for num, idx in ((bm.kv_num_blocks, bm.kv_indices), (bm.full_kv_num_blocks, bm.full_kv_indices)):
        if num is None:
            continue
        num = num.expand(B, H, -1).numpy()
        idx = idx.expand(B, H, -1, -1).numpy()
        for b, h, qb in np.ndindex(*num.shape):
            for kb in idx[b, h, qb, :num[b, h, qb]]:
                out[b, h, qb * bq:(qb + 1) * bq, kb * bk:(kb + 1) * bk] = True
    return out


@pytest.mark.parametrize("Sq,Sk,block", [(200, 200, 64), (150, 200, (32, 64))])
def test_block_mask_as_built(rng, Sq, Sk, block):
    print(f"seed {SEED}")
    B, H = 2, 3
    for name, fn in _mods(rng, max(Sq, Sk)).items():
        for bB, bH in ((B, H), (1, 1)):
            if name not in ("causal", "documents") and (bB, bH) == (1, 1):
                continue  # shared over batch and heads: two cases are enough (and the others depend on b or h)
            bm = _block_mask(fn, bB, bH, Sq, Sk, block)
            want = flex.create_mask(fn, bB, bH, Sq, Sk, device="cpu").numpy() & _listed(bm, bB, bH, Sq, Sk)
            got = from_block_mask(bm).build(B, H, Sq, Sk).to_dense()
            assert np.array_equal(got, want), name
    # listed blocks only: a BlockMask whose full blocks were dropped visits the partial ones alone
    bm = _block_mask(lambda b, h, q, kv: q >= kv, 1, 1, Sq, Sk, block)
    bm.full_kv_num_blocks.zero_()
    want = (np.arange(Sq)[:, None] >= np.arange(Sk)[None, :]) & _listed(bm, 1, 1, Sq, Sk)[0, 0]
    got = from_block_mask(bm).build(1, 1, Sq, Sk).to_dense()[0, 0]
    assert np.array_equal(got, want) and got.sum() < want.size
    # separate_full_blocks=False: every listed block is partial (mask_mod everywhere)
    bm = _block_mask(lambda b, h, q, kv: q >= kv, 1, 1, Sq, Sk, block, separate=False)
    _, full, partial = from_block_mask(bm).build(1, 1, Sq, Sk).stats()
    assert full == 0 and partial > 0


def _flex(q, k, v, bm, scale=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            return flex.flex_attention(q, k, v, block_mask=bm, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def _dense_flex(q, k, v, bm):
    """Differentiable float64 attention over flex's own mask (create_mask of bm.mask_mod on
    the blocks bm lists); a row with no visible key gives 0, as flex_attention does."""
    B, Hq, S, D = q.shape
    Sk = k.shape[2]
    attend = torch.from_numpy(flex.create_mask(bm.mask_mod, B, Hq, S, Sk, device="cpu").numpy()
                              & _listed(bm, B, Hq, S, Sk))
    rep = Hq // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = (q @ k.transpose(-1, -2)) / D ** 0.5
    s = s.masked_fill(~attend, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ v


@pytest.mark.parametrize("name", ["causal", "documents", "per_head", "prefix_per_batch"])
def test_attention_matches_flex(rng, name):
    B, Hq, Hk, S, D = 2, 4, 2, 192, 16
    fn = _mods(rng, S)[name]
    bm = _block_mask(fn, B, Hq, S, S, 64)
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    q, k, v = (torch.randn(B, h, S, D, generator=g, dtype=torch.float64) for h in (Hq, Hk, Hk))
    do = torch.randn(B, Hq, S, D, generator=g, dtype=torch.float64)
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    o_flex = _flex(q, k, v, bm)
    o_ref = _dense_flex(*ref, bm)
    o_ref.backward(do)
    assert (o_ref.detach() - o_flex).abs().max().item() <= 1e-10  # the dense reference is flex's
    mine = [t.to(torch.float32).requires_grad_() for t in (q, k, v)]
    o = ft.attention(*mine, block_mask=bm)
    o.backward(do.to(torch.float32))
    scale = o_flex.abs().max().item()
    assert (o.double() - o_flex).abs().max().item() <= 1e-5 * scale
    for got, want in zip(mine, ref):
        err = (got.grad.double() - want.grad).abs().max().item()
        assert err <= 5e-5 * want.grad.abs().max().item(), name


@pytest.mark.parametrize("bB,bH", [(None, None), (2, None), (None, 4)])
def test_shared_block_mask_with_b_h_dependent_mask_mod(rng, bB, bH):
    """A BlockMask made with B=None or H=None (block lists shared, built at b = 0, h = 0)
    whose mask_mod depends on b or h: flex_attention calls mask_mod with the real b and h, so
    flashattn evaluates the partial blocks at every b and h of the call. The mask_mods keep
    the same blocks partial for every b and h (so the shared lists cover every head's mask)."""
    B, Hq, Hk, S, D = 2, 4, 2, 130, 16
    c = int(rng.integers(0, 3))
    mods = {
        "h": lambda b, h, q, kv: ((q + kv + h + c) % 3 != 0) | (q == kv),
        "b_causal": lambda b, h, q, kv: (q >= kv) & (((q * (b + 1) + kv + c) % 4 != 1) | (q == kv)),
        "b_h": lambda b, h, q, kv: ((q + 2 * kv + h + 3 * b + c) % 5 != 0) | (q == kv),
        "causal": lambda b, h, q, kv: q >= kv,  # depends on neither: the mask stays shared
    }
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    q, k, v = (torch.randn(B, h, S, D, generator=g, dtype=torch.float64) for h in (Hq, Hk, Hk))
    do = torch.randn(B, Hq, S, D, generator=g, dtype=torch.float64)
    for name, fn in mods.items():
        bm = _block_mask(fn, bB, bH, S, S, 64)
        o_flex = _flex(q, k, v, bm)
        # flex is the same with the BlockMask made for every b and h (mask_mod at the real b, h)
        assert (o_flex - _flex(q, k, v, _block_mask(fn, B, Hq, S, S, 64))).abs().max().item() <= 1e-12, name
        ref = [t.clone().requires_grad_() for t in (q, k, v)]
        o_ref = _dense_flex(*ref, bm)
        o_ref.backward(do)
        assert (o_ref.detach() - o_flex).abs().max().item() <= 1e-10, name
        mine = [t.to(torch.float32).requires_grad_() for t in (q, k, v)]
        o = ft.attention(*mine, block_mask=bm)
        o.backward(do.to(torch.float32))
        assert (o.double() - o_flex).abs().max().item() <= 1e-5 * o_flex.abs().max().item(), name
        for got, want in zip(mine, ref):
            err = (got.grad.double() - want.grad).abs().max().item()
            assert err <= 5e-5 * want.grad.abs().max().item(), name
        built = from_block_mask(bm).build(B, Hq, S, S)
        want_dims = (B if "b" in name or bB else 1, Hq if "h" in name or bH else 1)
        assert built.dims()[:2] == want_dims, name
        want = flex.create_mask(fn, B, Hq, S, S, device="cpu").numpy()
        assert np.array_equal(np.broadcast_to(built.to_dense(), want.shape), want), name
        pairs = int(want.sum())
        kv = torch.empty(B, Hk, S, D, device="meta")
        cost = ft.flex_cost(bm, torch.empty(B, Hq, S, D, device="meta"), kv, kv)
        assert cost["forward"]["flops_useful"] == 4 * D * pairs, name


def test_flex_cost_is_exact(rng):
    B, H, S, D = 2, 2, 256, 32
    for name, fn in _mods(rng, S).items():
        bm = _block_mask(fn, B, H, S, S, 64)
        q = torch.empty(B, H, S, D, device="meta")
        c = ft.flex_cost(bm, q, q, q)
        pairs = int(flex.create_mask(fn, B, H, S, S, device="cpu").sum())
        assert c["forward"]["flops_useful"] == 4 * D * pairs, name
        dense = 4 * D * B * H * S * S
        assert c["forward"]["flops"] < dense if name == "causal" else c["forward"]["flops"] <= dense, name
        assert set(c) == {"forward", "backward"}


def test_attention_with_flashattn_masks(rng):
    """mask= a flashattn.masks mask in the torch front (with a BlockMask too: ANDed), forward
    and gradients, against flex_attention with the combined mask_mod."""
    from flashattn import masks
    B, H, S, D = 1, 2, 160, 16
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    q, k, v = (torch.randn(B, H, S, D, generator=g, dtype=torch.float64) for _ in range(3))
    C = int(rng.integers(10, 70))

    def chunked(b, h, qi, kv):
        return (kv <= qi) & (kv // C == qi // C)

    def window(b, h, qi, kv):
        return qi - kv <= 30

    for m, bm, fn in ((masks.chunked(C), None, chunked),
                      (masks.chunked(C), _block_mask(window, 1, 1, S, S, 64),
                       lambda b, h, qi, kv: chunked(b, h, qi, kv) & window(b, h, qi, kv))):
        ref = [t.clone().requires_grad_() for t in (q, k, v)]
        full = _block_mask(fn, 1, 1, S, S, 64)
        o_ref = _dense_flex(*ref, full)
        o_ref.sum().backward()
        assert (o_ref.detach() - _flex(q, k, v, full)).abs().max().item() <= 1e-10
        mine = [t.to(torch.float32).requires_grad_() for t in (q, k, v)]
        o = ft.attention(*mine, mask=m, block_mask=bm)
        o.sum().backward()
        assert (o.double() - o_ref).abs().max().item() <= 1e-5 * o_ref.abs().max().item()
        for got, want in zip(mine, ref):
            assert (got.grad.double() - want.grad).abs().max().item() <= 5e-5 * want.grad.abs().max().item()


def test_per_head_with_a_block_mask_head(rng):
    """masks.per_head with a head given as a BlockMask (its own 64 x 64 blocks) beside a plain
    mask: every head built at the BlockMask's blocks and stacked (it was refused, "blocks must
    be equal", once per_head stacked by blocks); heads at two different BlockMask block sizes
    still run (stacked from their arrays). Against a float64 reference of the per-element masks."""
    import flashattn
    from flashattn import masks
    S, D = 256, 32
    q, k, v = (rng.standard_normal((1, 3, S, D)).astype(np.float32) for _ in range(3))
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    near, far = np.abs(i - j) < 40, np.abs(i - j) > 100
    for blocks, want in (((64, None), [near, j <= i, near]), ((64, 32), [near, far, j <= i])):
        heads = [from_block_mask(_block_mask(lambda b, h, qi, kv: (qi - kv).abs() < 40, 1, 1, S, S, blocks[0]))]
        heads.append(masks.causal() if blocks[1] is None else
                     from_block_mask(_block_mask(lambda b, h, qi, kv: (qi - kv).abs() > 100, 1, 1, S, S, blocks[1])))
        heads.append(heads[0] if blocks[1] is None else masks.causal())
        o = flashattn.attention(q, k, v, mask=masks.per_head(heads))
        s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(D)
        s = np.where(np.stack(want)[None], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        ref = np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v.astype(np.float64))
        assert np.abs(o - ref).max() <= 1e-5 * np.abs(ref).max(), (blocks, f"seed {SEED}")


def test_masks_under_torch_compile():
    """A flashattn.masks mask is built in Python (docs/python_masks.md): torch.compile runs it with
    a graph break around the call, the same result as eager; fullgraph=True refuses it with
    flashattn's words (not Dynamo's 'Unsupported context manager' from the mask's lock)."""
    from flashattn import masks
    q = torch.randn(1, 2, 40, 8)
    f = lambda q: ft.attention(q, q, q, mask=masks.chunked(16))  # noqa: E731
    torch._dynamo.reset()
    assert torch.equal(torch.compile(f)(q), f(q))
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"(?s)built in Python, outside the graph.*fullgraph"):
        torch.compile(f, fullgraph=True)(q)


def test_a_larger_block_mask_serves_a_smaller_call_as_in_flex(rng):
    """flex_attention takes a BlockMask made for more batch items or heads than the call has
    (a mask built for a full batch, reused on a smaller last one) and reads its first B and
    H; flashattn refused it ("each 1 or equal"). Now the same outputs and gradients as flex,
    with a mask_mod that depends on b and h; fewer than the call's (but not 1) is refused."""
    B, H, S, D = 2, 2, 130, 16
    c = int(rng.integers(0, 5))
    fn = lambda b, h, q, kv: (q >= kv) & (((q + kv * (b + 2) + 7 * h + c) % 5 != 0) | (q == kv))  # noqa: E731
    bm = _block_mask(fn, 4, 3, S, S, 64)
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    q, k, v = (torch.randn(B, H, S, D, generator=g, dtype=torch.float64) for _ in range(3))
    o_flex = _flex(q, k, v, bm)
    assert (o_flex - _flex(q, k, v, _block_mask(fn, B, H, S, S, 64))).abs().max().item() <= 1e-12
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    _dense_flex(*ref, _block_mask(fn, B, H, S, S, 64)).sum().backward()
    mine = [t.to(torch.float32).requires_grad_() for t in (q, k, v)]
    o = ft.attention(*mine, block_mask=bm)
    o.sum().backward()
    assert (o.double() - o_flex).abs().max().item() <= 1e-5 * o_flex.abs().max().item()
    for got, want in zip(mine, ref):
        assert (got.grad.double() - want.grad).abs().max().item() <= 5e-5 * want.grad.abs().max().item()
    with pytest.raises(ValueError, match="each 1, equal or larger"):
        ft.attention(*(torch.randn(3, H, S, D),) * 3, block_mask=_block_mask(fn, 2, H, S, S, 64))


def test_block_lists_must_cover_seq_lengths(rng):
    """A BlockMask whose lists hold fewer query-block rows than its Q_LEN needs made the library
    read past them (garbage kinds, or a wrong answer where the bytes were 0): refused. One
    that lists more (made for a longer Q_LEN) is read as flex_attention reads it, its first
    rows per head: head 1 read head 0's extra rows (error 0.48)."""
    causal = lambda b, h, q, kv: q >= kv  # noqa: E731
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    q, k, v = (torch.randn(1, 2, 256, 16, generator=g) for _ in range(3))
    bm = _block_mask(causal, None, 2, 256, 256, 128)
    short = flex.BlockMask.from_kv_blocks(bm.kv_num_blocks[:, :, :1], bm.kv_indices[:, :, :1],
                                          seq_lengths=(256, 256), mask_mod=causal)
    with pytest.raises(ValueError, match="lists 1 query blocks of 128 rows, but its Q_LEN 256 needs 2"):
        ft.attention(q, k, v, block_mask=short)
    with pytest.raises(ValueError, match="needs 2"):
        ft.flex_cost(short, q, k, v)
    long = _block_mask(causal, None, 2, 512, 256, 128)
    more = flex.BlockMask.from_kv_blocks(long.kv_num_blocks, long.kv_indices, long.full_kv_num_blocks,
                                         long.full_kv_indices, seq_lengths=(256, 256), mask_mod=causal)
    want = _flex(q, k, v, bm)
    assert (ft.attention(q, k, v, block_mask=more) - want).abs().max().item() <= 1e-5 * want.abs().max().item()


def test_zero_batch_or_heads_and_devices(rng):
    """A zero batch or zero heads gives an empty output, as with every other mask (the mask
    was built for batch 0 and refused); a BlockMask on another device than q is refused
    naming both (torch's 'Cannot copy out of meta tensor' came through); meta q with a meta
    BlockMask gives the output's shape; flex_cost of a meta BlockMask says it has no blocks."""
    causal = lambda b, h, q, kv: q >= kv  # noqa: E731
    bm = _block_mask(causal, None, None, 256, 256, 128)
    q = torch.randn(1, 2, 256, 16)
    assert ft.attention(q[:0], q[:0], q[:0], block_mask=bm).shape == (0, 2, 256, 16)
    assert ft.attention(q[:, :0], q[:, :0], q[:, :0], block_mask=bm).shape == (1, 0, 256, 16)
    meta = bm.to("meta")
    with pytest.raises(ValueError, match="block_mask is on meta but q is on cpu"):
        ft.attention(q, q, q, block_mask=meta)
    qm = q.to("meta")
    assert ft.attention(qm, qm, qm, block_mask=meta).shape == q.shape
    assert ft.attention(qm, qm, qm, block_mask=bm).shape == q.shape
    with pytest.raises(ValueError, match="meta device: it holds no blocks"):
        ft.flex_cost(meta, q, q, q)


def test_a_reassigned_mask_mod_is_used(rng):
    """torch's own messages tell users to assign mask_mod on a BlockMask; the conversion,
    cached per BlockMask object, kept the old one (an output 3.3 away from flex's)."""
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    q, k, v = (torch.randn(1, 2, 256, 16, generator=g) for _ in range(3))
    bm = _block_mask(lambda b, h, qi, ki: (qi - ki) % 3 != 0, None, None, 256, 256, 128)
    ft.attention(q, k, v, block_mask=bm)
    bm.mask_mod = lambda b, h, qi, ki: (qi - ki) % 5 != 0
    want = _flex(q, k, v, bm)
    assert (ft.attention(q, k, v, block_mask=bm) - want).abs().max().item() <= 1e-5 * want.abs().max().item()
    # block lists edited in place (flex_attention reads them at every call): every block gone
    bm.kv_num_blocks.zero_()
    if bm.full_kv_num_blocks is not None:
        bm.full_kv_num_blocks.zero_()
    assert ft.attention(q, k, v, block_mask=bm).abs().max().item() == 0.0
    # meta: the BlockMask's lengths are checked as on the CPU
    meta = _block_mask(lambda b, h, qi, ki: qi >= ki, None, None, 256, 256, 128).to("meta")
    with pytest.raises(ValueError, match="Q_LEN, KV_LEN"):
        ft.attention(*(torch.empty(1, 2, 100, 16, device="meta"),) * 3, block_mask=meta)


def test_block_mask_made_under_inference_mode(rng):
    """The usual inference pattern: a BlockMask built under torch.inference_mode. Its tensors
    track no version counter, and reading one raised RuntimeError in the conversion cache."""
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    q, k, v = (torch.randn(1, 2, 256, 16, generator=g) for _ in range(3))
    with torch.inference_mode():
        bm = _block_mask(lambda b, h, qi, ki: qi >= ki, None, None, 256, 256, 128)
        want = _flex(q, k, v, bm)
        got = ft.attention(q, k, v, block_mask=bm)
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()
    assert torch.equal(ft.attention(q, k, v, block_mask=bm), got)  # outside it too
