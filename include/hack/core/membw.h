/// @file membw.h
/// @brief Measured memory read bandwidth: the bound decode and attention benches compare to.
#pragma once

#include <cstddef>

#include "hack/core/thread_pool.h"

namespace hack {

/// Best-of-`repeats` read bandwidth in GB/s (1e9 bytes/s) over a buffer of `bytes`, read
/// by every thread of `pool` (each its own contiguous slice) with 256-bit loads. Each
/// thread reads its slice as 1, 4, 8 and 16 concurrent sequential streams and the best is
/// kept: one stream leaves bandwidth unused (a core reaches ~12 GB/s with one stream and
/// ~16 GB/s with four on our machine), while a GEMV reads many weight rows at once, so the
/// single-stream figure would be a bound that kernels beat.
double measure_read_bandwidth_gbs(ThreadPool& pool, size_t bytes = size_t{1} << 30, int repeats = 5);

}  // namespace hack
