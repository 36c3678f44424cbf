// Random inputs (never zeros) for the bench subcommands; contiguous tensor
// descriptors come from the C++ API (flashattn::make_tensor).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "flashattn/flashattn.hpp"

namespace flashattn::tools {

// `elements` standard-normal values in `dtype`.
inline std::vector<uint8_t> random_bytes(size_t elements, fa_dtype dtype, std::mt19937_64& rng) {
  std::vector<uint8_t> bytes(elements * dtype_size(dtype));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < elements; ++i) store_from_float(bytes.data(), static_cast<int64_t>(i), dtype, normal(rng));
  return bytes;
}

}  // namespace flashattn::tools
