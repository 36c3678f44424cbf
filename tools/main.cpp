// The `flashattn` command-line tool.
#include <cstdio>
#include <cstring>
#include <exception>

#include "cli.h"

namespace {

constexpr const char* kUsage =
    "usage: flashattn <command> [options]\n"
    "  bench   time and check attention over a sweep of shapes (the main job)\n"
    "  run     attention on .npy files (forward, and backward with --backward)\n"
    "  info    version and the backends this build can use\n"
    "  --version  print the library version and exit\n"
    "Run 'flashattn <command> --help' for a command's options.\n";

int version_main() {
  std::printf("flashattn %s (commit %s)\n", fa_version(), fa_build_commit());
  return 0;
}

int info_main() {
  version_main();
  const char* archs = fa_build_cuda_architectures();
  std::printf("  CUDA architectures compiled in: %s\n", archs[0] != '\0' ? archs : "none");
  for (fa_backend b : {FA_BACKEND_CPU, FA_BACKEND_CUDA}) {
    const char* name = b == FA_BACKEND_CPU ? "cpu" : "cuda";
    if (fa_backend_available(b)) std::printf("  %-5s available\n", name);
    else std::printf("  %-5s unavailable: %s\n", name, fa_backend_unavailable_reason(b));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) return version_main();
  try {
    flashattn::tools::Args args(argc, argv, 2);
    if (!std::strcmp(argv[1], "bench")) return flashattn::tools::bench_main(args);
    if (!std::strcmp(argv[1], "run")) return flashattn::tools::run_main(args);
    if (!std::strcmp(argv[1], "info")) {
      args.finish();
      return info_main();
    }
    std::fprintf(stderr, "error: unknown command '%s'\n%s", argv[1], kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
