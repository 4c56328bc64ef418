// Context-parallel attention on GPUs, one process per rank (NCCL): parity against the single-GPU result on the same
// inputs, and timing. Used by `ringtrain attention-check --device cuda --cp N`, `ringtrain bench cp` and the GPU CP
// tests. Works with any Communicator whose device is a GPU.
#pragma once

#include <cstdint>
#include <string>

#include "ringtrain/attention/selection.h"
#include "ringtrain/comm/communicator.h"
#include "ringtrain/cp/cp_check.h"

namespace ringtrain::cp {

struct DeviceRunOptions {
  AttnProblem prob;
  CpConfig config;
  uint64_t seed = 1;
  bool check = true;  // compare with the single-GPU result of the same backend on the whole sequence
  int warmup = 0;     // timed runs: warm-up iterations, then `iters` timed ones (median); 0 iters = no timing
  int iters = 0;
  bool time_single = false;  // also time the single-GPU call on the whole sequence (for scaling efficiency)
  bool keep_kv = true;       // hand the forward's last KV block to the backward (KeptKv)
};

struct DeviceRunResult {
  // ||cp - single||_2 / ||single||_2 over all ranks' valid tokens (the single-GPU run on each rank's GPU).
  double err_o = 0, err_lse = 0, err_dq = 0, err_dk = 0, err_dv = 0;
  // Medians over ranks' max, milliseconds (CUDA events, barrier before each iteration).
  double cp_fwd_ms = 0, cp_fwdbwd_ms = 0, single_fwd_ms = 0, single_fwdbwd_ms = 0;
  std::string selection;  // the block decision of rank 0 under the CP scope
  attention::DispatchCounts dispatches;  // this rank's
};

// Collective: every rank calls it with the same options. Inputs are drawn on each GPU from the seed
// (fill_normal_hashed), so every rank holds the same whole sequence without sending it.
DeviceRunResult run_cp_on_device(comm::Communicator& comm, const DeviceRunOptions& opt);

}  // namespace ringtrain::cp
