"""PyTorch side of `mgn bench conv`: conv2d (NCHW, no bias) on the inputs mgn wrote (x, w, the upstream gradient
dy): forward, the gradient of the input and the gradient of the weight, each alone, through
torch.nn.grad.conv2d_input / conv2d_weight (aten's convolution_backward: cuDNN on CUDA, with
cudnn.benchmark on so it picks its fastest algorithm during the warm-up; TF32 off in strict mode).

  python3 bench/pytorch/conv.py --inputs conv.mgn_out.safetensors --outputs conv.torch_out.safetensors \\
      --json conv.torch.jsonl
"""
import torch
import torch.nn.functional as F

from micro_common import run


def phase_fn(case, shape, phase, t):
    stride, pad = int(shape["stride"]), int(shape["padding"])
    x, w, dy = t["x"], t["w"], t["dy"]
    state = {}
    if phase == "forward":
        def fn():
            with torch.no_grad():
                state["v"] = F.conv2d(x, w, stride=stride, padding=pad)
        name = "out"
    elif phase == "grad_input":
        def fn():
            state["v"] = torch.nn.grad.conv2d_input(x.shape, w, dy, stride=stride, padding=pad)
        name = "grad.x"
    elif phase == "grad_weight":
        def fn():
            state["v"] = torch.nn.grad.conv2d_weight(x, w.shape, dy, stride=stride, padding=pad)
        name = "grad.w"
    else:
        raise SystemExit(f"conv.py: unknown phase '{phase}' (forward, grad_input, grad_weight)")

    def result():
        fn()
        return {name: state["v"]}
    return fn, result


if __name__ == "__main__":
    run(__doc__, "conv", lambda device: "cudnn" if device.type == "cuda" else "aten-cpu", phase_fn)
