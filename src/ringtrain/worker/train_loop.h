// The training run of `ringtrain train`: optimizer steps of a PolicyWorker over a data file, checkpoints, metrics,
// and resuming from the newest complete checkpoint.
//
// Step s (0-based, epochs one after another) trains on BatchSchedule::step_units(s) of the data; the run ends after
// train.steps steps (or, with 0, after `epochs` passes). A checkpoint goes to train.checkpoint_dir/step_N every
// train.checkpoint_every steps and at the end (checkpoint.h: written under a temporary name, then renamed), its
// data position being the next step. Rank 0 writes metrics.jsonl and TensorBoard events into train.metrics_dir and
// the progress line on stderr.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ringtrain/comm/communicator.h"
#include "ringtrain/core/stop_request.h"
#include "ringtrain/model/file_io.h"
#include "ringtrain/worker/config.h"
#include "ringtrain/worker/data.h"
#include "ringtrain/worker/metrics.h"

namespace ringtrain::worker {

class StartingWeights;  // policy_worker.h

struct TrainRunOptions {
  bool resume = false;   // continue from the newest complete checkpoint in train.checkpoint_dir (none: start)
  bool progress = true;  // the progress line on stderr (rank 0)
  // Replace the metrics an earlier run left in train.metrics_dir (a fresh run refuses them otherwise).
  bool overwrite_metrics = false;
  // Shared by the ranks of this process (one copy of the starting weights); null: each rank loads its own.
  StartingWeights* starting_weights = nullptr;
  // When requested (on any rank), the step in progress stops at its next microbatch, having changed nothing, and
  // run_training throws comm::Interrupted on every rank after the lead says where the run stopped. Not owned.
  const StopRequest* stop = nullptr;
};

// What a fresh run (neither resume nor overwrite) that finds an earlier run's files is told to do.
constexpr const char* kEarlierRunHint =
    "pass --resume to continue that run, --overwrite-metrics to replace its metrics, or choose another folder";

// The metrics an earlier run left in train.metrics_dir: refused for a fresh run; overwritten; or, resuming after
// `resumed_step` steps, kept up to that step (the later ones are written again).
MetricsStart metrics_start(bool resume, bool overwrite_metrics, int64_t resumed_step);

// The checks of a run's folders that need no weights. For a run that neither resumes nor overwrites: metrics of an
// earlier run in train.metrics_dir, a checkpoint step_N in train.checkpoint_dir (a later --resume would mix the
// two runs). Errors name the file or folder.
void check_fresh_run(const Config& c, const TrainRunOptions& o);
// For a run that resumes without --overwrite-metrics, once it holds its folders: an error naming the file when
// train.checkpoint_dir holds no checkpoint to continue from but train.metrics_dir holds an earlier run's records,
// which a run from step 0 would drop.
void check_resume_start(const Config& c, bool overwrite_metrics);

// The steps the run takes in all (train.steps and train.epochs over `units` batches' worth of data).
int64_t total_train_steps(const Config& c, int64_t units);

// What a skipped step (train::StepResult::skipped) is, for the end-of-run lines that count them.
inline constexpr const char* kSkippedWhy =
    " (a non-finite gradient norm or no valid token: no weight changed; `skipped` in metrics.jsonl)";

// DIR/step_N, the checkpoint of a run's first N steps (`ringtrain train`'s and `ringtrain grpo`'s).
std::filesystem::path step_folder(const std::filesystem::path& dir, int64_t steps);
// Whether `name` is a checkpoint's (step_N) or a save's leftover's (step_N.*) in a checkpoint folder.
bool is_step_entry(std::string_view name);
// Whether the step that makes `done` steps of `steps` is saved: every train.checkpoint_every steps and the last.
bool checkpoint_due(int64_t done, int64_t steps, int64_t every);

// The newest checkpoint DIR/step_N (highest N), if any. DIR must be a directory (or absent); a step_N that is not a
// complete checkpoint (a directory holding trainer_state.json) is an error: a save that did not finish leaves
// step_N.saving, never step_N.
std::optional<std::filesystem::path> newest_checkpoint(const std::filesystem::path& dir);

// For a run that resumes from checkpoint `from`: a cosine schedule whose length the config leaves to the run
// (policy.scheduler.total_steps = 0) keeps the length it was made for, which a changed train.steps would otherwise
// stretch or cut (the learning rate jumping at the resume); `run_config`'s total_steps is set to it and the lead says
// so. A schedule that still differs from the recorded one (an explicit total_steps, another lr or warm-up), or a
// checkpoint that records none, is named on the lead's stderr: the learning rate follows this run's.
void resume_schedule(const Config& c, Config& run_config, const std::filesystem::path& from, bool lead,
                     const char* command);

// What continues a run of config `c` that stopped: "--resume continues from DIR/step_N", or why nothing does and
// what a new run needs. Never throws for a folder it cannot read: it says so instead.
std::string resume_hint(const Config& c);

// The leftovers of saves that died in train.checkpoint_dir removed (train::remove_save_leftovers), each said on stderr
// as `ringtrain COMMAND: removed ...`. By the lead rank, holding the run's folders (lock_run_folders), once every rank
// has passed prepare_checkpoint_dir's checks of them.
void remove_save_leftovers(const Config& c, const std::string& command);

// Whether a run of config `c` that a signal stops saves its finished steps first (train.checkpoint_on_stop, with a
// train.checkpoint_dir to save them in).
bool saves_at_stop(const Config& c);

// The end of a run of config `c` that stopped at a signal after `done` finished steps, `saved` of them in its newest
// checkpoint. On every rank (the stop was agreed, so the collective save can run): save(done) when saves_at_stop(c)
// and `done` > `saved`; a failed save is said, not thrown, since the stop is
// what ends the run. Then the lead says "ringtrain COMMAND: STOPPED_IN; " and what continues the run (resume_hint).
void save_at_stop_and_report(const Config& c, bool lead, const std::string& command, const std::string& stopped_in,
                             int64_t done, int64_t saved, const std::function<void(int64_t)>& save);

// train.checkpoint_dir made (or found) before any weight is loaded or step taken: an error names the key when it
// is not a directory or cannot be created, or the folder when a leftover step_N.saving or step_N.old there is not
// ours to remove (a save would refuse it only after the steps before it).
void prepare_checkpoint_dir(const std::filesystem::path& dir);

// The run's folders (train.checkpoint_dir, train.metrics_dir, where set) locked for as long as the result lives, made
// if need be: a second run on them (two `--resume` at once) is refused instead of mixing its checkpoints and
// metrics with this one's. Taken by the lead rank only.
using RunFolderLocks = std::vector<std::unique_ptr<model::FolderLock>>;
RunFolderLocks lock_run_folders(const Config& c);

// Collective over `world` (dp · cp ranks; every rank passes the same config and data). Returns the steps taken by
// this call.
int64_t run_training(const Config& c, comm::Communicator& world, const Dataset& data, const TrainRunOptions& o);

}  // namespace ringtrain::worker
