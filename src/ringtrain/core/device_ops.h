// The operations core's Tensor, copy() and fill() need from a kind of device, as one table per DeviceKind. The host
// table is core's own; a device layer (core/cuda/) fills in its table through register_devices.cpp, the one file of
// core that depends on the build's options. Everything else reaches a device through device_ops(), never through an
// #ifdef.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ringtrain/core/tensor.h"

namespace ringtrain {

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  virtual DeviceKind kind() const = 0;

  // Memory for the contiguous view `like` (its nbytes, at least 1, on its device; its data is ignored), freed when
  // the last owner lets go.
  virtual std::shared_ptr<void> allocate(const TensorView& like) const = 0;
  // Host memory of `bytes` (at least 1) that copies to and from this kind of device at its full speed (page-locked
  // for CUDA; plain for the host table), freed when the last owner lets go. For buffers copied again and again.
  virtual std::shared_ptr<void> allocate_staging(size_t bytes) const = 0;
  // dst <- src, views of one shape where at least one lives on this kind of device (the other may be on the host):
  // any strides and dtypes. Complete when it returns.
  virtual void copy(const TensorView& dst, const TensorView& src) const = 0;
  // dst <- src, `bytes` raw bytes, at least one of them on this kind of device. Complete when it returns.
  virtual void copy_bytes(void* dst, const void* src, size_t bytes) const = 0;
  // Stream-ordered forms on views of one device of this kind (`stream`: a cudaStream_t or the like, nullptr = the
  // device's default stream), not waited for: dst <- src, dst += src, dst <- value, dst <- N(0, stddev) hashed
  // from (seed, row-major element number) as core/hashed_normal.h.
  virtual void copy_async(const TensorView& dst, const TensorView& src, void* stream) const = 0;
  virtual void add_async(const TensorView& dst, const TensorView& src, void* stream) const = 0;
  virtual void fill_async(const TensorView& dst, double value, void* stream) const = 0;
  virtual void fill_normal_hashed_async(const TensorView& dst, uint64_t seed, double stddev, void* stream) const = 0;
  // The first entry, row by row, of the integer [R, C] view `ids` (I32 or I64, any strides) among the first
  // lengths[r] columns of each row r that lies outside [0, limit): its index r * C + c, or -1 when there is none.
  // lengths has R entries in [0, C] (checked). Complete when it returns (one 8-byte result comes back from a device).
  virtual int64_t first_outside(const TensorView& ids, const std::vector<int64_t>& lengths, int64_t limit) const = 0;
  // Waits for the work enqueued on `stream` of the current device; `what` names the work in the error.
  virtual void synchronize_stream(void* stream, const std::string& what) const = 0;

  // Devices of this kind the process can use (0 when the driver reports none).
  virtual int device_count() const = 0;
  // Why there is no usable device of this kind ("no CUDA device on this machine", the driver's message), or "".
  virtual std::string unavailable_reason() const = 0;
  // Compute capability as major*10 + minor (90 for Hopper); 0 when unknown.
  virtual int arch(int index) const = 0;
  // Waits for all work on device `index`.
  virtual void synchronize(int index) const = 0;
  // The high-water mark in bytes of the memory allocate() hands out on device `index` since the last reset, and
  // restarting it from what is in use now.
  virtual uint64_t pool_peak_bytes(int index) const = 0;
  virtual void reset_pool_peak(int index) const = 0;
};

// The table of `kind`, or nullptr when this build has none (CUDA in a CPU-only build).
const DeviceOps* find_device_ops(DeviceKind kind);
// The table of `view`'s device; an Error naming `what` and the view when this build has none (a CUDA view in a
// CPU-only build).
const DeviceOps& device_ops(const TensorView& view, const char* what);
// The Error of a device kind this build has no table for; `what` says what was asked for.
[[noreturn]] void throw_no_device_ops(Device device, const std::string& what);

// The tables a build has, filled in once by register_device_ops (register_devices.cpp) on first use.
struct DeviceOpsRegistry {
  const DeviceOps* cpu = nullptr;
  const DeviceOps* cuda = nullptr;
};
void register_device_ops(DeviceOpsRegistry& registry);

// What first_outside checks before it reads: a 2-D I32 / I64 view and one length in [0, C] per row.
void check_row_lengths(const TensorView& ids, const std::vector<int64_t>& lengths);

// Entry `index` (r * C + c, as first_outside returns it) of a 2-D integer view on any device, read to the host: the
// value an error names.
int64_t integer_at(const TensorView& ids, int64_t index);

// The host table (every view on the host).
const DeviceOps& host_device_ops();

}  // namespace ringtrain
