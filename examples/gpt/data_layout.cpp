#include "examples/gpt/data_layout.hpp"

#include "examples/gpt/error.hpp"

namespace gpt {

int micro_batches_at(const DataLayout& layout, int world) {
  const int total = layout.total();
  if (world >= 1 && total % world == 0) return total / world;
  std::string works;
  for (int w = 1; w <= total; ++w)
    if (total % w == 0) works += (works.empty() ? "" : ", ") + std::to_string(w);
  GPT_THROW("--resume at world size ", world, ": the checkpointed run trains ", layout.ranks, " ranks x ",
            layout.micro_batches, " micro-batches = ", total, " micro-batches per step, which ", world,
            " ranks cannot split evenly (the global batch and the data order are kept on resume); world sizes "
            "that work: ",
            works);
}

DataSlot data_slot(const DataLayout& layout, int rank, int micro_batches, int k) {
  const int global = rank * micro_batches + k;
  return {global / layout.micro_batches, global % layout.micro_batches};
}

std::string relayout_message(const DataLayout& layout, int world, int micro_batch, int context) {
  const int per_rank = micro_batches_at(layout, world);
  const long long sequences = static_cast<long long>(layout.total()) * micro_batch;
  return detail::concat("resuming a run of world size ", layout.ranks, " x ", layout.micro_batches,
                        " micro-batches at world size ", world, " x ", per_rank, " micro-batches (gradient accumulation ",
                        per_rank, "): the same ", sequences, " sequences (", sequences * context,
                        " tokens) per step, in the same order");
}

}  // namespace gpt
