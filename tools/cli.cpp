#include "cli.h"

#include <cstdlib>
#include <sstream>

namespace flashattn::tools {

Args::Args(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) args_.emplace_back(argv[i]);
  used_.assign(args_.size(), false);
}

bool Args::flag(const std::string& name) {
  for (size_t i = 0; i < args_.size(); ++i) {
    if (args_[i] == name) {
      used_[i] = true;
      return true;
    }
  }
  return false;
}

std::string Args::value(const std::string& name, const std::string& fallback) {
  for (size_t i = 0; i < args_.size(); ++i) {
    if (args_[i] == name) {
      if (i + 1 >= args_.size()) throw CliError(name + " needs a value");
      used_[i] = used_[i + 1] = true;
      return args_[i + 1];
    }
  }
  return fallback;
}

int Args::int_value(const std::string& name, int fallback) {
  const std::string v = value(name, "");
  if (v.empty()) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (*end != '\0') throw CliError(name + " takes an integer, not '" + v + "'");
  return static_cast<int>(x);
}

double Args::double_value(const std::string& name, double fallback) {
  const std::string v = value(name, "");
  if (v.empty()) return fallback;
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (*end != '\0') throw CliError(name + " takes a number, not '" + v + "'");
  return x;
}

std::vector<int> Args::int_list(const std::string& name) {
  const std::string v = value(name, "");
  std::vector<int> out;
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long x = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || x <= 0) {
      throw CliError(name + " takes positive integers separated by commas, not '" + v + "'");
    }
    out.push_back(static_cast<int>(x));
  }
  return out;
}

void Args::finish() const {
  for (size_t i = 0; i < args_.size(); ++i) {
    if (!used_[i]) throw CliError("unknown argument '" + args_[i] + "' (see --help)");
  }
}

fa_backend parse_backend(const std::string& s) {
  if (s == "auto") return FA_BACKEND_AUTO;
  if (s == "cpu") return FA_BACKEND_CPU;
  if (s == "cuda") return FA_BACKEND_CUDA;
  throw CliError("--backend takes auto, cpu or cuda, not '" + s + "'");
}

fa_dtype parse_dtype(const std::string& s) {
  if (s == "f32") return FA_F32;
  if (s == "f16") return FA_F16;
  if (s == "bf16") return FA_BF16;
  throw CliError("--dtype takes f32, f16 or bf16, not '" + s + "'");
}

}  // namespace flashattn::tools
