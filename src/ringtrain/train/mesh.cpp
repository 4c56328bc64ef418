#include "ringtrain/train/mesh.h"

namespace ringtrain::train {

Mesh::Mesh(comm::Communicator& world, MeshShape shape) : world_(&world), shape_(shape) {
  RT_CHECK(shape.dp >= 1 && shape.cp >= 1, "mesh: dp and cp must be >= 1, got dp ", shape.dp, ", cp ", shape.cp);
  RT_CHECK(static_cast<int64_t>(shape.dp) * shape.cp == world.size(), "mesh: dp ", shape.dp, " x cp ", shape.cp,
           " = ", static_cast<int64_t>(shape.dp) * shape.cp, " ranks, but the world has ", world.size());
  const int rank = world.rank();
  cp_ = world.split(rank / shape.cp, rank % shape.cp);
  dp_ = world.split(rank % shape.cp, rank / shape.cp);
}

}  // namespace ringtrain::train
