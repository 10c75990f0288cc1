// Heap allocations made by every thread of the process so far (operator new is replaced in
// support/alloc_counter.cpp, linked into every Catch2 test binary). A test that asserts a
// path allocates nothing reads it before and after, with no other thread of its own busy.
#pragma once

namespace hack::test {
long process_allocations();
}
