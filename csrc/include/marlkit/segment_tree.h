// Segment trees for prioritized experience replay: a sum tree (sampling proportional to
// priority) and a min tree (the smallest priority, for importance weights).
//
// Header-only, no Python.
//
// Layout. Leaves are grouped in blocks of kBlock = 16 consecutive values (one cache line of
// floats, two of doubles; 64-byte aligned). Above the blocks sits a kArity-ary tree (16-ary),
// stored level by level in one aligned array:
//
//   level 0:       totals(0)[b] = block b's reduction;
//   level L >= 1:  node i has children i*kArity .. i*kArity + kArity - 1 of level L - 1;
//                  totals(L)[i] is its reduction and, in sum trees only, starts(L)[i*kArity + j]
//                  is the running sum of its children before child j (starts(L)[i*kArity] = 0).
//
// Each group of 16 siblings' totals is stored in "slot order" (slot_index) so that a node's
// running sums come from vertical SIMD additions (scan_node); starts are in plain order.
//
// The top level has one node, the root. A sum-tree descent reads one node (one 64-byte line in
// float32, two in float64) per level and compares the mass with all of its kArity running sums
// at once (a vectorized count, no dependency chain), then scans one leaf block: at capacity
// 10**6 in float32 that is 4 node lines and 1 leaf line instead of the ~17 of a binary tree.
// Memory: the leaves plus about 2 / (kBlock - 1) values per leaf for the nodes of a sum tree
// (1.13 values per leaf; 453 MB in float32 at capacity 10**8), half that for a min tree, which
// keeps no running sums.
//
// Padding (leaves past `capacity` in the last block, level entries past the last real child)
// holds the operation's neutral element (0 for sums, +inf for minima), so the root is always the
// reduction over [0, capacity).
//
// Every batched entry point validates the whole batch before it writes or returns anything,
// so a bad batch leaves the tree untouched. Errors are std::out_of_range (a bad index) and
// std::invalid_argument (a bad value), whose messages name the offending value, its position
// in the batch and what was expected.
//
// Thread safety: const methods may run concurrently with each other; `update` must not run
// concurrently with anything else on the same tree (the bindings hold a shared mutex for that).
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "marlkit/common.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace marlkit {

enum class SegmentOp { kSum, kMin };

namespace segment_tree_detail {

// Shortest decimal text that reads back as the same value, as Python's repr writes it
// ("0.1", "-2.5", "1e-05", "inf", "nan"), for error messages.
template <typename T>
std::string format_value(T value) {
  if (std::isnan(value)) {
    return "nan";
  }
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  std::string text(buffer, result.ptr);
  if (text.find_first_of(".eni") == std::string::npos) {
    text += ".0";  // integral values read "3.0", as in Python
  }
  return text;
}

constexpr std::size_t kCacheLine = 64;

// Frees memory from the cache-line-aligned operator new[].
struct AlignedDelete {
  void operator()(void* p) const { ::operator delete[](p, std::align_val_t{kCacheLine}); }
};

template <typename T>
std::unique_ptr<T[], AlignedDelete> aligned_array(std::int64_t n) {
  void* raw = ::operator new[](static_cast<std::size_t>(n) * sizeof(T),
                               std::align_val_t{kCacheLine});
  return std::unique_ptr<T[], AlignedDelete>(static_cast<T*>(raw));
}

inline void prefetch(const void* address) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(address);
#else
  (void)address;
#endif
}

inline void prefetch_for_write(void* address) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(address, 1);
#else
  (void)address;
#endif
}

// Number of j in [0, 16) with values[j] <= limit, where values is non-decreasing: then the
// comparisons that hold are a run from j = 0, and the count is the first j with values[j] >
// limit (16 when there is none). With SSE2 (every x86-64 CPU) the 16 comparisons are packed
// compares whose masks are narrowed to one byte each (saturating packs keep 0 and -1) and read
// as one 16-bit mask, whose trailing ones are counted. Elsewhere a branch-free scalar loop.
template <typename T>
std::int64_t count_at_most_16(const T* values, T limit) {
#if defined(__SSE2__)
  std::uint32_t mask;
  if constexpr (std::is_same<T, float>::value) {
    const __m128 probe = _mm_set1_ps(limit);
    auto le = [&](int j) {
      return _mm_castps_si128(_mm_cmple_ps(_mm_loadu_ps(values + j), probe));
    };
    const __m128i low = _mm_packs_epi32(le(0), le(4));
    const __m128i high = _mm_packs_epi32(le(8), le(12));
    mask = static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_packs_epi16(low, high)));
  } else {
    const __m128d probe = _mm_set1_pd(limit);
    auto le = [&](int j) {
      return _mm_castpd_si128(_mm_cmple_pd(_mm_loadu_pd(values + j), probe));
    };
    // A double's 64-bit mask is two 32-bit halves: after the packs each comparison owns two
    // adjacent bits of the 32-bit mask.
    const __m128i a = _mm_packs_epi16(_mm_packs_epi32(le(0), le(2)), _mm_packs_epi32(le(4), le(6)));
    const __m128i b =
        _mm_packs_epi16(_mm_packs_epi32(le(8), le(10)), _mm_packs_epi32(le(12), le(14)));
    const std::uint64_t pairs = static_cast<std::uint32_t>(_mm_movemask_epi8(a)) |
                                static_cast<std::uint64_t>(_mm_movemask_epi8(b)) << 16;
    return static_cast<std::int64_t>(__builtin_ctzll(~pairs) >> 1);  // bit 32 of ~pairs is set
  }
  return static_cast<std::int64_t>(__builtin_ctz(~mask));  // bit 16 of ~mask is set
#else
  std::int32_t count = 0;
  for (int j = 0; j < 16; ++j) {
    count += static_cast<std::int32_t>(values[j] <= limit);
  }
  return count;
#endif
}

}  // namespace segment_tree_detail

template <typename T, SegmentOp Op>
class SegmentTree {
  static_assert(std::is_floating_point<T>::value, "SegmentTree holds float or double values");

 public:
  using value_type = T;

  // Largest capacity accepted (the bound).
  static constexpr std::int64_t kMaxCapacity = 100'000'000;
  // Leaves per block: one cache line of floats, two of doubles.
  static constexpr std::int64_t kBlock = 16;
  // Values per cache line (16 floats, 8 doubles) and cache lines per block (1 or 2).
  static constexpr std::int64_t kLineValues =
      static_cast<std::int64_t>(segment_tree_detail::kCacheLine / sizeof(T));
  static constexpr std::int64_t kBlockLines = kBlock / kLineValues;
  // Children per node (count_at_most_16 compares a node's 16 running sums at once).
  static constexpr std::int64_t kArity = 16;
  static constexpr int kArityShift = 4;
  // Batches below this many queries per thread run scan_lower_bound on the calling thread.
  static constexpr std::int64_t kScanMinPerThread = 8192;
  // Queries per task of a multi-threaded scan, taken by whichever thread is free.
  static constexpr std::int64_t kScanPerTask = 256;
  // Queries descended together by one thread (their cache misses overlap).
  static constexpr std::int64_t kScanGroup = 16;
  // update() recomputes a whole level when it has at most this many nodes per batch item.
  static constexpr std::int64_t kFullLevelFactor = 2;
  // update() prefetches the leaf and block total this many items ahead.
  static constexpr std::int64_t kPrefetchDistance = 16;
  // update() refolds an item's block this many items after writing its leaf.
  static constexpr std::int64_t kFoldLag = 8;

  // The neutral element, and the value of every leaf that was never written.
  static constexpr T neutral() {
    return Op == SegmentOp::kSum ? T(0) : std::numeric_limits<T>::infinity();
  }

  explicit SegmentTree(std::int64_t capacity) : capacity_(checked_capacity(capacity)) {
    const std::int64_t num_blocks = (capacity_ + kBlock - 1) / kBlock;
    count_[0] = num_blocks;
    while ((std::int64_t{1} << span_shift_[0]) < kBlock) {
      ++span_shift_[0];
    }
    std::int64_t size = round_up(num_blocks);  // totals(0), padded
    do {
      ++top_;
      count_[top_] = (count_[top_ - 1] + kArity - 1) / kArity;
      span_shift_[top_] = span_shift_[top_ - 1] + kArityShift;
      if constexpr (Op == SegmentOp::kSum) {
        starts_offset_[top_] = size;
        size += count_[top_] * kArity;
      }
      totals_offset_[top_] = size;
      size += round_up(count_[top_]);
    } while (count_[top_] > 1);
    nodes_size_ = size;
    leaves_ = segment_tree_detail::aligned_array<T>(num_blocks * kBlock);
    std::fill_n(leaves_.get(), num_blocks * kBlock, neutral());
    nodes_ = segment_tree_detail::aligned_array<T>(nodes_size_);
    std::fill_n(nodes_.get(), nodes_size_, neutral());
    if constexpr (Op == SegmentOp::kSum) {
      for (int level = 1; level <= top_; ++level) {
        refresh(level, count_[level] - 1);  // the starts of padding children: +inf
      }
    }
  }

  std::int64_t capacity() const { return capacity_; }
  // Bytes held by the leaves and the nodes.
  std::int64_t nbytes() const {
    return (count_[0] * kBlock + nodes_size_) * static_cast<std::int64_t>(sizeof(T));
  }

  // The reduction over the whole tree: sum or min of [0, capacity).
  T reduce_all() const { return totals(top_)[0]; }

  // Check one batch of indices against [0, capacity) without touching the tree.
  void check_indices(const std::int64_t* indices, std::int64_t n) const {
    // A branch-free pass first (vectorized), the search only on failure: an index i is valid
    // when neither i nor (capacity - 1) - i, both as unsigned 64-bit, has its top bit set.
    const auto last = static_cast<std::uint64_t>(capacity_ - 1);
    std::uint64_t bits = 0;
    for (std::int64_t b = 0; b < n; ++b) {
      const auto i = static_cast<std::uint64_t>(indices[b]);
      bits |= i | (last - i);
    }
    if ((bits >> 63) == 0) {
      return;
    }
    for (std::int64_t b = 0; b < n; ++b) {
      const std::int64_t i = indices[b];
      if (i < 0 || i >= capacity_) {
        throw std::out_of_range("index " + std::to_string(i) + " at position " +
                                std::to_string(b) +
                                " is out of range for a segment tree of capacity " +
                                std::to_string(capacity_) + " (expected 0 <= index < " +
                                std::to_string(capacity_) + ")");
      }
    }
  }

  // Branch-free (vectorized): false for any NaN, infinity or negative value (-0.0 is valid).
  static bool all_finite_nonnegative(const T* values, std::int64_t n) {
    std::int64_t b = 0;
    int invalid = 0;
#if defined(__SSE2__)
    if constexpr (std::is_same<T, float>::value) {
      const __m128 zero = _mm_setzero_ps();
      const __m128 max = _mm_set1_ps(std::numeric_limits<float>::max());
      __m128 ok = _mm_castsi128_ps(_mm_set1_epi32(-1));
      for (; b + 4 <= n; b += 4) {
        const __m128 v = _mm_loadu_ps(values + b);
        ok = _mm_and_ps(ok, _mm_and_ps(_mm_cmpge_ps(v, zero), _mm_cmple_ps(v, max)));
      }
      invalid = _mm_movemask_ps(ok) != 0xF;
    } else {
      const __m128d zero = _mm_setzero_pd();
      const __m128d max = _mm_set1_pd(std::numeric_limits<double>::max());
      __m128d ok = _mm_castsi128_pd(_mm_set1_epi32(-1));
      for (; b + 2 <= n; b += 2) {
        const __m128d v = _mm_loadu_pd(values + b);
        ok = _mm_and_pd(ok, _mm_and_pd(_mm_cmpge_pd(v, zero), _mm_cmple_pd(v, max)));
      }
      invalid = _mm_movemask_pd(ok) != 0x3;
    }
#endif
    for (; b < n; ++b) {
      invalid |= !((values[b] >= T(0)) & (values[b] <= std::numeric_limits<T>::max()));
    }
    return invalid == 0;
  }

  // Check one batch of priorities: each must be finite and >= 0.
  static void check_priorities(const T* values, std::int64_t n) {
    if (all_finite_nonnegative(values, n)) {
      return;
    }
    for (std::int64_t b = 0; b < n; ++b) {
      const T v = values[b];
      if (!(v >= T(0)) || !std::isfinite(v)) {
        throw std::invalid_argument("priority " + segment_tree_detail::format_value(v) +
                                    " at position " + std::to_string(b) +
                                    " is invalid: priorities must be finite and >= 0");
      }
    }
  }

  // Set leaf indices[b] to values[b] for b in [0, n), in order (a repeated index keeps the last
  // value written). Validates the whole batch first; writes nothing on error.
  //
  // Level by level, bottom up: each item writes its leaf and refolds its block, then, level after
  // level, each item recomputes its ancestor node there from that node's children, all final by
  // then. A level with at most kFullLevelFactor * n nodes is recomputed whole instead, in one
  // sequential pass (cheaper than n scattered visits); so are the levels above it. A block or
  // node shared by several items is recomputed by each, always to the same final value.
  // O(n (kBlock + kArity log(blocks / n)) + min(n kArity, blocks)).
  void update(const std::int64_t* indices, const T* values, std::int64_t n) {
    check_indices(indices, n);
    check_priorities(values, n);
    if (n == 0) {
      return;
    }
    T* const leaves = leaves_.get();
    T* const block_totals = totals(0);
    bool whole = count_[0] <= kFullLevelFactor * n;
    if (whole) {
      for (std::int64_t b = 0; b < n; ++b) {
        leaves[indices[b]] = values[b];
      }
      for (std::int64_t block = 0; block < count_[0]; ++block) {
        block_totals[slot_index(block)] = fold_block(block);
      }
    } else {
      // Item b's block is refolded kFoldLag items after its leaf is written: a vector load
      // right after a scalar store into it would stall (no store forwarding).
      for (std::int64_t b = 0; b < n + kFoldLag; ++b) {
        if (b + kPrefetchDistance < n) {
          const std::int64_t ahead = block_of(indices[b + kPrefetchDistance]);
          for (std::int64_t line = 0; line < kBlockLines; ++line) {
            segment_tree_detail::prefetch_for_write(leaves + ahead * kBlock + line * kLineValues);
          }
          segment_tree_detail::prefetch_for_write(block_totals + slot_index(ahead));
        }
        if (b < n) {
          leaves[indices[b]] = values[b];
        }
        if (b >= kFoldLag) {
          const std::int64_t block = block_of(indices[b - kFoldLag]);
          block_totals[slot_index(block)] = fold_block(block);
        }
      }
    }
    for (int level = 1; level <= top_; ++level) {
      whole = whole || count_[level] <= kFullLevelFactor * n;
      if (whole) {
        for (std::int64_t node = 0; node < count_[level]; ++node) {
          refresh(level, node);
        }
        continue;
      }
      const int shift = span_shift_[level];  // spans are powers of 2
      for (std::int64_t b = 0; b < n; ++b) {
        if (b + kPrefetchDistance < n) {
          const std::int64_t ahead = indices[b + kPrefetchDistance] >> shift;
          segment_tree_detail::prefetch(totals(level - 1) + ahead * kArity);
          if constexpr (Op == SegmentOp::kSum) {
            segment_tree_detail::prefetch_for_write(starts(level) + ahead * kArity);
          }
        }
        refresh(level, indices[b] >> shift);
      }
    }
  }

  // out[b] = value of leaf indices[b]. Validates every index first.
  void get(const std::int64_t* indices, T* out, std::int64_t n) const {
    check_indices(indices, n);
    const T* const leaves = leaves_.get();
    for (std::int64_t b = 0; b < n; ++b) {
      out[b] = leaves[indices[b]];
    }
  }

  // Reduction (sum or min) over leaves [start, end), end exclusive.
  // O(kBlock + kArity log capacity).
  T query(std::int64_t start, std::int64_t end) const {
    if (start < 0 || start >= capacity_) {
      throw std::out_of_range("query start " + std::to_string(start) +
                              " is out of range for a segment tree of capacity " +
                              std::to_string(capacity_) + " (expected 0 <= start < " +
                              std::to_string(capacity_) + ")");
    }
    if (end < 1 || end > capacity_) {
      throw std::out_of_range("query end " + std::to_string(end) +
                              " is out of range for a segment tree of capacity " +
                              std::to_string(capacity_) + " (expected 0 < end <= " +
                              std::to_string(capacity_) + ", end exclusive)");
    }
    if (start >= end) {
      throw std::invalid_argument("query range [" + std::to_string(start) + ", " +
                                  std::to_string(end) +
                                  ") is empty: expected start < end (end is exclusive)");
    }
    if (start == 0 && end == capacity_) {
      return reduce_all();
    }
    const std::int64_t first_block = start / kBlock;
    const std::int64_t last_block = (end - 1) / kBlock;
    if (first_block == last_block) {
      return fold_leaves(start, end);
    }
    // Partial first block, whole blocks between (through the levels), partial last block.
    T left = fold_leaves(start, (first_block + 1) * kBlock);
    T right = fold_leaves(last_block * kBlock, end);
    std::int64_t lo = first_block + 1;  // entries [lo, hi) of the current level are covered
    std::int64_t hi = last_block;
    for (int level = 0; lo < hi; ++level) {
      const T* const t = totals(level);
      const std::int64_t lo_up = std::min(round_up(lo), hi);
      const std::int64_t hi_down = std::max(hi / kArity * kArity, lo_up);
      for (std::int64_t i = lo; i < lo_up; ++i) {
        left = combine(left, t[slot_index(i)]);
      }
      for (std::int64_t i = hi; i > hi_down; --i) {
        right = combine(t[slot_index(i - 1)], right);
      }
      lo = lo_up / kArity;
      hi = hi_down / kArity;
    }
    return combine(left, right);
  }

  // Sum trees only. For each mass v = values[b], out[b] is the smallest index i such that
  // prefix_sum(0..i inclusive) > v, i.e. prefix_sum(0..i-1) <= v < prefix_sum(0..i); such an i
  // always has a nonzero priority. Masses v >= total() (no such i; reached by rounding in
  // u * total()) give the last index with a nonzero priority. Prefix sums are the tree's own:
  // the nodes' running sums along the path, then a running sum inside the block. Requires every
  // v finite and >= 0 (std::invalid_argument otherwise) and total() > 0 when n > 0. Validates
  // the whole batch before any work. O(n (kArity log capacity + kBlock)), split over threads
  // for large batches.
  template <SegmentOp O = Op, typename = std::enable_if_t<O == SegmentOp::kSum>>
  void scan_lower_bound(const T* values, std::int64_t* out, std::int64_t n) const {
    check_masses(values, n);
    if (n == 0) {
      return;
    }
    const T total = reduce_all();
    if (!(total > T(0))) {
      throw std::invalid_argument(
          "scan_lower_bound needs a positive total priority, but the tree's total is " +
          segment_tree_detail::format_value(total) + " (every priority is zero)");
    }
    if (n < 2 * kScanMinPerThread) {
      scan_range(values, out, 0, n, total);  // one thread in any case: skip the pool's setup
      return;
    }
    auto scan = [&](std::int64_t begin, std::int64_t end) {
      scan_range(values, out, begin, end, total);
    };
    parallel_for_chunks(n, kScanMinPerThread, kScanPerTask, scan);
  }

 private:
  // Levels above the blocks: 6 suffice for 10**8 leaves in 16-leaf blocks (16**6 > 6.25e6),
  // 7 for 8-leaf blocks.
  static constexpr int kMaxLevels = 8;

  static std::int64_t checked_capacity(std::int64_t capacity) {
    if (capacity < 1 || capacity > kMaxCapacity) {
      throw std::invalid_argument("segment tree capacity must be in [1, " +
                                  std::to_string(kMaxCapacity) + "], got " +
                                  std::to_string(capacity));
    }
    return capacity;
  }

  static std::int64_t round_up(std::int64_t n) { return (n + kArity - 1) / kArity * kArity; }

  // Position of child j (0..15) in its node's 16 values: slot order puts children i, 4 + i,
  // 8 + i, 12 + i side by side (one SIMD vector per position within a group of 4), so that a
  // node is scanned with vertical additions (scan_node).
  static std::int64_t slot(std::int64_t j) { return (j & 3) << 2 | j >> 2; }
  // Position of entry i of a level's totals (groups of 16 siblings in slot order).
  static std::int64_t slot_index(std::int64_t i) { return (i & ~std::int64_t{15}) | slot(i & 15); }

  // The block of a valid (non-negative) leaf index: a shift.
  static std::int64_t block_of(std::int64_t index) {
    return static_cast<std::int64_t>(static_cast<std::uint64_t>(index) / kBlock);
  }

  static T combine(T a, T b) {
    if constexpr (Op == SegmentOp::kSum) {
      return a + b;
    } else {
      return b < a ? b : a;
    }
  }

  // Level L's node reductions (L = 0: the block totals), padded to a multiple of kArity.
  T* totals(int level) { return nodes_.get() + totals_offset_[level]; }
  const T* totals(int level) const { return nodes_.get() + totals_offset_[level]; }
  // Sum trees, level L >= 1: per node, the running sums of its children before each child.
  T* starts(int level) { return nodes_.get() + starts_offset_[level]; }
  const T* starts(int level) const { return nodes_.get() + starts_offset_[level]; }

  // Recompute node `node` of `level` >= 1 from its children's totals (in slot order).
  void refresh(int level, std::int64_t node) {
    const T* const child = totals(level - 1) + node * kArity;
    T* const total = totals(level) + slot_index(node);
    if constexpr (Op == SegmentOp::kSum) {
      T* const start = starts(level) + node * kArity;
      *total = scan_node(child, start);
      const std::int64_t real = count_[level - 1] - node * kArity;  // children that exist
      for (std::int64_t j = real; j < kArity; ++j) {
        start[j] = std::numeric_limits<T>::infinity();  // never taken by a descent
      }
    } else {
      T acc = child[0];
      for (std::int64_t j = 1; j < kArity; ++j) {
        acc = combine(acc, child[j]);  // min: any order is exact
      }
      *total = acc;
    }
  }

  // A node's starts from its 16 child totals, both in slot order (vector i of 4 slots holds
  // children i, 4 + i, 8 + i, 12 + i: one per group of 4 consecutive children). Blocked
  // running sums: E_i = c[4k] + ... + c[4k + i - 1] within group k (E_0 = 0) and the group's
  // total G_k = E_4, added left to right; P_k = G_0 + ... + G_(k-1), left to right; the start
  // of child 4k + i is P_k + E_i and the node's total P_3 + G_3 (returned). Each start is the
  // previous one plus one non-negative term, in floating point: the starts never decrease, and
  // a child of sum 0 starts where the next child starts (or the node's total). SSE2 and the
  // scalar loop give the same bits.
  static T scan_node(const T* child, T* start) {
#if defined(__SSE2__)
    if constexpr (std::is_same<T, float>::value) {
      const __m128 e1 = _mm_loadu_ps(child);
      const __m128 e2 = _mm_add_ps(e1, _mm_loadu_ps(child + 4));
      const __m128 e3 = _mm_add_ps(e2, _mm_loadu_ps(child + 8));
      const __m128 g = _mm_add_ps(e3, _mm_loadu_ps(child + 12));
      auto shift_up = [](__m128 x) {  // [x0, x1, x2, x3] -> [0, x0, x1, x2]
        return _mm_castsi128_ps(_mm_slli_si128(_mm_castps_si128(x), 4));
      };
      const __m128 a = shift_up(g);                    // [0, g0, g1, g2]
      const __m128 b = _mm_add_ps(a, shift_up(a));     // [0, g0, g1 + g0, g2 + g1]
      const __m128 p = _mm_add_ps(a, shift_up(b));     // [0, g0, g1 + g0, g2 + (g1 + g0)]
      __m128 s0 = p;  // s_i: the starts of children i, 4 + i, 8 + i, 12 + i
      __m128 s1 = _mm_add_ps(p, e1);
      __m128 s2 = _mm_add_ps(p, e2);
      __m128 s3 = _mm_add_ps(p, e3);
      _MM_TRANSPOSE4_PS(s0, s1, s2, s3);  // now s_k: the starts of children 4k .. 4k + 3
      _mm_storeu_ps(start, s0);
      _mm_storeu_ps(start + 4, s1);
      _mm_storeu_ps(start + 8, s2);
      _mm_storeu_ps(start + 12, s3);
      const __m128 last = _mm_add_ss(_mm_shuffle_ps(p, p, 3), _mm_shuffle_ps(g, g, 3));
      return _mm_cvtss_f32(last);
    } else {
      __m128d e1[2], e2[2], e3[2], g[2];
      for (int h = 0; h < 2; ++h) {  // h = 0: groups 0 and 1; h = 1: groups 2 and 3
        e1[h] = _mm_loadu_pd(child + 2 * h);
        e2[h] = _mm_add_pd(e1[h], _mm_loadu_pd(child + 4 + 2 * h));
        e3[h] = _mm_add_pd(e2[h], _mm_loadu_pd(child + 8 + 2 * h));
        g[h] = _mm_add_pd(e3[h], _mm_loadu_pd(child + 12 + 2 * h));
      }
      const __m128d p2 = _mm_add_sd(g[0], _mm_unpackhi_pd(g[0], g[0]));  // g0 + g1
      const __m128d p3 = _mm_add_sd(p2, g[1]);                           // (g0 + g1) + g2
      const __m128d p[2] = {_mm_unpacklo_pd(_mm_setzero_pd(), g[0]), _mm_unpacklo_pd(p2, p3)};
      for (int h = 0; h < 2; ++h) {  // groups 2h and 2h + 1, children 8h .. 8h + 7
        const __m128d s0 = p[h];
        const __m128d s1 = _mm_add_pd(p[h], e1[h]);
        const __m128d s2 = _mm_add_pd(p[h], e2[h]);
        const __m128d s3 = _mm_add_pd(p[h], e3[h]);
        _mm_storeu_pd(start + 8 * h, _mm_unpacklo_pd(s0, s1));
        _mm_storeu_pd(start + 8 * h + 2, _mm_unpacklo_pd(s2, s3));
        _mm_storeu_pd(start + 8 * h + 4, _mm_unpackhi_pd(s0, s1));
        _mm_storeu_pd(start + 8 * h + 6, _mm_unpackhi_pd(s2, s3));
      }
      return _mm_cvtsd_f64(_mm_add_sd(p3, _mm_unpackhi_pd(g[1], g[1])));
    }
#else
    T offset = T(0);  // P_k
    for (int k = 0; k < 4; ++k) {
      T running = T(0);  // E_i
      for (int i = 0; i < 4; ++i) {
        start[4 * k + i] = offset + running;
        running += child[4 * i + k];
      }
      offset = offset + running;
    }
    return offset;
#endif
  }

  // Reduction of leaves [begin, end), folded in index order.
  T fold_leaves(std::int64_t begin, std::int64_t end) const {
    const T* const leaves = leaves_.get();
    T acc = neutral();
    for (std::int64_t i = begin; i < end; ++i) {
      acc = combine(acc, leaves[i]);
    }
    return acc;
  }

  // A block's total (sums: added pairwise, 4 or 2 lanes at a time; minima: any order is
  // exact). A sum may differ in the last bits from the running sum of a block scan; the scans
  // never rely on the two being equal (a mass at or past the running total is redone carefully).
  T fold_block(std::int64_t block) const {
    const T* const leaf = leaves_.get() + block * kBlock;
#if defined(__SSE2__)
    if constexpr (Op == SegmentOp::kSum && std::is_same<T, float>::value) {
      const __m128 a = _mm_add_ps(_mm_load_ps(leaf), _mm_load_ps(leaf + 4));
      const __m128 b = _mm_add_ps(_mm_load_ps(leaf + 8), _mm_load_ps(leaf + 12));
      __m128 sum = _mm_add_ps(a, b);
      sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
      return _mm_cvtss_f32(_mm_add_ss(sum, _mm_shuffle_ps(sum, sum, 1)));
    } else if constexpr (Op == SegmentOp::kSum) {
      auto pair = [&](int i) { return _mm_add_pd(_mm_load_pd(leaf + i), _mm_load_pd(leaf + i + 2)); };
      const __m128d sum =
          _mm_add_pd(_mm_add_pd(pair(0), pair(4)), _mm_add_pd(pair(8), pair(12)));
      return _mm_cvtsd_f64(_mm_add_sd(sum, _mm_unpackhi_pd(sum, sum)));
    }
#endif
    T acc = leaf[0];
    for (std::int64_t i = 1; i < kBlock; ++i) {
      acc = combine(acc, leaf[i]);
    }
    return acc;
  }


  static void check_masses(const T* values, std::int64_t n) {
    if (all_finite_nonnegative(values, n)) {
      return;
    }
    for (std::int64_t b = 0; b < n; ++b) {
      const T v = values[b];
      if (!(v >= T(0)) || !std::isfinite(v)) {
        throw std::invalid_argument("prefix-sum value " + segment_tree_detail::format_value(v) +
                                    " at position " + std::to_string(b) +
                                    " is invalid: expected a finite value >= 0");
      }
    }
  }

  // Descends for queries [begin, end), kScanGroup of them interleaved level by level so that
  // their cache misses overlap (each next node, then the leaf block, prefetched).
  //
  // The fast descent, per level: the node's starts s[0] = 0 <= s[1] <= ... <= s[15] (the
  // running sum before each child; +inf for children past the end of the level) are compared
  // with the mass m < total at once; the child is the last j with s[j] <= m, and m -= s[j].
  // For j < 15 that child has a positive sum (s[j + 1] > m >= s[j]). Only through rounding can
  // m reach a node's total; the descent may then end in a block of sum 0, or with a mass at or
  // past its block's total. Those few queries (the block scan reports them), and masses
  // v >= total, are settled by descend_careful().
  void scan_range(const T* values, std::int64_t* out, std::int64_t begin, std::int64_t end,
                  T total) const {
    const T* const leaves = leaves_.get();
    constexpr std::int64_t kNodeLines = kArity / kLineValues;
    for (std::int64_t g = begin; g < end; g += kScanGroup) {
      const std::int64_t m = std::min(kScanGroup, end - g);
      T mass[kScanGroup];
      std::int64_t node[kScanGroup];
      for (std::int64_t j = 0; j < m; ++j) {
        mass[j] = values[g + j] < total ? values[g + j] : T(0);  // v >= total: careful
        node[j] = 0;
      }
      for (int level = top_; level >= 1; --level) {
        const T* const start = starts(level);
        for (std::int64_t j = 0; j < m; ++j) {
          const T* const s = start + node[j] * kArity;
          const std::int64_t c = segment_tree_detail::count_at_most_16(s, mass[j]) - 1;
          mass[j] -= s[c];
          node[j] = node[j] * kArity + c;
          if (level > 1) {
            const T* const next = starts(level - 1) + node[j] * kArity;
            for (std::int64_t line = 0; line < kNodeLines; ++line) {
              segment_tree_detail::prefetch(next + line * kLineValues);
            }
          } else {
            for (std::int64_t line = 0; line < kBlockLines; ++line) {
              segment_tree_detail::prefetch(leaves + node[j] * kBlock + line * kLineValues);
            }
          }
        }
      }
      for (std::int64_t j = 0; j < m; ++j) {
        const T v = values[g + j];
        const std::int64_t found = scan_block(node[j], mass[j]);
        out[g + j] = found >= 0 && v < total ? found : descend_careful(v, total);
      }
    }
  }

  // In block `block`: the first leaf whose running sum exceeds the mass (it has a nonzero
  // priority), or -1 when the mass reaches the block's total (no such leaf).
  std::int64_t scan_block(std::int64_t block, T mass) const {
    const T* const leaf = leaves_.get() + block * kBlock;
    T acc = T(0);
    std::int64_t below = 0;  // leaves whose running sum is <= mass
    for (std::int64_t i = 0; i < kBlock; ++i) {
      acc += leaf[i];
      below += static_cast<std::int64_t>(acc <= mass);
    }
    return below < kBlock ? block * kBlock + below : -1;
  }

  // Among n running sums running(0) <= ... <= running(n - 1) (the last, positive, is the
  // total): the first j with running(j) > mass or, when there is none, the first j with
  // running(j) == total, the last position with a positive increment. Either way
  // running(j) > running(j - 1) (or j = 0 and running(0) > 0).
  template <typename Running>
  static std::int64_t careful_pick(std::int64_t n, T mass, Running running) {
    std::int64_t j = 0;
    while (j < n - 1 && !(running(j) > mass)) {
      ++j;
    }
    if (running(j) > mass) {
      return j;
    }
    const T last = running(n - 1);
    j = 0;
    while (running(j) < last) {
      ++j;
    }
    return j;
  }

  // One query, careful rule at every level (careful_pick), through nodes and a block of
  // positive sum only: the index the fast descent could not settle. A mass v >= total becomes
  // +inf, which careful_pick sends to the last child with a positive sum at every level.
  std::int64_t descend_careful(T v, T total) const {
    T mass = v >= total ? std::numeric_limits<T>::infinity() : v;
    std::int64_t node = 0;
    for (int level = top_; level >= 1; --level) {
      const T* const s = starts(level) + node * kArity;
      const T node_total = totals(level)[slot_index(node)];
      // The running sum after child j: the next start, the node's total for the last child
      // that exists (past the end of a level, starts are +inf).
      const std::int64_t c = careful_pick(kArity, mass, [&](std::int64_t j) {
        return j + 1 < kArity ? std::min(s[j + 1], node_total) : node_total;
      });
      mass -= s[c];
      node = node * kArity + c;
    }
    const T* const leaf = leaves_.get() + node * kBlock;
    T running[kBlock];
    T acc = T(0);
    for (std::int64_t i = 0; i < kBlock; ++i) {
      acc += leaf[i];
      running[i] = acc;
    }
    return node * kBlock +
           careful_pick(kBlock, mass, [&](std::int64_t i) { return running[i]; });
  }

  std::int64_t capacity_;
  int top_ = 0;                                       // the root's level
  std::array<std::int64_t, kMaxLevels + 1> count_{};  // nodes per level (level 0: blocks)
  std::array<int, kMaxLevels + 1> span_shift_{};      // log2(leaves under one node), per level
  std::array<std::int64_t, kMaxLevels + 1> starts_offset_{};
  std::array<std::int64_t, kMaxLevels + 1> totals_offset_{};
  std::int64_t nodes_size_ = 0;
  std::unique_ptr<T[], segment_tree_detail::AlignedDelete> leaves_;
  std::unique_ptr<T[], segment_tree_detail::AlignedDelete> nodes_;
};

template <typename T>
using SumSegmentTree = SegmentTree<T, SegmentOp::kSum>;
template <typename T>
using MinSegmentTree = SegmentTree<T, SegmentOp::kMin>;

}  // namespace marlkit
