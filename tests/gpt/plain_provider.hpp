// A ParamProvider over plain memory (no engine), for model tests: holds every parameter's value
// and accumulates each module's gradients into a per-parameter total, as zoe does for tied
// weights.
#pragma once

#include <string>
#include <vector>

#include "examples/gpt/model.hpp"

namespace gpt::test {

template <class T>
class PlainProvider : public ParamProvider<T> {
 public:
  PlainProvider(const ModelSpec& spec, std::uint64_t seed) : spec_(spec) {
    for (const auto& p : spec.params) {
      const auto init = initial_value(p, seed);
      values.emplace_back(init.begin(), init.end());
      grads.emplace_back(init.size(), T(0));
    }
  }
  ModuleView<T> begin_forward(int m) override {
    calls.push_back("F" + std::to_string(m));
    ModuleView<T> v;
    for (int p : spec_.modules[m].params) v.params.push_back(values[p].data());
    return v;
  }
  void end_forward(int m) override {}
  ModuleView<T> begin_backward(int m) override {
    calls.push_back("B" + std::to_string(m));
    ModuleView<T> v = begin_forward(m);
    calls.pop_back();
    scratch_.clear();
    for (int p : spec_.modules[m].params) scratch_.emplace_back(values[p].size(), T(0));
    for (auto& s : scratch_) v.grads.push_back(s.data());
    return v;
  }
  void end_backward(int m) override {
    const auto& ps = spec_.modules[m].params;
    for (std::size_t i = 0; i < ps.size(); ++i)
      for (std::size_t j = 0; j < scratch_[i].size(); ++j) grads[ps[i]][j] += scratch_[i][j];
  }
  void zero_grads() {
    for (auto& g : grads) std::fill(g.begin(), g.end(), T(0));
  }

  std::vector<std::vector<T>> values, grads;
  std::vector<std::string> calls;

 private:
  const ModelSpec& spec_;
  std::vector<std::vector<T>> scratch_;
};

}  // namespace gpt::test
