// Device loss and device-memory exhaustion during a run (issue 30, docs/reliability.md "Resource
// exhaustion"), on lavapipe, through CompileOptions::faults (FaultInjection): the Vulkan engine takes an
// injected VK_ERROR_DEVICE_LOST or VK_ERROR_OUT_OF_DEVICE_MEMORY exactly where the driver's answer would
// arrive, so the recovery code under test is the one a real failure runs. Checked: the clear error
// (mgn::DeviceLost), fast refusals afterwards on every session of the lost device, a new session with the
// same DeviceOptions on a new device whose results match the CPU reference executor, the old device destroyed
// with the validation layer silent, and the pipeline cache on disk never written from a lost device.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "mgn/device.h"
#include "mgn/session.h"
#include "support/test_util.h"

namespace fs = std::filesystem;
using namespace mgn;

namespace {

bool has_vulkan() {
  return !list_devices().empty();
}
bool has(const std::string& msg, const std::string& part) {
  return msg.find(part) != std::string::npos;
}

// The message of the DeviceLost that f throws, and how long f took; "(no DeviceLost)" otherwise (another
// mgn::Error is reported with its message, so a failing check shows it).
struct Thrown {
  std::string message;
  double seconds = 0;
};
Thrown device_lost_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  Thrown r{"(no DeviceLost)"};
  try {
    f();
  } catch (const DeviceLost& e) {
    r.message = e.what();
  } catch (const Error& e) {
    r.message = std::string("(another error) ") + e.what();
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// y = relu(x W) · v (a [4, 3] result); `salt` changes W, so that two graphs make different kernels'
// pipelines.
Graph small_graph(uint64_t salt = 0) {
  Graph g;
  Tensor x = g.input("x", {4, 8});
  Tensor w = g.parameter("w", {8, 6}, Init::normal(0, 1, 7 + salt));
  Tensor v = g.parameter("v", {6, 3}, Init::normal(0, 1, 11));
  Tensor h = relu(matmul(x, w));
  g.output("y", salt ? matmul(sigmoid(h), v) : matmul(h, v));
  return g;
}

std::vector<float> input_x() {
  std::vector<float> x(32);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 7) - 3) * 0.25f;
  return x;
}

CompileOptions vulkan_options(FaultInjection faults = {}, const std::string& cache_dir = "") {
  CompileOptions o{.backend = Backend::Vulkan, .device = test::device_options()};
  o.faults = faults;
  o.cache_dir = cache_dir;
  return o;
}

// The CPU reference executor's y for the same graph and input.
std::vector<float> cpu_reference(uint64_t salt = 0) {
  Graph g = small_graph(salt);
  Session s = compile(g, {.backend = Backend::Cpu});
  s.set_input("x", input_x());
  s.run();
  return s.read("y");
}

void expect_matches_cpu(Session& s, uint64_t salt = 0) {
  s.set_input("x", input_x());
  s.run();
  const std::vector<float> got = s.read("y"), want = cpu_reference(salt);
  ASSERT_EQ(got.size(), want.size());
  std::vector<double> a(got.begin(), got.end()), b(want.begin(), want.end());
  EXPECT_LT(test::rel_l2(a, b), 1e-5);
}

Session compile_small(const CompileOptions& o, uint64_t salt = 0) {
  Graph g = small_graph(salt);
  return compile(g, o);
}

// What a lost device's session says to every later call: refused at once, naming the call that lost it.
void expect_refused(const Thrown& t, const std::string& call, const std::string& lost_during) {
  EXPECT_TRUE(has(t.message, call + " refused: vulkan device '") &&
              has(t.message, "lost (VK_ERROR_DEVICE_LOST) during " + lost_during) &&
              has(t.message, "compile a new session"))
      << t.message;
  EXPECT_LT(t.seconds, 1.0) << "a refusal must not wait for the device";
}

}  // namespace

TEST(ReliabilityDeviceLost, InjectedLossAtSubmissionThenANewDevice) {
  if (!has_vulkan()) GTEST_SKIP() << "no Vulkan device";
  // The second step's queue submission reports the device lost.
  std::optional<Session> lost = compile_small(vulkan_options({.device_lost_at_submission = 2}));
  std::optional<Session> bystander = compile_small(vulkan_options());  // same DeviceOptions: the same device
  expect_matches_cpu(*lost);                                           // step 1: healthy
  expect_matches_cpu(*bystander);

  const Thrown first = device_lost_of([&] { lost->run(); });
  EXPECT_TRUE(
      has(first.message, "vulkan device '") &&
      has(first.message, "lost (VK_ERROR_DEVICE_LOST) during vkQueueSubmit; this session cannot run again") &&
      has(first.message, "compile a new session"))
      << first.message;
  EXPECT_EQ(first.message.find('\n'), std::string::npos) << "one line";

  // The same session, again: refused at once, run and reads alike; and the other session of that device.
  expect_refused(device_lost_of([&] { lost->run(); }), "run", "vkQueueSubmit");
  expect_refused(device_lost_of([&] { lost->read("y"); }), "read_output", "vkQueueSubmit");
  expect_refused(device_lost_of([&] { lost->set_input("x", input_x()); }), "set_input", "vkQueueSubmit");
  expect_refused(device_lost_of([&] { bystander->run(); }), "run", "vkQueueSubmit");
  expect_refused(device_lost_of([&] { bystander->read("w"); }), "read_state", "vkQueueSubmit");

  // A new session with the same DeviceOptions opens a new device and computes the reference's result, while
  // the old device's sessions (still alive) keep failing: they are on the lost one.
  Session fresh = compile_small(vulkan_options());
  expect_matches_cpu(fresh);
  expect_refused(device_lost_of([&] { bystander->run(); }), "run", "vkQueueSubmit");

  // The last sessions of the old device go: it is destroyed now, with the validation layer silent (anything
  // left undestroyed on it, or a destroy while in use, would be reported on stderr).
  testing::internal::CaptureStderr();
  lost.reset();
  bystander.reset();
  const std::string destroy_log = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(has(destroy_log, "[vulkan")) << destroy_log;
  expect_matches_cpu(fresh);  // the new device is untouched by the old one's end
  expect_matches_cpu(fresh);
}

TEST(ReliabilityDeviceLost, InjectedLossAtTheStepWaitOfATrainingStep) {
  if (!has_vulkan()) GTEST_SKIP() << "no Vulkan device";
  // Training: the first step's wait reports the device lost (the work itself ran on lavapipe).
  Graph g;
  Tensor x = g.input("x", {4, 8});
  Tensor w = g.parameter("w", {8, 3}, Init::normal(0, 1, 3));
  g.output("loss", sum(mul(matmul(x, w), matmul(x, w))));
  CompileOptions o = vulkan_options({.device_lost_at_wait = 1});
  o.mode = Mode::Train;
  o.optimizer = SGD{.lr = 0.01};
  std::optional<Session> training = compile(g, o);
  Session& s = *training;
  s.set_input("x", input_x());
  const Thrown first = device_lost_of([&] { s.step(); });
  EXPECT_TRUE(has(first.message, "lost (VK_ERROR_DEVICE_LOST) during vkWaitForFences (the end of a step)") &&
              has(first.message, "compile a new session"))
      << first.message;
  // step() sets the step's scalars (set_input) before it runs: refused at the first of them.
  const Thrown again = device_lost_of([&] { s.step(); });
  expect_refused(again, has(again.message, "set_input refused") ? "set_input" : "run",
                 "vkWaitForFences (the end of a step)");
  expect_refused(device_lost_of([&] { s.read("w"); }), "read_state", "vkWaitForFences (the end of a step)");

  Session fresh = compile_small(vulkan_options());
  expect_matches_cpu(fresh);
  // The old device goes with its last session; its step had completed (the wait was the injected failure).
  testing::internal::CaptureStderr();
  training.reset();
  const std::string destroy_log = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(has(destroy_log, "[vulkan")) << destroy_log;
}

TEST(ReliabilityDeviceLost, InjectedLossInsideASplitStep) {
  if (!has_vulkan()) GTEST_SKIP() << "no Vulkan device";
  // A step split into two queue submissions; the second is lost, so the first stays queued with no fence of
  // its own: the old device must wait for it before its objects are destroyed (or the layer reports it).
  CompileOptions o = vulkan_options({.device_lost_at_submission = 2});
  o.submissions = 2;
  std::optional<Session> s = compile_small(o);
  ASSERT_EQ(s->device_memory().submissions, 2) << "the step must be split for this test";
  s->set_input("x", input_x());
  const Thrown first = device_lost_of([&] { s->run(); });
  EXPECT_TRUE(has(first.message, "lost (VK_ERROR_DEVICE_LOST) during vkQueueSubmit;")) << first.message;
  expect_refused(device_lost_of([&] { s->run(); }), "run", "vkQueueSubmit");

  Session fresh = compile_small(vulkan_options());  // the registry lets go of the lost device here
  testing::internal::CaptureStderr();
  s.reset();  // its last session: the old device is destroyed now
  const std::string destroy_log = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(has(destroy_log, "[vulkan")) << destroy_log;
  expect_matches_cpu(fresh);
}

TEST(ReliabilityDeviceLost, InjectedOutOfDeviceMemoryAtCompile) {
  if (!has_vulkan()) GTEST_SKIP() << "no Vulkan device";
  Session healthy = compile_small(vulkan_options());
  // The session's first vkAllocateMemory answers VK_ERROR_OUT_OF_DEVICE_MEMORY.
  std::string e;
  try {
    compile_small(vulkan_options({.out_of_memory_at_allocation = 1}));
    e = "(no error)";
  } catch (const DeviceLost& d) {
    e = std::string("(DeviceLost) ") + d.what();
  } catch (const Error& err) {
    e = err.what();
  }
  // (Lavapipe's first block is device memory; a discrete GPU's first is upload staging.)
  EXPECT_TRUE(has(e, "out of GPU memory: asked for") && has(e, " memory for '") &&
              has(e, "failed (VK_ERROR_OUT_OF_DEVICE_MEMORY)") && !has(e, "(DeviceLost)"))
      << e;
  // Not a lost device: the session alive before still runs, and a later one compiles and matches.
  expect_matches_cpu(healthy);
  Session later = compile_small(vulkan_options());
  expect_matches_cpu(later);
}

TEST(ReliabilityDeviceLost, PipelineCacheOnDiskIsNotWrittenFromALostDevice) {
  if (!has_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const std::string dir = test::make_temp_dir("device_lost_cache");
  auto pipeline_file = [&] {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().rfind("pipelines-", 0) == 0) return e.path().string();
    return std::string();
  };
  {
    Session s = compile_small(vulkan_options({}, dir));
    expect_matches_cpu(s);
  }  // its pipelines reach the disk
  const std::string file = pipeline_file();
  ASSERT_FALSE(file.empty()) << "a healthy session saves the pipeline cache";
  // Every save is a new file renamed over the old one (files::write_atomic): another inode, or the same
  // number reused, with a later change time. (Lavapipe's cache data is its 32-byte header alone, so the bytes
  // cannot tell a save apart; inode and change time can.)
  auto inode = [&] {
    struct stat st {};
    if (::stat(file.c_str(), &st) != 0) return std::string("(missing)");
    return std::to_string(st.st_ino) + "@" + std::to_string(st.st_ctim.tv_sec) + "." +
           std::to_string(st.st_ctim.tv_nsec);
  };
  const std::string saved = test::read_bytes(file);
  const std::string saved_inode = inode();
  {
    // Other kernels (new pipelines to save), then the device is lost at the first step.
    Session s = compile_small(vulkan_options({.device_lost_at_submission = 1}, dir), 1);
    s.set_input("x", input_x());
    EXPECT_TRUE(has(device_lost_of([&] { s.run(); }).message, "during vkQueueSubmit"));
  }
  // The next lookup drops the lost device and its pipeline cache (destroyed now: its last save is skipped
  // too).
  Session control = compile_small(vulkan_options({}, dir), 1);
  EXPECT_EQ(inode(), saved_inode) << "the lost device's session and cache must not write the pipeline cache";
  EXPECT_EQ(test::read_bytes(file), saved);
  // Control: the same new kernels on the new device are saved (a new file), and everything from the disk
  // loads.
  expect_matches_cpu(control, 1);
  EXPECT_NE(control.compile_report().session_cache, "corrupt");
  { Session gone = std::move(control); }
  EXPECT_NE(inode(), saved_inode) << "control: a healthy session with new pipelines saves the file";
  Session again = compile_small(vulkan_options({}, dir));
  expect_matches_cpu(again);
  EXPECT_EQ(again.compile_report().session_cache, "hit");
  fs::remove_all(dir);
}
