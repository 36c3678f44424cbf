// NcclTransport: each exchange is one NCCL group (send to next, recv from
// previous) on the transport's stream, which first waits for the compute
// stream's work so far (the block being sent was written there); finish()
// makes the compute stream wait for the transport's stream in turn.
#include "flashattn/ring_nccl.hpp"

#include <string>

namespace flashattn::ring {
namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw Error(FA_ERROR_DEVICE, std::string("NcclTransport: ") + what + ": " +
                                     cudaGetErrorString(e));
  }
}

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) {
    throw Error(FA_ERROR_DEVICE, std::string("NcclTransport: ") + what + ": " +
                                     ncclGetErrorString(r));
  }
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

NcclTransport::NcclTransport(ncclComm_t comm) : comm_(comm) {
  if (comm == nullptr) throw Error(FA_ERROR_INVALID_ARGUMENT, "NcclTransport: comm is null");
  check_nccl(ncclCommUserRank(comm, &rank_), "ncclCommUserRank");
  check_nccl(ncclCommCount(comm, &world_), "ncclCommCount");
  check_cuda(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking), "stream");
  check_cuda(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming), "event");
  check_cuda(cudaEventCreateWithFlags(&transfer_done_, cudaEventDisableTiming), "event");
}

NcclTransport::~NcclTransport() {
  cudaEventDestroy(transfer_done_);
  cudaEventDestroy(compute_ready_);
  cudaStreamDestroy(comm_stream_);
}

void NcclTransport::start(const void* send, size_t send_bytes, void* recv, size_t recv_bytes,
                          void* stream) {
  check_cuda(cudaEventRecord(compute_ready_, as_stream(stream)), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(comm_stream_, compute_ready_, 0), "cudaStreamWaitEvent");
  const int next = (rank_ + 1) % world_, prev = (rank_ - 1 + world_) % world_;
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  check_nccl(ncclSend(send, send_bytes, ncclChar, next, comm_, comm_stream_), "ncclSend");
  check_nccl(ncclRecv(recv, recv_bytes, ncclChar, prev, comm_, comm_stream_), "ncclRecv");
  check_nccl(ncclGroupEnd(), "ncclGroupEnd");
}

void NcclTransport::finish(void* stream) {
  check_cuda(cudaEventRecord(transfer_done_, comm_stream_), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(as_stream(stream), transfer_done_, 0), "cudaStreamWaitEvent");
}

}  // namespace flashattn::ring
