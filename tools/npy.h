// Minimal NumPy .npy reader/writer for the CLI: little-endian f2/f4/f8, C order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace flashattn::tools {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> values;  // converted to f32, C order
  std::string descr;          // as read, e.g. "<f2"
};

// Returns false with a one-line reason in *error. Every size (header, shape,
// data) is checked against the file before anything is allocated.
bool read_npy(const std::string& path, NpyArray* array, std::string* error);
// The same from bytes in memory (the fuzz target's entry).
bool read_npy_memory(const void* data, size_t size, NpyArray* array, std::string* error);
// Returns false when the file cannot be written completely (checked after the
// final flush, so a full disk is reported).
bool write_npy_f32(const std::string& path, const std::vector<int64_t>& shape,
                   const std::vector<float>& values, std::string* error);

}  // namespace flashattn::tools
