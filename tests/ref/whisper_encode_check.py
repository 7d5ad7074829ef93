"""`mgn whisper-encode` end to end (ctest WhisperEncodeCli): a reduced Whisper model directory written here
(config.json + model.safetensors under WhisperForConditionalGeneration's names, a decoder tensor included), WAV
files written here, and the encoder states compared with the NumPy log-mel (tests/ref/logmel_ref.py) fed to the
plain-torch encoder (tests/ref/whisper_ref.py) in float64. Also: a 48 kHz stereo file goes through the
resampler, audio over 30 s is refused unless --long chunk, a truncated file fails naming it before any compile.

  python3 tests/ref/whisper_encode_check.py MGN OUT_DIR
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import logmel_ref  # noqa: E402
import st_io  # noqa: E402
import whisper_ref  # noqa: E402

CFG = {"d_model": 64, "encoder_layers": 1, "encoder_attention_heads": 4, "encoder_ffn_dim": 96, "num_mel_bins": 80,
       "max_source_positions": 1500, "activation_function": "gelu", "model_type": "whisper", "decoder_layers": 1}
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def wav(path, samples, rate, channels=1):
    pcm = np.clip(np.round(samples * 32767), -32768, 32767).astype("<i2").tobytes()
    hdr = b"RIFF" + struct.pack("<I", 36 + len(pcm)) + b"WAVEfmt " + struct.pack(
        "<IHHIIHH", 16, 1, channels, rate, rate * channels * 2, channels * 2, 16) + b"data" + struct.pack("<I", len(pcm))
    with open(path, "wb") as f:
        f.write(hdr + pcm)


def sinusoids(length, channels):
    inv = torch.exp(-np.log(10000) / (channels // 2 - 1) * torch.arange(channels // 2))
    t = torch.arange(length)[:, None] * inv[None, :]
    return torch.cat([t.sin(), t.cos()], dim=1)


def main():
    mgn, out = sys.argv[1], sys.argv[2]
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out + "/model")
    with open(out + "/model/config.json", "w") as f:
        json.dump(CFG, f)
    g = torch.Generator().manual_seed(5)
    d, f_, m = CFG["d_model"], CFG["encoder_ffn_dim"], CFG["num_mel_bins"]
    shapes = {"conv1.weight": (d, m, 3), "conv1.bias": (d,), "conv2.weight": (d, d, 3), "conv2.bias": (d,),
              "layer_norm.weight": (d,), "layer_norm.bias": (d,)}
    for i in range(CFG["encoder_layers"]):
        p = f"layers.{i}."
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes[p + f"self_attn.{n}.weight"] = (d, d)
            if n != "k_proj":
                shapes[p + f"self_attn.{n}.bias"] = (d,)
        shapes.update({p + "self_attn_layer_norm.weight": (d,), p + "self_attn_layer_norm.bias": (d,),
                       p + "fc1.weight": (f_, d), p + "fc1.bias": (f_,), p + "fc2.weight": (d, f_),
                       p + "fc2.bias": (d,), p + "final_layer_norm.weight": (d,), p + "final_layer_norm.bias": (d,)})
    w = {}
    for k, s in shapes.items():
        fan = np.prod(s[1:]) if len(s) > 1 else 100.0
        w[k] = (torch.rand(s, generator=g) * 2 - 1) / np.sqrt(fan) + (1.0 if k.endswith("norm.weight") else 0.0)
    w["embed_positions.weight"] = sinusoids(CFG["max_source_positions"], d)
    stored = {"model.encoder." + k: v.float() for k, v in w.items()}
    stored["model.decoder.layer_norm.weight"] = torch.ones(d)
    st_io.write(out + "/model/model.safetensors", {k: v.numpy() for k, v in stored.items()})

    # 16 kHz speech-like audio (a gliding harmonic tone with noise, 2.5 s) and a second clip at 0.5 s.
    rng = np.random.default_rng(3)
    t = np.arange(40000) / 16000.0
    a = 0.3 * np.sin(2 * np.pi * (180 * t + 60 * t * t)) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t)) + 0.01 * rng.standard_normal(t.size)
    b = 0.5 * np.sin(2 * np.pi * 440 * t[:8000])
    wav(out + "/a.wav", a, 16000)
    wav(out + "/b.wav", b, 16000)
    r = subprocess.run([mgn, "whisper-encode", out + "/a.wav", out + "/b.wav", "--model", out + "/model", "--batch", "2",
                        "--out", out + "/states.safetensors"], capture_output=True, text=True)
    print(r.stdout, r.stderr)
    check(r.returncode == 0, "mgn whisper-encode a.wav b.wav exits 0")
    if r.returncode == 0:
        got = st_io.read(out + "/states.safetensors")
        for name, sig in (("a.wav", a), ("b.wav", b)):
            # The WAV holds 16-bit samples: the reference starts from the same quantized values.
            q = np.clip(np.round(sig * 32767), -32768, 32767) / 32768.0
            pcm = np.zeros(480000)
            pcm[:q.size] = q
            mel = logmel_ref.np_log_mel(pcm.astype(np.float32), 16000, 400, 160, 80)
            ww = {k: v.double() for k, v in w.items()}
            ref = whisper_ref.encoder(ww, torch.from_numpy(mel).double()[None], d, CFG["encoder_layers"],
                                      CFG["encoder_attention_heads"])[0].numpy()
            ours = got[out + "/" + name].astype(np.float64)
            err = np.linalg.norm(ours - ref) / np.linalg.norm(ref)
            check(ours.shape == ref.shape and err < 1e-4, f"{name}: encoder states vs NumPy log-mel + torch f64: rel-L2 {err:.2e}")

    # The spectrogram inside the encoder's graph (on the device): the same states, to the f32 DFT's accuracy.
    r2 = subprocess.run([mgn, "whisper-encode", out + "/a.wav", out + "/b.wav", "--model", out + "/model", "--batch", "2",
                         "--features", "graph", "--out", out + "/states_graph.safetensors"], capture_output=True, text=True)
    check(r2.returncode == 0, f"--features graph exits 0: {r2.stderr.strip()[-200:]}")
    if r.returncode == 0 and r2.returncode == 0:
        host, dev = st_io.read(out + "/states.safetensors"), st_io.read(out + "/states_graph.safetensors")
        for name in ("a.wav", "b.wav"):
            k = out + "/" + name
            err = np.linalg.norm(dev[k] - host[k]) / np.linalg.norm(host[k])
            check(err < 1e-3, f"{name}: --features graph vs host: rel-L2 {err:.2e}")

    # 48 kHz stereo (two different channels) goes through the mixdown and the resampler.
    t48 = np.arange(48000) / 48000.0
    st = np.stack([0.4 * np.sin(2 * np.pi * 300 * t48), 0.2 * np.sin(2 * np.pi * 500 * t48)], axis=1).ravel()
    wav(out + "/stereo48k.wav", st, 48000, channels=2)
    r = subprocess.run([mgn, "whisper-encode", out + "/stereo48k.wav", "--model", out + "/model"], capture_output=True, text=True)
    check(r.returncode == 0 and "2 channel(s), 48000 Hz" in r.stderr and "[1500, 64]" in r.stdout,
          f"a 48 kHz stereo file is mixed down and resampled: {r.stderr.strip()[:200]}")

    # 40 s: refused by default (exit 1, names the file and --long), two windows with --long chunk.
    wav(out + "/long.wav", 0.1 * np.sin(2 * np.pi * 220 * np.arange(640000) / 16000.0), 16000)
    r = subprocess.run([mgn, "whisper-encode", out + "/long.wav", "--model", out + "/model"], capture_output=True, text=True)
    check(r.returncode == 1 and "long.wav" in r.stderr and "--long chunk" in r.stderr, f"40 s refused: {r.stderr.strip()}")
    r = subprocess.run([mgn, "whisper-encode", out + "/long.wav", "--model", out + "/model", "--long", "chunk"],
                       capture_output=True, text=True)
    check(r.returncode == 0 and "long.wav#0" in r.stdout and "long.wav#1" in r.stdout, "40 s with --long chunk: 2 windows")

    # A truncated file: exit 1, the file named, nothing compiled (no "ready in" line).
    with open(out + "/a.wav", "rb") as f:
        data = f.read()
    with open(out + "/cut.wav", "wb") as f:
        f.write(data[:len(data) // 3])
    r = subprocess.run([mgn, "whisper-encode", out + "/a.wav", out + "/cut.wav", "--model", out + "/model"],
                       capture_output=True, text=True)
    check(r.returncode == 1 and "cut.wav" in r.stderr and "ready in" not in r.stderr, f"truncated file: {r.stderr.strip()[-200:]}")
    # A model directory missing a tensor: the tensor and the file named, before anything compiles.
    del stored["model.encoder.layers.0.fc1.bias"]
    os.makedirs(out + "/broken")
    shutil.copy(out + "/model/config.json", out + "/broken/config.json")
    st_io.write(out + "/broken/model.safetensors", {k: v.numpy() for k, v in stored.items()})
    r = subprocess.run([mgn, "whisper-encode", out + "/b.wav", "--model", out + "/broken"], capture_output=True, text=True)
    check(r.returncode == 1 and "layers.0.fc1.bias" in r.stderr and "ready in" not in r.stderr,
          f"missing tensor: {r.stderr.strip()[-200:]}")
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)


if __name__ == "__main__":
    main()
