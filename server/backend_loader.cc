// CreateBackend: see backend_loader.h.
#include "server/backend_loader.h"

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "server/log.h"

namespace fusebox {
namespace {

std::string ExecutableDir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

absl::StatusOr<std::unique_ptr<Backend>> LoadCuda(const BackendChoice& choice) {
  const std::string path = choice.cuda_module.empty()
                               ? ExecutableDir() + "/libfusebox_cuda_backend.so"
                               : choice.cuda_module;
  // The module stays loaded for the life of the process: never dlclose'd.
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot load the CUDA backend: ", dlerror()));
  }
  using Factory = decltype(&fusebox_create_cuda_backend);
  auto factory = reinterpret_cast<Factory>(dlsym(lib, "fusebox_create_cuda_backend"));
  if (factory == nullptr) {
    return absl::UnavailableError(absl::StrCat(path, " has no fusebox_create_cuda_backend"));
  }
  char error[512] = {0};
  int code = static_cast<int>(absl::StatusCode::kUnavailable);
  Backend* backend = factory(&choice.cuda, error, sizeof error, &code);
  if (backend == nullptr) {
    if (code == static_cast<int>(absl::StatusCode::kInvalidArgument)) {
      return absl::InvalidArgumentError(absl::StrCat("CUDA backend: ", error));
    }
    return absl::UnavailableError(absl::StrCat("no usable GPU: ", error));
  }
  return std::unique_ptr<Backend>(backend);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendChoice& choice) {
  if (choice.kind == "cpu") return MakeCpuBackend(choice.cpu);
  if (choice.kind == "cuda") return LoadCuda(choice);
  if (choice.kind != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend=", choice.kind, " is unknown: use auto, cpu or cuda"));
  }
  auto cuda = LoadCuda(choice);
  // Options this host cannot honour are the caller's mistake, not a reason to use the CPU.
  if (cuda.ok() || cuda.status().code() == absl::StatusCode::kInvalidArgument) return cuda;
  Log("backend auto: using the CPU (%s)", std::string(cuda.status().message()).c_str());
  return MakeCpuBackend(choice.cpu);
}

}  // namespace fusebox
