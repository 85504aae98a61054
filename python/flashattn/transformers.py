"""flashattn as a Hugging Face transformers attention backend.

    import flashattn.transformers
    name = flashattn.transformers.register()          # "exact_attention"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=name)

register() adds one function to transformers' AttentionInterface and its mask builder to
AttentionMaskInterface under the same name. The name has no "flash" in it on purpose:
transformers routes any implementation whose name contains "flash" through its own
FlashAttention integration (varlen unpadding, its flash_attn imports) instead of calling
the registered function.

The mask builder is transformers' own SDPA mask (a boolean [B, 1, Sq, Sk], True = attend,
padding and sliding windows folded in; None where plain causal attention is exact), so the
masks this backend receives are exactly the ones the "sdpa" implementation receives. The
attention function lowers them the way flashattn.torch.attention lowers any mask: hidden
keys get -inf and follow the library's hidden-key rule (docs/nonfinite.md). GQA runs on
the kv heads directly (no repeat_kv copy); softcap (Gemma 2) goes to the kernel.

output_attentions=True gets no attention maps (flashattn never forms them), with a warning
once, as "sdpa" gives. What differs from "sdpa": a query row that sees no key at all (the pad positions of a
left-padded batch) gives o = 0 here; torch's SDPA gives 0 or NaN there depending on its
version and kernel. Those rows are padding, which the model's loss and generate() ignore.
Attention dropout (a module in training mode with attention_dropout > 0) runs flashattn's
dropout, its seed drawn from torch's generator (torch.manual_seed reproduces it; the keep
mask is flashattn's own, docs/semantics.md, "Dropout"). Attention sinks (gpt-oss passes its
per-head `sinks` parameter as `s_aux`) go to the kernel as sinks=, with their gradient; T5's
relative `position_bias` goes as bias= (with the mask's -inf where it hides a key), with its
gradient; a batch of 1 (queries, or keys and values) against a batch of B is broadcast, as
"sdpa" does.
"""
import torch

from . import torch as _ft

NAME = "exact_attention"
_WARNED = set()


def _warn_once(message):
    """transformers' own logger, once per message (its convention for what a backend cannot do)."""
    if message not in _WARNED:
        _WARNED.add(message)
        from transformers.utils import logging
        logging.get_logger(__name__).warning(message)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      is_causal=None, softcap=None, **kwargs):
    """transformers' attention-function signature: query [B, Hq, Sq, D], key and value
    [B, Hk, Sk, D]; returns (output [B, Sq, Hq, Dv], None)."""
    if kwargs.get("output_attentions"):  # as transformers warns for "sdpa": said once, not silent
        _warn_once(f"{NAME} never forms the attention weights: output_attentions=True returns no maps "
                   "(attn_implementation='eager' does)")
    sq, sk = query.shape[2], key.shape[2]
    # a batch of 1 against a larger one (learned queries, or keys and values shared by the
    # batch): broadcast, as SDPA does
    if query.shape[0] == 1 and key.shape[0] > 1:
        query = query.expand(key.shape[0], *query.shape[1:])
    elif key.shape[0] == 1 and value.shape[0] == 1 and query.shape[0] > 1:
        key, value = (x.expand(query.shape[0], *x.shape[1:]) for x in (key, value))
    # T5's relative position bias [1 or B, Hq, Sq, Sk] (learned: its gradient flows), added
    # to the scores as "sdpa" adds it (with the mask's -inf where a key is hidden)
    position_bias = kwargs.get("position_bias")
    if position_bias is not None:
        position_bias = position_bias.to(torch.float32)[..., :sq, :sk]
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    opts = dict(scale=scaling, softcap=softcap)
    if dropout:  # transformers passes 0.0 outside training
        opts["dropout_p"] = float(dropout)
    s_aux = kwargs.get("s_aux")
    if s_aux is not None:  # gpt-oss: a logit per query head in each row's softmax denominator
        opts["sinks"] = s_aux.to(torch.float32)
    if attention_mask is not None:
        # the mask already holds causality, padding and any sliding window
        if attention_mask.dtype == torch.bool:
            bias = torch.zeros(attention_mask.shape, dtype=torch.float32, device=query.device)
            bias.masked_fill_(~attention_mask, float("-inf"))
        else:  # an additive float mask (a custom mask function)
            bias = attention_mask.to(torch.float32)
        bias = bias[..., :sq, :sk]
        if position_bias is not None:
            bias = bias + position_bias
        o = _ft.attention(query, key, value, bias=bias, **opts)
    else:
        # no mask: transformers found plain causal attention (or, for one query row or a
        # bidirectional model, full attention) exact here; a sliding window that matters
        # always comes as a mask (masking_utils._ignore_causal_mask_sdpa)
        causal = bool(is_causal and sq > 1)  # aligned top-left, as SDPA's is_causal
        o = _ft.attention(query, key, value, causal=causal, diag_offset=0 if causal else None, bias=position_bias,
                          **opts)
    return o.transpose(1, 2).contiguous(), None


def register(name=NAME):
    """Registers flashattn with transformers under `name` (default "exact_attention") and
    returns the name, for `attn_implementation=name`."""
    if "flash" in name.lower():
        raise ValueError(f"{name!r}: transformers sends names containing 'flash' to its own "
                         "FlashAttention integration; choose a name without it")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
