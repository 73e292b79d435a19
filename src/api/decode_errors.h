// decode_errors.h: why bytes do not parse as a generated message, naming the field.
//
// What it is: protobuf's parser refuses a proto3 `string` field that is not valid UTF-8 and says
// only that the message failed. why_undecodable() reads the same bytes field by field, without
// that check, and names the first string field (depth-first, in wire order) that is not valid
// UTF-8: "app: not valid UTF-8", "checks[2].key: not valid UTF-8" (the index counts that repeated
// field's entries on the wire). Bytes that are not the message at all: "request: cannot be
// decoded as sluice.v1.CheckRequest". Used by the transport for the API's own methods and by a
// policy kind for its gRPC method's message; mistyped_field() names a field sent with the wrong
// wire type, which protobuf itself lets through.
//
// Thread-safety: a pure function.
#pragma once

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <string>
#include <string_view>

namespace sluice::api {

[[nodiscard]] std::string why_undecodable(const google::protobuf::Descriptor& type,
                                          std::string_view bytes);

// A field of `m`'s own that came with another wire type than its declared one (protobuf keeps
// it as an unknown field and parses on): "app: wrong wire type"; empty when none did. For a
// method that holds its callers to the declared types.
[[nodiscard]] std::string mistyped_field(const google::protobuf::Message& m);

// Parses `bytes` into `m`, held to its declared wire types: empty when it could, else why
// (why_undecodable(), or mistyped_field()). For a kind's gRPC method.
[[nodiscard]] std::string decode(std::string_view bytes, google::protobuf::Message& m);

}  // namespace sluice::api
