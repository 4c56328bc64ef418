// The training mesh: world = dp · cp ranks, rank = dp_index · cp + cp_index, so the ranks of one context-parallel
// group are adjacent (on GPUs of one node they share NVLink). Every rank of a cp group holds the same sequences and
// the same weights; the dp groups (one rank of each cp group, same cp_index) hold different sequences. Gradients
// and the optimizer state are sharded over the whole world (trainer.h).
#pragma once

#include <memory>

#include "ringtrain/comm/communicator.h"

namespace ringtrain::train {

struct MeshShape {
  int dp = 1;
  int cp = 1;
};

class Mesh {
 public:
  // Collective over `world` (two splits): every rank constructs its Mesh with the same shape. `world` is not owned
  // and must outlive the mesh. An error when world.size() != dp · cp or a size is < 1.
  Mesh(comm::Communicator& world, MeshShape shape);

  MeshShape shape() const { return shape_; }
  int dp() const { return shape_.dp; }
  int cp() const { return shape_.cp; }
  int dp_index() const { return world_->rank() / shape_.cp; }
  int cp_index() const { return world_->rank() % shape_.cp; }

  comm::Communicator& world() const { return *world_; }
  // Ranks dp_index · cp + 0 .. cp - 1, ranked by cp_index.
  comm::Communicator& cp_group() const { return *cp_; }
  // Ranks d · cp + cp_index for d = 0 .. dp - 1, ranked by dp index.
  comm::Communicator& dp_group() const { return *dp_; }

 private:
  comm::Communicator* world_;
  MeshShape shape_;
  std::unique_ptr<comm::Communicator> cp_, dp_;
};

}  // namespace ringtrain::train
