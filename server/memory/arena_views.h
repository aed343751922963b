#ifndef MATERIALIZER_SERVER_MEMORY_ARENA_VIEWS_H_
#define MATERIALIZER_SERVER_MEMORY_ARENA_VIEWS_H_

// The LibTorch side of an Arena. Only code that runs LibTorch kernels on
// the tensors (server/init, tests) includes this.

#include <vector>

#include <ATen/core/Tensor.h>

#include "server/memory/arena.h"

namespace materializer::memory {

struct ArenaTensors {
  // One uint8 tensor over the whole allocation; owns the storage.
  at::Tensor storage;
  // views[i] is tensor i of the layout: same storage, its own offset,
  // shape and dtype, contiguous.
  std::vector<at::Tensor> views;
};

}  // namespace materializer::memory

#endif  // MATERIALIZER_SERVER_MEMORY_ARENA_VIEWS_H_
