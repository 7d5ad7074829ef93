"""Audio and the Whisper encoder through the module: a WAV file read back against the samples written, the
log-mel spectrogram against tests/ref/logmel_ref.py (NumPy float64), and the encoder states of a reduced
Whisper directory against the plain-torch encoder of tests/ref/whisper_ref.py on the same weights."""
import json
import os
import sys

import numpy as np
import pytest

import meganeura as mg

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "ref"))
import logmel_ref  # noqa: E402
import whisper_encode_check as wec  # noqa: E402  (its model config, WAV writer and sinusoids)
import whisper_ref  # noqa: E402


def tone(n, rate=16000):
    t = np.arange(n) / rate
    return 0.3 * np.sin(2 * np.pi * (180 * t + 60 * t * t)) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))


def test_wav_and_log_mel(workdir):
    sig = tone(16000)
    path = str(workdir / "a.wav")
    wec.wav(path, sig, 16000)
    samples, rate, channels, fmt = mg.audio.read(path)
    want = np.clip(np.round(sig * 32767), -32768, 32767) / 32768.0  # 16-bit PCM as libsndfile scales it
    assert (rate, channels) == (16000, 1) and "16" in fmt
    np.testing.assert_allclose(samples, want, atol=1e-7)
    mel = mg.audio.log_mel(samples)
    ref = logmel_ref.np_log_mel(samples, 16000, 400, 160, 80)
    assert mel.shape == ref.shape == (80, 100)
    np.testing.assert_allclose(mel, ref, atol=2e-5)


def test_whisper_encoder_matches_torch(opts, workdir):
    cfg = wec.CFG
    d, f_, m = cfg["d_model"], cfg["encoder_ffn_dim"], cfg["num_mel_bins"]
    model = workdir / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(5)
    shapes = {"conv1.weight": (d, m, 3), "conv1.bias": (d,), "conv2.weight": (d, d, 3), "conv2.bias": (d,),
              "layer_norm.weight": (d,), "layer_norm.bias": (d,)}
    for i in range(cfg["encoder_layers"]):
        p = f"layers.{i}."
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes[p + f"self_attn.{n}.weight"] = (d, d)
            if n != "k_proj":
                shapes[p + f"self_attn.{n}.bias"] = (d,)
        shapes.update({p + "self_attn_layer_norm.weight": (d,), p + "self_attn_layer_norm.bias": (d,),
                       p + "fc1.weight": (f_, d), p + "fc1.bias": (f_,), p + "fc2.weight": (d, f_),
                       p + "fc2.bias": (d,), p + "final_layer_norm.weight": (d,), p + "final_layer_norm.bias": (d,)})
    w = {k: ((rng.random(s) * 2 - 1) / np.sqrt(np.prod(s[1:]) if len(s) > 1 else 100.0)
             + (1.0 if k.endswith("norm.weight") else 0.0)).astype(np.float32) for k, s in shapes.items()}
    w["embed_positions.weight"] = wec.sinusoids(cfg["max_source_positions"], d).numpy().astype(np.float32)
    mg.save_safetensors(str(model / "model.safetensors"), {"model.encoder." + k: v for k, v in w.items()})

    c = mg.whisper.Config.from_file(str(model / "config.json"))
    pcm = np.zeros(480000, np.float32)
    pcm[:32000] = tone(32000)
    mel = mg.audio.log_mel(pcm)
    s = mg.compile(mg.whisper.encoder_graph(c, batch=1), **opts)
    mg.whisper.load_weights(s, c, str(model))
    got = s.run({"mel": mel[None]})["last_hidden_state"]
    ref = whisper_ref.encoder({k: torch.from_numpy(v).double() for k, v in w.items()},
                              torch.from_numpy(mel).double()[None], d, cfg["encoder_layers"],
                              cfg["encoder_attention_heads"]).numpy()
    assert got.shape == ref.shape == (1, 1500, d)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-4
