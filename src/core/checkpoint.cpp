// Checkpoints: each rank writes its optimizer range of every group (fp32 master weights,
// exp_avg, exp_avg_sq) plus the step count, learning rate and loss-scaler state to
// <dir>/rank<R>.zoe, CRC32C-checked. Compute parameters are not stored: they are the
// master weights cast to the compute dtype, recomputed on load. A frozen group (no master
// weights) stores the rank's shard of its compute-dtype values instead (the trainer may have
// written them): the record's element count is then shard_numel, its bytes shard_numel x the
// compute dtype's size.
//
// Atomicity: all ranks write into <dir>.tmp (each file's space reserved up front, fsynced);
// once all ranks agree that every file is complete rank 0 swaps it into place (the old
// checkpoint is renamed to <dir>.old first and removed last), so a failure at any point
// leaves the last good checkpoint readable at <dir> or <dir>.old; a failed write removes
// <dir>.tmp.
#include <exception>
#include <filesystem>
#include <fstream>

#include "io/crc32c.hpp"
#include "io/file_writer.hpp"
#include "src/common/check.hpp"
#include "src/common/log.hpp"
#include "src/core/engine_impl.hpp"
#include "src/device/host_elementwise.hpp"

namespace zoe {
namespace fs = std::filesystem;

namespace {
constexpr std::uint64_t kMagic = 0x31504b43454f5aull;  // "ZOECKP1"

struct Header {
  std::uint64_t magic = kMagic;
  std::int32_t world = 0, stage = 0, rank = 0, groups = 0;
  std::int64_t step = 0;
  double lr = 0, scale = 1;
  std::int32_t good_steps = 0, hysteresis_left = 0;
};

void barrier(core::EngineImpl& I) {
  I.comm.barrier(*I.side);
  I.device.synchronize(*I.side);
}

std::string rank_file(const fs::path& dir, int rank) { return (dir / ("rank" + std::to_string(rank) + ".zoe")).string(); }

}  // namespace

namespace {
// Writes this rank's file (see the top of this file for the format).
void write_rank_file(core::EngineImpl& I, const std::string& path) {
  std::uint64_t total = sizeof(Header);
  for (const core::Group& g : I.groups)
    total += sizeof(std::int64_t) + sizeof(std::uint32_t) +
             (g.frozen ? static_cast<std::uint64_t>(g.layout->shard_numel()) * dtype_size(I.dtype)
                       : 3 * static_cast<std::uint64_t>(g.opt_numel) * sizeof(float));
  io::FileWriter out(path, total);  // reserves `total` bytes: a full disk fails here
  auto st = I.scaler.state();
  Header h;
  h.world = I.world;
  h.stage = I.stage;
  h.rank = I.rank;
  h.groups = static_cast<std::int32_t>(I.groups.size());
  h.step = I.step_count;
  h.lr = I.lr;
  h.scale = st.scale;
  h.good_steps = st.good_steps;
  h.hysteresis_left = st.hysteresis_left;
  out.write(&h, sizeof(h));
  for (core::Group& g : I.groups) {
    if (g.frozen) {
      std::vector<std::byte> shard = I.read_frozen_shard(g);
      std::int64_t n = g.layout->shard_numel();
      std::uint32_t crc = io::crc32c(shard.data(), shard.size());
      out.write(&n, sizeof(n));
      out.write(&crc, sizeof(crc));
      out.write(shard.data(), shard.size());
      continue;
    }
    std::vector<float> all = I.read_states(g);
    std::int64_t n = g.opt_numel;
    std::uint32_t crc = io::crc32c(all.data(), all.size() * sizeof(float));
    out.write(&n, sizeof(n));
    out.write(&crc, sizeof(crc));
    out.write(all.data(), all.size() * sizeof(float));
  }
  out.finish();
}

// The ranks whose `failed` is true, as "0, 2" (empty if none), agreed by one small all-reduce
// on the side stream: every rank learns every rank's outcome, so none waits for a collective
// a failed rank never joins.
std::string failed_ranks(core::EngineImpl& I, bool failed) {
  std::vector<double> flags(static_cast<std::size_t>(I.world), 0.0);
  flags[static_cast<std::size_t>(I.rank)] = failed ? 1.0 : 0.0;
  core::DeviceBuffer buf = I.alloc(core::MemKind::buffer, DType::f32, 2 * I.world);
  I.device.copy(buf.data(), flags.data(), flags.size() * sizeof(double), *I.side);
  I.comm.all_reduce_f64(static_cast<double*>(buf.data()), flags.size(), *I.side);
  I.device.copy(flags.data(), buf.data(), flags.size() * sizeof(double), *I.side);
  I.device.synchronize(*I.side);
  std::string bad;
  for (int r = 0; r < I.world; ++r)
    if (flags[static_cast<std::size_t>(r)] != 0.0) bad += (bad.empty() ? "" : ", ") + std::to_string(r);
  return bad;
}
}  // namespace

// A rank that fails to write its file (a full disk: IoError ENOSPC) fails the save on every
// rank after they agree; the partial <dir>.tmp is removed and <dir> is left as it was.
void Engine::save_checkpoint(const std::string& dir) {
  core::EngineImpl& I = *impl_;
  I.finalize();
  synchronize();
  const fs::path final_dir(dir), tmp = dir + ".tmp", old = dir + ".old";
  std::exception_ptr error;
  if (I.rank == 0) {
    try {
      fs::remove_all(tmp);
      fs::create_directories(tmp);
    } catch (...) {
      error = std::current_exception();
    }
  }
  barrier(I);
  const std::string path = rank_file(tmp, I.rank);
  if (!error) {
    try {
      write_rank_file(I, path);
    } catch (...) {
      error = std::current_exception();
    }
  }
  const std::string bad = failed_ranks(I, error != nullptr);
  if (!bad.empty()) {
    if (I.rank == 0) {
      std::error_code ec;
      fs::remove_all(tmp, ec);  // every rank is past its writes
      if (ec) ZOE_LOG_WARN("cannot remove the partial checkpoint '{}': {}", tmp.string(), ec.message());
    }
    barrier(I);
    if (error) std::rethrow_exception(error);
    ZOE_THROW(Error, "checkpoint '", dir, "' was not saved: writing failed on rank(s) ", bad,
              " (see their error); the partial '", tmp.string(), "' was removed and '", dir, "' is unchanged");
  }
  if (I.rank == 0) {
    fs::remove_all(old);
    if (fs::exists(final_dir)) fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    fs::remove_all(old);
  }
  barrier(I);
  ZOE_LOG_DEBUG("rank {}: checkpoint of step {} saved to {}", I.rank, I.step_count, dir);
}

namespace {
struct LoadedCheckpoint {
  Header header;
  std::vector<std::vector<float>> groups;  // [master | exp_avg | exp_avg_sq] per group (frozen: empty)
  std::vector<std::vector<std::byte>> frozen;  // a frozen group's compute-dtype shard (else empty)
};

// Reads and verifies this rank's whole file; changes nothing in the engine.
LoadedCheckpoint read_rank_file(core::EngineImpl& I, const std::string& dir) {
  fs::path from(dir);
  if (!fs::exists(rank_file(from, I.rank)) && fs::exists(rank_file(dir + ".old", I.rank))) from = dir + ".old";
  const std::string path = rank_file(from, I.rank);
  std::ifstream in(path, std::ios::binary);
  if (!in) ZOE_THROW_ERRNO(ENOENT, "cannot open checkpoint file '", path, "'");
  LoadedCheckpoint c;
  Header& h = c.header;
  in.read(reinterpret_cast<char*>(&h), sizeof(h));
  if (!in || h.magic != kMagic) ZOE_THROW(CorruptionError, "'", path, "' is not a zoe checkpoint");
  if (h.world != I.world || h.stage != I.stage || h.groups != static_cast<std::int32_t>(I.groups.size()))
    ZOE_THROW(UsageError, "checkpoint '", path, "' has world size ", h.world, ", stage ", h.stage, ", ", h.groups,
              " module groups; this engine has ", I.world, ", ", I.stage, ", ", I.groups.size());
  for (core::Group& g : I.groups) {
    std::int64_t n = 0;
    std::uint32_t crc = 0;
    in.read(reinterpret_cast<char*>(&n), sizeof(n));
    in.read(reinterpret_cast<char*>(&crc), sizeof(crc));
    const std::int64_t expected = g.frozen ? g.layout->shard_numel() : g.opt_numel;
    if (!in || n != expected)
      ZOE_THROW(UsageError, "checkpoint '", path, "': group '", g.name, "' holds ", n, " elements, expected ",
                expected);
    if (g.frozen) {
      std::vector<std::byte> shard(static_cast<std::size_t>(n) * dtype_size(I.dtype));
      in.read(reinterpret_cast<char*>(shard.data()), static_cast<std::streamsize>(shard.size()));
      if (!in || io::crc32c(shard.data(), shard.size()) != crc)
        ZOE_THROW(CorruptionError, "checkpoint '", path, "': group '", g.name, "' is truncated or corrupt");
      c.groups.emplace_back();
      c.frozen.push_back(std::move(shard));
      continue;
    }
    std::vector<float> all(3 * static_cast<std::size_t>(n));
    in.read(reinterpret_cast<char*>(all.data()), static_cast<std::streamsize>(all.size() * sizeof(float)));
    if (!in || io::crc32c(all.data(), all.size() * sizeof(float)) != crc)
      ZOE_THROW(CorruptionError, "checkpoint '", path, "': group '", g.name, "' is truncated or corrupt");
    c.groups.push_back(std::move(all));
    c.frozen.emplace_back();
  }
  return c;
}
}  // namespace

// Every rank first reads and verifies its own file, then the ranks agree (one small
// all-reduce) before anything is written: a bad file on any rank fails the load on every rank
// at once (no rank waits for a collective the failed one never joins) and changes nothing.
void Engine::load_checkpoint(const std::string& dir) {
  core::EngineImpl& I = *impl_;
  I.finalize();
  synchronize();
  LoadedCheckpoint loaded;
  std::exception_ptr error;
  try {
    loaded = read_rank_file(I, dir);
  } catch (...) {
    error = std::current_exception();
  }
  const std::string bad = failed_ranks(I, error != nullptr);
  if (error) std::rethrow_exception(error);
  if (!bad.empty())
    ZOE_THROW(CorruptionError, "checkpoint '", dir, "' could not be loaded on rank(s) ", bad,
              " (see their error); nothing was changed");

  for (std::size_t gi = 0; gi < I.groups.size(); ++gi) {
    core::Group& g = I.groups[gi];
    if (g.frozen) {
      I.write_frozen_shard(g, loaded.frozen[gi].data());
    } else {
      I.write_states_and_params(g, loaded.groups[gi]);
    }
  }
  const Header& h = loaded.header;
  I.step_count = h.step;
  I.lr = h.lr;
  I.scaler.restore({h.scale, h.good_steps, h.hysteresis_left});
  if (I.policy.shards_params) I.drop_all_gathered();
  barrier(I);
}

}  // namespace zoe
