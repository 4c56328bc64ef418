// Element types and host-side conversions for the 16-bit float formats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace ringtrain {

enum class DType : uint8_t { F32, BF16, F16, F64, I32, I64, U8 };  // U8: bytes, masks (bool as 0/1)

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
DType parse_dtype(std::string_view name);  // "fp32"/"float32", "bf16"/"bfloat16", "fp16"/"float16", "fp64"
bool is_float(DType t);

// bfloat16: the high half of an IEEE float32, rounded to nearest even.
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_fp16(float f);
float fp16_to_float(uint16_t h);

// Reads element i of a buffer of type t as double / writes a double into it (host memory).
double load_as_double(const void* p, DType t, int64_t i);
void store_from_double(void* p, DType t, int64_t i, double v);

}  // namespace ringtrain
