// Large host copies spread over a few threads: gathering a message's receive slices (HostPieces)
// into one buffer (the server's requests, the C++ client's results), or copying one buffer into
// another. One thread's memcpy moves 7-16 GB/s, far
// less than a host's memory gives several threads; gathering a 64 MiB request into pinned
// staging on one thread was the largest part of its server time (lab/notes/rpc-path.md).
//
// The helpers are a small process-wide pool, started on first use and shared by every caller
// (no thread per call). The caller copies a part itself and takes over parts that no helper
// has started (helpers busy with other callers' parts), so it never waits on a queue, only for
// parts already under way. A copy of fewer than 2 x kCopyPartBytes stays on the caller's thread.
#pragma once

#include <cstddef>
#include <vector>

namespace fusebox {

// Bytes that arrived in pieces (gRPC's receive slices): their bytes are the pieces' bytes in order.
struct HostPiece {
  const void* data;
  size_t bytes;
};
using HostPieces = std::vector<HostPiece>;

// The least a thread is given of a split copy: below it, waking a helper costs more than it saves.
constexpr size_t kCopyPartBytes = size_t{1} << 20;
// The most threads one copy uses (--copy_threads).
constexpr int kMaxCopyThreads = 64;

// The threads a copy given `threads` uses: `threads` (at most kMaxCopyThreads), or for 0,
// min(4, hardware_concurrency / 2) and at least 1. 1 = the caller's thread alone.
int CopyThreads(int threads);

// Copies n bytes from src to dst (not overlapping) with up to CopyThreads(threads) threads.
void ParallelCopy(void* dst, const void* src, size_t n, int threads);

// A byte of a piece list: byte `offset` of pieces[piece].
struct PiecePos {
  size_t piece = 0;
  size_t offset = 0;
};

// Copies the n bytes of `pieces` (their bytes in order) that begin at *pos to dst, and moves
// *pos past them. False, copying nothing and leaving *pos, when the pieces end first.
bool GatherPieces(const HostPieces& pieces, PiecePos* pos, void* dst, size_t n, int threads);
// The same from byte `offset` of the pieces' bytes.
bool GatherPieces(const HostPieces& pieces, size_t offset, void* dst, size_t n, int threads);
// Sets *pos to byte `offset` of the pieces' bytes; false when they hold fewer.
bool SeekPieces(const HostPieces& pieces, size_t offset, PiecePos* pos);

}  // namespace fusebox
