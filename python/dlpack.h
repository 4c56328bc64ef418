// The DLPack tensor structs (ABI of dlpack.h v0.x, the "dltensor" capsule that __dlpack__() returns when no
// max_version is asked for): declared here so the module needs no dlpack package. Only the fields read are named;
// the layout is the published one and is stable.
#pragma once

#include <cstdint>

namespace ringtrain::python::dl {

enum DeviceType : int32_t { kCPU = 1, kCUDA = 2, kCUDAHost = 3 };
enum TypeCode : uint8_t { kInt = 0, kUInt = 1, kFloat = 2, kOpaqueHandle = 3, kBfloat = 4, kComplex = 5, kBool = 6 };

struct Device {
  int32_t device_type;
  int32_t device_id;
};

struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null = compact row-major
  uint64_t byte_offset;
};

struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};

}  // namespace ringtrain::python::dl
