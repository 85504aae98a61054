"""flashattn as a transformers attention backend (python/flashattn/transformers.py): small
randomly initialised models built from configs (no weights downloaded), each model from its
own deep copy of the config, run with attn_implementation="sdpa" and with flashattn's
registered name. Logits agree within f32 tolerance (left-padded batches included, on the
positions that are not padding), generate() gives the same tokens, and flashattn's
function is shown to have run."""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flashattn.torch as ft  # noqa: E402
import flashattn.transformers as fhf  # noqa: E402

from conftest import SEED  # noqa: E402

VOCAB = 97


def _configs():
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  attention_dropout=0.0, tie_word_embeddings=False)
    return {
        "llama": transformers.LlamaConfig(**common),
        # a sliding window shorter than the prompts, so the window shows in the masks
        "mistral": transformers.MistralConfig(sliding_window=6, **common),
        "qwen2": transformers.Qwen2Config(use_sliding_window=True, sliding_window=5, max_window_layers=1,
                                          layer_types=["full_attention", "sliding_attention"], **common),
    }


@pytest.fixture
def counted(monkeypatch):
    """Counts the calls that reach flashattn.torch.attention."""
    calls = []
    real = ft.attention

    def wrapper(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(ft, "attention", wrapper)
    return calls


def _models(cfg, name):
    torch.manual_seed(SEED % 2**31)
    ref = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="sdpa")
    ours = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=name)
    ours.load_state_dict(ref.state_dict())
    return ref.eval(), ours.eval()


def _batch(rng, lengths, total):
    """Left-padded token ids and attention mask for prompts of the given lengths."""
    ids = np.zeros((len(lengths), total), np.int64)
    mask = np.zeros((len(lengths), total), np.int64)
    for b, n in enumerate(lengths):
        ids[b, total - n:] = rng.integers(1, VOCAB, n)
        mask[b, total - n:] = 1
    return torch.from_numpy(ids), torch.from_numpy(mask)


def test_register_returns_a_name_without_flash():
    name = fhf.register()
    assert name == "exact_attention" and "flash" not in name
    with pytest.raises(ValueError, match="flash"):
        fhf.register("my_flash_impl")


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
def test_logits_match_sdpa(arch, rng, counted):
    name = fhf.register()
    ref, ours = _models(_configs()[arch], name)
    for lengths in ([12, 12], [12, 7, 3]):  # no padding; left padding (rows with no visible key)
        ids, mask = _batch(rng, lengths, 12)
        with torch.no_grad():
            want = ref(input_ids=ids, attention_mask=mask).logits
            before = len(counted)
            got = ours(input_ids=ids, attention_mask=mask).logits
        assert len(counted) - before == 2, "flashattn's attention did not run once per layer"
        real = mask.bool()
        err = (got - want)[real].abs().max().item() / want[real].abs().max().item()
        assert err < 1e-5, f"{arch} lengths {lengths}: relative logit error {err:.3g} (seed {SEED})"


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_generate_matches_sdpa(arch, rng, counted):
    name = fhf.register()
    ref, ours = _models(_configs()[arch], name)
    ids, mask = _batch(rng, [9, 4], 9)
    kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want = ref.generate(ids, **kw)
        got = ours.generate(ids, **kw)
    assert len(counted) >= 2 * 8, "generate() did not run flashattn in every step"
    assert torch.equal(got, want), f"{arch}: tokens differ (seed {SEED})\n{got}\n{want}"


def test_dropout_in_training(rng):
    """A model in training mode with attention_dropout > 0 runs flashattn's dropout: the seed
    from torch's generator (torch.manual_seed repeats the logits bit for bit, another seed
    changes them), the same weights as flashattn.torch.attention with dropout_p, and a
    backward that runs; eval() turns it off."""
    name = fhf.register()
    cfg = copy.deepcopy(_configs()["llama"])
    cfg.attention_dropout = 0.1
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=name).train()
    ids = torch.from_numpy(rng.integers(1, VOCAB, (2, 10)))
    runs = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        runs.append(model(input_ids=ids).logits)
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])
    runs[0].sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    with torch.no_grad():
        a, b = model.eval()(input_ids=ids).logits, model(input_ids=ids).logits
    assert torch.equal(a, b)
    q, k, v = (torch.from_numpy(rng.standard_normal((1, 4, 8, 16)).astype(np.float32)) for _ in range(3))
    torch.manual_seed(9)
    got, _ = fhf.attention_forward(model.model.layers[0].self_attn, q, k, v, None, dropout=0.2, scaling=0.25)
    torch.manual_seed(9)
    want = ft.attention(q, k, v, causal=True, scale=0.25, diag_offset=0, dropout_p=0.2).transpose(1, 2)
    assert torch.equal(got, want)


def _gpt_oss_config():
    return transformers.GptOssConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                     num_local_experts=4, num_experts_per_tok=2, sliding_window=6,
                                     layer_types=["sliding_attention", "full_attention"], max_position_embeddings=128,
                                     attention_dropout=0.0, tie_word_embeddings=False)


@pytest.mark.skipif(not hasattr(transformers, "GptOssConfig"), reason="this transformers has no gpt-oss")
def test_gpt_oss_sinks_match_eager(rng, counted):
    """gpt-oss passes its per-head sinks as s_aux: the logits and every gradient (the sinks'
    included) agree with transformers' eager attention, which concatenates the sink logit to
    each row's scores; a sliding-window layer and left padding included."""
    name = fhf.register()
    cfg = _gpt_oss_config()
    torch.manual_seed(SEED % 2**31)
    ref = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="eager")
    ours = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=name)
    with torch.no_grad():  # sinks are initialised to zeros: make them matter
        for layer in ref.model.layers:
            layer.self_attn.sinks.copy_(torch.from_numpy(rng.standard_normal(4).astype(np.float32)))
    ours.load_state_dict(ref.state_dict())
    ids, mask = _batch(rng, [10, 6], 10)
    want, got = ref(input_ids=ids, attention_mask=mask).logits, ours(input_ids=ids, attention_mask=mask).logits
    assert counted, "flashattn did not run"
    real = mask.bool()
    err = (got - want)[real].abs().max().item() / want[real].abs().max().item()
    assert err < 1e-5, f"gpt-oss: relative logit error {err:.3g} (seed {SEED})"
    (got[real] ** 2).sum().backward()
    (want[real] ** 2).sum().backward()
    for (n, a), b in zip(ours.named_parameters(), ref.parameters()):
        if b.grad is None:
            assert a.grad is None or not a.grad.any(), n
            continue
        e = (a.grad - b.grad).abs().max().item() / max(b.grad.abs().max().item(), 1e-30)
        assert e < 1e-4, f"gpt-oss: gradient of {n} off by {e:.3g} (seed {SEED})"


def test_output_attentions_is_said_not_silently_empty(rng, counted, monkeypatch):
    """output_attentions=True returned no maps without a word (sdpa warns); the backend now
    warns once through transformers' logger, and the logits are still the model's."""
    messages = []
    monkeypatch.setattr(fhf, "_WARNED", set())
    from transformers.utils import logging
    monkeypatch.setattr(logging.get_logger(fhf.__name__), "warning", messages.append)
    name = fhf.register()
    ref, ours = _models(_configs()["llama"], name)
    ids = torch.from_numpy(rng.integers(1, VOCAB, (1, 9)))
    with torch.no_grad():
        r = ours(input_ids=ids, output_attentions=True)
        ours(input_ids=ids, output_attentions=True)
        want = ref(input_ids=ids).logits
    assert len(messages) == 1 and "output_attentions=True returns no maps" in messages[0]
    assert torch.allclose(r.logits, want, atol=1e-5) and counted


@pytest.mark.skipif(not hasattr(transformers, "T5Config"), reason="this transformers has no T5")
def test_t5_position_bias_matches_sdpa(rng, counted):
    """T5's learned relative position bias (position_bias) goes to the kernel as bias=, added
    to the mask as "sdpa" adds it (it was refused with NotImplementedError): logits and every
    parameter's gradient, the relative-bias table's included, with a padded encoder batch."""
    name = fhf.register()
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=96, num_layers=2, num_heads=4,
                                dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
    torch.manual_seed(SEED % 2**31)
    ref = transformers.T5ForConditionalGeneration._from_config(copy.deepcopy(cfg), attn_implementation="sdpa")
    ours = transformers.T5ForConditionalGeneration._from_config(copy.deepcopy(cfg), attn_implementation=name)
    ours.load_state_dict(ref.state_dict())
    ids, mask = _batch(rng, [9, 5], 9)
    dec = torch.from_numpy(rng.integers(1, VOCAB, (2, 6)))
    out = {}
    for tag, model in (("ref", ref), ("ours", ours)):
        model.zero_grad()
        before = len(counted)
        logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
        logits.square().mean().backward()
        out[tag] = (logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        if tag == "ours":
            assert len(counted) - before == 3 * 2, "flashattn did not run in every attention layer"
    (want, gwant), (got, ggot) = out["ref"], out["ours"]
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item(), f"logits differ (seed {SEED})"
    assert any("relative_attention_bias" in n for n in gwant)
    for n, g in gwant.items():
        err = (ggot[n] - g).abs().max().item() / max(g.abs().max().item(), 1e-30)
        assert err < 1e-4, f"{n}: relative gradient error {err:.3g} (seed {SEED})"


def test_query_batch_of_one_broadcasts_as_sdpa():
    """Queries of batch 1 against keys of batch B (learned queries) are broadcast, as
    transformers' "sdpa" broadcasts them (they were refused: batch sizes differ), gradient of
    the shared queries summed over the batch; and keys and values of batch 1 against queries
    of batch B likewise."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    torch.manual_seed(SEED % 2**31)
    module = torch.nn.Module()
    module.is_causal = False
    q = torch.randn(1, 4, 3, 8, requires_grad=True)
    k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8)
    want, _ = sdpa_attention_forward(module, q, k, v, None)
    (gwant,) = torch.autograd.grad(want.square().sum(), q)
    got, _ = fhf.attention_forward(module, q, k, v, None)
    (ggot,) = torch.autograd.grad(got.square().sum(), q)
    assert got.shape == want.shape == (2, 3, 4, 8)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ggot, gwant, rtol=1e-5, atol=1e-5)
    # and the other way: keys and values of batch 1 shared by queries of batch 2
    q2 = torch.randn(2, 4, 3, 8)
    k1, v1 = (torch.randn(1, 4, 5, 8, requires_grad=True) for _ in range(2))
    want, _ = sdpa_attention_forward(module, q2, k1, v1, None)
    gwant = torch.autograd.grad(want.square().sum(), (k1, v1))
    got, _ = fhf.attention_forward(module, q2, k1, v1, None)
    ggot = torch.autograd.grad(got.square().sum(), (k1, v1))
    assert got.shape == want.shape == (2, 3, 4, 8)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(ggot, gwant):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
