"""`mgn dinov3-embed` and `mgn dinovision train|reconstruct` end to end (ctest DinoVisionCli), on Debian's
photographs (opencv-doc) with a reduced DINOv3 directory written here (config.json + model.safetensors of random
weights, 3 layers, hidden 64):

- dinov3-embed: CLS and patch features against PIL + torchvision preprocessing fed to the plain-torch ViT
  (tests/ref/dinov3_ref.py) in float64 (rel-L2 <= 1e-4, every row cosine > 0.9999); a truncated JPEG and a size
  that is no multiple of 16 with --resize 0 --crop 0 are refused naming the file, before any compile;
- dinovision train on 64 x 64 crops for a few Adam steps: the cached held-out features equal the torch ViT's first
  3 layers (+ final norm) on the same crops; the PyTorch anchor (bench/pytorch/dinovision_anchor.py) trains the
  same decoder from the same init in the same order and lands within 0.2 dB of meganeura's PSNR; a second run
  reuses the feature cache; reconstruct writes the grid PNG.

  python3 tests/ref/dinovision_check.py MGN OUT_DIR
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch
import torchvision.transforms as T
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dinov3_ref  # noqa: E402
import st_io  # noqa: E402

PHOTOS = "/usr/share/doc/opencv-doc/examples/data/"
CFG = {"architectures": ["DINOv3ViTModel"], "model_type": "dinov3_vit", "hidden_size": 64, "num_hidden_layers": 3,
       "num_attention_heads": 4, "intermediate_size": 96, "patch_size": 16, "num_register_tokens": 4,
       "rope_theta": 100.0, "layer_norm_eps": 1e-5, "hidden_act": "gelu", "key_bias": False, "image_size": 224}
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def mgn(tool, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MGN_") or k == "MGN_VALIDATION"}
    return subprocess.run([tool, *args], capture_output=True, text=True, env=env, timeout=600)


def weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    d, f = CFG["hidden_size"], CFG["intermediate_size"]
    w = {"embeddings.cls_token": torch.randn(1, 1, d, generator=g),
         "embeddings.register_tokens": torch.randn(1, 4, d, generator=g),
         "embeddings.mask_token": torch.zeros(1, 1, d),
         "embeddings.patch_embeddings.weight": torch.randn(d, 3, 16, 16, generator=g) / 28,
         "embeddings.patch_embeddings.bias": torch.randn(d, generator=g) * 0.1,
         "norm.weight": 1 + 0.1 * torch.randn(d, generator=g), "norm.bias": 0.1 * torch.randn(d, generator=g)}
    for i in range(CFG["num_hidden_layers"]):
        p = f"layer.{i}."
        for n in ("norm1", "norm2"):
            w[p + n + ".weight"] = 1 + 0.1 * torch.randn(d, generator=g)
            w[p + n + ".bias"] = 0.1 * torch.randn(d, generator=g)
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            w[p + "attention." + n + ".weight"] = torch.randn(d, d, generator=g) / d ** 0.5
            if n != "k_proj":
                w[p + "attention." + n + ".bias"] = 0.1 * torch.randn(d, generator=g)
        w[p + "mlp.up_proj.weight"] = torch.randn(f, d, generator=g) / d ** 0.5
        w[p + "mlp.up_proj.bias"] = 0.1 * torch.randn(f, generator=g)
        w[p + "mlp.down_proj.weight"] = torch.randn(d, f, generator=g) / f ** 0.5
        w[p + "mlp.down_proj.bias"] = 0.1 * torch.randn(d, generator=g)
        w[p + "layer_scale1.lambda1"] = 0.5 + 0.1 * torch.randn(d, generator=g)
        w[p + "layer_scale2.lambda1"] = 0.5 + 0.1 * torch.randn(d, generator=g)
    return {k: v.float() for k, v in w.items()}


def torch_vit(w, px, layers=None):
    w64 = {k: v.double() for k, v in w.items()}
    return dinov3_ref.vit(w64, px.double(), CFG["hidden_size"], layers or CFG["num_hidden_layers"],
                          CFG["num_attention_heads"], 16, 4, 100.0, 1e-5, True)


def preprocess(path, resize, crop):
    x = torch.from_numpy(np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255.0).permute(2, 0, 1)
    x = T.CenterCrop(crop)(T.Resize(resize, interpolation=T.InterpolationMode.BILINEAR, antialias=True)(x))
    return x


def normalize(x):
    return T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])(x)


def rel(a, b):
    return float(torch.linalg.norm((a - b).flatten()) / torch.linalg.norm(b.flatten()))


def min_cos(a, b):
    return float(torch.nn.functional.cosine_similarity(a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1]), dim=1).min())


def main():
    tool, out = sys.argv[1], sys.argv[2]
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    model = os.path.join(out, "dinov3-tiny")
    os.makedirs(model)
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump(CFG, f)
    w = weights()
    st_io.write(os.path.join(model, "model.safetensors"), {k: v.numpy() for k, v in w.items()})

    # ---- dinov3-embed against torchvision + the plain-torch ViT (f64)
    imgs = [PHOTOS + "baboon.jpg", PHOTOS + "fruits.jpg"]
    emb = os.path.join(out, "emb.safetensors")
    r = mgn(tool, "dinov3-embed", *imgs, "--model", model, "--out", emb, "--resize", "73", "--crop", "64",
            "--backend", "cpu")
    check(r.returncode == 0, f"dinov3-embed runs: {r.stderr[-500:]}")
    if r.returncode == 0:
        got = st_io.read(emb)[0] if isinstance(st_io.read(emb), tuple) else st_io.read(emb)
        for p in imgs:
            px = normalize(preprocess(p, 73, 64))[None]
            want = torch_vit(w, px)[0]
            cls, patches = torch.as_tensor(np.asarray(got[p + ".cls"])), torch.as_tensor(np.asarray(got[p + ".patches"]))
            check(tuple(patches.shape) == (16, 64), f"{p}: patches [16, 64], got {tuple(patches.shape)}")
            full = torch.cat([cls[None].double(), patches.double()])
            ref = torch.cat([want[:1], want[5:]])
            check(rel(full, ref) <= 1e-4, f"{p}: embed rel-L2 {rel(full, ref):.2e} <= 1e-4")
            check(min_cos(full, ref) > 0.9999, f"{p}: every row cosine {min_cos(full, ref):.6f} > 0.9999")
    # Refusals naming the file.
    cut = os.path.join(out, "cut.jpg")
    with open(imgs[0], "rb") as f:
        data = f.read()
    with open(cut, "wb") as f:
        f.write(data[:len(data) // 3])
    r = mgn(tool, "dinov3-embed", imgs[1], cut, "--model", model, "--backend", "cpu")
    check(r.returncode == 1 and cut in r.stderr and "dinov3:" not in r.stderr,
          f"a truncated JPEG is refused naming it, before any compile: {r.stderr.strip()[-300:]}")
    odd = PHOTOS + "butterfly.jpg"  # 493 x 356
    r = mgn(tool, "dinov3-embed", odd, "--model", model, "--resize", "0", "--crop", "0", "--backend", "cpu")
    check(r.returncode == 1 and odd in r.stderr and "multiple of the patch size" in r.stderr,
          f"a size that is no multiple of 16 is refused naming the file: {r.stderr.strip()[-300:]}")

    # ---- dinovision train on 64 x 64 crops
    photos = os.path.join(out, "photos")
    os.makedirs(photos)
    for n in ["baboon.jpg", "fruits.jpg", "building.jpg", "lena.jpg", "apple.jpg", "butterfly.jpg", "home.jpg",
              "orange.jpg", "starry_night.jpg", "pic1.png"]:
        if os.path.exists(PHOTOS + n):
            os.symlink(PHOTOS + n, os.path.join(photos, n))
    run = os.path.join(out, "run")
    args = ["dinovision", "train", "--images", photos, "--model", model, "--image-size", "64",
            "--widths", "16,16,8,8,8", "--batch", "4", "--views", "2", "--backend", "cpu"]
    r = mgn(tool, *args, "--run", run, "--steps", "40", "--progress", "10")
    check(r.returncode == 0, f"dinovision train runs: {r.stderr[-800:]}")
    print(r.stdout.strip())
    if r.returncode != 0:
        return
    metrics = json.load(open(os.path.join(run, "metrics.json")))
    runj = json.load(open(os.path.join(run, "run.json")))
    check(runj["train_images"] + runj["val_images"] == len(os.listdir(photos)) and runj["val_images"] == 2,
          f"split by image, 80/20: {runj['train_images']} / {runj['val_images']}")
    check(np.isfinite(metrics["psnr_db"]) and 0 < metrics["ssim_median"] < 1, f"metrics: {metrics['psnr_db']:.3f} dB")
    check("step 40/40" in r.stderr, "progress is printed")
    # The cached held-out features are the torch ViT's first 3 layers + final norm on the same crops.
    feats = st_io.read(os.path.join(run, "features.safetensors"))
    feats = feats[0] if isinstance(feats, tuple) else feats
    vt = torch.as_tensor(np.asarray(feats["val.targets"])).double() / 255.0
    vf = torch.as_tensor(np.asarray(feats["val.features"])).double()
    want = torch_vit(w, normalize(vt.float()).double(), layers=3)[:, 5:]  # [n, 16, D]
    want = want.transpose(1, 2).reshape(vf.shape)
    check(rel(vf, want) <= 1e-4, f"cached features = torch's first 3 layers: rel-L2 {rel(vf, want):.2e}")
    # The PyTorch anchor: same decoder, init, order, optimizer.
    anchor = os.path.join(HERE, "..", "..", "bench", "pytorch", "dinovision_anchor.py")
    a = subprocess.run([sys.executable, anchor, run, "--device", "cpu", "--json", os.path.join(out, "anchor.json")],
                       capture_output=True, text=True, timeout=600)
    print(a.stdout.strip().splitlines()[-1] if a.stdout.strip() else a.stderr[-500:])
    check(a.returncode == 0, "the PyTorch anchor lands within 0.2 dB")
    if a.returncode == 0:
        aj = json.load(open(os.path.join(out, "anchor.json")))
        check(abs(aj["ssim_median"] - metrics["ssim_median"]) < 0.01, f"median SSIM: torch {aj['ssim_median']:.4f}, "
              f"meganeura {metrics['ssim_median']:.4f}")
        if "ssim_median_skimage" in aj:
            check(abs(aj["ssim_median_skimage"] - aj["ssim_median"]) < 1e-6, "the anchor's SSIM is skimage's")
    # A second run reuses the cache.
    r = mgn(tool, *args, "--steps", "2", "--run", os.path.join(out, "run2"))
    check(r.returncode == 0 and "features from the cache" not in r.stderr, "a new run folder computes its features")
    shutil.copy(os.path.join(run, "features.safetensors"), os.path.join(out, "run2", "features.safetensors"))
    r = mgn(tool, *args, "--steps", "2", "--run", os.path.join(out, "run2"))
    check(r.returncode == 0 and "features from the cache" in r.stderr, f"the feature cache is reused: {r.stderr[-300:]}")
    # The training set on the device (auto here: a few MiB) against uploading every batch: the same values reach
    # the same kernels, so the trained decoders are bitwise identical; on the CPU backend (the run above) and on
    # Vulkan.
    check(runj.get("data_on_device") is True, "auto keeps a small training set on the device")
    def decoder_bytes(d):
        with open(os.path.join(d, "decoder.safetensors"), "rb") as f:
            return f.read()
    def run_with(name, steps, *extra):
        d = os.path.join(out, name)
        os.makedirs(d)
        shutil.copy(os.path.join(run, "features.safetensors"), os.path.join(d, "features.safetensors"))
        r = mgn(tool, *args[:-2], *extra, "--steps", str(steps), "--run", d)
        check(r.returncode == 0, f"{name} runs: {r.stderr[-300:]}")
        return d, r
    d_off, r = run_with("run_host_batches", 40, "--backend", "cpu", "--data-on-device", "off")
    if r.returncode == 0:
        check(json.load(open(os.path.join(d_off, "run.json")))["data_on_device"] is False, "off uploads each batch")
        check(decoder_bytes(d_off) == decoder_bytes(run), "cpu: data on the device = batches uploaded, bitwise")
    d_on, r_on = run_with("run_vk_on", 6, "--backend", "vulkan", "--data-on-device", "on")
    d_off, r_off = run_with("run_vk_off", 6, "--backend", "vulkan", "--data-on-device", "off")
    if r_on.returncode == 0 and r_off.returncode == 0:
        check("training set on the device" in r_on.stderr, "on says so")
        check(decoder_bytes(d_on) == decoder_bytes(d_off), "vulkan: data on the device = batches uploaded, bitwise")
    # reconstruct
    grid = os.path.join(out, "grid.png")
    r = mgn(tool, "dinovision", "reconstruct", imgs[0], imgs[1], "--run", run, "--out", grid)  # auto: Vulkan where present
    check(r.returncode == 0 and os.path.exists(grid), f"reconstruct writes the grid: {r.stderr[-300:]}")
    if os.path.exists(grid):
        im = Image.open(grid)
        check(im.size == (2 * 64 + 12, 2 * 64 + 12) and im.mode == "RGB", f"grid {im.size} {im.mode}")


if __name__ == "__main__":
    main()
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)
