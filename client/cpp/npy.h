// .npy files (NumPy format v1.0 / v2.0 / v3.0, C order, little-endian) and how
// they map to fusebox tensors.
//
// NumPy has no bfloat16, so fusebox uses these conventions in files:
//   '<f4' <-> float32, '<f2' <-> float16, '<u2' <-> bfloat16 stored as its raw
//   16-bit patterns (the upper half of a float32). '<f8' is accepted on input
//   and narrowed to float32 (or to the requested dtype).
// With an explicit target dtype, input values are converted on the client
// (round to nearest even). A bfloat16 output is written as '<f4' by default
// (exact widening, loads in any NumPy) or as '<u2' bit patterns on request.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cpp/fusebox_client.h"

namespace fusebox::client {

struct NpyArray {
  std::string descr;  // e.g. "<f4"
  std::vector<int64_t> shape;
  std::string data;   // raw little-endian element bytes, C order
};

absl::StatusOr<NpyArray> ParseNpy(const std::string& file_bytes);
// The header alone: v1.0, or v2.0 when the header is huge; the data follows it.
std::string NpyHeader(const NpyArray& array);
std::string SerializeNpy(const NpyArray& array);  // NpyHeader + data
// path "-" is standard input / output. A regular file is read through mmap, its data copied
// once into the array; a pipe is read whole.
absl::StatusOr<NpyArray> ReadNpy(const std::string& path);
absl::Status WriteNpy(const std::string& path, const NpyArray& array);

// File -> tensor. want: the dtype to send (nullopt: the file's own dtype). From an rvalue,
// a file that needs no conversion gives its bytes up instead of copying them.
absl::StatusOr<HostTensor> NpyToTensor(const NpyArray& array, std::optional<DType> want);
absl::StatusOr<HostTensor> NpyToTensor(NpyArray&& array, std::optional<DType> want);
// Tensor -> file. bf16_bits: write bfloat16 as '<u2' bit patterns instead of '<f4'.
NpyArray TensorToNpy(const HostTensor& tensor, bool bf16_bits = false);
NpyArray TensorToNpy(HostTensor&& tensor, bool bf16_bits = false);

}  // namespace fusebox::client
