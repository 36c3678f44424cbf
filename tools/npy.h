// Minimal NumPy .npy reader/writer for the CLI: little-endian f2/f4/f8, C order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flashattn::tools {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> values;  // converted to f32, C order
  std::string descr;          // as read, e.g. "<f2"
};

// Returns false with a one-line reason in *error.
bool read_npy(const std::string& path, NpyArray* array, std::string* error);
bool write_npy_f32(const std::string& path, const std::vector<int64_t>& shape,
                   const std::vector<float>& values, std::string* error);

}  // namespace flashattn::tools
