// The NNEF binary tensor format (.dat): a 128-byte little-endian header — magic 0x4E 0xEF, version 1.0,
// data length in bytes, rank, eight u32 extents, bits per item, item type, 19 reserved words — then the items
// in row-major order (logical 1-bit items packed most significant bit first).
#include <cstring>
#include <fstream>
#include <sstream>

#include "mgn/nnef.h"

namespace mgn::nnef {

namespace {

constexpr size_t kHeader = 128;
constexpr uint32_t kMaxDim = 8;
// A bound on the elements one file may declare, so a hostile header cannot ask for unbounded memory.
constexpr uint64_t kMaxElements = uint64_t(1) << 28;

uint32_t u32(const std::string& b, size_t off) {
  uint32_t v;
  std::memcpy(&v, b.data() + off, 4);
  return v;
}

const char* type_name(uint32_t t) {
  switch (t) {
    case 0: return "float";
    case 1: return "unsigned integer";
    case 2: return "quantized unsigned integer";
    case 3: return "quantized signed integer";
    case 4: return "signed integer";
    case 5: return "logical";
    default: return "unknown";
  }
}

template <typename T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

void put32(std::string& b, size_t off, uint32_t v) { std::memcpy(b.data() + off, &v, 4); }

}  // namespace

TensorData read_tensor_bytes(const std::string& b, const std::string& origin) {
  auto bad = [&](const std::string& why) { return Error(origin + ": not a valid NNEF tensor file: " + why); };
  if (b.size() < kHeader)
    throw bad("the file holds " + std::to_string(b.size()) + " bytes, shorter than the 128-byte header (truncated)");
  if (static_cast<unsigned char>(b[0]) != 0x4E || static_cast<unsigned char>(b[1]) != 0xEF)
    throw bad("bad magic (expected bytes 0x4E 0xEF)");
  if (b[2] != 1 || b[3] != 0)
    throw bad("version " + std::to_string(int(static_cast<unsigned char>(b[2]))) + "." +
              std::to_string(int(static_cast<unsigned char>(b[3]))) + " (expected 1.0)");
  const uint32_t data_len = u32(b, 4), rank = u32(b, 8), bits = u32(b, 44), code = u32(b, 48);
  if (rank > kMaxDim) throw bad("rank " + std::to_string(rank) + " (at most 8)");
  TensorData t;
  uint64_t count = 1;
  for (uint32_t i = 0; i < rank; ++i) {
    uint32_t e = u32(b, 12 + 4 * i);
    t.shape.push_back(int64_t(e));
    count *= e;
    if (count > kMaxElements) throw bad("shape " + shape_str(t.shape) + " has too many elements");
  }
  if (rank > uint32_t(kMaxRank)) throw bad("rank " + std::to_string(rank) + " (mgn tensors have at most " +
                                          std::to_string(kMaxRank) + " axes)");
  if (code >> 16) throw bad("vendor-specific item type 0x" + [&] {
    std::ostringstream s;
    s << std::hex << code;
    return s.str();
  }() + " is not supported");
  t.item_type = ItemType(code);
  t.bits = bits;
  bool ok = false;
  switch (code) {
    case 0: ok = bits == 16 || bits == 32 || bits == 64; break;
    case 1:
    case 4: ok = bits == 8 || bits == 16 || bits == 32 || bits == 64; break;
    case 5: ok = bits == 1 || bits == 8; break;
    case 2:
    case 3:
      throw bad(std::string(type_name(code)) + " items are not supported (dequantize to float first)");
    default: throw bad("item type " + std::to_string(code) + " is unknown");
  }
  if (!ok) throw bad(std::to_string(bits) + "-bit " + type_name(code) + " items are not supported");
  const uint64_t need = (count * bits + 7) / 8;
  if (data_len != need)
    throw bad("the header's data length " + std::to_string(data_len) + " disagrees with shape " + shape_str(t.shape) +
              " of " + std::to_string(bits) + "-bit items (" + std::to_string(need) + " bytes)");
  if (b.size() - kHeader < need)
    throw bad("truncated: the data holds " + std::to_string(b.size() - kHeader) + " bytes, shape " +
              shape_str(t.shape) + " needs " + std::to_string(need));
  if (b.size() - kHeader > need)
    throw bad(std::to_string(b.size() - kHeader - need) + " bytes after the data (shape " + shape_str(t.shape) +
              " needs " + std::to_string(need) + "; files from old NNEF-Tools carry 4 extra header bytes)");
  const char* p = b.data() + kHeader;
  t.values.resize(size_t(count));
  const size_t w = bits / 8;
  for (size_t i = 0; i < size_t(count); ++i) {
    double& v = t.values[i];
    const char* q = p + i * w;
    switch (code) {
      case 0:
        v = bits == 16 ? double(half_to_float(load<uint16_t>(q))) : bits == 32 ? double(load<float>(q)) : load<double>(q);
        break;
      case 1:
        v = bits == 8    ? double(load<uint8_t>(q))
            : bits == 16 ? double(load<uint16_t>(q))
            : bits == 32 ? double(load<uint32_t>(q))
                         : double(load<uint64_t>(q));
        break;
      case 4:
        v = bits == 8    ? double(load<int8_t>(q))
            : bits == 16 ? double(load<int16_t>(q))
            : bits == 32 ? double(load<int32_t>(q))
                         : double(load<int64_t>(q));
        break;
      default:  // logical
        v = bits == 1 ? double((static_cast<unsigned char>(p[i / 8]) >> (7 - i % 8)) & 1) : double(p[i] != 0);
    }
  }
  return t;
}

TensorData read_tensor_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open the tensor file");
  std::stringstream ss;
  ss << f.rdbuf();
  return read_tensor_bytes(ss.str(), path);
}

std::string write_tensor_bytes(const Shape& shape, const std::vector<double>& values, ItemType type, uint32_t bits) {
  const uint32_t code = uint32_t(type);
  if (shape.size() > kMaxDim) throw Error("NNEF tensor: rank " + std::to_string(shape.size()) + " (at most 8)");
  if (int64_t(values.size()) != numel(shape))
    throw Error("NNEF tensor: " + std::to_string(values.size()) + " values for shape " + shape_str(shape));
  bool ok = (code == 0 && (bits == 16 || bits == 32 || bits == 64)) ||
            ((code == 1 || code == 4) && (bits == 8 || bits == 16 || bits == 32 || bits == 64)) ||
            (code == 5 && (bits == 1 || bits == 8));
  if (!ok) throw Error("NNEF tensor: cannot write " + std::to_string(bits) + "-bit " + type_name(code) + " items");
  const size_t n = values.size(), len = (n * bits + 7) / 8;
  std::string b(kHeader + len, '\0');
  b[0] = char(0x4E);
  b[1] = char(0xEF);
  b[2] = 1;
  put32(b, 4, uint32_t(len));
  put32(b, 8, uint32_t(shape.size()));
  for (size_t i = 0; i < shape.size(); ++i) put32(b, 12 + 4 * i, uint32_t(shape[i]));
  put32(b, 44, bits);
  put32(b, 48, code);
  char* p = b.data() + kHeader;
  const size_t w = bits / 8;
  for (size_t i = 0; i < n; ++i) {
    const double v = values[i];
    char* q = p + i * w;
    auto store = [&](auto x) { std::memcpy(q, &x, sizeof(x)); };
    if (code == 0) {
      if (bits == 16) store(float_to_half(float(v)));
      else if (bits == 32) store(float(v));
      else store(v);
    } else if (code == 5) {
      if (bits == 1) p[i / 8] = char(static_cast<unsigned char>(p[i / 8]) | ((v != 0 ? 1 : 0) << (7 - i % 8)));
      else p[i] = v != 0 ? 1 : 0;
    } else if (bits == 8) {
      code == 1 ? store(uint8_t(v)) : store(int8_t(v));
    } else if (bits == 16) {
      code == 1 ? store(uint16_t(v)) : store(int16_t(v));
    } else if (bits == 32) {
      code == 1 ? store(uint32_t(v)) : store(int32_t(v));
    } else {
      code == 1 ? store(uint64_t(v)) : store(int64_t(v));
    }
  }
  return b;
}

}  // namespace mgn::nnef
