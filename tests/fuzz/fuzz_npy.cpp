// libFuzzer target: the CLI's .npy reader on arbitrary bytes. Besides the
// sanitizers' checks (no overflow, no leak, no recursion blow-up), every
// outcome must be well formed: success gives as many values as the shape
// says, backed by the input's bytes; failure gives one short line.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "npy.h"

namespace {

constexpr size_t kMaxMessage = 300;

void require(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  flashattn::tools::NpyArray a;
  std::string error;
  if (flashattn::tools::read_npy_memory(data, size, &a, &error)) {
    uint64_t n = 1;
    for (int64_t d : a.shape) {
      require(d >= 0);
      n *= static_cast<uint64_t>(d);
    }
    require(n == a.values.size());
    require(a.values.size() * 2 <= size);  // at least 2 bytes of the file per value
  } else {
    require(!error.empty() && error.size() < kMaxMessage);
    require(error.find('\n') == std::string::npos);
  }
  return 0;
}
