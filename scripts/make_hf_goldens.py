#!/usr/bin/env python3
"""Goldens for sshsdp's Llama-family models, computed by transformers itself.

Builds tiny random Qwen3 / Qwen3-MoE / Llama models offline (`*Config(...)` ->
`*ForCausalLM(config)`, eager attention, fp32; odd sizes, GQA and MQA, head_dim != hidden /
heads, tied and untied, a dense block among MoE blocks, norm_topk_prob on and off, the
pooled load-balancing loss of output_router_logits),
saves each with `save_pretrained` into sshsdp/hf/testdata/<name>/ and records, for one batch
of tokens and targets, the logits, the mean cross-entropy and every parameter's gradient in
golden.safetensors (names: tokens, targets, logits, loss, grad.<HF name>, and adamw_losses:
the loss before each of 3 AdamW steps and after them). The C++ tests (sshsdp/hf/
hf_golden_test.cc, llama_parity_test.cc) hold sshsdp to them.

Run by developers, never by CI (torch is a multi-GB download):
    python3 -m venv ~/.cache/sshsdp/fsdp2-peer
    ~/.cache/sshsdp/fsdp2-peer/bin/pip install torch transformers safetensors
    ~/.cache/sshsdp/fsdp2-peer/bin/python scripts/make_hf_goldens.py
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sshsdp", "hf", "testdata")
B, T = 2, 12


def models():
    common = dict(num_hidden_layers=2, max_position_embeddings=64, initializer_range=0.1,
                  attn_implementation="eager", attention_bias=False)
    yield "qwen3_gqa", transformers.Qwen3ForCausalLM, transformers.Qwen3Config(
        vocab_size=97, hidden_size=48, intermediate_size=80, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False, use_sliding_window=False, **common)
    yield "qwen3_tied", transformers.Qwen3ForCausalLM, transformers.Qwen3Config(
        vocab_size=131, hidden_size=32, intermediate_size=56, num_attention_heads=2,
        num_key_value_heads=2, head_dim=24, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, use_sliding_window=False, **common)
    moe = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_attention_heads=2,
               num_key_value_heads=1, head_dim=16, rope_theta=1000000.0, rms_norm_eps=1e-6,
               tie_word_embeddings=False, use_sliding_window=False, num_experts=4,
               num_experts_per_tok=2, moe_intermediate_size=24, **common)
    moe["num_hidden_layers"] = 3
    # A dense block between two MoE blocks; renormalised top-k gates.
    yield "qwen3_moe", transformers.Qwen3MoeForCausalLM, transformers.Qwen3MoeConfig(
        mlp_only_layers=[1], norm_topk_prob=True, **moe)
    # Every block MoE; the top-k softmax probabilities as they are.
    yield "qwen3_moe_raw", transformers.Qwen3MoeForCausalLM, transformers.Qwen3MoeConfig(
        mlp_only_layers=[], norm_topk_prob=False, **moe)
    yield "llama_mqa", transformers.LlamaForCausalLM, transformers.LlamaConfig(
        vocab_size=89, hidden_size=40, intermediate_size=72, num_attention_heads=4,
        num_key_value_heads=1, head_dim=10, rope_theta=500000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False, mlp_bias=False, **common)
    # transformers' load-balancing loss, pooled over the MoE blocks (output_router_logits; the
    # dense middle block has no router), with a coefficient large enough to show in gradients.
    yield "qwen3_moe_aux", transformers.Qwen3MoeForCausalLM, transformers.Qwen3MoeConfig(
        mlp_only_layers=[1], norm_topk_prob=True, output_router_logits=True,
        router_aux_loss_coef=0.05, **moe)


def training_loss(model, tokens, targets, V):
    """(logits, loss): the mean cross-entropy, plus router_aux_loss_coef times the pooled
    load-balancing loss where the config asks for it (output_router_logits)."""
    out = model(input_ids=tokens)
    loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, V), targets.reshape(-1))
    if getattr(model.config, "output_router_logits", False):
        loss = loss + model.config.router_aux_loss_coef * out.aux_loss
    return out.logits, loss


def adamw_losses(model, tokens, targets, V):
    """The loss before each of 3 full-batch AdamW steps and after the last: lr 1e-3, betas (0.9,
    0.95), eps 1e-8, weight decay 0.1 on matrices and tables and none on norm gains (sshsdp's
    rule), no clipping. Run after the gradient above was recorded, on a copy. At lr 1e-2 the
    MoE trajectory is ill-conditioned (transformers' own eager and sdpa attention end 7.7e-4
    apart after 3 steps, a gate near a top-k tie); at 1e-3 they agree to 1e-6."""
    import copy
    m = copy.deepcopy(model)
    m.zero_grad(set_to_none=True)
    decay = [p for p in m.parameters() if p.dim() >= 2]
    keep = [p for p in m.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": keep, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    losses = []
    for step in range(4):
        _, loss = training_loss(m, tokens, targets, V)
        losses.append(loss.item())
        if step == 3:
            break
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return torch.tensor(losses, dtype=torch.float64).float()


def saved_names(name, t, config):
    """(name, tensor) pairs of a parameter as save_pretrained writes it: transformers 5 keeps a
    Qwen3-MoE block's experts fused at run time (experts.gate_up_proj [E, 2f, d] with gate rows
    first, experts.down_proj [E, d, f]) and saves them per expert."""
    prefix, sep, kind = name.rpartition(".experts.")
    if not sep:
        return [(name, t)]
    f = config.moe_intermediate_size
    out = []
    for e in range(t.shape[0]):
        at = f"{prefix}.experts.{e}"
        if kind == "gate_up_proj":
            out += [(f"{at}.gate_proj.weight", t[e, :f]), (f"{at}.up_proj.weight", t[e, f:])]
        else:
            out.append((f"{at}.down_proj.weight", t[e]))
    return out


def check_saved_names(model, out):
    """The per-expert split above is the one save_pretrained wrote."""
    from safetensors.torch import load_file
    saved = load_file(os.path.join(out, "model.safetensors"))
    for n, p in model.named_parameters():
        for key, t in saved_names(n, p.detach(), model.config):
            assert torch.equal(saved[key], t), key


def main():
    torch.manual_seed(20261204)
    for name, cls, config in models():
        model = cls(config).float().eval()
        with torch.no_grad():  # norms away from 1, so their gains matter
            for n, p in model.named_parameters():
                if p.dim() == 1:
                    p.add_(0.2 * torch.randn_like(p))
        V = config.vocab_size
        tokens = torch.randint(0, V, (B, T))
        targets = torch.randint(0, V, (B, T))
        logits, loss = training_loss(model, tokens, targets, V)
        loss.backward()
        out = os.path.join(OUT, name)
        model.save_pretrained(out)
        adamw = adamw_losses(model, tokens, targets, V)
        g = {"tokens": tokens.float(), "targets": targets.float(),
             "logits": logits.detach().reshape(B * T, V).contiguous(),
             "loss": loss.detach().reshape(1), "adamw_losses": adamw}
        for n, p in model.named_parameters():
            for saved, grad in saved_names(n, p.grad.detach(), model.config):
                g["grad." + saved] = grad.contiguous()
        check_saved_names(model, out)
        save_file(g, os.path.join(out, "golden.safetensors"),
                  metadata={"torch": torch.__version__, "transformers": transformers.__version__})
        print(f"{name}: loss {loss.item():.6f}, {sum(p.numel() for p in model.parameters())} "
              f"parameters -> {out}")


if __name__ == "__main__":
    sys.exit(main())
