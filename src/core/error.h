// Error reporting for the C API: a status code plus a thread-local message.
#pragma once

#include <string>

#include "flashattn/flashattn.h"

namespace flashattn {

// Records `message` as this thread's last error and returns `status`.
fa_status fail(fa_status status, std::string message);
void clear_error();
const char* last_error();

// Propagate a non-OK status.
#define FA_RETURN_IF_ERROR(expr)              \
  do {                                        \
    fa_status fa_status_ = (expr);            \
    if (fa_status_ != FA_OK) return fa_status_; \
  } while (0)

}  // namespace flashattn
