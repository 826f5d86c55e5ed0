// How the direct W4A16 kernel splits a layer between its warps (w4a16_sm80_direct.cu), shared by
// the kernel, its planner's cost model and the CPU tests. Host- and device-compilable.
//
// The layer is `strips` strips of 64 columns, each `units_per_strip` units of 64 k. The units are
// cut into `slices` k-slices: slice s is units [slice_first(s), slice_first(s + 1)) of every strip.
// Each slice's (strip, unit) pairs, strip-major, are numbered v = strip * slice_units + unit and
// split into equal contiguous warp ranges [warp_first(w), warp_first(w + 1)) over the slice's
// warps.
#pragma once

#if defined(__CUDACC__)
#define GPUOPT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define GPUOPT_HOST_DEVICE inline
#endif

namespace gpuopt::kernels::w4a16_detail {

// The first unit (within a strip) of k-slice `slice` of `slices`.
GPUOPT_HOST_DEVICE int direct_slice_first(int slice, int slices, int units_per_strip) {
  return slice * units_per_strip / slices;
}

// The first of the `total` pair indices of a slice that warp `warp` of `warps` takes.
GPUOPT_HOST_DEVICE int direct_warp_first(long long warp, long long warps, long long total) {
  return static_cast<int>(warp * total / warps);
}

}  // namespace gpuopt::kernels::w4a16_detail
