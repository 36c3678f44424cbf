// The `flashattn` tool end to end: .npy files in, .npy files out, checked
// against the reference; bad files and options give a one-line error and a
// non-zero exit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <sys/wait.h>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "common/harness.h"
#include "npy.h"

namespace flashattn::testing {
namespace {

namespace fs = std::filesystem;

struct CliRun {
  int exit_code;
  std::string output;
};

CliRun run_cli(const std::string& arguments) {
  // ctest runs each test in its own process, in parallel: the name must be
  // unique across processes (an unseeded std::rand() gave them all the same one).
  static int calls = 0;
  const fs::path log = fs::temp_directory_path() / ("flashattn_cli_" + std::to_string(::getpid()) + "_" +
                                                    std::to_string(calls++) + ".log");
  const std::string cmd = std::string(FLASHATTN_CLI_PATH) + " " + arguments + " > " + log.string() + " 2>&1";
  const int status = std::system(cmd.c_str());
  std::ifstream f(log);
  std::string output((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  fs::remove(log);
  return {WEXITSTATUS(status), output};
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("flashattn_cli_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes a problem's f32 tensors as .npy files named q, k, v, dout.
  void write_inputs(const Problem& p) {
    for (auto [t, name] : {std::pair{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}, {&p.dout, "dout"}}) {
      std::vector<int64_t> shape(t->desc.shape, t->desc.shape + 4);
      std::vector<float> values(t->bytes.size() / 4);
      std::memcpy(values.data(), t->bytes.data(), t->bytes.size());
      std::string error;
      ASSERT_TRUE(tools::write_npy_f32(path(std::string(name) + ".npy"), shape, values, &error)) << error;
    }
  }
  fs::path dir_;
};

TEST_F(CliTest, ForwardAndBackwardMatchReference) {
  Case c;
  c.batch = 2;
  c.seqlen_q = 37;
  c.seqlen_k = 53;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = 32;
  c.causal = true;
  c.softcap = 3.0f;
  const Problem p = make_problem(c);
  write_inputs(p);
  const CliRun r = run_cli("run --backend cpu --q " + path("q.npy") + " --k " + path("k.npy") +
                           " --v " + path("v.npy") + " --out " + path("o.npy") + " --lse " +
                           path("lse.npy") + " --causal --softcap 3 --backward --dout " +
                           path("dout.npy") + " --dq " + path("dq.npy") + " --dk " + path("dk.npy") +
                           " --dv " + path("dv.npy"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Expected e = expected_all(p);
  auto check = [&](const char* file, const HostTensor& like, const std::vector<double>& exact,
                   const std::vector<double>& naive) {
    tools::NpyArray a;
    std::string error;
    ASSERT_TRUE(tools::read_npy(path(file), &a, &error)) << error;
    HostTensor got = like;
    std::memcpy(got.bytes.data(), a.values.data(), got.bytes.size());
    got.rebind();
    const Comparison cmp = compare_rows(got, exact, naive, default_atol(FA_F32));
    EXPECT_TRUE(cmp.ok) << cmp.describe(file);
  };
  check("o.npy", p.q, e.exact.out, e.naive.out);
  check("dq.npy", p.q, e.exact_grad.dq, e.naive_grad.dq);
  check("dk.npy", p.k, e.exact_grad.dk, e.naive_grad.dk);
  check("dv.npy", p.v, e.exact_grad.dv, e.naive_grad.dv);
  tools::NpyArray lse;
  std::string error;
  ASSERT_TRUE(tools::read_npy(path("lse.npy"), &lse, &error)) << error;
  EXPECT_EQ(lse.shape, (std::vector<int64_t>{2, 4, 37}));
}

TEST_F(CliTest, BadInputsFailWithOneLine) {
  Case c;
  c.seqlen_q = 5;
  c.seqlen_k = 6;
  c.head_dim = 16;
  write_inputs(make_problem(c));
  std::ofstream(path("junk.npy")) << "not numpy";
  const std::string base = " --k " + path("k.npy") + " --v " + path("v.npy") + " --out " + path("o.npy");
  for (const std::string& args :
       {"run --q " + path("missing.npy") + base, "run --q " + path("junk.npy") + base,
        "run --q " + path("v.npy") + " --k " + path("k.npy") + " --v " + path("dout.npy") + " --out " + path("o.npy"),
        "run --q " + path("q.npy") + base + " --window 3", "run --q " + path("q.npy") + base + " --dtype f64",
        "run --q " + path("q.npy") + base + " --window -3,0", "run --q " + path("q.npy") + base + " --bogus",
        std::string("run --k x.npy"), std::string("bench --causal maybe"), std::string("frobnicate")}) {
    const CliRun r = run_cli(args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.output.find("error"), std::string::npos) << args << ": " << r.output;
  }
}

TEST_F(CliTest, BenchRunsAndChecks) {
  const CliRun r = run_cli("bench --backend cpu --seqlens 64,100 --head-dims 32 --tokens 200 --hidden 64 "
                           "--repeats 2 --warmup 1 --backward --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"ok\": true"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("\"ok\": false"), std::string::npos) << r.output;
}

TEST_F(CliTest, DecodeBenchRunsAndChecks) {
  for (const char* page : {"0", "16"}) {
    const CliRun r = run_cli(std::string("bench --decode --backend cpu --batches 2 --kv-lens 100,7 --heads 4 "
                                         "--gqa 2 --head-dims 32 --repeats 2 --warmup 1 --json --page-size ") + page);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("\"ok\": true"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("\"ok\": false"), std::string::npos) << r.output;
  }
  const CliRun bad = run_cli("bench --decode --backend cpu --page-size -1");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("error"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace flashattn::testing
