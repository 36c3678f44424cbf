#include "npy.h"

#include <cstring>
#include <fstream>
#include <regex>

#include "core/dtype.h"

namespace flashattn::tools {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

bool parse_header(const std::string& header, NpyArray* a, bool* fortran, std::string* error) {
  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'descr'\\s*:\\s*'([^']*)'"))) {
    *error = "no 'descr' in .npy header";
    return false;
  }
  a->descr = m[1];
  *fortran = std::regex_search(header, std::regex("'fortran_order'\\s*:\\s*True"));
  if (!std::regex_search(header, m, std::regex("'shape'\\s*:\\s*\\(([^)]*)\\)"))) {
    *error = "no 'shape' in .npy header";
    return false;
  }
  const std::string dims = m[1];
  const std::regex number("\\d+");
  std::sregex_iterator it(dims.begin(), dims.end(), number), end;
  for (; it != end; ++it) a->shape.push_back(std::stoll(it->str()));
  return true;
}

}  // namespace

bool read_npy(const std::string& path, NpyArray* a, std::string* error) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    *error = "cannot open " + path;
    return false;
  }
  char magic[kMagicLen + 2];
  if (!f.read(magic, sizeof magic) || std::memcmp(magic, kMagic, kMagicLen) != 0) {
    *error = path + " is not a .npy file";
    return false;
  }
  const int major = static_cast<unsigned char>(magic[kMagicLen]);
  uint32_t header_len = 0;
  if (major == 1) {
    unsigned char b[2];
    f.read(reinterpret_cast<char*>(b), 2);
    header_len = b[0] | (b[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    f.read(reinterpret_cast<char*>(b), 4);
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  } else {
    *error = path + ": unsupported .npy version " + std::to_string(major);
    return false;
  }
  std::string header(header_len, '\0');
  if (!f.read(header.data(), header_len)) {
    *error = path + ": truncated .npy header";
    return false;
  }
  bool fortran = false;
  if (!parse_header(header, a, &fortran, error)) {
    *error = path + ": " + *error;
    return false;
  }
  if (fortran) {
    *error = path + ": Fortran-order arrays are not supported (save a C-contiguous array)";
    return false;
  }
  int64_t n = 1;
  for (int64_t d : a->shape) n *= d;
  size_t elem;
  if (a->descr == "<f4") elem = 4;
  else if (a->descr == "<f2") elem = 2;
  else if (a->descr == "<f8") elem = 8;
  else {
    *error = path + ": dtype '" + a->descr + "' is not supported (use float16, float32 or float64)";
    return false;
  }
  std::vector<char> raw(static_cast<size_t>(n) * elem);
  if (!f.read(raw.data(), static_cast<std::streamsize>(raw.size()))) {
    *error = path + ": file is shorter than its shape says";
    return false;
  }
  a->values.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const char* src = raw.data() + i * elem;
    if (elem == 4) {
      std::memcpy(&a->values[i], src, 4);
    } else if (elem == 2) {
      uint16_t h;
      std::memcpy(&h, src, 2);
      a->values[i] = fp16_to_float(h);
    } else {
      double d;
      std::memcpy(&d, src, 8);
      a->values[i] = static_cast<float>(d);
    }
  }
  return true;
}

bool write_npy_f32(const std::string& path, const std::vector<int64_t>& shape,
                   const std::vector<float>& values, std::string* error) {
  std::string dims;
  for (int64_t d : shape) dims += std::to_string(d) + ",";
  if (shape.size() > 1) dims.pop_back();
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6) + version (2) + length (2) + header + '\n' is a multiple of 64.
  const size_t unpadded = kMagicLen + 2 + 2 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  if (!f) {
    *error = "cannot write " + path;
    return false;
  }
  f.write(kMagic, kMagicLen);
  const char version[2] = {1, 0};
  f.write(version, 2);
  const unsigned char len[2] = {static_cast<unsigned char>(header.size() & 0xff),
                                static_cast<unsigned char>(header.size() >> 8)};
  f.write(reinterpret_cast<const char*>(len), 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(reinterpret_cast<const char*>(values.data()),
          static_cast<std::streamsize>(values.size() * sizeof(float)));
  if (!f) {
    *error = "failed writing " + path;
    return false;
  }
  return true;
}

}  // namespace flashattn::tools
