// proto_wire.h: the protocol-buffers wire format for the few flat messages a policy kind's gRPC
// method reads and writes (routes.h: GrpcMethod hands a kind the request's bytes), so the
// engine needs no generated code and no protobuf library. The messages themselves are declared
// in proto/sluice/v1/ for clients; a test round-trips them through the generated code.
//
// WireReader walks a message's fields (varint, 64-bit, length-delimited, 32-bit; groups are
// malformed); WireWriter appends fields. Proto3 semantics: a field absent on the wire is its
// default, a repeated scalar field is not supported, the last of a repeated singular field wins.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace sluice::server {

class WireReader {
 public:
  explicit WireReader(std::string_view bytes) noexcept : rest_(bytes) {}

  // The next field; false at the end or when the message is malformed (then ok() is false).
  bool next() noexcept {
    if (rest_.empty() || !ok_) return false;
    std::uint64_t key = 0;
    if (!varint(key) || (key >> 3) == 0 || (key >> 3) > 0x1fffffff) return fail();
    field_ = static_cast<std::uint32_t>(key >> 3);
    type_ = static_cast<unsigned>(key & 7);
    switch (type_) {
      case 0:
        return varint(number_) || fail();
      case 1:
        return fixed(8) || fail();
      case 5:
        return fixed(4) || fail();
      case 2: {
        std::uint64_t n = 0;
        if (!varint(n) || n > rest_.size()) return fail();
        bytes_ = rest_.substr(0, static_cast<std::size_t>(n));
        rest_.remove_prefix(static_cast<std::size_t>(n));
        return true;
      }
      default:
        return fail();
    }
  }
  [[nodiscard]] bool ok() const noexcept { return ok_; }
  [[nodiscard]] std::uint32_t field() const noexcept { return field_; }
  // The field's wire type: 0 varint, 1 64-bit, 2 length-delimited, 5 32-bit.
  [[nodiscard]] unsigned type() const noexcept { return type_; }
  [[nodiscard]] std::uint64_t varint_value() const noexcept { return number_; }
  [[nodiscard]] double double_value() const noexcept {
    double d = 0;
    std::memcpy(&d, &number_, sizeof d);
    return d;
  }
  [[nodiscard]] std::string_view bytes_value() const noexcept { return bytes_; }

 private:
  bool fail() noexcept {
    ok_ = false;
    return false;
  }
  bool varint(std::uint64_t& out) noexcept {
    out = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (rest_.empty()) return false;
      const auto b = static_cast<unsigned char>(rest_.front());
      rest_.remove_prefix(1);
      out |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  bool fixed(std::size_t n) noexcept {
    if (rest_.size() < n) return false;
    number_ = 0;
    for (std::size_t i = 0; i < n; ++i)
      number_ |= static_cast<std::uint64_t>(static_cast<unsigned char>(rest_[i])) << (8 * i);
    rest_.remove_prefix(n);
    return true;
  }

  std::string_view rest_;
  bool ok_ = true;
  std::uint32_t field_ = 0;
  unsigned type_ = 0;
  std::uint64_t number_ = 0;
  std::string_view bytes_;
};

class WireWriter {
 public:
  // Proto3: a default value (0, false, empty) is not written.
  WireWriter& varint(std::uint32_t field, std::uint64_t v) {
    if (v == 0) return *this;
    key(field, 0);
    raw_varint(v);
    return *this;
  }
  WireWriter& boolean(std::uint32_t field, bool v) { return varint(field, v ? 1 : 0); }
  WireWriter& int32(std::uint32_t field, std::int32_t v) {
    return varint(field, static_cast<std::uint64_t>(static_cast<std::int64_t>(v)));
  }
  WireWriter& dbl(std::uint32_t field, double v) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    if (bits == 0) return *this;
    key(field, 1);
    for (int i = 0; i < 8; ++i) out_ += static_cast<char>((bits >> (8 * i)) & 0xff);
    return *this;
  }
  WireWriter& str(std::uint32_t field, std::string_view v) {
    if (v.empty()) return *this;
    return bytes(field, v);
  }
  // A nested message (written even when empty: it is present).
  WireWriter& bytes(std::uint32_t field, std::string_view v) {
    key(field, 2);
    raw_varint(v.size());
    out_.append(v);
    return *this;
  }
  [[nodiscard]] const std::string& data() const noexcept { return out_; }

 private:
  void key(std::uint32_t field, unsigned type) {
    raw_varint((static_cast<std::uint64_t>(field) << 3) | type);
  }
  void raw_varint(std::uint64_t v) {
    while (v >= 0x80) {
      out_ += static_cast<char>((v & 0x7f) | 0x80);
      v >>= 7;
    }
    out_ += static_cast<char>(v);
  }
  std::string out_;
};

}  // namespace sluice::server
