#include "ringtrain/attention/cuda/cuda_util.h"

#include <cstdint>
#include <mutex>
#include <set>

namespace ringtrain::attention::cuda {

void keep_pool_memory() {
  static std::mutex mu;
  static std::set<int> done;
  int dev = 0;
  RT_CUDA_CHECK(cudaGetDevice(&dev), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mu);
  if (done.count(dev)) return;
  cudaMemPool_t pool = nullptr;
  RT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev), "getting the default memory pool");
  uint64_t keep = UINT64_MAX;
  RT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "setting the pool's release threshold");
  done.insert(dev);
}

}  // namespace ringtrain::attention::cuda
