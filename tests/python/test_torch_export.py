"""flashattn.torch under the transformations a PyTorch power user applies to a model:
torch.export (gradients through the exported program, strict and not), torch.func.vmap over
a dim of size 0, kvcache_attention under vmap (refused by name), torch.compile with dynamic
shapes over a decode step that appends to its caches. Every result against eager flashattn
(itself checked against float64 in test_torch*.py). Random inputs from torch.Generator(SEED)."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import flashattn.torch as fat  # noqa: E402
from conftest import SEED  # noqa: E402


def _gen():
    return torch.Generator().manual_seed(SEED)


class _Block(torch.nn.Module):
    """proj -> attention -> out, plus a residual: gradients must reach proj through the call."""

    def __init__(self, call):
        super().__init__()
        self.proj, self.out, self.call = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), call

    def forward(self, x, *extra):
        h = self.proj(x)
        return self.out(self.call(h, *extra)) + x


_CALLS = {
    "attention": (lambda h: fat.attention(h, h, h, causal=True), (2, 2, 5, 8), ()),
    "scaled_dot_product_attention": (lambda h: fat.scaled_dot_product_attention(h, h, h), (2, 2, 5, 8), ()),
    "varlen_attention": (lambda h, cu: fat.varlen_attention(h, h, h, cu, cu, causal=True), (10, 2, 8),
                         (torch.tensor([0, 4, 10], dtype=torch.int32),)),
}


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("name", list(_CALLS))
def test_export_keeps_the_gradients(name, strict):
    """An exported block trains as the eager one: its output requires grad and every parameter
    gets the eager gradient. Before, the Function's no_grad region (non-strict) or export's
    tracing of the Function (strict) cut the graph at the call: proj got None, or nothing
    after the call required grad, without a word."""
    call, shape, extra = _CALLS[name]
    torch.manual_seed(SEED)
    m = _Block(call)
    x = torch.randn(shape, generator=_gen())
    want = torch.autograd.grad(m(x, *extra).pow(2).sum(), [m.proj.weight, m.out.weight])
    em = torch.export.export(m, (x,) + extra, strict=strict).module()
    y = em(x, *extra)
    assert y.requires_grad
    params = dict(em.named_parameters())
    got = torch.autograd.grad(y.pow(2).sum(), [params["proj.weight"], params["out.weight"]])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("name", ["attention", "varlen_attention"])
def test_export_refuses_an_lse_gradient_under_dropout(name, strict):
    """As eager and compiled calls do: export drops the caller's refusal (an autograd.Function),
    so the op's own backward refuses (the lse term was silently dropped from dq)."""
    gen = _gen()
    if name == "attention":
        q, k, v = (torch.randn(1, 2, 16, 8, generator=gen) for _ in range(3))
        extra = ()

        def call(q, k, v):
            return fat.attention(q, k, v, dropout_p=0.3, seed=5, return_lse=True)
    else:
        q, k, v = (torch.randn(16, 2, 8, generator=gen) for _ in range(3))
        extra = (torch.tensor([0, 7, 16], dtype=torch.int32),)

        def call(q, k, v, cu):
            return fat.varlen_attention(q, k, v, cu, cu, dropout_p=0.3, seed=5, return_lse=True)

    class M(torch.nn.Module):
        def forward(self, *args):
            return call(*args)
    em = torch.export.export(M(), (q, k, v) + extra, strict=strict).module()
    x = q.clone().requires_grad_()
    o, lse = em(x, k, v, *extra)
    torch.autograd.grad(o.sum(), x, retain_graph=True)  # o alone: fine
    with pytest.raises(NotImplementedError, match="a gradient through lse with dropout"):
        torch.autograd.grad(o.sum() + lse.sum(), x)


def test_export_refuses_a_mask_object_in_its_own_words():
    import flashattn

    class M(torch.nn.Module):
        def forward(self, q):
            return fat.attention(q, q, q, mask=flashattn.masks.chunked(2))
    with pytest.raises(ValueError, match="under torch.export: the op takes the mask by its address"):
        torch.export.export(M(), (torch.randn(1, 2, 6, 8),), strict=False)


@pytest.mark.parametrize("fn", ["attention", "scaled_dot_product_attention"])
def test_vmap_over_a_dim_of_size_zero_gives_empty_results(fn):
    """As torch's own ops under vmap: [0, ...] of the shapes one element gives (it raised a
    TypeError from inside torch's autograd.Function machinery)."""
    gen = _gen()
    k, v = torch.randn(2, 2, 4, 8, generator=gen), torch.randn(2, 2, 4, 8, generator=gen)
    qs = torch.randn(0, 2, 2, 3, 8)

    def call(q):
        return getattr(fat, fn)(q, k, v)
    o = torch.func.vmap(call)(qs)
    assert o.shape == (0, 2, 2, 3, 8) and o.dtype == qs.dtype
    g = torch.func.vmap(torch.func.grad(lambda q: call(q).sum()))(qs)
    assert g.shape == qs.shape


@pytest.mark.parametrize("batched", ["all", "append", "sinks", "alibi_slopes"])
def test_kvcache_under_vmap_is_refused_by_name(batched):
    gen = _gen()
    kc, vc = torch.randn(3, 2, 8, 2, 8, generator=gen), torch.randn(3, 2, 8, 2, 8, generator=gen)
    q = torch.randn(3, 2, 1, 2, 8, generator=gen)
    msg = "kvcache_attention does not take tensors batched by torch.func.vmap"
    if batched in ("sinks", "alibi_slopes"):  # only the option batched: the caches are the call's own
        with pytest.raises(NotImplementedError, match=msg):
            torch.func.vmap(lambda x: fat.kvcache_attention(q[0], kc[0], vc[0], cache_seqlens=4, **{batched: x}))(
                torch.randn(3, 2, generator=gen).abs())
        return
    new = (torch.randn(3, 2, 1, 2, 8, generator=gen),) * 2 if batched == "append" else ()

    def step(q, kc, vc, *new):
        return fat.kvcache_attention(q, kc, vc, *new, cache_seqlens=4)
    with pytest.raises(NotImplementedError, match=msg):
        torch.func.vmap(step)(q, kc, vc, *new)


def test_compile_fullgraph_dynamic_over_an_appending_decode_step():
    """The append's overlap check sorted the caches' strides, which are symbolic under dynamic
    shapes: Dynamo refused ("sort with non-constant keys")."""
    gen = _gen()
    B, C, H, D = 2, 16, 2, 8
    kc, vc = torch.randn(B, C, H, D, generator=gen), torch.randn(B, C, H, D, generator=gen)
    q, kn, vn = (torch.randn(B, 1, H, D, generator=gen) for _ in range(3))
    lens = torch.tensor([3, 7], dtype=torch.int32)

    def step(q, kc, vc, kn, vn, lens):
        return fat.kvcache_attention(q, kc, vc, kn, vn, lens, causal=True)
    kw, vw = kc.clone(), vc.clone()
    want = step(q, kw, vw, kn, vn, lens)
    torch._dynamo.reset()
    kg, vg = kc.clone(), vc.clone()
    got = torch.compile(step, fullgraph=True, dynamic=True, backend="eager")(q, kg, vg, kn, vn, lens)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert torch.equal(kg, kw) and torch.equal(vg, vw)  # the appends happened, as in eager


def test_jax_dot_product_attention_names_its_own_arguments_under_x64():
    """The jax.nn drop-in refuses float64 in its own words (query, key, value), not in
    flashattn's (q). Its own process: jax_enable_x64 is global."""
    pytest.importorskip("jax")
    code = ("import jax; jax.config.update('jax_enable_x64', True); import jax.numpy as jnp, flashattn.jax as fj\n"
            "x = jnp.ones((1, 4, 2, 8), jnp.float64)\n"
            "try:\n    fj.dot_product_attention(x, x, x)\nexcept ValueError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ),
                         timeout=120)
    assert "query, key and value dtype should be float32, float16 or bfloat16" in out.stdout, out.stderr[-2000:]


def test_compile_with_symbolic_floats():
    """torch.compile(fullgraph=True) with dynamic shapes, or recompiling when a float argument
    changes (dynamo then traces it as a symbolic float), as one compiled function serves
    Gemma's layers with their own scale and softcap: the front's float checks did math on the
    traced value (math.isfinite) and broke the graph ("torch.* op returned non-Tensor"); a
    float option tested for truth (softcap or 0.0) was guarded on data it did not have."""
    q = torch.randn(1, 2, 9, 16)
    for fn in (lambda q: fat.attention(q, q, q), lambda q: fat.attention(q, q, q, softcap=50.0, window=(3, 0)),
               lambda q: fat.scaled_dot_product_attention(q, q, q, is_causal=True),
               lambda q: fat.varlen_attention(q[0].transpose(0, 1).contiguous(), q[0].transpose(0, 1).contiguous(),
                                              q[0].transpose(0, 1).contiguous(), torch.tensor([0, 4, 9]),
                                              torch.tensor([0, 4, 9]))):
        torch._dynamo.reset()
        assert torch.equal(torch.compile(fn, fullgraph=True, dynamic=True, backend="eager")(q), fn(q))
    torch._dynamo.reset()
    g = torch.compile(lambda q, s, c: fat.attention(q, q, q, scale=s, softcap=c), fullgraph=True, backend="eager")
    for s, c in ((0.1, 0.5), (0.2, 0.6), (0.3, 0.7)):  # the second value recompiles with symbolic floats
        assert torch.equal(g(q, s, c), fat.attention(q, q, q, scale=s, softcap=c))
