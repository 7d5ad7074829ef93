"""ONNX models exported by torch, and Hugging Face Llama directories, imported through the module."""
import json
import os

import numpy as np
import pytest

import meganeura as mg

torch = pytest.importorskip("torch")


def test_onnx_export_matches_torch(opts, workdir):
    pytest.importorskip("onnx")
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.GELU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 7), torch.nn.Softmax(dim=1)).eval()
    x = torch.randn(2, 3, 6, 6)
    path = str(workdir / "m.onnx")
    torch.onnx.export(model, (x,), path, input_names=["x"], output_names=["y"], opset_version=17)
    im = mg.onnx.import_file(path)
    assert im["inputs"] == ["x"] and im["outputs"] == ["y"] and im["opset"] == 17
    s = mg.compile(im["graph"], **opts)
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(s.run({"x": x.numpy()})["y"], want, rtol=1e-4, atol=1e-6)
    assert "Conv" in mg.onnx.supported_ops()


def test_nnef_model_matches_torch(opts, workdir):
    """The hand-written NNEF conv + linear net of tests/ref/nnef_models.py (graph.nnef + .dat files, float16
    weights) against PyTorch's float64 output, written by that script."""
    import subprocess
    import sys
    ref_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "ref")
    subprocess.run([sys.executable, os.path.join(ref_dir, "nnef_models.py"), str(workdir / "nnef")], check=True,
                   capture_output=True)
    sys.path.insert(0, ref_dir)
    import st_io
    ref = st_io.read(str(workdir / "nnef" / "train" / "ref.safetensors"))
    im = mg.nnef.import_path(str(workdir / "nnef" / "train"))
    assert im["inputs"] == ["x"] and im["outputs"] == ["y"] and im["version"] == "1.0"
    s = mg.compile(im["graph"], **opts)
    got = s.run({"x": ref["in.x"].astype(np.float32)})["y"]
    np.testing.assert_allclose(got, ref["out.y"], rtol=1e-4, atol=1e-5)
    assert "conv" in mg.nnef.supported_ops()


def test_llama_directory_matches_torch(opts, workdir):
    """A tiny Llama written as a Hugging Face directory (config.json + model.safetensors) from random torch
    weights; the prefill logits against a plain-torch forward of the same weights (RMSNorm, rotate-half RoPE,
    grouped-query causal attention, SwiGLU, tied embeddings)."""
    cfg = {"vocab_size": 50, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "tie_word_embeddings": True, "max_position_embeddings": 64, "hidden_act": "silu"}
    d = workdir / "llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    c = mg.llama.Config.from_file(str(d / "config.json"))
    rng = np.random.default_rng(4)
    H, V, F, nh, kvh = 32, 50, 48, 4, 2
    hd = H // nh
    w = {"model.embed_tokens.weight": rng.standard_normal((V, H)) * 0.5,
         "model.norm.weight": 1 + 0.1 * rng.standard_normal(H),
         "model.layers.0.input_layernorm.weight": 1 + 0.1 * rng.standard_normal(H),
         "model.layers.0.post_attention_layernorm.weight": 1 + 0.1 * rng.standard_normal(H),
         "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((nh * hd, H)) * 0.2,
         "model.layers.0.self_attn.k_proj.weight": rng.standard_normal((kvh * hd, H)) * 0.2,
         "model.layers.0.self_attn.v_proj.weight": rng.standard_normal((kvh * hd, H)) * 0.2,
         "model.layers.0.self_attn.o_proj.weight": rng.standard_normal((H, nh * hd)) * 0.2,
         "model.layers.0.mlp.gate_proj.weight": rng.standard_normal((F, H)) * 0.2,
         "model.layers.0.mlp.up_proj.weight": rng.standard_normal((F, H)) * 0.2,
         "model.layers.0.mlp.down_proj.weight": rng.standard_normal((H, F)) * 0.2}
    w = {k: v.astype(np.float32) for k, v in w.items()}
    mg.save_safetensors(str(d / "model.safetensors"), w)

    S = 6
    ids = rng.integers(0, V, (1, S)).astype(np.int32)
    s = mg.compile(mg.llama.prefill_graph(c, batch=1, seq=S), **opts)
    mg.llama.load_weights(s, c, str(d))
    got = s.run({"ids": ids})["logits"]

    t = {k: torch.from_numpy(v).double() for k, v in w.items()}
    L = "model.layers.0."

    def rms(x, wt):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5) * wt

    def rope(x):  # [B, h, S, hd], rotate-half layout
        inv = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        ang = torch.arange(S, dtype=torch.float64)[:, None] * inv[None]
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
        rot = torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1)
        return x * cos + rot * sin

    x = t["model.embed_tokens.weight"][torch.from_numpy(ids).long()]
    h = rms(x, t[L + "input_layernorm.weight"])
    q = (h @ t[L + "self_attn.q_proj.weight"].T).view(1, S, nh, hd).transpose(1, 2)
    k = (h @ t[L + "self_attn.k_proj.weight"].T).view(1, S, kvh, hd).transpose(1, 2)
    v = (h @ t[L + "self_attn.v_proj.weight"].T).view(1, S, kvh, hd).transpose(1, 2)
    q, k = rope(q), rope(k)
    k, v = k.repeat_interleave(nh // kvh, 1), v.repeat_interleave(nh // kvh, 1)
    scores = (q @ k.transpose(-1, -2)) / hd ** 0.5
    scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    a = scores.softmax(-1) @ v
    x = x + a.transpose(1, 2).reshape(1, S, H) @ t[L + "self_attn.o_proj.weight"].T
    h = rms(x, t[L + "post_attention_layernorm.weight"])
    m = torch.nn.functional.silu(h @ t[L + "mlp.gate_proj.weight"].T) * (h @ t[L + "mlp.up_proj.weight"].T)
    x = x + m @ t[L + "mlp.down_proj.weight"].T
    want = (rms(x, t["model.norm.weight"]) @ t["model.embed_tokens.weight"].T).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4)
