#!/usr/bin/env python3
"""The rules that keep the architecture visible (docs/architecture.md), checked on the source tree:

1. Layers: every #include in src/ points to the file's own layer or to one listed below it in LAYERS; a
   public header (include/mgn/X.h) belongs to the layer that implements it (PUBLIC).
2. Public headers: each is classified in PUBLIC, and every .cpp whose first include is "mgn/X.h" (the
   convention: a source file includes the header it implements first) lives in X's layer folder.
3. Tools (tools/, fuzz/), the Python module (python/) and the examples (examples/) include only public
   headers and their own folder's headers.
4. Configuration: getenv appears in src/ only in src/runtime/environment.cpp; no setenv, unsetenv or
   putenv in src/, tools/ or tests/ (tests pass options).
5. Exhaustive op handling: a switch over an op kind (ir::Op) has no `default:` label, so an op added to
   ops.def fails to compile (-Werror=switch) until every switch handles it.
6. Kernel emitters: no source file in src/codegen/ is longer than CODEGEN_MAX_LINES.

Prints every violation and exits 1 if there is any. Usage: scripts/check-layers.py [SOURCE_DIR]
"""
import os
import re
import sys

# Each layer and the layers it may include (its own is always allowed). Order: bottom to top.
LAYERS = {
    "src/ir": [],
    "src/support": ["src/ir"],
    "src/frontend": ["src/ir"],
    "src/passes": ["src/frontend", "src/ir"],
    "src/plan": ["src/ir"],
    "src/codegen": ["src/plan", "src/ir", "src/support"],
    "src/backend/cpu": ["src/plan", "src/ir", "src/support"],
    "src/backend/vulkan": ["src/codegen", "src/plan", "src/ir", "src/support"],
    "src/io": ["src/frontend", "src/ir", "src/support"],
    "src/runtime": ["src/backend/vulkan", "src/backend/cpu", "src/codegen", "src/plan", "src/passes", "src/io",
                    "src/frontend", "src/ir", "src/support"],
    "src/models": ["src/runtime", "src/io", "src/passes", "src/frontend", "src/ir", "src/support"],
}

# Public header -> the layer folder that implements it.
PUBLIC = {
    "types.h": "src/ir",
    "init.h": "src/ir",
    "options.h": "src/support",
    "graph.h": "src/frontend",
    "nn.h": "src/frontend",
    "autodiff.h": "src/passes",
    "optim.h": "src/passes",
    "safetensors.h": "src/io",
    "checkpoint.h": "src/io",
    "data.h": "src/io",
    "onnx.h": "src/io",
    "nnef.h": "src/io",
    "audio.h": "src/io",
    "image.h": "src/io",
    "gguf.h": "src/io",
    "session.h": "src/runtime",
    "train.h": "src/runtime",
    "data_parallel.h": "src/runtime",
    "plan.h": "src/runtime",
    "environment.h": "src/runtime",
    "device.h": "src/runtime",
    "models.h": "src/models",
    "llama.h": "src/models",
    "whisper.h": "src/models",
    "smolvla.h": "src/models",
    "dinov3.h": "src/models",
    "dinovision.h": "src/models",
    "unet.h": "src/models",
    "tokenizer.h": "src/models",
}

CODEGEN_MAX_LINES = 600
SOURCE_EXT = (".cpp", ".h", ".inc", ".def")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def files_under(root, folder, exts=SOURCE_EXT):
    base = os.path.join(root, folder)
    for d, _, names in os.walk(base):
        for n in sorted(names):
            if n.endswith(exts):
                yield os.path.relpath(os.path.join(d, n), root)


def layer_of_file(path):
    best = None
    for layer in LAYERS:
        if path.startswith(layer + "/") and (best is None or len(layer) > len(best)):
            best = layer
    return best


def layer_of_include(inc):
    if inc.startswith("mgn/"):
        return PUBLIC.get(inc[4:], "?public")
    return layer_of_file("src/" + inc)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def op_switch_defaults(text):
    """Line numbers of `default:` labels inside switches over an op kind (ir::Op values)."""
    bad = []
    code = strip_comments(text)
    for m in re.finditer(r"switch\s*\(([^)]*)\)\s*\{", code):
        expr = m.group(1)
        start = m.end()
        depth, i = 1, start
        while i < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        body = code[start:i]
        # A switch over ops: its expression names an op, or its cases are ir::Op / Op:: values or the
        # ops.def X-macro.
        over_op = re.search(r"(^|[.>\s])op\s*$", expr.strip()) or re.search(r"\bcase\s+(ir::)?Op::", body) or \
            '#include "ir/ops.def"' in body
        if not over_op:
            continue
        # Labels of nested switches belong to them; blank those out first.
        inner = re.sub(r"switch\s*\([^)]*\)\s*\{(?:[^{}]|\{[^{}]*\})*\}", "", body)
        for d in re.finditer(r"\bdefault\s*:", inner):
            bad.append(code[: start + body.find(d.group(0))].count("\n") + 1)
    return bad


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    errors = []

    # 2. Public headers classified, and implemented in their layer.
    for name in sorted(os.listdir(os.path.join(root, "include/mgn"))):
        if name.endswith(".h") and name not in PUBLIC:
            errors.append(f"include/mgn/{name}: not classified in PUBLIC (scripts/check-layers.py): which layer "
                          "implements it?")
    for path in files_under(root, "src", (".cpp",)):
        text = open(os.path.join(root, path), encoding="utf-8").read()
        incs = INCLUDE.findall(text)
        if incs and incs[0].startswith("mgn/") and incs[0][4:] in PUBLIC:
            want = PUBLIC[incs[0][4:]]
            if not path.startswith(want + "/"):
                errors.append(f"{path}: implements include/{incs[0]}, whose layer is {want}")

    # 1. Include arrows inside src/.
    for path in files_under(root, "src"):
        layer = layer_of_file(path)
        if layer is None:
            errors.append(f"{path}: in no layer of scripts/check-layers.py")
            continue
        text = open(os.path.join(root, path), encoding="utf-8").read()
        for inc in INCLUDE.findall(text):
            target = layer_of_include(inc)
            if target is None and not inc.startswith("mgn/") and os.path.exists(os.path.join(os.path.dirname(
                    os.path.join(root, path)), inc)):
                continue  # a file next to this one (generated tables)
            if target == layer or target in LAYERS[layer]:
                continue
            errors.append(f"{path}: includes \"{inc}\" ({target}), which {layer} may not use")

    # 3. Tools use public headers only.
    for folder in ("tools", "fuzz", "python", "examples"):
        for path in files_under(root, folder):
            text = open(os.path.join(root, path), encoding="utf-8").read()
            for inc in INCLUDE.findall(text):
                if inc.startswith("mgn/") and inc[4:] in PUBLIC:
                    continue
                if "/" not in inc and os.path.exists(os.path.join(root, os.path.dirname(path), inc)):
                    continue
                errors.append(f"{path}: includes \"{inc}\"; tools use public headers (include/mgn) only")

    # 4. Configuration is read in one place; tests never write the environment.
    for folder in ("src", "tools", "tests", "python"):
        for path in files_under(root, folder, (".cpp", ".h")):
            code = strip_comments(open(os.path.join(root, path), encoding="utf-8").read())
            if re.search(r"\b(setenv|unsetenv|putenv)\s*\(", code):
                errors.append(f"{path}: writes the process environment (pass options instead)")
            if folder != "tests" and re.search(r"\bgetenv\s*\(", code) and path != "src/runtime/environment.cpp":
                errors.append(f"{path}: reads the environment; only src/runtime/environment.cpp may "
                              "(mgn::read_environment)")

    # 5. Switches over ops have no default.
    for folder in ("src", "tools"):
        for path in files_under(root, folder, (".cpp", ".h")):
            for line in op_switch_defaults(open(os.path.join(root, path), encoding="utf-8").read()):
                errors.append(f"{path}:{line}: `default:` in a switch over ops (list every op so a new one "
                              "fails to compile)")

    # 6. Kernel emitter files stay small.
    for path in files_under(root, "src/codegen"):
        n = sum(1 for _ in open(os.path.join(root, path), encoding="utf-8"))
        if n > CODEGEN_MAX_LINES:
            errors.append(f"{path}: {n} lines; kernel families stay under {CODEGEN_MAX_LINES} (split it)")

    for e in errors:
        print(e)
    print(f"check-layers: {len(errors)} problem(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
