"""Reference side of `mgn llama-check`: a Hugging Face Llama-family directory with random weights, and what
transformers' LlamaForCausalLM computes on it in strict f32 (and how long PyTorch eager takes).

    python3 bench/pytorch/llama_ref.py DIR [--config smollm2-135m|tiny] [--seq 128] [--tokens 32]
                                           [--prompt P] [--device cuda|cpu] [--impl auto|hf|plain]

Writes into DIR:
  config.json          HF config (SmolLM2-135M's published fields, or the tiny test config); bos/eos are null
                       so that greedy generation never stops early on random weights
  model.safetensors    random weights (fixed seed) under HF names; tied models store no lm_head.weight
  inputs.safetensors   ref.ids i32 [1, S] (random, fixed seed), ref.logits f32 [1, S, V], ref.prompt i32 [P]
                       (the first P ids), ref.greedy i32 [N] (greedy continuation of the prompt with the KV
                       cache), ref.loss f32 [] (next-token cross-entropy, labels = ids, shifted inside the model
                       as HF does), grad.<name> f32 for every parameter; metadata says which implementation
  torch_times.json     PyTorch eager, CUDA-synchronized: prefill at S tokens, one decode token with a cache of
                       P tokens, F+L+B (forward + loss + backward) at S tokens; median of 20 after 5 warm-ups

--impl hf (the default when transformers imports) loads DIR with LlamaForCausalLM.from_pretrained, eager
attention, f32. --impl plain (the default without transformers, e.g. Debian's python3-torch) computes the same
function with plain torch ops written from the HF modeling code (the semantics of tests/ref/llama_ref.py).
Weights: matrices ~ N(0, initializer_range^2) (1/sqrt(hidden), the published SmolLM2 value for 135M), norm
weights 1 + N(0, 0.1^2) so that a dropped norm weight shows.
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gates  # noqa: E402
import safetensors_lite  # noqa: E402
import timing  # noqa: E402

# The numbers of ../shared/reference/workloads.md (SmolLM2-135M) and of mgn::llama::Config::tiny().
CONFIGS = {
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, head_dim=64, intermediate_size=1536, rms_norm_eps=1e-5,
                         rope_theta=10000.0, tie_word_embeddings=True, max_position_embeddings=8192,
                         initializer_range=0.041666666666666664),
    "tiny": dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, intermediate_size=128, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
                 max_position_embeddings=256, initializer_range=0.125),
}


def hf_config(c):
    j = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "attention_bias": False,
         "attention_dropout": 0.0, "mlp_bias": False, "pretraining_tp": 1, "rope_scaling": None, "use_cache": True,
         "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "torch_dtype": "float32"}
    j.update(c)
    return j


def parameter_shapes(c):
    """HF names in the order of mgn::llama::parameter_shapes."""
    H, D, Fd = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
    r = [("model.embed_tokens.weight", (c["vocab_size"], H))]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        r += [(p + "input_layernorm.weight", (H,)), (p + "self_attn.q_proj.weight", (q, H)),
              (p + "self_attn.k_proj.weight", (kv, H)), (p + "self_attn.v_proj.weight", (kv, H)),
              (p + "self_attn.o_proj.weight", (H, q)), (p + "post_attention_layernorm.weight", (H,)),
              (p + "mlp.gate_proj.weight", (Fd, H)), (p + "mlp.up_proj.weight", (Fd, H)),
              (p + "mlp.down_proj.weight", (H, Fd))]
    r.append(("model.norm.weight", (H,)))
    if not c["tie_word_embeddings"]:
        r.append(("lm_head.weight", (c["vocab_size"], H)))
    return r


def random_weights(c, seed):
    g = torch.Generator().manual_seed(seed)
    w = {}
    for name, shape in parameter_shapes(c):
        r = torch.randn(shape, generator=g, dtype=torch.float32)
        w[name] = (1.0 + 0.1 * r) if len(shape) == 1 else r * c["initializer_range"]
    return w


# ---- plain PyTorch (no transformers): LlamaForCausalLM's function, written from the HF modeling code

class PlainLlama:
    def __init__(self, c, weights, device, dtype=torch.float32):
        self.c = c
        self.W = {k: v.to(device, dtype).clone().requires_grad_(True) for k, v in weights.items()}
        self.device = device

    def named_parameters(self):
        return self.W.items()

    def zero_grad(self):
        for v in self.W.values():
            v.grad = None

    @staticmethod
    def rms_norm(x, w, eps):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    @staticmethod
    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    def forward(self, ids, past=None):
        """Logits of ids [B, s] at positions P..P+s-1 after a cache of P tokens (past: per layer (k, v), before
        the grouped heads are repeated), and the cache extended by these tokens."""
        c, W = self.c, self.W
        b, s = ids.shape
        p0 = 0 if past is None else past[0][0].shape[2]
        nh, kvh, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        x = W["model.embed_tokens.weight"][ids.long()]
        ft = x.dtype  # the rotary angles and the mask in the weights' dtype (float32, or float64 for the reference)
        inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.int64, device=self.device).to(ft) / d))
        freqs = torch.arange(p0, p0 + s, device=self.device).to(ft)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        causal = torch.full((s, p0 + s), float("-inf"), device=self.device, dtype=ft).triu(p0 + 1)
        cache = []
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = self.rms_norm(x, W[p + "input_layernorm.weight"], c["rms_norm_eps"])
            q = F.linear(h, W[p + "self_attn.q_proj.weight"]).view(b, s, nh, d).transpose(1, 2)
            k = F.linear(h, W[p + "self_attn.k_proj.weight"]).view(b, s, kvh, d).transpose(1, 2)
            v = F.linear(h, W[p + "self_attn.v_proj.weight"]).view(b, s, kvh, d).transpose(1, 2)
            q = q * cos + self.rotate_half(q) * sin
            k = k * cos + self.rotate_half(k) * sin
            if past is not None:
                k, v = torch.cat([past[i][0], k], dim=2), torch.cat([past[i][1], v], dim=2)
            cache.append((k, v))
            k = k.repeat_interleave(nh // kvh, dim=1)
            v = v.repeat_interleave(nh // kvh, dim=1)
            att = torch.softmax(torch.matmul(q, k.transpose(2, 3)) / (d ** 0.5) + causal, dim=-1)
            o = torch.matmul(att, v).transpose(1, 2).reshape(b, s, nh * d)
            x = x + F.linear(o, W[p + "self_attn.o_proj.weight"])
            h = self.rms_norm(x, W[p + "post_attention_layernorm.weight"], c["rms_norm_eps"])
            x = x + F.linear(F.silu(F.linear(h, W[p + "mlp.gate_proj.weight"])) * F.linear(h, W[p + "mlp.up_proj.weight"]),
                             W[p + "mlp.down_proj.weight"])
        x = self.rms_norm(x, W["model.norm.weight"], c["rms_norm_eps"])
        head = W["model.embed_tokens.weight" if c["tie_word_embeddings"] else "lm_head.weight"]
        return F.linear(x, head), cache

    def logits(self, ids):
        return self.forward(ids)[0]

    def loss(self, ids):
        lg = self.logits(ids)
        return F.cross_entropy(lg[:, :-1].reshape(-1, lg.shape[-1]), ids[:, 1:].reshape(-1).long())

    def greedy(self, prompt, n):
        # No cache: the whole prefix again for every token (the prefill-only path).
        seq = prompt.clone()
        out = []
        with torch.no_grad():
            for _ in range(n):
                nxt = int(torch.argmax(self.logits(seq)[0, -1]).item())
                out.append(nxt)
                seq = torch.cat([seq, torch.tensor([[nxt]], device=self.device, dtype=seq.dtype)], dim=1)
        return out

    def decode_step(self, prompt, tok=None):
        """One token (tok [B, 1], default the greedy one) after the cache of prompt; the cache is not extended."""
        with torch.no_grad():
            lg, cache = self.forward(prompt)
        if tok is None:
            tok = torch.argmax(lg[:, -1:], dim=-1)

        def step():
            with torch.no_grad():
                self.last_logits = self.forward(tok, cache)[0]
        return step

    def compile(self, mode):
        self.forward = torch.compile(self.forward, mode=mode)


# ---- transformers

class HfLlama:
    def __init__(self, c, directory, weights, device, attn="eager", dtype=torch.float32):
        import transformers
        from transformers import LlamaForCausalLM
        self.c, self.device = c, device
        self.version = transformers.__version__
        kw = {"attn_implementation": attn, "output_loading_info": True}
        try:
            model, info = LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32, **kw)
        except TypeError:  # transformers 4 names it torch_dtype
            model, info = LlamaForCausalLM.from_pretrained(directory, torch_dtype=torch.float32, **kw)
        bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        if bad:
            raise SystemExit(f"llama_ref.py: transformers loaded {directory}/model.safetensors with problems: {bad}")
        self.model = model.to(device).eval()
        emb = self.model.model.embed_tokens.weight
        if c["tie_word_embeddings"] != (self.model.lm_head.weight.data_ptr() == emb.data_ptr()):
            raise SystemExit("llama_ref.py: lm_head tying differs from tie_word_embeddings")
        # The weights and the rotary frequencies are what we wrote and what mgn computes.
        params = dict(self.model.named_parameters())
        for name, v in weights.items():
            if not torch.equal(params[name].detach().cpu(), v):
                raise SystemExit(f"llama_ref.py: {name} differs after from_pretrained")
        d = c["head_dim"]
        want = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        got = self.model.model.rotary_emb.inv_freq.detach().double().cpu()
        if not torch.allclose(got, want, rtol=1e-6, atol=0):
            raise SystemExit(f"llama_ref.py: transformers' rotary inv_freq is not theta {c['rope_theta']}")
        if dtype != torch.float32:  # the float64 reference: the checked float32 weights, widened exactly
            self.model.to(dtype)
        self.call = self.model

    def compile(self, mode):
        self.call = torch.compile(self.model, mode=mode)

    def named_parameters(self):
        return self.model.named_parameters()

    def zero_grad(self):
        self.model.zero_grad(set_to_none=True)

    def logits(self, ids):
        return self.call(input_ids=ids, use_cache=False).logits

    def loss(self, ids):
        return self.call(input_ids=ids, labels=ids, use_cache=False).loss

    def greedy(self, prompt, n):
        with torch.no_grad():
            out = self.model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
                                      do_sample=False, num_beams=1, use_cache=True)
            gen = out[0, prompt.shape[1]:].tolist()
            # The same with the cache driven by hand (no logits processors), as a cross-check of generate().
            o = self.model(input_ids=prompt, use_cache=True)
            cache, loop = o.past_key_values, [int(torch.argmax(o.logits[0, -1]))]
            while len(loop) < n:
                o = self.model(input_ids=torch.tensor([[loop[-1]]], device=self.device), past_key_values=cache,
                               use_cache=True)
                cache = o.past_key_values
                loop.append(int(torch.argmax(o.logits[0, -1])))
        if gen != loop:
            print(f"llama_ref.py: warning: generate() {gen} differs from the hand-driven cache {loop}", file=sys.stderr)
        return gen

    def decode_step(self, prompt, tok=None):
        """One token (tok [B, 1], default the greedy one) after a cache of len(prompt) tokens, timed; the cache
        is cut back after each call."""
        with torch.no_grad():
            o = self.model(input_ids=prompt, use_cache=True)
        cache = o.past_key_values
        if tok is None:
            tok = torch.argmax(o.logits[:, -1:], dim=-1)

        if not hasattr(cache, "crop"):
            raise SystemExit("llama_ref.py: this transformers' cache has no crop(); cannot time one decode token")

        def step():
            with torch.no_grad():
                self.last_logits = self.model(input_ids=tok, past_key_values=cache, use_cache=True).logits
            cache.crop(-1)  # drop the token just appended (a positive length is deprecated in transformers 5.17)
        return step


# ---- timing

def set_strict():
    timing.set_mode("strict")


def time_calls(fn, warmup, samples, device):
    return timing.summary(timing.time_calls(fn, warmup, samples, device), warmup)


def resolve_impl(impl):
    if impl == "auto":
        try:
            import transformers  # noqa: F401
            return "hf"
        except ImportError:
            return "plain"
    return impl


# ---- bench mode: the PyTorch side of `mgn bench smollm2-135m|llama-tiny|llama`

def bench_ids(batch, cols, vocab, seed):
    """The token ids of tools/bench_model.cpp bench_ids(): row b, position t of a [batch, cols] table."""
    i = np.arange(batch * cols, dtype=np.uint64)
    x = (i * np.uint64(2654435761) + np.uint64(12345 + seed * 97)) & np.uint64(0xFFFFFFFF)
    return ((x >> np.uint64(7)) % np.uint64(vocab)).astype(np.int64).reshape(batch, cols)


class LlamaRun:
    """The timed functions of one configuration (model, AdamW, eager, compiled or eager + CUDA-graph replay:
    inference, flb and step each captured whole on its first call with a capturable AdamW, timing.cuda_graph) on
    fixed inputs."""

    def __init__(self, model, lr, ids, nxt, graphed=False):
        self.model, self.ids, self.nxt = model, ids, nxt
        self.opt = torch.optim.AdamW([p for _, p in model.named_parameters()], lr=lr, capturable=graphed,
                                     **timing.ADAMW)
        self.opt_step = self.opt.step
        self.decode = None
        self.loss = None
        self.compiled = False
        self.graphs = {} if graphed else None

    def _graphed(self, name, fn):
        if self.graphs is None:
            return fn()
        if name not in self.graphs:
            self.graphs[name] = timing.cuda_graph(fn)
        self.graphs[name]()

    def compile(self, mode):
        """The model under torch.compile in `mode` (timing.compile_mode), the AdamW update compiled."""
        self.compiled = True
        self.model.compile(mode)
        self.opt_step = timing.compile_update(self.opt)

    def _inference(self):
        with torch.no_grad():
            self.logits = self.model.logits(self.ids)

    def inference(self):
        self._graphed("inference", self._inference)

    def prepare(self, phase):
        """Before a phase is timed; False: not timed. Minimal: the cache of the prefill (the S prompt tokens),
        then one token at position S per timed call."""
        if phase != "minimal":
            return True
        if self.compiled or self.graphs is not None:  # a growing KV cache: neither recompiled nor re-captured
            print("llama_ref.py: minimal (KV-cache decode) is timed eager only", file=sys.stderr)
            return False
        self.decode = self.model.decode_step(self.ids, self.nxt)
        return True

    def minimal(self):
        self.decode()

    def _flb(self):
        self.model.zero_grad()  # both models set every gradient to None
        self.loss = self.model.loss(self.ids)
        self.loss.backward()

    def flb(self):
        self._graphed("flb", self._flb)

    def _step(self):
        self._flb()
        self.opt_step()

    def step(self):
        self._graphed("step", self._step)

    def value(self, phase):
        """A scalar of the phase's last result (checked finite after the samples)."""
        if phase == "inference":
            return self.logits[0, 0, 0].item()
        if phase == "minimal":
            return self.model.last_logits[0, 0, 0].item()
        return self.loss.item()


def bench_main(a):
    device = timing.pick_device(a.device)
    wnp, wmeta = safetensors_lite.read(a.weights)
    if "config" in wmeta:  # written by mgn bench: the very config its graphs were built from
        c = json.loads(wmeta["config"])
    elif a.config:
        c = load_config(a.config)
    else:
        raise SystemExit(f"llama_ref.py: {a.weights} names no config (metadata 'config'); pass --config")
    workload = a.workload or wmeta.get("workload") or "llama"
    names = [n for n, _ in parameter_shapes(c)]
    extra = sorted(set(wnp) - set(names) - ({"lm_head.weight"} if c["tie_word_embeddings"] else set()))
    missing = [n for n in names if n not in wnp]
    if missing or extra:
        raise SystemExit(f"llama_ref.py: {a.weights}: missing {missing[:5]}, unexpected {extra[:5]}")
    weights = {n: torch.from_numpy(wnp[n].astype(np.float32)) for n in names}
    for n, shape in parameter_shapes(c):
        if tuple(weights[n].shape) != tuple(shape):
            raise SystemExit(f"llama_ref.py: {a.weights}: {n} has shape {list(weights[n].shape)}, expected {list(shape)}")
    B, S, V = a.batch, a.seq, c["vocab_size"]
    table = bench_ids(B, S + 1, V, a.seed)
    ids = torch.from_numpy(table[:, :S].copy()).to(device)
    nxt = torch.from_numpy(table[:, S:].copy()).to(device)
    impl = resolve_impl(a.impl)
    params = sum(int(np.prod(s)) for _, s in parameter_shapes(c))
    out_lines = timing.JsonLines(a.json)
    with tempfile.TemporaryDirectory(prefix="llama_bench_") as tmp:
        if impl == "hf":  # from_pretrained wants a directory: the config and (a link to) the weights
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(hf_config(c), f, indent=2)
            os.symlink(os.path.abspath(a.weights), os.path.join(tmp, "model.safetensors"))

        def build(dtype=torch.float32, dev=device):
            if impl == "hf":
                return HfLlama(c, tmp, weights, dev, a.attn, dtype)
            return PlainLlama(c, weights, dev, dtype)

        probe = build()
        meta = {"backend": device.type, "device": timing.device_name(device), "torch": torch.__version__,
                "model": impl, "transformers": getattr(probe, "version", "none"),
                "attn": a.attn if impl == "hf" else "math"}
        del probe
        if a.outputs:
            bench_gate_outputs(a, build, ids, nxt, workload, meta)
            print(f"llama_ref.py: gate outputs in {a.outputs}", file=sys.stderr)

        phases, modes, impls = timing.run_lists(a, device, "llama_ref.py")
        for mode, run_impl, compiled in timing.configurations(modes, impls):
            run = LlamaRun(build(), a.lr, ids, nxt, graphed=run_impl == "cudagraph")
            common = dict(meta, side="torch", impl=run_impl, workload=workload, mode=mode, batch=B, seq=S,
                          params=params)
            if compiled:
                run.compile(timing.compile_mode(run_impl))
            timing.time_phases(run, common, phases, ("inference", "minimal", "flb", "step"), a.warmup, a.samples,
                               device, out_lines.emit, compiled, run.value, prepare=run.prepare)
            del run
    out_lines.close()


class GatePhases:
    """gates.model_tensors' view of a Llama: inference (logits), minimal (the last row of a full forward of ids +
    the next token, no cache: the reference for our KV-cache step), flb and step (LlamaRun's)."""

    def __init__(self, model, lr, ids, nxt):
        self.run, self.model, self.ids, self.nxt = LlamaRun(model, lr, ids, nxt), model, ids, nxt
        self.out = self.out_min = self.loss = None

    def inference(self):
        with torch.no_grad():
            self.out = self.model.logits(self.ids)

    def minimal(self):
        with torch.no_grad():
            self.out_min = self.model.logits(torch.cat([self.ids, self.nxt], dim=1))[:, -1:]

    def flb(self):
        self.run.flb()
        self.loss = self.run.loss

    def step(self):
        self.run.step()
        self.loss = self.run.loss


def bench_gate_outputs(a, build, ids, nxt, workload, meta):
    """Strict eager: logits, the minimal phase's logits, loss, every gradient, every parameter after one AdamW
    step; with --f64-reference / --accelerated-reference the same in float64 (f64.*) / with TF32 (acc.*):
    gates.py. On transformers the float64 reference is float64 except where transformers itself computes in
    float32 (its rotary angles, and its loss upcasts the logits to float32): about 1e-7 relative."""
    labels = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], dim=1)  # HF's shift, as mgn feeds it

    def compute(dev, dtype):
        idd, nd = ids.to(dev), nxt.to(dev)

        def make():
            return GatePhases(build(dtype, dev), a.lr, idd, nd), lambda ph: ph.model.named_parameters(), None
        return gates.model_tensors(make, minimal=True)

    inputs = {"input.ids": ids.cpu().numpy().astype(np.int32), "input.labels": labels.cpu().numpy().astype(np.int32)}
    gates.write(a.outputs, inputs, compute, ids.device, a,
                dict(meta, side="torch", impl="eager", mode="strict", workload=workload, batch=a.batch, seq=a.seq,
                     lr=a.lr), "llama_ref.py")


def load_config(name):
    """A CONFIGS key, or the path of a Hugging Face config.json (the fields mgn::llama::Config reads)."""
    if name in CONFIGS:
        return dict(CONFIGS[name])
    with open(name) as f:
        j = json.load(f)
    c = {k: j[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                           "intermediate_size")}
    c["num_key_value_heads"] = j.get("num_key_value_heads") or c["num_attention_heads"]
    c["head_dim"] = j.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    c["rms_norm_eps"] = j.get("rms_norm_eps", 1e-6)
    c["rope_theta"] = j.get("rope_theta", 10000.0)
    c["tie_word_embeddings"] = bool(j.get("tie_word_embeddings", False))
    c["max_position_embeddings"] = j.get("max_position_embeddings", 2048)
    c["initializer_range"] = j.get("initializer_range", 0.02)
    return c


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", nargs="?", help="reference mode: the directory to write")
    ap.add_argument("--config", default=None,
                    help=f"{', '.join(sorted(CONFIGS))} or a config.json (reference mode default: smollm2-135m)")
    ap.add_argument("--seq", type=int, default=128, help="tokens of the prefill / loss input")
    ap.add_argument("--tokens", type=int, default=32, help="greedy tokens generated")
    ap.add_argument("--prompt", type=int, default=0, help="prompt length for generation (default: --seq)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--impl", choices=["auto", "hf", "plain"], default="auto")
    ap.add_argument("--seed", type=int, default=0)
    timing.add_warmup_args(ap)
    ap.add_argument("--no-time", action="store_true")
    b = ap.add_argument_group("bench mode (--bench): the PyTorch side of mgn bench smollm2-135m|llama-tiny|llama")
    b.add_argument("--bench", action="store_true")
    b.add_argument("--weights", help="safetensors written by mgn bench --weights (its metadata holds the config)")
    b.add_argument("--workload", help="default: the weights' metadata")
    b.add_argument("--batch", type=int, default=1)
    b.add_argument("--phases", default="compile,inference,minimal,flb,step")
    b.add_argument("--modes", default="strict,accelerated", help="on the CPU only strict is run")
    b.add_argument("--impls", default="eager,compiled")
    b.add_argument("--lr", type=float, default=1e-3)
    b.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="transformers' attention")
    b.add_argument("--json", help="write the JSON lines here too (they always go to stdout)")
    b.add_argument("--outputs", help="write the gate tensors of the strict eager model here")
    gates.add_args(b)
    a = ap.parse_args()
    gates.check_args(ap, a)
    if a.bench:
        if not a.weights or a.dir:
            raise SystemExit("llama_ref.py --bench: needs --weights FILE and no directory")
        if a.seq < 2 or a.batch < 1:
            raise SystemExit("llama_ref.py --bench: needs --seq >= 2 and --batch >= 1")
        return bench_main(a)
    if not a.dir:
        raise SystemExit("llama_ref.py: name the directory to write (or use --bench)")
    a.config = a.config or "smollm2-135m"
    c = load_config(a.config)
    P = a.prompt or a.seq
    if a.seq < 2 or a.tokens < 1 or P < 1 or P > a.seq or P + a.tokens > c["max_position_embeddings"]:
        raise SystemExit("llama_ref.py: need --seq >= 2, --tokens >= 1, 1 <= --prompt <= --seq and prompt + tokens "
                         f"<= max_position_embeddings ({c['max_position_embeddings']})")
    impl = resolve_impl(a.impl)
    device = torch.device(a.device)
    set_strict()

    os.makedirs(a.dir, exist_ok=True)
    with open(os.path.join(a.dir, "config.json"), "w") as f:
        json.dump(hf_config(c), f, indent=2)
    weights = random_weights(c, a.seed)
    safetensors_lite.write(os.path.join(a.dir, "model.safetensors"), {k: v.numpy() for k, v in weights.items()},
                           {"format": "pt"})
    g = torch.Generator().manual_seed(a.seed + 1)
    ids = torch.randint(0, c["vocab_size"], (1, a.seq), generator=g, dtype=torch.int64)

    model = HfLlama(c, a.dir, weights, device) if impl == "hf" else PlainLlama(c, weights, device)
    ids_d = ids.to(device)
    out = {"ref.ids": ids.numpy().astype(np.int32), "ref.prompt": ids[0, :P].numpy().astype(np.int32)}
    with torch.no_grad():
        out["ref.logits"] = model.logits(ids_d).float().cpu().numpy()
    model.zero_grad()
    loss = model.loss(ids_d)
    loss.backward()
    out["ref.loss"] = np.array(loss.item(), dtype=np.float32)
    for name, p in model.named_parameters():
        out["grad." + name] = p.grad.detach().float().cpu().numpy()
    missing = [n for n, _ in parameter_shapes(c) if "grad." + n not in out]
    if missing:
        raise SystemExit(f"llama_ref.py: no gradient for {missing}")
    model.zero_grad()
    out["ref.greedy"] = np.array(model.greedy(ids_d[:, :P], a.tokens), dtype=np.int32)
    meta = {"impl": impl, "config": a.config, "seed": str(a.seed), "device": str(device), "torch": torch.__version__,
            "transformers": getattr(model, "version", "none"), "prompt": str(P)}
    safetensors_lite.write(os.path.join(a.dir, "inputs.safetensors"), out, meta)
    print(f"llama_ref.py: {a.config} ({impl}, {device}): loss {out['ref.loss']:.6f}, greedy {out['ref.greedy'].tolist()}",
          file=sys.stderr)

    if device.type == "cuda":
        # Peak device memory of PyTorch's training step (F+L+B, then F+L+B + AdamW.step() with the
        # optimizer state allocated), for the planner's comparison (docs/perf-notes.md).
        mem = {}
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        model.zero_grad()
        model.loss(ids_d).backward()
        torch.cuda.synchronize()
        mem["flb_peak_bytes"] = torch.cuda.max_memory_allocated()
        opt = torch.optim.AdamW([p for _, p in model.named_parameters()], lr=1e-4)
        for _ in range(2):  # the first step allocates the moments
            model.zero_grad()
            model.loss(ids_d).backward()
            opt.step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        model.zero_grad()
        model.loss(ids_d).backward()
        opt.step()
        torch.cuda.synchronize()
        mem["train_step_peak_bytes"] = torch.cuda.max_memory_allocated()
        del opt
        with open(os.path.join(a.dir, "torch_memory.json"), "w") as f:
            json.dump(dict(meta, seq=a.seq, **mem), f, indent=1)
        print(f"llama_ref.py: peak memory: F+L+B {mem['flb_peak_bytes'] / 2**20:.1f} MiB, "
              f"AdamW step {mem['train_step_peak_bytes'] / 2**20:.1f} MiB", file=sys.stderr)

    if a.no_time:
        return
    times = dict(meta, seq=a.seq, phases={})

    def prefill():
        with torch.no_grad():
            model.logits(ids_d)

    def flb():
        model.zero_grad()
        model.loss(ids_d).backward()

    times["phases"]["prefill"] = time_calls(prefill, a.warmup, a.samples, device)
    times["phases"]["decode"] = time_calls(model.decode_step(ids_d[:, :P]), a.warmup, a.samples, device)
    times["phases"]["flb"] = time_calls(flb, a.warmup, a.samples, device)
    with open(os.path.join(a.dir, "torch_times.json"), "w") as f:
        json.dump(times, f, indent=1)
    for k, v in times["phases"].items():
        print(f"llama_ref.py: {k}: median {v['median_ms']:.3f} ms (IQR {v['iqr_ms']:.3f})", file=sys.stderr)


if __name__ == "__main__":
    main()
