// libFuzzer harness: the C++ client's .npy reader (client/cpp/npy.h), the path every file the
// `fusebox` CLI is given takes: ParseNpy on the file's bytes, then NpyToTensor to each dtype.
//
// It fails (abort) when: a file that parses has data that is not its shape times its item
// size; a tensor made from it is not its shape times its dtype's size; or what the client
// writes back (TensorToNpy, SerializeNpy) does not parse again to the same array.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "client/cpp/npy.h"

namespace fusebox::client {
namespace {

#define FUZZ_CHECK(cond, ...)                           \
  do {                                                  \
    if (!(cond)) {                                      \
      std::fprintf(stderr, "npy_fuzzer: %s: ", #cond);  \
      std::fprintf(stderr, __VA_ARGS__);                \
      std::fprintf(stderr, "\n");                       \
      std::abort();                                     \
    }                                                   \
  } while (0)

void CheckRoundTrip(const NpyArray& a) {
  auto back = ParseNpy(SerializeNpy(a));
  FUZZ_CHECK(back.ok(), "%s", back.status().ToString().c_str());
  FUZZ_CHECK(back->descr == a.descr && back->shape == a.shape && back->data == a.data,
             "'%s' of %zu dims and %zu bytes came back as '%s' of %zu dims and %zu bytes",
             a.descr.c_str(), a.shape.size(), a.data.size(), back->descr.c_str(),
             back->shape.size(), back->data.size());
}

}  // namespace
}  // namespace fusebox::client

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fusebox;
  using namespace fusebox::client;
  auto a = ParseNpy(std::string(reinterpret_cast<const char*>(data), size));
  if (!a.ok()) {
    FUZZ_CHECK(a.status().code() == absl::StatusCode::kInvalidArgument, "%s",
               a.status().ToString().c_str());
    return 0;
  }
  HostTensor shape_only;
  shape_only.shape = a->shape;
  const int64_t elements = shape_only.NumElements();
  FUZZ_CHECK(elements >= 0, "a parsed shape of %zu dims has no element count", a->shape.size());
  for (std::optional<DType> want :
       {std::optional<DType>(), std::optional<DType>(DType::kFloat32),
        std::optional<DType>(DType::kFloat16), std::optional<DType>(DType::kBFloat16)}) {
    auto t = NpyToTensor(*a, want);
    if (!t.ok()) {
      FUZZ_CHECK(t.status().code() == absl::StatusCode::kInvalidArgument, "%s",
                 t.status().ToString().c_str());
      continue;
    }
    FUZZ_CHECK(t->shape == a->shape, "NpyToTensor changed the shape");
    FUZZ_CHECK(static_cast<int64_t>(t->data.size()) ==
                   elements * static_cast<int64_t>(ElementSize(t->dtype)),
               "a tensor of %lld elements has %zu bytes", static_cast<long long>(elements),
               t->data.size());
    CheckRoundTrip(TensorToNpy(*t));
    CheckRoundTrip(TensorToNpy(*t, /*bf16_bits=*/true));
  }
  return 0;
}
