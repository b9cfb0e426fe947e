// .npy reading/writing and the .npy <-> HostTensor conventions (see npy.h).
#include "client/cpp/npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>

#include "absl/strings/string_view.h"

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


// Parses the header of the .npy file whose bytes are f, filling *a but for its data; returns
// the offset of the data, which it has checked to be exactly what the shape and dtype need.
absl::StatusOr<size_t> ParseNpyHeader(absl::string_view f, NpyArray* out) {
  if (f.size() < 10 || f.compare(0, 6, absl::string_view(kMagic, 6)) != 0) {
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
  const std::string h(f.substr(offset, header_len));
  NpyArray& a = *out;

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
  return data_off;
}

}  // namespace

absl::StatusOr<NpyArray> ParseNpy(const std::string& f) {
  NpyArray a;
  auto data_off = ParseNpyHeader(f, &a);
  if (!data_off.ok()) return data_off.status();
  a.data = f.substr(*data_off);
  return a;
}

std::string NpyHeader(const NpyArray& a) {
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
  return out;
}

std::string SerializeNpy(const NpyArray& a) { return NpyHeader(a) + a.data; }

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  const bool std_in = path == "-";
  const std::string name = std_in ? "standard input" : path;
  auto fail = [&](const absl::Status& st) {
    return absl::Status(st.code(), name + ": " + std::string(st.message()));
  };
  const int fd = std_in ? 0 : open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError("cannot open " + path + ": " + std::strerror(errno));
  struct stat info {};
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode) || info.st_size == 0) {
    // A pipe (or anything without a size): read it whole, as NumPy would.
    std::string bytes;
    char buf[1 << 16];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
      if (n > 0) bytes.append(buf, static_cast<size_t>(n));
    }
    const int read_errno = errno;
    if (!std_in) close(fd);
    if (n < 0) return fail(absl::DataLossError(std::string("read: ") + std::strerror(read_errno)));
    auto a = ParseNpy(bytes);
    if (!a.ok()) return fail(a.status());
    return a;
  }
  // A file: mapped, its header parsed in place and its data copied once into the array, the
  // mapping's pages dropped behind the copy, so memory holds the data once (as NumPy's does)
  // rather than the file, a stream buffer and the array.
  const size_t size = static_cast<size_t>(info.st_size);
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  if (!std_in) close(fd);
  if (map == MAP_FAILED) return fail(absl::InternalError(std::string("mmap: ") + std::strerror(map_errno)));
  madvise(map, size, MADV_SEQUENTIAL);
  const char* bytes = static_cast<const char*>(map);
  NpyArray a;
  auto data_off = ParseNpyHeader(absl::string_view(bytes, size), &a);
  if (!data_off.ok()) {
    munmap(map, size);
    return fail(data_off.status());
  }
  a.data.resize(size - *data_off);
  constexpr size_t kStep = size_t{8} << 20;
  for (size_t done = 0; done < a.data.size();) {
    const size_t n = std::min(kStep, a.data.size() - done);
    std::memcpy(&a.data[done], bytes + *data_off + done, n);
    done += n;
    // Whole pages behind the copy only: the page the next copy starts in stays mapped.
    const size_t end_page = (*data_off + done) / 4096 * 4096;
    madvise(map, end_page, MADV_DONTNEED);
  }
  munmap(map, size);
  return a;
}

absl::Status WriteNpy(const std::string& path, const NpyArray& array) {
  const bool std_out = path == "-";
  const std::string name = std_out ? "standard output" : path;
  FILE* out = std_out ? stdout : std::fopen(path.c_str(), "wb");
  if (out == nullptr) return absl::PermissionDeniedError("cannot write " + path + ": " + std::strerror(errno));
  // The header, then the data from where it is: no copy of the whole file in memory.
  const std::string header = NpyHeader(array);
  bool ok = std::fwrite(header.data(), 1, header.size(), out) == header.size() &&
            std::fwrite(array.data.data(), 1, array.data.size(), out) == array.data.size();
  ok = (std_out ? std::fflush(out) : std::fclose(out)) == 0 && ok;
  if (!ok) return absl::InternalError("error writing " + name + ": " + std::strerror(errno));
  return absl::OkStatus();
}

absl::StatusOr<HostTensor> NpyToTensor(NpyArray&& a, std::optional<DType> want) {
  // The same file as the same dtype: the bytes move instead of being copied.
  if ((a.descr == "<f4" && want.value_or(DType::kFloat32) == DType::kFloat32) ||
      (a.descr == "<f2" && want.value_or(DType::kFloat16) == DType::kFloat16) ||
      (a.descr == "<u2" && want.value_or(DType::kBFloat16) == DType::kBFloat16)) {
    HostTensor t;
    t.dtype = a.descr == "<f4" ? DType::kFloat32
              : a.descr == "<f2" ? DType::kFloat16 : DType::kBFloat16;
    t.shape = std::move(a.shape);
    t.data = std::move(a.data);
    return t;
  }
  return NpyToTensor(static_cast<const NpyArray&>(a), want);
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

NpyArray TensorToNpy(HostTensor&& t, bool bf16_bits) {
  if (t.dtype == DType::kBFloat16 && !bf16_bits) return TensorToNpy(static_cast<const HostTensor&>(t));
  NpyArray a;
  a.descr = t.dtype == DType::kFloat32 ? "<f4" : t.dtype == DType::kFloat16 ? "<f2" : "<u2";
  a.shape = std::move(t.shape);
  a.data = std::move(t.data);
  return a;
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
