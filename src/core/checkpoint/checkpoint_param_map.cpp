#include "src/core/checkpoint/checkpoint_param_map.hpp"

#include <algorithm>
#include <unordered_map>

#include "src/common/check.hpp"
#include "src/common/quote.hpp"

namespace zoe::ckpt {

namespace {
std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string t = "[";
  for (std::size_t d = 0; d < s.size(); ++d) t += (d ? ", " : "") + std::to_string(s[d]);
  return t + "]";
}
}  // namespace

ParamMap::ParamMap(const core::Model& model, const Manifest& saved, const std::string& what) {
  struct Where {
    std::size_t group, index;
  };
  std::unordered_map<std::string, Where> where;
  std::size_t saved_params = 0;
  for (std::size_t sg = 0; sg < saved.groups.size(); ++sg)
    for (std::size_t i = 0; i < saved.groups[sg].params.size(); ++i, ++saved_params)
      where.emplace(saved.groups[sg].params[i].name, Where{sg, i});
  const std::string other = what + " is of another model: ";
  if (saved_params != model.params.size())
    ZOE_THROW(UsageError, other, "it has ", saved_params, " parameters, this engine ", model.params.size());
  groups_.resize(model.groups.size());
  for (std::size_t gi = 0; gi < model.groups.size(); ++gi) {
    const core::Group& g = model.groups[gi];
    GroupMap& map = groups_[gi];
    bool same = true;
    for (std::size_t i = 0; i < g.params.size(); ++i) {
      const core::ParamInfo& p = model.params[g.params[i]];
      const auto it = where.find(p.name);
      if (it == where.end()) ZOE_THROW(UsageError, other, "it has no parameter ", detail::quoted(p.name));
      const ParamEntry& e = saved.groups[it->second.group].params[it->second.index];
      if (e.shape != p.shape)
        ZOE_THROW(UsageError, other, "parameter ", detail::quoted(p.name), " is ", shape_text(e.shape), " there, ", shape_text(p.shape),
                  " here");
      const std::int64_t begin = g.layout->offset(i);
      map.pieces.push_back(Piece{begin, p.numel, it->second.group, e.offset});
      same = same && it->second.group == map.pieces.front().saved_group && it->second.index == i && e.offset == begin;
    }
    if (same && !g.params.empty() && saved.groups[map.pieces.front().saved_group].params.size() == g.params.size())
      map.same_as = static_cast<long>(map.pieces.front().saved_group);
  }
}

void ParamMap::read(CheckpointReader& reader, std::size_t gi, int state, std::int64_t begin, std::span<float> out,
                    int prefer) const {
  const GroupMap& map = groups_[gi];
  if (map.same_as >= 0) {
    reader.read(static_cast<std::size_t>(map.same_as), state, begin, out, prefer);
    return;
  }
  std::fill(out.begin(), out.end(), 0.0f);
  const std::int64_t end = begin + static_cast<std::int64_t>(out.size());
  for (const Piece& p : map.pieces) {
    const std::int64_t lo = std::max(begin, p.begin), hi = std::min(end, p.begin + p.numel);
    if (lo >= hi) continue;
    reader.read(p.saved_group, state, p.saved_begin + (lo - p.begin),
                out.subspan(static_cast<std::size_t>(lo - begin), static_cast<std::size_t>(hi - lo)), prefer);
  }
}

std::set<std::pair<std::size_t, int>> ParamMap::sources(const CheckpointReader& reader, std::size_t gi, std::int64_t begin,
                                                        std::int64_t end, int prefer) const {
  std::set<std::pair<std::size_t, int>> out;
  const GroupMap& map = groups_[gi];
  if (map.same_as >= 0) {
    const auto sg = static_cast<std::size_t>(map.same_as);
    for (int r : reader.sources(sg, begin, end, prefer)) out.insert({sg, r});
    return out;
  }
  for (const Piece& p : map.pieces) {
    const std::int64_t lo = std::max(begin, p.begin), hi = std::min(end, p.begin + p.numel);
    if (lo >= hi) continue;
    const std::int64_t from = p.saved_begin + (lo - p.begin);
    for (int r : reader.sources(p.saved_group, from, from + (hi - lo), prefer)) out.insert({p.saved_group, r});
  }
  return out;
}

}  // namespace zoe::ckpt
