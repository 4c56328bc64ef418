#include "ringtrain/comm/nccl/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "ringtrain/core/cuda/check.h"

namespace ringtrain::comm {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::F64: return ncclFloat64;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
  }
  throw Error("nccl: unsupported dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Sum ? ncclSum : ncclMax; }


class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const RankInfo& info, std::chrono::milliseconds timeout)
      : rank_(info.rank), world_(info.world), device_(Device::cuda(info.local_rank)), timeout_(timeout) {
    ::setenv("NCCL_NVLS_ENABLE", "0", 1);
    int gpus = 0;
    RT_CUDA_CHECK(cudaGetDeviceCount(&gpus));
    RT_CHECK(info.local_rank < gpus, "rank ", rank_, " has local rank ", info.local_rank, " but this node has only ",
             gpus, " GPU(s)");
    RT_CUDA_CHECK(cudaSetDevice(device_.index));
    create_stream_and_event();
    ncclUniqueId id{};
    if (rank_ == 0) RT_CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId failed");
    std::vector<uint8_t> bytes(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof id);
    bytes = rendezvous_broadcast(info, bytes, timeout_);
    RT_CHECK(bytes.size() == sizeof id, "rendezvous returned ", bytes.size(), " bytes, expected an NCCL id");
    std::memcpy(&id, bytes.data(), sizeof id);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // so that every wait can give up at the deadline and abort
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, world_, id, rank_, &config);
    RT_CHECK(r == ncclSuccess || r == ncclInProgress, "ncclCommInitRankConfig failed on rank ", rank_, ": ",
             ncclGetErrorString(r));
    settle("ncclCommInitRank");
  }

  // Adopts a communicator made by ncclCommSplit (already settled).
  NcclCommunicator(ncclComm_t comm, int rank, int world, Device device, std::chrono::milliseconds timeout)
      : rank_(rank), world_(world), device_(device), timeout_(timeout), comm_(comm) {
    create_stream_and_event();
  }

  ~NcclCommunicator() override {
    if (comm_) {  // null after abort(), which already released it
      ncclCommFinalize(comm_);
      settle_quietly();
      ncclCommDestroy(comm_);
    }
    if (barrier_buf_) cudaFree(barrier_buf_);
    if (own_stream_) cudaStreamDestroy(own_stream_);
    if (after_legacy_) cudaEventDestroy(after_legacy_);
  }

  int rank() const override { return rank_; }
  int size() const override { return world_; }
  Device device() const override { return device_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  std::unique_ptr<Request> exchange(std::span<const Transfer> parts, int dst, int src, DType dtype,
                                    void* stream) override {
    cudaStream_t s = pick(stream);
    group("send_recv", [&] {
      for (const Transfer& t : parts) {
        ncclSend(t.send, t.count, nccl_type(dtype), dst, comm_, s);
        ncclRecv(t.recv, t.count, nccl_type(dtype), src, comm_, s);
      }
    });
    return std::make_unique<StreamRequest>(this, s, cat("send_recv (to rank ", dst, ", from rank ", src, ")"));
  }

  void all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream) override {
    cudaStream_t s = pick(stream);
    call("all_gather", ncclAllGather(send, recv, count, nccl_type(dtype), comm_, s));
    finish(stream, s, "all_gather");
  }

  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, void* stream) override {
    cudaStream_t s = pick(stream);
    call("reduce_scatter", ncclReduceScatter(send, recv, count, nccl_type(dtype), nccl_op(op), comm_, s));
    finish(stream, s, "reduce_scatter");
  }

  void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, void* stream) override {
    cudaStream_t s = pick(stream);
    call("all_reduce", ncclAllReduce(buf, buf, count, nccl_type(dtype), nccl_op(op), comm_, s));
    finish(stream, s, "all_reduce");
  }

  void all_to_all(const void* send, void* recv, size_t count, DType dtype, void* stream) override {
    cudaStream_t s = pick(stream);
    const size_t bytes = count * dtype_size(dtype);
    group("all_to_all", [&] {
      for (int peer = 0; peer < world_; ++peer) {
        ncclSend(static_cast<const char*>(send) + peer * bytes, count, nccl_type(dtype), peer, comm_, s);
        ncclRecv(static_cast<char*>(recv) + peer * bytes, count, nccl_type(dtype), peer, comm_, s);
      }
    });
    finish(stream, s, "all_to_all");
  }

  void broadcast(void* buf, size_t count, DType dtype, int root, void* stream) override {
    cudaStream_t s = pick(stream);
    call("broadcast", ncclBroadcast(buf, buf, count, nccl_type(dtype), root, comm_, s));
    finish(stream, s, "broadcast");
  }

  void barrier() override {
    if (!barrier_buf_) RT_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(int32_t)), "cudaMalloc (barrier)");
    all_reduce(barrier_buf_, 1, DType::I32, ReduceOp::Sum, nullptr);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    RT_CHECK(!aborted_, "nccl communicator on rank ", rank_, " was aborted: ", why_);
    if (color < 0) fail(cat("split: color must be >= 0, got ", color));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t child = nullptr;
    call("ncclCommSplit", ncclCommSplit(comm_, color, key, &child, &config));
    RT_CHECK(child != nullptr, "ncclCommSplit on rank ", rank_, " returned no communicator");
    settle_comm(child, "ncclCommSplit (the new communicator)");
    int child_rank = -1, child_size = 0;
    ncclCommUserRank(child, &child_rank);
    ncclCommCount(child, &child_size);
    return std::make_unique<NcclCommunicator>(child, child_rank, child_size, device_, timeout_);
  }

  void abort(const std::string& why) override {
    if (!aborted_ && comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    aborted_ = true;
    why_ = why;
  }

  // Polls the stream until the work enqueued so far is done, the timeout passes, or NCCL reports an error.
  void wait_stream(cudaStream_t s, const std::string& what) {
    cudaEvent_t ev;
    RT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    RT_CUDA_CHECK(cudaEventRecord(ev, s));
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      const cudaError_t q = cudaEventQuery(ev);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) {
        cudaEventDestroy(ev);
        fail(cat(what, ": CUDA error ", cudaGetErrorString(q)));
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        cudaEventDestroy(ev);
        fail(cat(what, ": NCCL error ", ncclGetErrorString(async), " (a peer rank may have died)"));
      }
      if (Clock::now() >= deadline) {
        cudaEventDestroy(ev);
        fail(cat(what, " did not complete within ", timeout_.count(), " ms: a peer rank is dead or stuck"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    cudaEventDestroy(ev);
  }

 private:
  class StreamRequest final : public Request {
   public:
    StreamRequest(NcclCommunicator* c, cudaStream_t s, std::string what) : c_(c), s_(s), what_(std::move(what)) {}
    void wait() override { c_->wait_stream(s_, what_); }

   private:
    NcclCommunicator* c_;
    cudaStream_t s_;
    std::string what_;
  };

  // Without a caller stream the buffers were written by work on the legacy default stream (where ringtrain's
  // kernels run when no stream is given): the communicator's own non-blocking stream waits for it on the GPU (an
  // event, so the host goes on launching), and later kernels on the legacy stream do not wait for the exchange — so
  // a send_recv overlaps with the compute launched after it.
  cudaStream_t pick(void* stream) {
    RT_CHECK(!aborted_, "nccl communicator on rank ", rank_, " was aborted: ", why_);
    if (stream) return static_cast<cudaStream_t>(stream);
    RT_CUDA_CHECK(cudaEventRecord(after_legacy_, cudaStreamLegacy), "cudaEventRecord (the buffers' producers)");
    RT_CUDA_CHECK(cudaStreamWaitEvent(own_stream_, after_legacy_, 0), "cudaStreamWaitEvent (the buffers' producers)");
    return own_stream_;
  }

  // Without a caller stream the operation completes before returning.
  void finish(void* caller_stream, cudaStream_t s, const char* what) {
    if (!caller_stream) wait_stream(s, what);
  }

  [[noreturn]] void fail(const std::string& msg) {
    const std::string full = cat("rank ", rank_, " of ", world_, ": ", msg);
    abort(full);
    throw CommError(full);
  }

  void call(const char* what, ncclResult_t r) {
    if (r != ncclSuccess && r != ncclInProgress) fail(cat(what, ": ", ncclGetErrorString(r)));
    settle(what);
  }

  template <typename F>
  void group(const char* what, F&& body) {
    ncclGroupStart();
    body();
    call(what, ncclGroupEnd());
  }

  void create_stream_and_event() {
    RT_CUDA_CHECK(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking));
    RT_CUDA_CHECK(cudaEventCreateWithFlags(&after_legacy_, cudaEventDisableTiming));
  }

  // Waits (with the deadline) until a non-blocking NCCL call has been accepted.
  void settle(const std::string& what) { settle_comm(comm_, what); }

  // The same for the call's communicator `comm` (a split's new one is aborted with ours when it fails).
  void settle_comm(ncclComm_t comm, const std::string& what) {
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm, &state);
      if (state == ncclSuccess) return;
      std::string error;
      if (state != ncclInProgress) error = cat(what, ": ", ncclGetErrorString(state));
      else if (Clock::now() >= deadline) error = cat(what, " not accepted within ", timeout_.count(), " ms");
      if (!error.empty()) {
        if (comm != comm_) ncclCommAbort(comm);
        fail(error);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void settle_quietly() {
    const auto deadline = Clock::now() + timeout_;
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress && Clock::now() < deadline) ncclCommGetAsyncError(comm_, &state);
  }

  int rank_, world_;
  Device device_;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t own_stream_ = nullptr;
  cudaEvent_t after_legacy_ = nullptr;
  void* barrier_buf_ = nullptr;
  bool aborted_ = false;
  std::string why_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const RankInfo& info, std::chrono::milliseconds timeout) {
  return std::make_unique<NcclCommunicator>(info, timeout);
}

}  // namespace ringtrain::comm
