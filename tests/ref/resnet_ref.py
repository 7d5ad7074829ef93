"""torchvision ResNet reference for tests/resnet_test.cpp (run through test::run_torch).

The model is torchvision's own: torchvision.models.resnet{18,34,50,101,152} at width 64; for a narrower
test model (width < 64) torchvision's ResNet class is reused with its stem and stage widths scaled (its
_make_layer, BasicBlock/Bottleneck, forward and weight init are torchvision's code). After torchvision's
init (kaiming_normal_ fan_out for convs, BN 1/0, nn.Linear default for fc) the BN affine parameters and
running statistics are perturbed, so that a swapped, dropped or mis-named BN tensor changes the result.

Inputs:  "cfg" f64 [depth, width, num_classes, seed, float64, grads, adamw_step, lr, beta1, beta2, eps, wd],
         "x" f32 [B, 3, H, W], "labels" i32 [B].
Outputs: "w.<key>"        every state_dict tensor before the step (num_batches_tracked excluded)
         "eval.logits"    model.eval() forward (running statistics)
         "train.logits", "train.loss"   model.train() forward (batch statistics) and mean cross-entropy
         "running.<key>"  running_mean / running_var after that train-mode forward
         "grad.<param>"   (grads) d loss / d param of that forward, for every parameter
         "step.<param>"   (adamw_step) the parameter after one torch.optim.AdamW step on those gradients
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

import torch_io

LAYERS = {18: (BasicBlock, [2, 2, 2, 2]), 34: (BasicBlock, [3, 4, 6, 3]), 50: (Bottleneck, [3, 4, 6, 3]),
          101: (Bottleneck, [3, 4, 23, 3]), 152: (Bottleneck, [3, 8, 36, 3])}


class NarrowResNet(ResNet):
    """torchvision's ResNet with base width `width` instead of 64 (same modules, names and init)."""

    def __init__(self, block, layers, width, num_classes):
        nn.Module.__init__(self)
        self._norm_layer = nn.BatchNorm2d
        self.inplanes, self.dilation, self.groups, self.base_width = width, 1, 1, 64
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(block, width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(block, width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8 * block.expansion, num_classes)
        for m in self.modules():  # as ResNet.__init__ (zero_init_residual=False)
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)


def build(depth, width, num_classes):
    if width == 64:
        return getattr(torchvision.models, f"resnet{depth}")(weights=None, num_classes=num_classes)
    block, layers = LAYERS[depth]
    return NarrowResNet(block, layers, width, num_classes)


def run(t):
    c = [float(v) for v in t["cfg"]]
    depth, width, classes, seed = int(c[0]), int(c[1]), int(c[2]), int(c[3])
    f64, grads, adamw = bool(c[4]), bool(c[5]), bool(c[6])
    lr, b1, b2, eps, wd = c[7:12]
    torch.manual_seed(seed)
    model = build(depth, width, classes)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.weight.copy_(1 + 0.2 * torch.randn(n))
                m.bias.copy_(0.1 * torch.randn(n))
                m.running_mean.copy_(0.1 * torch.randn(n))
                m.running_var.copy_(0.5 + torch.rand(n))
    if f64:
        model = model.double()
    dt = torch.float64 if f64 else torch.float32
    out = {"w." + k: v.clone() for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    x, labels = t["x"].to(dt), t["labels"].long()

    model.eval()
    with torch.no_grad():
        out["eval.logits"] = model(x)

    model.train()
    logits = model(x)
    loss = F.cross_entropy(logits, labels)
    out["train.logits"], out["train.loss"] = logits.detach(), loss.detach().reshape(1)
    for k, v in model.state_dict().items():
        if k.endswith("running_mean") or k.endswith("running_var"):
            out["running." + k] = v.clone()
    if grads or adamw:
        loss.backward()
        for k, p in model.named_parameters():
            out["grad." + k] = p.grad.clone()
    if adamw:
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
        opt.step()
        for k, p in model.named_parameters():
            out["step." + k] = p.detach().clone()
    return out


if __name__ == "__main__":
    torch_io.main(run)
