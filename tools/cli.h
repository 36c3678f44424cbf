// Command-line plumbing shared by the subcommands: argument parsing and the
// one-line error every failure becomes.
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashattn/flashattn.h"

namespace flashattn::tools {

struct CliError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// --name value / --flag arguments; finish() rejects anything not consumed.
class Args {
 public:
  Args(int argc, char** argv, int first);
  bool flag(const std::string& name);
  std::string value(const std::string& name, const std::string& fallback);
  int int_value(const std::string& name, int fallback);
  double double_value(const std::string& name, double fallback);
  std::vector<int> int_list(const std::string& name);
  void finish() const;

 private:
  std::vector<std::string> args_;
  std::vector<bool> used_;
};

fa_backend parse_backend(const std::string& s);
fa_dtype parse_dtype(const std::string& s);

int bench_main(Args& args);
// `bench --decode`: attention against a KV cache (tools/bench_decode.cpp).
int decode_bench_main(Args& args);
int run_main(Args& args);

}  // namespace flashattn::tools
