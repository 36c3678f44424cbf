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
#include <tuple>
#include <utility>
#include <vector>

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
      if (!values.empty()) std::memcpy(values.data(), t->bytes.data(), t->bytes.size());
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

// A .npy file from a header dict (padded as np.save does) and raw data bytes.
std::string npy_bytes(const std::string& dict, const std::string& data, int version = 1) {
  std::string header = dict + "\n";
  std::string out = std::string("\x93NUMPY") + char(version) + '\0';
  const uint32_t n = static_cast<uint32_t>(header.size());
  out += char(n & 0xff);
  out += char((n >> 8) & 0xff);
  if (version >= 2) {
    out += char((n >> 16) & 0xff);
    out += char(n >> 24);
  }
  return out + header + data;
}

// Hostile or corrupt files (issue 27): each gives false and one line naming
// the problem, before anything large is allocated; no recursion on long fields.
TEST(NpyReader, RejectsMalformedFilesWithOneLine) {
  const std::string f4 = "'descr': '<f4', 'fortran_order': False, ";
  std::string many_dims = "{" + f4 + "'shape': (";
  for (int i = 0; i < 15000; ++i) many_dims += "1,";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {npy_bytes("{'descr': '" + std::string(30000, 'x') + "', 'fortran_order': False, 'shape': (2,), }", ""),
       "not supported"},
      {npy_bytes(many_dims + "), }", ""), "more than 64 dimensions"},
      {npy_bytes("{" + f4 + "'shape': (2,), }" + std::string(70000, ' '), "", 2), "exceeds 65536"},
      {std::string("\x93NUMPY\x02\x00\x00\xff\x00\x00{'descr'", 20), "does not fit"},
      {std::string("\x93NUMPY\x02\x00\xff\xff\xff\xff{'descr'", 20), "exceeds 65536"},
      {npy_bytes("{" + f4 + "'shape': (1073741824,), }", "1234"), "needs 4294967296 bytes"},
      {npy_bytes("{" + f4 + "'shape': (99999999999999999999,), }", ""), "overflows"},
      {npy_bytes("{" + f4 + "'shape': (-5, 2), }", ""), "non-negative integers"},
      {npy_bytes("{" + f4 + "'shape': (abc,), }", ""), "non-negative integers"},
      {npy_bytes("{" + f4 + "'shape': (2 3), }", ""), "expected ','"},
      {npy_bytes("{" + f4 + "'shape': (4294967296, 4294967296, 4294967296), }", ""), "over 2^64"},
      {npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", "1234"), "not supported"},
      {npy_bytes("{" + f4 + "'shape': (1,), 'extra': 1}", "1234"), "unknown key"},
      {npy_bytes("{'a\nb': 1}", ""), "unknown key 'a?b'"},  // found by fuzz_npy: a newline in the message
      {npy_bytes("{'descr': '<f4', 'shape': (1,), }", "1234"), "lacks 'fortran_order'"},
      {npy_bytes("{" + f4 + "'shape': (1,), 'shape': (1,)}", "1234"), "appears twice"},
      {npy_bytes("{" + f4 + "'shape': (2,), }", "1234"), "needs 8 bytes"},
      {npy_bytes("{" + f4 + "'shape': (1,), } x", "1234"), "after the header"},
      {std::string("\x93NUMPY\x09\x00", 8), "version 9"},
      {std::string("\x93NUM", 5), "not a .npy file"},
  };
  for (const auto& [bytes, words] : cases) {
    tools::NpyArray a;
    std::string error;
    EXPECT_FALSE(tools::read_npy_memory(bytes.data(), bytes.size(), &a, &error)) << words;
    EXPECT_NE(error.find(words), std::string::npos) << "'" << error.substr(0, 300) << "' should mention '" << words << "'";
    EXPECT_EQ(error.find('\n'), std::string::npos) << error.substr(0, 300);
    EXPECT_LT(error.size(), 300u) << error.substr(0, 300);
  }
  tools::NpyArray a;
  std::string error;
  // Any key order and spacing; a 30 KB run of spaces parses without recursion.
  for (const std::string& good :
       {npy_bytes("{'shape': ( 2 , ),'fortran_order':False,'descr':'<f4'}", std::string(8, '\0')),
        npy_bytes("{" + f4 + "'shape': (" + std::string(30000, ' ') + "2,), }", std::string(8, '\0'), 2)}) {
    EXPECT_TRUE(tools::read_npy_memory(good.data(), good.size(), &a, &error)) << error.substr(0, 200);
    EXPECT_EQ(a.shape, (std::vector<int64_t>{2}));
  }
}

TEST_F(CliTest, MalformedFileFailsWithOneLine) {
  std::ofstream(path("huge.npy"), std::ios::binary)
      << std::string("\x93NUMPY\x02\x00\xff\xff\xff\xff{'descr'", 20);
  Case c;
  c.head_dim = 16;
  write_inputs(make_problem(c));
  const CliRun r = run_cli("run --backend cpu --q " + path("huge.npy") + " --k " + path("k.npy") +
                           " --v " + path("v.npy") + " --out " + path("o.npy"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << r.output;
  EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << r.output;
}

// A full disk (/dev/full) for --out or --lse is a failure, not exit 0.
TEST_F(CliTest, WriteFailureExitsNonZero) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  Case c;
  c.head_dim = 16;
  write_inputs(make_problem(c));
  const std::string base = "run --backend cpu --q " + path("q.npy") + " --k " + path("k.npy") + " --v " + path("v.npy");
  for (const std::string& outputs : {std::string(" --out /dev/full"), " --out " + path("o.npy") + " --lse /dev/full"}) {
    const CliRun r = run_cli(base + outputs);
    EXPECT_NE(r.exit_code, 0) << outputs << ": " << r.output;
    EXPECT_NE(r.output.find("failed writing"), std::string::npos) << r.output;
  }
}

// Zero batch and zero-length sequences run end to end.
TEST_F(CliTest, EmptyArraysRun) {
  for (auto [batch, sq, sk] : {std::tuple{0, 5, 6}, std::tuple{2, 0, 6}, std::tuple{2, 5, 0}}) {
    Case c;
    c.batch = batch;
    c.seqlen_q = sq;
    c.seqlen_k = sk;
    c.head_dim = 16;
    write_inputs(make_problem(c));
    const CliRun r = run_cli("run --backend cpu --q " + path("q.npy") + " --k " + path("k.npy") + " --v " +
                             path("v.npy") + " --out " + path("o.npy") + " --lse " + path("lse.npy") +
                             " --backward --dout " + path("dout.npy") + " --dq " + path("dq.npy") +
                             " --dk " + path("dk.npy") + " --dv " + path("dv.npy"));
    ASSERT_EQ(r.exit_code, 0) << batch << " " << sq << " " << sk << ": " << r.output;
    tools::NpyArray o;
    std::string error;
    ASSERT_TRUE(tools::read_npy(path("o.npy"), &o, &error)) << error;
    EXPECT_EQ(o.shape, (std::vector<int64_t>{batch, sq, 1, 16}));
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
