// RT_HOST_DEVICE marks a small inline function that host and device code share, so that both compute it by one
// definition; plain C++ sees nothing.
#pragma once

#ifdef __CUDACC__
#define RT_HOST_DEVICE __host__ __device__
#else
#define RT_HOST_DEVICE
#endif
