#include "ringtrain/cli/options.h"

#include <algorithm>
#include <charconv>
#include <filesystem>

#include "ringtrain/core/checked.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/hf_config.h"

namespace ringtrain::cli {
namespace {

// A validator that accepts what `parse` accepts and otherwise reports its error.
template <typename Parse>
CLI::Validator parser_check(const char* what, Parse parse) {
  return CLI::Validator(
      [parse](std::string& value) {
        try {
          parse(value);
          return std::string();
        } catch (const std::exception& e) {
          return std::string(e.what());
        }
      },
      what);
}

}  // namespace

CLI::Validator device_name_check() {
  return parser_check("DEVICE", [](const std::string& s) { parse_device(s); });
}
CLI::Validator dtype_name_check() {
  return parser_check("DTYPE", [](const std::string& s) { parse_dtype(s); });
}
CLI::Validator backend_list_check() {
  return parser_check("LIST", [](const std::string& s) { attention::parse_backend_list(s); });
}
CLI::Validator seed_check() {
  return CLI::Validator(
      [](std::string& s) {
        uint64_t v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        return !s.empty() && ec == std::errc() && end == s.data() + s.size()
                   ? std::string()
                   : "Value " + s + " is not a whole number in [0, 2^64)";
      },
      "", "SEED");
}
CLI::Validator cp_comm_check() {
  return parser_check("COMM", [](const std::string& s) { cp::parse_cp_comm(s); });
}

void AttnShapeOptions::add_to(CLI::App& cmd, unsigned fields) {
  if (fields & kDevice)
    cmd.add_option("--device", device, "cpu, cuda or cuda:N")->check(device_name_check())->capture_default_str();
  if (fields & kDtype)
    cmd.add_option("--dtype", dtype, "fp32, bf16, fp16 (fp64: backends only)")
        ->check(dtype_name_check())
        ->capture_default_str();
  if (fields & kBatch) add_bounded(cmd, "--batch", batch, "batch size", int64_t{1}, kMaxBatch)->capture_default_str();
  if (fields & kSeq)
    add_bounded(cmd, "--seq", seq, "sequence length (query length)", int64_t{1}, kMaxSeq)->capture_default_str();
  if (fields & kSeqList)
    cmd.add_option("--seq", seqs, "sequence lengths, comma-separated")
        ->delimiter(',')
        ->check(CLI::Range(int64_t{1}, kMaxSeq))
        ->capture_default_str();
  if (fields & kKvSeq) add_bounded(cmd, "--kv-seq", kv_seq, "key length (default: --seq)", int64_t{1}, kMaxSeq);
  if (fields & kHeads) {
    add_bounded(cmd, "--heads", heads, "query heads", int64_t{1}, kMaxHeads)->capture_default_str();
    // A command that sets a default states it; without one, --kv-heads follows --heads.
    CLI::Option* o = add_bounded(cmd, "--kv-heads", kv_heads, kv_heads ? "key/value heads" : "key/value heads "
                                 "(default: --heads)", int64_t{1}, kMaxHeads);
    if (kv_heads) o->capture_default_str();
  }
  if (fields & kHeadDim)
    add_bounded(cmd, "--head-dim", head_dim, "head dimension", int64_t{1}, kMaxHeadDim)->capture_default_str();
  if (fields & kCausal) cmd.add_flag("--causal", causal, "causal mask (top-left)");
  if (fields & kMask) {
    cmd.add_option("--mask", mask, "none, causal_top_left or causal_bottom_right (overrides --causal)")
        ->check(parser_check("MASK", [](const std::string& s) { attention::parse_mask(s); }));
    cmd.add_flag("--packed", packed, "packed sequences (THD with cu_seqlens)");
  }
  if (fields & kWindow)
    add_bounded(cmd, "--window", window, "sliding window: a query sees its W most recent keys (causal only; 0: none)",
                int64_t{0}, kMaxSeq)
        ->capture_default_str();
  if (fields & kCp) add_bounded(cmd, "--cp", cp, "context-parallel size (ranks)", 1, kMaxRanks)->capture_default_str();
  if (fields & kCpComm) {
    cmd.add_option("--cp-comm,--comm", cp_comm, "ring, allgather or a2a (heads divisible by cp)")
        ->check(cp_comm_check())
        ->capture_default_str();
  }
  if (fields & kBackends) {
    CLI::Option* o = cmd.add_option("--backends", backends,
                                    "ordered root allow-list of attention backends, e.g. cudnn,flash,efficient,math");
    o->check(backend_list_check());
    if (!backends.empty()) o->capture_default_str();
  }
}

attention::MaskType AttnShapeOptions::parsed_mask() const {
  if (!mask.empty()) return attention::parse_mask(mask);
  return causal ? attention::MaskType::CausalTopLeft : attention::MaskType::None;
}

check::AttnProblem AttnShapeOptions::problem(int64_t seq_len) const {
  const int64_t hkv = kv_heads_or_heads();
  RT_CHECK(heads % hkv == 0, "--heads (", heads, ") must be a multiple of --kv-heads (", hkv, ")");
  // The largest tensor of the problem is q (or dO, O, dQ): batch * seq * heads * head_dim elements.
  checked_mul(checked_mul(checked_mul(batch, seq_len, "--batch * --seq"), heads, "--batch * --seq * --heads"),
              head_dim, "--batch * --seq * --heads * --head-dim");
  RT_CHECK(window == 0 || parsed_mask() != attention::MaskType::None, "--window ", window,
           " needs a causal mask (--causal)");
  return check::AttnProblem{batch, seq_len, heads, hkv, head_dim, parsed_mask() != attention::MaskType::None,
                            parsed_dtype(), window};
}

attention::AttnParams AttnShapeOptions::params(int64_t seq_len) const {
  const check::AttnProblem prob = problem(seq_len);
  attention::AttnParams p;
  p.device = parsed_device();
  p.dtype = prob.dtype;
  p.batch = prob.batch;
  p.heads_q = prob.heads_q;
  p.heads_kv = prob.heads_kv;
  p.head_dim = prob.head_dim;
  p.seqlen_q = seq_len;
  p.seqlen_kv = kv_seq ? kv_seq : seq_len;
  checked_mul(checked_mul(batch, p.seqlen_kv, "--batch * --kv-seq"), heads, "--batch * --kv-seq * --heads");
  p.mask = parsed_mask();
  p.packed = packed;
  p.window = window;
  return p;
}

RootBackends::RootBackends(const std::string& list, const std::string& source) {
  if (list.empty()) return;
  previous_ = attention::root_backends();
  attention::set_root_backends(attention::parse_backend_list(list), source);
  set_ = true;
}

RootBackends::~RootBackends() {
  if (set_) attention::set_root_backends(previous_, "the allow-list before --backends");
}

void ModelShapeOptions::add_to(CLI::App& cmd) {
  cmd.add_option("--arch", arch, "llama, qwen2, qwen3 or mistral")
      ->check(parser_check("ARCH", [](const std::string& s) { model::parse_arch(s); }))
      ->capture_default_str();
  add_bounded(cmd, "--layers", layers, "decoder layers", int64_t{1}, kMaxLayers)->capture_default_str();
  add_bounded(cmd, "--hidden", hidden, "hidden size", int64_t{1}, kMaxHidden)->capture_default_str();
  add_bounded(cmd, "--heads", heads, "query heads", int64_t{1}, kMaxHeads)->capture_default_str();
  // A size given a default here shows it; one left 0 is derived, as its help says.
  CLI::Option* kv = add_bounded(cmd, "--kv-heads", kv_heads, kv_heads ? "key/value heads" : "key/value heads "
                                "(default: --heads)", int64_t{1}, kMaxHeads);
  if (kv_heads) kv->capture_default_str();
  CLI::Option* hd = add_bounded(cmd, "--head-dim", head_dim, head_dim ? "head dimension" : "head dimension "
                                "(default: hidden / heads)", int64_t{1}, kMaxHeadDim);
  if (head_dim) hd->capture_default_str();
  CLI::Option* ffn_opt = add_bounded(cmd, "--ffn", ffn, ffn ? "MLP width" : "MLP width (default: 4 x hidden)",
                                     int64_t{1}, 4 * kMaxHidden);
  if (ffn) ffn_opt->capture_default_str();
  add_bounded(cmd, "--vocab", vocab, "vocabulary size", int64_t{1}, kMaxVocab)->capture_default_str();
}

std::string ModelShapeOptions::first_given(const CLI::App& cmd) {
  for (const char* name : {"--arch", "--layers", "--hidden", "--heads", "--kv-heads", "--head-dim", "--ffn", "--vocab"})
    if (cmd.count(name) > 0) return name;
  return "";
}

ModelShapeOptions ModelShapeOptions::llama_1b() {
  ModelShapeOptions s;
  s.layers = 16, s.hidden = 2048, s.heads = 32, s.kv_heads = 8, s.head_dim = 64, s.ffn = 8192, s.vocab = 128256;
  return s;
}

model::ModelConfig ModelShapeOptions::apply_to(model::ModelConfig c, bool tie_embeddings) const {
  c.arch = model::parse_arch(arch);
  c.layers = layers, c.hidden = hidden, c.heads = heads, c.vocab = vocab;
  c.kv_heads = kv_heads ? kv_heads : heads;
  c.head_dim = head_dim ? head_dim : hidden / heads;  // heads >= 1: checked when parsed
  c.ffn = ffn ? ffn : checked_mul(int64_t{4}, hidden, "--hidden x 4 (the default --ffn)");
  c.tie_embeddings = tie_embeddings;
  c.qkv_bias = c.arch == model::Arch::Qwen2;
  c.qk_norm = c.arch == model::Arch::Qwen3;
  return c;
}

void check_out_is_not_input(const char* out_option, const std::string& out, const std::vector<InputPath>& inputs) {
  namespace fs = std::filesystem;
  if (out.empty()) return;
  std::error_code ec;
  const fs::path out_path = fs::weakly_canonical(out, ec);
  for (const InputPath& in : inputs) {
    if (in.path.empty()) continue;
    RT_CHECK(!fs::equivalent(out, in.path, ec), out_option, " ", out, " is the ", in.what,
             fs::is_directory(in.path, ec) ? " folder" : " file", "; refusing to overwrite it");
    if (!fs::is_directory(in.path, ec) || out_path.empty()) continue;
    const fs::path folder = fs::canonical(in.path, ec);
    if (ec) continue;
    // Inside the folder: the folder's components are a prefix of the output's.
    const bool inside = std::mismatch(folder.begin(), folder.end(), out_path.begin(), out_path.end()).first ==
                        folder.end();
    RT_CHECK(!inside, out_option, " ", out, " lies inside ", in.path, " (the ", in.what,
             " folder, which this command reads); refusing to write there");
  }
}

CLI::Option* add_timeout_ms(CLI::App& cmd, int64_t& timeout_ms) {
  return add_bounded(cmd, "--timeout-ms", timeout_ms, "communicator timeout (ms)", int64_t{1}, kMaxTimeoutMs)
      ->capture_default_str();
}

}  // namespace ringtrain::cli
