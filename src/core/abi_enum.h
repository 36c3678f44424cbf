// Enum fields arrive from C callers, which may store any int in them. Loading
// an out-of-range value through the C++ enum type is undefined behaviour, so
// the validator reads every enum as its integer code first and range-checks
// that; only then is the field used as the enum.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace flashattn {

template <typename Enum>
int64_t enum_code(const Enum& value) {
  static_assert(std::is_enum_v<Enum>, "enum_code reads enums");
  std::underlying_type_t<Enum> code;
  static_assert(sizeof code == sizeof value, "an enum is stored as its underlying type");
  std::memcpy(&code, &value, sizeof code);
  return static_cast<int64_t>(code);
}

}  // namespace flashattn
