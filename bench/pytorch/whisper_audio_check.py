"""Real speech through both front ends (bench/h200.sh job whisper-audio): our 16-kHz samples and log-mel
spectrograms (`mgn whisper-encode --dump-features`) against transformers' WhisperFeatureExtractor on the same
samples (gate: max abs <= 1e-4), and our encoder states (`--out`) against transformers' WhisperEncoder on the
extractor's features with the same weights (strict f32; gate: rel-L2 <= 1e-3). One JSON line per clip.

  python3 bench/pytorch/whisper_audio_check.py --features feat.safetensors --states states.safetensors \\
      --model MODEL_DIR [--device cuda]
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite  # noqa: E402
from timing import set_mode  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--features", required=True)
    ap.add_argument("--states", required=True)
    ap.add_argument("--model", required=True, help="the directory mgn whisper-encode read (config.json, model.safetensors)")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    from transformers import WhisperConfig, WhisperFeatureExtractor
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    set_mode("strict")
    feats, _ = safetensors_lite.read(args.features)
    states, _ = safetensors_lite.read(args.states)
    weights, _ = safetensors_lite.read(os.path.join(args.model, "model.safetensors"))
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    enc = WhisperEncoder(WhisperConfig(**cfg)).to(args.device).eval()
    enc.load_state_dict({k.removeprefix("model.encoder."): torch.from_numpy(v.astype(np.float32)) for k, v in weights.items()})
    fe = WhisperFeatureExtractor(feature_size=80, sampling_rate=16000, n_fft=400, hop_length=160, chunk_length=30)
    failed = 0
    for name in sorted(k[:-4] for k in feats if k.endswith(".pcm")):
        pcm = feats[name + ".pcm"].astype(np.float32)
        ref = fe(pcm, sampling_rate=16000, return_tensors="np").input_features[0]
        ours = feats[name + ".log_mel"]
        fe_err = float(np.max(np.abs(ours.astype(np.float64) - ref.astype(np.float64))))
        with torch.no_grad():
            h = enc(torch.from_numpy(ref)[None].to(args.device)).last_hidden_state[0].double().cpu().numpy()
        got = states[name].astype(np.float64)
        st_err = float(np.linalg.norm(got - h) / np.linalg.norm(h))
        ok = fe_err <= 1e-4 and st_err <= 1e-3
        failed += not ok
        print(json.dumps({"clip": os.path.basename(name), "features_max_abs": fe_err, "states_rel_l2": st_err,
                          "gate": "pass" if ok else "FAIL", "extractor": type(fe).__name__}), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
