// `ringtrain backends`: prints which attention backend would run a call and why each other one would not.
#include <cstdio>
#include <string>

#include "ringtrain/attention/selection.h"
#include "ringtrain/cli/commands.h"
#include "ringtrain/cli/options.h"

namespace ringtrain::cli {

void add_backends_command(CLI::App& app) {
  auto o = std::make_shared<AttnShapeOptions>();
  o->dtype = "bf16";
  o->heads = 32;
  o->head_dim = 128;
  CLI::App* cmd = app.add_subcommand("backends", "Explain the attention backend selection for a call");
  o->add_to(*cmd, AttnShapeOptions::kDevice | AttnShapeOptions::kDtype | AttnShapeOptions::kBatch |
                      AttnShapeOptions::kHeads | AttnShapeOptions::kHeadDim | AttnShapeOptions::kSeq |
                      AttnShapeOptions::kKvSeq | AttnShapeOptions::kCausal | AttnShapeOptions::kWindow |
                      AttnShapeOptions::kMask | AttnShapeOptions::kCp | AttnShapeOptions::kBackends);
  cmd->callback([o] {
    using namespace attention;
    const RootBackends root(o->backends, "--backends");
    const AttnParams p = o->params(o->seq);
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
