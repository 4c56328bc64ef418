// `ringtrain backends`: prints which attention backend would run a call and why each other one would not.
#include <cstdio>
#include <string>

#include "ringtrain/attention/selection.h"
#include "ringtrain/cli/commands.h"

namespace ringtrain::cli {

void add_backends_command(CLI::App& app) {
  struct Opts {
    std::string device = "cpu", dtype = "bf16", backends, mask;
    int64_t batch = 1, heads = 32, kv_heads = 0, head_dim = 128, seq = 4096, kv_seq = 0;
    bool causal = false, packed = false;
    int cp = 1;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("backends", "Explain the attention backend selection for a call");
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "fp32, bf16, fp16 or fp64")->capture_default_str();
  cmd->add_option("--batch", o->batch)->capture_default_str();
  cmd->add_option("--heads", o->heads, "query heads")->capture_default_str();
  cmd->add_option("--kv-heads", o->kv_heads, "key/value heads (default: --heads)");
  cmd->add_option("--head-dim", o->head_dim)->capture_default_str();
  cmd->add_option("--seq", o->seq, "query length")->capture_default_str();
  cmd->add_option("--kv-seq", o->kv_seq, "key length (default: --seq)");
  cmd->add_flag("--causal", o->causal, "causal mask (top-left)");
  cmd->add_option("--mask", o->mask, "none, causal_top_left or causal_bottom_right (overrides --causal)");
  cmd->add_flag("--packed", o->packed, "packed sequences (THD with cu_seqlens)");
  cmd->add_option("--cp", o->cp, "context-parallel size")->capture_default_str();
  cmd->add_option("--backends", o->backends, "ordered allow-list, e.g. cudnn,flash,efficient,math");
  cmd->callback([o] {
    using namespace attention;
    if (!o->backends.empty()) set_root_backends(parse_backend_list(o->backends), "--backends");
    AttnParams p;
    p.device = parse_device(o->device);
    p.dtype = parse_dtype(o->dtype);
    p.batch = o->batch;
    p.heads_q = o->heads;
    p.heads_kv = o->kv_heads ? o->kv_heads : o->heads;
    p.head_dim = o->head_dim;
    p.seqlen_q = o->seq;
    p.seqlen_kv = o->kv_seq ? o->kv_seq : o->seq;
    p.mask = !o->mask.empty() ? parse_mask(o->mask) : (o->causal ? MaskType::CausalTopLeft : MaskType::None);
    p.packed = o->packed;
    BackendScope cp_scope = BackendScope::context_parallel(o->cp);
    const Selection s = explain(p);
    std::fputs(s.report().c_str(), stdout);
    if (!s.backend) {
      std::fprintf(stderr, "ringtrain: no attention backend can serve this call (reasons above)\n");
      throw Exit{2};
    }
    std::printf("selected: %s\n", std::string(backend_name(s.backend->id())).c_str());
  });
}

}  // namespace ringtrain::cli
