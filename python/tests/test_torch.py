"""The module against PyTorch on the same weights: a small CNN's logits, and the losses and weights of an
MLP over five AdamW steps (torch.optim.AdamW, same hyperparameters)."""
import numpy as np
import pytest

import meganeura as mg

torch = pytest.importorskip("torch")


def test_cnn_forward_matches_torch(opts):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 1, 8, 8)).astype(np.float32)
    conv = torch.nn.Conv2d(1, 4, 3, padding=1)
    fc = torch.nn.Linear(4 * 4 * 4, 5)
    with torch.no_grad():
        want = fc(torch.nn.functional.max_pool2d(torch.relu(conv(torch.from_numpy(x))), 2).flatten(1)).numpy()

    g = mg.Graph()
    xi = g.input("x", [2, 1, 8, 8])
    h = mg.nn.conv2d(g, "conv", xi, 4, 3, padding=[1, 1])
    h = mg.flatten(mg.max_pool2d(mg.relu(h)))
    g.output("logits", mg.nn.linear(g, "fc", h, 5))
    s = mg.compile(g, **opts)
    s.load_state_dict({"conv.weight": conv.weight.detach().numpy(), "conv.bias": conv.bias.detach().numpy(),
                       "fc.weight": fc.weight.detach().numpy(), "fc.bias": fc.bias.detach().numpy()})
    np.testing.assert_allclose(s.run({"x": x})["logits"], want, rtol=1e-4, atol=1e-5)


def test_mlp_adamw_steps_match_torch(opts):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    names = {"fc1.weight": model[0].weight, "fc1.bias": model[0].bias,
             "fc2.weight": model[2].weight, "fc2.bias": model[2].bias}
    g = mg.Graph()
    x = g.input("x", [8, 6])
    y = g.input("labels", [8], "i32")
    h = mg.relu(mg.nn.linear(g, "fc1", x, 16))
    g.output("loss", mg.cross_entropy(mg.nn.linear(g, "fc2", h, 3), y))
    s = mg.compile(g, mode="train", optimizer=mg.AdamW(lr=1e-2, weight_decay=0.1), **opts)
    s.load_state_dict({k: v.detach().numpy() for k, v in names.items()})

    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    rng = np.random.default_rng(2)
    for step in range(5):
        xb = rng.standard_normal((8, 6)).astype(np.float32)
        yb = rng.integers(0, 3, 8).astype(np.int32)
        s.step({"x": xb, "labels": yb})
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(xb)), torch.from_numpy(yb).long())
        loss.backward()
        opt.step()
        assert abs(s.read_scalar("loss") - loss.item()) < 1e-5, step
    for k, v in names.items():
        np.testing.assert_allclose(s.read(k), v.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=k)
