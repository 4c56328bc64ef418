#include "ranks.h"

#include <algorithm>
#include <exception>

#include "ringtrain/comm/gpu_communicator.h"
#include "ringtrain/comm/in_process.h"
#include "ringtrain/comm/rendezvous.h"
#include "ringtrain/core/error.h"

namespace ringtrain::python {
namespace {

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown exception";
  }
}

// Whether e holds an exception of type E (or derived from it).
template <typename E>
bool holds(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

WorkerGroup::WorkerGroup(const worker::Config& config, std::chrono::milliseconds timeout, const StopRequest* stop) {
  const int world = static_cast<int>(config.parallel.world());
  const comm::RankInfo info = comm::rank_info_from_environment();
  if (config.device.is_cuda()) {
    RT_CHECK(info.world == world, "parallel.dp x parallel.cp = ", world, " ranks, but this process is rank ", info.rank,
             " of ", info.world, " (", info.source, "); start ", world,
             " processes with torchrun or `ringtrain launch` (one per GPU)");
    comms_.push_back(comm::make_gpu_communicator(info, timeout));
  } else {
    RT_CHECK(info.world == 1, "device cpu: the ranks are threads of one process, but this process is rank ", info.rank,
             " of ", info.world, " (", info.source, " variables); run a single process");
    comms_ = comm::make_in_process_group(world, timeout);
  }
  workers_.resize(comms_.size());
  worker::StartingWeights shared;  // this process's ranks hold one copy of the reference weights
  run_ranks([&](int r) {
    workers_[static_cast<size_t>(r)] =
        std::make_unique<worker::PolicyWorker>(config, *comms_[static_cast<size_t>(r)], &shared, stop);
  });
}

WorkerGroup::~WorkerGroup() {
  workers_.clear();  // before the communicators they use
  comms_.clear();
}

int WorkerGroup::rank() const { return comms_.front()->rank(); }
int WorkerGroup::world_size() const { return comms_.front()->size(); }

void WorkerGroup::run(const std::function<void(int, worker::PolicyWorker&)>& fn) {
  run_ranks([&](int r) { fn(r, *workers_[static_cast<size_t>(r)]); });
}

void WorkerGroup::check_usable() const {
  RT_CHECK(broken_.empty(), "this PolicyWorker cannot be used any more: ", broken_, "; make a new one");
}

void WorkerGroup::run_ranks(const std::function<void(int)>& fn) {
  check_usable();
  const int n = static_cast<int>(comms_.size());
  const bool collective = comms_.front()->size() > 1;
  std::vector<std::exception_ptr> errors;
  if (n == 1) {  // one rank: on the caller's thread
    errors.resize(1);
    try {
      fn(0);
    } catch (...) {
      errors[0] = std::current_exception();
    }
  } else {
    try {
      errors = comm::run_threads(comms_, fn);
    } catch (const Error& e) {  // a rank thread could not be started; the started ones were stopped and joined
      broken_ = e.what();
      throw;
    }
  }
  // The root cause: the first rank whose error is not a communicator error (the others' waits failed because of it).
  int root = -1;
  for (int r = 0; r < n; ++r)
    if (errors[static_cast<size_t>(r)] && (root < 0 || (holds<comm::CommError>(errors[static_cast<size_t>(root)]) &&
                                                        !holds<comm::CommError>(errors[static_cast<size_t>(r)]))))
      root = r;
  if (root < 0) return;
  if (!collective) std::rethrow_exception(errors[static_cast<size_t>(root)]);
  // Every rank raised it together (a bad checkpoint path, a file that failed to read): the group is still in step.
  if (std::all_of(errors.begin(), errors.end(), holds<comm::AgreedError>)) std::rethrow_exception(errors.front());
  const int global = comms_[static_cast<size_t>(root)]->rank();
  broken_ = cat("rank ", global, " failed: ", message_of(errors[static_cast<size_t>(root)]));
  try {
    std::rethrow_exception(errors[static_cast<size_t>(root)]);
  } catch (const comm::CommError& e) {
    throw comm::CommError(cat("rank ", global, ": ", e.what()));
  } catch (const std::exception& e) {
    throw Error(cat("rank ", global, ": ", e.what()));
  }
}

}  // namespace ringtrain::python
