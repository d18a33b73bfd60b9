"""sshsdp's reference models written in PyTorch as its users write them, for the peers.

Why: a ratio against PyTorch only means something if both sides train the same model from
the same weights. This module holds that model on the PyTorch side:

  Gpt      sshsdp/models/gpt.cc: token + learned position embeddings, pre-norm blocks
           (RMSNorm eps 1e-5 -> packed QKV -> causal attention -> proj -> residual;
           RMSNorm -> MLP -> residual), final RMSNorm, untied LM head, mean cross-entropy,
           no biases. A dense block's MLP is fc1 -> GELU (tanh) -> fc2.
  MoE      sshsdp/models/moe.h: the same trunk; in the blocks the workload lists as MoE the
           MLP is a mixture of experts. Router logits in fp32 (autocast off), top-k experts
           by logit, gates from softmax (or sigmoid) scores, renormalised over the k chosen
           when the model says so, Switch-Transformer load-balancing loss
           aux = alpha * E * sum_e f_e * P_e added to the loss per MoE block. Experts as
           torchtitan keeps them (stacked [E, out, in] weights) and runs them on a CPU: a
           loop over experts gathering each expert's tokens, SwiGLU (or GELU) MLP, weighted
           by the gate and scattered back with index_add; an optional shared expert.

`build_model(m)` takes workload.json's "model" object (sshsdp's model JSON: type gpt or
moe-gpt); `model.load_sshsdp(weights)` copies sshsdp's initial weights (update-parameter
names; per-part names are concatenated or stacked back into the packed runtime tensors).

  model = build_model(wl["model"])
  model.load_sshsdp(read_safetensors("init.safetensors"))
  loss = model(tokens, targets)          # cross-entropy (+ the MoE blocks' aux losses)
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

RMS_EPS = 1e-5


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.g = nn.Parameter(torch.ones(d))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_EPS)
        return (y * self.g.float()).to(x.dtype)


class Embeddings(nn.Module):
    def __init__(self, vocab, seq_len, d):
        super().__init__()
        self.wte = nn.Parameter(torch.zeros(vocab, d))
        self.wpe = nn.Parameter(torch.zeros(seq_len, d))

    def forward(self, tokens):
        T = tokens.shape[1]
        return F.embedding(tokens, self.wte) + self.wpe[:T]


class DenseMlp(nn.Module):
    def __init__(self, d, d_ff):
        super().__init__()
        self.fc1 = nn.Linear(d, d_ff, bias=False)
        self.fc2 = nn.Linear(d_ff, d, bias=False)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh")), None

    @torch.no_grad()
    def load(self, t, p):
        self.fc1.weight.copy_(t(p + "mlp.fc1"))
        self.fc2.weight.copy_(t(p + "mlp.fc2"))


class MoeMlp(nn.Module):
    """Top-k routed experts (+ shared expert) and the load-balancing loss of one block."""

    def __init__(self, d, m):
        super().__init__()
        E, f = m["n_expert"], m["d_expert"]
        self.E, self.k = E, m["top_k"]
        self.softmax = m["gating"] == "softmax"
        self.renormalize = m["renormalize"]
        self.swiglu = m["expert_mlp"] == "swiglu"
        self.alpha = m.get("aux_loss_weight", 0.01)
        self.router = nn.Parameter(torch.zeros(E, d))
        self.w1 = nn.Parameter(torch.zeros(E, f, d))
        self.w2 = nn.Parameter(torch.zeros(E, d, f))
        self.w3 = nn.Parameter(torch.zeros(E, f, d)) if self.swiglu else None
        fs = m.get("d_shared", 0)
        self.shared = None
        if fs:
            self.shared = nn.ParameterDict({
                "w1": nn.Parameter(torch.zeros(fs, d)),
                "w2": nn.Parameter(torch.zeros(d, fs)),
                **({"w3": nn.Parameter(torch.zeros(fs, d))} if self.swiglu else {}),
            })

    def expert(self, x, w1, w2, w3):
        h = F.linear(x, w1)
        a = F.silu(h) * F.linear(x, w3) if self.swiglu else F.gelu(h, approximate="tanh")
        return F.linear(a, w2)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        N = x.shape[0]
        with torch.autocast("cpu", enabled=False):  # routing decisions from fp32 logits
            logits = F.linear(x.float(), self.router.float())
            top = logits.topk(self.k, dim=-1).indices
            if self.softmax:
                q = logits.softmax(-1)
                p = q
            else:
                q = logits.sigmoid()
                p = q / q.sum(-1, keepdim=True)
            gate = q.gather(1, top)
            if self.renormalize:
                gate = gate / gate.sum(-1, keepdim=True)
            frac = torch.bincount(top.flatten(), minlength=self.E).float() / (N * self.k)
            aux = self.alpha * self.E * (frac * p.mean(0)).sum()
        if self.shared is not None:
            s = self.shared
            out = self.expert(x, s["w1"], s["w2"], s["w3"] if self.swiglu else None)
        else:
            out = torch.zeros_like(x)
        for e in range(self.E):
            tok, slot = (top == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            y = self.expert(x[tok], self.w1[e], self.w2[e], self.w3[e] if self.swiglu else None)
            out = out.index_add(0, tok, y * gate[tok, slot].unsqueeze(1).to(y.dtype))
        return out.reshape(shape), aux

    @torch.no_grad()
    def load(self, t, p, w):
        def stacked(name):  # the packed [E, out, in] tensor, or its per-expert parts
            if p + name in w:
                return t(p + name)
            return torch.stack([t(f"{p}{name}.e{e}") for e in range(self.E)])

        self.router.copy_(t(p + "moe.router"))
        self.w1.copy_(stacked("moe.w1"))
        self.w2.copy_(stacked("moe.w2"))
        if self.swiglu:
            self.w3.copy_(stacked("moe.w3"))
        if self.shared is not None:
            for k_, v in self.shared.items():
                v.copy_(t(f"{p}moe.shared.{k_}"))


class Block(nn.Module):
    def __init__(self, d, n_head, mlp):
        super().__init__()
        self.n_head = n_head
        self.ln1 = RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.ln2 = RMSNorm(d)
        self.mlp = mlp

    def forward(self, x):
        B, T, d = x.shape
        H = self.n_head
        qkv = self.qkv(self.ln1(x))
        # Rows of the QKV weight: all Q heads, then all K heads, then all V heads.
        q, k, v = (t.view(B, T, H, d // H).transpose(1, 2) for t in qkv.split(d, dim=-1))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(B, T, d))
        y, aux = self.mlp(self.ln2(x))
        return x + y, aux


class Head(nn.Module):
    def __init__(self, d, vocab):
        super().__init__()
        self.lnf = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, x, targets):
        logits = self.lm_head(self.lnf(x)).float()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


class Gpt(nn.Module):
    """The dense GPT, or the MoE GPT when m["type"] is "moe-gpt"."""

    def __init__(self, m):
        super().__init__()
        d, H = m["d_model"], m["n_head"]
        moe_layers = set(m.get("moe_layers", [])) if m.get("type") == "moe-gpt" else set()
        self.n_head = H
        self.emb = Embeddings(m["vocab"], m["seq_len"], d)
        self.blocks = nn.ModuleList(
            Block(d, H, MoeMlp(d, m) if l in moe_layers else DenseMlp(d, m["d_ff"]))
            for l in range(m["n_layer"])
        )
        self.head = Head(d, m["vocab"])

    def forward(self, tokens, targets):
        x = self.emb(tokens)
        aux = []
        for b in self.blocks:
            x, a = b(x)
            if a is not None:
                aux.append(a)
        loss = self.head(x, targets)
        return loss + sum(aux) if aux else loss

    @torch.no_grad()
    def load_sshsdp(self, w):
        def t(name):
            if name not in w:
                raise SystemExit(f"init weights: '{name}' is missing")
            return torch.from_numpy(w[name])

        self.emb.wte.copy_(t("wte"))
        self.emb.wpe.copy_(t("wpe"))
        for l, b in enumerate(self.blocks):
            p = f"blocks.{l}."
            b.ln1.g.copy_(t(p + "ln1.g"))
            if p + "attn.qkv" in w:  # the fused model (AdamW runs): one [3d, d] parameter
                b.qkv.weight.copy_(t(p + "attn.qkv"))
            else:
                parts = [t(f"{p}attn.{w_}.h{h}") for w_ in ("q", "k", "v")
                         for h in range(self.n_head)]
                b.qkv.weight.copy_(torch.cat(parts, dim=0))
            b.proj.weight.copy_(t(p + "attn.proj"))
            b.ln2.g.copy_(t(p + "ln2.g"))
            if isinstance(b.mlp, MoeMlp):
                b.mlp.load(t, p, w)
            else:
                b.mlp.load(t, p)
        self.head.lnf.g.copy_(t("lnf.g"))
        self.head.lm_head.weight.copy_(t("lm_head"))


def build_model(m):
    """The model workload.json's "model" object describes (gpt or moe-gpt)."""
    if m.get("type", "gpt") not in ("gpt", "moe-gpt"):
        raise SystemExit(f"workload model type '{m['type']}' is neither gpt nor moe-gpt")
    return Gpt(m)
