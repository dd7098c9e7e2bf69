// Which sequences a step trains on, and how a resumed run at another number of ranks keeps them.
//
// A run's data layout is the ranks x micro-batches of its first run: step s's micro-batch k of
// data rank r is the k-th batch drawn from the stream (seed, r, s) (trainer.cpp), so a step's
// global batch is a pure function of the seed, the layout and s. A run resumed at `world` ranks
// keeps the layout: its ranks split the same layout.ranks x layout.micro_batches micro-batches
// in order (rank i takes the i-th run of micro_batches_at(layout, world) of them), which keeps the
// tokens per step and the data order; only the order of the gradient and loss sums changes.
// Thread-safety: free functions of values.
#pragma once

#include <string>

namespace gpt {

/// The ranks and micro-batches per rank whose data streams define a step's batches.
struct DataLayout {
  int ranks = 1;
  int micro_batches = 1;
  int total() const { return ranks * micro_batches; }
};

/// Micro-batches per step each of `world` ranks runs to keep `layout`'s global batch:
/// layout.total() / world. Throws zoe::Error unless `world` divides layout.total(), naming the
/// world sizes that do.
int micro_batches_at(const DataLayout& layout, int world);

/// Where micro-batch `k` of `rank` (running `micro_batches` per step) comes from: the data rank
/// of `layout` whose stream holds it and its index in that rank's step.
struct DataSlot {
  int rank = 0;
  int micro_batch = 0;
};
DataSlot data_slot(const DataLayout& layout, int rank, int micro_batches, int k);

/// The one line a resume at another world size prints: what changed and what did not.
std::string relayout_message(const DataLayout& layout, int world, int micro_batch, int context);

}  // namespace gpt
