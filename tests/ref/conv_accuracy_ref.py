"""PyTorch's own f32 error on a long-K convolution (tests/vulkan_conv_accuracy_test.cpp, via test::run_torch).

Inputs: "x" f32 [N, C, H, W], "w" f32 [Co, C, kh, kw], "dy" f32 (the output's shape), "pad" f64 [1]. For
y = conv2d(x, w), dx and dw (the derivatives for the upstream gradient dy), outputs "<name>.f64" (float64 from
the same f32 values) and "<name>.err32" (f64 [1]: rel-L2 of torch's float32 result against it), the tolerance
the test holds our Vulkan kernels to.
"""
import sys

import torch

import torch_io


def run(ins, dtype, pad):
    x = ins["x"].to(dtype).requires_grad_(True)
    w = ins["w"].to(dtype).requires_grad_(True)
    y = torch.nn.functional.conv2d(x, w, padding=pad)
    y.backward(ins["dy"].to(dtype))
    return {"y": y.detach(), "dx": x.grad, "dw": w.grad}


def main():
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False  # oneDNN's f32 conv backward is wrong in Debian's torch 1.13
    ins = torch_io.read(sys.argv[1])
    pad = int(ins["pad"][0])
    exact, f32 = run(ins, torch.float64, pad), run(ins, torch.float32, pad)
    out = {}
    for k, e in exact.items():
        out[k + ".f64"] = e
        err = (f32[k].double() - e).norm() / e.norm()
        out[k + ".err32"] = err.reshape(1)
    torch_io.write(sys.argv[2], out)


if __name__ == "__main__":
    main()
