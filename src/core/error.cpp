#include "core/error.h"

namespace flashattn {
namespace {
thread_local std::string g_last_error;
}

fa_status fail(fa_status status, std::string message) {
  g_last_error = std::move(message);
  return status;
}

void clear_error() { g_last_error.clear(); }

const char* last_error() { return g_last_error.c_str(); }

}  // namespace flashattn
