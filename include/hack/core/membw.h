/// @file membw.h
/// @brief Measured memory read bandwidth: the bound decode and attention benches compare to.
#pragma once

#include <cstddef>

#include "hack/core/thread_pool.h"

namespace hack {

/// Best-of-`repeats` read bandwidth in GB/s (1e9 bytes/s) over a buffer of `bytes`,
/// read by every thread of `pool` (each its own contiguous slice) with 256-bit loads.
double measure_read_bandwidth_gbs(ThreadPool& pool, size_t bytes = size_t{1} << 30, int repeats = 5);

}  // namespace hack
