// Heap allocations made by the calling thread so far (operator new is replaced in
// alloc_counter_test.cpp for the whole unit_kv binary).
#pragma once

namespace hack::test {
long thread_allocations();
}
