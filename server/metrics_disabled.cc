// Placeholder until the Prometheus exporter lands (issue 5): asking for
// --metrics_address fails at start-up with a clear message instead of
// silently serving nothing.
#include "server/metrics.h"

namespace fusebox {

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string&, const Backend*) {
  return absl::UnimplementedError("--metrics_address: this build has no metrics exporter yet");
}

}  // namespace fusebox
