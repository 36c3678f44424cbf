/* Calls through the C ABI as a C program makes them: in C an enum is an int, so
 * passing any int code is well defined (in C++ it would be undefined behaviour
 * in the caller). The library must read such codes as integers. */
#include "flashattn/flashattn.h"

const char* c_abi_dtype_name(int code) { return fa_dtype_name((fa_dtype)code); }
const char* c_abi_status_string(int code) { return fa_status_string((fa_status)code); }
int c_abi_backend_available(int code) { return fa_backend_available((fa_backend)code); }
const char* c_abi_backend_unavailable_reason(int code) {
  return fa_backend_unavailable_reason((fa_backend)code);
}
