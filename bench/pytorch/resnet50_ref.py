"""PyTorch's memory for the ResNet-50 workload, for the comparison with `mgn plan --model resnet50`.

    python3 bench/pytorch/resnet50_ref.py DIR [--device cuda|cpu] [--batch 4] [--image 224] [--seed 0]
                                              [--foreach default|on|off]

torchvision's resnet50 (random init, 1000 classes), f32 with TF32 off (matmul and cuDNN), batch 4 x 3 x 224 x 224
of deterministic random inputs (torch.Generator seeded with --seed) and random labels. Writes DIR/torch_memory.json:

  inference        model.eval(), one torch.no_grad() forward
  flb              model.train(), forward + cross-entropy + backward (no optimizer), grads set to None before
  train_step       model.train(), forward + cross-entropy + backward + torch.optim.AdamW.step() (lr 1e-3, betas
                   0.9/0.999, eps 1e-8, weight decay 1e-2: mgn's AdamW defaults), measured on the third step,
                   so that the optimizer state exists (the first step allocates it); zero_grad(set_to_none=True)
                   before the step, as mgn keeps no gradient between steps

For each phase: start_bytes = torch.cuda.memory_allocated() when the phase starts (parameters, buffers, the
input batch and, for train_step, the AdamW moments), peak_bytes = torch.cuda.max_memory_allocated() after
torch.cuda.reset_peak_memory_stats() at that point, so peak_bytes INCLUDES everything already allocated
(the convention of mgn's planned arena, which holds parameters, state and inputs too), and
peak_minus_start_bytes excludes it. Also written: parameter_bytes, buffer_bytes (BN running statistics and
num_batches_tracked), optimizer_state_bytes (every tensor of opt.state after the warm-up steps), input_bytes.
Caching-allocator reserve (memory_reserved) is reported but is not the figure compared.

--device cpu runs the same phases without memory figures (the *_bytes of the phases are null), so the
script can be smoke-tested without a GPU. Losses and the logits' checksum are written for both devices.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
import torchvision


def tensor_bytes(ts):
    return int(sum(t.numel() * t.element_size() for t in ts))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--foreach", choices=["default", "on", "off"], default="default",
                    help="AdamW's multi-tensor implementation (default: torch's choice for the device)")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if hasattr(torch, "set_float32_matmul_precision"):
        torch.set_float32_matmul_precision("highest")

    torch.manual_seed(a.seed)
    model = torchvision.models.resnet50(weights=None, num_classes=a.classes).to(device)
    gen = torch.Generator().manual_seed(a.seed + 1)
    x = torch.randn(a.batch, 3, a.image, a.image, generator=gen).to(device)
    labels = torch.randint(0, a.classes, (a.batch,), generator=gen).to(device)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def measure(fn):
        """Runs fn once; returns (result, {start_bytes, peak_bytes, peak_minus_start_bytes, reserved_bytes})."""
        sync()
        if not cuda:
            return fn(), {"start_bytes": None, "peak_bytes": None, "peak_minus_start_bytes": None,
                          "reserved_bytes": None}
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        r = fn()
        sync()
        peak = torch.cuda.max_memory_allocated()
        return r, {"start_bytes": start, "peak_bytes": peak, "peak_minus_start_bytes": peak - start,
                   "reserved_bytes": torch.cuda.max_memory_reserved()}

    result = {"model": "torchvision.models.resnet50", "torch": torch.__version__,
              "torchvision": torchvision.__version__, "device": str(device),
              "device_name": torch.cuda.get_device_name(device) if cuda else "cpu", "dtype": "float32",
              "tf32": False, "cudnn_benchmark": bool(torch.backends.cudnn.benchmark), "batch": a.batch,
              "image": a.image, "classes": a.classes, "seed": a.seed,
              "convention": "peak_bytes = max_memory_allocated() after reset_peak_memory_stats(), including "
                            "what is allocated at the start (start_bytes); peak_minus_start_bytes excludes it",
              "parameter_bytes": tensor_bytes(model.parameters()), "buffer_bytes": tensor_bytes(model.buffers()),
              "input_bytes": tensor_bytes([x, labels]), "phases": {}}

    # Inference: eval mode (running statistics), no autograd.
    model.eval()

    def infer():
        with torch.no_grad():
            return model(x)

    logits, mem = measure(infer)
    result["phases"]["inference"] = dict(mem, logits_sum=float(logits.double().sum()))
    del logits

    # F+L+B: train mode (batch statistics), no optimizer.
    model.train()

    def flb():
        loss = F.cross_entropy(model(x), labels)
        loss.backward()
        return loss.detach()

    model.zero_grad(set_to_none=True)
    loss, mem = measure(flb)
    result["phases"]["flb"] = dict(mem, loss=float(loss))
    model.zero_grad(set_to_none=True)

    # One full AdamW training step, after two warm-up steps (the first allocates the moments).
    kw = {} if a.foreach == "default" else {"foreach": a.foreach == "on"}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, **kw)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), labels)
        loss.backward()
        opt.step()
        return loss.detach()

    warm = [float(step()) for _ in range(2)]
    opt.zero_grad(set_to_none=True)
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    result["optimizer"] = {"name": "AdamW", "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 1e-2,
                           "foreach": a.foreach}
    result["optimizer_state_bytes"] = tensor_bytes(state)
    result["optimizer_state_device_bytes"] = tensor_bytes(t for t in state if t.device == device)
    loss, mem = measure(step)
    result["phases"]["train_step"] = dict(mem, loss=float(loss), warmup_losses=warm)

    path = os.path.join(a.dir, "torch_memory.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    mib = lambda b: "n/a" if b is None else f"{b / 2**20:.1f} MiB"  # noqa: E731
    ph = result["phases"]
    print(f"resnet50_ref.py ({device}, batch {a.batch}, {a.image}x{a.image}): parameters "
          f"{mib(result['parameter_bytes'])}, AdamW state {mib(result['optimizer_state_bytes'])}; peak allocated: "
          f"inference {mib(ph['inference']['peak_bytes'])}, F+L+B {mib(ph['flb']['peak_bytes'])}, "
          f"train step {mib(ph['train_step']['peak_bytes'])} (start {mib(ph['train_step']['start_bytes'])}); "
          f"loss {ph['train_step']['loss']:.4f} -> {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
