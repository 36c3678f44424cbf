#include "npy.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "core/dtype.h"

namespace flashattn::tools {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
// NOTES: limits that make every size checkable before anything is allocated.
// np.save writes headers of a few hundred bytes; a header beyond this is
// hostile or corrupt. numpy itself allows at most 64 dimensions.
constexpr uint32_t kMaxHeaderBytes = 1 << 16;
constexpr size_t kMaxDims = 64;
constexpr size_t kMaxQuoted = 32;  // characters of a file's text echoed in a message

// 'text' for a one-line message: cut short (a hostile header must not become a
// huge message) and with control and non-ASCII bytes shown as '?'.
std::string quote(const std::string& text) {
  std::string shown = text.substr(0, kMaxQuoted);
  for (char& c : shown) {
    if (c < ' ' || c > '~') c = '?';
  }
  return "'" + shown + (text.size() > kMaxQuoted ? "...'" : "'");
}

// A cursor over the header dict, e.g. {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }.
// Iterative, one token at a time: no recursion, no regex (which recurses per character).
class HeaderParser {
 public:
  explicit HeaderParser(const std::string& text) : s_(text) {}

  bool parse(NpyArray* a, bool* fortran, std::string* error) {
    bool have_descr = false, have_order = false, have_shape = false;
    if (!expect('{', error)) return false;
    while (skip_space() != '}') {
      std::string key;
      if (!quoted(&key, error) || !expect(':', error)) return false;
      if (key == "descr") {
        if (have_descr || !quoted(&a->descr, error)) return duplicate_or(key, have_descr, error);
        have_descr = true;
      } else if (key == "fortran_order") {
        if (have_order || !boolean(fortran, error)) return duplicate_or(key, have_order, error);
        have_order = true;
      } else if (key == "shape") {
        if (have_shape || !shape(&a->shape, error)) return duplicate_or(key, have_shape, error);
        have_shape = true;
      } else {
        *error = "unknown key " + quote(key) + " in the header";
        return false;
      }
      if (skip_space() == ',') ++pos_;
      else if (skip_space() != '}') return fail("expected ',' or '}' after " + quote(key), error);
    }
    ++pos_;
    if (!have_descr || !have_order || !have_shape) {
      *error = "the header lacks " + std::string(!have_descr ? "'descr'" : !have_order ? "'fortran_order'" : "'shape'");
      return false;
    }
    return rest_is_space() || fail("unexpected text after the header dict", error);
  }

 private:
  char skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t')) ++pos_;
    return pos_ < s_.size() ? s_[pos_] : '\0';
  }
  bool rest_is_space() {
    skip_space();
    return pos_ == s_.size();
  }
  static bool fail(const std::string& what, std::string* error) {
    *error = "malformed header: " + what;
    return false;
  }
  static bool duplicate_or(const std::string& key, bool duplicate, std::string* error) {
    if (duplicate) *error = "malformed header: " + quote(key) + " appears twice";
    return false;
  }
  bool expect(char c, std::string* error) {
    if (skip_space() != c) return fail(std::string("expected '") + c + "'", error);
    ++pos_;
    return true;
  }
  bool quoted(std::string* out, std::string* error) {
    const char q = skip_space();
    if (q != '\'' && q != '"') return fail("expected a quoted string", error);
    const size_t end = s_.find(q, pos_ + 1);
    if (end == std::string::npos) return fail("unterminated string", error);
    *out = s_.substr(pos_ + 1, end - pos_ - 1);
    pos_ = end + 1;
    return true;
  }
  bool boolean(bool* out, std::string* error) {
    skip_space();
    for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}}) {
      if (s_.compare(pos_, std::strlen(word), word) == 0) {
        pos_ += std::strlen(word);
        *out = value;
        return true;
      }
    }
    return fail("fortran_order must be True or False", error);
  }
  // A non-negative decimal that fits int64.
  bool dimension(int64_t* out, std::string* error) {
    skip_space();
    const size_t start = pos_;
    int64_t value = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      if (__builtin_mul_overflow(value, 10, &value) || __builtin_add_overflow(value, s_[pos_] - '0', &value)) {
        return fail("a shape entry overflows 64 bits", error);
      }
      ++pos_;
    }
    if (pos_ == start) return fail("shape entries must be non-negative integers", error);
    *out = value;
    return true;
  }
  // (d0, d1, ...) with an optional trailing comma; () is a scalar.
  bool shape(std::vector<int64_t>* dims, std::string* error) {
    if (!expect('(', error)) return false;
    while (skip_space() != ')') {
      if (dims->size() == kMaxDims) return fail("more than 64 dimensions", error);
      int64_t d = 0;
      if (!dimension(&d, error)) return false;
      dims->push_back(d);
      if (skip_space() == ',') ++pos_;
      else if (skip_space() != ')') return fail("expected ',' or ')' in the shape", error);
    }
    ++pos_;
    return true;
  }

  const std::string& s_;
  size_t pos_ = 0;
};

size_t element_size(const std::string& descr) {
  if (descr == "<f4") return 4;
  if (descr == "<f2") return 2;
  if (descr == "<f8") return 8;
  return 0;
}

// Bytes the data of a shape takes, or false on 64-bit overflow.
bool data_bytes(const std::vector<int64_t>& shape, size_t elem, uint64_t* bytes) {
  uint64_t n = elem;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *bytes = n;
  return true;
}

float decode(const char* src, size_t elem) {
  if (elem == 4) {
    float f;
    std::memcpy(&f, src, 4);
    return f;
  }
  if (elem == 2) {
    uint16_t h;
    std::memcpy(&h, src, 2);
    return fp16_to_float(h);
  }
  double d;
  std::memcpy(&d, src, 8);
  return static_cast<float>(d);
}

// The header length field (after magic and version) and the version's size of it.
bool read_header_length(std::istream& f, int major, uint32_t* length, std::string* error) {
  const int width = major == 1 ? 2 : (major == 2 || major == 3) ? 4 : 0;
  if (width == 0) {
    *error = "unsupported .npy version " + std::to_string(major);
    return false;
  }
  unsigned char b[4] = {};
  if (!f.read(reinterpret_cast<char*>(b), width)) {
    *error = "truncated .npy preamble";
    return false;
  }
  *length = b[0] | (b[1] << 8) | (static_cast<uint32_t>(b[2]) << 16) | (static_cast<uint32_t>(b[3]) << 24);
  return true;
}

bool read_npy_stream(std::istream& f, uint64_t file_size, NpyArray* a, std::string* error) {
  char magic[kMagicLen + 2];
  if (!f.read(magic, sizeof magic) || std::memcmp(magic, kMagic, kMagicLen) != 0) {
    *error = "not a .npy file (no \\x93NUMPY magic)";
    return false;
  }
  uint32_t header_len = 0;
  if (!read_header_length(f, static_cast<unsigned char>(magic[kMagicLen]), &header_len, error)) return false;
  const uint64_t preamble = static_cast<uint64_t>(f.tellg());
  if (header_len > kMaxHeaderBytes) {
    *error = "header of " + std::to_string(header_len) + " bytes exceeds " +
             std::to_string(kMaxHeaderBytes) + " (not written by numpy)";
    return false;
  }
  if (header_len > file_size - preamble) {
    *error = "header of " + std::to_string(header_len) + " bytes does not fit the " +
             std::to_string(file_size) + "-byte file";
    return false;
  }
  std::string header(header_len, '\0');
  if (!f.read(header.data(), header_len)) {
    *error = "truncated .npy header";
    return false;
  }
  bool fortran = false;
  if (!HeaderParser(header).parse(a, &fortran, error)) return false;
  if (fortran) {
    *error = "Fortran-order arrays are not supported (save a C-contiguous array)";
    return false;
  }
  const size_t elem = element_size(a->descr);
  if (elem == 0) {
    *error = "dtype " + quote(a->descr) + " is not supported (use little-endian float16, float32 or float64)";
    return false;
  }
  uint64_t bytes = 0;
  const uint64_t available = file_size - preamble - header_len;
  const bool fits = data_bytes(a->shape, elem, &bytes);
  if (!fits || bytes != available) {
    *error = "the shape needs " + (fits ? std::to_string(bytes) : std::string("over 2^64")) +
             " bytes of data but the file holds " + std::to_string(available);
    return false;
  }
  std::vector<char> raw(bytes);
  if (!f.read(raw.data(), static_cast<std::streamsize>(raw.size()))) {
    *error = "could not read the data";
    return false;
  }
  a->values.resize(bytes / elem);
  for (size_t i = 0; i < a->values.size(); ++i) a->values[i] = decode(raw.data() + i * elem, elem);
  return true;
}

}  // namespace

bool read_npy(const std::string& path, NpyArray* a, std::string* error) {
  *a = NpyArray{};
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) {
    *error = "cannot open " + path;
    return false;
  }
  const std::streamoff size = f.tellg();
  f.seekg(0);
  if (size < 0 || !f) {
    *error = "cannot read " + path;
    return false;
  }
  if (!read_npy_stream(f, static_cast<uint64_t>(size), a, error)) {
    *error = path + ": " + *error;
    return false;
  }
  return true;
}

bool read_npy_memory(const void* data, size_t size, NpyArray* a, std::string* error) {
  *a = NpyArray{};
  std::istringstream in(std::string(static_cast<const char*>(data), size), std::ios::binary);
  return read_npy_stream(in, size, a, error);
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
  // Buffered bytes reach the file only here: a full disk shows at flush/close.
  f.flush();
  f.close();
  if (!f) {
    *error = "failed writing " + path + " (disk full or I/O error)";
    return false;
  }
  return true;
}

}  // namespace flashattn::tools
