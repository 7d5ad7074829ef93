"""Whisper's log-mel spectrogram in NumPy (float64) and in torch (torch.stft, float32), for
tests/audio_test.cpp (run through test::run_torch). Written from transformers' WhisperFeatureExtractor
(_np_extract_fbank_features / _torch_extract_fbank_features) and audio_utils.mel_filter_bank, vectorized
differently from src/io/audio.cpp (frames by stride tricks, the filter bank by broadcasting).

Inputs:  "pcm" f32 [n] (16 kHz); "opt" f64 [sample_rate, n_fft, hop, n_mels]
Outputs: "filters" f64 [n_mels, n_fft/2+1]; "np" f32 [n_mels, n/hop] (NumPy float64 path, rounded);
         "torch" f32 [n_mels, n/hop] (torch.stft in float32, as transformers computes on torch)
"""
import sys

import numpy as np
import torch

import torch_io


def hz_to_mel(f):
    f = np.asarray(f, np.float64)
    lin = 3.0 * f / 200.0
    log = 15.0 + np.log(np.maximum(f, 1e-300) / 1000.0) * (27.0 / np.log(6.4))
    return np.where(f >= 1000.0, log, lin)


def mel_to_hz(m):
    m = np.asarray(m, np.float64)
    lin = 200.0 * m / 3.0
    log = 1000.0 * np.exp(np.log(6.4) / 27.0 * (m - 15.0))
    return np.where(m >= 15.0, log, lin)


def filter_bank(sr, n_fft, n_mels):
    fft_freqs = np.linspace(0, sr // 2, n_fft // 2 + 1)
    edges = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(sr / 2.0), n_mels + 2))
    diff = np.diff(edges)
    slopes = edges[None, :] - fft_freqs[:, None]
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    fb = np.maximum(0.0, np.minimum(down, up))
    fb *= (2.0 / (edges[2:n_mels + 2] - edges[:n_mels]))[None, :]
    return fb.T  # [n_mels, bins]


def np_log_mel(pcm, sr, n_fft, hop, n_mels):
    x = np.pad(pcm.astype(np.float64), (n_fft // 2, n_fft // 2), mode="reflect")
    frames = 1 + (len(x) - n_fft) // hop
    idx = np.arange(n_fft)[None, :] + hop * np.arange(frames)[:, None]
    window = np.hanning(n_fft + 1)[:-1]
    spec = np.abs(np.fft.rfft(x[idx] * window, n=n_fft, axis=1)) ** 2  # [frames, bins]
    mel = filter_bank(sr, n_fft, n_mels) @ spec.T                      # [n_mels, frames]
    log = np.log10(np.maximum(mel, 1e-10))[:, :-1]
    log = np.maximum(log, log.max() - 8.0)
    return ((log + 4.0) / 4.0).astype(np.float32)


def torch_log_mel(pcm, sr, n_fft, hop, n_mels):
    w = torch.from_numpy(pcm.astype(np.float32))
    stft = torch.stft(w, n_fft, hop, window=torch.hann_window(n_fft), return_complex=True)
    mag = stft[..., :-1].abs() ** 2
    fb = torch.from_numpy(filter_bank(sr, n_fft, n_mels).T).to(torch.float32)
    log = torch.clamp(fb.T @ mag, min=1e-10).log10()
    log = torch.maximum(log, log.max() - 8.0)
    return (log + 4.0) / 4.0


def main():
    ins = torch_io.read(sys.argv[1])
    sr, n_fft, hop, n_mels = (int(v) for v in ins["opt"].tolist())
    pcm = ins["pcm"].numpy()
    torch_io.write(sys.argv[2], {
        "filters": torch.from_numpy(filter_bank(sr, n_fft, n_mels).copy()),
        "np": torch.from_numpy(np_log_mel(pcm, sr, n_fft, hop, n_mels)),
        "torch": torch_log_mel(pcm, sr, n_fft, hop, n_mels),
    })


if __name__ == "__main__":
    main()
