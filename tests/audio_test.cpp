// Audio front end (include/mgn/audio.h): WAV files written byte by byte here (16-bit PCM and float, mono and
// stereo) read back to the samples written; damaged files refused with the file named; the resampler
// against the closed form of a sine; the mel filters and the log-mel spectrogram of real speech (the ALSA
// recordings Debian ships, 48 kHz, and a sentence synthesized by espeak-ng) against NumPy float64 and
// torch.stft (tests/ref/logmel_ref.py); the graph form of the spectrogram against the host form.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numbers>

#include "mgn/audio.h"
#include "mgn/session.h"
#include "support/test_util.h"

using namespace mgn;
using test::error_of;

namespace {

template <typename T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// A RIFF/WAVE file: format tag 1 (PCM) or 3 (IEEE float), `data` as given; `declared` overrides the data
// chunk's size field (a header that promises more than the file holds).
void write_wav(const std::string& path, uint16_t tag, uint16_t channels, uint32_t rate, uint16_t bits,
               const std::string& data, int64_t declared = -1) {
  std::string s = "RIFF";
  put<uint32_t>(s, uint32_t(36 + data.size()));
  s += "WAVEfmt ";
  put<uint32_t>(s, 16);
  put<uint16_t>(s, tag);
  put<uint16_t>(s, channels);
  put<uint32_t>(s, rate);
  put<uint32_t>(s, rate * channels * bits / 8);
  put<uint16_t>(s, uint16_t(channels * bits / 8));
  put<uint16_t>(s, bits);
  s += "data";
  put<uint32_t>(s, uint32_t(declared >= 0 ? declared : int64_t(data.size())));
  s += data;
  std::ofstream(path, std::ios::binary) << s;
}

std::map<std::string, StoredTensor> reference(const std::vector<float>& pcm) {
  std::vector<double> opt = {16000, 400, 160, 80};
  return test::run_torch("tests/ref/logmel_ref.py",
                         {StoredTensor::from_f32("pcm", {int64_t(pcm.size())}, pcm), StoredTensor::from_f64("opt", {4}, opt)});
}

double max_abs(const std::vector<float>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

// Whisper's input from a file: read, resample to 16 kHz, pad to 30 s.
std::vector<float> whisper_pcm(const std::string& path) {
  audio::Audio a = audio::read(path);
  return audio::pad_or_trim(audio::resample(a.samples, a.sample_rate, 16000), 480000);
}

}  // namespace

TEST(Audio, ReadsPcm16AndFloatMonoAndStereoExactly) {
  const std::string dir = test::make_temp_dir("audio_read");
  // 16-bit PCM stereo: the mean of the two channels, each sample / 32768.
  std::string pcm;
  const int16_t l[] = {0, 1000, -32768, 32767, 12}, r[] = {0, -1000, 32767, 32767, -8};
  for (int i = 0; i < 5; ++i) {
    put<int16_t>(pcm, l[i]);
    put<int16_t>(pcm, r[i]);
  }
  write_wav(dir + "/s16.wav", 1, 2, 44100, 16, pcm);
  audio::Audio a = audio::read(dir + "/s16.wav");
  EXPECT_EQ(a.sample_rate, 44100);
  EXPECT_EQ(a.channels, 2);
  ASSERT_EQ(a.samples.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_FLOAT_EQ(a.samples[size_t(i)], float((l[i] + r[i]) / 2.0 / 32768.0)) << i;
  // 32-bit float mono: the values themselves.
  std::string f32;
  const float v[] = {0.25f, -0.5f, 0.125f, 1.0f};
  for (float x : v) put<float>(f32, x);
  write_wav(dir + "/f32.wav", 3, 1, 16000, 32, f32);
  a = audio::read(dir + "/f32.wav");
  EXPECT_EQ(a.channels, 1);
  ASSERT_EQ(a.samples.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a.samples[size_t(i)], v[i]);
  std::filesystem::remove_all(dir);
}

TEST(Audio, DamagedFilesAreRefusedNamingTheFile) {
  const std::string dir = test::make_temp_dir("audio_bad");
  std::string data(2000, '\0');
  write_wav(dir + "/truncated.wav", 1, 1, 16000, 16, data, 200000);  // the header promises 100x the bytes
  write_wav(dir + "/empty.wav", 1, 1, 16000, 16, "");
  write_wav(dir + "/codec.wav", 0x1234, 1, 16000, 16, data);  // a format tag no decoder knows
  std::ofstream(dir + "/text.wav") << "this is not a sound file\n";
  for (const char* name : {"truncated.wav", "empty.wav", "codec.wav", "text.wav", "missing.wav"}) {
    const std::string path = dir + "/" + name;
    std::string e = error_of([&] { audio::read(path); });
    EXPECT_NE(e.find(path), std::string::npos) << name << ": " << e;
  }
  EXPECT_NE(error_of([&] { audio::read(dir + "/truncated.wav"); }).find("truncated"), std::string::npos);
  EXPECT_NE(error_of([&] { audio::read(dir + "/empty.wav"); }).find("no samples"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(Audio, ResamplesASineToItsClosedForm) {
  // 1 s of a 440 Hz sine at 48 kHz to 16 kHz and at 22.05 kHz to 16 kHz: away from the edges (the filter's
  // start-up), the output is the same sine sampled at 16 kHz.
  for (int64_t from : {48000, 22050}) {
    std::vector<float> x(static_cast<size_t>(from));
    for (int64_t i = 0; i < from; ++i) x[size_t(i)] = float(0.5 * std::sin(2 * std::numbers::pi * 440.0 * double(i) / double(from)));
    std::vector<float> y = audio::resample(x, from, 16000);
    EXPECT_NEAR(double(y.size()), 16000.0, 2.0) << from;
    double err = 0;
    for (int64_t i = 400; i < 15600; ++i)
      err = std::max(err, std::fabs(double(y[size_t(i)]) - 0.5 * std::sin(2 * std::numbers::pi * 440.0 * double(i) / 16000.0)));
    EXPECT_LT(err, 1e-3) << from;
  }
  EXPECT_THROW(audio::resample({1.0f}, 0, 16000), Error);
}

TEST(Audio, LogMelOfRealSpeechMatchesNumpyAndTorch) {
  // The ALSA test recordings (16-bit mono, 48 kHz) and a sentence from espeak-ng (22.05 kHz).
  const std::string dir = test::make_temp_dir("audio_speech");
  const std::string spoken = dir + "/espeak.wav";
  const std::string cmd = "espeak-ng -w " + spoken + " 'Meganeura trains networks on any graphics card.' 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "espeak-ng (Debian package espeak-ng) is needed";
  for (const std::string& path : {std::string("/usr/share/sounds/alsa/Front_Center.wav"), spoken}) {
    ASSERT_TRUE(std::filesystem::exists(path)) << path << " (Debian package alsa-utils)";
    std::vector<float> pcm = whisper_pcm(path);
    std::vector<float> mel = audio::log_mel(pcm);
    ASSERT_EQ(mel.size(), size_t(80 * 3000));
    auto ref = reference(pcm);
    EXPECT_LT(max_abs(mel, ref.at("np").to_f64()), 1e-4) << path << " vs NumPy float64";
    EXPECT_LT(max_abs(mel, ref.at("torch").to_f64()), 1e-3) << path << " vs torch.stft float32";
    std::vector<double> f = audio::mel_filters();
    std::vector<double> rf = ref.at("filters").to_f64();
    ASSERT_EQ(f.size(), rf.size());
    EXPECT_LT(test::max_abs_diff(f, rf), 1e-12);
  }
  std::filesystem::remove_all(dir);
}

TEST(Audio, BatchedAndThreadedIsTheSameAsOneByOne) {
  std::vector<std::vector<float>> sig;
  for (uint64_t s = 0; s < 3; ++s) {
    std::vector<double> d = test::random_normal(8000, 40 + s, 0.1);
    sig.emplace_back(d.begin(), d.end());
  }
  std::vector<float> all = audio::log_mel_batch(sig, {}, 2);
  for (size_t i = 0; i < sig.size(); ++i) {
    std::vector<float> one = audio::log_mel(sig[i]);
    EXPECT_TRUE(std::equal(one.begin(), one.end(), all.begin() + ptrdiff_t(i * one.size()))) << i;
  }
  EXPECT_THROW(audio::log_mel_batch({sig[0], std::vector<float>(100)}), Error);
  EXPECT_THROW(audio::log_mel(std::vector<float>(150)), Error);
}

// The spectrogram as a graph (a strided convolution with the DFT basis, f32) on each backend against the
// host form (FFT in double): real speech, 2 s.
TEST(Audio, LogMelGraphMatchesTheHostSpectrogram) {
  audio::Audio a = audio::read("/usr/share/sounds/alsa/Front_Left.wav");
  std::vector<float> pcm = audio::pad_or_trim(audio::resample(a.samples, a.sample_rate, 16000), 32000);
  std::vector<float> host = audio::log_mel(pcm);
  std::vector<float> padded = audio::reflect_pad(pcm, 200);
  std::vector<float> two = padded;
  two.insert(two.end(), padded.begin(), padded.end());
  for (Backend b : {Backend::Cpu, Backend::Auto}) {
    Graph g = audio::log_mel_graph(2, 32000);
    Session s = compile(g, {.mode = Mode::Infer, .backend = b, .device = test::device_options()});
    if (b == Backend::Auto && std::string(s.backend()) == "cpu") continue;
    s.set_input("audio", two);
    s.run();
    std::vector<float> out = s.read("log_mel");
    ASSERT_EQ(out.size(), 2 * host.size());
    std::vector<double> h(host.begin(), host.end());
    EXPECT_LT(max_abs(std::vector<float>(out.begin(), out.begin() + ptrdiff_t(host.size())), h), 2e-3) << s.backend();
    EXPECT_LT(max_abs(std::vector<float>(out.begin() + ptrdiff_t(host.size()), out.end()), h), 2e-3) << s.backend();
  }
}
