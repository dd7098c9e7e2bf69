#include "src/core/checkpoint/checkpoint_manifest.hpp"
#include "src/common/quote.hpp"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <limits>

#include <nlohmann/json.hpp>

#include "io/crc32c.hpp"
#include "src/common/check.hpp"
#include "src/common/regular_file.hpp"
#include "src/core/checkpoint/checkpoint_manifest_json.hpp"
#include "src/core/flat_layout.hpp"

namespace zoe::ckpt {
namespace {
using nlohmann::json;

constexpr const char* kFormat = "zoe-checkpoint";
// Bounds that keep every size and offset computation far from overflow.
constexpr std::int64_t kMaxElements = std::int64_t{1} << 50;
constexpr int kMaxWorld = 1 << 16;

std::string hex64(std::uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016" PRIx64, v);
  return b;
}

// A field reader that names the field in every error.
class Fields {
 public:
  explicit Fields(const std::string& path) : path_(path) {}
  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    ZOE_THROW(CorruptionError, detail::quoted_path(path_), ": field '", field, "': ", what);
  }
  const json& at(const json& obj, const std::string& field, const std::string& key) const {
    if (!obj.is_object()) fail(field, "expected an object");
    auto it = obj.find(key);
    if (it == obj.end()) fail(join(field, key), "missing");
    return *it;
  }
  std::int64_t integer(const json& obj, const std::string& field, const std::string& key, std::int64_t lo,
                       std::int64_t hi) const {
    const json& v = at(obj, field, key);
    const std::string f = join(field, key);
    if (!v.is_number_integer()) fail(f, "expected an integer, got " + shown(v));
    std::int64_t x;
    if (v.is_number_unsigned()) {
      const auto u = v.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(hi)) fail(f, "out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]: " + shown(v));
      x = static_cast<std::int64_t>(u);
    } else {
      x = v.get<std::int64_t>();
    }
    if (x < lo || x > hi) fail(f, "out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]: " + shown(v));
    return x;
  }
  double number(const json& obj, const std::string& field, const std::string& key) const {
    const json& v = at(obj, field, key);
    if (!v.is_number()) fail(join(field, key), "expected a number, got " + shown(v));
    return v.get<double>();
  }
  std::string string(const json& obj, const std::string& field, const std::string& key) const {
    const json& v = at(obj, field, key);
    if (!v.is_string()) fail(join(field, key), "expected a string, got " + shown(v));
    return v.get<std::string>();
  }
  const json& array(const json& obj, const std::string& field, const std::string& key) const {
    const json& v = at(obj, field, key);
    if (!v.is_array()) fail(join(field, key), "expected an array, got " + shown(v));
    return v;
  }
  std::uint64_t hex(const json& obj, const std::string& field, const std::string& key, int digits) const {
    const std::string s = string(obj, field, key);
    if (s.size() != static_cast<std::size_t>(digits) || s.find_first_not_of("0123456789abcdef") != std::string::npos)
      fail(join(field, key), "expected " + std::to_string(digits) + " lowercase hex digits, got " + shown(s));
    return std::stoull(s, nullptr, 16);
  }
  static std::string join(const std::string& field, const std::string& key) {
    return field.empty() ? key : field + "." + key;
  }
  static std::string index(const std::string& field, std::size_t i) { return field + "[" + std::to_string(i) + "]"; }

 private:
  const std::string& path_;
};

// Derived, for readers of the file (an exporter): which rank holds which elements of the
// parameter, in rank order. The ranges (groups[].ranks) are the source: a parse checks these
// are what they give.
json pieces_of(const GroupEntry& g, const ParamEntry& p) {
  json pieces = json::array();
  for (std::size_t r = 0; r < g.ranks.size(); ++r) {
    const RankRange& rr = g.ranks[r];
    const std::int64_t a = std::max(p.offset, rr.begin), b = std::min(p.offset + p.numel, rr.begin + rr.numel);
    if (a < b) pieces.push_back({{"rank", r}, {"begin", a - p.offset}, {"end", b - p.offset}});
  }
  return pieces;
}
// The dtype a parameter is stored as: fp32 master weights, a frozen one's compute dtype.
std::string stored_dtype(const Manifest& m, const GroupEntry& g) { return g.frozen ? m.compute_dtype : "fp32"; }

json to_json(const Manifest& m) {
  json groups = json::array();
  for (const GroupEntry& g : m.groups) {
    json params = json::array();
    for (const ParamEntry& p : g.params)
      params.push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}, {"numel", p.numel},
                        {"dtype", stored_dtype(m, g)}, {"ranks", pieces_of(g, p)}});
    json ranks = json::array();
    for (const RankRange& r : g.ranks)
      ranks.push_back({{"begin", r.begin}, {"numel", r.numel}, {"file_offset", r.file_offset},
                       {"crc32c", crc_hex(r.crc32c)}});
    json group = {{"name", g.name}, {"padded_numel", g.padded_numel}, {"params", params}, {"ranks", ranks}};
    if (m.version >= 3) group["frozen"] = g.frozen;  // version 2 has no frozen groups (and no key)
    groups.push_back(std::move(group));
  }
  json files = json::array();
  for (const RankFileEntry& f : m.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}});
  return {{"id", hex64(m.id)},
          {"world_size", m.world_size},
          {"stage", m.stage},
          {"compute_dtype", m.compute_dtype},
          {"states", {kStateNames[0], kStateNames[1], kStateNames[2]}},
          {"state_dtype", "fp32"},
          {"chunk_elements", m.chunk_elements},
          {"step", m.step},
          {"step_calls", m.step_calls},
          {"skipped_steps", m.skipped_steps},
          {"lr", m.lr},
          {"loss_scaler", {{"scale", m.loss_scale}, {"good_steps", m.good_steps}, {"hysteresis_left", m.hysteresis_left}}},
          {"client_state", m.client_state},
          {"groups", groups},
          {"files", files}};
}
// A parameter's derived fields (to_json): `dtype` as stored and `ranks`, the pieces its
// group's ranges give (checked after those ranges are, so these follow from them).
void check_derived(const Fields& F, const Manifest& m, const GroupEntry& g, const json& jg, const std::string& G) {
  const json& params = jg.at("params");
  for (std::size_t pi = 0; pi < g.params.size(); ++pi) {
    const std::string P = Fields::index(G + ".params", pi);
    const json& dtype = F.at(params[pi], P, "dtype");
    if (dtype != stored_dtype(m, g))
      F.fail(P + ".dtype", "expected \"" + stored_dtype(m, g) + "\" (" +
                               (g.frozen ? "a frozen parameter's values are stored in the compute dtype"
                                         : "a trainable parameter's master weights are fp32") +
                               "), got " + shown(dtype));
    const json& got = F.array(params[pi], P, "ranks");
    const json expect = pieces_of(g, g.params[pi]);
    for (std::size_t i = 0; i < std::max(got.size(), expect.size()); ++i) {
      const std::string R = Fields::index(P + ".ranks", i);
      if (i >= expect.size())
        F.fail(R, shown(got[i]) + " beyond the " + std::to_string(expect.size()) +
                      " pieces the group's ranges give (every rank's [begin, end) of the parameter, in rank order)");
      if (i >= got.size())
        F.fail(P + ".ranks", std::to_string(got.size()) + " pieces, the group's ranges give " +
                                 std::to_string(expect.size()) + ": missing " + shown(expect[i]));
      if (got[i] != expect[i])
        F.fail(R, shown(got[i]) + ", the group's ranges give " + shown(expect[i]) +
                      " (rank < world size " + std::to_string(m.world_size) + ", [begin, end) within the parameter)");
    }
  }
}
}  // namespace

std::uint32_t header_crc(const RankFileHeader& h) { return io::crc32c(&h, offsetof(RankFileHeader, crc32c)); }

std::string crc_hex(std::uint32_t crc) {
  char b[9];
  std::snprintf(b, sizeof b, "%08" PRIx32, crc);
  return b;
}

int version_for(const Manifest& m) {
  for (const GroupEntry& g : m.groups)
    if (g.frozen) return 3;
  return 2;
}

std::uint64_t state_bytes(const Manifest& m, const GroupEntry& g) {
  if (!g.frozen || m.compute_dtype == "fp32") return 4;
  return 2;  // bf16, fp16 (parse_manifest admits no other)
}

std::uint64_t element_offset(const Manifest& m, const GroupEntry& g, std::int64_t i, int state, std::int64_t chunk,
                             std::int64_t numel) {
  const std::int64_t c0 = i / chunk * chunk;  // the chunk's first element
  const std::int64_t len = std::min(chunk, numel - c0);
  return range_bytes(m, g, c0) + static_cast<std::uint64_t>(state * len + (i - c0)) * state_bytes(m, g);
}

void lay_out_ranks(Manifest& m) {
  m.files.assign(static_cast<std::size_t>(m.world_size), {});
  std::vector<std::uint64_t> at(static_cast<std::size_t>(m.world_size), kHeaderBytes);
  for (GroupEntry& g : m.groups) {
    std::vector<std::int64_t> numels;
    for (const ParamEntry& p : g.params) numels.push_back(p.numel);
    const core::FlatLayout L(numels, m.world_size);
    std::vector<std::uint32_t> crcs;
    for (const RankRange& r : g.ranks) crcs.push_back(r.crc32c);
    g.padded_numel = L.padded_numel();
    g.ranks.assign(static_cast<std::size_t>(m.world_size), {});
    for (int r = 0; r < m.world_size; ++r) {
      RankRange& rr = g.ranks[static_cast<std::size_t>(r)];
      rr.begin = sharded(m, g) ? L.shard_begin(r) : 0;
      rr.numel = sharded(m, g) ? L.shard_numel() : L.padded_numel();
      rr.file_offset = at[static_cast<std::size_t>(r)];
      if (static_cast<std::size_t>(r) < crcs.size()) rr.crc32c = crcs[static_cast<std::size_t>(r)];
      at[static_cast<std::size_t>(r)] += range_bytes(m, g, rr.numel);
    }
  }
  for (int r = 0; r < m.world_size; ++r)
    m.files[static_cast<std::size_t>(r)] = {"rank" + std::to_string(r) + ".zoe", at[static_cast<std::size_t>(r)]};
}

std::string read_manifest_text(const std::string& path) { return read_regular_file(path, kMaxManifestBytes); }

std::string serialize(const Manifest& m) {
  const json inner = to_json(m);
  json outer = {{"format", kFormat},
                {"version", m.version},
                {"crc32c", crc_hex(io::crc32c(inner.dump().data(), inner.dump().size()))},
                {"manifest", inner}};
  return outer.dump(1) + "\n";
}

Manifest parse_manifest(std::string_view text, const std::string& path) {
  const json outer = parse_manifest_json(text, path);  // refuses repeated keys
  Fields F(path);
  try {
    if (!outer.is_object()) F.fail("", "expected an object");
    if (F.string(outer, "", "format") != kFormat) F.fail("format", "expected \"zoe-checkpoint\"");
    const std::int64_t version = F.integer(outer, "", "version", 0, 1 << 30);
    if (version < kOldestManifestVersion || version > kFormatVersion)
      F.fail("version", "format version " + std::to_string(version) + " is not known to this zoe (it reads " +
                            std::to_string(kOldestManifestVersion) + " to " + std::to_string(kFormatVersion) +
                            "); use the zoe that wrote it");
    const std::uint64_t crc = F.hex(outer, "", "crc32c", 8);
    const json& in = F.at(outer, "", "manifest");
    if (!in.is_object()) F.fail("manifest", "expected an object");
    const std::string dumped = in.dump();
    const std::uint32_t actual = io::crc32c(dumped.data(), dumped.size());
    if (actual != crc)
      ZOE_THROW(CorruptionError, detail::quoted_path(path), ": the manifest does not match its checksum (crc32c ", crc_hex(actual),
                ", recorded ", crc_hex(static_cast<std::uint32_t>(crc)), "): the file was edited or is corrupt");

    Manifest m;
    m.version = static_cast<int>(version);
    const std::string M = "manifest";
    m.id = F.hex(in, M, "id", 16);
    m.world_size = static_cast<int>(F.integer(in, M, "world_size", 1, kMaxWorld));
    m.stage = static_cast<int>(F.integer(in, M, "stage", 0, 3));
    m.compute_dtype = F.string(in, M, "compute_dtype");
    if (m.compute_dtype != "fp32" && m.compute_dtype != "bf16" && m.compute_dtype != "fp16")
      F.fail(M + ".compute_dtype", "expected fp32, bf16 or fp16, got " + shown(m.compute_dtype));
    if (const std::string sd = F.string(in, M, "state_dtype"); sd != "fp32")
      F.fail(M + ".state_dtype", "expected \"fp32\", got " + shown(sd));
    const json& states = F.at(in, M, "states");
    if (states != json{kStateNames[0], kStateNames[1], kStateNames[2]})
      F.fail(M + ".states", "expected [\"master\", \"exp_avg\", \"exp_avg_sq\"], got " + shown(states));
    m.chunk_elements = F.integer(in, M, "chunk_elements", 1, kMaxElements);
    m.step = F.integer(in, M, "step", 0, kMaxElements);
    m.step_calls = F.integer(in, M, "step_calls", 0, kMaxElements);
    m.skipped_steps = F.integer(in, M, "skipped_steps", 0, m.step_calls);
    // The engine counts one optimizer step per step() call it did not skip.
    if (m.step != m.step_calls - m.skipped_steps)
      F.fail(M + ".step", std::to_string(m.step) + ", but step_calls " + std::to_string(m.step_calls) +
                              " - skipped_steps " + std::to_string(m.skipped_steps) + " = " +
                              std::to_string(m.step_calls - m.skipped_steps) +
                              " (each step() call that is not skipped applies one optimizer step)");
    m.lr = F.number(in, M, "lr");
    if (!(m.lr >= 0) || !std::isfinite(m.lr)) F.fail(M + ".lr", "must be finite and >= 0, got " + shown(in.at("lr")));
    const json& ls = F.at(in, M, "loss_scaler");
    m.loss_scale = F.number(ls, M + ".loss_scaler", "scale");
    if (!(m.loss_scale > 0) || !std::isfinite(m.loss_scale))
      F.fail(M + ".loss_scaler.scale", "must be finite and > 0, got " + shown(ls.at("scale")));
    m.good_steps = static_cast<int>(F.integer(ls, M + ".loss_scaler", "good_steps", 0, 1 << 30));
    m.hysteresis_left = static_cast<int>(F.integer(ls, M + ".loss_scaler", "hysteresis_left", 0, 1 << 30));
    m.client_state = F.string(in, M, "client_state");

    const json& groups = F.array(in, M, "groups");
    if (groups.size() > (1u << 20)) F.fail(M + ".groups", "too many groups: " + std::to_string(groups.size()));
    std::int64_t total = 0;
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      const std::string G = F.index(M + ".groups", gi);
      const json& jg = groups[gi];
      GroupEntry g;
      g.name = F.string(jg, G, "name");
      if (m.version >= 3) {
        const json& frozen = F.at(jg, G, "frozen");
        if (!frozen.is_boolean()) F.fail(G + ".frozen", "expected true or false, got " + shown(frozen));
        g.frozen = frozen.get<bool>();
      } else if (jg.is_object() && jg.contains("frozen")) {
        F.fail(G + ".frozen", "not a field of format version 2 (frozen groups are version 3)");
      }
      const json& params = F.array(jg, G, "params");
      if (params.size() > (1u << 20)) F.fail(G + ".params", "too many parameters");
      for (std::size_t pi = 0; pi < params.size(); ++pi) {
        const std::string P = F.index(G + ".params", pi);
        ParamEntry p;
        p.name = F.string(params[pi], P, "name");
        const json& shape = F.array(params[pi], P, "shape");
        if (shape.size() > 16) F.fail(P + ".shape", "more than 16 dimensions");
        std::int64_t n = 1;
        for (std::size_t d = 0; d < shape.size(); ++d) {
          if (!shape[d].is_number_integer() || shape[d].get<std::int64_t>() < 0 ||
              shape[d].get<std::int64_t>() > kMaxElements)
            F.fail(F.index(P + ".shape", d), "expected a size in [0, 2^50], got " + shown(shape[d]));
          const std::int64_t s = shape[d].get<std::int64_t>();
          p.shape.push_back(s);
          n = s == 0 ? 0 : (n > kMaxElements / s ? kMaxElements + 1 : n * s);
        }
        p.numel = F.integer(params[pi], P, "numel", 0, kMaxElements);
        if (n != p.numel) F.fail(P + ".numel", std::to_string(p.numel) + " is not the product of the shape");
        p.offset = F.integer(params[pi], P, "offset", 0, kMaxElements);
        total += p.numel;
        if (total > kMaxElements) F.fail(P + ".numel", "the model exceeds 2^50 elements");
        g.params.push_back(std::move(p));
      }
      const json& ranks = F.array(jg, G, "ranks");
      if (ranks.size() != static_cast<std::size_t>(m.world_size))
        F.fail(G + ".ranks", std::to_string(ranks.size()) + " entries for world size " + std::to_string(m.world_size));
      for (std::size_t r = 0; r < ranks.size(); ++r) {
        const std::string R = F.index(G + ".ranks", r);
        RankRange rr;
        rr.begin = F.integer(ranks[r], R, "begin", 0, kMaxElements);
        rr.numel = F.integer(ranks[r], R, "numel", 0, kMaxElements);
        rr.file_offset = static_cast<std::uint64_t>(F.integer(ranks[r], R, "file_offset", 0, kMaxElements * 16));
        rr.crc32c = static_cast<std::uint32_t>(F.hex(ranks[r], R, "crc32c", 8));
        g.ranks.push_back(rr);
      }
      g.padded_numel = F.integer(jg, G, "padded_numel", 0, kMaxElements * 2);
      m.groups.push_back(std::move(g));
    }
    const json& files = F.array(in, M, "files");
    if (files.size() != static_cast<std::size_t>(m.world_size))
      F.fail(M + ".files", std::to_string(files.size()) + " entries for world size " + std::to_string(m.world_size));
    for (std::size_t r = 0; r < files.size(); ++r) {
      const std::string R = F.index(M + ".files", r);
      m.files.push_back({F.string(files[r], R, "name"),
                         static_cast<std::uint64_t>(F.integer(files[r], R, "bytes", 0, kMaxElements * 16))});
    }

    // Every offset must be the one the layout gives: a reader then trusts them all.
    Manifest expect = m;
    lay_out_ranks(expect);
    for (std::size_t gi = 0; gi < m.groups.size(); ++gi) {
      const GroupEntry &g = m.groups[gi], &e = expect.groups[gi];
      const std::string G = F.index(M + ".groups", gi);
      std::vector<std::int64_t> numels;
      for (const ParamEntry& p : g.params) numels.push_back(p.numel);
      const core::FlatLayout L(numels, m.world_size);
      for (std::size_t pi = 0; pi < g.params.size(); ++pi)
        if (g.params[pi].offset != L.offset(pi))
          F.fail(F.index(G + ".params", pi) + ".offset",
                 std::to_string(g.params[pi].offset) + ", but the layout puts it at " + std::to_string(L.offset(pi)));
      if (g.padded_numel != e.padded_numel)
        F.fail(G + ".padded_numel", std::to_string(g.padded_numel) + ", the layout gives " + std::to_string(e.padded_numel));
      for (std::size_t r = 0; r < g.ranks.size(); ++r) {
        const RankRange &a = g.ranks[r], &b = e.ranks[r];
        if (a.begin != b.begin || a.numel != b.numel || a.file_offset != b.file_offset)
          F.fail(F.index(G + ".ranks", r), "range [" + std::to_string(a.begin) + ", +" + std::to_string(a.numel) +
                                               ") at byte " + std::to_string(a.file_offset) + ", the layout gives [" +
                                               std::to_string(b.begin) + ", +" + std::to_string(b.numel) + ") at byte " +
                                               std::to_string(b.file_offset));
      }
      check_derived(F, m, g, groups[gi], G);
    }
    for (std::size_t r = 0; r < m.files.size(); ++r)
      if (m.files[r].name != expect.files[r].name || m.files[r].bytes != expect.files[r].bytes)
        F.fail(F.index(M + ".files", r), "\"" + m.files[r].name + "\" of " + std::to_string(m.files[r].bytes) +
                                             " bytes, the layout gives \"" + expect.files[r].name + "\" of " +
                                             std::to_string(expect.files[r].bytes));
    return m;
  } catch (const json::exception& e) {
    ZOE_THROW(CorruptionError, detail::quoted_path(path), ": ", e.what());
  }
}

}  // namespace zoe::ckpt
