// Memory and timing on the backend's device, for the CLI: host vectors on the
// CPU backend, cudaMalloc'd buffers and CUDA events on the CUDA backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "flashattn/flashattn.h"

namespace flashattn::tools {

class Buffer {
 public:
  Buffer(fa_backend backend, size_t bytes);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() { return data_; }
  size_t bytes() const { return bytes_; }
  void upload(const void* host);          // bytes() bytes
  void download(void* host) const;        // bytes() bytes
  void fill_bytes(unsigned char value);   // poison

 private:
  fa_backend backend_;
  size_t bytes_;
  void* data_ = nullptr;
};

fa_device_type device_of(fa_backend backend);

// Times fn (one call = one sample) `repeats` times after `warmup` calls;
// returns every sample in milliseconds. CUDA samples come from events.
std::vector<double> time_calls(fa_backend backend, int warmup, int repeats,
                               const std::function<void()>& fn);

// Device name for reports ("NVIDIA H100 80GB HBM3", or the CPU model).
std::string device_name(fa_backend backend);

// Synchronizes the device (no-op on the CPU).
void synchronize(fa_backend backend);

}  // namespace flashattn::tools
