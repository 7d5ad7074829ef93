"""Checks `mgn export --gguf` (src/io/gguf, src/models/llama_gguf.cpp) against independent references.

    gguf_check.py MGN WORKDIR                  part (a): the file itself
    gguf_check.py MGN WORKDIR --llama-cpp DIR  part (b): llama.cpp's logits

Two tiny Llama models, written here with plain NumPy/torch (bench/pytorch/llama_ref.py's random weights):
  A  a weights file as `mgn bench` writes one (safetensors whose metadata "config" holds the config): tied
     embeddings, 4 heads / 2 KV heads of 16, vocab 512, no tokenizer (the placeholder vocabulary)
  B  a Hugging Face directory: untied lm_head, 4 heads / 2 KV heads of 8, rope_theta 5000, the "smollm"
     tokenizer of tests/ref/bpe_reference.py (digits split one by one) with a tokenizer_config.json naming
     bos/eos, and a vocab_size 7 above the tokenizer's ids (padding)
(a) exports A as f32 and f16 and B as f32, and re-reads every file with tests/ref/gguf_reader.py (written
    from the GGUF spec, nothing shared with the C++): the exact set of metadata keys, their types and values
    (from the config and tokenizer.json as read here), the exact set of tensor names, their ggml dims, types
    and every value against the safetensors weights, with the q/k rows permuted here in NumPy the way
    llama.cpp's convert_hf_to_gguf.py does (reshape [heads, 2, D/2, in], swap axes 1 and 2).
(b) runs llama.cpp itself (DIR from scripts/fetch-llama-cpp.sh: its llama-cpp-logits on ggml's CPU backend,
    f32 KV cache) on A and B and compares the logits of 12 positions with the plain-torch Llama of
    bench/pytorch/llama_ref.py (the reference LlamaCheckTiny gates our executors against): relative L2
    <= 1e-4 for f32 weights, <= 5e-3 for f16 weights (llama.cpp then also rounds activations to f16). A
    wrong permutation or tensor name shows as an O(1) error. Without DIR it exits 77 (skipped), or 1 when
    MGN_REQUIRE_REFERENCES is set.
"""
import json
import os
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "pytorch"))
import bpe_reference  # noqa: E402
import gguf_reader as gr  # noqa: E402
import llama_ref  # noqa: E402
import safetensors_lite  # noqa: E402

CONFIG_A = dict(llama_ref.CONFIGS["tiny"])
CONFIG_B = dict(vocab_size=0, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                head_dim=8, intermediate_size=48, rms_norm_eps=1e-6, rope_theta=5000.0, tie_word_embeddings=False,
                max_position_embeddings=64, initializer_range=0.125)

GGUF_NAMES = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
              "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
              "self_attn.o_proj.weight": "attn_output.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
              "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
              "mlp.down_proj.weight": "ffn_down.weight"}


def gguf_name(hf):
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")  # model.layers.N.<rest>
    return f"blk.{parts[2]}." + GGUF_NAMES[".".join(parts[3:])]


def permute(w, heads):
    return w.reshape(heads, 2, w.shape[0] // heads // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout}{r.stderr}"
    return r


def make_models(work):
    weights_a = {k: v.numpy() for k, v in llama_ref.random_weights(CONFIG_A, 7).items()}
    path_a = os.path.join(work, "a.safetensors")
    safetensors_lite.write(path_a, weights_a, {"format": "pt", "workload": "llama-tiny",
                                               "config": json.dumps(CONFIG_A)})
    tok_dir = os.path.join(work, "tok")
    os.makedirs(tok_dir, exist_ok=True)
    run([sys.executable, os.path.join(HERE, "bpe_reference.py"), tok_dir])
    tj = json.load(open(os.path.join(tok_dir, "smollm", "tokenizer.json"), encoding="utf-8"))
    ids = list(tj["model"]["vocab"].values()) + [t["id"] for t in tj["added_tokens"]]
    cb = dict(CONFIG_B, vocab_size=max(ids) + 1 + 7)
    dir_b = os.path.join(work, "b")
    os.makedirs(dir_b, exist_ok=True)
    weights_b = {k: v.numpy() for k, v in llama_ref.random_weights(cb, 11).items()}
    safetensors_lite.write(os.path.join(dir_b, "model.safetensors"), weights_b, {"format": "pt"})
    json.dump(llama_ref.hf_config(cb), open(os.path.join(dir_b, "config.json"), "w"))
    json.dump(tj, open(os.path.join(dir_b, "tokenizer.json"), "w", encoding="utf-8"), ensure_ascii=False)
    json.dump({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
              open(os.path.join(dir_b, "tokenizer_config.json"), "w"))
    return (path_a, CONFIG_A, weights_a, None), (dir_b, cb, weights_b, tj)


def expected_vocab(c, tj):
    V = c["vocab_size"]
    tokens = [f"[PAD{i}]" for i in range(V)]
    types = [5] * V
    if tj is None:
        b2u = bpe_reference.bytes_to_unicode()
        for b in range(256):
            tokens[b], types[b] = b2u[b], 1
        tokens[256], types[256] = "<|endoftext|>", 3
        return tokens, types, [], "gpt-2", 256, 256
    for tok, i in tj["model"]["vocab"].items():
        tokens[i], types[i] = tok, 1
    for t in tj["added_tokens"]:
        tokens[t["id"]], types[t["id"]] = t["content"], 3 if t["special"] else 1
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    steps = tj["pre_tokenizer"].get("pretokenizers", [tj["pre_tokenizer"]])
    digits = [s for s in steps if s["type"] == "Digits"]
    pre = "smollm" if digits and digits[0]["individual_digits"] else "gpt-2"
    by_content = {t["content"]: t["id"] for t in tj["added_tokens"]}
    return tokens, types, merges, pre, by_content["<|im_start|>"], by_content["<|im_end|>"]


def check_file(path, c, weights, tj, f16):
    g = gr.read(path)
    assert g.alignment == 32 and "general.alignment" not in g.metadata, g.alignment
    U32, F32, STR, BOOL, ARR, I32 = gr.U32, gr.F32, gr.STRING, gr.BOOL, gr.ARRAY, gr.I32
    tokens, types, merges, pre, bos, eos = expected_vocab(c, tj)
    want = {
        "general.architecture": (STR, "llama"),
        "general.file_type": (U32, 1 if f16 else 0),
        "llama.vocab_size": (U32, c["vocab_size"]),
        "llama.context_length": (U32, c["max_position_embeddings"]),
        "llama.embedding_length": (U32, c["hidden_size"]),
        "llama.block_count": (U32, c["num_hidden_layers"]),
        "llama.feed_forward_length": (U32, c["intermediate_size"]),
        "llama.attention.head_count": (U32, c["num_attention_heads"]),
        "llama.attention.head_count_kv": (U32, c["num_key_value_heads"]),
        "llama.attention.key_length": (U32, c["head_dim"]),
        "llama.attention.value_length": (U32, c["head_dim"]),
        "llama.rope.freq_base": (F32, np.float32(c["rope_theta"])),
        "llama.rope.dimension_count": (U32, c["head_dim"]),
        "llama.attention.layer_norm_rms_epsilon": (F32, np.float32(c["rms_norm_eps"])),
        "tokenizer.ggml.model": (STR, "gpt2"),
        "tokenizer.ggml.pre": (STR, pre),
        "tokenizer.ggml.tokens": ((ARR, STR), tokens),
        "tokenizer.ggml.token_type": ((ARR, I32), types),
        "tokenizer.ggml.merges": ((ARR, STR), merges),
        "tokenizer.ggml.add_bos_token": (BOOL, False),
        "tokenizer.ggml.bos_token_id": (U32, bos),
        "tokenizer.ggml.eos_token_id": (U32, eos),
    }
    got_keys = set(g.metadata) - {"general.name"}
    assert got_keys == set(want), (sorted(got_keys ^ set(want)), path)
    assert g.types["general.name"] == (STR, None) and g.metadata["general.name"], g.metadata["general.name"]
    for k, (t, v) in want.items():
        gt = g.types[k] if isinstance(t, tuple) else g.types[k][0]
        assert gt == t, (k, gt, t)
        gv = g.metadata[k]
        if t == F32:
            assert np.float32(gv) == v, (k, gv, v)
        else:
            assert gv == v, (k, gv if not isinstance(gv, list) else gv[:8], v if not isinstance(v, list) else v[:8])
    # Tensors: exactly the model's, each with ggml dims, type and values.
    want_names = {gguf_name(n) for n in weights}
    assert set(g.tensors) == want_names, sorted(set(g.tensors) ^ want_names)
    assert ("output.weight" in g.tensors) == (not c["tie_word_embeddings"])
    for hf, w in weights.items():
        t = g.tensors[gguf_name(hf)]
        assert t.dims == list(reversed(w.shape)), (hf, t.dims, w.shape)
        want_type = 1 if (f16 and w.ndim == 2) else 0
        assert t.type == want_type, (hf, t.type, want_type)
        if hf.endswith("q_proj.weight"):
            w = permute(w, c["num_attention_heads"])
        elif hf.endswith("k_proj.weight"):
            w = permute(w, c["num_key_value_heads"])
        ref = w.astype(np.float16) if want_type == 1 else w
        assert np.array_equal(t.array, ref), (hf, float(np.abs(t.array.astype(np.float64) - ref).max()))
    print(f"gguf: {os.path.basename(path)}: {len(g.metadata)} keys, {len(g.tensors)} tensors "
          f"({'f16' if f16 else 'f32'}) read back exactly")


def reference_logits(c, weights, ids):
    m = llama_ref.PlainLlama(c, {k: torch.from_numpy(v) for k, v in weights.items()}, "cpu")
    with torch.no_grad():
        return m.logits(torch.tensor([ids], dtype=torch.int64))[0].numpy()


def llama_cpp_logits(tool, gguf, ids, work):
    ids_path, out_path = os.path.join(work, "ids.bin"), os.path.join(work, "logits.bin")
    np.asarray(ids, dtype="<i4").tofile(ids_path)
    run([tool, gguf, ids_path, out_path, "--device", "cpu"])
    return np.fromfile(out_path, dtype="<f4").reshape(len(ids), -1)


def main():
    mgn, work = sys.argv[1], sys.argv[2]
    llama_cpp = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--llama-cpp" else None
    if llama_cpp is not None and not os.path.exists(os.path.join(llama_cpp, "llama-cpp-logits")):
        print(f"llama.cpp is not fetched into {llama_cpp} (scripts/fetch-llama-cpp.sh; setup-debian.sh --tests)")
        sys.exit(1 if os.environ.get("MGN_REQUIRE_REFERENCES") else 77)
    os.makedirs(work, exist_ok=True)
    torch.manual_seed(0)
    models = make_models(work)
    rng = np.random.default_rng(3)
    for name, (src, c, weights, tj) in zip("ab", models):
        for f16 in ((False, True) if name == "a" or llama_cpp else (False,)):
            out = os.path.join(work, f"{name}.{'f16' if f16 else 'f32'}.gguf")
            run([mgn, "export", src, "--gguf", out, "--gguf-type", "f16" if f16 else "f32"])
            check_file(out, c, weights, tj, f16)
            if llama_cpp:
                ids = [int(i) for i in rng.integers(0, c["vocab_size"], 12)]
                ref = reference_logits(c, weights, ids)
                got = llama_cpp_logits(os.path.join(llama_cpp, "llama-cpp-logits"), out, ids, work)
                assert got.shape == ref.shape, (got.shape, ref.shape)
                err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
                tol = 5e-3 if f16 else 1e-4
                print(f"llama.cpp CPU logits of {os.path.basename(out)} vs plain torch: rel L2 {err:.2e} (<= {tol})")
                assert err <= tol, (out, err)
    # Bad input: a weights file without the config metadata, and a tokenizer with more ids than the model.
    bare = os.path.join(work, "bare.safetensors")
    safetensors_lite.write(bare, models[0][2], {"format": "pt"})
    r = subprocess.run([mgn, "export", bare, "--gguf", os.path.join(work, "x.gguf")], capture_output=True, text=True)
    assert r.returncode == 1 and "config" in r.stderr and "bare.safetensors" in r.stderr, r.stderr
    r = subprocess.run([mgn, "export", models[0][0], "--gguf", os.path.join(work, "x.gguf"), "--tokenizer",
                        os.path.join(models[1][0], "tokenizer.json")], capture_output=True, text=True)
    assert models[1][1]["vocab_size"] - 7 > CONFIG_A["vocab_size"]  # the tokenizer has more ids than A's vocab
    assert r.returncode == 1 and "tokenizer has" in r.stderr and "vocab_size" in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(work, "x.gguf"))
    print("gguf_check: ok")


if __name__ == "__main__":
    main()
