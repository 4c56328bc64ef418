// The options that several commands take, each declared once with its range check (a bad value is refused at parse
// time with the option's name), and the helpers that turn them into the lower layers' types.
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "ringtrain/attention/selection.h"
#include "ringtrain/check/attention_check.h"
#include "ringtrain/cp/cp_attention.h"
#include "ringtrain/model/hf_config.h"

namespace ringtrain::cli {

// Upper bounds of the integer options: far above any real run, low enough that a typo (or 2^63 - 1) is refused and
// that the products of sizes fit 64 bits long before any allocation.
constexpr int64_t kMaxBatch = int64_t{1} << 16;
constexpr int64_t kMaxSeq = int64_t{1} << 30;
constexpr int64_t kMaxHeads = int64_t{1} << 12;
constexpr int64_t kMaxHeadDim = int64_t{1} << 10;
using comm::kMaxRanks;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxHidden = int64_t{1} << 18;
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int kMaxIters = 1000000;
constexpr int64_t kMaxTimeoutMs = int64_t{7} * 24 * 3600 * 1000;  // a week

// Adds a numeric option that must lie in [lo, hi]. A floating one must also be a number: NaN compares false with
// both bounds, so CLI::Range alone lets it through.
template <typename T>
CLI::Option* add_bounded(CLI::App& cmd, const std::string& name, T& value, const std::string& help, T lo, T hi) {
  CLI::Option* o = cmd.add_option(name, value, help);
  if constexpr (std::is_floating_point_v<T>)
    o->check(CLI::Validator(
        [](std::string& s) {
          return std::isnan(std::strtod(s.c_str(), nullptr)) ? "Value " + s + " is not a number" : std::string();
        },
        "", "NUMBER"));
  // Text that is no integer (1e3, 7.0) would otherwise be reported by the range check as out of range.
  if constexpr (std::is_integral_v<T>)
    o->check(CLI::Validator(
        [](std::string& s) {
          T parsed{};
          return CLI::detail::lexical_cast(s, parsed) ? std::string() : "Value " + s + " is not an integer";
        },
        "", "INTEGER"));
  return o->check(CLI::Range(lo, hi));
}

// The shape of an attention call or problem and where it runs. Each command sets the defaults it wants, then adds
// the fields it takes.
struct AttnShapeOptions {
  enum Field : unsigned {
    kDevice = 1u << 0,
    kDtype = 1u << 1,
    kBatch = 1u << 2,
    kSeq = 1u << 3,      // --seq N
    kSeqList = 1u << 4,  // --seq N,M,... (benchmarks)
    kKvSeq = 1u << 5,
    kHeads = 1u << 6,   // --heads and --kv-heads
    kHeadDim = 1u << 7,
    kCausal = 1u << 8,
    kMask = 1u << 9,  // --mask (alignment of the causal mask), --packed
    kCp = 1u << 10,
    kCpComm = 1u << 11,  // --cp-comm (alias --comm)
    kBackends = 1u << 12,
    kWindow = 1u << 13,  // --window (sliding window; causal masks only)
  };
  std::string device = "cpu", dtype = "fp32", mask, cp_comm = "ring", backends;
  int64_t batch = 1, seq = 4096, kv_seq = 0, heads = 8, kv_heads = 0, head_dim = 64;  // 0: as --seq / --heads
  int64_t window = 0;                                                                   // 0: none
  std::vector<int64_t> seqs;
  bool causal = false, packed = false;
  int cp = 1;

  void add_to(CLI::App& cmd, unsigned fields);

  int64_t kv_heads_or_heads() const { return kv_heads ? kv_heads : heads; }
  Device parsed_device() const { return parse_device(device); }
  DType parsed_dtype() const { return parse_dtype(dtype); }
  cp::CpComm parsed_comm() const { return cp::parse_cp_comm(cp_comm); }
  attention::MaskType parsed_mask() const;  // --mask, else --causal (top-left) or none
  // The problem for one sequence length; throws unless heads is a multiple of kv_heads, the tensors' element
  // counts fit 64 bits and a window comes with a causal mask.
  check::AttnProblem problem(int64_t seq_len) const;
  // The call's parameters (seqlen_kv: --kv-seq, else seq_len); the same checks as problem().
  attention::AttnParams params(int64_t seq_len) const;
};

// The root allow-list (`--backends`) for as long as this lives, when one is given; the previous list after.
class RootBackends {
 public:
  RootBackends(const std::string& list, const std::string& source);
  ~RootBackends();
  RootBackends(const RootBackends&) = delete;
  RootBackends& operator=(const RootBackends&) = delete;

 private:
  bool set_ = false;
  std::vector<attention::BackendId> previous_;
};

// Validators for the named choices: the lower layer's parser decides, at parse time.
CLI::Validator device_name_check();
CLI::Validator dtype_name_check();
CLI::Validator backend_list_check();
CLI::Validator cp_comm_check();
// A --seed: a whole number in [0, 2^64). CLI11 reads unsigned options with strtoull, which wraps "-1" to 2^64 - 1
// and saturates past 2^64 - 1, so both would be taken without a word.
CLI::Validator seed_check();

// The shape of a transformer (init-model, bench model|train|rollouts).
struct ModelShapeOptions {
  std::string arch = "llama";
  int64_t layers = 2, hidden = 64, heads = 4, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 256;  // 0: derived
  void add_to(CLI::App& cmd);
  // The first of add_to's options given on cmd's command line, or "" when none was.
  static std::string first_given(const CLI::App& cmd);
  // The benchmarks' default: the Llama-3.2-1B shape.
  static ModelShapeOptions llama_1b();
  // `base` with this shape: the architecture and its flags (Qwen2 biases, Qwen3 QK norm), the sizes (key/value heads
  // = heads, head dim = hidden / heads, ffn = 4 × hidden where 0) and the tying; the rest of `base` is kept.
  model::ModelConfig apply_to(model::ModelConfig base, bool tie_embeddings) const;
};

// An input of a command, for check_out_is_not_input: a file or a folder (a model or a checkpoint), and what names it
// ("--data", "policy.model_name"). An empty path is skipped.
struct InputPath {
  std::string path, what;
};
// Refuses an output (named by `out_option`) that the command reads: one of `inputs` (the same file under another name
// too), or a path inside an input folder. Writing it would replace or corrupt what is being read.
void check_out_is_not_input(const char* out_option, const std::string& out, const std::vector<InputPath>& inputs);

// The communicator timeout of multi-rank commands.
CLI::Option* add_timeout_ms(CLI::App& cmd, int64_t& timeout_ms);

}  // namespace ringtrain::cli
