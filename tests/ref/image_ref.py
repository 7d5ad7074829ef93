"""Image decoding and preprocessing references for tests/image_test.cpp (run through test::run_torch): PIL
decodes (libjpeg-turbo / libpng / libwebp underneath, convert("RGB")), torchvision preprocesses the float
tensor (Resize(256, antialias=True), CenterCrop(224), Normalize(ImageNet)). It also writes the converted
formats the C++ side must read (gray, palette, alpha, 16-bit PNG; gray JPEG; lossy and lossless WebP) into
the directory it is given.

Inputs:  "dir" f64 [n] (a directory path as character codes), "paths" f64 [m] (image paths, '\n'-separated)
Outputs: per image i: "raw.i" [3, H, W] in [0, 1] (PIL's decode), "pre.i" [3, 224, 224] (torchvision);
         per written file k: "made.k" [3, H, W] and the file <dir>/made_k.<ext>; "made_names": '\n'-joined names
"""
import os
import sys

import numpy as np
import torch
import torchvision.transforms as T
from PIL import Image

import torch_io


def text(t):
    return "".join(chr(int(v)) for v in t.tolist())


def to_codes(s):
    return torch.tensor([float(ord(c)) for c in s], dtype=torch.float64)


def tv_preprocess(x):
    x = T.Resize(256, interpolation=T.InterpolationMode.BILINEAR, antialias=True)(x)
    x = T.CenterCrop(224)(x)
    return T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])(x)


def rgb_tensor(img):
    a = np.asarray(img.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(a).permute(2, 0, 1).contiguous()


def main():
    ins = torch_io.read(sys.argv[1])
    out_dir = text(ins["dir"])
    paths = [p for p in text(ins["paths"]).split("\n") if p]
    res = {}
    for i, p in enumerate(paths):
        x = rgb_tensor(Image.open(p))
        res[f"raw.{i}"] = x
        res[f"pre.{i}"] = tv_preprocess(x)

    # Converted formats, made from the first photo (cut to 96 x 80 to stay small).
    base = Image.open(paths[0]).convert("RGB").crop((0, 0, 80, 96))
    made = []
    gray = base.convert("L")
    made.append(("gray.png", gray, rgb_tensor(gray)))
    rgba = base.copy()
    rgba.putalpha(Image.linear_gradient("L").resize(base.size))
    made.append(("rgba.png", rgba, rgb_tensor(rgba)))
    made.append(("gray_alpha.png", rgba.convert("LA"), rgb_tensor(rgba.convert("LA").convert("L"))))
    pal = base.convert("P", palette=Image.ADAPTIVE, colors=32)
    made.append(("palette.png", pal, rgb_tensor(pal)))
    made.append(("gray.jpg", gray, None))  # decoded by PIL after writing (JPEG is lossy)
    made.append(("lossless.webp", base, rgb_tensor(base)))
    made.append(("lossy.webp", base, None))
    names = []
    for k, (name, img, want) in enumerate(made):
        path = os.path.join(out_dir, name)
        if name.endswith(".webp"):
            img.save(path, lossless=name.startswith("lossless"), quality=90)
        else:
            img.save(path)
        if want is None:
            want = rgb_tensor(Image.open(path))
        res[f"made.{k}"] = want
        names.append(name)
    # 16-bit gray PNG (values spread over the full 16-bit range), and 16-bit RGB written by raw numpy via PIL's I;16.
    g16 = (np.asarray(gray, dtype=np.uint32) * 257 + np.arange(gray.size[0])[None, :] % 7).astype(np.uint16)
    path = os.path.join(out_dir, "gray16.png")
    Image.fromarray(g16, mode="I;16").save(path)
    back = np.asarray(Image.open(path), dtype=np.float64)
    assert back.max() > 255, "PIL did not keep 16 bits"
    v = torch.from_numpy(g16.astype(np.float64) / 65535.0).float()
    res[f"made.{len(names)}"] = v[None].expand(3, -1, -1).contiguous()
    names.append("gray16.png")
    res["made_names"] = to_codes("\n".join(names))
    torch_io.write(sys.argv[2], res)


if __name__ == "__main__":
    main()
