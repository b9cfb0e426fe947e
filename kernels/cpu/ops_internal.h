// Knobs of the CPU ops (ops.cc) that tests turn to reach code paths that
// normally need huge inputs. Not for serving code.
#pragma once

#include <cstdint>

namespace fusebox::cpu::internal {

// MatmulRelu for half types widens A and B in chunks of at most `operand_floats`
// floats each and C in chunks of at most `out_floats`. Defaults: 2^25 and 2^24.
// Values <= 0 restore the defaults. Not thread-safe against running ops.
void SetMatmulChunkBudget(int64_t operand_floats, int64_t out_floats);

}  // namespace fusebox::cpu::internal
