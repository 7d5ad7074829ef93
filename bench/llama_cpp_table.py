#!/usr/bin/env python3
"""The llama.cpp peer table of issue 27 (docs/benchmarks.md, "llama.cpp Vulkan as a peer"), from one run of the
h200.sh job `llama-cpp`:

    llama_cpp_table.py --out TABLE.md MGN.jsonl LLAMA_BENCH.jsonl [VERSION_FILE]

MGN.jsonl: `mgn bench smollm2-135m --phases inference,minimal` lines (strict and accelerated): phase inference is
the prefill of S tokens, phase minimal one decode token at position S with the cache of the S prompt tokens.
LLAMA_BENCH.jsonl: llama-bench's `-o jsonl` lines of the GGUF exports (f32 and f16 weights, flash attention
off/on, llama-bench's KV cache type: f16, its default; it offers no f32 cache): pp<S> (n_prompt S, n_gen 0) is the prefill, tg<N> (n_gen N
from an empty cache) gives the mean time per token over N tokens, and n_gen 1 with n_depth S the single token at
position S (the prompt is processed before the timer starts). Every cell is the median over the run's samples
(ours: the bench's timed calls; llama.cpp: its repetitions, tg<N> divided by N). A configuration with no line
(a failed or skipped run; see the job's log) is shown as "—".
"""
import argparse
import json
import statistics


def read_lines(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                out.append(json.loads(line))
    return out


def weight_type(rec):
    t = rec.get("model_type", "")
    if t.endswith("F16"):
        return "f16"
    if t.endswith("F32"):
        return "f32"
    name = rec.get("model_filename", "")
    return "f16" if ".f16." in name else "f32" if ".f32." in name else "?"


def fmt(v):
    return "—" if v is None else f"{v:.3f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("mgn")
    ap.add_argument("llama_bench")
    ap.add_argument("version", nargs="?")
    a = ap.parse_args()

    ours = {}  # (phase, mode) -> median ms
    seq, device, workload = None, "", "SmolLM2-135M"
    for r in read_lines(a.mgn):
        if r.get("side") == "mgn" and r.get("phase") in ("inference", "minimal"):
            ours[(r["phase"], r["mode"])] = r["median_ms"]
            seq = r.get("seq", seq)
            device = r.get("backend", device)
            workload = {"smollm2-135m": "SmolLM2-135M"}.get(r.get("workload"), r.get("workload", workload))
    lc = {}  # (kind, weights, fa, kv) -> median ms; kind: prefill, tg_mean, tg_at_s
    info = {}
    for r in read_lines(a.llama_bench):
        w, fa, kv = weight_type(r), int(r.get("flash_attn", 0)), r.get("type_k", "?")
        samples = [s / 1e6 for s in r.get("samples_ns", [])] or [r["avg_ns"] / 1e6]
        n_p, n_g, n_d = r.get("n_prompt", 0), r.get("n_gen", 0), r.get("n_depth", 0)
        if n_p > 0 and n_g == 0 and n_d == 0:
            kind, per = f"prefill{n_p}", 1
        elif n_p == 0 and n_g == 1 and n_d > 0:
            kind, per = f"tg_at{n_d}", 1
        elif n_p == 0 and n_g > 0 and n_d == 0:
            kind, per = "tg_mean", n_g
            info["n_gen"] = n_g
        else:
            continue
        lc[(kind, w, fa, kv)] = statistics.median(samples) / per
        info.setdefault("gpu", r.get("gpu_info", ""))
        info.setdefault("build", f"{r.get('build_commit', '?')} (build {r.get('build_number', '?')})")
        info.setdefault("backends", r.get("backends", ""))

    S = seq or 128
    N = info.get("n_gen", 128)
    cols = [(w, fa) for w in ("f32", "f16") for fa in (0, 1)]
    head = [f"{workload}, batch 1 (ms, median)", "ours strict", "ours accelerated"] + \
        [f"llama.cpp {w} weights, FA {'on' if fa else 'off'}" for w, fa in cols]
    rows = [
        (f"prefill {S} tokens", "inference", f"prefill{S}"),
        (f"one decode token (ours: at position {S}; llama.cpp: mean of tg{N})", "minimal", "tg_mean"),
        (f"one decode token at position {S} (llama.cpp: -n 1 -d {S})", "minimal", f"tg_at{S}"),
    ]
    lines = []
    version = open(a.version).read().strip().replace("\n", "; ") if a.version else ""
    lines.append(f"Ours: {device or '?'}. llama.cpp: {info.get('backends', '?')} on {info.get('gpu', '?')}, "
                 f"commit {info.get('build', '?')}{'; ' + version if version else ''}.")
    for kv in sorted({k[3] for k in lc} | {"f16"}):
        lines.append("")
        note = " (llama-bench's default)" if kv == "f16" else ""
        lines.append(f"KV cache of llama.cpp: {kv}{note}; ours: f32.")
        lines.append("")
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for label, phase, kind in rows:
            cells = [fmt(ours.get((phase, "strict"))), fmt(ours.get((phase, "accelerated")))]
            cells += [fmt(lc.get((kind, w, fa, kv))) for w, fa in cols]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
