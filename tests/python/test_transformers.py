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


def test_dropout_in_training_raises():
    name = fhf.register()
    cfg = copy.deepcopy(_configs()["llama"])
    cfg.attention_dropout = 0.1
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=name).train()
    with pytest.raises(NotImplementedError, match="dropout"):
        model(input_ids=torch.ones((1, 4), dtype=torch.long))
