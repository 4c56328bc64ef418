#include "ringtrain/comm/agreed.h"

#include <cstring>
#include <exception>
#include <vector>

namespace ringtrain::comm {

namespace {

// The maximum over `group` of one integer.
int64_t max_over(Communicator& group, int64_t value) {
  Tensor buf = Tensor::empty({1}, DType::I64, group.device());
  const TensorView host = contiguous_view(&value, DType::I64, Device::cpu(), {1});
  copy(buf, host);
  group.all_reduce(buf.data(), 1, DType::I64, ReduceOp::Max);
  copy(host, buf);
  return value;
}

}  // namespace

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
  const auto share = [&](int64_t* values, int64_t n, int root) {
    Tensor buf = Tensor::empty({n}, DType::I64, world.device());
    const TensorView host = contiguous_view(values, DType::I64, Device::cpu(), {n});
    copy(buf, host);
    world.broadcast(buf.data(), static_cast<size_t>(n), DType::I64, root);
    copy(host, buf);
  };
  // The lowest failing rank speaks for all: size - rank, so that Max picks it.
  const int64_t failed = max_over(world, error.empty() ? 0 : world.size() - world.rank());
  if (!failed) return;
  const int root = static_cast<int>(world.size() - failed);
  int64_t length = static_cast<int64_t>(error.size());
  share(&length, 1, root);
  std::vector<int64_t> text(static_cast<size_t>((length + 7) / 8) + 1, 0);
  std::memcpy(text.data(), error.data(), world.rank() == root ? error.size() : 0);
  share(text.data(), static_cast<int64_t>(text.size()), root);
  if (world.rank() == root) throw AgreedError(error);
  throw AgreedError(cat(what, " failed on rank ", root, ": ",
                        std::string(reinterpret_cast<const char*>(text.data()), static_cast<size_t>(length))));
}

bool any_stop_requested(Communicator& group, const StopRequest* stop) {
  if (!stop) return false;
  const bool mine = stop->requested();
  return group.size() == 1 ? mine : max_over(group, mine ? 1 : 0) != 0;
}

void agree_to_stop(Communicator& world, const StopRequest* stop, bool stopped, const std::string& what) {
  if (!stop) return;
  const bool mine = stopped || stop->requested();
  if (world.size() == 1 ? mine : max_over(world, mine ? 1 : 0) != 0)
    throw Interrupted(cat(what, " was interrupted; nothing it would have changed was changed"));
}

}  // namespace ringtrain::comm
