// The only translation unit that includes the cuDNN frontend (it takes ~40 s to compile). With CUDA 13 the
// frontend builds only in its dynamic-loading mode: every cuDNN call goes through dlsym on cudnn_dlhandle,
// which load_error() fills with dlopen("libcudnn.so.9"); nothing links libcudnn.
#include "ringtrain/attention/cudnn/sdpa_graphs.h"

#include <dlfcn.h>

#include <cudnn_frontend.h>

#include <bit>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "ringtrain/attention/cuda/cuda_util.h"
#include "ringtrain/core/error.h"

namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;  // declared by the frontend's shim
}

namespace ringtrain::attention::cudnn {
namespace {

namespace fe = cudnn_frontend;
using TensorAttr = std::shared_ptr<fe::graph::Tensor_attributes>;

// Tensor uids in the variant packs.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kSeqQ, kSeqKV,
  kRagQ, kRagK, kRagV, kRagO, kRagDO, kRagDQ, kRagDK, kRagDV
};

void check(fe::error_t e, const std::string& what) {
  if (e.is_bad()) throw Error(cat("cuDNN SDPA: ", what, " failed: ", e.get_message()));
}

fe::DataType_t fe_type(DType t) {
  switch (t) {
    case DType::BF16: return fe::DataType_t::BFLOAT16;
    case DType::F16: return fe::DataType_t::HALF;
    default: throw Error(cat("cuDNN SDPA: dtype ", dtype_name(t), " is not supported (bf16 or fp16)"));
  }
}

std::vector<int64_t> vec4(const int64_t (&a)[4]) { return {a[0], a[1], a[2], a[3]}; }

std::string describe(const char* name, const Tensor4& t) {
  return cat(name, "(", t.dim[0], ",", t.dim[1], ",", t.dim[2], ",", t.dim[3], ":", t.stride[0], ",", t.stride[1], ",",
             t.stride[2], ",", t.stride[3], t.ragged ? ",ragged" : "", ")");
}

std::string config_key(int device, const SdpaConfig& c) {
  return cat("cuda:", device, " ", dtype_name(c.dtype), " scale=", std::bit_cast<uint32_t>(c.scale), c.causal_top_left ? " causal_tl" : "",
             c.causal_bottom_right ? " causal_br" : "", c.window > 0 ? cat(" window=", c.window) : std::string(),
             c.deterministic ? " det" : "", c.seq_len_q ? " padded" : "");
}

struct PerDevice {
  std::mutex mu;  // guards the handle's stream and execution, and the graph cache
  cudnnHandle_t handle = nullptr;
  struct Entry {
    std::shared_ptr<fe::graph::Graph> graph;
    int64_t workspace = 0;
  };
  std::map<std::string, Entry> graphs;
};

PerDevice& per_device(int device) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<PerDevice>> all;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = all[device];
  if (!slot) slot = std::make_unique<PerDevice>();
  return *slot;
}

// Graph construction helpers: input tensors (with their ragged offsets) and the shapes of outputs.
class Builder {
 public:
  Builder(DType dtype, int64_t batch) : graph_(std::make_shared<fe::graph::Graph>()), batch_(batch) {
    graph_->set_io_data_type(fe_type(dtype))
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
  }
  fe::graph::Graph& g() { return *graph_; }
  std::shared_ptr<fe::graph::Graph> graph() { return graph_; }

  TensorAttr input(const char* name, int64_t uid, const Tensor4& t, int64_t ragged_uid,
                   fe::DataType_t type = fe::DataType_t::NOT_SET) {
    auto attr = fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(vec4(t.dim)).set_stride(vec4(t.stride));
    if (type != fe::DataType_t::NOT_SET) attr.set_data_type(type);
    TensorAttr a = graph_->tensor(attr);
    if (t.ragged) a->set_ragged_offset(ragged(ragged_uid));
    return a;
  }
  void output(const TensorAttr& a, int64_t uid, const Tensor4& t, int64_t ragged_uid) {
    a->set_output(true).set_uid(uid).set_dim(vec4(t.dim)).set_stride(vec4(t.stride));
    if (t.ragged) a->set_ragged_offset(ragged(ragged_uid));
  }
  TensorAttr seq_len(const char* name, int64_t uid) {
    return graph_->tensor(fe::graph::Tensor_attributes()
                              .set_name(name)
                              .set_uid(uid)
                              .set_dim({batch_, 1, 1, 1})
                              .set_stride({1, 1, 1, 1})
                              .set_data_type(fe::DataType_t::INT32));
  }

 private:
  TensorAttr ragged(int64_t uid) {
    return graph_->tensor(fe::graph::Tensor_attributes()
                              .set_name(cat("ragged_offset_", uid))
                              .set_uid(uid)
                              .set_dim({batch_ + 1, 1, 1, 1})
                              .set_stride({1, 1, 1, 1})
                              .set_data_type(fe::DataType_t::INT32));
  }
  std::shared_ptr<fe::graph::Graph> graph_;
  int64_t batch_;
};

cudnnHandle_t handle_for(PerDevice& pd, int device) {
  if (!pd.handle) {
    cudnnStatus_t st = fe::detail::create_handle(&pd.handle);
    RT_CHECK(st == CUDNN_STATUS_SUCCESS, "cuDNN: cudnnCreate on cuda:", device, " failed (status ", static_cast<int>(st),
             ")");
  }
  return pd.handle;
}

// Finds or builds the graph for `key`; build() fills a Builder. Called with pd.mu held. (A pointer, not a
// reference: g++ 13 takes a reference returned next to a temporary std::function for a dangling one.)
const PerDevice::Entry* graph_for(PerDevice& pd, cudnnHandle_t h, const std::string& key,
                            const std::function<std::shared_ptr<fe::graph::Graph>()>& build) {
  auto it = pd.graphs.find(key);
  if (it != pd.graphs.end()) return &it->second;
  PerDevice::Entry e;
  try {
    e.graph = build();
    check(e.graph->validate(), cat("validating the graph ", key));
    check(e.graph->build_operation_graph(h), cat("building the operation graph ", key));
    check(e.graph->create_execution_plans({fe::HeurMode_t::A}), cat("creating execution plans for ", key));
    check(e.graph->check_support(h), cat("support check of ", key));
    check(e.graph->build_plans(h), cat("building plans for ", key));
    check(e.graph->get_workspace_size(e.workspace), cat("workspace query of ", key));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& ex) {  // the frontend throws std::runtime_error from its loader
    throw Error(cat("cuDNN SDPA: building ", key, ": ", ex.what()));
  }
  return &pd.graphs.emplace(key, std::move(e)).first->second;
}

void execute(cudnnHandle_t h, cudaStream_t stream, const PerDevice::Entry& e,
             std::unordered_map<int64_t, void*>& pack, const std::string& key) {
  cuda::StreamScratch workspace(static_cast<size_t>(e.workspace), stream, "the cuDNN SDPA workspace");
  cudnnStatus_t st = fe::detail::set_stream(h, stream);
  RT_CHECK(st == CUDNN_STATUS_SUCCESS, "cuDNN: cudnnSetStream failed (status ", static_cast<int>(st), ")");
  check(e.graph->execute(h, pack, workspace.bytes()), cat("executing ", key));
}

void add_ragged(std::unordered_map<int64_t, void*>& pack, int64_t uid, const Tensor4& t) {
  if (t.ragged) pack[uid] = t.ragged;
}

}  // namespace

const std::string& load_error() {
  static const std::string error = []() -> std::string {
    dlerror();
    void* h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
      const char* e = dlerror();
      return cat("cuDNN could not be loaded at run time: dlopen(libcudnn.so.9) failed: ", e ? e : "unknown error");
    }
    cudnn_frontend::cudnn_dlhandle = h;
    if (!dlsym(h, "cudnnGetVersion")) return "cuDNN was loaded but has no cudnnGetVersion";
    const size_t v = fe::detail::get_backend_version();
    if (v < 90000) return cat("cuDNN ", v, " is older than 9.0 (needed for SDPA with GQA and causal masks)");
    return "";
  }();
  return error;
}

int64_t backend_version() {
  return load_error().empty() ? static_cast<int64_t>(fe::detail::get_backend_version()) : 0;
}

void sdpa_forward(int device, cudaStream_t stream, const SdpaConfig& c, const Tensor4& q, const Tensor4& k,
                  const Tensor4& v, const Tensor4& o, const Tensor4& stats) {
  RT_CHECK(load_error().empty(), load_error());
  const std::string key = cat("forward ", config_key(device, c), " ", describe("q", q), describe("k", k),
                              describe("v", v), describe("o", o), describe("stats", stats));
  PerDevice& pd = per_device(device);
  std::lock_guard<std::mutex> lock(pd.mu);
  cudnnHandle_t h = handle_for(pd, device);
  const PerDevice::Entry* e = graph_for(pd, h, key, [&] {
    Builder b(c.dtype, q.dim[0]);
    TensorAttr Q = b.input("Q", kQ, q, kRagQ), K = b.input("K", kK, k, kRagK), V = b.input("V", kV, v, kRagV);
    auto opts = fe::graph::SDPA_attributes().set_name("sdpa_forward").set_is_inference(false).set_attn_scale(c.scale);
    if (c.causal_top_left) opts.set_causal_mask(true);
    if (c.causal_bottom_right) opts.set_causal_mask_bottom_right(true);
    if (c.window > 0) opts.set_sliding_window_length(static_cast<int>(c.window));
    if (c.seq_len_q) opts.set_padding_mask(true).set_seq_len_q(b.seq_len("seq_q", kSeqQ)).set_seq_len_kv(b.seq_len("seq_kv", kSeqKV));
    auto [O, Stats] = b.g().sdpa(Q, K, V, opts);
    b.output(O, kO, o, kRagO);
    Stats->set_data_type(fe::DataType_t::FLOAT);
    b.output(Stats, kStats, stats, 0);
    return b.graph();
  });
  std::unordered_map<int64_t, void*> pack{{kQ, q.data}, {kK, k.data}, {kV, v.data}, {kO, o.data}, {kStats, stats.data}};
  if (c.seq_len_q) {
    pack[kSeqQ] = c.seq_len_q;
    pack[kSeqKV] = c.seq_len_kv;
  }
  add_ragged(pack, kRagQ, q);
  add_ragged(pack, kRagK, k);
  add_ragged(pack, kRagV, v);
  add_ragged(pack, kRagO, o);
  execute(h, stream, *e, pack, key);
}

void sdpa_backward(int device, cudaStream_t stream, const SdpaConfig& c, const Tensor4& q, const Tensor4& k,
                   const Tensor4& v, const Tensor4& o, const Tensor4& dout, const Tensor4& stats, const Tensor4& dq,
                   const Tensor4& dk, const Tensor4& dv) {
  RT_CHECK(load_error().empty(), load_error());
  for (int i = 0; i < 4; ++i)
    RT_CHECK(o.stride[i] == dout.stride[i], "cuDNN SDPA backward needs O and dO with identical strides: ",
             describe("o", o), " vs ", describe("dO", dout));
  const std::string key = cat("backward ", config_key(device, c), " ", describe("q", q), describe("k", k),
                              describe("v", v), describe("o", o), describe("stats", stats), describe("dq", dq),
                              describe("dk", dk), describe("dv", dv));
  PerDevice& pd = per_device(device);
  std::lock_guard<std::mutex> lock(pd.mu);
  cudnnHandle_t h = handle_for(pd, device);
  const PerDevice::Entry* e = graph_for(pd, h, key, [&] {
    Builder b(c.dtype, q.dim[0]);
    TensorAttr Q = b.input("Q", kQ, q, kRagQ), K = b.input("K", kK, k, kRagK), V = b.input("V", kV, v, kRagV);
    TensorAttr O = b.input("O", kO, o, kRagO), dO = b.input("dO", kDO, dout, kRagDO);
    TensorAttr Stats = b.input("Stats", kStats, stats, 0, fe::DataType_t::FLOAT);
    auto opts = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward").set_attn_scale(c.scale);
    if (c.causal_top_left) opts.set_causal_mask(true);
    if (c.causal_bottom_right) opts.set_causal_mask_bottom_right(true);
    if (c.window > 0) opts.set_sliding_window_length(static_cast<int>(c.window));
    if (c.deterministic) opts.set_deterministic_algorithm(true);
    if (c.seq_len_q) opts.set_padding_mask(true).set_seq_len_q(b.seq_len("seq_q", kSeqQ)).set_seq_len_kv(b.seq_len("seq_kv", kSeqKV));
    auto [dQ, dK, dV] = b.g().sdpa_backward(Q, K, V, O, dO, Stats, opts);
    b.output(dQ, kDQ, dq, kRagDQ);
    b.output(dK, kDK, dk, kRagDK);
    b.output(dV, kDV, dv, kRagDV);
    return b.graph();
  });
  std::unordered_map<int64_t, void*> pack{{kQ, q.data},      {kK, k.data},   {kV, v.data},   {kO, o.data},
                                          {kDO, dout.data},  {kStats, stats.data}, {kDQ, dq.data}, {kDK, dk.data},
                                          {kDV, dv.data}};
  if (c.seq_len_q) {
    pack[kSeqQ] = c.seq_len_q;
    pack[kSeqKV] = c.seq_len_kv;
  }
  add_ragged(pack, kRagQ, q);
  add_ragged(pack, kRagK, k);
  add_ragged(pack, kRagV, v);
  add_ragged(pack, kRagO, o);
  add_ragged(pack, kRagDO, dout);
  add_ragged(pack, kRagDQ, dq);
  add_ragged(pack, kRagDK, dk);
  add_ragged(pack, kRagDV, dv);
  execute(h, stream, *e, pack, key);
}

}  // namespace ringtrain::attention::cudnn
