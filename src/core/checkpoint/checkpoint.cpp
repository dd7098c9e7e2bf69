// Engine checkpoints (format 2, src/core/checkpoint/checkpoint_manifest.hpp): each rank streams its
// optimizer range of every group (fp32 master weights, exp_avg, exp_avg_sq), one sub-group at
// a time, into <dir>/rank<R>.zoe; rank 0 writes manifest.json (the model, every rank's ranges,
// the counters, the loss scaler, the caller's client state, the checksums) once every rank's
// file is complete, and publishes the directory (checkpoint_dir.hpp: fsynced, the previous
// checkpoint readable until the new one is). Compute parameters of trainable groups are not
// stored: they are the master weights cast to the compute dtype, recomputed on load. A frozen
// group (no master weights) is stored as its compute-dtype values, rank r its shard r at every
// stage (manifest version 3), and loaded back bit for bit.
//
// A load reads the manifest, checks it against the engine's model, verifies the CRC32C of
// every part of every rank file it will read, and only when every rank agrees writes the
// values, chunk by chunk (write_values: the sub-groups, read from whichever saved ranks hold
// their elements), so any world size and stage loads any other, in the memory of one
// sub-group. Stages 0-2 read the master weights of the whole buffer (every rank keeps the full
// compute-dtype copy) instead of all-gathering them.
//
// Every decision that differs between ranks (a failed write, a bad file) goes through
// share_outcomes(): each rank learns every rank's outcome and message, so all of them throw at once,
// each naming the failed ranks and their errors, and none waits for a collective the failed
// one never joins.
#include <exception>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "io/file_writer.hpp"
#include "io/crc32c.hpp"
#include "src/common/check.hpp"
#include "src/common/log.hpp"
#include "src/common/quote.hpp"
#include "src/core/checkpoint/checkpoint_dir.hpp"
#include "src/core/checkpoint/checkpoint_manifest.hpp"
#include "src/core/checkpoint/checkpoint_param_map.hpp"
#include "src/core/checkpoint/checkpoint_reader.hpp"
#include "src/core/checkpoint/engine_checkpoint.hpp"
#include "src/core/state_access.hpp"
#include "src/core/names.hpp"

namespace zoe {
namespace fs = std::filesystem;

namespace {

// An outcome as exchanged: "ok <data>" or "error <message>".
std::string ok(const std::string& data) { return "ok " + data; }
std::string failure(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return std::string("error ") + x.what();
  } catch (...) {
    return "error (a non-standard exception)";
  }
}
bool is_error(const std::string& s) { return s.rfind("error ", 0) == 0; }
std::string payload(const std::string& s) { return s.substr(s.find(' ') + 1); }

// Rank 0 alone runs `decide` (its result: the data every rank needs); every rank learns the
// outcome. When rank 0 failed, every rank throws together (an agreed failure: the engine stays
// usable), rank 0 its own exception, the others Error "<failed><rank 0's message><after>".
// Returns rank 0's data on every rank.
template <class F>
std::string rank0_decides(core::StateAccess& S, F&& decide, const std::string& failed, const std::string& after = "") {
  std::exception_ptr error;
  std::string mine;
  if (S.rank() == 0) {
    try {
      mine = ok(decide());
    } catch (...) {
      error = std::current_exception();
      mine = failure(error);
    }
  }
  const std::vector<std::string> all = S.share(mine);
  if (is_error(all[0])) {
    S.fail_together();  // every rank throws here
    if (error) std::rethrow_exception(error);
    ZOE_THROW(Error, failed, payload(all[0]), after);
  }
  return payload(all[0]);
}

// "1, 3" and "rank 1: <message>; rank 3: <message>" of the ranks whose outcome is an error.
std::pair<std::string, std::string> failed_ranks(const std::vector<std::string>& all) {
  std::string ranks, messages;
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (!is_error(all[r])) continue;
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    messages += (messages.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": " + payload(all[r]));
  }
  return {ranks, messages};
}

// The engine's model as manifest groups (names, shapes, offsets; no ranges).
std::vector<ckpt::GroupEntry> model_of(const core::StateAccess& S) {
  std::vector<ckpt::GroupEntry> out;
  for (const core::Group& g : S.model().groups) {
    ckpt::GroupEntry e;
    e.name = g.name;
    e.frozen = g.frozen;
    for (std::size_t i = 0; i < g.params.size(); ++i) {
      const core::ParamInfo& p = S.model().params[g.params[i]];
      e.params.push_back({p.name, p.shape, g.layout->offset(i), p.numel});
    }
    out.push_back(std::move(e));
  }
  return out;
}

// The model as format 1 saved it: the modules' own groups (Model::own_groups), laid out
// as FlatLayout lays out any group (offsets do not depend on the world size).
std::vector<ckpt::GroupEntry> own_groups_of(const core::StateAccess& S) {
  std::vector<ckpt::GroupEntry> out;
  for (const core::Model::OwnGroup& o : S.model().own_groups()) {
    std::vector<std::int64_t> numels;
    for (std::uint32_t pi : o.params) numels.push_back(S.model().params[pi].numel);
    const core::FlatLayout layout(numels, 1);
    ckpt::GroupEntry e;
    e.name = o.name;
    e.frozen = o.frozen;
    for (std::size_t i = 0; i < o.params.size(); ++i) {
      const core::ParamInfo& p = S.model().params[o.params[i]];
      e.params.push_back({p.name, p.shape, layout.offset(i), p.numel});
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::string rank_file_name(int rank) { return "rank" + std::to_string(rank) + ".zoe"; }

// Streams this rank's optimizer range of every group into `path`, one sub-group at a time
// (one chunk of the file), and returns each group's CRC32C.
std::vector<std::uint32_t> write_rank_file(core::StateAccess& S, const ckpt::Manifest& m, const std::string& path) {
  const ckpt::RankFileEntry& entry = m.files[static_cast<std::size_t>(S.rank())];
  io::FileWriter out(path, entry.bytes);  // reserves the bytes: a full disk fails here
  ckpt::RankFileHeader h;
  h.version = static_cast<std::uint32_t>(m.version);
  h.rank = S.rank();
  h.world_size = S.world();
  h.id = m.id;
  h.file_bytes = entry.bytes;
  h.crc32c = ckpt::header_crc(h);
  out.write(&h, sizeof h);
  std::vector<std::uint32_t> crcs;
  for (std::size_t gi = 0; gi < S.model().groups.size(); ++gi) {
    const core::Group& g = S.model().groups[gi];
    const ckpt::RankRange& rr = m.groups[gi].ranks[static_cast<std::size_t>(S.rank())];
    // What this rank stores: its optimizer range; a frozen group, its shard.
    const std::int64_t begin = g.frozen ? g.layout->shard_begin(S.rank()) : g.opt_begin;
    const std::int64_t numel = g.frozen ? g.layout->shard_numel() : g.opt_numel;
    ZOE_CHECK(rr.begin == begin && rr.numel == numel && rr.file_offset == out.written(), "group ", detail::quoted(g.name),
              ": range [", begin, ", +", numel, ") at byte ", out.written(), ", the manifest's [", rr.begin,
              ", +", rr.numel, ") at ", rr.file_offset);
    // A frozen group's compute-dtype shard, a trainable one's sub-groups' three states.
    std::uint32_t crc = 0;
    S.read_stored_part(gi, [&](const void* bytes, std::size_t size) {
      crc = io::crc32c(bytes, size, crc);
      out.write(bytes, size);
    });
    crcs.push_back(crc);
  }
  out.finish();  // fsync
  return crcs;
}

std::string hex_id(std::uint64_t id) {
  std::ostringstream s;
  s << std::hex << id;
  return s.str();
}

void write_manifest(const ckpt::Manifest& m, const std::string& dir) {
  const std::string text = ckpt::serialize(m);
  io::FileWriter out((fs::path(dir) / ckpt::kManifestName).string(), text.size());
  out.write(text.data(), text.size());
  out.finish();
}

// Throws on every rank when some outcome is an error: the rank's own exception where it has
// one, else `Type` naming the failed ranks and their messages.
// Every rank throws together here, so the failure is agreed: the engine's guard does not abort
// the communicator for it (Engine's guarded calls, StateAccess::fail_together) and the engine stays usable.
template <typename Type>
void throw_if_failed(core::StateAccess& S, const std::vector<std::string>& all, std::exception_ptr own,
                     const std::string& what, const std::string& after) {
  const auto [ranks, messages] = failed_ranks(all);
  if (ranks.empty()) return;
  S.fail_together();
  if (own) std::rethrow_exception(own);
  ZOE_THROW(Type, what, " on rank(s) ", ranks, " (", messages, ")", after);
}
}  // namespace

void core::save_engine_checkpoint(StateAccess& S, const std::string& dir, const std::string& client_state) {
  core::check_utf8("save_checkpoint: client_state", client_state);
  S.settle("save_checkpoint");
  const core::StateAccess::Counters counters = S.counters();
  const std::string tmp = ckpt::temp_dir_of(dir);
  const std::string not_saved = "checkpoint " + detail::quoted_path(dir) + " was not saved: ";

  // 1. Rank 0 finishes an interrupted publish, makes <dir>.tmp and draws the save's id.
  ckpt::Manifest m;
  m.world_size = S.world();
  m.stage = S.config().zero_optimization.stage;
  m.compute_dtype = std::string(dtype_name(S.compute_dtype()));
  m.chunk_elements = S.chunk_elements();
  m.step = counters.optimizer_steps;
  m.step_calls = counters.step_calls;
  m.skipped_steps = counters.skipped_calls;
  m.lr = counters.lr;
  m.loss_scale = counters.scaler.scale;
  m.good_steps = counters.scaler.good_steps;
  m.hysteresis_left = counters.scaler.hysteresis_left;
  m.client_state = client_state;
  m.groups = model_of(S);
  m.version = ckpt::version_for(m);  // 3 with frozen groups, else 2 (what older zoe reads)
  ckpt::lay_out_ranks(m);
  const std::string id = rank0_decides(
      S,
      [&] {
        ckpt::recover(dir);
        ckpt::make_temp(dir);
        std::random_device rd;
        return hex_id((static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^ static_cast<std::uint64_t>(counters.optimizer_steps));
      },
      not_saved + "rank 0 could not prepare " + detail::quoted_path(tmp) + ": ");
  m.id = std::stoull(id, nullptr, 16);
  std::exception_ptr error;
  std::string mine;
  std::vector<std::string> all;

  // 2. Every rank streams its file into <dir>.tmp.
  std::vector<std::uint32_t> crcs;
  try {
    crcs = write_rank_file(S, m, (fs::path(tmp) / rank_file_name(S.rank())).string());
    std::string list;
    for (std::uint32_t c : crcs) list += ckpt::crc_hex(c);
    mine = ok(list);
  } catch (...) {
    error = std::current_exception();
    mine = failure(error);
  }
  all = S.share(mine);
  if (!failed_ranks(all).first.empty()) {
    if (S.rank() == 0) {
      std::error_code ec;
      fs::remove_all(tmp, ec);  // every rank is past its writes
      if (ec) ZOE_LOG_WARN("cannot remove the partial checkpoint '{}': {}", tmp, ec.message());
    }
    S.barrier();
    throw_if_failed<Error>(S, all, error, not_saved + "writing failed",
                           "; the partial " + detail::quoted_path(tmp) + " was removed and " + detail::quoted_path(dir) + " is unchanged");
  }

  // 3. Rank 0 writes the manifest (with every rank's checksums) and publishes the directory.
  rank0_decides(
      S,
      [&] {
        for (std::size_t r = 0; r < all.size(); ++r) {
          const std::string list = payload(all[r]);
          ZOE_CHECK(list.size() == 8 * m.groups.size(), "rank ", r, " sent ", list.size() / 8, " checksums");
          for (std::size_t gi = 0; gi < m.groups.size(); ++gi)
            m.groups[gi].ranks[r].crc32c = static_cast<std::uint32_t>(std::stoul(list.substr(8 * gi, 8), nullptr, 16));
        }
        write_manifest(m, tmp);
        ckpt::publish(dir);
        return std::string();
      },
      not_saved + "rank 0 could not write its manifest or publish it: ");
  ZOE_LOG_DEBUG("rank {}: checkpoint of step {} saved to {}", S.rank(), counters.optimizer_steps, dir);
}

namespace {
// This rank's part of group g's flat buffer that write_values fills: [begin, end).
std::pair<std::int64_t, std::int64_t> kept_part(const core::StateAccess& S, const core::Group& g) {
  if (S.policy().shards_params) return {g.layout->shard_begin(S.rank()), g.layout->shard_begin(S.rank()) + g.layout->shard_numel()};
  return {0, g.layout->padded_numel()};
}

// Refuses a checkpoint whose frozen set differs from the engine's (`saved_frozen`: the saved
// parameters and whether each is frozen), naming the first parameter that differs. Why not
// convert: a trainable parameter's record is its master weights and moments, a frozen one's
// its compute-dtype values, in groups of different layouts; as torch's
// Optimizer.load_state_dict (and so DeepSpeed's optimizer-state load) refuses param groups of
// other sizes, a load needs the frozen set it was saved with. Fine-tuning a trained model with
// some parameters frozen starts from its weights instead (zoe-ckpt export, SafetensorsFile).
void check_frozen_set(const core::StateAccess& S, const std::map<std::string, bool>& saved_frozen,
                      const std::string& what) {
  for (const core::ParamInfo& p : S.model().params) {
    const auto it = saved_frozen.find(p.name);
    if (it == saved_frozen.end() || it->second == p.options.frozen) continue;
    ZOE_THROW(UsageError, what, ": parameter ", detail::quoted(p.name), " is ", it->second ? "frozen" : "trainable",
              " there and ", p.options.frozen ? "frozen" : "trainable",
              " here (ParamOptions::frozen): a checkpoint loads only into an engine with the frozen parameters it was "
              "saved with (a trainable parameter's record is its master weights and moments, a frozen one's its "
              "values); to fine-tune from it with other parameters frozen, export its weights (zoe-ckpt export) and "
              "start from the file (SafetensorsFile's initializers)");
  }
}

// The manifest of the checkpoint in `from` (format 2, or format 1 as a manifest), checked
// against the engine's model.
ckpt::Manifest read_manifest(const core::StateAccess& S, const std::string& from) {
  if (ckpt::is_legacy(from)) {
    std::map<std::string, bool> saved;  // format 1 stores every parameter trainable
    for (const core::ParamInfo& p : S.model().params) saved[p.name] = false;
    check_frozen_set(S, saved, "checkpoint " + detail::quoted_path(from) + " (format 1)");
    return ckpt::read_legacy(from, own_groups_of(S));  // format 1: a group per module
  }
  const std::string path = (fs::path(from) / ckpt::kManifestName).string();
  ckpt::Manifest m = ckpt::parse_manifest(ckpt::read_manifest_text(path), path);
  std::map<std::string, bool> saved;
  for (const ckpt::GroupEntry& g : m.groups)
    for (const ckpt::ParamEntry& p : g.params) saved[p.name] = g.frozen;
  check_frozen_set(S, saved, "checkpoint " + detail::quoted_path(path));
  return m;
}

// Opens and verifies every part of every rank file this rank will read.
void verify_needed(core::StateAccess& S, ckpt::CheckpointReader& reader, const ckpt::ParamMap& map) {
  std::set<std::pair<std::size_t, int>> parts;
  for (std::size_t gi = 0; gi < S.model().groups.size(); ++gi) {
    const auto [begin, end] = kept_part(S, S.model().groups[gi]);
    parts.merge(map.sources(reader, gi, begin, end, S.rank()));
  }
  for (const auto& [saved_group, r] : parts) {
    reader.check_file(r);
    reader.verify(r, saved_group);
  }
}
}  // namespace

std::string core::load_engine_checkpoint(StateAccess& S, const std::string& dir) {
  S.settle("load_checkpoint");

  // 1. Rank 0 chooses the directory (<dir>, or <dir>.old after a crash in a publish), so
  //    every rank reads the same checkpoint.
  const std::string from = rank0_decides(
      S, [&] { return ckpt::choose_for_load(dir); }, "checkpoint " + detail::quoted_path(dir) + " could not be loaded: rank 0: ",
      "; nothing was changed");
  std::exception_ptr error;
  std::string mine;
  std::vector<std::string> all;
  if (from != dir) ZOE_LOG_WARN("checkpoint '{}' is incomplete (a save was interrupted): loading '{}'", dir, from);

  // 2. Every rank reads the manifest, checks it and verifies what it will read.
  std::unique_ptr<ckpt::CheckpointReader> reader;
  std::unique_ptr<ckpt::ParamMap> map;  // where this engine's groups' elements were saved
  try {
    reader = std::make_unique<ckpt::CheckpointReader>(from, read_manifest(S, from));
    const std::string source = ckpt::is_legacy(from) ? detail::quoted_path(from) + " (format 1)"
                                                     : detail::quoted_path((fs::path(from) / ckpt::kManifestName).string());
    map = std::make_unique<ckpt::ParamMap>(S.model(), reader->manifest(), "checkpoint " + source);
    verify_needed(S, *reader, *map);
    mine = ok(hex_id(reader->manifest().id));
  } catch (...) {
    error = std::current_exception();
    mine = failure(error);
  }
  all = S.share(mine);
  throw_if_failed<CorruptionError>(S, all, error, "checkpoint " + detail::quoted_path(from) + " could not be loaded",
                                   "; nothing was changed");
  for (std::size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0]) {
      S.fail_together();  // every rank compares the same ids
      ZOE_THROW(CorruptionError, "checkpoint ", detail::quoted_path(from), ": rank ", r, " read a manifest of id ", payload(all[r]),
                ", rank 0 one of id ", payload(all[0]), " (the directory changed while loading); nothing was changed");
    }

  // 3. The values, chunk by chunk. A failure now (a disk error after verification) leaves
  //    the engine half-loaded: it is marked unusable.
  const ckpt::Manifest& m = reader->manifest();
  if (m.compute_dtype != dtype_name(S.compute_dtype()))
    for (const ckpt::GroupEntry& g : m.groups)
      if (g.frozen) {
        ZOE_LOG_INFO("rank {}: checkpoint '{}': the frozen parameters' {} values are rounded to this engine's {}",
                     S.rank(), from, m.compute_dtype, dtype_name(S.compute_dtype()));
        break;
      }
  try {
    S.write_values(
        [&](const core::Group& g, std::int64_t begin, std::span<float> master, std::span<float> moments) {
          const auto gi = static_cast<std::size_t>(&g - S.model().groups.data());
          map->read(*reader, gi, 0, begin, master, S.rank());
          if (moments.empty()) return;
          map->read(*reader, gi, 1, begin, moments.first(master.size()), S.rank());
          map->read(*reader, gi, 2, begin, moments.subspan(master.size()), S.rank());
        },
        true);
  } catch (const std::exception& e) {
    S.mark_broken(detail::concat("loading checkpoint ", detail::quoted_path(from),
                                           " failed after it was verified: ", e.what()));
    throw;
  }
  S.finish_load({m.step, m.step_calls, m.skipped_steps, m.lr, {m.loss_scale, m.good_steps, m.hysteresis_left}});
  S.barrier();
  if (m.world_size != S.world() || m.stage != S.config().zero_optimization.stage)
    ZOE_LOG_INFO("rank {}: checkpoint '{}' of world size {}, stage {} loaded at world size {}, stage {}", S.rank(), from,
                 m.world_size, m.stage, S.world(), S.config().zero_optimization.stage);
  return m.client_state;
}

}  // namespace zoe
