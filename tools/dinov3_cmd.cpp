// `mgn dinov3-embed` (images -> DINOv3 CLS + patch features) and `mgn dinovision train|reconstruct` (the
// paper's case study: a decoder trained on frozen features of the first 3 ViT layers reconstructs the image).
// Every input is read and checked (images decoded, config and weights read, output folders present) before
// anything compiles.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cli.h"
#include "mgn/checkpoint.h"
#include "mgn/dinov3.h"
#include "mgn/dinovision.h"
#include "mgn/image.h"
#include "mgn/safetensors.h"

namespace mgn::tool {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void check_out_parent(const std::string& out, const std::string& flag) {
  if (out.empty()) return;
  const fs::path parent = fs::absolute(out).parent_path();
  if (!fs::is_directory(parent))
    throw UsageError(flag + " " + out + ": the folder " + parent.string() + " does not exist");
}

// The encoder: config + weights from a Hugging Face directory, or ViT-S/16 with the paper's sine init.
struct Encoder {
  dinov3::Config cfg = dinov3::Config::vits16();
  std::map<std::string, std::vector<float>> weights;  // empty: the graph's own init
  std::string source = "paper sine init (no pretrained weights)";
};

Encoder load_encoder(const std::string& model, int64_t layers) {
  Encoder e;
  if (model.empty()) return e;
  e.cfg = dinov3::Config::from_file(model + "/config.json");
  if (layers > e.cfg.num_hidden_layers)
    throw Error(model + "/config.json: the model has " + std::to_string(e.cfg.num_hidden_layers) +
                " layers, fewer than the " + std::to_string(layers) + " asked for");
  e.weights = dinov3::read_weights(e.cfg, model, layers);
  e.source = model;
  return e;
}

// ---- dinov3-embed

struct EmbedArgs {
  std::vector<std::string> images;
  std::string model, out;
  int64_t resize = 256, crop = 224, batch = 0, layers = 0;
  CompileFlags compile;
};

int dinov3_embed(const EmbedArgs& a, const Context& c) {
  auto t0 = Clock::now();
  Encoder enc = load_encoder(a.model, a.layers);
  const int64_t p = enc.cfg.patch_size;
  // Every image first: decoded, preprocessed, its size checked.
  struct Item {
    std::string name;
    std::vector<float> px;
    int64_t h, w;
  };
  std::vector<Item> items;
  for (const std::string& path : a.images) {
    image::Image im = image::read(path);
    image::Image x = a.resize > 0 ? image::resize_shorter(im, a.resize) : im;
    if (a.crop > 0) {
      if (x.height < a.crop || x.width < a.crop)
        throw Error("'" + path + "': " + std::to_string(x.height) + "x" + std::to_string(x.width) +
                    " after resizing, smaller than the crop " + std::to_string(a.crop));
      x = image::center_crop(x, a.crop, a.crop);
    }
    if (x.height % p != 0 || x.width % p != 0)
      throw Error("'" + path + "': " + std::to_string(x.height) + "x" + std::to_string(x.width) +
                  " is not a multiple of the patch size " + std::to_string(p) +
                  " (give --crop, or --resize so that it is)");
    items.push_back({path, image::normalize(x), x.height, x.width});
    std::fprintf(stderr, "%s: %s, %lldx%lld -> %lldx%lld\n", path.c_str(), im.format.c_str(),
                 (long long)im.width, (long long)im.height, (long long)x.width, (long long)x.height);
  }
  check_out_parent(a.out, "--out");

  // One session per distinct image size (one with --crop).
  std::map<std::pair<int64_t, int64_t>, std::vector<size_t>> by_size;
  for (size_t i = 0; i < items.size(); ++i) by_size[{items[i].h, items[i].w}].push_back(i);
  const int64_t D = enc.cfg.hidden_size, P = enc.cfg.prefix_tokens();
  std::vector<StoredTensor> out;
  for (auto& [hw, idx] : by_size) {
    const int64_t B = a.batch ? a.batch : std::min<int64_t>(int64_t(idx.size()), 8);
    Graph g =
        dinov3::vit_graph(enc.cfg, {.batch = B, .height = hw.first, .width = hw.second, .layers = a.layers});
    Session s = compile(g, compile_options(c, a.compile, Mode::Infer));
    dinov3::load_weights(s, enc.weights);
    std::fprintf(
        stderr, "dinov3: %lld layers, hidden %lld, %lldx%lld, batch %lld, backend %s; ready in %.2f s (%s)\n",
        (long long)(a.layers ? a.layers : enc.cfg.num_hidden_layers), (long long)D, (long long)hw.first,
        (long long)hw.second, (long long)B, s.backend(), seconds_since(t0), enc.source.c_str());
    const int64_t N = (hw.first / enc.cfg.patch_size) * (hw.second / enc.cfg.patch_size), S = P + N;
    const size_t per = size_t(3 * hw.first * hw.second);
    for (size_t first = 0; first < idx.size(); first += size_t(B)) {
      std::vector<float> px(size_t(B) * per, 0.0f);
      const size_t used = std::min(idx.size() - first, size_t(B));
      for (size_t r = 0; r < used; ++r)
        std::copy(items[idx[first + r]].px.begin(), items[idx[first + r]].px.end(),
                  px.begin() + ptrdiff_t(r * per));
      s.set_input("pixel_values", px);
      s.run();
      std::vector<float> h = s.read("last_hidden_state");
      for (size_t r = 0; r < used; ++r) {
        const Item& it = items[idx[first + r]];
        auto row = h.begin() + ptrdiff_t(r) * S * D;
        std::vector<float> cls(row, row + D), patches(row + P * D, row + S * D);
        double n2 = 0;
        for (float v : cls) n2 += double(v) * v;
        double sum = 0, sq = 0;
        for (float v : patches) sum += v, sq += double(v) * v;
        const double mean = sum / double(patches.size());
        std::printf("%s: cls [%lld] norm %.6f, patches [%lld, %lld] mean %.6f std %.6f\n", it.name.c_str(),
                    (long long)D, std::sqrt(n2), (long long)N, (long long)D, mean,
                    std::sqrt(std::max(0.0, sq / double(patches.size()) - mean * mean)));
        if (!a.out.empty()) {
          out.push_back(StoredTensor::from_f32(it.name + ".cls", {D}, cls));
          out.push_back(StoredTensor::from_f32(it.name + ".patches", {N, D}, patches));
        }
      }
    }
  }
  if (!a.out.empty()) {
    write_safetensors(a.out, out,
                      {{"model", enc.source},
                       {"cls", "[hidden] (after the final norm)"},
                       {"patches", "[patches, hidden], row-major (r, c)"}});
    std::fprintf(stderr, "wrote %s\n", a.out.c_str());
  }
  return 0;
}

// ---- dinovision

struct VisionArgs {
  std::string action;
  std::vector<std::string> images, image_dirs;
  std::string model, run_dir = "dinovision-run", out;
  int64_t steps = 12000, batch = 8, views = 4, image_size = 224, seed = 0, progress = 100,
          layers = dinovision::kEncoderLayers;
  double lr = 1e-3, holdout = 0.2;
  std::string widths = "272,120,88,16,16";
  std::string data_on_device = "auto";
  CompileFlags compile;
};

std::vector<int64_t> parse_widths(const std::string& text) {
  std::vector<int64_t> w;
  size_t at = 0;
  while (at <= text.size()) {
    size_t comma = text.find(',', at);
    if (comma == std::string::npos) comma = text.size();
    try {
      size_t used = 0;
      const std::string part = text.substr(at, comma - at);
      w.push_back(std::stoll(part, &used));
      if (used != part.size()) throw std::invalid_argument(part);
    } catch (const std::exception&) {
      throw UsageError("--widths " + text + ": expected 5 comma-separated integers");
    }
    at = comma + 1;
  }
  if (w.size() != 5) throw UsageError("--widths " + text + ": expected 5 comma-separated integers");
  return w;
}

bool is_image_name(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  return e == ".jpg" || e == ".jpeg" || e == ".png" || e == ".webp";
}

// Resize so that a crop of `size` takes the central 224/256 of the shorter edge (torchvision's 256 -> 224).
int64_t resize_for(int64_t size) {
  return size * 256 / 224;
}

// One view: the encoder's input (normalized) and the decoder's target (the crop, 8-bit as an image file holds
// it).
struct View {
  std::vector<float> px;
  std::vector<uint8_t> target;
};

View make_view(const image::Image& resized, int64_t size, int64_t top, int64_t left, bool flip) {
  image::Image x = image::crop(resized, top, left, size, size);
  if (flip) x = image::flip_horizontal(x);
  View v;
  v.target.resize(x.data.size());
  for (size_t i = 0; i < x.data.size(); ++i)
    v.target[i] = uint8_t(std::lround(std::clamp(x.data[i], 0.0f, 1.0f) * 255.0f));
  for (size_t i = 0; i < x.data.size(); ++i)
    x.data[i] = float(v.target[i]) / 255.0f;  // the encoder sees the target
  v.px = image::normalize(x);
  return v;
}

StoredTensor u8_tensor(const std::string& name, const Shape& shape, std::vector<uint8_t> bytes) {
  StoredTensor t;
  t.name = name;
  t.dtype = "U8";
  t.shape = shape;
  t.bytes = std::move(bytes);
  return t;
}

// Encodes views in batches with the frozen first layers: features [n, D, g, g].
std::vector<float> encode_views(Session& s, const std::vector<View>& views, int64_t B, int64_t size,
                                int64_t prefix, int64_t grid, int64_t D, const char* what) {
  std::vector<float> feats;
  feats.reserve(views.size() * size_t(D * grid * grid));
  const size_t per = size_t(3 * size * size);
  auto t = Clock::now(), last = t;
  for (size_t first = 0; first < views.size(); first += size_t(B)) {
    std::vector<float> px(size_t(B) * per, 0.0f);
    const size_t used = std::min(views.size() - first, size_t(B));
    for (size_t r = 0; r < used; ++r)
      std::copy(views[first + r].px.begin(), views[first + r].px.end(), px.begin() + ptrdiff_t(r * per));
    s.set_input("pixel_values", px);
    s.run();
    std::vector<float> g = dinovision::patch_grid(s.read("last_hidden_state"), B, prefix, grid, D);
    feats.insert(feats.end(), g.begin(), g.begin() + ptrdiff_t(used) * D * grid * grid);
    const size_t done = first + used;
    if (seconds_since(last) > 10 && done < views.size()) {  // progress on long runs (a CPU backend)
      std::fprintf(stderr, "encoding %s views: %zu/%zu, %.1f s\n", what, done, views.size(),
                   seconds_since(t));
      last = Clock::now();
    }
  }
  std::fprintf(stderr, "encoded %zu %s view(s) in %.2f s\n", views.size(), what, seconds_since(t));
  return feats;
}

struct Metrics {
  double psnr = 0, ssim_median = 0, mse = 0;
  std::vector<double> ssim;
};

// Decodes features [n, D, g, g] in batches: images [n, 3, S, S] clamped to [0, 1].
std::vector<float> decode_all(Session& s, const std::vector<float>& feats, int64_t n, int64_t B,
                              int64_t per_feat, int64_t per_img) {
  std::vector<float> out;
  out.reserve(size_t(n * per_img));
  for (int64_t first = 0; first < n; first += B) {
    const int64_t used = std::min(n - first, B);
    std::vector<float> f(size_t(B * per_feat), 0.0f);
    std::copy(feats.begin() + first * per_feat, feats.begin() + (first + used) * per_feat, f.begin());
    s.set_input("features", f);
    s.run();
    std::vector<float> img = s.read("image");
    out.insert(out.end(), img.begin(), img.begin() + used * per_img);
  }
  for (float& v : out) v = std::clamp(v, 0.0f, 1.0f);
  return out;
}

Metrics metrics_of(const std::vector<float>& recon, const std::vector<float>& target, int64_t n,
                   int64_t size) {
  Metrics m;
  const size_t per = size_t(3 * size * size);
  double se = 0;
  for (size_t i = 0; i < recon.size(); ++i)
    se += (double(recon[i]) - target[i]) * (double(recon[i]) - target[i]);
  m.mse = se / double(recon.size());
  m.psnr = dinovision::psnr(m.mse);
  for (int64_t i = 0; i < n; ++i)
    m.ssim.push_back(dinovision::ssim({recon.begin() + i * per, recon.begin() + (i + 1) * per},
                                      {target.begin() + i * per, target.begin() + (i + 1) * per}, size,
                                      size));
  std::vector<double> s = m.ssim;
  std::sort(s.begin(), s.end());
  m.ssim_median =
      s.empty() ? 0 : (s.size() % 2 ? s[s.size() / 2] : 0.5 * (s[s.size() / 2 - 1] + s[s.size() / 2]));
  return m;
}

// A grid PNG: one row per image, the input crop beside its reconstruction, 4-pixel white gaps.
void write_grid(const std::string& path, const std::vector<float>& inputs, const std::vector<float>& recon,
                int64_t n, int64_t size) {
  const int64_t gap = 4, H = n * size + (n + 1) * gap, W = 2 * size + 3 * gap;
  image::Image g{H, W, std::vector<float>(size_t(3 * H * W), 1.0f), ""};
  const size_t per = size_t(3 * size * size);
  for (int64_t i = 0; i < n; ++i)
    for (int col = 0; col < 2; ++col) {
      const float* src = (col == 0 ? inputs.data() : recon.data()) + size_t(i) * per;
      const int64_t top = gap + i * (size + gap), left = gap + col * (size + gap);
      for (int64_t ch = 0; ch < 3; ++ch)
        for (int64_t y = 0; y < size; ++y)
          std::copy_n(src + (ch * size + y) * size, size, g.data.begin() + (ch * H + top + y) * W + left);
    }
  image::write_png(path, g);
}

std::vector<float> to_float(const std::vector<uint8_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = float(v[i]) / 255.0f;
  return f;
}

int dinovision_train(const VisionArgs& a, const Context& c) {
  auto t0 = Clock::now();
  if (a.image_dirs.empty()) throw UsageError("train: --images DIR is required");
  if (!a.images.empty()) throw UsageError("train: takes --images DIR, not image files (" + a.images[0] + ")");
  if (a.image_size % 16 != 0)
    throw UsageError("--image-size " + std::to_string(a.image_size) + ": not a multiple of 16");
  dinovision::DecoderConfig dcfg{.widths = parse_widths(a.widths)};
  // Images: every file of every folder, sorted; all decoded before anything else.
  std::vector<std::string> paths;
  for (const std::string& d : a.image_dirs) {
    std::vector<std::string> here;
    for (const auto& e : fs::directory_iterator(d))
      if (e.is_regular_file() && is_image_name(e.path())) here.push_back(e.path().string());
    if (here.empty()) throw Error("'" + d + "' holds no .jpg, .jpeg, .png or .webp file");
    std::sort(here.begin(), here.end());
    paths.insert(paths.end(), here.begin(), here.end());
  }
  if (paths.size() < 2)
    throw Error("dinovision train needs at least 2 images (one to train on, one held out), got " +
                std::to_string(paths.size()));
  const int64_t S = a.image_size, R = resize_for(S);
  std::vector<image::Image> resized;
  for (const std::string& p : paths) resized.push_back(image::resize_shorter(image::read(p), R));
  Encoder enc = load_encoder(a.model, a.layers);
  if (a.layers > enc.cfg.num_hidden_layers)
    throw UsageError("--layers " + std::to_string(a.layers) + ": the encoder has " +
                     std::to_string(enc.cfg.num_hidden_layers));
  dcfg.in_channels = enc.cfg.hidden_size;
  dcfg.grid = S / enc.cfg.patch_size;
  if (enc.cfg.patch_size != 16)
    throw Error("dinovision: the decoder upsamples x16; the encoder's patch size is " +
                std::to_string(enc.cfg.patch_size));
  dcfg.validate();
  fs::create_directories(a.run_dir);

  // Split by image: a seeded shuffle, the last holdout share held out (at least one image each side).
  std::mt19937_64 rng(uint64_t(a.seed));
  std::vector<size_t> order(paths.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  size_t n_val = std::max<size_t>(1, size_t(std::lround(a.holdout * double(paths.size()))));
  n_val = std::min(n_val, paths.size() - 1);
  std::vector<size_t> train_idx(order.begin(), order.end() - ptrdiff_t(n_val)),
      val_idx(order.end() - ptrdiff_t(n_val), order.end());
  std::sort(val_idx.begin(), val_idx.end());
  std::sort(train_idx.begin(), train_idx.end());

  // Views: `views` random crops (flipped half the time) per training image; the center crop of each held-out
  // one.
  std::vector<View> train_views, val_views;
  std::vector<std::string> train_names;
  for (size_t i : train_idx)
    for (int64_t v = 0; v < a.views; ++v) {
      const image::Image& im = resized[i];
      const int64_t top = int64_t(rng() % uint64_t(im.height - S + 1)),
                    left = int64_t(rng() % uint64_t(im.width - S + 1));
      train_views.push_back(make_view(im, S, top, left, rng() & 1));
      train_names.push_back(paths[i]);
    }
  for (size_t i : val_idx) {
    const image::Image& im = resized[i];
    image::Image cc = image::center_crop(im, S, S);
    View v;
    v.target.resize(cc.data.size());
    for (size_t k = 0; k < cc.data.size(); ++k)
      v.target[k] = uint8_t(std::lround(std::clamp(cc.data[k], 0.0f, 1.0f) * 255.0f));
    for (size_t k = 0; k < cc.data.size(); ++k) cc.data[k] = float(v.target[k]) / 255.0f;
    v.px = image::normalize(cc);
    val_views.push_back(std::move(v));
  }
  std::fprintf(stderr,
               "dinovision: %zu images, %zu train (%zu views) / %zu held out; %lldx%lld crops; encoder %s\n",
               paths.size(), train_idx.size(), train_views.size(), val_idx.size(), (long long)S, (long long)S,
               enc.source.c_str());

  const int64_t D = enc.cfg.hidden_size, g = dcfg.grid, per_feat = D * g * g, per_img = 3 * S * S;
  // Features, cached: reused when the cache was made from the same images, crops and encoder.
  nlohmann::json key = {{"images", paths},   {"seed", a.seed},       {"views", a.views},
                        {"image_size", S},   {"holdout", a.holdout}, {"encoder", enc.source},
                        {"layers", a.layers}};
  const std::string cache = a.run_dir + "/features.safetensors";
  std::vector<float> train_feats, val_feats;
  bool cached = false;
  if (fs::exists(cache)) {
    SafetensorsFile f = SafetensorsFile::read(cache);
    auto it = f.metadata().find("key");
    if (it != f.metadata().end() && it->second == key.dump()) {
      train_feats = f.get("train.features").to_f32();
      val_feats = f.get("val.features").to_f32();
      cached = train_feats.size() == train_views.size() * size_t(per_feat) &&
               val_feats.size() == val_views.size() * size_t(per_feat);
    }
  }
  if (cached) {
    std::fprintf(stderr, "features from the cache %s\n", cache.c_str());
  } else {
    const int64_t EB = std::min<int64_t>(8, int64_t(train_views.size()));
    Graph eg = dinov3::vit_graph(
        enc.cfg, {.batch = EB, .height = S, .width = S, .layers = a.layers, .final_norm = true});
    Session es = compile(eg, compile_options(c, a.compile, Mode::Infer));
    dinov3::load_weights(es, enc.weights);
    train_feats = encode_views(es, train_views, EB, S, enc.cfg.prefix_tokens(), g, D, "training");
    val_feats = encode_views(es, val_views, EB, S, enc.cfg.prefix_tokens(), g, D, "held-out");
    std::vector<uint8_t> tt, vt;
    for (const View& v : train_views) tt.insert(tt.end(), v.target.begin(), v.target.end());
    for (const View& v : val_views) vt.insert(vt.end(), v.target.begin(), v.target.end());
    nlohmann::json val_names = nlohmann::json::array();
    for (size_t i : val_idx) val_names.push_back(paths[i]);
    write_safetensors(
        cache,
        {StoredTensor::from_f32("train.features", {int64_t(train_views.size()), D, g, g}, train_feats),
         u8_tensor("train.targets", {int64_t(train_views.size()), 3, S, S}, std::move(tt)),
         StoredTensor::from_f32("val.features", {int64_t(val_views.size()), D, g, g}, val_feats),
         u8_tensor("val.targets", {int64_t(val_views.size()), 3, S, S}, std::move(vt))},
        {{"key", key.dump()},
         {"train_images", nlohmann::json(train_names).dump()},
         {"val_images", val_names.dump()},
         {"targets", "u8 RGB crops; /255 for [0, 1]"}});
    std::fprintf(stderr, "wrote the feature cache %s\n", cache.c_str());
  }

  // The data order: epochs of seeded permutations of the training views, written for the PyTorch anchor.
  const int64_t B = a.batch, NT = int64_t(train_views.size());
  std::vector<int32_t> data_order;
  std::mt19937_64 order_rng(uint64_t(a.seed) + 1);
  while (int64_t(data_order.size()) < a.steps * B) {
    std::vector<int32_t> perm(static_cast<size_t>(NT));
    for (int64_t i = 0; i < NT; ++i) perm[size_t(i)] = int32_t(i);
    std::shuffle(perm.begin(), perm.end(), order_rng);
    data_order.insert(data_order.end(), perm.begin(), perm.end());
  }
  data_order.resize(size_t(a.steps * B));
  write_safetensors(a.run_dir + "/order.safetensors",
                    {StoredTensor::from_i32("order", {a.steps, B}, data_order)});

  // The training set on the device (features and targets as states, a step gathers its rows), or uploaded
  // batch by batch from here: the same values either way. auto: on the device when it takes at most 1 GiB.
  const double table_bytes = double(NT) * double(per_feat + per_img) * sizeof(float);
  const bool resident = a.data_on_device == "on" || (a.data_on_device == "auto" && table_bytes <= double(1 << 30));
  // The decoder: its initial weights written first (the anchor starts from them), then Adam steps.
  Graph dg = dinovision::decoder_graph(dcfg, B, Mode::Train, uint64_t(a.seed), resident ? NT : 0);
  Session ts = compile(dg, [&] {
    CompileOptions o = compile_options(c, a.compile, Mode::Train);
    o.optimizer = Adam{.lr = a.lr};
    return o;
  }());
  std::vector<StoredTensor> init;
  for (auto& [name, shape] : dinovision::decoder_parameter_shapes(dcfg))
    init.push_back(StoredTensor::from_f32(name, shape, ts.read(name)));
  write_safetensors(a.run_dir + "/init.safetensors", init);
  nlohmann::json run = {
      {"encoder", enc.source},
      {"encoder_layers", a.layers},
      {"final_norm", true},
      {"image_size", S},
      {"hidden_size", D},
      {"grid", g},
      {"widths", dcfg.widths},
      {"groups", dcfg.groups},
      {"eps", dcfg.eps},
      {"decoder_parameters", dinovision::decoder_parameter_count(dcfg)},
      {"steps", a.steps},
      {"batch", B},
      {"optimizer", {{"name", "Adam"}, {"lr", a.lr}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}}},
      {"loss", "mean squared error against the [0, 1] RGB crop"},
      {"seed", a.seed},
      {"views", a.views},
      {"holdout", a.holdout},
      {"train_images", train_idx.size()},
      {"data_on_device", resident},
      {"val_images", val_idx.size()},
      {"backend", ts.backend()}};
  write_text_atomic(a.run_dir + "/run.json", run.dump(2) + "\n");
  std::fprintf(stderr,
               "decoder: %lld parameters, Adam lr %g, batch %lld, %lld steps, backend %s; ready in %.2f s\n",
               (long long)dinovision::decoder_parameter_count(dcfg), a.lr, (long long)B, (long long)a.steps,
               ts.backend(), seconds_since(t0));

  std::vector<float> x(size_t(B * per_feat)), y(size_t(B * per_img));
  SafetensorsFile cf = SafetensorsFile::read(cache);
  const StoredTensor& targets = cf.get("train.targets");
  if (resident) {
    ts.write_parameter("data.features", train_feats);
    std::vector<float> all(targets.bytes.size());
    for (size_t k = 0; k < all.size(); ++k) all[k] = float(targets.bytes[k]) / 255.0f;
    ts.write_parameter("data.targets", all);
    std::fprintf(stderr, "training set on the device: %lld views, %.1f MiB\n", (long long)NT,
                 table_bytes / (1024.0 * 1024.0));
  }
  auto t1 = Clock::now();
  double recent = 0;
  for (int64_t step = 0; step < a.steps; ++step) {
    if (resident) {
      ts.set_input("rows", std::span<const int32_t>(data_order.data() + step * B, size_t(B)));
    } else {
      for (int64_t r = 0; r < B; ++r) {
        const int64_t i = data_order[size_t(step * B + r)];
        std::copy_n(train_feats.begin() + i * per_feat, per_feat, x.begin() + r * per_feat);
        for (int64_t k = 0; k < per_img; ++k)
          y[size_t(r * per_img + k)] = float(targets.bytes[size_t(i * per_img + k)]) / 255.0f;
      }
      ts.set_input("features", x);
      ts.set_input("target", y);
    }
    ts.step();
    const float loss = ts.read_scalar("loss");
    if (!std::isfinite(loss))
      throw Error("the loss is " + std::to_string(loss) + " at step " + std::to_string(step + 1) +
                  " (lower --lr)");
    recent += loss;
    if ((step + 1) % a.progress == 0 || step + 1 == a.steps) {
      const int64_t n = (step + 1) % a.progress ? (step + 1) % a.progress : a.progress;
      std::fprintf(stderr, "step %lld/%lld: loss %.6f (mean of the last %lld), %.1f steps/s\n",
                   (long long)(step + 1), (long long)a.steps, recent / double(n), (long long)n,
                   double(step + 1) / seconds_since(t1));
      recent = 0;
    }
  }
  const double train_s = seconds_since(t1);
  std::vector<StoredTensor> trained;
  for (auto& [name, shape] : dinovision::decoder_parameter_shapes(dcfg))
    trained.push_back(StoredTensor::from_f32(name, shape, ts.read(name)));
  write_safetensors(a.run_dir + "/decoder.safetensors", trained, {{"run", "run.json"}});

  // Held-out evaluation.
  const int64_t NV = int64_t(val_views.size()), VB = std::min<int64_t>(8, NV);
  Graph ig = dinovision::decoder_graph(dcfg, VB, Mode::Infer);
  Session is = compile(ig, compile_options(c, a.compile, Mode::Infer));
  for (const StoredTensor& t : trained) is.write_parameter(t.name, t.to_f32());
  std::vector<float> recon = decode_all(is, val_feats, NV, VB, per_feat, per_img);
  std::vector<float> vt = to_float(cf.get("val.targets").bytes);
  Metrics m = metrics_of(recon, vt, NV, S);
  nlohmann::json per_image = nlohmann::json::array();
  for (size_t i = 0; i < val_idx.size(); ++i)
    per_image.push_back({{"image", paths[val_idx[i]]}, {"ssim", m.ssim[i]}});
  nlohmann::json metrics = {
      {"psnr_db", m.psnr},
      {"ssim_median", m.ssim_median},
      {"mse", m.mse},
      {"val_images", NV},
      {"steps", a.steps},
      {"train_seconds", train_s},
      {"backend", ts.backend()},
      {"per_image", per_image},
      {"psnr", "10 log10(1 / mse), mse over every pixel of every held-out crop (clamped to [0, 1])"},
      {"ssim", "11x11 Gaussian window (sigma 1.5), K1 0.01, K2 0.03, as skimage with gaussian_weights"}};
  write_text_atomic(a.run_dir + "/metrics.json", metrics.dump(2) + "\n");
  const int64_t shown = std::min<int64_t>(NV, 8);
  write_grid(a.run_dir + "/grid.png", vt, recon, shown, S);
  std::printf("held out: %lld images, PSNR %.3f dB, median SSIM %.4f (%s/metrics.json, %s/grid.png)\n",
              (long long)NV, m.psnr, m.ssim_median, a.run_dir.c_str(), a.run_dir.c_str());
  return 0;
}

int dinovision_reconstruct(const VisionArgs& a, const Context& c) {
  if (a.images.empty()) throw UsageError("reconstruct: give IMAGE files");
  if (a.out.empty()) throw UsageError("reconstruct: --out grid.png is required");
  if (!a.image_dirs.empty()) throw UsageError("reconstruct: takes image files, not --images");
  check_out_parent(a.out, "--out");
  const std::string run_path = a.run_dir + "/run.json";
  std::ifstream rf(run_path);
  if (!rf)
    throw Error("cannot open '" + run_path + "' (train first: mgn dinovision train --out-dir " + a.run_dir +
                ")");
  nlohmann::json run;
  try {
    run = nlohmann::json::parse(rf);
  } catch (const nlohmann::json::exception& e) {
    throw Error(run_path + ": not valid JSON: " + e.what());
  }
  dinovision::DecoderConfig dcfg;
  int64_t S = 0, layers = 0;
  std::string encoder;
  try {
    S = run.at("image_size").get<int64_t>();
    layers = run.at("encoder_layers").get<int64_t>();
    encoder = run.at("encoder").get<std::string>();
    dcfg.widths = run.at("widths").get<std::vector<int64_t>>();
    dcfg.groups = run.at("groups").get<int64_t>();
    dcfg.grid = run.at("grid").get<int64_t>();
    dcfg.in_channels = run.at("hidden_size").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(run_path + ": " + e.what());
  }
  dcfg.validate();
  Encoder enc = load_encoder(encoder.starts_with("paper sine") ? std::string() : encoder, layers);
  if (enc.cfg.hidden_size != dcfg.in_channels || S / enc.cfg.patch_size != dcfg.grid)
    throw Error(run_path + ": the decoder's input (" + std::to_string(dcfg.in_channels) +
                " channels) does not match the encoder " + enc.source);
  TensorSet dec = read_tensor_set(a.run_dir + "/decoder.safetensors");
  std::vector<std::pair<std::string, std::vector<float>>> dw;
  for (auto& [name, shape] : dinovision::decoder_parameter_shapes(dcfg))
    dw.push_back({name, dec.values_f32(name, shape)});
  std::vector<View> views;
  for (const std::string& p : a.images) {
    image::Image im = image::center_crop(image::resize_shorter(image::read(p), resize_for(S)), S, S);
    View v;
    v.target.resize(im.data.size());
    for (size_t k = 0; k < im.data.size(); ++k)
      v.target[k] = uint8_t(std::lround(std::clamp(im.data[k], 0.0f, 1.0f) * 255.0f));
    for (size_t k = 0; k < im.data.size(); ++k) im.data[k] = float(v.target[k]) / 255.0f;
    v.px = image::normalize(im);
    views.push_back(std::move(v));
  }
  const int64_t n = int64_t(views.size()), B = std::min<int64_t>(8, n), D = dcfg.in_channels, g = dcfg.grid;
  Graph eg =
      dinov3::vit_graph(enc.cfg, {.batch = B, .height = S, .width = S, .layers = layers, .final_norm = true});
  Session es = compile(eg, compile_options(c, a.compile, Mode::Infer));
  dinov3::load_weights(es, enc.weights);
  std::vector<float> feats = encode_views(es, views, B, S, enc.cfg.prefix_tokens(), g, D, "input");
  Graph dg = dinovision::decoder_graph(dcfg, B, Mode::Infer);
  Session ds = compile(dg, compile_options(c, a.compile, Mode::Infer));
  for (auto& [name, v] : dw) ds.write_parameter(name, v);
  std::vector<float> recon = decode_all(ds, feats, n, B, D * g * g, 3 * S * S);
  std::vector<float> inputs;
  for (const View& v : views) {
    std::vector<float> f = to_float(v.target);
    inputs.insert(inputs.end(), f.begin(), f.end());
  }
  Metrics m = metrics_of(recon, inputs, n, S);
  for (int64_t i = 0; i < n; ++i)
    std::printf("%s: SSIM %.4f\n", a.images[size_t(i)].c_str(), m.ssim[size_t(i)]);
  std::printf("%lld images: PSNR %.3f dB, median SSIM %.4f\n", (long long)n, m.psnr, m.ssim_median);
  write_grid(a.out, inputs, recon, n, S);
  std::fprintf(stderr, "wrote %s\n", a.out.c_str());
  return 0;
}

}  // namespace

Run declare_dinov3_embed(CLI::App& app) {
  auto a = std::make_shared<EmbedArgs>();
  app.add_option("IMAGE", a->images, "image files (JPEG, PNG, WebP)")->required()->check(CLI::ExistingFile);
  app.add_option("--model", a->model, "a Hugging Face DINOv3 ViT directory (config.json, model.safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--out", a->out,
                 "write <image>.cls [hidden] and <image>.patches [patches, hidden] to this safetensors file");
  app.add_option("--resize", a->resize,
                 "shorter edge after resizing (antialiased bilinear); 0: keep the size")
      ->check(at_least(0));
  app.add_option("--crop", a->crop,
                 "center crop size; 0: no crop (the size must then be a multiple of the patch size)")
      ->check(at_least(0));
  app.add_option("--batch", a->batch, "images per run (default: the image count, at most 8)")
      ->check(at_least(1));
  app.add_option("--layers", a->layers, "run only the first N layers (the final norm still applies); 0: all")
      ->check(at_least(0));
  add_compile_flags(app, a->compile);
  app.footer(
      "Each image is decoded, resized (shorter edge 256), center-cropped (224) and ImageNet-normalized, as\n"
      "torchvision's Resize/CenterCrop/Normalize; the model's CLS row and patch rows (after the final norm)\n"
      "are printed as norm/mean/std and, with --out, saved under the image's name.");
  return [a](const Context& c) { return dinov3_embed(*a, c); };
}

Run declare_dinovision(CLI::App& app) {
  auto a = std::make_shared<VisionArgs>();
  app.add_option("ACTION", a->action, "train or reconstruct")
      ->required()
      ->check(CLI::IsMember({"train", "reconstruct"}));
  app.add_option("IMAGE", a->images, "reconstruct: image files")->check(CLI::ExistingFile);
  app.add_option("--images", a->image_dirs, "train: folders of images (.jpg, .jpeg, .png, .webp)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--run", a->run_dir,
                 "the run folder: train writes its cache, weights and metrics there; reconstruct reads it");
  app.add_option("--out", a->out, "reconstruct: the grid PNG (inputs beside reconstructions)");
  app.add_option("--model", a->model,
                 "train: a Hugging Face DINOv3 ViT directory (default: ViT-S/16 with the paper's sine init)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--steps", a->steps, "train: Adam updates")->check(at_least(1));
  app.add_option("--batch", a->batch, "train: batch size")->check(at_least(1));
  app.add_option("--lr", a->lr, "train: Adam learning rate")->check(positive_number());
  app.add_option("--views", a->views, "train: random crops (flipped half the time) cached per training image")
      ->check(at_least(1));
  app.add_option("--holdout", a->holdout, "train: share of the images held out (split by image)")
      ->check(CLI::Range(0.0, 0.9));
  app.add_option("--image-size", a->image_size,
                 "train: crop size (a multiple of 16; images are resized to size·256/224 first)")
      ->check(at_least(16));
  app.add_option("--layers", a->layers, "train: encoder layers run (the paper: 3)")->check(at_least(1));
  app.add_option("--widths", a->widths,
                 "train: the decoder's 5 widths (conv_in/block, then after each upsampling)");
  app.add_option("--seed", a->seed, "train: split, crops, data order and decoder init")->check(at_least(0));
  app.add_option("--progress", a->progress, "train: print the loss every N steps")->check(at_least(1));
  app.add_option("--data-on-device", a->data_on_device,
                 "train: keep the training features and targets on the device, a step gathering its rows (on), "
                 "upload each batch (off), or on when they take at most 1 GiB (auto); the same results either way")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  add_compile_flags(app, a->compile);
  app.footer(
      "train: images are split by image (a seeded shuffle; --holdout of them held out), training images "
      "give\n"
      "--views random crops with flips, held-out ones their center crop; features of the frozen encoder's "
      "first\n"
      "layers are computed once and cached (RUN/features.safetensors); only the decoder trains (Adam, MSE).\n"
      "Writes RUN/run.json, init.safetensors, order.safetensors, decoder.safetensors, metrics.json (global "
      "PSNR,\n"
      "median SSIM on the held-out images) and grid.png.\n"
      "reconstruct: center crops of the given images through the trained encoder + decoder into a grid PNG.");
  return [a](const Context& c) {
    if (a->action == "train") {
      if (!a->out.empty()) throw UsageError("train: --out is for reconstruct (train writes into --run)");
      if (a->image_dirs.empty()) throw UsageError("train: --images DIR is required");
      if (a->image_size % 16 != 0)
        throw UsageError("--image-size " + std::to_string(a->image_size) + ": not a multiple of 16");
      parse_widths(a->widths);
      return dinovision_train(*a, c);
    }
    return dinovision_reconstruct(*a, c);
  };
}

}  // namespace mgn::tool
