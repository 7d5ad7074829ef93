// `mgn whisper-encode`: sound files -> Whisper encoder states. Every file is read, resampled to 16 kHz and
// checked, and the model directory's config and weights are read, before anything compiles; then one
// encoder session (compiled once for --batch rows) encodes the files batch by batch, the log-mel
// spectrograms computed on the host (FFTW, one thread per core) while nothing else waits on them.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"
#include "mgn/audio.h"
#include "mgn/safetensors.h"
#include "mgn/whisper.h"

namespace mgn::tool {

namespace {

constexpr int64_t kRate = 16000, kWindow = 30 * kRate;  // Whisper's 30-s window
// --features auto: the largest batch at which the in-graph spectrogram is used on a GPU (run 10, H100: graph
// 7.1 ms vs host 15.4 ms per batch of 1; host 141 ms vs graph 192 ms per batch of 16).
constexpr int64_t kGraphFeaturesMaxBatch = 4;

struct WhisperArgs {
  std::vector<std::string> audio;
  std::string model, out, long_audio = "refuse", features = "auto", dump_features;
  int64_t batch = 0, repeat = 1;
  CompileFlags compile;
};

// One 30-s window of one file.
struct Clip {
  std::string name;  // the file, with "#k" for the k-th window of a chunked file
  std::vector<float> pcm;
};

int whisper_encode(const WhisperArgs& a, const Context& c) {
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  // Inputs first: a bad file fails here, before the weights are read or anything compiles.
  std::vector<Clip> clips;
  for (const std::string& path : a.audio) {
    audio::Audio in = audio::read(path);
    std::vector<float> pcm = audio::resample(in.samples, in.sample_rate, kRate);
    const double seconds = double(in.samples.size()) / double(in.sample_rate);
    if (int64_t(pcm.size()) > kWindow) {
      if (a.long_audio == "refuse")
        throw Error("'" + path + "' is " + std::to_string(seconds) +
                    " s long; the encoder sees 30 s at a time: give --long chunk to encode it as consecutive "
                    "30-s windows (nothing is cut silently)");
      const int64_t n = (int64_t(pcm.size()) + kWindow - 1) / kWindow;
      for (int64_t k = 0; k < n; ++k) {
        auto first = pcm.begin() + k * kWindow;
        auto last = pcm.begin() + std::min<int64_t>(int64_t(pcm.size()), (k + 1) * kWindow);
        clips.push_back({path + "#" + std::to_string(k), audio::pad_or_trim({first, last}, kWindow)});
      }
    } else {
      clips.push_back({path, audio::pad_or_trim(pcm, kWindow)});
    }
    std::fprintf(stderr, "%s: %s, %lld channel(s), %lld Hz, %.2f s\n", path.c_str(), in.format.c_str(),
                 (long long)in.channels, (long long)in.sample_rate, seconds);
  }
  const std::string cfg_path = a.model + "/config.json";
  whisper::Config cfg = whisper::Config::from_file(cfg_path);
  if (cfg.num_mel_bins != 80 || cfg.frames() != 3000)
    throw Error(cfg_path + ": num_mel_bins " + std::to_string(cfg.num_mel_bins) + " and max_source_positions " +
                std::to_string(cfg.max_source_positions) + " differ from the 80-mel, 30-s front end this command uses");
  auto weights = whisper::read_weights(cfg, a.model);
  if (!a.out.empty()) {
    const std::filesystem::path parent = std::filesystem::absolute(a.out).parent_path();
    if (!std::filesystem::is_directory(parent))
      throw UsageError("--out " + a.out + ": the folder " + parent.string() + " does not exist");
  }

  if (!a.dump_features.empty()) {
    std::vector<StoredTensor> f;
    for (const Clip& clip : clips) {
      f.push_back(StoredTensor::from_f32(clip.name + ".pcm", {kWindow}, clip.pcm));
      f.push_back(StoredTensor::from_f32(clip.name + ".log_mel", {80, 3000}, audio::log_mel(clip.pcm)));
    }
    write_safetensors(a.dump_features, f, {{"sample_rate", "16000"}});
    std::fprintf(stderr, "wrote the 16-kHz samples and log-mel spectrograms to %s\n", a.dump_features.c_str());
  }

  const int64_t B = a.batch ? a.batch : std::min<int64_t>(int64_t(clips.size()), 8);
  // auto: the spectrogram in the graph on a GPU at batches up to kGraphFeaturesMaxBatch (measured faster there,
  // docs/whisper.md), else on the host. The device is known once a session exists: compile for host features,
  // and recompile with the audio input when the device turns out to be a GPU (kernels come from the cache).
  bool on_device = a.features == "graph";
  Graph g = whisper::encoder_graph(cfg, {.batch = B, .audio_input = on_device});
  std::optional<Session> first(compile(g, compile_options(c, a.compile, Mode::Infer)));
  const std::string type = first->device_type();
  Graph g_audio;
  if (a.features == "auto" && B <= kGraphFeaturesMaxBatch && (type == "discrete GPU" || type == "integrated GPU")) {
    on_device = true;
    first.reset();
    g_audio = whisper::encoder_graph(cfg, {.batch = B, .audio_input = true});
    first.emplace(compile(g_audio, compile_options(c, a.compile, Mode::Infer)));
  }
  Session& s = *first;
  whisper::load_weights(s, weights);
  std::fprintf(stderr, "whisper encoder: %lld layers, d_model %lld, batch %lld, backend %s; ready in %.2f s\n",
               (long long)cfg.encoder_layers, (long long)cfg.d_model, (long long)B, s.backend(),
               std::chrono::duration<double>(Clock::now() - t0).count());

  const int64_t T = cfg.max_source_positions, D = cfg.d_model, per = T * D;
  std::vector<StoredTensor> out;
  std::vector<double> batch_ms;
  auto t1 = Clock::now();
  for (int64_t rep = 0; rep < a.repeat; ++rep)
  for (size_t first = 0; first < clips.size(); first += size_t(B)) {
    auto tb = Clock::now();
    std::vector<std::vector<float>> rows;
    for (size_t i = first; i < std::min(clips.size(), first + size_t(B)); ++i) rows.push_back(clips[i].pcm);
    const size_t used = rows.size();
    while (int64_t(rows.size()) < B) rows.push_back(std::vector<float>(size_t(kWindow), 0.0f));  // unused rows
    if (on_device) {
      std::vector<float> padded;
      padded.reserve(size_t(B) * size_t(kWindow + 400));
      for (const auto& r : rows) {
        std::vector<float> p = audio::reflect_pad(r, 200);
        padded.insert(padded.end(), p.begin(), p.end());
      }
      s.set_input("audio", padded);
    } else {
      s.set_input("mel", audio::log_mel_batch(rows));
    }
    s.run();
    std::vector<float> h = s.read("last_hidden_state");
    batch_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - tb).count());
    if (rep + 1 < a.repeat) continue;
    for (size_t r = 0; r < used; ++r) {
      const Clip& clip = clips[first + r];
      std::vector<float> v(h.begin() + ptrdiff_t(r) * per, h.begin() + ptrdiff_t(r + 1) * per);
      double sum = 0, sq = 0;
      for (float x : v) {
        sum += x;
        sq += double(x) * x;
      }
      const double mean = sum / double(per), sd = std::sqrt(std::max(0.0, sq / double(per) - mean * mean));
      std::printf("%s: [%lld, %lld] mean %.6f std %.6f\n", clip.name.c_str(), (long long)T, (long long)D, mean, sd);
      if (!a.out.empty()) out.push_back(StoredTensor::from_f32(clip.name, {T, D}, v));
    }
  }
  std::fprintf(stderr, "encoded %zu window(s) in %.2f s (spectrogram on the %s)\n", clips.size(),
               std::chrono::duration<double>(Clock::now() - t1).count(), on_device ? "device" : "host");
  if (a.repeat > 1) {
    // Per batch: features + upload + encoder + download, the first repetition left out (warm-up).
    std::vector<double> t(batch_ms.begin() + ptrdiff_t(batch_ms.size() / size_t(a.repeat)), batch_ms.end());
    std::sort(t.begin(), t.end());
    std::printf("timing: features %s, batch %lld, %zu batches: median %.3f ms, min %.3f ms per batch\n",
                on_device ? "graph" : "host", (long long)B, t.size(), t[t.size() / 2], t.front());
  }
  if (!a.out.empty()) {
    write_safetensors(a.out, out, {{"model", a.model}, {"tensor", "last_hidden_state [positions, d_model]"}});
    std::fprintf(stderr, "wrote %s\n", a.out.c_str());
  }
  return 0;
}

}  // namespace

Run declare_whisper_encode(CLI::App& app) {
  auto a = std::make_shared<WhisperArgs>();
  app.add_option("AUDIO", a->audio, "sound files (WAV and what libsndfile reads; any rate, mono or stereo)")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--model", a->model, "a Hugging Face Whisper directory (config.json, model.safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--out", a->out, "write the encoder states, one tensor per file, to this safetensors file");
  app.add_option("--batch", a->batch, "rows per encoder run (default: the file count, at most 8)")->check(at_least(1));
  app.add_option("--features", a->features,
                 "where the log-mel spectrogram is computed: host (FFTW), graph (on the device, in the encoder's "
                 "graph) or auto (graph on a GPU at batch <= 4, else host; the default)")
      ->check(CLI::IsMember({"auto", "host", "graph"}));
  app.add_option("--repeat", a->repeat, "encode everything this many times and print the per-batch time")
      ->check(at_least(1));
  app.add_option("--dump-features", a->dump_features,
                 "also write each window's 16-kHz samples and host log-mel spectrogram to this safetensors file");
  app.add_option("--long", a->long_audio, "audio over 30 s: refuse (default) or chunk into 30-s windows")
      ->check(CLI::IsMember({"refuse", "chunk"}));
  add_compile_flags(app, a->compile);
  app.footer(
      "Each file is mixed to mono, resampled to 16 kHz, padded to 30 s and turned into Whisper's 80-bin\n"
      "log-mel spectrogram; the encoder's last hidden state [1500, d_model] is printed as mean/std and, with\n"
      "--out, saved under the file's name.");
  return [a](const Context& c) { return whisper_encode(*a, c); };
}

}  // namespace mgn::tool
