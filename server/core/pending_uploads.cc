// PendingUploads: see pending_uploads.h.
#include "server/core/pending_uploads.h"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fusebox {
namespace {

// 128 random bits, like a handle's: ids cannot be guessed from one another. The 'u' tells
// them apart from handles ('t') in logs and error messages.
std::string NewUploadId() {
  static std::mutex mu;
  static std::random_device rd;
  std::lock_guard<std::mutex> lock(mu);
  char buf[40];
  std::snprintf(buf, sizeof buf, "u%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  return buf;
}

}  // namespace

struct PendingUploads::Entry {
  enum class State { kOpen, kCommitted, kDropped };
  struct Range {
    int64_t end = 0;
    uint64_t owner = 0;  // the writer's serial; 0 = finished (written)
  };
  std::string id, tenant;
  std::shared_ptr<StoredTensor> tensor;
  State state = State::kOpen;
  std::map<int64_t, Range> ranges;  // by start; disjoint
  int64_t written = 0;              // bytes in finished ranges
  int64_t open_claimed = 0;         // bytes claimed by writers not yet finished
  int open_writers = 0;
  int64_t last_active_ns = 0;
};

PendingUploads::PendingUploads(TensorStore* store, double idle_timeout_seconds)
    : store_(store), idle_timeout_ns_(static_cast<int64_t>(idle_timeout_seconds * 1e9)) {}

PendingUploads::~PendingUploads() = default;

absl::StatusOr<PendingUploads::Created> PendingUploads::Create(const std::string& tenant,
                                                               DType dtype,
                                                               const std::vector<int64_t>& shape) {
  auto t = store_->Create(tenant, dtype, shape);
  if (!t.ok()) return t.status();
  auto e = std::make_shared<Entry>();
  const std::string& replica = store_->replica_id();
  e->id = replica.empty() ? NewUploadId() : absl::StrCat(replica, ".", NewUploadId());
  e->tenant = tenant;
  e->tensor = *std::move(t);
  e->last_active_ns = SteadyNowNs();
  Created c{e->id, e->tensor->bytes};
  std::lock_guard<std::mutex> lock(mu_);
  by_id_[e->id] = std::move(e);
  return c;
}

absl::Status PendingUploads::NotFound(const std::string& id) const {
  constexpr size_t kEcho = 64;  // a long id would not fit gRPC's metadata limit
  const std::string echo =
      id.size() <= kEcho ? id : absl::StrCat(id.substr(0, kEcho), "... (", id.size(), " bytes)");
  // As for handles (TensorStore): an id minted by another replica says which, from the id
  // alone, so it tells a tenant nothing of others' uploads.
  const std::string& replica = store_->replica_id();
  const size_t dot = id.find('.');
  if (dot != std::string::npos && dot > 0 && id.compare(0, dot, replica) != 0) {
    const std::string owner = echo.substr(0, std::min(dot, echo.size()));
    return absl::NotFoundError(absl::StrCat(
        "no upload '", echo, "' here: it was made by replica '", owner,
        "'; calls naming it must reach that replica (header 'fusebox-replica: ", owner, "')"));
  }
  return absl::NotFoundError(absl::StrCat(
      "no upload '", echo, "' (never created, already committed or aborted, or dropped after "
      "no write for its idle timeout)"));
}

absl::StatusOr<std::shared_ptr<PendingUploads::Entry>> PendingUploads::Find(
    const std::string& tenant, const std::string& id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end() || it->second->tenant != tenant) return NotFound(id);
  return it->second;
}

absl::StatusOr<std::unique_ptr<PendingUploads::Writer>> PendingUploads::OpenWriter(
    const std::string& tenant, const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto e = Find(tenant, id);
  if (!e.ok()) return e.status();
  ++(*e)->open_writers;
  (*e)->last_active_ns = SteadyNowNs();
  return std::unique_ptr<Writer>(new Writer(this, *std::move(e), next_serial_++));
}

PendingUploads::Writer::Writer(PendingUploads* owner, std::shared_ptr<Entry> entry,
                               uint64_t serial)
    : owner_(owner), entry_(std::move(entry)), serial_(serial) {}

PendingUploads::Writer::~Writer() {
  std::shared_ptr<StoredTensor> last;  // a dropped upload's memory, freed outside the lock
  std::lock_guard<std::mutex> lock(owner_->mu_);
  Entry& e = *entry_;
  if (!finished_) {  // take back this writer's ranges: they were never acknowledged
    for (auto it = e.ranges.begin(); it != e.ranges.end();) {
      it = it->second.owner == serial_ ? e.ranges.erase(it) : std::next(it);
    }
    e.open_claimed -= claimed_;
  }
  --e.open_writers;
  e.last_active_ns = SteadyNowNs();  // the idle timeout counts from the last writer's end
  if (e.state == Entry::State::kDropped && e.open_writers == 0) last = std::move(e.tensor);
}

Buffer* PendingUploads::Writer::buffer() const { return entry_->tensor->buffer.get(); }
int64_t PendingUploads::Writer::bytes() const { return entry_->tensor->bytes; }
const std::string& PendingUploads::Writer::id() const { return entry_->id; }

absl::Status PendingUploads::Writer::Claim(int64_t offset, int64_t n) {
  std::lock_guard<std::mutex> lock(owner_->mu_);
  Entry& e = *entry_;
  if (e.state == Entry::State::kCommitted) {
    return absl::FailedPreconditionError(
        absl::StrCat("upload '", e.id, "' is already committed; it takes no more writes"));
  }
  if (e.state == Entry::State::kDropped) {
    return absl::AbortedError(absl::StrCat("upload '", e.id, "' was aborted or expired"));
  }
  if (offset < 0 || n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("a write at offset ", offset, " is negative"));
  }
  const int64_t size = e.tensor->bytes;
  if (offset > size || n > size - offset) {
    return absl::OutOfRangeError(absl::StrCat("a write of bytes [", offset, ", ", offset + n,
                                              ") is past the end of upload '", e.id, "' (",
                                              size, " bytes)"));
  }
  if (n == 0) return absl::OkStatus();
  const int64_t end = offset + n;
  auto next = e.ranges.upper_bound(offset);  // first range starting after offset
  auto prev = next == e.ranges.begin() ? e.ranges.end() : std::prev(next);
  const bool overlaps_prev = prev != e.ranges.end() && prev->second.end > offset;
  const bool overlaps_next = next != e.ranges.end() && next->first < end;
  if (overlaps_prev || overlaps_next) {
    const auto& hit = overlaps_prev ? *prev : *next;
    return absl::InvalidArgumentError(absl::StrCat(
        "a write of bytes [", offset, ", ", end, ") overlaps bytes [", hit.first, ", ",
        hit.second.end, ") of upload '", e.id, "', ",
        hit.second.owner == 0 ? "already written" : "being written by another write",
        "; every byte is written once"));
  }
  if (prev != e.ranges.end() && prev->second.end == offset && prev->second.owner == serial_) {
    prev->second.end = end;  // a writer going forward keeps one range
  } else {
    if (static_cast<int64_t>(e.ranges.size()) >= kMaxRanges) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "upload '", e.id, "' holds ", e.ranges.size(),
          " separate ranges, the most one may; write larger contiguous ranges"));
    }
    e.ranges.emplace(offset, Entry::Range{end, serial_});
  }
  claimed_ += n;
  e.open_claimed += n;
  e.last_active_ns = SteadyNowNs();
  return absl::OkStatus();
}

absl::StatusOr<int64_t> PendingUploads::Writer::Finish() {
  std::lock_guard<std::mutex> lock(owner_->mu_);
  Entry& e = *entry_;
  if (e.state == Entry::State::kDropped) {
    return absl::AbortedError(
        absl::StrCat("upload '", e.id, "' was aborted or expired; nothing it wrote was kept"));
  }
  // Mark this writer's ranges written and merge finished neighbours, so the map stays small.
  for (auto& [start, range] : e.ranges) {
    if (range.owner == serial_) range.owner = 0;
  }
  for (auto it = e.ranges.begin(); it != e.ranges.end();) {
    auto next = std::next(it);
    if (next != e.ranges.end() && it->second.owner == 0 && next->second.owner == 0 &&
        it->second.end == next->first) {
      it->second.end = next->second.end;
      e.ranges.erase(next);
    } else {
      it = next;
    }
  }
  e.open_claimed -= claimed_;
  e.written += claimed_;
  finished_ = true;
  e.last_active_ns = SteadyNowNs();
  return e.tensor->bytes - e.written;
}

absl::StatusOr<std::shared_ptr<StoredTensor>> PendingUploads::TakeComplete(
    const std::string& tenant, const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto found = Find(tenant, id);
  if (!found.ok()) return found.status();
  Entry& e = **found;
  const int64_t missing = e.tensor->bytes - e.written;
  if (missing > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "upload '", e.id, "' is missing ", missing, " of its ", e.tensor->bytes, " bytes",
        e.open_claimed > 0
            ? absl::StrCat(" (", e.open_claimed,
                           " of them in WriteUpload calls still open: commit after they end)")
            : std::string(),
        "; nothing was committed"));
  }
  e.state = Entry::State::kCommitted;
  std::shared_ptr<StoredTensor> t = e.tensor;
  by_id_.erase(id);
  return t;
}

absl::StatusOr<int64_t> PendingUploads::Abort(const std::string& tenant, const std::string& id) {
  std::shared_ptr<StoredTensor> gone;  // freed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  auto found = Find(tenant, id);
  if (!found.ok()) return found.status();
  Entry& e = **found;
  e.state = Entry::State::kDropped;
  const int64_t bytes = e.tensor->bytes;
  if (e.open_writers == 0) gone = std::move(e.tensor);  // else the last writer lets it go
  by_id_.erase(id);
  return bytes;
}

int PendingUploads::ExpireIdle(int64_t now_ns) {
  if (idle_timeout_ns_ <= 0) return 0;
  std::vector<std::shared_ptr<StoredTensor>> gone;  // freed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = by_id_.begin(); it != by_id_.end();) {
    Entry& e = *it->second;
    if (e.open_writers == 0 && now_ns - e.last_active_ns > idle_timeout_ns_) {
      e.state = Entry::State::kDropped;
      gone.push_back(std::move(e.tensor));
      it = by_id_.erase(it);
    } else {
      ++it;
    }
  }
  return static_cast<int>(gone.size());
}

int64_t PendingUploads::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(by_id_.size());
}

}  // namespace fusebox
