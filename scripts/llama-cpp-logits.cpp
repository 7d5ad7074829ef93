// llama-cpp-logits: runs a GGUF model through llama.cpp (the prebuilt libraries scripts/fetch-llama-cpp.sh
// fetches) on one sequence of token ids and writes the logits of every position, so a test can compare
// them with another implementation's. Built by scripts/fetch-llama-cpp.sh next to llama-bench; not part of
// meganeura (it links only llama.cpp).
//
//   llama-cpp-logits MODEL.gguf IDS_FILE OUT_FILE [--device cpu|gpu] [--flash-attn 0|1]
//
// IDS_FILE: the ids as little-endian int32; OUT_FILE: float32 [n_ids, n_vocab], row-major. cpu keeps every
// layer and operation on ggml's CPU backend (no device offload); gpu offloads all layers to the first GPU
// device the loaded backends offer (Vulkan). The KV cache is f32 (llama.cpp's default is f16). Prints one line with the sizes; exits 1 with a message on error.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "llama.h"

static int fail(const std::string& what) {
  std::fprintf(stderr, "llama-cpp-logits: %s\n", what.c_str());
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 4) return fail("usage: llama-cpp-logits MODEL.gguf IDS_FILE OUT_FILE [--device cpu|gpu] [--flash-attn 0|1]");
  std::string model_path = argv[1], ids_path = argv[2], out_path = argv[3], device = "cpu";
  bool flash = false;
  for (int i = 4; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--device" && (v == "cpu" || v == "gpu")) device = v;
    else if (k == "--flash-attn" && (v == "0" || v == "1")) flash = v == "1";
    else return fail("bad option " + k + " " + v);
  }
  std::ifstream f(ids_path, std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (!f.good() && !f.eof()) return fail("cannot read " + ids_path);
  if (raw.empty() || raw.size() % 4) return fail(ids_path + ": expected a non-empty list of int32");
  std::vector<llama_token> ids(raw.size() / 4);
  std::memcpy(ids.data(), raw.data(), raw.size());

  ggml_backend_load_all();
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  ggml_backend_dev_t none[1] = {nullptr};
  ggml_backend_dev_t gpu[2] = {nullptr, nullptr};
  if (device == "cpu") {
    mp.devices = none;  // an empty list: no device to offload to
    mp.n_gpu_layers = 0;
  } else {
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
      ggml_backend_dev_t d = ggml_backend_dev_get(i);
      if (ggml_backend_dev_type(d) == GGML_BACKEND_DEVICE_TYPE_GPU) { gpu[0] = d; break; }
    }
    if (!gpu[0]) return fail("no GPU device (for Vulkan on a CPU-type device set GGML_VK_VISIBLE_DEVICES=0)");
    mp.devices = gpu;
    mp.n_gpu_layers = 999;
  }
  llama_model* model = llama_model_load_from_file(model_path.c_str(), mp);
  if (!model) return fail("cannot load " + model_path);
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);
  const int n = int(ids.size());
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = uint32_t(n);
  cp.n_batch = uint32_t(n);
  cp.n_ubatch = uint32_t(n);
  cp.n_threads = cp.n_threads_batch = 2;
  cp.flash_attn_type = flash ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.op_offload = device == "gpu";
  cp.type_k = cp.type_v = GGML_TYPE_F32;  // the default f16 cache rounds k and v
  cp.no_perf = true;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) return fail("cannot create a context for " + model_path);
  llama_batch batch = llama_batch_init(n, 0, 1);
  for (int i = 0; i < n; ++i) {
    if (ids[size_t(i)] < 0 || ids[size_t(i)] >= n_vocab) return fail("id out of the vocabulary: " + std::to_string(ids[size_t(i)]));
    batch.token[i] = ids[size_t(i)];
    batch.pos[i] = i;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  batch.n_tokens = n;
  if (llama_decode(ctx, batch) != 0) return fail("llama_decode failed");
  std::vector<float> out(size_t(n) * size_t(n_vocab));
  for (int i = 0; i < n; ++i) {
    const float* l = llama_get_logits_ith(ctx, i);
    if (!l) return fail("no logits for position " + std::to_string(i));
    std::memcpy(out.data() + size_t(i) * size_t(n_vocab), l, sizeof(float) * size_t(n_vocab));
  }
  std::ofstream o(out_path, std::ios::binary);
  o.write(reinterpret_cast<const char*>(out.data()), std::streamsize(out.size() * sizeof(float)));
  if (!o) return fail("cannot write " + out_path);
  std::printf("llama-cpp-logits: %d positions x %d vocab (%s%s)\n", n, n_vocab, device.c_str(), flash ? ", flash attention" : "");
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
