// What the library was built from: the git commit of the source tree ("+dirty"
// if it had uncommitted changes) and the CUDA architectures compiled in. The
// definitions are generated at build time (cmake/build_info.cmake), so results
// files can name the exact code that produced them.
#pragma once

namespace flashattn {
extern const char* const kBuildCommit;
extern const char* const kBuildCudaArchitectures;  // "" when built without CUDA
}  // namespace flashattn
