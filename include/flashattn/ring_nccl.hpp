// The NCCL transport of ring attention (library flashattn_ring_nccl, built
// when CMake finds NCCL): point-to-point send/recv to rank + 1 / from rank - 1
// of a communicator the caller owns, on a stream of its own, so a block
// travels while the compute stream attends to the previous one.
// Run with NCCL_NVLS_ENABLE=0 (NVLink multicast off; docs/ring.md).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include "flashattn/ring.hpp"

namespace flashattn::ring {

class FA_API NcclTransport final : public Transport {
 public:
  // comm: one rank per GPU, the current device being this rank's.
  explicit NcclTransport(ncclComm_t comm);
  ~NcclTransport() override;
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  void start(const void* send, size_t send_bytes, void* recv, size_t recv_bytes,
             void* stream) override;
  void finish(void* stream) override;

 private:
  ncclComm_t comm_;
  int rank_ = 0, world_ = 1;
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t compute_ready_ = nullptr;
  cudaEvent_t transfer_done_ = nullptr;
};

}  // namespace flashattn::ring
