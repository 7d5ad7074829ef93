"""Plain-PyTorch reference of transformers' LlamaForCausalLM (written from the HF modeling code's semantics, no
transformers import): RMSNorm computed in fp32 (or fp64) with a weight, rotate_half RoPE, repeat_kv GQA, SwiGLU,
tied or untied lm_head, loss with HF's internal next-token shift and ignore_index -100.

Inputs (tests/llama_test.cpp): "cfg" f64 [vocab, hidden, layers, heads, kv_heads, head_dim, ffn, eps, theta,
tied, gen_steps, float64], the weights under their HF names, "ids" i32 [B, S], optional "labels" i32 [B, S]
(unshifted, as given to LlamaForCausalLM), optional "prompt" i32 [P] for greedy generation.
Outputs: "logits", "loss" (+ "grad.<name>" for every weight) when labels are given, "generated" when a prompt is.
"""
import torch
import torch.nn.functional as F

import torch_io


class Cfg:
    def __init__(self, v):
        v = [float(x) for x in v]
        (self.vocab, self.hidden, self.layers, self.heads, self.kv_heads, self.head_dim, self.ffn) = map(int, v[:7])
        self.eps, self.theta = v[7], v[8]
        self.tied, self.gen_steps, self.f64 = bool(v[9]), int(v[10]), bool(v[11])


def rms_norm(x, w, eps):
    # LlamaRMSNorm: variance in fp32 (here: at least the compute dtype), then weight * normalized.
    dt = x.dtype
    h = x.to(torch.float64 if dt == torch.float64 else torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return w * h.to(dt)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_cos_sin(positions, dim, theta, dtype):
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))  # HF: computed in fp32
    freqs = positions[:, None].float() * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def repeat_kv(x, n_rep):
    b, kvh, s, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, kvh, n_rep, s, d).reshape(b, kvh * n_rep, s, d)


def forward(c, W, ids):
    b, s = ids.shape
    x = W["model.embed_tokens.weight"][ids.long()]
    cos, sin = rope_cos_sin(torch.arange(s), c.head_dim, c.theta, x.dtype)
    causal = torch.full((s, s), float("-inf"), dtype=x.dtype).triu(1)
    for i in range(c.layers):
        p = f"model.layers.{i}."
        h = rms_norm(x, W[p + "input_layernorm.weight"], c.eps)
        q = F.linear(h, W[p + "self_attn.q_proj.weight"]).view(b, s, c.heads, c.head_dim).transpose(1, 2)
        k = F.linear(h, W[p + "self_attn.k_proj.weight"]).view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)
        v = F.linear(h, W[p + "self_attn.v_proj.weight"]).view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = repeat_kv(k, c.heads // c.kv_heads)
        v = repeat_kv(v, c.heads // c.kv_heads)
        att = torch.matmul(q, k.transpose(2, 3)) / (c.head_dim ** 0.5) + causal
        att = torch.softmax(att, dim=-1)
        o = torch.matmul(att, v).transpose(1, 2).reshape(b, s, c.heads * c.head_dim)
        x = x + F.linear(o, W[p + "self_attn.o_proj.weight"])
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], c.eps)
        mlp = F.linear(F.silu(F.linear(h, W[p + "mlp.gate_proj.weight"])) * F.linear(h, W[p + "mlp.up_proj.weight"]),
                       W[p + "mlp.down_proj.weight"])
        x = x + mlp
    x = rms_norm(x, W["model.norm.weight"], c.eps)
    head = W["model.embed_tokens.weight"] if c.tied else W["lm_head.weight"]
    return F.linear(x, head)


def hf_loss(logits, labels):
    # LlamaForCausalLM: shift so that token t predicts t + 1, then mean cross-entropy ignoring -100.
    shift_logits = logits[..., :-1, :].contiguous().view(-1, logits.shape[-1])
    shift_labels = labels[..., 1:].contiguous().view(-1).long()
    return F.cross_entropy(shift_logits, shift_labels, ignore_index=-100)


def run(t):
    c = Cfg(t["cfg"].tolist())
    dt = torch.float64 if c.f64 else torch.float32
    W = {k: v.to(dt).requires_grad_(True) for k, v in t.items() if k.startswith("model.") or k == "lm_head.weight"}
    out = {}
    logits = forward(c, W, t["ids"])
    out["logits"] = logits.detach()
    if "labels" in t:
        loss = hf_loss(logits, t["labels"])
        loss.backward()
        out["loss"] = loss.detach().reshape(1)
        for k, v in W.items():
            out["grad." + k] = v.grad
    if "prompt" in t:
        # Greedy decoding by re-running the full prefill each step (no cache), argmax with lowest id on ties.
        seq = t["prompt"].long().tolist()
        gen = []
        with torch.no_grad():
            for _ in range(c.gen_steps):
                lg = forward(c, W, torch.tensor([seq]))[0, -1]
                nxt = int(torch.argmax(lg).item())
                gen.append(nxt)
                seq.append(nxt)
        out["generated"] = torch.tensor(gen, dtype=torch.int32)
    return out


if __name__ == "__main__":  # tests/ref/finetune_dp_check.py imports forward and hf_loss
    torch_io.main(run)
