# torch.optim reference for tests/optim_test.cpp: N steps of one optimizer on given parameters with given
# per-step gradients (no model: the gradients are fed, so only the update rule is under test).
#   optim_ref.py in.safetensors out.safetensors config.json
# in:  "<param>" initial values, "step<k>.<param>" the gradient at step k
# out: "<param>" after N steps, "lr<k>" the lr used at step k, "norm<k>" the pre-clip grad norm (clip only)
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402


def main():
    src, dst, cfg_path = sys.argv[1:4]
    cfg = json.load(open(cfg_path))
    t = st_io.read(src)
    names = cfg["params"]
    params = {n: torch.nn.Parameter(torch.tensor(t[n], dtype=torch.float32)) for n in names}
    mults = cfg.get("lr_multipliers", [])

    def scale_of(name):
        best, s = -1, 1.0
        for m in mults:
            if name.startswith(m["prefix"]) and len(m["prefix"]) > best:
                best, s = len(m["prefix"]), m["scale"]
        return s

    lr = cfg["lr"]
    groups = {}
    for n in names:
        groups.setdefault(scale_of(n), []).append(params[n])
    pg = [{"params": ps, "lr": lr * s} for s, ps in groups.items()]
    group_scales = list(groups.keys())
    kind = cfg["optimizer"]
    if kind == "sgd":
        opt = torch.optim.SGD(pg, lr=lr, momentum=cfg.get("momentum", 0), dampening=cfg.get("dampening", 0),
                              nesterov=cfg.get("nesterov", False), weight_decay=cfg.get("weight_decay", 0))
    elif kind == "adam":
        opt = torch.optim.Adam(pg, lr=lr, betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"],
                               weight_decay=cfg.get("weight_decay", 0))
    elif kind == "adamw":
        opt = torch.optim.AdamW(pg, lr=lr, betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"],
                                weight_decay=cfg.get("weight_decay", 0))
    else:
        raise SystemExit("unknown optimizer " + kind)
    sched = None
    sc = cfg.get("schedule")
    if sc and sc["kind"] == "linear_warmup":
        sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=sc["start_factor"], end_factor=1.0,
                                                  total_iters=sc["warmup"])
    elif sc and sc["kind"] == "cosine":
        # eta_min is absolute in torch; per group it is the same, so only one group is used with cosine.
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=sc["total"], eta_min=lr * sc["min_ratio"])

    out = {}
    for k in range(cfg["steps"]):
        for n in names:
            params[n].grad = torch.tensor(t["step%d.%s" % (k, n)], dtype=torch.float32)
        if cfg.get("clip", 0) > 0:
            norm = torch.nn.utils.clip_grad_norm_([params[n] for n in names], cfg["clip"])
            out["norm%d" % k] = np.array([float(norm)], dtype=np.float32)
        # the base lr: the first group's lr without its multiplier
        out["lr%d" % k] = np.array([opt.param_groups[0]["lr"] / group_scales[0]], dtype=np.float64)
        opt.step()
        if sched is not None:
            sched.step()
    for n in names:
        out[n] = params[n].detach().numpy()
    st_io.write(dst, out, dtypes={k: "F64" for k in out if k.startswith("lr")})


if __name__ == "__main__":
    main()
