// A check of a serialized request before protobuf parses it: a request is INVALID_ARGUMENT,
// unparsed, when
//  - a string field is not valid UTF-8 (protobuf would log each such request before refusing
//    it: a log line per request for anyone who can reach the port);
//  - it is not well-formed protobuf.
#pragma once

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/zero_copy_stream.h>

#include "absl/status/status.h"

namespace fusebox {

// Reads `in` to its end; OK when a message of `type` parsed from the same bytes passes the
// checks above.
absl::Status CheckWire(google::protobuf::io::ZeroCopyInputStream* in,
                       const google::protobuf::Descriptor* type);

}  // namespace fusebox
