// A check of a serialized request before protobuf parses it. Parsing can hold far more memory
// than the bytes it reads, before any check of ours has run: a one-byte packed varint becomes an
// 8-byte int64 in a field that grows by doubling (12-18x), and every field the schema does not
// know becomes an entry of the message's unknown-field set (a 2-byte field takes 16-60 bytes).
// So the wire bytes are walked first, and a request is INVALID_ARGUMENT, unparsed, when
//  - a repeated field holds more than kMaxRepeated values (all its occurrences together, as
//    parsing merges them: a shape has at most kMaxRank axes anyway);
//  - it has more than kMaxUnknownFields fields the schema does not know, or a group;
//  - a string field is not valid UTF-8 (protobuf would log each such request before
//    refusing it: a log line per request for anyone who can reach the port);
//  - it is not well-formed protobuf.
// Parsing then holds about the request's own size (the bytes fields' copies).
#pragma once

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/zero_copy_stream.h>

#include "absl/status/status.h"

namespace fusebox {

constexpr int kMaxRepeated = 64;        // = kMaxRank (request.h)
constexpr int kMaxUnknownFields = 1024;  // newer clients' fields, with room to spare

// Reads `in` to its end; OK when a message of `type` parsed from the same bytes holds no more
// than described above.
absl::Status CheckWire(google::protobuf::io::ZeroCopyInputStream* in,
                       const google::protobuf::Descriptor* type);

}  // namespace fusebox
