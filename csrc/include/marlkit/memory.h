// Transparent huge pages for large arrays read at random (replay storages).
//
// With 4 KiB pages every random row of a 100 MB buffer is a TLB miss and a page walk on top of
// the cache miss; with 2 MiB pages the whole buffer fits the TLB. Linux backs a region with
// huge pages when it is advised with madvise(MADV_HUGEPAGE) (the only way under the common
// "madvise" THP setting) and its pages are first touched after the advice. Measured on the
// replay benchmark's storage (10^6 rows of 37 floats, 4096 random rows gathered): 250 -> 193 us
// on 1 thread, 205 -> 150-163 us on 2.
//
// Memory from malloc is not always fresh: glibc serves a large block from a free chunk of its
// heap when one fits (seen in a long test run: a 64 MiB tensor inside [heap], every page already
// touched, no huge page), so map_huge_zeros maps its own region instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <stdexcept>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace marlkit {

constexpr std::size_t kHugePage = std::size_t{2} << 20;  // x86-64 and arm64 (4 KiB base pages)

// Advise the 2 MiB-aligned pages inside [address, address + nbytes) to be backed by huge
// pages. Returns the bytes advised: 0 where the range holds no whole huge page, off Linux, or
// when the kernel refuses (no THP support). Never fails: the advice only changes speed.
inline std::size_t advise_huge_pages(void* address, std::size_t nbytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const auto begin = reinterpret_cast<std::uintptr_t>(address);
  const std::uintptr_t first = (begin + kHugePage - 1) / kHugePage * kHugePage;
  const std::uintptr_t last = (begin + nbytes) / kHugePage * kHugePage;
  if (last <= first) {
    return 0;
  }
  const std::size_t length = last - first;
  return ::madvise(reinterpret_cast<void*>(first), length, MADV_HUGEPAGE) == 0 ? length : 0;
#else
  (void)address;
  (void)nbytes;
  return 0;
#endif
}

// A region of its own: [data, data + length) mapped by map_huge_zeros, released by
// unmap_region.
struct MappedRegion {
  void* data;
  std::size_t length;
};

// nbytes of zeroed memory in a fresh anonymous mapping whose start is 2 MiB-aligned, advised
// for huge pages before any page is touched, then faulted in (one write per base page, as
// torch.zeros would zero it), so every whole 2 MiB page of it can come as a huge page. The
// mapping is nbytes rounded up to the base page: the tail past the last whole huge page stays
// on base pages. Throws std::invalid_argument for nbytes == 0, std::bad_alloc when the kernel
// has no memory to map, std::runtime_error off Linux.
inline MappedRegion map_huge_zeros(std::size_t nbytes) {
  if (nbytes == 0) {
    throw std::invalid_argument("map_huge_zeros: nbytes must be > 0");
  }
#if defined(__linux__)
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t length = (nbytes + page - 1) / page * page;
  if (length < nbytes || length > SIZE_MAX - kHugePage) {
    throw std::bad_alloc();
  }
  // Map a huge page more than needed, then give back the unaligned head and the tail.
  const std::size_t mapped = length + kHugePage;
  void* base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    throw std::bad_alloc();
  }
  const auto begin = reinterpret_cast<std::uintptr_t>(base);
  const std::uintptr_t start = (begin + kHugePage - 1) / kHugePage * kHugePage;
  if (start > begin) {
    ::munmap(base, start - begin);
  }
  const std::uintptr_t end = start + length;
  if (begin + mapped > end) {
    ::munmap(reinterpret_cast<void*>(end), begin + mapped - end);
  }
  auto* data = reinterpret_cast<unsigned char*>(start);
  advise_huge_pages(data, length);
  for (std::size_t offset = 0; offset < length; offset += page) {
    reinterpret_cast<volatile unsigned char*>(data)[offset] = 0;  // fault it in
  }
  return MappedRegion{data, length};
#else
  throw std::runtime_error("map_huge_zeros: needs Linux");
#endif
}

inline void unmap_region(const MappedRegion& region) noexcept {
#if defined(__linux__)
  ::munmap(region.data, region.length);
#else
  (void)region;
#endif
}

}  // namespace marlkit
