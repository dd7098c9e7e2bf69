// The safetensors format (io/safetensors.hpp): the writer's bytes against a file built by hand
// from the format's text, round trips through the streaming writer and the reader, and the
// strict reader on every file of tests/safetensors/corpus (built by make_corpus.py, an
// independent Python writer): good_* parse, bad_* fail with a CorruptionError naming the file
// and the phrase corpus_expected.json gives.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "io/safetensors.hpp"
#include "zoe/error.hpp"

namespace {
namespace fs = std::filesystem;
using namespace zoe::io;

std::string source_dir() {
  const char* s = std::getenv("ZOE_SOURCE_DIR");
  return s ? s : ".";
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("zoe_st_" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& n) const { return (path_ / n).string(); }

 private:
  fs::path path_;
};

// The expected file, byte by byte from the format's description: length 144 (0x90) as 8
// little-endian bytes; the JSON; 4 spaces so the data starts at byte 152, a multiple of 8;
// F32 1.5, -2.0; BF16 1.0 (0x3f80), -2.0 (0xc000), little-endian.
std::string hand_built() {
  const std::string json =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]}})";
  std::string f("\x90\0\0\0\0\0\0\0", 8);
  f += json + "    ";
  const unsigned char data[] = {0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00, 0x00, 0xc0, 0x80, 0x3f, 0x00, 0xc0};
  f.append(reinterpret_cast<const char*>(data), sizeof data);
  return f;
}

TEST(SafetensorsFormat, WriterBytesEqualTheFormatByHand) {
  const TempDir dir;
  const std::string expected = hand_built();
  ASSERT_EQ(expected.size(), 8u + 144u + 12u);
  {
    SafetensorsWriter w(dir / "x.safetensors", {{"a", "F32", {2}}, {"b", "BF16", {2}}}, {{"format", "pt"}});
    const float a[2] = {1.5f, -2.0f};
    const std::uint16_t b[2] = {0x3f80, 0xc000};
    w.write(a, 4);  // a call may stop inside a tensor...
    std::vector<char> rest(8);
    std::memcpy(rest.data(), reinterpret_cast<const char*>(a) + 4, 4);
    std::memcpy(rest.data() + 4, b, 4);
    w.write(rest.data(), rest.size());  // ... and span two
    EXPECT_FALSE(fs::exists(dir / "x.safetensors")) << "visible before commit";
    EXPECT_EQ(w.remaining(), 0u);
    w.commit();
  }
  EXPECT_EQ(slurp(dir / "x.safetensors"), expected);
  EXPECT_FALSE(fs::exists(dir / "x.safetensors.tmp"));
  // The same file is what the corpus's independent writer (Python) built.
  EXPECT_EQ(slurp(source_dir() + "/tests/safetensors/corpus/good_basic"), expected);
}

TEST(SafetensorsFormat, ReaderDecodesTheHandBuiltFile) {
  const TempDir dir;
  { std::ofstream(dir / "h.safetensors", std::ios::binary) << hand_built(); }
  const SafetensorsReader r(dir / "h.safetensors");
  const SafetensorsHeader& h = r.header();
  EXPECT_EQ(h.header_bytes, 144u);
  EXPECT_EQ(h.data_begin(), 152u);
  EXPECT_EQ(h.data_bytes, 12u);
  EXPECT_EQ(h.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "a");
  EXPECT_EQ(h.tensors[0].dtype, "F32");
  EXPECT_EQ(h.tensors[0].shape, std::vector<std::int64_t>{2});
  EXPECT_EQ(h.tensors[1].name, "b");
  EXPECT_EQ(h.tensors[1].begin, 8u);
  float a[2];
  r.read(h.tensors[0], 0, a, 8);
  EXPECT_EQ(a[0], 1.5f);
  EXPECT_EQ(a[1], -2.0f);
  std::uint16_t b1 = 0;
  r.read(h.tensors[1], 2, &b1, 2);
  EXPECT_EQ(b1, 0xc000);
  EXPECT_THROW(r.read(h.tensors[1], 2, &b1, 4), zoe::UsageError);  // past the tensor
}

TEST(SafetensorsFormat, FileOrderIsOffsetOrderNotHeaderOrder) {
  const std::string f = slurp(source_dir() + "/tests/safetensors/corpus/good_header_order_differs");
  const SafetensorsHeader h = parse_safetensors(f, "good_header_order_differs");
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "a");
  EXPECT_EQ(h.tensors[1].name, "b");
}

TEST(SafetensorsFormat, RoundTripStreamsEveryKindOfTensor) {
  const TempDir dir;
  // Scalars, zero-size tensors, several dtypes, a tensor larger than the chunks written.
  std::vector<SafetensorsTensorSpec> specs = {
      {"big", "F32", {37, 29}}, {"scalar", "F64", {}}, {"empty", "BF16", {0, 4}}, {"ids", "I64", {5}},
      {"flags", "BOOL", {3}},   {"half", "F16", {7}}};
  std::vector<std::string> payload;
  std::uint64_t total = 0;
  for (const auto& s : specs) {
    std::size_t n = safetensors_dtype_size(s.dtype);
    for (auto d : s.shape) n *= static_cast<std::size_t>(d);
    std::string bytes(n, '\0');
    for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>((i * 131 + s.name.size() * 7) & 0xff);
    payload.push_back(bytes);
    total += n;
  }
  std::string all;
  for (const auto& p : payload) all += p;
  {
    SafetensorsWriter w(dir / "rt.safetensors", specs, {{"format", "pt"}, {"source", "zoe test"}});
    EXPECT_EQ(w.remaining(), total);
    for (std::size_t at = 0; at < all.size(); at += 100) w.write(all.data() + at, std::min<std::size_t>(100, all.size() - at));
    w.commit();
  }
  const SafetensorsReader r(dir / "rt.safetensors");
  const SafetensorsHeader& h = r.header();
  EXPECT_EQ(h.data_begin() % 8, 0u);
  EXPECT_EQ(h.data_bytes, total);
  EXPECT_EQ(h.metadata.at("source"), "zoe test");
  ASSERT_EQ(h.tensors.size(), specs.size());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const SafetensorsEntry& e = h.tensors[i];  // file order = the order written
    EXPECT_EQ(e.name, specs[i].name);
    EXPECT_EQ(e.dtype, specs[i].dtype);
    EXPECT_EQ(e.shape, specs[i].shape);
    std::string back(e.bytes(), '\0');
    r.read(e, 0, back.data(), back.size());
    EXPECT_EQ(back, payload[i]) << e.name;
  }
  EXPECT_EQ(h.find("scalar")->numel, 1);
  EXPECT_EQ(h.find("empty")->numel, 0);
  EXPECT_EQ(h.find("missing"), nullptr);
}

TEST(SafetensorsFormat, WriterRefusesBadSpecsAndMisuse) {
  const TempDir dir;
  const std::string p = dir / "w.safetensors";
  EXPECT_THROW(SafetensorsWriter(p, {{"a", "F32", {1}}, {"a", "F32", {1}}}), zoe::UsageError);
  EXPECT_THROW(SafetensorsWriter(p, {{"a", "F33", {1}}}), zoe::UsageError);
  EXPECT_THROW(SafetensorsWriter(p, {{"a", "F32", {-1}}}), zoe::UsageError);
  EXPECT_THROW(SafetensorsWriter(p, {{"", "F32", {1}}}), zoe::UsageError);
  EXPECT_THROW(SafetensorsWriter(p, {{"__metadata__", "F32", {1}}}), zoe::UsageError);
  {
    SafetensorsWriter w(p, {{"a", "F32", {2}}});
    const float v[3] = {1, 2, 3};
    EXPECT_THROW(w.write(v, 12), zoe::UsageError);  // past the data section
    w.write(v, 4);
    EXPECT_THROW(w.commit(), zoe::UsageError);  // 4 bytes missing
  }  // abandoned: the temporary file goes, nothing appears
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  // An abandoned rewrite leaves the previous file as it was.
  {
    SafetensorsWriter w(p, {{"a", "U8", {1}}});
    w.write("x", 1);
    w.commit();
  }
  { SafetensorsWriter w(p, {{"a", "U8", {1}}}); }
  EXPECT_EQ(SafetensorsReader(p).header().tensors.at(0).name, "a");
}

// A FIFO without a writer blocked the reader's open(2) before its regular-file check ran.
TEST(SafetensorsFormat, ReaderRefusesAFifoWithoutBlocking) {
  const TempDir dir;
  const std::string fifo = dir / "weights.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    SafetensorsReader r(fifo);
    FAIL() << "opened a FIFO";
  } catch (const zoe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
}

TEST(SafetensorsFormat, ReaderNamesTheFileForMissingAndTruncatedFiles) {
  const TempDir dir;
  try {
    SafetensorsReader r(dir / "nope.safetensors");
    FAIL() << "opened a missing file";
  } catch (const zoe::SystemError& e) {
    EXPECT_NE(std::string(e.what()).find("nope.safetensors"), std::string::npos) << e.what();
  }
  std::string f = hand_built();
  f.resize(f.size() - 1);  // one byte short: the last tensor lies past the end
  { std::ofstream(dir / "t.safetensors", std::ios::binary) << f; }
  try {
    SafetensorsReader r(dir / "t.safetensors");
    FAIL() << "accepted a truncated file";
  } catch (const zoe::CorruptionError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("t.safetensors"), std::string::npos) << m;
    EXPECT_NE(m.find("tensor \"b\""), std::string::npos) << m;
    EXPECT_NE(m.find("past the end"), std::string::npos) << m;
  }
}

// Every corpus file through the reader (the file path) and parse_safetensors (in memory).
TEST(SafetensorsFormat, CorpusGoodFilesParseAndBadFilesFailNamingTheProblem) {
  const std::string dir = source_dir() + "/tests/safetensors";
  std::ifstream in(dir + "/corpus_expected.json");
  ASSERT_TRUE(in) << "no " << dir << "/corpus_expected.json";
  const nlohmann::json expected = nlohmann::json::parse(in);
  int good = 0, refused = 0;
  for (const auto& entry : fs::directory_iterator(dir + "/corpus")) {
    const std::string name = entry.path().filename().string();
    const std::string path = entry.path().string();
    const std::string bytes = slurp(path);
    if (name.rfind("good_", 0) == 0) {
      EXPECT_NO_THROW(SafetensorsReader{path}) << name;
      EXPECT_NO_THROW(parse_safetensors(bytes, name)) << name;
      ++good;
      continue;
    }
    ASSERT_TRUE(expected.contains(name)) << name << " has no entry in corpus_expected.json";
    const std::string phrase = expected[name].get<std::string>();
    for (int via_file = 0; via_file < 2; ++via_file) {
      try {
        if (via_file) {
          SafetensorsReader r(path);
        } else {
          parse_safetensors(bytes, path);
        }
        ADD_FAILURE() << name << " was accepted";
      } catch (const zoe::CorruptionError& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("safetensors file '" + path + "'"), std::string::npos) << m;
        EXPECT_NE(m.find(phrase), std::string::npos) << name << ": expected '" << phrase << "' in: " << m;
      }
    }
    ++refused;
  }
  EXPECT_EQ(refused, static_cast<int>(expected.size()));
  EXPECT_GE(good, 5);
}

}  // namespace
