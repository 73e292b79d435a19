// allocations.cpp: see allocations.h.
#include "common/allocations.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {

std::atomic<std::uint64_t> allocations{0};

}  // namespace

// The replaced operator new allocates with malloc and the replaced delete frees with free;
// g++ 12, inlining them, pairs the delete with the library's new and warns.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t /*n*/) noexcept { std::free(p); }

namespace sluice::bench {

std::uint64_t allocations_so_far() noexcept { return allocations.load(std::memory_order_relaxed); }

}  // namespace sluice::bench
