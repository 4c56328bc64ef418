// The communicator: every collective that context parallelism and training need, over one group of ranks.
//
// Buffers live on the communicator's device (host memory for the in-process communicator, device memory for
// NCCL). Counts are in elements of `dtype`. Every operation gives up after timeout() with ringtrain::CommError;
// when any rank of the group fails, the others fail fast with a CommError naming that rank and its error.
// Operations are collective: every rank calls them in the same order.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "ringtrain/core/error.h"
#include "ringtrain/core/tensor.h"

namespace ringtrain::comm {

// The most ranks one group may have: far above any run on hand, and low enough that a mistyped size is refused
// before anything is allocated (the in-process group keeps world x world mailboxes).
constexpr int kMaxRanks = 1024;

class CommError : public Error {
 public:
  using Error::Error;
};

// An error that every rank of a group raised together, after an exchange that completed (comm::all_or_none): the
// group is still in step, so its communicator is not aborted and it can go on to the next call.
class AgreedError : public Error {
 public:
  using Error::Error;
};

enum class ReduceOp { Sum, Max };

// One buffer pair of a point-to-point exchange: `count` elements sent from `send`, as many received into `recv`.
struct Transfer {
  const void* send;
  void* recv;
  size_t count;
};

// A pending point-to-point exchange; wait() completes it (or throws CommError on timeout / peer failure).
class Request {
 public:
  virtual ~Request() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Device device() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  // Paired exchange: send `count` elements to `dst` while receiving `count` elements from `src` (the ring step).
  // Returns at once; the buffers must stay untouched until wait(). `stream` orders it on the GPU (NCCL).
  std::unique_ptr<Request> send_recv(const void* send, int dst, void* recv, int src, size_t count, DType dtype,
                                     void* stream = nullptr) {
    const Transfer one{send, recv, count};
    return exchange(std::span<const Transfer>(&one, 1), dst, src, dtype, stream);
  }
  // The same for several buffer pairs at once (one NCCL group, so one posting): part i goes from this rank's
  // parts[i].send to dst's parts[i].recv.
  virtual std::unique_ptr<Request> exchange(std::span<const Transfer> parts, int dst, int src, DType dtype,
                                            void* stream = nullptr) = 0;
  // recv holds size() blocks of `count` elements, block r from rank r.
  virtual void all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream = nullptr) = 0;
  // send holds size() blocks of `count` elements; recv gets the reduction of everyone's block rank().
  virtual void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                              void* stream = nullptr) = 0;
  virtual void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, void* stream = nullptr) = 0;
  // send and recv hold size() blocks of `count` elements; block r of send goes to rank r, block r of recv
  // came from rank r.
  virtual void all_to_all(const void* send, void* recv, size_t count, DType dtype, void* stream = nullptr) = 0;
  virtual void broadcast(void* buf, size_t count, DType dtype, int root, void* stream = nullptr) = 0;
  virtual void barrier() = 0;
  // A sub-group (collective over this group): the ranks that pass the same color (>= 0) form a new communicator,
  // ranked by (key, rank in this group). It has this group's device and timeout and lives independently of it; a
  // rank failing in one group of a family fails the others' waits fast instead of letting them reach the timeout
  // (in-process: one failure domain; NCCL: each communicator's own abort plus the timeout).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // Marks this rank failed so that the others stop waiting for it (called when a rank's work throws).
  virtual void abort(const std::string& why) = 0;
};

}  // namespace ringtrain::comm
