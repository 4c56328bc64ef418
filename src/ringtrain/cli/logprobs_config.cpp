// `ringtrain logprobs --config FILE`: scoring through the policy worker, with the model, device, precision, mesh
// (dp x cp), attention allow-list, packing and batch sizes of a run config; --checkpoint scores a training
// checkpoint's weights, --reference the config's starting weights (the reference policy of the run).
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "ringtrain/cli/commands.h"
#include "ringtrain/cli/multi_gpu.h"
#include "ringtrain/cli/options.h"
#include "ringtrain/cli/stop_on_signal.h"
#include "ringtrain/comm/in_process.h"
#include "ringtrain/core/device_info.h"
#include "ringtrain/core/error.h"
#include "ringtrain/worker/data.h"
#include "ringtrain/worker/policy_worker.h"

namespace ringtrain::cli {

std::optional<std::vector<std::vector<float>>> run_config_logprobs(const ConfigLogprobsOptions& o) {
  // Checked as the worker checks it: scoring reads no training data, so a config without train.data serves.
  const worker::Config c = worker::load_config(o.config, o.overrides, worker::ConfigUse::Worker);
  check_out_is_not_input("--out", o.out, {{c.policy.model_name, "policy.model_name"}});
  const int world = static_cast<int>(c.parallel.world());
  if (!c.device.is_cuda()) check_one_process_on_cpu("ringtrain logprobs", world);
  if (c.device.is_cuda()) {
    require_cuda("logprobs");
    if (!inside_ranks(world)) throw relaunch_self(world);
  }
  const model::ModelConfig m = worker::resolve_model_config(c.policy);
  c.validate_against(m);
  worker::DataSpec spec;  // scoring reads input_ids (and ignores nothing else: a misspelt key is an error)
  spec.vocab = m.vocab;
  spec.max_length = c.policy.max_total_sequence_length;
  const std::vector<worker::Sample> samples = worker::load_dataset(o.data, spec).samples;
  std::vector<std::vector<float>> results;
  bool lead = true;
  run_stoppable("logprobs", "ends without writing", [&](const StopRequest* stop) {  // stopped: nothing is written
    lead = run_on_ranks(c, std::chrono::seconds(o.timeout_s),
                        [&](comm::Communicator& comm, worker::StartingWeights* shared) {
                          worker::PolicyWorker w(c, comm, shared, stop);
                          if (!o.checkpoint.empty()) w.load(o.checkpoint);
                          worker::LogprobResult r =
                              o.reference ? w.get_reference_logprobs(samples) : w.get_logprobs(samples);
                          if (comm.rank() == 0) results = std::move(r.logprobs);
                        });
  });
  if (!lead) return std::nullopt;
  return results;
}

}  // namespace ringtrain::cli
