// Audio in (include/mgn/audio.h): libsndfile reads, libsamplerate resamples, FFTW computes Whisper's log-mel
// spectrogram on the host; log_mel_graph() is the same spectrogram as a graph for a device.
#include "mgn/audio.h"

#include <fftw3.h>
#include <samplerate.h>
#include <sndfile.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <numbers>
#include <thread>

namespace mgn::audio {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

std::string format_name(int format) {
  SF_FORMAT_INFO major{}, minor{};
  major.format = format & SF_FORMAT_TYPEMASK;
  minor.format = format & SF_FORMAT_SUBMASK;
  std::string out;
  if (sf_command(nullptr, SFC_GET_FORMAT_INFO, &major, sizeof(major)) == 0 && major.name) out = major.name;
  if (sf_command(nullptr, SFC_GET_FORMAT_INFO, &minor, sizeof(minor)) == 0 && minor.name)
    out += (out.empty() ? "" : " ") + std::string(minor.name);
  return out.empty() ? "format 0x" + [&] {
    char b[16];
    std::snprintf(b, sizeof(b), "%x", format);
    return std::string(b);
  }() : out;
}

struct SndFile {
  SNDFILE* f = nullptr;
  ~SndFile() {
    if (f) sf_close(f);
  }
};

// Slaney's mel scale (librosa's default, htk = False): linear below 1 kHz, logarithmic above.
double hz_to_mel(double hz) {
  const double min_log_hz = 1000.0, min_log_mel = 15.0, logstep = 27.0 / std::log(6.4);
  return hz >= min_log_hz ? min_log_mel + std::log(hz / min_log_hz) * logstep : 3.0 * hz / 200.0;
}
double mel_to_hz(double mel) {
  const double min_log_hz = 1000.0, min_log_mel = 15.0, logstep = std::log(6.4) / 27.0;
  return mel >= min_log_mel ? min_log_hz * std::exp(logstep * (mel - min_log_mel)) : 200.0 * mel / 3.0;
}

void check_options(const LogMelOptions& o) {
  if (o.sample_rate <= 0 || o.n_fft < 2 || o.n_fft % 2 || o.hop <= 0 || o.n_mels <= 0)
    throw Error("audio::log_mel: sample_rate, hop and n_mels must be positive and n_fft even, got sample_rate " +
                str(o.sample_rate) + ", n_fft " + str(o.n_fft) + ", hop " + str(o.hop) + ", n_mels " + str(o.n_mels));
}

// The filters as sparse rows: for each mel band the first bin and the weights of its non-zero run.
struct MelBank {
  std::vector<int64_t> first;
  std::vector<std::vector<double>> weights;
};

MelBank mel_bank(const LogMelOptions& o) {
  const int64_t bins = o.n_fft / 2 + 1;
  std::vector<double> f = mel_filters(o);
  MelBank b;
  for (int64_t m = 0; m < o.n_mels; ++m) {
    const double* row = f.data() + m * bins;
    int64_t lo = 0, hi = bins;
    while (lo < bins && row[lo] == 0) ++lo;
    while (hi > lo && row[hi - 1] == 0) --hi;
    b.first.push_back(lo);
    b.weights.emplace_back(row + lo, row + hi);
  }
  return b;
}

std::mutex fftw_planner;  // FFTW's planner is not thread-safe; executing a plan on new arrays is.

// The log10 mel power of one signal, [n_mels, frames], before the clamp; returns its maximum.
double log_mel_raw(const std::vector<float>& samples, const LogMelOptions& o, const MelBank& bank, fftw_plan plan,
                   float* out) {
  const int64_t n = int64_t(samples.size()), pad = o.n_fft / 2, bins = o.n_fft / 2 + 1;
  const int64_t frames = n / o.hop;
  std::vector<float> padded = reflect_pad(samples, pad);
  std::vector<double> window(size_t(o.n_fft));
  for (int64_t i = 0; i < o.n_fft; ++i)
    window[size_t(i)] = 0.5 - 0.5 * std::cos(2.0 * std::numbers::pi * double(i) / double(o.n_fft));
  double* in = fftw_alloc_real(size_t(o.n_fft));
  fftw_complex* spec = fftw_alloc_complex(size_t(bins));
  std::vector<double> power(static_cast<size_t>(bins));
  double top = -INFINITY;
  for (int64_t t = 0; t < frames; ++t) {
    const float* src = padded.data() + t * o.hop;
    for (int64_t i = 0; i < o.n_fft; ++i) in[i] = double(src[i]) * window[size_t(i)];
    fftw_execute_dft_r2c(plan, in, spec);
    for (int64_t k = 0; k < bins; ++k) power[size_t(k)] = spec[k][0] * spec[k][0] + spec[k][1] * spec[k][1];
    for (int64_t m = 0; m < o.n_mels; ++m) {
      double acc = 0;
      const std::vector<double>& w = bank.weights[size_t(m)];
      const double* p = power.data() + bank.first[size_t(m)];
      for (size_t k = 0; k < w.size(); ++k) acc += w[k] * p[k];
      const double v = std::log10(std::max(acc, 1e-10));
      top = std::max(top, v);
      out[m * frames + t] = float(v);
    }
  }
  fftw_free(in);
  fftw_free(spec);
  return top;
}

void finish(float* x, int64_t n, double top) {
  const float floor = float(top - 8.0);
  for (int64_t i = 0; i < n; ++i) x[i] = (std::max(x[i], floor) + 4.0f) / 4.0f;
}

}  // namespace

Audio read(const std::string& path) {
  SF_INFO info{};
  SndFile f;
  f.f = sf_open(path.c_str(), SFM_READ, &info);
  if (!f.f) throw Error("cannot read audio file '" + path + "': " + sf_strerror(nullptr));
  Audio a;
  a.sample_rate = info.samplerate;
  a.channels = info.channels;
  a.format = format_name(info.format);
  if (info.channels <= 0 || info.samplerate <= 0)
    throw Error("audio file '" + path + "' declares " + str(info.channels) + " channels at " + str(info.samplerate) +
                " Hz");
  // libsndfile reads a file whose data chunk is shorter than its header says up to where the bytes end, and
  // notes it in its log; such a file lost its end, so refuse it rather than encode part of the sound.
  char log[4096] = {0};
  sf_command(f.f, SFC_GET_LOG_INFO, log, sizeof(log));
  const std::string l(log);
  if (l.find("runcated") != std::string::npos || l.find("should be") != std::string::npos ||
      l.find("exceeds") != std::string::npos)
    throw Error("audio file '" + path + "' is truncated or damaged (its header promises more data than it holds)");
  if (info.frames <= 0) throw Error("audio file '" + path + "' holds no samples");
  if (info.frames > (int64_t(1) << 34) / info.channels)
    throw Error("audio file '" + path + "' is too long (" + str(info.frames) + " frames)");
  std::vector<float> inter(size_t(info.frames * info.channels));
  const sf_count_t got = sf_readf_float(f.f, inter.data(), info.frames);
  if (got != info.frames)
    throw Error("audio file '" + path + "' is truncated: read " + str(got) + " of " + str(info.frames) + " frames");
  a.samples.resize(size_t(info.frames));
  for (int64_t t = 0; t < info.frames; ++t) {
    double acc = 0;
    for (int c = 0; c < info.channels; ++c) acc += inter[size_t(t * info.channels + c)];
    a.samples[size_t(t)] = float(acc / info.channels);
  }
  return a;
}

std::vector<float> resample(const std::vector<float>& samples, int64_t from, int64_t to) {
  if (from <= 0 || to <= 0)
    throw Error("audio::resample: rates must be positive, got " + str(from) + " Hz to " + str(to) + " Hz");
  if (from == to || samples.empty()) return samples;
  const double ratio = double(to) / double(from);
  std::vector<float> out(size_t(std::ceil(double(samples.size()) * ratio)) + 16);
  SRC_DATA d{};
  d.data_in = samples.data();
  d.input_frames = long(samples.size());
  d.data_out = out.data();
  d.output_frames = long(out.size());
  d.src_ratio = ratio;
  d.end_of_input = 1;
  if (int err = src_simple(&d, SRC_SINC_BEST_QUALITY, 1))
    throw Error(std::string("audio::resample: libsamplerate: ") + src_strerror(err));
  out.resize(size_t(d.output_frames_gen));
  return out;
}

std::vector<float> pad_or_trim(const std::vector<float>& samples, int64_t n) {
  if (n < 0) throw Error("audio::pad_or_trim: length must be non-negative, got " + str(n));
  std::vector<float> out(samples.begin(), samples.begin() + std::min<ptrdiff_t>(ptrdiff_t(samples.size()), n));
  out.resize(size_t(n), 0.0f);
  return out;
}

std::vector<float> reflect_pad(const std::vector<float>& x, int64_t pad) {
  const int64_t n = int64_t(x.size());
  if (pad < 0 || n <= pad)
    throw Error("audio: reflect padding by " + str(pad) + " needs more than " + str(pad) + " samples, got " + str(n));
  std::vector<float> out(size_t(n + 2 * pad));
  for (int64_t i = 0; i < pad; ++i) {
    out[size_t(i)] = x[size_t(pad - i)];
    out[size_t(n + pad + i)] = x[size_t(n - 2 - i)];
  }
  std::copy(x.begin(), x.end(), out.begin() + pad);
  return out;
}

std::vector<double> mel_filters(const LogMelOptions& o) {
  check_options(o);
  const int64_t bins = o.n_fft / 2 + 1, M = o.n_mels;
  const double mel_lo = hz_to_mel(0.0), mel_hi = hz_to_mel(double(o.sample_rate) / 2.0);
  std::vector<double> edge(size_t(M + 2));
  for (int64_t i = 0; i < M + 2; ++i) edge[size_t(i)] = mel_to_hz(mel_lo + (mel_hi - mel_lo) * double(i) / double(M + 1));
  std::vector<double> f(size_t(M * bins), 0.0);
  for (int64_t m = 0; m < M; ++m) {
    const double lo = edge[size_t(m)], mid = edge[size_t(m + 1)], hi = edge[size_t(m + 2)];
    const double enorm = 2.0 / (hi - lo);
    for (int64_t k = 0; k < bins; ++k) {
      const double hz = double(o.sample_rate / 2) * double(k) / double(bins - 1);
      const double down = (hz - lo) / (mid - lo), up = (hi - hz) / (hi - mid);
      f[size_t(m * bins + k)] = std::max(0.0, std::min(down, up)) * enorm;
    }
  }
  return f;
}

std::vector<float> log_mel(const std::vector<float>& samples, const LogMelOptions& opt) {
  return log_mel_batch({samples}, opt, 1);
}

std::vector<float> log_mel_batch(const std::vector<std::vector<float>>& signals, const LogMelOptions& o, int threads) {
  check_options(o);
  if (signals.empty()) return {};
  const int64_t n = int64_t(signals[0].size());
  for (const auto& s : signals)
    if (int64_t(s.size()) != n)
      throw Error("audio::log_mel_batch: signals differ in length (" + str(n) + " and " + str(int64_t(s.size())) +
                  " samples); pad_or_trim() them to one length");
  if (n <= o.n_fft / 2)
    throw Error("audio::log_mel: " + str(n) + " samples are too few for n_fft " + str(o.n_fft) +
                " (the reflect padding needs more than n_fft / 2)");
  const int64_t frames = n / o.hop, per = o.n_mels * frames;
  const MelBank bank = mel_bank(o);
  fftw_plan plan;
  {
    std::lock_guard<std::mutex> lock(fftw_planner);
    double* in = fftw_alloc_real(size_t(o.n_fft));
    fftw_complex* out = fftw_alloc_complex(size_t(o.n_fft / 2 + 1));
    plan = fftw_plan_dft_r2c_1d(int(o.n_fft), in, out, FFTW_ESTIMATE);
    fftw_free(in);
    fftw_free(out);
  }
  std::vector<float> out(size_t(per) * signals.size());
  const size_t count = signals.size();
  unsigned workers = threads > 0 ? unsigned(threads) : std::max(1u, std::thread::hardware_concurrency());
  workers = unsigned(std::min<size_t>(workers, count));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < count;) {
      float* dst = out.data() + i * size_t(per);
      finish(dst, per, log_mel_raw(signals[i], o, bank, plan, dst));
    }
  };
  std::vector<std::thread> pool;
  for (unsigned w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  {
    std::lock_guard<std::mutex> lock(fftw_planner);
    fftw_destroy_plan(plan);
  }
  return out;
}

Tensor log_mel(Graph& g, Tensor audio, const LogMelOptions& o) {
  check_options(o);
  if (audio.rank() != 3 || audio.dim(1) != 1 || audio.dim(2) <= o.n_fft + o.n_fft / 2)
    throw Error("audio::log_mel: the audio tensor must be [batch, 1, samples + n_fft] (reflect-padded), got " +
                shape_str(audio.shape()));
  const int64_t batch = audio.dim(0), samples = audio.dim(2) - o.n_fft;
  const int64_t bins = o.n_fft / 2 + 1, frames = samples / o.hop;
  // The windowed DFT basis: rows 0..bins-1 the cosines, bins..2·bins-1 the sines.
  std::vector<float> basis(static_cast<size_t>(2 * bins * o.n_fft));
  for (int64_t k = 0; k < bins; ++k)
    for (int64_t i = 0; i < o.n_fft; ++i) {
      const double w = 0.5 - 0.5 * std::cos(2.0 * std::numbers::pi * double(i) / double(o.n_fft));
      const double a = 2.0 * std::numbers::pi * double((k * i) % o.n_fft) / double(o.n_fft);
      basis[size_t(k * o.n_fft + i)] = float(w * std::cos(a));
      basis[size_t((bins + k) * o.n_fft + i)] = float(-w * std::sin(a));
    }
  std::vector<double> fd = mel_filters(o);
  std::vector<float> filters_t(static_cast<size_t>(bins * o.n_mels));  // [bins, n_mels]
  for (int64_t m = 0; m < o.n_mels; ++m)
    for (int64_t k = 0; k < bins; ++k) filters_t[size_t(k * o.n_mels + m)] = float(fd[size_t(m * bins + k)]);
  // Frames without a gather: the signal cut into hop-long chunks [B, C, hop]; frame t is chunks t .. t+r-1
  // side by side (r = ceil(n_fft / hop)), cut to n_fft. Then the DFT of every frame is one GEMM
  // [B·(frames+1), n_fft] x [n_fft, 2·bins].
  const int64_t f1 = frames + 1, r = (o.n_fft + o.hop - 1) / o.hop, chunks = f1 + r - 1;
  const int64_t len = samples + o.n_fft;
  Tensor x = reshape(audio, {batch, len});
  if (chunks * o.hop > len) x = pad(x, {0, 0, 0, chunks * o.hop - len});
  else if (chunks * o.hop < len) x = slice(x, 1, 0, chunks * o.hop);
  x = reshape(x, {batch, chunks, o.hop});
  std::vector<Tensor> parts;
  for (int64_t j = 0; j < r; ++j) parts.push_back(slice(x, 1, j, j + f1));
  Tensor fr = r == 1 ? parts[0] : concat(parts, 2);                     // [B, frames+1, r·hop]
  if (r * o.hop != o.n_fft) fr = slice(fr, 2, 0, o.n_fft);
  fr = slice(fr, 1, 0, frames);                                          // the last frame is dropped
  Tensor spec = matmul(fr, g.constant({2 * bins, o.n_fft}, basis), false, true);  // [B, frames, 2·bins]
  Tensor power = sum(reshape(square(spec), {batch, frames, 2, bins}), {2});       // [B, frames, bins]
  Tensor mel = transpose(matmul(power, g.constant({bins, o.n_mels}, filters_t)), 1, 2);  // [B, n_mels, frames]
  Tensor lg = log(maximum(mel, g.scalar(1e-10))) * (1.0 / std::log(10.0));
  Tensor top = max(lg, {1, 2}, true);
  return (maximum(lg, top - 8.0) + 4.0) * 0.25;
}

Graph log_mel_graph(int64_t batch, int64_t samples, const LogMelOptions& o) {
  check_options(o);
  if (batch <= 0 || samples <= o.n_fft / 2)
    throw Error("audio::log_mel_graph: needs a positive batch and more than n_fft / 2 samples, got batch " +
                str(batch) + ", " + str(samples) + " samples");
  Graph g;
  g.output("log_mel", log_mel(g, g.input("audio", {batch, 1, samples + o.n_fft}), o));
  return g;
}

}  // namespace mgn::audio
