// Compile-time guard for the Hopper-only code (wgmma, setmaxnreg need sm_90a).
// The library is built for 80;90a: in the sm_80 pass every sm90 kernel body
// compiles to nothing (FLASHATTN_SM90_DEVICE == 0) and the host side never
// launches it on anything but a 9.0 device.
#pragma once

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASHATTN_SM90_DEVICE 1
#else
#define FLASHATTN_SM90_DEVICE 0
#endif
