"""The torch inference fronts under torch.compile and torch.func: a compiled decode step whose
inputs require grad (detached, as eager's forward), an int cache_seqlens and varlen's
max_seqlen_q/k in a compiled loop (one graph, not a recompile per value), and
varlen_attention's backward under torch.func.grad and a double backward (as attention's)."""
import pytest

torch = pytest.importorskip("torch")

import flashattn.torch as fat  # noqa: E402
from conftest import SEED  # noqa: E402
from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402

B, Hq, Hk, D, CAP = 2, 4, 2, 16, 32


def _gen(offset=0):
    return torch.Generator().manual_seed(SEED + offset)


def _randn(*shape, gen):
    return torch.randn(*shape, generator=gen)


def _caches(gen):
    return _randn(B, CAP, Hk, D, gen=gen), _randn(B, CAP, Hk, D, gen=gen)


# ---- kv-cache decoding: inputs that require grad, compiled -------------------------------

@pytest.mark.parametrize("which", ["q_from_linear", "q", "new_kv", "caches_no_append"])
def test_decode_compiled_detaches_inputs_that_require_grad(which):
    """A compiled step whose q (a Linear's output, grad mode on) or new k and v require grad
    compiles and gives eager's o, detached; it once failed to compile (torch traced the
    backward the decode op lacks)."""
    gen = _gen()
    lin = torch.nn.Linear(D, Hq * D)
    x = _randn(B, 1, D, gen=gen)
    q = _randn(B, 1, Hq, D, gen=gen)
    kn, vn = _randn(B, 1, Hk, D, gen=gen), _randn(B, 1, Hk, D, gen=gen)
    caches = _caches(gen)
    grad = (lambda t: t.clone().requires_grad_(True))

    def step(x, q, kc, vc, kn, vn):
        if which == "q_from_linear":
            return fat.kvcache_attention(lin(x).view(B, 1, Hq, D), kc, vc, kn, vn, 5, causal=True)
        if which == "q":
            return fat.kvcache_attention(q, kc, vc, kn, vn, 5, causal=True)
        if which == "new_kv":
            return fat.kvcache_attention(q, kc, vc, kn, vn, 5, causal=True)
        return fat.kvcache_attention(q, kc, vc, cache_seqlens=5, causal=True)

    def args(for_grad):
        kc, vc = (c.clone() for c in caches)
        qq, kk, vv = q, kn, vn
        if for_grad and which == "q":
            qq = grad(q)
        if for_grad and which == "new_kv":
            kk, vv = grad(kn), grad(vn)
        if for_grad and which == "caches_no_append":
            kc, vc = grad(kc), grad(vc)
        return x, qq, kc, vc, kk, vv

    with torch.no_grad():
        want_args = args(False)
        want = step(*want_args)
    torch._dynamo.reset()
    got_args = args(True)
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(*got_args)
    assert not got.requires_grad
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for a, b in zip(got_args[2:4], want_args[2:4]):  # the appended caches alike
        assert torch.equal(a.detach(), b)


def test_decode_compiled_run_eagerly_still_refuses_gradients():
    """Where Dynamo runs kvcache_attention eagerly (here after a first call that raised: it
    skips the frame, yet compiles the helpers it calls), a gradient reaching o raises the
    front's words; it met torch's "no autograd formula" (a compiled helper saw
    is_compiling() and let the op's own autograd take q)."""
    gen = _gen(5)
    q = _randn(B, 1, Hq, D, gen=gen).requires_grad_(True)
    kn, vn = _randn(B, 1, Hk, D, gen=gen), _randn(B, 1, Hk, D, gen=gen)
    torch._dynamo.reset()
    step = torch.compile(lambda q, kc, vc: fat.kvcache_attention(q, kc, vc, kn, vn, 5), backend="aot_eager")
    kc, vc = _caches(gen)
    with pytest.raises(RuntimeError, match="k_cache requires grad and is written in place"):
        step(q, kc.requires_grad_(True), vc)
    o = step(q, *_caches(gen))
    if o.requires_grad:  # run eagerly (torch 2.15): the front's refusal; compiled: detached
        with pytest.raises(RuntimeError, match="kvcache_attention has no backward"):
            o.sum().backward()


# ---- kv-cache decoding: an int cache_seqlens in a compiled loop ------------------------------

@pytest.mark.parametrize("dynamic, warm", [(True, 1), (None, 2)])
def test_decode_int_cache_seqlens_compiles_one_graph(dynamic, warm):
    """An int cache_seqlens, a new value each step: fullgraph=True compiles (it once failed on
    Dynamo's hasattr of a SymInt) and keeps one graph after the first `warm` steps
    (dynamic=None: torch's own second compile, which makes the int symbolic), with eager's
    outputs and caches."""
    gen = _gen(1)
    steps = 12
    qs, ks, vs = (_randn(steps, B, 1, h, D, gen=gen) for h in (Hq, Hk, Hk))
    caches = _caches(gen)

    def step(q, kc, vc, k, v, n):
        return fat.kvcache_attention(q, kc, vc, k, v, n, causal=True, softcap=30.0)

    def loop(fn, counter=None):
        kc, vc = (c.clone() for c in caches)
        outs, counts = [], []
        for t in range(steps):
            outs.append(fn(qs[t], kc, vc, ks[t], vs[t], 7 + t))
            counts.append(counter.frame_count if counter else 0)
        return (torch.stack(outs), kc, vc), counts

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    got, counts = loop(torch.compile(step, fullgraph=True, dynamic=dynamic, backend=counter), counter)
    want, _ = loop(step)
    assert counts[warm - 1] == counts[-1], f"compiles after each step: {counts}"
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_decode_int_cache_seqlens_compiled_is_judged_where_the_op_runs():
    """Compiled, an int cache_seqlens beyond int32 is refused when the op runs, as the
    library's lengths are (eager refuses it before)."""
    gen = _gen(2)
    q = _randn(B, 1, Hq, D, gen=gen)
    kc, vc = _caches(gen)
    torch._dynamo.reset()
    f = torch.compile(lambda q, n: fat.kvcache_attention(q, kc, vc, cache_seqlens=n), fullgraph=True, dynamic=True)
    f(q, 3)
    with pytest.raises(ValueError, match="cache_seqlens must fit int32, got 4294967296"):
        f(q, 2**32)
    with pytest.raises(ValueError, match="cache_seqlens values must fit int32, got 4294967296"):
        fat.kvcache_attention(q, kc, vc, cache_seqlens=2**32)


# ---- packed batches: max_seqlen under compile; torch.func.grad; double backward ----------------

@pytest.mark.parametrize("dynamic", [None, True, False])
def test_varlen_max_seqlen_does_not_recompile(dynamic):
    """max_seqlen_q/k, a new value each call: one graph (each value once compiled a graph of
    its own, and fullgraph=True failed at the recompile limit); under compile they are a
    bound the library does not need and are not read."""
    gen = _gen(3)
    T = 48
    q, k, v = (_randn(T, Hq, D, gen=gen) for _ in range(3))

    def step(q, k, v, cu, mx):
        return fat.varlen_attention(q, k, v, cu, cu, mx, mx, causal=True)

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    f = torch.compile(step, fullgraph=True, dynamic=dynamic, backend=counter)
    counts = []
    for n in range(12):
        a = 10 + n
        cu = torch.tensor([0, a, T], dtype=torch.int32)
        assert torch.equal(f(q, k, v, cu, max(a, T - a)), step(q, k, v, cu, max(a, T - a)))
        counts.append(counter.frame_count)
    assert counts[0] == counts[-1], f"compiles after each call: {counts}"
    with pytest.raises(ValueError, match="max_seqlen_q = 3 but a sequence has"):
        step(q, k, v, cu, 3)  # eager still checks the bound


def _varlen_inputs(grad=False):
    gen = _gen(4)
    T = 40
    q, k, v = (_randn(T, Hq, D, gen=gen).requires_grad_(grad) for _ in range(3))
    return q, k, v, torch.tensor([0, 15, T], dtype=torch.int32)


@pytest.mark.parametrize("sinks", [False, True])
def test_varlen_func_grad_matches_autograd(sinks):
    """torch.func.grad of varlen_attention (it once raised torch's "must override the
    setup_context staticmethod": the backward ran the op with grad mode on)."""
    q, k, v, cu = _varlen_inputs()
    s = torch.linspace(-1.0, 1.0, Hq) if sinks else None

    def f(qq, kk):
        o, lse = fat.varlen_attention(qq, kk, v, cu, cu, causal=True, sinks=s, return_lse=True)
        return o.square().sum() + lse.sum()

    qa, ka = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    want = torch.autograd.grad(f(qa, ka), (qa, ka))
    got = torch.func.grad(f, argnums=(0, 1))(q, k)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_varlen_double_backward_raises_as_attention():
    """A backward through a gradient taken with create_graph=True raises attention's
    NotImplementedError (it once met torch's "no autograd formula" for varlen_bwd)."""
    q, k, v, cu = _varlen_inputs(grad=True)
    o = fat.varlen_attention(q, k, v, cu, cu, causal=True)
    (gq,) = torch.autograd.grad(o.square().sum(), q, create_graph=True)
    with pytest.raises(NotImplementedError, match="attention backward is not differentiable"):
        torch.autograd.grad(gq.square().sum(), k)
