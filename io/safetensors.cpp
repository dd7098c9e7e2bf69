#include "io/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "src/common/check.hpp"
#include "src/common/quote.hpp"

namespace zoe::io {
namespace {
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

constexpr std::string_view kMetadataKey = "__metadata__";

[[noreturn]] void bad(const std::string& file, const std::string& what) {
  ZOE_THROW(CorruptionError, "safetensors file '", file, "': ", what);
}

// a * b, or false when it overflows
bool mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) { return !__builtin_mul_overflow(a, b, &out); }

std::uint64_t le64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// A name in a message: JSON-escaped (a hostile name cannot forge lines), cut short (a hostile
// header cannot make a message of megabytes).
std::string json_quoted(std::string_view s) { return zoe::detail::json_excerpt(json(std::string(s)), 120); }

// A JSON value in a message, cut short.
std::string brief(const json& v) { return zoe::detail::json_excerpt(v, 120); }

// One tensor's header entry, validated on its own (the coverage check comes after).
SafetensorsEntry parse_entry(const std::string& name, const json& v, const std::string& file) {
  const std::string who = "tensor " + json_quoted(name);
  if (!v.is_object()) bad(file, who + " is a JSON " + v.type_name() + ", expected an object");
  for (const auto& [key, _] : v.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      bad(file, who + " has an unknown key " + json_quoted(key) + " (expected dtype, shape, data_offsets)");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) bad(file, who + " has no \"" + key + "\"");
  SafetensorsEntry e;
  e.name = name;
  const json& dt = v["dtype"];
  if (!dt.is_string()) bad(file, who + ": dtype is a JSON " + std::string(dt.type_name()) + ", expected a string");
  e.dtype = dt.get<std::string>();
  const std::size_t esz = safetensors_dtype_size(e.dtype);
  if (esz == 0) bad(file, who + ": unknown or unsupported dtype " + json_quoted(e.dtype));
  const json& shape = v["shape"];
  if (!shape.is_array()) bad(file, who + ": shape is a JSON " + std::string(shape.type_name()) + ", expected an array");
  std::uint64_t numel = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const json& d = shape[i];
    if (!d.is_number_unsigned())
      bad(file, who + ": shape[" + std::to_string(i) + "] = " + brief(d) + " is not a non-negative integer");
    const auto dim = d.get<std::uint64_t>();
    if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) || !mul(numel, dim, numel) ||
        numel > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      bad(file, who + ": shape " + brief(shape) + " has more than 2^63 elements");
    e.shape.push_back(static_cast<std::int64_t>(dim));
  }
  e.numel = static_cast<std::int64_t>(numel);
  const json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    bad(file, who + ": data_offsets " + brief(off) + " is not [BEGIN, END] with non-negative integers");
  e.begin = off[0].get<std::uint64_t>();
  e.end = off[1].get<std::uint64_t>();
  if (e.end < e.begin)
    bad(file, who + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] end before they begin");
  std::uint64_t expect = 0;
  if (!mul(numel, esz, expect))
    bad(file, who + ": shape " + brief(shape) + " of " + e.dtype + " has more than 2^64 bytes");
  if (e.end - e.begin != expect)
    bad(file, who + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] hold " +
                  std::to_string(e.end - e.begin) + " bytes, but shape " + brief(shape) + " of " + e.dtype + " (" +
                  std::to_string(esz) + " bytes each) needs " + std::to_string(expect));
  return e;
}

// Parser callback: refuses duplicate keys (nlohmann keeps the last one silently) and nesting
// deeper than the format has (root object, tensor object, shape array).
class KeyChecker {
 public:
  explicit KeyChecker(const std::string& file) : file_(file) {}
  bool operator()(int depth, json::parse_event_t event, json& parsed) {
    if (depth > 3) bad(file_, "the header nests deeper than the format allows (root, tensor, shape)");
    switch (event) {
      case json::parse_event_t::object_start: keys_.emplace_back(); break;
      case json::parse_event_t::object_end: if (!keys_.empty()) keys_.pop_back(); break;
      case json::parse_event_t::key: {
        const std::string& k = parsed.get_ref<const std::string&>();
        if (!keys_.back().insert(k).second)
          bad(file_, std::string("duplicate key ") + json_quoted(k) + (keys_.size() == 1 ? " in the header" : " in a tensor entry"));
        break;
      }
      default: break;
    }
    return true;
  }

 private:
  const std::string& file_;
  std::vector<std::set<std::string>> keys_;
};
}  // namespace

std::size_t safetensors_dtype_size(std::string_view t) noexcept {
  static constexpr std::pair<std::string_view, std::size_t> kSizes[] = {
      {"BOOL", 1}, {"U8", 1}, {"I8", 1},   {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},   {"I32", 4},     {"U32", 4},
      {"F32", 4},  {"F64", 8}, {"I64", 8}, {"U64", 8},    {"C64", 8}};
  for (const auto& [name, size] : kSizes)
    if (name == t) return size;
  return 0;
}

const SafetensorsEntry* SafetensorsHeader::find(std::string_view name) const {
  for (const SafetensorsEntry& e : tensors)
    if (e.name == name) return &e;
  return nullptr;
}

SafetensorsHeader parse_safetensors_header(std::string_view text, std::uint64_t data_bytes, const std::string& file) {
  SafetensorsHeader h;
  h.header_bytes = text.size();
  h.data_bytes = data_bytes;
  // Trailing padding: spaces only (the format's words); the JSON itself starts at byte 0.
  std::size_t end = text.size();
  while (end > 0 && text[end - 1] == ' ') --end;
  if (end == 0 || text[0] != '{')
    bad(file, "the header does not begin with '{' (" + std::to_string(text.size()) + " header bytes)");
  if (text[end - 1] != '}')
    bad(file, "the header's JSON is followed by bytes other than spaces, or does not end with '}'");
  json root;
  try {
    KeyChecker keys(file);
    root = json::parse(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(end),
                       [&keys](int d, json::parse_event_t ev, json& p) { return keys(d, ev, p); });
  } catch (const json::exception& e) {
    bad(file, std::string("the header is not valid JSON: ") + e.what());
  }
  if (!root.is_object()) bad(file, "the header is not a JSON object");
  for (const auto& [key, value] : root.items()) {
    if (key == kMetadataKey) {
      if (value.is_null()) continue;
      if (!value.is_object()) bad(file, "__metadata__ is a JSON " + std::string(value.type_name()) + ", expected an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          bad(file, "__metadata__ " + json_quoted(mk) + " is a JSON " + mv.type_name() + ", expected a string");
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_entry(key, value, file));
  }
  // Coverage: sorted by offsets, the tensors must tile [0, data_bytes) exactly.
  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t at = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry& e : h.tensors) {
    if (e.end > data_bytes)
      bad(file, "tensor " + json_quoted(e.name) + " (data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                    "]) lies past the end of the data section (" + std::to_string(data_bytes) +
                    " bytes): the file is truncated or the header lies");
    if (e.begin < at)
      bad(file, "tensor " + json_quoted(e.name) + " (bytes [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                    ")) overlaps tensor " + json_quoted(prev->name) + " (ending at " + std::to_string(at) + ")");
    if (e.begin > at)
      bad(file, "bytes [" + std::to_string(at) + ", " + std::to_string(e.begin) + ") of the data section, before tensor " +
                    json_quoted(e.name) + ", belong to no tensor (the format allows no holes)");
    at = e.end;
    prev = &e;
  }
  if (at != data_bytes)
    bad(file, "bytes [" + std::to_string(at) + ", " + std::to_string(data_bytes) +
                  ") at the end of the data section belong to no tensor (the format allows no holes)");
  return h;
}

SafetensorsHeader parse_safetensors(std::string_view bytes, const std::string& file) {
  if (bytes.size() < 8) bad(file, "the file has " + std::to_string(bytes.size()) + " bytes, fewer than the 8 of the header length");
  const std::uint64_t n = le64(bytes.data());
  if (n > kSafetensorsMaxHeaderBytes)
    bad(file, "header length " + std::to_string(n) + " exceeds the format's limit of " +
                  std::to_string(kSafetensorsMaxHeaderBytes) + " bytes");
  if (n > bytes.size() - 8)
    bad(file, "header length " + std::to_string(n) + " exceeds the " + std::to_string(bytes.size() - 8) +
                  " bytes after the length: the file is truncated or not safetensors");
  return parse_safetensors_header(bytes.substr(8, n), bytes.size() - 8 - n, file);
}

std::string safetensors_header_bytes(const std::vector<SafetensorsTensorSpec>& tensors,
                                     const std::map<std::string, std::string>& metadata, std::uint64_t* data_bytes) {
  ordered_json root = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json m = ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    root[std::string(kMetadataKey)] = std::move(m);
  }
  std::uint64_t at = 0;
  for (const SafetensorsTensorSpec& t : tensors) {
    ZOE_CHECK_USAGE(!t.name.empty(), "safetensors: a tensor has an empty name");
    ZOE_CHECK_USAGE(t.name != kMetadataKey, "safetensors: a tensor may not be named __metadata__");
    ZOE_CHECK_USAGE(!root.contains(t.name), "safetensors: tensor '", t.name, "' is listed twice");
    const std::size_t esz = safetensors_dtype_size(t.dtype);
    ZOE_CHECK_USAGE(esz > 0, "safetensors: tensor '", t.name, "': unknown dtype '", t.dtype, "'");
    std::uint64_t bytes = esz;
    ordered_json shape = ordered_json::array();
    for (std::int64_t d : t.shape) {
      ZOE_CHECK_USAGE(d >= 0, "safetensors: tensor '", t.name, "': negative dimension ", d);
      ZOE_CHECK_USAGE(mul(bytes, static_cast<std::uint64_t>(d), bytes), "safetensors: tensor '", t.name,
                      "' has more than 2^64 bytes");
      shape.push_back(d);
    }
    std::uint64_t end = 0;
    ZOE_CHECK_USAGE(!__builtin_add_overflow(at, bytes, &end), "safetensors: the tensors exceed 2^64 bytes");
    root[t.name] = {{"dtype", t.dtype}, {"shape", std::move(shape)}, {"data_offsets", {at, end}}};
    at = end;
  }
  std::string text = root.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  if (data_bytes) *data_bytes = at;
  return out + text;
}

// ---------------------------------------------------------------------------------------------
SafetensorsReader::SafetensorsReader(std::string path) : path_(std::move(path)) {
  do {
    // O_NONBLOCK: a FIFO without a writer would block the open before the regular-file check
    // below refuses it (reads of a regular file ignore the flag).
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) ZOE_THROW_ERRNO(errno, "cannot open safetensors file '", path_, "'");
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) ZOE_THROW_ERRNO(errno, "cannot stat safetensors file '", path_, "'");
    if (!S_ISREG(st.st_mode)) bad(path_, "not a regular file");
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (size < 8) bad(path_, "the file has " + std::to_string(size) + " bytes, fewer than the 8 of the header length");
    char len[8];
    pread_all(len, 8, 0, "the header length");
    const std::uint64_t n = le64(len);
    if (n > kSafetensorsMaxHeaderBytes)
      bad(path_, "header length " + std::to_string(n) + " exceeds the format's limit of " +
                     std::to_string(kSafetensorsMaxHeaderBytes) + " bytes");
    if (n > size - 8)
      bad(path_, "header length " + std::to_string(n) + " exceeds the " + std::to_string(size - 8) +
                     " bytes after the length: the file is truncated or not safetensors");
    std::string text(static_cast<std::size_t>(n), '\0');
    pread_all(text.data(), text.size(), 8, "the header");
    header_ = parse_safetensors_header(text, size - 8 - n, path_);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsReader::pread_all(void* dst, std::size_t bytes, std::uint64_t at, const std::string& what) const {
  auto* p = static_cast<char*>(dst);
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd_, p + done, bytes - done, static_cast<off_t>(at + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw IoError(path_, static_cast<long long>(at + done), static_cast<long long>(bytes - done), errno,
                    "reading " + what, __FILE__, __LINE__);
    if (n == 0)
      bad(path_, "the file ends at byte " + std::to_string(at + done) + " while reading " + what +
                     " (it shrank after it was opened)");
    done += static_cast<std::size_t>(n);
  }
}

void SafetensorsReader::read(const SafetensorsEntry& t, std::uint64_t offset, void* dst, std::size_t bytes) const {
  ZOE_CHECK_USAGE(offset <= t.bytes() && bytes <= t.bytes() - offset, "safetensors file '", path_, "': bytes [",
                  offset, ", ", offset + bytes, ") lie outside tensor '", t.name, "' (", t.bytes(), " bytes)");
  pread_all(dst, bytes, header_.data_begin() + t.begin + offset, "tensor " + json_quoted(t.name));
}

// ---------------------------------------------------------------------------------------------
SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<SafetensorsTensorSpec> tensors,
                                     std::map<std::string, std::string> metadata)
    : path_(std::move(path)), tmp_(path_ + ".tmp") {
  const std::string head = safetensors_header_bytes(tensors, metadata, &data_bytes_);
  out_ = std::make_unique<FileWriter>(tmp_, head.size() + data_bytes_);
  try {
    out_->write(head.data(), head.size());
  } catch (...) {
    out_.reset();
    std::error_code ec;
    std::filesystem::remove(tmp_, ec);
    throw;
  }
}

SafetensorsWriter::~SafetensorsWriter() {
  if (!out_) return;
  out_.reset();
  std::error_code ec;
  std::filesystem::remove(tmp_, ec);
}

void SafetensorsWriter::write(const void* data, std::size_t bytes) {
  ZOE_CHECK_USAGE(out_, "safetensors file '", path_, "': write after commit()");
  ZOE_CHECK_USAGE(bytes <= remaining(), "safetensors file '", path_, "': writing ", bytes, " bytes, but only ",
                  remaining(), " of the data section are left");
  out_->write(data, bytes);
  written_ += bytes;
}

void SafetensorsWriter::commit() {
  ZOE_CHECK_USAGE(out_, "safetensors file '", path_, "': commit() called twice");
  ZOE_CHECK_USAGE(remaining() == 0, "safetensors file '", path_, "': commit() with ", remaining(),
                  " bytes of the data section not written");
  try {
    out_->finish();  // fsync + close
    std::filesystem::rename(tmp_, path_);
  } catch (const std::filesystem::filesystem_error& e) {
    out_.reset();
    std::error_code ec;
    std::filesystem::remove(tmp_, ec);
    ZOE_THROW_ERRNO(e.code().value(), "cannot rename '", tmp_, "' to '", path_, "'");
  } catch (...) {
    out_.reset();
    std::error_code ec;
    std::filesystem::remove(tmp_, ec);
    throw;
  }
  out_.reset();
  // The rename is durable once the directory is.
  std::filesystem::path dir = std::filesystem::path(path_).parent_path();
  if (dir.empty()) dir = ".";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) ZOE_THROW_ERRNO(errno, "cannot open directory '", dir.string(), "' to make '", path_, "' durable");
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) ZOE_THROW_ERRNO(err, "fsync of directory '", dir.string(), "' (making '", path_, "' durable) failed");
}

}  // namespace zoe::io
