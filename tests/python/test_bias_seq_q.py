"""A bias with a size-1 query dim ([B, H, 1, Sk], [1, 1, 1, Sk]) goes to the library as one
row for every query row (bias_seq_q = 1): no copy over Sq, and dbias comes back in the
bias's own shape from the library, summed over the query rows there, not in Python. Against
float64 eager attention, forward and gradients, in every front."""
import numpy as np
import pytest

import flashattn
from conftest import BWD_TOL, FWD_TOL, randn

SHAPES = [(2, 3, 1, 9), (1, 1, 1, 9), (2, 1, 1, 9), (1, 3, 1, 9)]  # bias shapes; B, H, Sq, Sk = 2, 3, 37, 9


def eager(q, k, v, bias, g):
    """o and the gradients of sum(o * g) in float64, by torch autograd on the plain formula."""
    torch = pytest.importorskip("torch")
    q, k, v, bias = (torch.tensor(np.asarray(x, np.float64), requires_grad=True) for x in (q, k, v, bias))
    s = q @ k.transpose(-1, -2) / np.sqrt(q.shape[-1]) + bias
    o = torch.softmax(s, -1) @ v
    (o * torch.tensor(np.asarray(g, np.float64))).sum().backward()
    return o.detach().numpy(), [x.grad.numpy() for x in (q, k, v, bias)]


def rel(got, want):
    return np.abs(np.asarray(got, np.float64) - want).max() / max(np.abs(want).max(), 1e-30)


def inputs(rng, bshape):
    q, k, v = randn(rng, (2, 3, 37, 16)), randn(rng, (2, 3, 9, 16)), randn(rng, (2, 3, 9, 8))
    return q, k, v, randn(rng, bshape), randn(rng, (2, 3, 37, 8))


def seen_bias_seq_q(monkeypatch, module):
    """Records the bias_seq_q of each problem with a bias the front builds (the numpy front
    also plans the bare shapes first, to have the library judge the sizes: those have none)."""
    seen = []
    real = module.make_problem

    def spy(**kw):
        p = real(**kw)
        if p.has_bias or kw.get("bias_shape") is not None:
            seen.append(p.bias_seq_q if p.has_bias else None)
        return p
    monkeypatch.setattr(module, "make_problem", spy)
    return seen


@pytest.mark.parametrize("bshape", SHAPES)
def test_torch_grad_keeps_the_bias_shape(rng, monkeypatch, bshape):
    torch = pytest.importorskip("torch")
    import flashattn._torch_ops as ops
    import flashattn.torch as fat
    seen = seen_bias_seq_q(monkeypatch, ops)
    q, k, v, bias, g = inputs(rng, bshape)
    o_ref, grads_ref = eager(q, k, v, bias, g)
    tq, tk, tv, tb = (torch.from_numpy(x).requires_grad_() for x in (q, k, v, bias))
    o = fat.attention(tq, tk, tv, bias=tb, threads=2)
    (o * torch.from_numpy(g)).sum().backward()
    assert rel(o.detach().numpy(), o_ref) <= FWD_TOL["f32"]
    assert tb.grad.shape == bias.shape
    for got, want in zip((tq.grad, tk.grad, tv.grad, tb.grad), grads_ref):
        assert rel(got.numpy(), want) <= BWD_TOL["f32"]
    assert seen and set(seen) == {1}  # the library broadcast the row (no expand over Sq)


@pytest.mark.parametrize("bshape", SHAPES[:2])
def test_numpy_dbias_in_the_bias_shape(rng, monkeypatch, bshape):
    import flashattn._numpy as front
    seen = seen_bias_seq_q(monkeypatch, front)
    q, k, v, bias, g = inputs(rng, bshape)
    o_ref, grads_ref = eager(q, k, v, bias, g)
    o, lse = flashattn.attention(q, k, v, bias=bias, return_lse=True)
    assert rel(o, o_ref) <= FWD_TOL["f32"]
    *grads, dbias = flashattn.attention_backward(q, k, v, o, lse, g, bias=bias, bias_grad=True)
    assert dbias.shape == bias.shape
    for got, want in zip(grads + [dbias], grads_ref):
        assert rel(got, want) <= BWD_TOL["f32"]
    assert seen and set(seen) == {1}


@pytest.mark.parametrize("bshape", SHAPES[:2])
def test_jax_grad_of_a_row_bias(rng, bshape):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import flashattn.jax as fj
    q, k, v, bias, g = inputs(rng, bshape)
    o_ref, grads_ref = eager(q, k, v, bias, g)

    def loss(q, k, v, b):
        return jnp.sum(fj.attention(q, k, v, bias=b, layout="bhsd") * g)
    o = fj.attention(*(jnp.asarray(x) for x in (q, k, v)), bias=jnp.asarray(bias), layout="bhsd")
    assert rel(o, o_ref) <= FWD_TOL["f32"]
    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(*(jnp.asarray(x) for x in (q, k, v, bias)))
    assert grads[3].shape == bias.shape
    for got, want in zip(grads, grads_ref):
        assert rel(got, want) <= BWD_TOL["f32"]
