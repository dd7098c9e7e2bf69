// ForwardingCommunicator: a test Communicator that forwards every collective to another (the
// ranks' own), counting bytes and calls as a backend does. With Tags::kept it passes each
// collective's tag on; with Tags::dropped the inner backend sees none, as NCCL pairs
// collectives by position only. It keeps Communicator's default grouped collectives (one
// collective per part, gathers_parts_in_place false), so the engine packs its coalesced
// all-gathers and gradient buckets, as it does for NCCL and Gloo.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "src/comm/communicator.hpp"

namespace zoe::test {

class ForwardingCommunicator final : public Communicator {
 public:
  enum class Tags { kept, dropped };
  ForwardingCommunicator(std::shared_ptr<Communicator> inner, Tags tags) : inner_(std::move(inner)), tags_(tags) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  Device& device() override { return inner_->device(); }
  void all_gather(const void* s, void* r, std::size_t n, DType t, Stream& st) override {
    count_all_gather(n * dtype_size(t) * static_cast<std::size_t>(world_size()));
    pass_tag();
    inner_->all_gather(s, r, n, t, st);
  }
  void reduce_scatter(const void* s, void* r, std::size_t n, DType t, ReduceOp op, Stream& st) override {
    count_reduce_scatter(n * dtype_size(t) * static_cast<std::size_t>(world_size()));
    pass_tag();
    inner_->reduce_scatter(s, r, n, t, op, st);
  }
  void all_reduce(const void* s, void* r, std::size_t n, DType t, ReduceOp op, Stream& st) override {
    count_all_reduce(n * dtype_size(t));
    pass_tag();
    inner_->all_reduce(s, r, n, t, op, st);
  }
  void all_reduce_f64(double* d, std::size_t n, Stream& st) override {
    count_all_reduce(n * sizeof(double));
    pass_tag();
    inner_->all_reduce_f64(d, n, st);
  }
  void broadcast(void* b, std::size_t n, DType t, int root, Stream& st) override {
    count_broadcast(n * dtype_size(t));
    pass_tag();
    inner_->broadcast(b, n, t, root, st);
  }
  void barrier(Stream& st) override {
    pass_tag();
    inner_->barrier(st);
  }
  void abort(const std::string& cause) noexcept override { inner_->abort(cause); }

 private:
  void pass_tag() {
    CollectiveTag tag = take_tag();
    if (tags_ == Tags::kept) inner_->tag_next(std::move(tag));
  }
  std::shared_ptr<Communicator> inner_;
  Tags tags_;
};

}  // namespace zoe::test
