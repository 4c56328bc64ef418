#include "batch.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <algorithm>
#include <cctype>
#include <map>

#include "dlpack.h"
#include "ringtrain/core/device_ops.h"
#include "ringtrain/core/error.h"
#include "ringtrain/core/tensor.h"

namespace ringtrain::python {
namespace {

// The element types the module reads, whatever the source (DLPack or buffer protocol).
enum class Elem { Bool, I8, I16, I32, I64, U8, U16, U32, U64, F16, BF16, F32, F64 };

const char* elem_name(Elem e) {
  switch (e) {
    case Elem::Bool: return "bool";
    case Elem::I8: return "int8";
    case Elem::I16: return "int16";
    case Elem::I32: return "int32";
    case Elem::I64: return "int64";
    case Elem::U8: return "uint8";
    case Elem::U16: return "uint16";
    case Elem::U32: return "uint32";
    case Elem::U64: return "uint64";
    case Elem::F16: return "float16";
    case Elem::BF16: return "bfloat16";
    case Elem::F32: return "float32";
    case Elem::F64: return "float64";
  }
  return "?";
}

size_t elem_size(Elem e) {
  switch (e) {
    case Elem::Bool: case Elem::I8: case Elem::U8: return 1;
    case Elem::I16: case Elem::U16: case Elem::F16: case Elem::BF16: return 2;
    case Elem::I32: case Elem::U32: case Elem::F32: return 4;
    case Elem::I64: case Elem::U64: case Elem::F64: return 8;
  }
  return 1;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) {  // inf / NaN
    const uint32_t bits = sign | 0x7f800000u | (mant << 13);
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  const float magnitude = exp == 0 ? std::ldexp(static_cast<float>(mant), -24)
                                   : std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  return sign ? -magnitude : magnitude;
}

double element(const char* p, Elem e) {
  const auto load = [p](auto v) {
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  switch (e) {
    case Elem::Bool: return load(uint8_t{}) != 0 ? 1.0 : 0.0;
    case Elem::I8: return load(int8_t{});
    case Elem::I16: return load(int16_t{});
    case Elem::I32: return load(int32_t{});
    case Elem::I64: return static_cast<double>(load(int64_t{}));
    case Elem::U8: return load(uint8_t{});
    case Elem::U16: return load(uint16_t{});
    case Elem::U32: return load(uint32_t{});
    case Elem::U64: return static_cast<double>(load(uint64_t{}));
    case Elem::F16: return half_to_float(load(uint16_t{}));
    case Elem::BF16: {
      const uint32_t bits = static_cast<uint32_t>(load(uint16_t{})) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case Elem::F32: return load(float{});
    case Elem::F64: return load(double{});
  }
  return 0;
}

std::string element_text(const char* p, Elem e) {
  const auto load = [p](auto v) {
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  switch (e) {
    case Elem::I64: return std::to_string(load(int64_t{}));
    case Elem::U64: return std::to_string(load(uint64_t{}));
    case Elem::Bool: case Elem::I8: case Elem::I16: case Elem::I32: case Elem::U8: case Elem::U16: case Elem::U32:
      return std::to_string(static_cast<int64_t>(element(p, e)));
    default: return cat(element(p, e));
  }
}

// A strided array (strides in bytes) read in place; `owner` keeps its memory alive. Only the shape's product is
// computed here (checked: a shape whose product overflows is refused), nothing of its size is allocated.
HostArray view(const std::string& key, const char* base, Elem e, const std::vector<int64_t>& shape,
               const std::vector<int64_t>& byte_strides, std::shared_ptr<const void> owner) {
  HostArray a;
  a.key = key;
  a.dtype = elem_name(e);
  a.boolean = e == Elem::Bool;
  a.floating = e == Elem::F16 || e == Elem::BF16 || e == Elem::F32 || e == Elem::F64;
  a.integer = !a.boolean && !a.floating;
  a.shape = shape;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && n > std::numeric_limits<int64_t>::max() / d))
      throw py::value_error(cat(key, ": shape ", d < 0 ? "with a negative dimension" : "of more than 2^63 elements"));
    n *= d;
  }
  a.base = base;
  a.byte_strides = byte_strides;
  a.elem = static_cast<int>(e);
  a.owner = std::move(owner);
  return a;
}

std::optional<Elem> dlpack_elem(const dl::DataType& t) {
  if (t.lanes != 1) return std::nullopt;
  switch (t.code) {
    case dl::kBool: return t.bits == 8 ? std::optional(Elem::Bool) : std::nullopt;
    case dl::kInt:
      switch (t.bits) {
        case 8: return Elem::I8;
        case 16: return Elem::I16;
        case 32: return Elem::I32;
        case 64: return Elem::I64;
      }
      return std::nullopt;
    case dl::kUInt:
      switch (t.bits) {
        case 8: return Elem::U8;
        case 16: return Elem::U16;
        case 32: return Elem::U32;
        case 64: return Elem::U64;
      }
      return std::nullopt;
    case dl::kFloat:
      switch (t.bits) {
        case 16: return Elem::F16;
        case 32: return Elem::F32;
        case 64: return Elem::F64;
      }
      return std::nullopt;
    case dl::kBfloat: return t.bits == 16 ? std::optional(Elem::BF16) : std::nullopt;
  }
  return std::nullopt;
}

std::string type_name(py::handle obj) { return py::str(py::type::handle_of(obj).attr("__name__")); }

// An array exported through DLPack, as its producer lays it out; `release` hands it back.
struct Exported {
  int device_type = 0, device_id = 0;
  Elem elem = Elem::U8;
  std::vector<int64_t> shape, byte_strides;
  const char* base = nullptr;
  std::shared_ptr<dl::ManagedTensor> release;
};

// An interrupt (KeyboardInterrupt, SystemExit: no Exception) or a MemoryError raised by the caller's Python code
// reaches the caller as itself, not as a ValueError about the array.
bool passes_through(const py::error_already_set& e) {
  return !e.matches(PyExc_Exception) || e.matches(PyExc_MemoryError);
}

// nullopt: the producer could not export this array (NumPy's bool arrays), and the buffer protocol is there instead.
std::optional<Exported> export_dlpack(py::handle obj, const std::string& key) {
  int device_type = 0, device_id = 0;
  try {
    const py::object dev = obj.attr("__dlpack_device__")();
    if (!py::isinstance<py::tuple>(dev) || py::len(dev) != 2)
      throw py::value_error(cat(key, ": __dlpack_device__() returned ", py::str(py::repr(dev)).cast<std::string>(),
                                ", not a (device_type, device_id) pair"));
    const py::tuple pair = dev.cast<py::tuple>();
    device_type = pair[0].cast<int>();
    device_id = pair[1].cast<int>();
  } catch (py::cast_error&) {
    throw py::value_error(cat(key, ": __dlpack_device__() returned a pair that is not two ints"));
  } catch (py::error_already_set& e) {
    if (passes_through(e)) throw;
    throw py::value_error(cat(key, ": __dlpack_device__() failed: ", e.what()));
  }
  if (device_type != dl::kCPU && device_type != dl::kCUDAHost && device_type != dl::kCUDA)
    throw py::value_error(cat(key, ": arrays on DLPack device type ", device_type,
                              " are not supported (CPU and CUDA are)"));
  py::object capsule;
  try {
    // Stream 1 = CUDA's legacy default stream: the producer orders its pending work on the tensor before it, and
    // the copy below runs on it.
    capsule = device_type == dl::kCUDA ? obj.attr("__dlpack__")(py::arg("stream") = 1) : obj.attr("__dlpack__")();
  } catch (py::error_already_set& e) {
    if (passes_through(e)) throw;
    if (PyObject_CheckBuffer(obj.ptr())) return std::nullopt;
    throw py::value_error(cat(key, ": __dlpack__() failed: ", e.what()));
  }
  auto* managed = static_cast<dl::ManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (managed == nullptr) {
    PyErr_Clear();
    throw py::value_error(cat(key, ": __dlpack__() did not return a 'dltensor' capsule"));
  }
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");  // consumed: the deleter is ours to call
  Exported out;
  out.device_type = device_type, out.device_id = device_id;
  out.release = std::shared_ptr<dl::ManagedTensor>(managed, [](dl::ManagedTensor* m) {
    if (m->deleter) m->deleter(m);
  });
  const dl::Tensor& t = managed->dl_tensor;
  const std::optional<Elem> elem = dlpack_elem(t.dtype);
  if (!elem)
    throw py::value_error(cat(key, ": unsupported dtype (DLPack code ", int(t.dtype.code), ", ", int(t.dtype.bits),
                              " bits, ", t.dtype.lanes, " lanes)"));
  std::vector<int64_t> shape(t.shape, t.shape + t.ndim), strides(static_cast<size_t>(t.ndim));
  const int64_t size = static_cast<int64_t>(elem_size(*elem));
  for (int d = t.ndim - 1; d >= 0; --d) {
    if (t.strides) {
      strides[static_cast<size_t>(d)] = t.strides[d] * size;
    } else {
      strides[static_cast<size_t>(d)] = d == t.ndim - 1 ? size : strides[static_cast<size_t>(d) + 1] * shape[d + 1];
    }
  }
  out.elem = *elem;
  out.shape = std::move(shape);
  out.byte_strides = std::move(strides);
  out.base = static_cast<const char*>(t.data) + t.byte_offset;
  if (device_type == dl::kCUDA && !find_device_ops(DeviceKind::CUDA))
    throw py::value_error(cat(key, ": a CUDA tensor, but this build of ringtrain has no CUDA (pass .cpu() tensors)"));
  return out;
}

std::optional<HostArray> read_dlpack(py::handle obj, const std::string& key) {
  std::optional<Exported> e = export_dlpack(obj, key);
  if (!e) return std::nullopt;
  const std::vector<int64_t>& shape = e->shape;
  const std::vector<int64_t>& strides = e->byte_strides;
  const char* base = e->base;
  const int64_t size = static_cast<int64_t>(elem_size(e->elem));
  if (e->device_type != dl::kCUDA) return view(key, base, e->elem, shape, strides, e->release);
  // The samples path takes host vectors: a CUDA tensor is copied to host memory here (a device-to-host copy).
  if (shape.size() > static_cast<size_t>(kMaxDims)) throw py::value_error(cat(key, ": ", shape.size(), " dimensions"));
  HostArray shaped = view(key, base, e->elem, shape, strides, nullptr);  // the shape checked before any copy
  // The bytes the strides reach, [lo, hi) around base: for a broadcast (stride 0) only the stored ones.
  int64_t lo = 0, hi = size;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return shaped;
    (strides[d] < 0 ? lo : hi) += (shape[d] - 1) * strides[d];
  }
  auto host = std::make_shared<std::vector<char>>(static_cast<size_t>(hi - lo));
  {
    py::gil_scoped_release unlocked;
    copy_bytes(host->data(), Device::cpu(), base + lo, Device::cuda(e->device_id), host->size());
  }
  shaped.base = host->data() - lo;
  shaped.owner = std::move(host);
  return shaped;
}

HostArray read_buffer(py::handle obj, const std::string& key) {
  py::buffer_info info = py::reinterpret_borrow<py::buffer>(obj).request();
  std::string format = info.format;
  if (!format.empty() && (format[0] == '<' || format[0] == '=' || format[0] == '@')) format.erase(0, 1);
  std::optional<Elem> elem;
  if (format.size() == 1) {
    const bool is_signed = std::islower(static_cast<unsigned char>(format[0])) != 0;
    switch (format[0]) {
      case '?': elem = Elem::Bool; break;
      case 'e': elem = Elem::F16; break;
      case 'f': elem = Elem::F32; break;
      case 'd': elem = Elem::F64; break;
      case 'b': case 'B': case 'h': case 'H': case 'i': case 'I': case 'l': case 'L': case 'q': case 'Q':
        switch (info.itemsize) {
          case 1: elem = is_signed ? Elem::I8 : Elem::U8; break;
          case 2: elem = is_signed ? Elem::I16 : Elem::U16; break;
          case 4: elem = is_signed ? Elem::I32 : Elem::U32; break;
          case 8: elem = is_signed ? Elem::I64 : Elem::U64; break;
        }
        break;
    }
  }
  if (!elem || elem_size(*elem) != static_cast<size_t>(info.itemsize))
    throw py::value_error(cat(key, ": unsupported element format '", info.format, "' (", info.itemsize, " bytes)"));
  std::vector<int64_t> shape(info.shape.begin(), info.shape.end()), strides(info.strides.begin(), info.strides.end());
  const char* base = static_cast<const char*>(info.ptr);
  return view(key, base, *elem, shape, strides, std::make_shared<py::buffer_info>(std::move(info)));
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += cat(i ? ", " : "", s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

const std::vector<std::string> kKeys = {"input_ids",     "input_lengths",       "token_mask",    "sample_mask",
                                        "advantages",    "generation_logprobs", "prev_logprobs", "reference_logprobs"};

std::string known_keys() {
  std::string s;
  for (const std::string& k : kKeys) s += (s.empty() ? "" : ", ") + k;
  return s;
}

const char* element_at(const HostArray& a, int64_t i) {
  int64_t off = 0;
  for (size_t d = a.shape.size(); d-- > 0;) {
    off += (i % a.shape[d]) * a.byte_strides[d];
    i /= a.shape[d];
  }
  return a.base + off;
}

// A copy of the batch as a dict whose keys are all batch keys; errors name `what`. A copy, also of a dict: reading an
// array runs Python code (__dlpack__, the buffer protocol) that could change the caller's dict while we walk it, and
// the copy holds a reference to every value until the batch is read.
py::dict batch_dict(py::handle batch_obj, const std::string& what) {
  if (!py::isinstance<py::dict>(batch_obj) && !py::hasattr(batch_obj, "keys"))
    throw py::type_error(cat(what, ": the batch must be a dict of arrays, got ", type_name(batch_obj)));
  const py::dict batch = py::isinstance<py::dict>(batch_obj)
                             ? py::reinterpret_steal<py::dict>(PyDict_Copy(batch_obj.ptr()))
                             : py::dict(py::reinterpret_borrow<py::object>(batch_obj));
  if (!batch) throw py::error_already_set();
  for (const auto& [k, v] : batch) {
    if (!py::isinstance<py::str>(k))
      throw py::type_error(cat(what, ": batch keys must be strings, got ", type_name(k)));
    const std::string key = k.cast<std::string>();
    if (std::find(kKeys.begin(), kKeys.end(), key) == kKeys.end())
      throw py::value_error(cat(what, ": unknown batch key '", key, "' (the keys are ", known_keys(), ")"));
  }
  return batch;
}

// Each row's length from input_lengths ([B] integers in [1, S]), S for every row without it.
std::vector<int64_t> row_lengths(const HostArray* a, int64_t B, int64_t S) {
  std::vector<int64_t> lengths(static_cast<size_t>(B), S);
  if (!a) return lengths;
  if (!a->integer) throw py::value_error(cat(a->key, ": expected an integer dtype, got ", a->dtype));
  if (a->shape != std::vector<int64_t>{B})
    throw py::value_error(cat(a->key, ": shape ", shape_str(a->shape), " does not match input_ids ", shape_str({B, S}),
                              ": expected [B] = ", shape_str({B})));
  for (int64_t b = 0; b < B; ++b) {
    const double l = a->at(b);
    if (l < 1 || l > static_cast<double>(S))
      throw py::value_error(cat(a->key, ": input_lengths[", b, "] = ", a->text(b), " is not in [1, S = ", S, "]"));
    lengths[static_cast<size_t>(b)] = static_cast<int64_t>(l);
  }
  return lengths;
}

// A field's shape next to input_ids [B, S]: [B] for sample_mask, [B, S] or [B] for advantages, [B, S] otherwise.
void check_field_shape(const std::string& name, const std::string& key, const std::vector<int64_t>& shape, int64_t B,
                       int64_t S) {
  const bool per_sequence = key == "sample_mask" || key == "advantages", per_token = key != "sample_mask";
  if ((per_token && shape == std::vector<int64_t>{B, S}) || (per_sequence && shape == std::vector<int64_t>{B})) return;
  throw py::value_error(cat(name, ": shape ", shape_str(shape), " does not match input_ids ", shape_str({B, S}),
                            ": expected ",
                            per_token && per_sequence ? cat("[B, S] = ", shape_str({B, S}), " or [B] = ", shape_str({B}))
                            : per_token               ? cat("[B, S] = ", shape_str({B, S}))
                                                      : cat("[B] = ", shape_str({B}))));
}

}  // namespace

double HostArray::at(int64_t i) const { return element(element_at(*this, i), static_cast<Elem>(elem)); }
std::string HostArray::text(int64_t i) const { return element_text(element_at(*this, i), static_cast<Elem>(elem)); }

HostArray read_array(py::handle obj, const std::string& key) {
  if (py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj)) {
    py::object array;
    try {
      array = py::module_::import("numpy").attr("asarray")(obj);
    } catch (py::error_already_set& e) {
      if (passes_through(e)) throw;
      throw py::value_error(cat(key, ": cannot make an array of this ", type_name(obj), ": ", e.what()));
    }
    return read_array(array, key);
  }
  if (py::hasattr(obj, "__dlpack__") && py::hasattr(obj, "__dlpack_device__"))
    if (std::optional<HostArray> a = read_dlpack(obj, key)) return std::move(*a);
  if (PyObject_CheckBuffer(obj.ptr())) return read_buffer(obj, key);
  throw py::type_error(cat(key, ": expected an array (NumPy, PyTorch, __dlpack__ or the buffer protocol), got ",
                           type_name(obj)));
}

DeviceArray read_device_array(py::handle obj, const std::string& key) {
  if (!py::hasattr(obj, "__dlpack__") || !py::hasattr(obj, "__dlpack_device__"))
    throw py::type_error(cat(key, ": expected a CUDA tensor, got ", type_name(obj)));
  std::optional<Exported> e = export_dlpack(obj, key);
  if (!e || e->device_type != dl::kCUDA) throw py::type_error(cat(key, ": expected a CUDA tensor"));
  DType dtype;
  switch (e->elem) {
    case Elem::Bool:
    case Elem::U8: dtype = DType::U8; break;
    case Elem::I32: dtype = DType::I32; break;
    case Elem::I64: dtype = DType::I64; break;
    case Elem::F16: dtype = DType::F16; break;
    case Elem::BF16: dtype = DType::BF16; break;
    case Elem::F32: dtype = DType::F32; break;
    case Elem::F64: dtype = DType::F64; break;
    default:
      throw py::type_error(cat(key, ": a CUDA tensor of ", elem_name(e->elem),
                               " (bool, uint8, int32, int64, float16, bfloat16, float32 or float64 here)"));
  }
  const int ndim = static_cast<int>(e->shape.size());
  if (ndim != 1 && ndim != 2)
    throw py::value_error(cat(key, ": expected shape [B, S] or [B], got ", shape_str(e->shape)));
  const int64_t size = static_cast<int64_t>(dtype_size(dtype));
  DeviceArray a;
  a.view.data = const_cast<char*>(e->base);
  a.view.dtype = dtype;
  a.view.device = Device::cuda(e->device_id);
  a.view.ndim = ndim;
  for (int d = 0; d < ndim; ++d) {
    a.view.shape[d] = e->shape[static_cast<size_t>(d)];
    if (e->byte_strides[static_cast<size_t>(d)] % size != 0)
      throw py::value_error(cat(key, ": strides that are not whole elements"));
    a.view.stride[d] = e->byte_strides[static_cast<size_t>(d)] / size;
    if (a.view.shape[d] > 1 && a.view.stride[d] < 0) throw py::value_error(cat(key, ": negative strides"));
  }
  a.owner = e->release;
  return a;
}

RowsBatch read_rows_batch(py::handle batch_obj, const worker::Config& config, int64_t vocab, const std::string& what) {
  const py::dict batch = batch_dict(batch_obj, what);
  if (!batch.contains("input_ids")) throw py::value_error(cat(what, ": the batch has no 'input_ids'"));
  RowsBatch out;
  out.ids = read_device_array(batch["input_ids"], cat(what, ": input_ids"));
  const TensorView& ids = out.ids.view;
  if (ids.ndim != 2) throw py::value_error(cat(what, ": input_ids: expected shape [B, S], got ", ids.shape_str()));
  if (ids.dtype != DType::I32 && ids.dtype != DType::I64)
    throw py::value_error(cat(what, ": input_ids: expected an int32 or int64 tensor, got ", dtype_name(ids.dtype)));
  const int64_t B = ids.shape[0], S = ids.shape[1];
  if (B < 1 || S < 1) throw py::value_error(cat(what, ": input_ids: the batch is empty (shape ", ids.shape_str(), ")"));
  // Before the results ([B, S] float32) are allocated, as read_batch checks them.
  if (B > kMaxBatchElements / S)
    throw py::value_error(cat(what, ": input_ids: shape ", shape_str({B, S}), ": more than ", kMaxBatchElements,
                              " elements in one batch (split it into several calls)"));
  const int64_t max_length = config.policy.max_total_sequence_length;
  std::optional<HostArray> lengths;
  for (const auto& [k, v] : batch) {
    const std::string key = k.cast<std::string>(), name = cat(what, ": ", key);
    if (key == "input_ids") continue;
    if (key == "input_lengths") {
      lengths = read_array(v, name);
      continue;
    }
    // Scoring reads none of the other fields: their shapes are checked (a CUDA tensor's from its DLPack header).
    std::optional<Exported> e;
    if (py::hasattr(v, "__dlpack__") && py::hasattr(v, "__dlpack_device__") && !py::isinstance<py::array>(v))
      e = export_dlpack(v, name);
    check_field_shape(name, key, e ? e->shape : read_array(v, name).shape, B, S);
  }
  out.rows.ids = ids;
  out.rows.lengths = row_lengths(lengths ? &*lengths : nullptr, B, S);
  for (int64_t b = 0; b < B; ++b)
    if (out.rows.lengths[static_cast<size_t>(b)] > max_length)
      throw py::value_error(cat(what, ": input_ids: sample ", b, " has ", out.rows.lengths[static_cast<size_t>(b)],
                                " tokens; policy.max_total_sequence_length allows 1 to ", max_length));
  int64_t bad = 0;
  {
    py::gil_scoped_release unlocked;
    bad = device_ops(ids, "input_ids").first_outside(ids, out.rows.lengths, vocab);
  }
  if (bad >= 0) {
    throw py::value_error(cat(what, ": input_ids: input_ids[", bad / S, ", ", bad % S, "] = ", integer_at(ids, bad),
                              " is not a token id in [0, ", vocab, ")"));
  }
  return out;
}

Batch read_batch(py::handle batch_obj, const worker::Config& config, int64_t vocab, const std::string& what) {
  const py::dict batch = batch_dict(batch_obj, what);
  std::map<std::string, HostArray> arrays;
  for (const auto& [k, v] : batch) {
    const std::string key = k.cast<std::string>();
    arrays.emplace(key, read_array(v, cat(what, ": ", key)));
  }
  const auto it = arrays.find("input_ids");
  if (it == arrays.end()) throw py::value_error(cat(what, ": the batch has no 'input_ids'"));
  const HostArray& ids = it->second;
  const auto fail = [&](const HostArray& a, const std::string& why) { throw py::value_error(cat(a.key, ": ", why)); };
  if (!ids.integer) fail(ids, cat("expected an integer dtype, got ", ids.dtype));
  if (ids.shape.size() != 2) fail(ids, cat("expected shape [B, S], got ", shape_str(ids.shape)));
  const int64_t B = ids.shape[0], S = ids.shape[1];
  if (B < 1 || S < 1) fail(ids, cat("the batch is empty (shape ", shape_str(ids.shape), ")"));
  const int64_t max_length = config.policy.max_total_sequence_length;
  // Before anything of the batch's size is allocated: without input_lengths every row is S long.
  if (S > max_length && !arrays.count("input_lengths"))
    fail(ids, cat("sample 0 has ", S, " tokens; policy.max_total_sequence_length allows 1 to ", max_length));
  if (B > kMaxBatchElements / S)
    fail(ids, cat("shape ", shape_str(ids.shape), ": more than ", kMaxBatchElements,
                  " elements in one batch (split it into several calls)"));

  const auto check_shape = [&](const HostArray& a, const char* key) { check_field_shape(a.key, key, a.shape, B, S); };
  const HostArray* get = nullptr;
  const auto field = [&](const char* key) -> const HostArray* {
    const auto f = arrays.find(key);
    return f == arrays.end() ? nullptr : &f->second;
  };

  const std::vector<int64_t> lengths = row_lengths(field("input_lengths"), B, S);
  Batch out;
  out.columns = S;
  out.samples.resize(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = lengths[static_cast<size_t>(b)];
    if (len > max_length)
      fail(ids, cat("sample ", b, " has ", len, " tokens; policy.max_total_sequence_length allows 1 to ", max_length));
    worker::Sample& s = out.samples[static_cast<size_t>(b)];
    s.input_ids.resize(static_cast<size_t>(len));
    for (int64_t p = 0; p < len; ++p) {
      const double t = ids.at(b * S + p);
      if (!(t >= 0 && t < static_cast<double>(vocab)))
        fail(ids, cat("input_ids[", b, ", ", p, "] = ", ids.text(b * S + p), " is not a token id in [0, ", vocab, ")"));
      s.input_ids[static_cast<size_t>(p)] = static_cast<int32_t>(t);
    }
    s.token_mask.assign(static_cast<size_t>(len), 1.0f);
  }

  const auto zero_one = [&](const HostArray& a, double v, const std::string& at) {
    if (v != 0.0 && v != 1.0) fail(a, cat(a.key.substr(a.key.rfind(' ') + 1), at, " = ", v, ": expected 0 or 1"));
    return static_cast<float>(v);
  };
  if ((get = field("token_mask"))) {
    check_shape(*get, "token_mask");
    for (int64_t b = 0; b < B; ++b)
      for (int64_t p = 0; p < lengths[static_cast<size_t>(b)]; ++p)
        out.samples[static_cast<size_t>(b)].token_mask[static_cast<size_t>(p)] =
            zero_one(*get, get->at(b * S + p), cat("[", b, ", ", p, "]"));
  }
  if ((get = field("sample_mask"))) {
    check_shape(*get, "sample_mask");
    for (int64_t b = 0; b < B; ++b)
      out.samples[static_cast<size_t>(b)].sample_mask =
          zero_one(*get, get->at(b), cat("[", b, "]"));
  }
  const auto finite = [&](const HostArray& a, double v, const std::string& at) {
    if (!std::isfinite(v) || std::abs(v) > std::numeric_limits<float>::max())
      fail(a, cat(a.key.substr(a.key.rfind(' ') + 1), at, " = ", v, ": not a finite float32"));
    return static_cast<float>(v);
  };
  const std::pair<const char*, std::vector<float> worker::Sample::*> float_fields[] = {
      {"advantages", &worker::Sample::advantages},
      {"generation_logprobs", &worker::Sample::generation_logprobs},
      {"prev_logprobs", &worker::Sample::prev_logprobs},
      {"reference_logprobs", &worker::Sample::reference_logprobs}};
  for (const auto& [key, member] : float_fields) {
    if (!(get = field(key))) continue;
    if (!get->floating) fail(*get, cat("expected a floating dtype, got ", get->dtype));
    check_shape(*get, key);
    const bool per_sequence = get->shape.size() == 1, logprob = std::string_view(key).ends_with("logprobs");
    const auto value = [&](int64_t i, const std::string& at) {
      const float v = finite(*get, get->at(i), at);
      if (logprob && v > 0.0f) fail(*get, cat(key, at, " = ", v, ": a log-probability is at most 0"));
      return v;
    };
    for (int64_t b = 0; b < B; ++b) {
      const int64_t len = lengths[static_cast<size_t>(b)];
      std::vector<float>& v = out.samples[static_cast<size_t>(b)].*member;
      v.resize(static_cast<size_t>(len));
      if (per_sequence) {
        std::fill(v.begin(), v.end(), value(b, cat("[", b, "]")));
      } else {
        for (int64_t p = 0; p < len; ++p) v[static_cast<size_t>(p)] = value(b * S + p, cat("[", b, ", ", p, "]"));
      }
    }
  }
  return out;
}

void check_train_batch(const Batch& batch, const worker::Config& c) {
  const bool empty = batch.samples.empty();
  check_train_fields(static_cast<int64_t>(batch.samples.size()), !empty && !batch.samples[0].advantages.empty(),
                     !empty && !batch.samples[0].generation_logprobs.empty(), c);
  if (c.loss_fn.type != worker::LossType::Dpo) return;
  // A pair is in the loss or out of it as a whole: one of its sequences masked alone has no preference to score.
  for (size_t i = 0; i + 1 < batch.samples.size(); i += 2) {
    const float chosen = batch.samples[i].sample_mask, rejected = batch.samples[i + 1].sample_mask;
    if (chosen != rejected)
      throw py::value_error(cat("train: sample_mask: DPO pair ", i / 2, " (rows ", i, " and ", i + 1, ") has ",
                                chosen, " on the chosen sequence but ", rejected, " on the rejected one"));
  }
}

void check_train_fields(int64_t n, bool has_advantages, bool has_generation_logprobs, const worker::Config& c) {
  const bool dpo = c.loss_fn.type == worker::LossType::Dpo, pg = c.loss_fn.type == worker::LossType::ClippedPg;
  if (dpo && n % 2 != 0)
    throw py::value_error(cat("train: input_ids: a DPO batch holds pairs (chosen, rejected) as consecutive rows; got ",
                              n, " rows"));
  const int64_t units = dpo ? n / 2 : n;
  if (units != c.policy.train_global_batch_size)
    throw py::value_error(cat("train: input_ids: the batch holds ", units, dpo ? " pairs" : " sequences",
                              "; policy.train_global_batch_size = ", c.policy.train_global_batch_size));
  if (pg && !has_advantages) throw py::value_error("train: loss_fn.type clipped_pg needs 'advantages' in the batch");
  if (pg && c.loss_fn.use_importance_sampling_correction && !has_generation_logprobs)
    throw py::value_error("train: loss_fn.use_importance_sampling_correction needs 'generation_logprobs' in the batch");
}

TrainRowsInput read_train_rows_batch(py::handle batch_obj, const worker::Config& config, int64_t vocab) {
  const char* what = "train";
  TrainRowsInput out;
  out.ids = read_rows_batch(batch_obj, config, vocab, what);
  const py::dict batch = batch_dict(batch_obj, what);
  const TensorView& ids = out.ids.ids.view;
  const int64_t B = ids.shape[0], S = ids.shape[1];
  out.rows.tokens = out.ids.rows;
  const std::pair<const char*, TensorView worker::TrainRowsBatch::*> fields[] = {
      {"token_mask", &worker::TrainRowsBatch::token_mask},
      {"sample_mask", &worker::TrainRowsBatch::sample_mask},
      {"advantages", &worker::TrainRowsBatch::advantages},
      {"generation_logprobs", &worker::TrainRowsBatch::generation_logprobs},
      {"prev_logprobs", &worker::TrainRowsBatch::prev_logprobs},
      {"reference_logprobs", &worker::TrainRowsBatch::reference_logprobs}};
  for (const auto& [key, member] : fields) {
    if (!batch.contains(key)) continue;
    const std::string name = cat(what, ": ", key);
    out.held.push_back(read_device_array(batch[key], name));
    const TensorView& v = out.held.back().view;
    if (v.device != ids.device)
      throw py::value_error(cat(name, ": on ", device_name(v.device), ", input_ids on ", device_name(ids.device)));
    const bool mask = std::string_view(key).ends_with("_mask");
    if (!mask && !is_float(v.dtype))
      throw py::type_error(cat(name, ": expected a floating dtype, got ", dtype_name(v.dtype)));
    check_field_shape(name, key, std::vector<int64_t>(v.shape.begin(), v.shape.begin() + v.ndim), B, S);
    out.rows.*member = v;
  }
  check_train_fields(B, out.rows.advantages.data != nullptr, out.rows.generation_logprobs.data != nullptr, config);
  return out;
}

py::array_t<float> padded(const std::vector<std::vector<float>>& values, int64_t columns) {
  py::array_t<float> out({static_cast<py::ssize_t>(values.size()), static_cast<py::ssize_t>(columns)});
  float* data = out.mutable_data();
  std::fill(data, data + out.size(), 0.0f);
  for (size_t b = 0; b < values.size(); ++b) {
    const size_t n = std::min(values[b].size(), static_cast<size_t>(columns));
    std::copy(values[b].begin(), values[b].begin() + static_cast<ptrdiff_t>(n),
              data + b * static_cast<size_t>(columns));
  }
  return out;
}

}  // namespace ringtrain::python
