#include "src/core/checkpoint/checkpoint_reader.hpp"
#include "src/common/quote.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "io/crc32c.hpp"
#include "src/common/check.hpp"
#include "src/common/regular_file.hpp"
#include "src/core/flat_layout.hpp"
#include "src/device/host_elementwise.hpp"

namespace zoe::ckpt {
namespace fs = std::filesystem;

namespace {
// Format 1's header (src/core/checkpoint/checkpoint.cpp before format 2), 56 bytes.
constexpr std::uint64_t kLegacyMagic = 0x31504b43454f5aull;  // "ZOECKP1"
struct LegacyHeader {
  std::uint64_t magic = 0;
  std::int32_t world = 0, stage = 0, rank = 0, groups = 0;
  std::int64_t step = 0;
  double lr = 0, scale = 1;
  std::int32_t good_steps = 0, hysteresis_left = 0;
};
constexpr std::uint64_t kLegacyGroupPrefix = sizeof(std::int64_t) + sizeof(std::uint32_t);

std::string rank_name(int r) { return "rank" + std::to_string(r) + ".zoe"; }

LegacyHeader read_legacy_header(const std::string& path, std::ifstream& in) {
  LegacyHeader h;
  in.read(reinterpret_cast<char*>(&h), sizeof(h));
  if (!in || h.magic != kLegacyMagic) ZOE_THROW(CorruptionError, detail::quoted_path(path), " is not a zoe checkpoint file of format 1");
  return h;
}
}  // namespace

CheckpointReader::CheckpointReader(std::string dir, Manifest m)
    : dir_(std::move(dir)), m_(std::move(m)), fds_(static_cast<std::size_t>(m_.world_size), -1) {}

CheckpointReader::~CheckpointReader() {
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
}

std::string CheckpointReader::file_path(int rank) const {
  return (fs::path(dir_) / m_.files[static_cast<std::size_t>(rank)].name).string();
}

void CheckpointReader::pread_exact(int rank, void* dst, std::size_t bytes, std::uint64_t offset) {
  check_file(rank);
  const int fd = fds_[static_cast<std::size_t>(rank)];
  auto* p = static_cast<char*>(dst);
  std::uint64_t at = offset;
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, bytes, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw IoError(file_path(rank), static_cast<long long>(at), static_cast<long long>(bytes), errno, "read",
                    __FILE__, __LINE__);
    if (n == 0)
      ZOE_THROW(CorruptionError, detail::quoted_path(file_path(rank)), " ends at byte ", at, ", before the ", bytes,
                " bytes the manifest places there: the file is truncated");
    p += n;
    at += static_cast<std::uint64_t>(n);
    bytes -= static_cast<std::size_t>(n);
  }
}

void CheckpointReader::check_file(int rank) {
  ZOE_CHECK(rank >= 0 && rank < m_.world_size, "rank ", rank, " of ", m_.world_size);
  int& fd = fds_[static_cast<std::size_t>(rank)];
  if (fd >= 0) return;
  const std::string path = file_path(rank);
  const int f = open_regular_file(path);  // a FIFO or /dev/zero is refused, not read
  if (f < 0) {
    const int err = errno;
    ZOE_THROW_ERRNO(err, "checkpoint file ", detail::quoted_path(path), " (rank ", rank, " of ", m_.world_size,
                    ") cannot be opened: ", err == ENOENT ? "it is missing" : std::strerror(err));
  }
  struct stat st {};
  if (::fstat(f, &st) != 0) {
    const int err = errno;
    ::close(f);
    ZOE_THROW_ERRNO(err, "cannot stat ", detail::quoted_path(path));
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  const std::uint64_t expect = m_.files[static_cast<std::size_t>(rank)].bytes;
  auto fail = [&](auto&&... what) {
    ::close(f);
    ZOE_THROW(CorruptionError, detail::quoted_path(path), ": ", what...);
  };
  if (m_.version >= kOldestManifestVersion) {
    RankFileHeader h;
    const ssize_t n = ::pread(f, &h, sizeof h, 0);
    if (n != static_cast<ssize_t>(sizeof h)) fail("shorter than its 64-byte header: the file is truncated");
    if (std::memcmp(h.magic, RankFileHeader{}.magic, sizeof h.magic) != 0) fail("not a zoe checkpoint rank file");
    if (h.crc32c != header_crc(h)) fail("its header does not match its checksum: the file is corrupt");
    if (h.version != static_cast<std::uint32_t>(m_.version))
      fail("format version ", h.version, ", the manifest's is ", m_.version, ": a rank file of another save was copied in");
    if (h.rank != rank || h.world_size != m_.world_size)
      fail("holds the states of rank ", h.rank, " of ", h.world_size, ", but the manifest expects rank ", rank, " of ",
           m_.world_size, " here: rank files were swapped or copied from elsewhere");
    if (h.id != m_.id)
      fail("belongs to another save (id ", std::hex, h.id, ", the manifest's is ", m_.id, std::dec,
           "): a rank file of an older or other checkpoint was copied in");
    if (h.file_bytes != expect) fail("its header says ", h.file_bytes, " bytes, the manifest ", expect);
  }
  if (size < expect) fail("holds ", size, " bytes, the manifest expects ", expect, ": the file is truncated");
  if (size > expect) fail("holds ", size, " bytes, the manifest expects ", expect, ": the file has trailing bytes");
  fd = f;
}

void CheckpointReader::verify(int rank, std::size_t g) {
  const GroupEntry& group = m_.groups[g];
  const RankRange& r = group.ranks[static_cast<std::size_t>(rank)];
  const std::uint64_t bytes = range_bytes(m_, group, r.numel);
  std::vector<char> buf(std::size_t{1} << 20);
  std::uint32_t crc = 0;
  for (std::uint64_t done = 0, total = bytes; done < total;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), total - done));
    pread_exact(rank, buf.data(), n, r.file_offset + done);
    crc = io::crc32c(buf.data(), n, crc);
    done += n;
  }
  if (crc != r.crc32c)
    ZOE_THROW(CorruptionError, detail::quoted_path(file_path(rank)), ": the ",
              group.frozen ? "values of frozen group " : "states of group ", detail::quoted(group.name), " (bytes [",
              r.file_offset, ", ", r.file_offset + bytes, ")) do not match their checksum (crc32c ",
              crc_hex(crc), ", the manifest's ", crc_hex(r.crc32c), "): the file is corrupt");
}

int CheckpointReader::owner(std::size_t g, std::int64_t x, int prefer) const {
  const auto& ranks = m_.groups[g].ranks;
  auto holds = [&](int r) {
    const RankRange& rr = ranks[static_cast<std::size_t>(r)];
    return x >= rr.begin && x < rr.begin + rr.numel;
  };
  if (prefer >= 0 && prefer < m_.world_size && holds(prefer)) return prefer;
  if (sharded(m_, m_.groups[g])) {  // disjoint equal shards
    const std::int64_t shard = ranks[0].numel;
    const int r = shard > 0 ? static_cast<int>(x / shard) : -1;
    return r >= 0 && r < m_.world_size && holds(r) ? r : -1;
  }
  return holds(0) ? 0 : -1;
}

std::vector<int> CheckpointReader::sources(std::size_t g, std::int64_t begin, std::int64_t end, int prefer) const {
  std::vector<int> out;
  for (const ParamEntry& p : m_.groups[g].params) {
    std::int64_t x = std::max(begin, p.offset);
    const std::int64_t b = std::min(end, p.offset + p.numel);
    while (x < b) {
      const int r = owner(g, x, prefer);
      if (r < 0) break;
      out.push_back(r);
      const RankRange& rr = m_.groups[g].ranks[static_cast<std::size_t>(r)];
      x = rr.begin + rr.numel;
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void CheckpointReader::read(std::size_t g, int state, std::int64_t begin, std::span<float> out, int prefer) {
  const GroupEntry& group = m_.groups[g];
  if (state_bytes(m_, group) == sizeof(float)) {
    read_stored(g, state, begin, out.size(), out.data(), prefer);
    return;
  }
  // A frozen group's 16-bit values, widened exactly.
  const DType dtype = m_.compute_dtype == "bf16" ? DType::bf16 : DType::f16;
  std::vector<std::uint16_t> stored(out.size());
  read_stored(g, state, begin, out.size(), stored.data(), prefer);
  host_ops::cast(stored.data(), dtype, out.data(), DType::f32, out.size());
}

void CheckpointReader::read_stored(std::size_t g, int state, std::int64_t begin, std::size_t count, void* out,
                                   int prefer) {
  const GroupEntry& group = m_.groups[g];
  ZOE_CHECK(state >= 0 && state < state_count(group), "state ", state, " of group ", detail::quoted(group.name));
  const std::uint64_t esz = state_bytes(m_, group);
  auto* bytes = static_cast<char*>(out);
  std::memset(bytes, 0, count * esz);
  const std::int64_t end = begin + static_cast<std::int64_t>(count);
  const std::int64_t chunk = m_.chunk_elements;
  for (const ParamEntry& p : group.params) {
    std::int64_t x = std::max(begin, p.offset);
    const std::int64_t b = std::min(end, p.offset + p.numel);
    while (x < b) {
      const int r = owner(g, x, prefer);
      if (r < 0) break;  // past the saved buffer (the manifest's layout covers every parameter)
      const RankRange& rr = m_.groups[g].ranks[static_cast<std::size_t>(r)];
      const std::int64_t i = x - rr.begin;                                   // in the rank's range
      const std::int64_t chunk_end = std::min(rr.numel, (i / chunk + 1) * chunk);  // in the range
      const std::int64_t n = std::min(b - x, chunk_end - i);
      pread_exact(r, bytes + static_cast<std::size_t>(x - begin) * esz, static_cast<std::size_t>(n) * esz,
                  rr.file_offset + element_offset(m_, group, i, state, chunk, rr.numel));
      x += n;
    }
  }
}

bool is_legacy(const std::string& dir) {
  if (fs::exists(fs::path(dir) / kManifestName)) return false;
  std::error_code ec;  // a FIFO named rank0.zoe would block the read below
  if (!fs::is_regular_file(fs::path(dir) / rank_name(0), ec)) return false;
  std::ifstream in(fs::path(dir) / rank_name(0), std::ios::binary);
  std::uint64_t magic = 0;
  in.read(reinterpret_cast<char*>(&magic), sizeof magic);
  return in && magic == kLegacyMagic;
}

Manifest read_legacy(const std::string& dir, std::vector<GroupEntry> model) {
  const std::string path0 = (fs::path(dir) / rank_name(0)).string();
  require_regular_file(path0);
  std::ifstream in0(path0, std::ios::binary);
  if (!in0) ZOE_THROW_ERRNO(ENOENT, "cannot open checkpoint file ", detail::quoted_path(path0));
  const LegacyHeader h0 = read_legacy_header(path0, in0);
  if (h0.world < 1 || h0.world > (1 << 16) || h0.stage < 0 || h0.stage > 3)
    ZOE_THROW(CorruptionError, detail::quoted_path(path0), ": world size ", h0.world, ", stage ", h0.stage, ": the file is corrupt");
  if (h0.groups != static_cast<std::int32_t>(model.size()))
    ZOE_THROW(UsageError, "checkpoint ", detail::quoted_path(dir), " (format 1) has ", h0.groups, " module groups; this engine has ",
              model.size(), ": it was saved from another model");
  Manifest m;
  m.version = 1;
  m.world_size = h0.world;
  m.stage = h0.stage;
  m.chunk_elements = std::int64_t{1} << 50;  // one chunk per group
  m.step = h0.step;
  m.step_calls = h0.step;
  m.lr = h0.lr;
  m.loss_scale = h0.scale;
  m.good_steps = h0.good_steps;
  m.hysteresis_left = h0.hysteresis_left;
  m.groups = std::move(model);
  lay_out_ranks(m);
  // Format 1 places a group's (count, crc) before its states, after a 56-byte header.
  for (int r = 0; r < m.world_size; ++r) {
    const std::string path = (fs::path(dir) / rank_name(r)).string();
    require_regular_file(path);
    std::ifstream in(path, std::ios::binary);
    if (!in)
      ZOE_THROW_ERRNO(ENOENT, "checkpoint file ", detail::quoted_path(path), " (rank ", r, " of ", m.world_size,
                      ") cannot be opened: it is missing");
    const LegacyHeader h = read_legacy_header(path, in);
    if (h.rank != r || h.world != m.world_size)
      ZOE_THROW(CorruptionError, detail::quoted_path(path), " holds the states of rank ", h.rank, " of ", h.world, ", expected rank ",
                r, " of ", m.world_size, ": rank files were swapped or copied from elsewhere");
    if (h.step != h0.step || h.stage != h0.stage)
      ZOE_THROW(CorruptionError, detail::quoted_path(path), " is of step ", h.step, " (stage ", h.stage, "), rank 0's of step ",
                h0.step, " (stage ", h0.stage, "): the files come from different saves");
    std::uint64_t at = sizeof(LegacyHeader);
    for (GroupEntry& g : m.groups) {
      RankRange& rr = g.ranks[static_cast<std::size_t>(r)];
      std::int64_t n = -1;
      std::uint32_t crc = 0;
      in.seekg(static_cast<std::streamoff>(at));
      in.read(reinterpret_cast<char*>(&n), sizeof n);
      in.read(reinterpret_cast<char*>(&crc), sizeof crc);
      if (!in) ZOE_THROW(CorruptionError, detail::quoted_path(path), ": group ", detail::quoted(g.name), " is truncated");
      if (n != rr.numel)
        ZOE_THROW(UsageError, "checkpoint ", detail::quoted_path(path), ": group ", detail::quoted(g.name), " holds ", n, " elements, this model's ",
                  rr.numel, " at world size ", m.world_size, ", stage ", m.stage, ": it was saved from another model");
      rr.file_offset = at + kLegacyGroupPrefix;
      rr.crc32c = crc;
      at = rr.file_offset + range_bytes(m, g, n);
    }
    m.files[static_cast<std::size_t>(r)].bytes = at;
  }
  return m;
}

}  // namespace zoe::ckpt
