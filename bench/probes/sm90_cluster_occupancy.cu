// How many thread-block clusters of the d128 forward's launch shape (384
// threads, 230,496 bytes of dynamic shared memory, one CTA per SM) the GPU
// holds at once, for cluster sizes 1, 2 and 4 (cudaOccupancyMaxActiveClusters):
// a K/V-multicast pair needs all SMs in pairs (on the H100: 66 pairs, all
// 132 SMs; docs/performance.md, the Hopper forward's 'not kept' rows).
//
//   nvcc -O2 -gencode arch=compute_90a,code=sm_90a bench/probes/sm90_cluster_occupancy.cu -o cluster_occupancy && ./cluster_occupancy
#include <cuda_runtime.h>

#include <cstdio>

constexpr int kThreads = 384, kSmemBytes = 230496;

__global__ void __launch_bounds__(kThreads, 1) shape_kernel(int* out) {
  extern __shared__ int smem[];
  if (threadIdx.x == 0 && out != nullptr) out[blockIdx.x] = smem[0];
}

int main() {
  cudaFuncSetAttribute(shape_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  cudaFuncSetAttribute(shape_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  for (int size : {1, 2, 4}) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(sms);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = kSmemBytes;
    cudaLaunchAttribute cluster[1];
    cluster[0].id = cudaLaunchAttributeClusterDimension;
    cluster[0].val.clusterDim.x = size;
    cluster[0].val.clusterDim.y = 1;
    cluster[0].val.clusterDim.z = 1;
    config.attrs = cluster;
    config.numAttrs = 1;
    int clusters = -1;
    const cudaError_t err = cudaOccupancyMaxActiveClusters(&clusters, shape_kernel, &config);
    std::printf("clusters of %d: %d at once (%d CTAs of %d SMs) %s\n", size, clusters, clusters * size, sms,
                cudaGetErrorString(err));
  }
  return 0;
}
