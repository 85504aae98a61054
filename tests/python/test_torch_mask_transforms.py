"""Masks whose data are torch tensors (flashattn.masks.from_array / prefix_lm / documents /
from_fn, a FlexAttention BlockMask) made or first used inside torch.func.grad, vjp and jacrev:
the same gradients as eager autograd (reading a tensor on the host inside a transform failed,
"Cannot access data pointer of Tensor that doesn't have storage"); mask data batched by vmap
refused in words. flex_cost, merge_states and a mask made from a tensor under
torch.compile: eager's results through a graph break, fullgraph=True refused with
flashattn's reason. Random cases draw from the run's seed (FA_TEST_SEED)."""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
flex = pytest.importorskip("torch.nn.attention.flex_attention")

import flashattn.masks as fm  # noqa: E402
import flashattn.torch as ft  # noqa: E402
from conftest import SEED  # noqa: E402


def _block_mask(fn, B, H, S, block):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flex.create_block_mask(fn, B, H, S, S, device="cpu", BLOCK_SIZE=block)


def _qkv(rng, B, H, S, D):
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    return [torch.randn(B, H, S, D, generator=g) for _ in range(3)]


def _check_transforms(make_kwargs, q, k, v, name):
    """torch.func.grad, vjp and jacrev of attention with the mask arguments make_kwargs()
    returns (made afresh inside each transformed function) against eager autograd."""
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    qe = q.clone().requires_grad_()
    ft.attention(qe, k, v, **make_kwargs()).backward(do)
    want = qe.grad

    def loss(qq):
        return (ft.attention(qq, k, v, **make_kwargs()) * do).sum()

    torch.testing.assert_close(torch.func.grad(loss)(q), want, msg=f"{name} grad, seed {SEED}")
    o, pull = torch.func.vjp(lambda qq: ft.attention(qq, k, v, **make_kwargs()), q)
    torch.testing.assert_close(pull(do)[0], want, msg=f"{name} vjp, seed {SEED}")
    # jacrev (vjp under vmap) of one output element: its row of the gradient
    jac = torch.func.jacrev(lambda qq: ft.attention(qq, k, v, **make_kwargs())[0, 0, -1, 0])(q)
    qe = q.clone().requires_grad_()
    ft.attention(qe, k, v, **make_kwargs())[0, 0, -1, 0].backward()
    torch.testing.assert_close(jac, qe.grad, msg=f"{name} jacrev, seed {SEED}")


def test_masks_from_tensors_under_torch_func(rng):
    B, H, S, D = 2, 2, 48, 16
    q, k, v = _qkv(rng, B, H, S, D)
    arr = torch.from_numpy(rng.random((S, S)) > 0.3)
    cut = int(rng.integers(1, S))
    prefix = torch.from_numpy(rng.integers(0, S, B))
    cases = {
        "from_array": lambda: fm.from_array(arr),
        "prefix_lm": lambda: fm.prefix_lm(prefix),
        "documents": lambda: fm.documents(torch.tensor([cut, S - cut])),
        "documents per batch item": lambda: fm.documents(torch.tensor([[cut, S - cut], [S - cut, cut]])),
        "documents list of 0-d tensors": lambda: fm.documents([torch.tensor(cut), torch.tensor(S - cut)]),
        "from_fn returning a tensor": lambda: fm.from_fn(lambda b, h, i, j: torch.from_numpy(np.abs(i - j)) < cut),
    }
    for name, make in cases.items():
        _check_transforms(lambda: {"mask": make()}, q, k, v, name)


@pytest.mark.parametrize("bB,bH", [(None, None), (None, 2), (2, None)])
def test_fresh_block_mask_under_torch_func(rng, bB, bH):
    """A BlockMask converted for the first time inside the transform (the conversion reads its
    block lists and mask_mod's bitmaps on the host); a mask_mod that depends on b and h with
    a shared dim evaluates the bitmaps at the call's every b and h."""
    B, H, S, D = 2, 2, 96, 16
    q, k, v = _qkv(rng, B, H, S, D)
    c = int(rng.integers(0, 5))
    fn = lambda b, h, qi, kv: (qi >= kv) & (((qi + kv * (b + 2) + 7 * h + c) % 5 != 0) | (qi == kv))  # noqa: E731
    _check_transforms(lambda: {"block_mask": _block_mask(fn, bB, bH, S, 32)}, q, k, v, f"block_mask {bB} {bH}")
    # one BlockMask object first used inside grad, then eagerly: the conversion is the same
    bm = _block_mask(fn, bB, bH, S, 32)
    torch.func.grad(lambda qq: ft.attention(qq, k, v, block_mask=bm).sum())(q)
    fresh = _block_mask(fn, bB, bH, S, 32)
    assert torch.equal(ft.attention(q, k, v, block_mask=bm), ft.attention(q, k, v, block_mask=fresh))


def test_mask_data_batched_by_vmap_are_refused():
    """A mask built from a tensor that vmap maps over would be one mask for every mapped
    example: refused, saying so (it crashed reading the batched tensor)."""
    q = torch.randn(1, 2, 16, 8)
    arrays = torch.rand(3, 16, 16) > 0.3
    with pytest.raises(ValueError, match="vmap's mapped dim"):
        torch.func.vmap(lambda a: ft.attention(q, q, q, mask=fm.from_array(a)))(arrays)
    with pytest.raises(ValueError, match="vmap's mapped dim"):
        torch.func.vmap(lambda n: ft.attention(q, q, q, mask=fm.prefix_lm(n)))(torch.tensor([1, 5, 9]))
    # mask data that vmap does not map are read as they are
    a = arrays[0]
    got = torch.func.vmap(lambda qq: ft.attention(qq, qq, qq, mask=fm.from_array(a)))(q[None].expand(2, -1, -1, -1, -1))
    torch.testing.assert_close(got[1], ft.attention(q, q, q, mask=fm.from_array(a)))


@pytest.mark.parametrize("name", ["flex_cost", "merge_states", "from_array", "prefix_lm"])
def test_host_calls_under_torch_compile(name):
    """flex_cost, merge_states and a mask made from a tensor inside the compiled function run
    on the host: without fullgraph a graph break gives eager's results; fullgraph=True refuses
    them in flashattn's words (Dynamo's own were "Could not guard on data-dependent
    expression" and "does not know how to trace the builtin _ctypes.POINTER")."""
    B, H, S, D = 1, 2, 128, 16
    bm = _block_mask(lambda b, h, qi, kv: qi >= kv, B, H, S, 64)
    q = torch.randn(B, H, S, D)
    oa, ob = torch.randn(2, 3, H, D), torch.randn(2, 3, H, D)
    la, lb = torch.randn(2, 3, H), torch.randn(2, 3, H)
    arr = torch.rand(S, S) > 0.3
    cases = {
        "flex_cost": (lambda q: q.sum() * 0 + ft.flex_cost(bm, q, q, q)["forward"]["flops"],
                      r"flashattn\.torch\.flex_cost reads the BlockMask's blocks and plans on the host"),
        "merge_states": (lambda q: ft.merge_states(oa, la, ob, lb),
                         r"flashattn\.torch\.merge_states runs the library .* outside compiled graphs"),
        "from_array": (lambda q: ft.attention(q, q, q, mask=fm.from_array(arr)),
                       r"(?s)mask made from a tensor .* reads its values in Python.*fullgraph"),
        "prefix_lm": (lambda q: ft.attention(q, q, q, mask=fm.prefix_lm(torch.tensor([7]))),
                      r"(?s)mask made from a tensor .* reads its values in Python.*fullgraph"),
    }
    f, reason = cases[name]
    torch._dynamo.reset()
    got, want = torch.compile(f)(q), f(q)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert torch.equal(g, w)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=reason):
        torch.compile(f, fullgraph=True)(q)
