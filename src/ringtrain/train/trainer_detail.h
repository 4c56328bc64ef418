// What the two forms of Trainer::step share (trainer.cpp, trainer_rows.cpp): the dp split, the microbatch plan and
// the host sums over a group.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ringtrain/comm/communicator.h"
#include "ringtrain/train/trainer.h"

namespace ringtrain::train::detail {

// This dp rank's contiguous part [first, last) of a batch of `sequences` (whole DPO pairs).
std::pair<int64_t, int64_t> dp_part(int64_t sequences, LossKind kind, const Mesh& mesh);
// The microbatches over sequences [first, last) of a batch with these lengths: the planner's, checked, or
// consecutive runs of micro_batch_size; indices into the batch.
std::vector<std::vector<int64_t>> plan_micros(const TrainerConfig& cfg, const std::vector<int64_t>& lengths,
                                              int64_t first, int64_t last);
// Sums host doubles over a group through a buffer on its device.
void all_reduce_sum(comm::Communicator& group, std::vector<double>& values);

}  // namespace ringtrain::train::detail
