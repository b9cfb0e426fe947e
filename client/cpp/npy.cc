// .npy reading/writing and the .npy <-> HostTensor conventions (see npy.h).
#include "client/cpp/npy.h"

#include <cctype>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

namespace fusebox::client {
namespace {

constexpr char kMagic[] = "\x93NUMPY";

size_t ItemSize(const std::string& descr) {
  if (descr.size() < 3) return 0;
  return static_cast<size_t>(std::atoi(descr.c_str() + 2));
}

// Finds 'key': in a header dict and returns the offset just past the colon.
std::optional<size_t> FindKey(const std::string& h, const std::string& key) {
  for (const char q : {'\'', '"'}) {
    const std::string k = std::string(1, q) + key + std::string(1, q);
    size_t p = h.find(k);
    if (p == std::string::npos) continue;
    p = h.find(':', p + k.size());
    if (p != std::string::npos) return p + 1;
  }
  return std::nullopt;
}

size_t SkipSpace(const std::string& h, size_t p) {
  while (p < h.size() && std::isspace(static_cast<unsigned char>(h[p]))) ++p;
  return p;
}

}  // namespace

absl::StatusOr<NpyArray> ParseNpy(const std::string& f) {
  if (f.size() < 10 || f.compare(0, 6, kMagic, 6) != 0) {
    return absl::InvalidArgumentError("not a .npy file (bad magic)");
  }
  const int major = static_cast<unsigned char>(f[6]);
  size_t header_len = 0, offset = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(f[8]) | (static_cast<unsigned char>(f[9]) << 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (f.size() < 12) return absl::InvalidArgumentError(".npy file truncated in its header");
    for (int i = 0; i < 4; ++i) header_len |= size_t{static_cast<unsigned char>(f[8 + i])} << (8 * i);
    offset = 12;
  } else {
    return absl::InvalidArgumentError(".npy format version " + std::to_string(major) +
                                      " is not supported (1, 2 and 3 are)");
  }
  if (f.size() < offset + header_len) return absl::InvalidArgumentError(".npy file truncated in its header");
  const std::string h = f.substr(offset, header_len);
  NpyArray a;

  auto p = FindKey(h, "descr");
  if (!p) return absl::InvalidArgumentError(".npy header has no 'descr'");
  size_t i = SkipSpace(h, *p);
  if (i >= h.size() || (h[i] != '\'' && h[i] != '"')) {
    return absl::InvalidArgumentError(".npy structured dtypes are not supported");
  }
  const size_t end = h.find(h[i], i + 1);
  if (end == std::string::npos) return absl::InvalidArgumentError(".npy header: bad 'descr'");
  a.descr = h.substr(i + 1, end - i - 1);
  if (a.descr.size() == 3 && a.descr[0] == '=') a.descr[0] = '<';  // native = little-endian here
  if (!a.descr.empty() && a.descr[0] == '>') {
    return absl::InvalidArgumentError("big-endian .npy data ('" + a.descr +
                                      "') is not supported; save with dtype '<" + a.descr.substr(1) + "'");
  }

  p = FindKey(h, "fortran_order");
  if (p && h.compare(SkipSpace(h, *p), 4, "True") == 0) {
    return absl::InvalidArgumentError(
        "Fortran-order .npy files are not supported; save np.ascontiguousarray(x)");
  }

  p = FindKey(h, "shape");
  if (!p) return absl::InvalidArgumentError(".npy header has no 'shape'");
  i = SkipSpace(h, *p);
  if (i >= h.size() || h[i] != '(') return absl::InvalidArgumentError(".npy header: bad 'shape'");
  const size_t close = h.find(')', i);
  if (close == std::string::npos) return absl::InvalidArgumentError(".npy header: bad 'shape'");
  std::string dims = h.substr(i + 1, close - i - 1);
  std::stringstream ss(dims);
  std::string item;
  int64_t count = 1;
  while (std::getline(ss, item, ',')) {
    size_t s = SkipSpace(item, 0);
    if (s == item.size()) continue;
    char* e = nullptr;
    const long long d = std::strtoll(item.c_str() + s, &e, 10);
    const size_t rest = SkipSpace(item, static_cast<size_t>(e - item.c_str()));
    if (e == item.c_str() + s || d < 0 || rest != item.size()) {
      return absl::InvalidArgumentError(".npy header: bad dim '" + item + "'");
    }
    if (d != 0 && count > std::numeric_limits<int64_t>::max() / d) {
      return absl::InvalidArgumentError(".npy shape overflows");
    }
    count *= d;
    a.shape.push_back(d);
  }

  const size_t item_size = ItemSize(a.descr);
  if (item_size == 0) return absl::InvalidArgumentError(".npy dtype '" + a.descr + "' is not understood");
  const size_t data_off = offset + header_len;
  if (static_cast<uint64_t>(count) > std::numeric_limits<size_t>::max() / item_size) {
    return absl::InvalidArgumentError(".npy shape overflows");
  }
  const size_t need = static_cast<size_t>(count) * item_size;
  if (f.size() - data_off != need) {
    return absl::InvalidArgumentError(".npy data is " + std::to_string(f.size() - data_off) +
                                      " bytes; shape and dtype need " + std::to_string(need));
  }
  a.data = f.substr(data_off);
  return a;
}

std::string SerializeNpy(const NpyArray& a) {
  std::string dict = "{'descr': '" + a.descr + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < a.shape.size(); ++i) {
    dict += std::to_string(a.shape[i]);
    if (a.shape.size() == 1 || i + 1 < a.shape.size()) dict += a.shape.size() == 1 ? "," : ", ";
  }
  dict += "), }";
  // Pad with spaces + '\n' so the data starts on a 64-byte boundary.
  const bool v2 = dict.size() + 1 + 10 > 65535;
  const size_t pre = v2 ? 12 : 10;
  size_t total = pre + dict.size() + 1;
  total = (total + 63) / 64 * 64;
  dict.append(total - pre - dict.size() - 1, ' ');
  dict.push_back('\n');
  std::string out(kMagic, 6);
  out.push_back(static_cast<char>(v2 ? 2 : 1));
  out.push_back(0);
  const size_t hl = dict.size();
  for (size_t i = 0; i < (v2 ? 4u : 2u); ++i) out.push_back(static_cast<char>((hl >> (8 * i)) & 0xff));
  out += dict;
  out += a.data;
  return out;
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError("cannot open " + path + ": " + std::strerror(errno));
  std::ostringstream buf;
  buf << in.rdbuf();
  auto a = ParseNpy(buf.str());
  if (!a.ok()) return absl::Status(a.status().code(), path + ": " + std::string(a.status().message()));
  return a;
}

absl::Status WriteNpy(const std::string& path, const NpyArray& array) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError("cannot write " + path + ": " + std::strerror(errno));
  const std::string bytes = SerializeNpy(array);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::InternalError("error writing " + path);
  return absl::OkStatus();
}

absl::StatusOr<HostTensor> NpyToTensor(const NpyArray& a, std::optional<DType> want) {
  DType have;
  if (a.descr == "<f4") have = DType::kFloat32;
  else if (a.descr == "<f2") have = DType::kFloat16;
  else if (a.descr == "<u2") have = DType::kBFloat16;  // raw bfloat16 bit patterns
  else if (a.descr == "<f8") have = DType::kFloat32;   // narrowed below
  else {
    return absl::InvalidArgumentError("unsupported .npy dtype '" + a.descr +
                                      "' (use '<f4', '<f2', '<f8', or '<u2' for bfloat16 bits)");
  }
  const DType to = want.value_or(have);
  HostTensor t;
  t.dtype = to;
  t.shape = a.shape;
  if (a.descr != "<f8" && to == have) {
    t.data = a.data;
    return t;
  }
  const size_t n = a.data.size() / ItemSize(a.descr);
  t.data.resize(n * ElementSize(to));
  for (size_t i = 0; i < n; ++i) {
    float v;
    if (a.descr == "<f8") {
      double d;
      std::memcpy(&d, a.data.data() + 8 * i, 8);
      // One rounding to the target: round to odd on the way through float32.
      v = to == DType::kFloat32 ? static_cast<float>(d) : DoubleToFloatRoundToOdd(d);
    } else {
      v = LoadAsFloat(have, a.data.data(), i);
    }
    StoreFromFloat(to, t.data.data(), i, v);
  }
  return t;
}

NpyArray TensorToNpy(const HostTensor& t, bool bf16_bits) {
  NpyArray a;
  a.shape = t.shape;
  switch (t.dtype) {
    case DType::kFloat32: a.descr = "<f4"; a.data = t.data; break;
    case DType::kFloat16: a.descr = "<f2"; a.data = t.data; break;
    case DType::kBFloat16:
      if (bf16_bits) {
        a.descr = "<u2";
        a.data = t.data;
      } else {
        a.descr = "<f4";
        const size_t n = t.data.size() / 2;
        a.data.resize(n * 4);
        for (size_t i = 0; i < n; ++i) {
          const float v = LoadAsFloat(DType::kBFloat16, t.data.data(), i);
          std::memcpy(&a.data[4 * i], &v, 4);
        }
      }
      break;
  }
  return a;
}

}  // namespace fusebox::client
