"""The `mgn` command line (ctest MgnCli): every command of the table has help from it (`mgn CMD --help`,
`mgn help CMD`, `mgn --help` lists them all); unknown flags and bad values are usage errors (exit 2, one line on
stderr naming the command once) reported before any work: fast, nothing on stdout, no kernel written to the
cache, where a positive control shows that a compile does write there; boolean flags take no value; runtime
errors exit 1; `mgn help environment --markdown` is docs/environment.md's block; unknown MGN_* names warn.

Usage: cli_test.py MGN SOURCE_DIR WORK_DIR
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time

# The command table of tools/mgn.cpp, in its order. A command added there is added here (and gets the checks).
COMMANDS = ["train-fashion-mnist", "dump-checkpoint", "kernels", "plan", "inspect", "run", "export", "onnx-conformance",
            "generate",
            "finetune",
            "whisper-encode", "dinov3-embed", "dinovision", "smolvla", "unet", "llama-check", "bench", "bench-gemm", "cache", "devices", "help"]
# A usage error is reported before any work: well under this (it takes milliseconds; the bound leaves room for
# a loaded machine), and nothing is compiled (checked through the kernel cache).
FAST_S = 2.0

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def main():
    mgn, src, work = sys.argv[1], sys.argv[2], sys.argv[3]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    cache = os.path.join(work, "cache")
    # A clean environment: no MGN_* from the caller but the validation layer, and a cache folder of our own.
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("MGN_") or k == "MGN_VALIDATION"}
    base_env["MGN_CACHE_DIR"] = cache

    def mgn_run(args, env_extra=None):
        env = dict(base_env)
        env.update(env_extra or {})
        t0 = time.monotonic()
        r = subprocess.run([mgn] + args, capture_output=True, text=True, env=env, timeout=300)
        return r, time.monotonic() - t0

    def cache_files():
        n = 0
        for _, _, files in os.walk(cache):
            n += len(files)
        return n

    # Files and folders the commands' validators accept (they check existence only).
    some_file = os.path.join(work, "some.txt")
    with open(some_file, "w") as f:
        f.write("not a model\n")
    some_dir = os.path.join(work, "dir")
    os.makedirs(some_dir)
    out_dir = os.path.join(work, "out")
    missing = os.path.join(work, "missing")
    valid = {
        "train-fashion-mnist": [], "dump-checkpoint": [some_file], "kernels": [], "plan": [],
        "inspect": [some_file], "run": [some_file], "export": [some_file, "--nnef", out_dir], "onnx-conformance": [some_dir], "generate": [some_dir, "--prompt", "x"],
        "finetune": [some_dir, "--text", some_file, "--out", out_dir], "llama-check": [some_dir],
        "whisper-encode": [some_file, "--model", some_dir],
        "dinov3-embed": [some_file, "--model", some_dir], "dinovision": ["train", "--images", some_dir],
        "smolvla": ["act", "--data", some_file, "--weights", some_file, "--out", os.path.join(work, "a.st")],
        "unet": ["sample", "--run", some_dir],
        "bench": ["fashion-cnn"], "bench-gemm": [], "cache": ["info"], "devices": [], "help": [],
    }
    check(sorted(valid) == sorted(COMMANDS), "every command has valid arguments in this test")

    # ---- help from the table
    r, _ = mgn_run(["--help"])
    check(r.returncode == 0, "mgn --help exits 0")
    listed = []
    if "Subcommands:" in r.stdout:
        for line in r.stdout.split("Subcommands:", 1)[1].splitlines():
            m = re.match(r"^  (\S+)\s+\S", line)
            if m:
                listed.append(m.group(1))
    check(listed == COMMANDS, f"mgn --help lists every command in table order: {listed}")
    top_help = r.stdout
    r, _ = mgn_run(["help"])
    check(r.returncode == 0 and r.stdout == top_help, "mgn help prints what mgn --help prints")
    r, _ = mgn_run([])
    check(r.returncode == 2 and "Usage: mgn" in r.stderr, "mgn without a command: usage on stderr, exit 2")
    r, _ = mgn_run(["--version"])
    check(r.returncode == 0 and r.stdout.startswith("mgn "), f"mgn --version: {r.stdout!r}")

    for cmd in COMMANDS:
        r, _ = mgn_run([cmd, "--help"])
        check(r.returncode == 0, f"mgn {cmd} --help exits 0 ({r.stderr.strip()})")
        check(f"Usage: mgn {cmd} " in r.stdout or r.stdout.rstrip().endswith(f"Usage: mgn {cmd}"),
              f"mgn {cmd} --help shows its own usage")
        check(r.stderr == "", f"mgn {cmd} --help writes nothing on stderr: {r.stderr!r}")
        summary = re.search(rf"^  {re.escape(cmd)}\s+(.+)$", top_help, re.M)
        check(summary is not None and r.stdout.startswith(summary.group(1)),
              f"mgn {cmd} --help starts with the table's summary")
        h, _ = mgn_run(["help", cmd])
        check(h.returncode == 0 and h.stdout == r.stdout, f"mgn help {cmd} prints what mgn {cmd} --help prints")
        h, _ = mgn_run([cmd, "-h"] + valid[cmd])
        check(h.returncode == 0 and h.stdout == r.stdout, f"mgn {cmd} -h ... prints the help and does nothing else")

    # --tune (measured GEMM kernel choice, docs/tuning.md) on the commands that take the common compile flags
    for cmd in ["train-fashion-mnist", "bench", "generate", "finetune", "llama-check", "run", "whisper-encode",
                "dinov3-embed", "dinovision", "smolvla", "unet"]:
        r, _ = mgn_run([cmd, "--help"])
        check(re.search(r"^\s+--tune\s", r.stdout, re.M) is not None, f"mgn {cmd} --help shows --tune")
    for cmd in ["bench-gemm", "plan", "onnx-conformance"]:
        r, _ = mgn_run([cmd, "--help"])
        check("--tune" not in r.stdout, f"mgn {cmd} has no --tune")

    # ---- unknown flags: exit 2, one line naming the command once and the flag
    def one_usage_error(cmd, args, want, env_extra=None, label=None):
        label = label or " ".join([cmd] + args)
        before = cache_files()
        r, dt = mgn_run([cmd] + args, env_extra)
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 2, f"mgn {label}: exit 2, got {r.returncode} ({r.stderr.strip()})")
        check(len(lines) == 1, f"mgn {label}: one line on stderr, got {lines}")
        check(len(re.findall(rf"(?<![\w-]){re.escape(cmd)}(?![\w-])", r.stderr)) == 1,
              f"mgn {label}: the command is named once: {r.stderr.strip()!r}")
        check(want in r.stderr, f"mgn {label}: the message names {want!r}: {r.stderr.strip()!r}")
        check(r.stdout == "", f"mgn {label}: nothing on stdout (no work): {r.stdout[:200]!r}")
        check(dt < FAST_S, f"mgn {label}: reported in {dt:.2f} s, before any work")
        check(cache_files() == before, f"mgn {label}: nothing compiled (the kernel cache is unchanged)")

    for cmd in COMMANDS:
        one_usage_error(cmd, valid[cmd] + ["--no-such-flag"], "--no-such-flag")
    one_usage_error("train-fashion-mnist", ["--no-such-flag=3"], "--no-such-flag")
    r, _ = mgn_run(["no-such-command"])
    check(r.returncode == 2 and r.stderr.count("no-such-command") == 1 and len(r.stderr.strip().splitlines()) == 1,
          f"an unknown command: exit 2, one line: {r.stderr!r}")

    # ---- bad values and combinations: exit 2 before anything is loaded or compiled
    for cmd, args, want in [
        ("train-fashion-mnist", ["--epochs", "0"], "--epochs"),
        ("train-fashion-mnist", ["--epochs", "x"], "--epochs"),
        ("train-fashion-mnist", ["--batch", "-1"], "--batch"),
        ("train-fashion-mnist", ["--lr", "0"], "--lr"),
        ("train-fashion-mnist", ["--data", missing], "--data"),
        ("train-fashion-mnist", ["--backend", "gpu"], "--backend"),
        ("train-fashion-mnist", ["--precision", "fast"], "--precision"),
        ("train-fashion-mnist", ["--model", "rnn"], "--model"),
        ("train-fashion-mnist", ["--replicas", "0"], "--replicas"),
        ("train-fashion-mnist", ["--data-parallel", "nccl"], "--data-parallel"),
        ("train-fashion-mnist", ["--replicas", "2", "--batch", "63"], "--batch 63 does not split into 2"),
        ("train-fashion-mnist", ["--replicas", "2", "--devices", "0"], "--devices names 1 device(s) but --replicas is 2"),
        ("train-fashion-mnist", ["--devices", "0,1"], "--devices names 2 device(s) but --replicas is 1"),
        ("kernels", ["--batch", "0"], "--batch"),
        ("kernels", ["--mode", "eval"], "--mode"),
        ("plan", ["--mode", "infer"], "--mode infer"),
        ("plan", ["--model", "llama:" + missing], "--model"),
        ("plan", ["--seq", "1"], "--seq"),
        ("inspect", [missing], "missing"),
        ("inspect", [], "--supported-ops"),
        ("run", [some_file, "--input", "x=" + missing + ".npy"], "--input"),
        ("run", [some_file, "--input", "x=1x0x3"], "--input"),
        ("run", [some_file, "--shape", "x"], "--shape"),
        ("export", [some_file], "--gguf"),
        ("export", [some_file, "--nnef", out_dir, "--gguf", out_dir + ".gguf"], "--gguf"),
        ("export", [some_file, "--gguf", out_dir + ".gguf", "--gguf-type", "bf16"], "--gguf-type"),
        ("export", [some_file, "--nnef", out_dir, "--gguf-type", "f16"], "--gguf-type"),
        ("export", [some_file, "--gguf", out_dir + ".gguf", "--shape", "x=1"], "--shape"),
        ("generate", [some_dir, "--prompt", "x", "--max-tokens", "0"], "--max-tokens"),
        ("generate", [some_dir, "--prompt", "x", "--temperature", "-1"], "--temperature"),
        ("generate", [some_dir], "--prompt"),
        ("generate", [missing, "--prompt", "x"], "missing"),
        ("finetune", [some_dir, "--text", missing, "--out", out_dir], "missing"),
        ("finetune", [some_dir, "--text", some_file, "--out", out_dir, "--seq", "1"], "--seq"),
        ("finetune", [some_dir, "--text", some_file, "--out", some_dir], "--out"),
        ("finetune", [some_dir, "--text", some_file, "--out", out_dir, "--replicas", "0"], "--replicas"),
        ("finetune", [some_dir, "--text", some_file, "--out", out_dir, "--data-parallel", "nccl"], "--data-parallel"),
        ("finetune", [some_dir, "--text", some_file, "--out", out_dir, "--replicas", "2", "--batch", "3"],
         "--batch 3 does not split into 2"),
        ("finetune", [some_dir, "--text", some_file, "--out", out_dir, "--replicas", "2", "--devices", "0"],
         "--devices names 1 device(s) but --replicas is 2"),
        ("whisper-encode", [missing, "--model", some_dir], "missing"),
        ("whisper-encode", [some_file], "--model"),
        ("whisper-encode", [some_file, "--model", some_dir, "--long", "cut"], "--long"),
        ("whisper-encode", [some_file, "--model", some_dir, "--batch", "0"], "--batch"),
        ("dinov3-embed", [missing, "--model", some_dir], "missing"),
        ("dinov3-embed", [some_file], "--model"),
        ("dinov3-embed", [some_file, "--model", some_dir, "--crop", "-1"], "--crop"),
        ("dinovision", ["fit", "--images", some_dir], "fit"),
        ("unet", ["fit"], "fit"),
        ("unet", ["train", "--steps", "0"], "--steps"),
        ("unet", ["train", "--channels", "3"], "--channels"),
        ("unet", ["train", "--config", "large"], "--config"),
        ("unet", ["train", "--data", missing], "--data"),
        ("unet", ["train", "--out", "x.png"], "--out"),
        ("unet", ["sample", "--sample-steps", "0"], "--sample-steps"),
        ("dinovision", ["train"], "--images"),
        ("dinovision", ["train", "--images", missing], "missing"),
        ("dinovision", ["train", "--images", some_dir, "--steps", "0"], "--steps"),
        ("dinovision", ["train", "--images", some_dir, "--image-size", "100"], "--image-size"),
        ("dinovision", ["train", "--images", some_dir, "--widths", "8,8"], "--widths"),
        ("dinovision", ["reconstruct", some_file], "--out"),
        ("dinovision", ["reconstruct", "--out", os.path.join(work, "g.png")], "IMAGE"),
        ("smolvla", ["fly", "--data", some_file, "--out", out_dir], "fly"),
        ("smolvla", ["train", "--data", some_file, "--out", out_dir], "--steps"),
        ("smolvla", ["act", "--data", some_file, "--out", out_dir], "--weights"),
        ("smolvla", ["act", "--data", missing, "--weights", some_file, "--out", out_dir], "missing"),
        ("smolvla", ["train", "--data", some_file, "--out", out_dir, "--steps", "3", "--config", "huge"], "--config"),
        ("smolvla", ["train", "--data", some_file, "--out", out_dir, "--steps", "3", "--attention", "x"], "--attention"),
        ("llama-check", [missing], "missing"),
        ("llama-check", [some_dir, "--tol-grad", "0"], "--tol-grad"),
        ("bench", ["fashion-cnn", "--samples", "0"], "--samples"),
        ("bench", ["fashion-cnn", "--warmup-ms", "-5"], "--warmup-ms"),
        ("bench", ["fashion-cnn", "--cache", "warm"], "--cache"),
        ("bench", ["fashion-cnn", "--mode", "fast"], "--mode"),
        ("bench", ["fashion-cnn", "--phases", "compile,nope"], "nope"),
        ("bench", ["fashion-cnn", "--data", missing], "--data"),
        ("bench", ["attention", "--weights", some_file], "--weights"),
        ("bench", ["conv", "--cases", "nope"], "nope"),
        ("bench", ["llama"], "--config"),
        ("bench", ["gpt2"], "gpt2"),
        ("bench", [], "WORKLOAD"),
        ("bench-gemm", ["2x3"], "2x3"),
        ("bench-gemm", ["0x4x4"], "0x4x4"),
        ("bench-gemm", ["--tile", "12x"], "--tile"),
        ("bench-gemm", ["--variant", "classic"], "--variant"),
        ("help", ["nope"], "nope"),
        ("help", ["--markdown"], "--markdown"),
    ]:
        one_usage_error(cmd, args, want)
    # A folder the environment names is checked up front too.
    one_usage_error("train-fashion-mnist", [], missing, {"MGN_FASHION_MNIST_DIR": missing},
                    "train-fashion-mnist with MGN_FASHION_MNIST_DIR missing")
    one_usage_error("bench", ["fashion-cnn"], missing, {"MGN_FASHION_MNIST_DIR": missing},
                    "bench fashion-cnn with MGN_FASHION_MNIST_DIR missing")
    # Boolean flags take no value: the error is about --epochs, not about --full or --no-progress.
    one_usage_error("train-fashion-mnist", ["--full", "--no-progress", "--epochs", "0"], "--epochs")
    # A malformed MGN_* value is a usage error of the command, naming the variable.
    one_usage_error("plan", [], "MGN_FUSION", {"MGN_FUSION": "maybe"}, "plan with MGN_FUSION=maybe")

    # ---- runtime errors: exit 1, one line naming the command once
    r, _ = mgn_run(["dump-checkpoint", some_file])
    check(r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("mgn dump-checkpoint: ")
          and r.stderr.count("dump-checkpoint") == 1, f"a runtime error: exit 1, one line: {r.stderr!r}")

    # ---- the aborts of issue 30 (mutation fuzzing through the CLI): each reproducer is now exit 1 and one line
    # naming the command and the file, fast (every size is checked before any allocation or compile)
    def one_runtime_error(args, needles, label):
        r, secs = mgn_run(args)
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 1 and len(lines) == 1 and lines[0].startswith(f"mgn {args[0]}: ")
              and all(n in lines[0] for n in needles) and secs < 30,
              f"{label}: exit 1, one line naming {needles}, got {r.returncode}: {r.stderr!r}")

    def model_dir(name, config, tokenizer=None, tokenizer_config=None):
        d = os.path.join(work, name)
        os.makedirs(d, exist_ok=True)
        for file, text in [("config.json", config), ("tokenizer.json", tokenizer),
                           ("tokenizer_config.json", tokenizer_config)]:
            if text is not None:
                with open(os.path.join(d, file), "w") as f:
                    f.write(text)
        return d

    sizes = '"vocab_size": 4, "hidden_size": 8, "intermediate_size": 4, "num_attention_heads": 2'
    ok_config = '{' + sizes + ', "num_hidden_layers": 1}'
    ok_tokenizer = '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}, ' \
                   '"pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"}}'
    for layers in ["2147483648", "4294967295"]:
        d = model_dir("layers" + layers, '{' + sizes + ', "num_hidden_layers": ' + layers + '}')
        one_runtime_error(["generate", d, "--prompt", "a"], ["config.json", "implausibly large"], f"layers {layers}")
    d = model_dir("vocab", '{"vocab_size": 4294967296, "hidden_size": 8, "intermediate_size": 4, '
                           '"num_attention_heads": 2, "num_hidden_layers": 1}')
    one_runtime_error(["generate", d, "--prompt", "a"], ["config.json", "vocab_size"], "vocab 2^32")
    d = model_dir("bigid", ok_config, ok_tokenizer.replace('"b": 1', '"b": 1e995'))
    one_runtime_error(["generate", d, "--prompt", "a"], ["tokenizer.json", "number overflow"], "a vocab id of 1e995")
    d = model_dir("template", ok_config, ok_tokenizer[:-1] + ', "post_processor": {"type": "TemplateProcessing", '
                  '"single": [{"SpecialToken": {"id": "a"}}, {"Sequence": {"id": "A"}}], '
                  '"special_tokens": {"a": [0]}}}')
    one_runtime_error(["generate", d, "--prompt", "a"], ["tokenizer.json", "special_tokens"],
                      "an array where post_processor.special_tokens expects an object")
    d = model_dir("tokconfig", ok_config, ok_tokenizer, '{"bos_token": 1e995}')
    one_runtime_error(["generate", d, "--prompt", "a"], ["tokenizer_config.json"], "tokenizer_config.json 1e995")
    one_runtime_error(["plan", "--model", "mlp", "--batch", str(2 ** 62)], ["64-bit"], "plan at batch 2^62")
    one_runtime_error(["train-fashion-mnist", "--limit-train", "64", "--out", os.path.join(work, "no", "c.safetensors")],
                      ["does not exist", os.path.join(work, "no")], "a checkpoint in a missing folder")

    # ---- boolean flags without a value, and the positive control for the cache
    r, _ = mgn_run(["inspect", "--supported-ops"])
    check(r.returncode == 0 and "Conv" in r.stdout.split(), "mgn inspect --supported-ops")
    r, _ = mgn_run(["plan", "--model", "mlp", "--show", "report", "--reuse", "off"])
    check(r.returncode == 0 and "step-local peak live" in r.stdout, f"mgn plan --show report: {r.stderr}")
    d, _ = mgn_run(["devices"])
    if d.returncode == 0 and d.stdout.strip() and "no Vulkan backend" not in d.stdout:
        before = cache_files()
        r, _ = mgn_run(["kernels", "--model", "mlp", "--batch", "2", "--list"])
        check(r.returncode == 0 and r.stdout.strip() and "// =====" not in r.stdout,
              f"mgn kernels --list prints names only: {r.stderr.strip()}")
        check(cache_files() > before, "a compile writes kernels to the cache (the usage-error checks see it)")
        # The warm path across processes: the second compile of the same sessions (a new process, the same cache
        # folder) emits no GLSL and runs no shaderc; mgn cache info counts the entries, clear removes them.
        own = os.path.join(work, "warm-cache")
        reports = []
        for run in ("cold", "warm"):
            j = os.path.join(work, f"compile_{run}.jsonl")
            r, _ = mgn_run(["bench", "fashion-mlp", "--phases", "compile", "--json", j], {"MGN_CACHE_DIR": own})
            check(r.returncode == 0, f"mgn bench fashion-mlp --phases compile ({run}): {r.stderr.strip()[-300:]}")
            reports.append(json.loads(open(j).readline())["phases"] if r.returncode == 0 else {})
        cold, warm = reports
        check(cold and all(p["session_cache"] == "miss" and p["emitted"] > 0 and p["compiled"] + p["spirv_memory_hits"] > 0
                           for p in cold.values()), f"a cold compile emits and compiles: {cold}")
        check(warm and all(p["session_cache"] == "hit" and p["emitted"] == 0 and p["compiled"] == 0
                           and p["spirv_from_session"] == p["unique_kernels"] for p in warm.values()),
              f"a warm compile in a new process emits no GLSL and runs no shaderc: {warm}")
        # --tune: the first compile measures the GEMM shapes and writes the tuning file; the second (a new process,
        # same folder) takes every choice from the file; without --tune the file is not read.
        tuned_dir = os.path.join(work, "tune-cache")
        tuned = []
        for run, flags in (("tune-cold", ["--tune"]), ("tune-warm", ["--tune"]), ("untuned", [])):
            j = os.path.join(work, f"compile_{run}.jsonl")
            r, _ = mgn_run(["bench", "fashion-mlp", "--phases", "compile", "--json", j] + flags, {"MGN_CACHE_DIR": tuned_dir})
            check(r.returncode == 0, f"mgn bench fashion-mlp --phases compile {flags} ({run}): {r.stderr.strip()[-300:]}")
            line = json.loads(open(j).readline()) if r.returncode == 0 else {}
            tuned.append(line)
        t_cold, t_warm, t_off = tuned
        if t_cold and t_warm and t_off:
            c, w = t_cold["phase_totals"], t_warm["phase_totals"]
            check(t_cold["tune"] == "measure" and c["tune_measured"] > 0 and c["tune_timed"] >= c["tune_measured"],
                  f"mgn bench --tune measures GEMM shapes: {c}")
            check(w["tune_measured"] == 0 and w["tune_cached"] >= c["tune_measured"] and
                  all(p["tune_file"] == "hit" for p in t_warm["phases"].values()),
                  f"a second mgn bench --tune measures nothing: {w}")
            check(t_off["tune"] == "off" and all(p["tune_file"] == "off" and p["tune_cached"] == 0
                                                 for p in t_off["phases"].values()),
                  f"without --tune the tuning file is not read: {t_off['phases']}")
            check(len(os.listdir(os.path.join(tuned_dir, "tuning"))) == 1, "one tuning file for the device")
        r, _ = mgn_run(["cache", "info", "--dir", own])
        m = re.search(r"compiled sessions\s+(\d+)", r.stdout)
        check(r.returncode == 0 and m and int(m.group(1)) == len(warm), f"mgn cache info counts the sessions: {r.stdout}")
        r, _ = mgn_run(["cache", "clear"], {"MGN_CACHE_DIR": own})
        check(r.returncode == 0 and r.stdout.startswith("cleared"), f"mgn cache clear: {r.stdout} {r.stderr}")
        r, _ = mgn_run(["cache", "info", "--dir", own])
        check(r.returncode == 0 and re.search(r"compiled sessions\s+0\s", r.stdout) and
              re.search(r"SPIR-V kernels\s+0\s", r.stdout), f"nothing left after mgn cache clear: {r.stdout}")
    else:
        print("no Vulkan device: the cache's positive control is skipped;", d.stderr.strip())

    # ---- the environment
    r, _ = mgn_run(["help", "environment", "--markdown"])
    doc = open(os.path.join(src, "docs", "environment.md")).read()
    begin, end = "<!-- env:begin -->\n", "<!-- env:end -->"
    block = doc[doc.index(begin) + len(begin):doc.index(end)]
    check(r.returncode == 0 and r.stdout == block, "mgn help environment --markdown is docs/environment.md's block")
    r, _ = mgn_run(["help", "environment"])
    names = sorted(set(re.findall(r"^\| `(MGN_[A-Z0-9_]+)`", block, re.M)))
    check(r.returncode == 0 and names and all(re.search(rf"^  {n}$", r.stdout, re.M) for n in names),
          "mgn help environment lists every variable of the docs")
    typo = "MGN_" + "GEMM_TIEL"  # spelled apart so that no script seems to set an undocumented variable
    r, _ = mgn_run(["help", "environment"], {typo: "64x64x16"})
    check(r.returncode == 0 and r.stderr.count(typo) == 1 and "warning" in r.stderr,
          f"an unknown MGN_* name is warned about once: {r.stderr!r}")
    r, _ = mgn_run(["plan", "--model", "mlp", "--show", "report"], {typo: "1"})
    check(r.returncode == 0 and r.stderr.count(typo) == 1, f"commands warn about it too: {r.stderr!r}")
    r, _ = mgn_run(["help", "environment"], {"MGN_FUSION": "maybe"})
    check(r.returncode == 0 and "MGN_FUSION" in r.stderr, "help works with a malformed variable (a warning)")

    # ---- bench-gemm: every storage layout, batched, against its double-precision check of sampled entries
    for layout in ["nn", "nt", "tn", "tt"]:
        r, _ = mgn_run(["bench-gemm", "--backend", "vulkan", "--layout", layout, "--samples", "1", "--warmup", "0",
                        "--warmup-ms", "0", "2x33x20x12", "37x68x20"])
        lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
        check(r.returncode == 0 and len(lines) == 2, f"bench-gemm --layout {layout}: {r.stderr.strip()[-300:]}")
        for ln in lines:
            check(ln["layout"] == layout and 0 <= ln["check_err"] < 1e-5,
                  f"bench-gemm --layout {layout} {ln['batch']}x{ln['m']}x{ln['n']}x{ln['k']}: error {ln['check_err']}")
    one_usage_error("bench-gemm", ["--layout", "nx"], "--layout")
    one_usage_error("bench-gemm", ["2x3"], "BATCHxMxNxK")

    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
