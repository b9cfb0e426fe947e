// The process heap's settings and its bound: how much freed memory glibc may keep for reuse,
// in how many arenas, and the check that gives back what is kept past that bound.
#pragma once

#include <cstdint>

namespace fusebox {

// Applies --malloc_retain_mib and --malloc_arenas (mallopt); call before any thread starts.
// retain_bytes 0 and arenas 0 leave glibc's defaults.
void ConfigureHeap(int64_t retain_bytes, int arenas);

// Returns freed memory to the OS (malloc_trim) when the resident memory not in use by the heap
// (RSS minus mallinfo2's bytes in use: freed memory kept, plus code, stacks and pinned
// buffers) is past retain_bytes; returns how much RSS that gave back (0 when under the bound
// or retain_bytes is 0). Cheap: one mallinfo2 and one read of /proc/self/statm.
int64_t TrimHeapAbove(int64_t retain_bytes);

}  // namespace fusebox
