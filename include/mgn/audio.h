// Audio in: sound files read with libsndfile (WAV 8/16/24/32-bit PCM and float, and the other formats
// libsndfile knows), mixed down to mono, resampled with libsamplerate, and turned into the log-mel
// spectrogram Whisper's feature extractor computes:
//
//   mgn::audio::Audio a = mgn::audio::read("speech.wav");                   // any rate, any channel count
//   std::vector<float> pcm = mgn::audio::resample(a.samples, a.sample_rate, 16000);
//   std::vector<float> mel = mgn::audio::log_mel(mgn::audio::pad_or_trim(pcm, 480000));   // [80, 3000]
//
// The spectrogram: a periodic Hann window of n_fft samples, frames every hop samples of the signal reflect-
// padded by n_fft / 2 at both ends (torch.stft's center = True), the power |X|² of the first n_fft / 2 + 1
// bins, Slaney-normalized mel filters on the Slaney mel scale from 0 Hz to sample_rate / 2, the last frame
// dropped, log10(max(·, 1e-10)), clamped from below to (its maximum − 8), then (x + 4) / 4. The FFT runs
// in double precision (FFTW); the result is rounded to f32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mgn/graph.h"

namespace mgn::audio {

struct Audio {
  std::vector<float> samples;  // mono, in [-1, 1] for PCM sources
  int64_t sample_rate = 0;
  int64_t channels = 0;        // of the file (the samples are their mean)
  std::string format;          // e.g. "WAV PCM 16-bit"
};

// Throws mgn::Error naming the file when it cannot be opened, is not a sound file libsndfile reads, holds no
// samples, or is shorter than its header says (a truncated file is refused, not read in part).
Audio read(const std::string& path);

// Band-limited resampling (libsamplerate, SRC_SINC_BEST_QUALITY). Rates must be positive; a rate equal to
// `from` returns the samples unchanged.
std::vector<float> resample(const std::vector<float>& samples, int64_t from, int64_t to);

// Zero-pads or cuts to exactly n samples (Whisper's 30-s window: 480,000 at 16 kHz).
std::vector<float> pad_or_trim(const std::vector<float>& samples, int64_t n);

struct LogMelOptions {
  int64_t sample_rate = 16000;
  int64_t n_fft = 400;
  int64_t hop = 160;
  int64_t n_mels = 80;
};

// Slaney mel filters [n_mels, n_fft / 2 + 1] (librosa.filters.mel(norm = "slaney") and transformers'
// mel_filter_bank(norm = "slaney", mel_scale = "slaney") compute the same).
std::vector<double> mel_filters(const LogMelOptions& opt = {});

// The log-mel spectrogram of one signal: [n_mels, samples / hop] (for 480,000 samples: [80, 3000]).
// Throws for fewer than n_fft / 2 + 1 samples (the reflect padding needs them).
std::vector<float> log_mel(const std::vector<float>& samples, const LogMelOptions& opt = {});
// Many signals of one length, on up to `threads` threads (0: one per core): [count, n_mels, frames].
std::vector<float> log_mel_batch(const std::vector<std::vector<float>>& signals, const LogMelOptions& opt = {},
                                 int threads = 0);

// The same spectrogram as a graph, for a GPU: input "audio" f32 [batch, 1, samples + n_fft] (each signal
// reflect-padded by n_fft / 2 at both ends: reflect_pad()) -> output "log_mel" [batch, n_mels, samples / hop].
// The frames are cut by reshapes and slices, and their DFT is one GEMM with the windowed cos/sin basis, in f32.
Graph log_mel_graph(int64_t batch, int64_t samples, const LogMelOptions& opt = {});
// The same computation appended to a graph: audio [batch, 1, samples + n_fft] -> [batch, n_mels, samples / hop].
Tensor log_mel(Graph& g, Tensor audio, const LogMelOptions& opt = {});
std::vector<float> reflect_pad(const std::vector<float>& samples, int64_t pad);

}  // namespace mgn::audio
