#include "ringtrain/comm/agreed.h"

#include <cstring>
#include <exception>
#include <vector>

namespace ringtrain::comm {

void all_or_none(Communicator& world, const std::string& what, const std::function<void()>& f) {
  std::string error;
  try {
    f();
  } catch (const std::exception& e) {
    error = e.what();
  }
  // One rank agrees with itself: no exchange (the train step calls this on every step).
  if (world.size() == 1) {
    if (!error.empty()) throw AgreedError(error);
    return;
  }
  const auto share = [&](int64_t* values, int64_t n, ReduceOp op, int root) {
    Tensor buf = Tensor::empty({n}, DType::I64, world.device());
    const TensorView host = contiguous_view(values, DType::I64, Device::cpu(), {n});
    copy(buf, host);
    if (root < 0) world.all_reduce(buf.data(), static_cast<size_t>(n), DType::I64, op);
    else world.broadcast(buf.data(), static_cast<size_t>(n), DType::I64, root);
    copy(host, buf);
  };
  // The lowest failing rank speaks for all: size - rank, so that Max picks it.
  int64_t failed = error.empty() ? 0 : world.size() - world.rank();
  share(&failed, 1, ReduceOp::Max, -1);
  if (!failed) return;
  const int root = static_cast<int>(world.size() - failed);
  int64_t length = static_cast<int64_t>(error.size());
  share(&length, 1, ReduceOp::Max, root);
  std::vector<int64_t> text(static_cast<size_t>((length + 7) / 8) + 1, 0);
  std::memcpy(text.data(), error.data(), world.rank() == root ? error.size() : 0);
  share(text.data(), static_cast<int64_t>(text.size()), ReduceOp::Max, root);
  if (world.rank() == root) throw AgreedError(error);
  throw AgreedError(cat(what, " failed on rank ", root, ": ",
                        std::string(reinterpret_cast<const char*>(text.data()), static_cast<size_t>(length))));
}

}  // namespace ringtrain::comm
