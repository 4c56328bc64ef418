// A communicator that passes every call on to another one: the base of the tests' communicators that count or fail
// the ring's exchanges (they override `exchange`).
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>

#include "ringtrain/comm/communicator.h"

namespace ringtrain::testing {

class ForwardingComm : public comm::Communicator {
 public:
  explicit ForwardingComm(comm::Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Device device() const override { return inner_.device(); }
  std::chrono::milliseconds timeout() const override { return inner_.timeout(); }
  std::unique_ptr<comm::Request> exchange(std::span<const comm::Transfer> parts, int dst, int src, DType dtype,
                                          void* stream) override {
    return inner_.exchange(parts, dst, src, dtype, stream);
  }
  void all_gather(const void* s, void* r, size_t n, DType t, void* st) override { inner_.all_gather(s, r, n, t, st); }
  void reduce_scatter(const void* s, void* r, size_t n, DType t, comm::ReduceOp op, void* st) override {
    inner_.reduce_scatter(s, r, n, t, op, st);
  }
  void all_reduce(void* b, size_t n, DType t, comm::ReduceOp op, void* st) override {
    inner_.all_reduce(b, n, t, op, st);
  }
  void all_to_all(const void* s, void* r, size_t n, DType t, void* st) override { inner_.all_to_all(s, r, n, t, st); }
  void broadcast(void* b, size_t n, DType t, int root, void* st) override { inner_.broadcast(b, n, t, root, st); }
  void barrier() override { inner_.barrier(); }
  std::unique_ptr<comm::Communicator> split(int color, int key) override { return inner_.split(color, key); }
  void abort(const std::string& why) override { inner_.abort(why); }

 private:
  comm::Communicator& inner_;
};

}  // namespace ringtrain::testing
