#include "src/core/checkpoint/checkpoint_reshard.hpp"
#include "src/common/quote.hpp"

#include <filesystem>
#include <random>

#include "io/crc32c.hpp"
#include "io/file_writer.hpp"
#include "src/common/check.hpp"
#include "src/core/checkpoint/checkpoint_dir.hpp"
#include "src/core/checkpoint/checkpoint_reader.hpp"

namespace zoe::ckpt {
namespace fs = std::filesystem;

Manifest read_manifest_file(const std::string& dir) {
  const std::string from = choose_for_load(dir);
  const std::string path = (fs::path(from) / kManifestName).string();
  if (is_legacy(from))
    ZOE_THROW_ERRNO(ENOENT, "cannot open ", detail::quoted_path(path), " (a checkpoint of format 1: load it with the engine and save it "
                    "again to convert it)");
  return parse_manifest(read_manifest_text(path), path);
}

void verify_checkpoint(const std::string& dir, const Manifest& m, const Progress& progress) {
  CheckpointReader reader(dir, m);
  std::uint64_t total = 0, done = 0;
  for (const RankFileEntry& f : m.files) total += f.bytes;
  for (int r = 0; r < m.world_size; ++r) {
    reader.check_file(r);
    for (std::size_t g = 0; g < m.groups.size(); ++g) {
      reader.verify(r, g);
      done += range_bytes(m, m.groups[g], m.groups[g].ranks[static_cast<std::size_t>(r)].numel);
      if (progress) progress(done, total);
    }
  }
}

void reshard_checkpoint(const std::string& in, const Manifest& m, const std::string& out, int world_size, int stage,
                        std::int64_t chunk_elements, const Progress& progress, Overwrite overwrite) {
  ZOE_CHECK_USAGE(world_size >= 1 && world_size <= (1 << 16), "world size ", world_size, " (expected 1 to 65536)");
  ZOE_CHECK_USAGE(stage >= 0 && stage <= 3, "stage ", stage, " (expected 0 to 3)");
  ZOE_CHECK_USAGE(chunk_elements >= 1, "chunk of ", chunk_elements, " elements (expected >= 1)");
  check_reshard_output(in, out, overwrite);  // before recover / make_temp / publish touch anything
  verify_checkpoint(in, m);
  CheckpointReader reader(in, m);
  Manifest n = m;
  n.world_size = world_size;
  n.stage = stage;
  n.chunk_elements = chunk_elements;
  std::random_device rd;
  n.id = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  n.version = version_for(n);  // format 1 becomes 2; frozen groups keep it 3
  lay_out_ranks(n);
  recover(out);
  make_temp(out);
  const std::string tmp = temp_dir_of(out);
  std::uint64_t total = 0, done = 0;
  for (const RankFileEntry& f : n.files) total += f.bytes;
  std::vector<char> chunk;  // [state 0 | state 1 | state 2] of one chunk, as stored
  for (int r = 0; r < world_size; ++r) {
    const RankFileEntry& entry = n.files[static_cast<std::size_t>(r)];
    io::FileWriter w((fs::path(tmp) / entry.name).string(), entry.bytes);
    RankFileHeader h;
    h.version = static_cast<std::uint32_t>(n.version);
    h.rank = r;
    h.world_size = world_size;
    h.id = n.id;
    h.file_bytes = entry.bytes;
    h.crc32c = header_crc(h);
    w.write(&h, sizeof h);
    for (std::size_t g = 0; g < n.groups.size(); ++g) {
      const GroupEntry& group = n.groups[g];
      RankRange& rr = n.groups[g].ranks[static_cast<std::size_t>(r)];
      // A frozen group's values move as stored (compute dtype), bit for bit.
      const std::size_t esz = state_bytes(n, group);
      std::uint32_t crc = 0;
      for (std::int64_t c = 0; c < rr.numel; c += chunk_elements) {
        const std::int64_t len = std::min(chunk_elements, rr.numel - c);
        const auto ulen = static_cast<std::size_t>(len);
        chunk.resize(static_cast<std::size_t>(state_count(group)) * ulen * esz);
        for (int s = 0; s < state_count(group); ++s)
          reader.read_stored(g, s, rr.begin + c, ulen, chunk.data() + static_cast<std::size_t>(s) * ulen * esz,
                             r % m.world_size);
        crc = io::crc32c(chunk.data(), chunk.size(), crc);
        w.write(chunk.data(), chunk.size());
        done += chunk.size();
        if (progress) progress(done, total);
      }
      rr.crc32c = crc;
    }
    w.finish();
  }
  const std::string text = serialize(n);
  io::FileWriter mw((fs::path(tmp) / kManifestName).string(), text.size());
  mw.write(text.data(), text.size());
  mw.finish();
  publish(out);
}

}  // namespace zoe::ckpt
