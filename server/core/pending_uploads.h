// Uploads written as byte ranges (CreateUpload, WriteUpload, CommitUpload, AbortUpload): the
// tensor is reserved in the store when the upload is created (budget, quota and count, as an
// Upload's header does), then any number of writers, on any streams and connections, fill
// disjoint byte ranges of it, and the commit hands it to the store (which gives it its handle)
// only once every byte is written. Until then it is invisible: dropping it (abort, idle expiry)
// frees its memory and returns its reservation.
//
// A writer's ranges count only once it finishes: one that fails or goes away leaves none of
// them written, so a client resends a failed stream's ranges whole and never has to learn which
// of them landed. Ranges are checked against the tensor's end and against every range claimed
// before (by any writer) when they are claimed, before a byte is copied: bad input changes
// nothing. Upload ids are per tenant: another tenant's id is the same NOT_FOUND as one that
// never existed. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/tensor_store.h"

namespace fusebox {

class PendingUploads {
 public:
  // Ranges one upload may hold apart (adjacent ranges of one writer, and finished ones, merge):
  // bounds the bookkeeping a client sending tiny scattered ranges could make the server keep.
  static constexpr int64_t kMaxRanges = 1 << 16;

  // `idle_timeout_seconds`: an upload with no writer open and no range claimed for this long
  // is dropped by ExpireIdle; 0 = never. `store` must outlive this.
  PendingUploads(TensorStore* store, double idle_timeout_seconds);
  ~PendingUploads();
  PendingUploads(const PendingUploads&) = delete;
  PendingUploads& operator=(const PendingUploads&) = delete;

  struct Created {
    std::string id;
    int64_t bytes = 0;
  };
  // Reserves the tensor (TensorStore::Create's checks and errors) and returns its upload id.
  absl::StatusOr<Created> Create(const std::string& tenant, DType dtype,
                                 const std::vector<int64_t>& shape);

  struct Entry;  // one upload (pending_uploads.cc)

  // One stream's writes into one upload. Destroying a writer that did not Finish OK takes its
  // ranges back (they were never acknowledged).
  class Writer {
   public:
    ~Writer();
    Writer(const Writer&) = delete;
    Writer& operator=(const Writer&) = delete;

    // Claims [offset, offset + n) for this writer, before its bytes are copied: OUT_OF_RANGE
    // past the tensor's end, INVALID_ARGUMENT if it overlaps a range already claimed,
    // FAILED_PRECONDITION / ABORTED once the upload was committed / dropped, RESOURCE_EXHAUSTED
    // past kMaxRanges. Nothing changes on an error. n == 0 claims nothing.
    absl::Status Claim(int64_t offset, int64_t n);
    // The ranges claimed so far now count as written; returns the upload's bytes still
    // missing. ABORTED if the upload was dropped meanwhile.
    absl::StatusOr<int64_t> Finish();

    // The tensor's memory (alive for as long as this writer is) and size.
    Buffer* buffer() const;
    int64_t bytes() const;
    int64_t claimed_bytes() const { return claimed_; }
    const std::string& id() const;

   private:
    friend class PendingUploads;
    Writer(PendingUploads* owner, std::shared_ptr<Entry> entry, uint64_t serial);
    PendingUploads* const owner_;
    const std::shared_ptr<Entry> entry_;
    const uint64_t serial_;  // marks this writer's ranges until it finishes
    int64_t claimed_ = 0;
    bool finished_ = false;
  };

  // A writer for the tenant's upload `id`, else NOT_FOUND (also once committed or dropped).
  absl::StatusOr<std::unique_ptr<Writer>> OpenWriter(const std::string& tenant,
                                                     const std::string& id);

  // When every byte is written: removes the upload and returns its tensor, for the caller to
  // commit to the store. Otherwise FAILED_PRECONDITION naming the bytes missing (and those in
  // writes still open), and the upload stays as it was.
  absl::StatusOr<std::shared_ptr<StoredTensor>> TakeComplete(const std::string& tenant,
                                                             const std::string& id);
  // Drops the upload (its memory returns once writes in flight end); returns its size.
  absl::StatusOr<int64_t> Abort(const std::string& tenant, const std::string& id);
  // Drops the uploads idle past the timeout at `now_ns` (steady clock); returns how many.
  int ExpireIdle(int64_t now_ns);

  double idle_timeout_seconds() const { return idle_timeout_ns_ / 1e9; }
  int64_t count() const;  // uploads open

 private:
  absl::Status NotFound(const std::string& id) const;
  // The tenant's upload, under mu_; else NOT_FOUND.
  absl::StatusOr<std::shared_ptr<Entry>> Find(const std::string& tenant, const std::string& id);

  TensorStore* const store_;
  const int64_t idle_timeout_ns_;
  mutable std::mutex mu_;  // guards the map and every Entry's state
  std::map<std::string, std::shared_ptr<Entry>> by_id_;
  uint64_t next_serial_ = 1;  // 0 marks finished ranges
};

}  // namespace fusebox
