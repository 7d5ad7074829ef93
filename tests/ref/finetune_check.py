"""End-to-end check of `mgn finetune` and `mgn generate` on a tiny Llama config with a byte-level BPE
tokenizer trained by tests/ref/bpe_reference.py: fine-tuning on a repeated passage must cut the
next-token loss well below its starting value (a random model starts near ln(vocab)); the output
directory must hold config.json, tokenizer.json and a model.safetensors with exactly the HF tensor names
and shapes of the config; `mgn generate` must load that directory and continue a prompt; bad input (a
missing --text file) must be a clear error.

usage: finetune_check.py MGN WORKDIR
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "pytorch"))
import safetensors_lite  # noqa: E402


def tiny_model(work):
    """A tiny Llama model folder under WORK/model (config.json, tokenizer.json of a byte-level BPE trained by
    bpe_reference.py); returns (folder, vocab size, config dict)."""
    tok_dir = os.path.join(work, "tok")
    os.makedirs(tok_dir)
    subprocess.run([sys.executable, os.path.join(HERE, "bpe_reference.py"), tok_dir], check=True,
                   stdout=subprocess.DEVNULL)
    tokjson = os.path.join(tok_dir, "gpt2", "tokenizer.json")
    t = json.load(open(tokjson))
    vocab = 1 + max(list(t["model"]["vocab"].values()) + [a["id"] for a in t.get("added_tokens", [])])
    model = os.path.join(work, "model")
    os.makedirs(model)
    shutil.copy(tokjson, os.path.join(model, "tokenizer.json"))
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab, "hidden_size": 32,
           "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
           "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "tie_word_embeddings": True, "hidden_act": "silu", "initializer_range": 0.02}
    json.dump(cfg, open(os.path.join(model, "config.json"), "w"))
    return model, vocab, cfg


def main():
    mgn, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    model, vocab, _ = tiny_model(work)
    out = os.path.join(work, "out")
    # A short passage repeated: the windows recur, so a working training loop memorizes it quickly.
    corpus = os.path.join(work, "text.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
                "must be in want of a wife. " * 40)
    r = subprocess.run([mgn, "finetune", model, "--text", corpus, "--out", out, "--steps", "40", "--batch", "2",
                        "--seq", "32", "--lr", "1e-2", "--weights", "random"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"loss: first step ([0-9.]+), last step ([0-9.]+)", r.stdout)
    assert m, r.stdout
    first, last = float(m.group(1)), float(m.group(2))
    print(f"finetune: loss {first:.4f} -> {last:.4f} (ln vocab {math.log(vocab):.4f})")
    assert abs(first - math.log(vocab)) < 1.0, "a random model should start near ln(vocab)"
    assert last < 0.6 * first, (first, last)
    # The metrics file (default OUT/metrics.jsonl): a run record, one step record per step with the loss the
    # command printed for the first and last steps, the lr it was given, and a positive throughput.
    recs = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    steps = [r for r in recs if r["kind"] == "step"]
    assert recs[0]["kind"] == "run" and recs[0]["command"] == "finetune", recs[0]
    assert [r["step"] for r in steps] == list(range(1, 41)), [r["step"] for r in steps]
    assert abs(steps[0]["loss"] - first) < 1e-4 and abs(steps[-1]["loss"] - last) < 1e-4, (steps[0], steps[-1])
    assert all(r["lr"] == 1e-2 and r["tokens_per_s"] > 0 for r in steps), steps[0]

    tensors, meta = safetensors_lite.read(os.path.join(out, "model.safetensors"))
    want = {"model.embed_tokens.weight": (vocab, 32), "model.norm.weight": (32,),
            "model.layers.0.input_layernorm.weight": (32,), "model.layers.0.post_attention_layernorm.weight": (32,),
            "model.layers.0.self_attn.q_proj.weight": (32, 32), "model.layers.0.self_attn.k_proj.weight": (16, 32),
            "model.layers.0.self_attn.v_proj.weight": (16, 32), "model.layers.0.self_attn.o_proj.weight": (32, 32),
            "model.layers.0.mlp.gate_proj.weight": (64, 32), "model.layers.0.mlp.up_proj.weight": (64, 32),
            "model.layers.0.mlp.down_proj.weight": (32, 64)}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    assert got == want, got
    for f in ("config.json", "tokenizer.json"):
        assert os.path.exists(os.path.join(out, f)), f

    g = subprocess.run([mgn, "generate", out, "--prompt", "It is a truth", "--max-tokens", "8"], capture_output=True,
                       text=True)
    assert g.returncode == 0, g.stdout + g.stderr
    assert g.stdout.startswith("It is a truth") and len(g.stdout.strip()) > len("It is a truth"), g.stdout
    print("generate:", g.stdout.strip().replace("\n", " ")[:80])

    bad = subprocess.run([mgn, "finetune", model, "--text", os.path.join(work, "missing.txt"), "--out", out],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "missing.txt" in bad.stderr, bad.stderr
    print("ok")


if __name__ == "__main__":
    main()
