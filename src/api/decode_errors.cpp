#include "api/decode_errors.h"

#include <google/protobuf/unknown_field_set.h>

#include <limits>
#include <map>
#include <optional>

#include "sluice/core/text.h"

namespace sluice::api {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

// The path of the first string field under `type` in `bytes` that is not UTF-8; none when every
// one is (or when the bytes do not even split into fields).
std::optional<std::string> not_utf8(const Descriptor& type, std::string_view bytes, int depth) {
  if (depth > 32) return std::nullopt;  // deeper than any message of the API
  UnknownFieldSet fields;
  if (!fields.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return std::nullopt;
  std::map<int, int> entries;  // a repeated field's entries so far
  for (int i = 0; i < fields.field_count(); ++i) {
    const UnknownField& u = fields.field(i);
    const FieldDescriptor* f = type.FindFieldByNumber(u.number());
    if (f == nullptr || u.type() != UnknownField::TYPE_LENGTH_DELIMITED) continue;
    std::string name = f->name();
    if (f->is_repeated()) {
      name += '[';
      name += std::to_string(entries[u.number()]++);
      name += ']';
    }
    const std::string& value = u.length_delimited();
    if (f->type() == FieldDescriptor::TYPE_STRING) {
      if (!is_utf8(value)) return name;
    } else if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
      if (std::optional<std::string> inner = not_utf8(*f->message_type(), value, depth + 1))
        return name + "." + *inner;
    }
  }
  return std::nullopt;
}

}  // namespace

std::string why_undecodable(const Descriptor& type, std::string_view bytes) {
  if (std::optional<std::string> path = not_utf8(type, bytes, 0))
    return *path + ": not valid UTF-8";
  return "request: cannot be decoded as " + type.full_name();
}

std::string mistyped_field(const google::protobuf::Message& m) {
  const UnknownFieldSet& unknown = m.GetReflection()->GetUnknownFields(m);
  for (int i = 0; i < unknown.field_count(); ++i) {
    if (const FieldDescriptor* f = m.GetDescriptor()->FindFieldByNumber(unknown.field(i).number()))
      return f->name() + ": wrong wire type";
  }
  return {};
}

std::string decode(std::string_view bytes, google::protobuf::Message& m) {
  if (bytes.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()) ||
      !m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return why_undecodable(*m.GetDescriptor(), bytes);
  return mistyped_field(m);
}

}  // namespace sluice::api
