// Text forms of the kernel options (include/mgn/options.h): parsed from the MGN_* variables and the
// command line, printed into benchmark records. Every malformed text is an mgn::Error naming who gave it.
#include "mgn/options.h"

#include <cctype>
#include <cstdlib>
#include <vector>

#include "mgn/types.h"

namespace mgn {
namespace {

// `count` positive numbers (at most 4096) separated by 'x'.
std::vector<uint32_t> parse_dims(const std::string& text, size_t count, const std::string& who) {
  std::vector<uint32_t> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t x = text.find('x', pos);
    std::string part = text.substr(pos, x == std::string::npos ? std::string::npos : x - pos);
    char* end = nullptr;
    unsigned long v = std::strtoul(part.c_str(), &end, 10);
    if (part.empty() || !end || *end || v == 0 || v > 4096)
      throw Error(who + ": expected " + std::to_string(count) + " positive numbers separated by 'x', got '" +
                  text + "'");
    out.push_back(uint32_t(v));
    if (x == std::string::npos) break;
    pos = x + 1;
  }
  if (out.size() != count)
    throw Error(who + ": expected " + std::to_string(count) + " numbers separated by 'x', got '" + text + "'");
  return out;
}

bool is_auto(const std::string& text) { return text.empty() || text == "auto"; }

}  // namespace

GemmKernel parse_gemm_kernel(const std::string& text, const std::string& who) {
  if (is_auto(text)) return GemmKernel::Auto;
  if (text == "simt" || text == "tiled") return GemmKernel::Tiled;
  if (text == "small") return GemmKernel::Small;
  throw Error(who + ": expected auto, simt or small, got '" + text + "'");
}

AttentionKernel parse_attention_kernel(const std::string& text, const std::string& who) {
  if (is_auto(text)) return AttentionKernel::Auto;
  if (text == "row") return AttentionKernel::Row;
  if (text == "tiled") return AttentionKernel::Tiled;
  if (text == "matmul") return AttentionKernel::Matmul;
  throw Error(who + ": expected auto, row, tiled or matmul, got '" + text + "'");
}

GemmAblation parse_gemm_ablation(const std::string& text, const std::string& who) {
  if (text.empty()) return GemmAblation::None;
  if (text == "noload") return GemmAblation::NoLoad;
  if (text == "nomma") return GemmAblation::NoMma;
  if (text == "mmaonly") return GemmAblation::MmaOnly;
  if (text == "fragonly") return GemmAblation::FragOnly;
  throw Error(who + ": expected noload, nomma, mmaonly or fragonly, got '" + text + "'");
}

GemmTile parse_gemm_tile(const std::string& text, bool coopmat, const std::string& who) {
  GemmTile t;
  if (is_auto(text)) return t;
  size_t pos = 0;
  bool first = true;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string field = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (field.empty()) throw Error(who + ": empty field in '" + text + "'");
    const char tag = field[0];
    const std::string rest = field.substr(1);
    if (first && std::isdigit(static_cast<unsigned char>(tag))) {
      auto d = parse_dims(field, 3, who);
      t.bm = d[0], t.bn = d[1], t.bk = d[2];
    } else if (!coopmat && tag == 't') {
      auto d = parse_dims(rest, 2, who);
      t.tm = d[0], t.tn = d[1];
    } else if (!coopmat && tag == 'l') {
      auto d = parse_dims(rest, 2, who);
      t.lx = d[0], t.ly = d[1];
    } else if (coopmat && tag == 'w') {
      auto d = parse_dims(rest, 2, who);
      t.wm = d[0], t.wn = d[1];
    } else if (tag == 'g') {
      t.group_m = parse_dims(rest, 1, who)[0];
    } else if (tag == 's') {
      t.splits = parse_dims(rest, 1, who)[0];
    } else if (coopmat && (tag == 'b' || tag == 'p' || tag == 'd')) {
      throw Error(who + ": field '" + field + "' in '" + text + "': the f16 GEMM's b (one shared buffer), p (two "
                  "slices in flight) and d (fragments from global memory) variants were removed after they "
                  "measured slower than the default (docs/perf-notes.md, \"Kept variants\")");
    } else {
      throw Error(who + ": unknown field '" + field + "' in '" + text + "' (expected " +
                  (coopmat ? "BMxBNxBK, wWMxWN, gG, sS" : "BMxBNxBK, tTMxTN, lLXxLY, gG, sS") + ")");
    }
    first = false;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return t;
}

ConvTile parse_conv_tile(const std::string& text, const std::string& who) {
  if (is_auto(text)) return {};
  const char* expected = "BPxBQxBK with BP in {32, 64, 128}, BQ in {16, 32, 64, 128}, BK in {8, 16, 32}";
  std::vector<uint32_t> d;
  try {
    d = parse_dims(text, 3, who);
  } catch (const Error&) {
    throw Error(who + "='" + text + "': expected " + expected);
  }
  const bool ok = (d[0] == 32 || d[0] == 64 || d[0] == 128) &&
                  (d[1] == 16 || d[1] == 32 || d[1] == 64 || d[1] == 128) && (d[2] == 8 || d[2] == 16 || d[2] == 32);
  if (!ok) throw Error(who + "='" + text + "': expected " + expected);
  return {d[0], d[1], d[2]};
}

TuneMode parse_tune_mode(const std::string& text, const std::string& who) {
  if (text == "off" || text.empty()) return TuneMode::Off;
  if (text == "use") return TuneMode::Use;
  if (text == "measure") return TuneMode::Measure;
  throw Error(who + ": expected off, use or measure, got '" + text + "'");
}

const char* tune_mode_name(TuneMode m) {
  switch (m) {
    case TuneMode::Off: return "off";
    case TuneMode::Use: return "use";
    case TuneMode::Measure: return "measure";
  }
  return "?";
}

const char* gemm_kernel_name(GemmKernel k) {
  switch (k) {
    case GemmKernel::Auto: return "auto";
    case GemmKernel::Tiled: return "simt";
    case GemmKernel::Small: return "small";
  }
  return "?";
}

const char* attention_kernel_name(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::Auto: return "auto";
    case AttentionKernel::Row: return "row";
    case AttentionKernel::Tiled: return "tiled";
    case AttentionKernel::Matmul: return "matmul";
  }
  return "?";
}

const char* gemm_ablation_name(GemmAblation a) {
  switch (a) {
    case GemmAblation::None: return "";
    case GemmAblation::NoLoad: return "noload";
    case GemmAblation::NoMma: return "nomma";
    case GemmAblation::MmaOnly: return "mmaonly";
    case GemmAblation::FragOnly: return "fragonly";
  }
  return "?";
}

std::string gemm_tile_str(const GemmTile& t, bool coopmat) {
  if (t.is_auto()) return "auto";
  auto n = [](uint32_t v) { return std::to_string(v); };
  std::string s = n(t.bm) + "x" + n(t.bn) + "x" + n(t.bk);
  if (!coopmat && (t.tm || t.tn)) s += ",t" + n(t.tm) + "x" + n(t.tn);
  if (!coopmat && (t.lx || t.ly)) s += ",l" + n(t.lx) + "x" + n(t.ly);
  if (coopmat && (t.wm || t.wn)) s += ",w" + n(t.wm) + "x" + n(t.wn);
  if (t.group_m) s += ",g" + n(t.group_m);
  if (t.splits) s += ",s" + n(t.splits);
  return s;
}

std::string conv_tile_str(const ConvTile& t) {
  if (t.is_auto()) return "auto";
  return std::to_string(t.bp) + "x" + std::to_string(t.bq) + "x" + std::to_string(t.bk);
}

}  // namespace mgn
