// What the dispatcher (dispatch.cu) exposes besides core/backends.h's entry
// points: the backward workspace plan of a call, for tests that drive a main
// kernel directly between the shared passes.
#pragma once

#include "core/params.h"
#include "cuda/bwd/workspace.h"

namespace flashattn::cuda {

bwd::WorkspacePlan plan_backward_workspace(const AttentionParams& p);

}  // namespace flashattn::cuda
