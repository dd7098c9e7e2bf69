#include "src/optim/split_master.hpp"

#include <bit>

namespace zoe::optim {

namespace {

// S: the moment's storage (uint32 fp32 bits or uint16 bf16 bits); its top bit is the sign.
// Branch-free loops over whole arrays: the compiler vectorises them.
template <class S>
constexpr S kSign = static_cast<S>(S{1} << (8 * sizeof(S) - 1));

template <class S>
void join(const std::uint16_t* high, const std::uint16_t* low, const S* v, float* master, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t r = static_cast<std::uint32_t>(v[i] >> (8 * sizeof(S) - 1));
    master[i] = std::bit_cast<float>(((static_cast<std::uint32_t>(high[i]) - r) << 16) | low[i]);
  }
}

template <class S>
void clear_signs(S* v, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<S>(v[i] & ~kSign<S>);
}

template <class S>
void split(const float* master, const std::uint16_t* high, std::uint16_t* low, S* v, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t w = std::bit_cast<std::uint32_t>(master[i]);
    low[i] = static_cast<std::uint16_t>(w & 0xffffu);
    const S r = high[i] != static_cast<std::uint16_t>(w >> 16) ? kSign<S> : S{0};
    v[i] = static_cast<S>((v[i] & ~kSign<S>) | r);
  }
}

}  // namespace

void join_master(const std::uint16_t* high, const std::uint16_t* low, const void* exp_avg_sq, bool bf16_states,
                 float* master, std::size_t n) {
  if (bf16_states) {
    join(high, low, static_cast<const std::uint16_t*>(exp_avg_sq), master, n);
  } else {
    join(high, low, static_cast<const std::uint32_t*>(exp_avg_sq), master, n);
  }
}

void join_master_for_update(const std::uint16_t* high, const std::uint16_t* low, void* exp_avg_sq, bool bf16_states,
                            float* master, std::size_t n) {
  join_master(high, low, exp_avg_sq, bf16_states, master, n);
  if (bf16_states) {
    clear_signs(static_cast<std::uint16_t*>(exp_avg_sq), n);
  } else {
    clear_signs(static_cast<std::uint32_t*>(exp_avg_sq), n);
  }
}

void split_master(const float* master, const std::uint16_t* high, std::uint16_t* low, void* exp_avg_sq,
                  bool bf16_states, std::size_t n) {
  if (bf16_states) {
    split(master, high, low, static_cast<std::uint16_t*>(exp_avg_sq), n);
  } else {
    split(master, high, low, static_cast<std::uint32_t*>(exp_avg_sq), n);
  }
}

}  // namespace zoe::optim
