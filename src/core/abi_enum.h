// Enum fields arrive from C callers, which may store any int in them. Loading
// an out-of-range value through the C++ enum type is undefined behaviour, so
// the validator reads every enum as its integer code first and range-checks
// that; only then is the field used as the enum.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace flashattn {

// The ABI's enums are C ints (the C caller stores an int; the C++ compiler
// may pick an unsigned underlying type), so they are read as int32_t.
template <typename Enum>
int64_t enum_code(const Enum& value) {
  static_assert(std::is_enum_v<Enum>, "enum_code reads enums");
  int32_t code;
  static_assert(sizeof code == sizeof value, "an ABI enum is stored as a 32-bit int");
  std::memcpy(&code, &value, sizeof code);
  return code;
}

}  // namespace flashattn
