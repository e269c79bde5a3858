// Segment trees for prioritized experience replay: a sum tree (sampling proportional to
// priority) and a min tree (the smallest priority, for importance weights).
//
// Header-only, no Python.
//
// Layout. Leaves are grouped in blocks of kBlock = 64 / sizeof(T) consecutive values (16 floats
// or 8 doubles: one cache line, 64-byte aligned). A complete binary tree is built over the
// blocks only: `size = next_pow2(num_blocks)` tree leaves, stored breadth-first in one array of
// 2 * size values (node 1 is the root, node k has children 2k and 2k+1, block b's node is
// size + b; slot 0 is unused). A block's node holds the reduction of its kBlock leaves folded
// in index order. Versus a tree over single leaves, this removes the log2(kBlock) bottom levels
// (whose nodes are the cache misses), and the tree part becomes small enough to stay in cache:
// a descent costs one cache miss for the leaf block instead of several. Memory:
// num_blocks * kBlock leaves + 2 * next_pow2(num_blocks) nodes: 1.125 to 1.25 values per leaf
// in float32, 1.25 to 1.5 in float64 (445 MiB in float32 at capacity 10^8).
//
// Padding (leaves past `capacity` in the last block, tree leaves past num_blocks) holds the
// operation's neutral element (0 for sums, +inf for minima), so the root is always the
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
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "marlkit/common.h"

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

inline std::int64_t next_pow2(std::int64_t n) {
  std::int64_t p = 1;
  while (p < n) {
    p <<= 1;
  }
  return p;
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

}  // namespace segment_tree_detail

template <typename T, SegmentOp Op>
class SegmentTree {
  static_assert(std::is_floating_point<T>::value, "SegmentTree holds float or double values");

 public:
  using value_type = T;

  // Largest capacity accepted (the bound).
  static constexpr std::int64_t kMaxCapacity = 100'000'000;
  // Leaves per block: one cache line.
  static constexpr std::int64_t kBlock =
      static_cast<std::int64_t>(segment_tree_detail::kCacheLine / sizeof(T));
  // Batches below this many queries per thread run scan_lower_bound on the calling thread.
  static constexpr std::int64_t kScanMinPerThread = 4096;
  // Queries descended together by one thread (their cache misses overlap).
  static constexpr std::int64_t kScanGroup = 16;
  // update() recomputes a whole level when it has at most this many nodes per batch item.
  static constexpr std::int64_t kFullLevelFactor = 2;
  // update() prefetches the leaf and block node this many items ahead.
  static constexpr std::int64_t kPrefetchDistance = 16;

  // The neutral element, and the value of every leaf that was never written.
  static constexpr T neutral() {
    return Op == SegmentOp::kSum ? T(0) : std::numeric_limits<T>::infinity();
  }

  explicit SegmentTree(std::int64_t capacity) : capacity_(checked_capacity(capacity)) {
    num_blocks_ = (capacity_ + kBlock - 1) / kBlock;
    size_ = segment_tree_detail::next_pow2(num_blocks_);
    while ((std::int64_t{1} << depth_) < size_) {
      ++depth_;
    }
    leaves_ = segment_tree_detail::aligned_array<T>(num_blocks_ * kBlock);
    std::fill_n(leaves_.get(), num_blocks_ * kBlock, neutral());
    nodes_.assign(static_cast<std::size_t>(2 * size_), neutral());
  }

  std::int64_t capacity() const { return capacity_; }
  // Bytes held by the leaves and the nodes.
  std::int64_t nbytes() const {
    return static_cast<std::int64_t>((static_cast<std::size_t>(num_blocks_ * kBlock) +
                                      nodes_.size()) *
                                     sizeof(T));
  }

  // The reduction over the whole tree: sum or min of [0, capacity).
  T reduce_all() const { return nodes_[1]; }

  // Check one batch of indices against [0, capacity) without touching the tree.
  void check_indices(const std::int64_t* indices, std::int64_t n) const {
    bool all_valid = true;  // a branch-free pass first (vectorized), the search only on failure
    for (std::int64_t b = 0; b < n; ++b) {
      all_valid &= static_cast<std::uint64_t>(indices[b]) < static_cast<std::uint64_t>(capacity_);
    }
    if (all_valid) {
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
  // The top levels of the tree, those with at most kFullLevelFactor * n nodes, are recomputed
  // whole at the end (a sequential pass, cheaper than n scattered visits). Below them each item
  // in turn writes its leaf, refolds its block and recomputes its ancestors, so a block or
  // node shared by several items is last recomputed by the last of them, from final children.
  // When the batch covers most blocks, every block is refolded in one sequential pass instead.
  // O(n (kBlock + log(blocks / n)) + min(n, blocks)).
  void update(const std::int64_t* indices, const T* values, std::int64_t n) {
    check_indices(indices, n);
    check_priorities(values, n);
    if (n == 0) {
      return;
    }
    T* const leaves = leaves_.get();
    T* const t = nodes_.data();
    int full_levels = 0;  // levels [0, full_levels) are recomputed whole
    while (full_levels < depth_ && (std::int64_t{1} << full_levels) <= kFullLevelFactor * n) {
      ++full_levels;
    }
    if (num_blocks_ <= kFullLevelFactor * n) {
      for (std::int64_t b = 0; b < n; ++b) {
        leaves[indices[b]] = values[b];
      }
      for (std::int64_t block = 0; block < num_blocks_; ++block) {
        t[size_ + block] = fold_block(block);
      }
      full_levels = depth_;
    } else {
      for (std::int64_t b = 0; b < n; ++b) {
        if (b + kPrefetchDistance < n) {
          const std::int64_t ahead = indices[b + kPrefetchDistance];
          segment_tree_detail::prefetch_for_write(leaves + ahead);
          segment_tree_detail::prefetch_for_write(t + size_ + ahead / kBlock);
        }
        const std::int64_t block = indices[b] / kBlock;
        leaves[indices[b]] = values[b];
        std::int64_t k = size_ + block;
        t[k] = fold_block(block);
        for (int level = depth_ - 1; level >= full_levels; --level) {
          k >>= 1;
          t[k] = combine(t[2 * k], t[2 * k + 1]);
        }
      }
    }
    for (int level = full_levels - 1; level >= 0; --level) {
      T* const parent = t + (std::int64_t{1} << level);
      const T* const child = t + (std::int64_t{2} << level);
      for (std::int64_t k = 0; k < (std::int64_t{1} << level); ++k) {
        parent[k] = combine(child[2 * k], child[2 * k + 1]);
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

  // Reduction (sum or min) over leaves [start, end), end exclusive. O(kBlock + log capacity).
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
      return nodes_[1];
    }
    const std::int64_t first_block = start / kBlock;
    const std::int64_t last_block = (end - 1) / kBlock;
    if (first_block == last_block) {
      return fold_leaves(start, end);
    }
    // Partial first block, whole blocks between (through the tree), partial last block.
    T left = fold_leaves(start, (first_block + 1) * kBlock);
    T right = fold_leaves(last_block * kBlock, end);
    std::int64_t lo = size_ + first_block + 1;
    std::int64_t hi = size_ + last_block;
    while (lo < hi) {
      if (lo & 1) {
        left = combine(left, nodes_[lo++]);
      }
      if (hi & 1) {
        right = combine(nodes_[--hi], right);
      }
      lo >>= 1;
      hi >>= 1;
    }
    return combine(left, right);
  }

  // Sum trees only. For each mass v = values[b], out[b] is the smallest index i such that
  // prefix_sum(0..i inclusive) > v, i.e. prefix_sum(0..i-1) <= v < prefix_sum(0..i); such an i
  // always has a nonzero priority. Masses v >= total() (no such i; reached by rounding in
  // u * total()) give the last index with a nonzero priority. Prefix sums are the tree's own:
  // subtree sums, then a running sum inside the block. Requires every v finite and >= 0
  // (std::invalid_argument otherwise) and total() > 0 when n > 0. Validates the whole batch
  // before any work. O(n (log capacity + kBlock)), split over threads for large batches.
  template <SegmentOp O = Op, typename = std::enable_if_t<O == SegmentOp::kSum>>
  void scan_lower_bound(const T* values, std::int64_t* out, std::int64_t n) const {
    check_masses(values, n);
    if (n == 0) {
      return;
    }
    const T total = nodes_[1];
    if (!(total > T(0))) {
      throw std::invalid_argument(
          "scan_lower_bound needs a positive total priority, but the tree's total is " +
          segment_tree_detail::format_value(total) + " (every priority is zero)");
    }
    parallel_for(n, kScanMinPerThread, [&](std::int64_t begin, std::int64_t end) {
      scan_range(values, out, begin, end, total);
    });
  }

 private:
  static std::int64_t checked_capacity(std::int64_t capacity) {
    if (capacity < 1 || capacity > kMaxCapacity) {
      throw std::invalid_argument("segment tree capacity must be in [1, " +
                                  std::to_string(kMaxCapacity) + "], got " +
                                  std::to_string(capacity));
    }
    return capacity;
  }

  static T combine(T a, T b) {
    if constexpr (Op == SegmentOp::kSum) {
      return a + b;
    } else {
      return b < a ? b : a;
    }
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

  // A block's node value: its kBlock leaves folded in index order, the same order as the
  // running sum of scan_block (so v < block sum guarantees a hit inside the block).
  T fold_block(std::int64_t block) const {
    const T* const leaf = leaves_.get() + block * kBlock;
    T acc = leaf[0];
    for (std::int64_t i = 1; i < kBlock; ++i) {
      acc = combine(acc, leaf[i]);
    }
    return acc;
  }

  // Branch-free (vectorized): false for any NaN, infinity or negative value.
  static bool all_finite_nonnegative(const T* values, std::int64_t n) {
    bool all_valid = true;
    for (std::int64_t b = 0; b < n; ++b) {
      all_valid &= (values[b] >= T(0)) & (values[b] <= std::numeric_limits<T>::max());
    }
    return all_valid;
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
  // their cache misses overlap (each next pair of children, then the leaf block, prefetched).
  // Branch-free: the direction is data, not control flow.
  //
  // The fast descent reads only left sums: go right when v >= left sum (then v -= left sum).
  // It differs from the careful rule of descend_careful() only when it enters a subtree of sum
  // 0, which happens only through rounding or for v >= total (mapped to +inf); it then ends on
  // a block of sum 0, and those few queries are redone carefully.
  void scan_range(const T* values, std::int64_t* out, std::int64_t begin, std::int64_t end,
                  T total) const {
    const T* const t = nodes_.data();
    for (std::int64_t g = begin; g < end; g += kScanGroup) {
      const std::int64_t m = std::min(kScanGroup, end - g);
      T mass[kScanGroup];
      std::int64_t node[kScanGroup];
      for (std::int64_t j = 0; j < m; ++j) {
        mass[j] = start_mass(values[g + j], total);
        node[j] = 1;
      }
      for (int level = 0; level < depth_; ++level) {
        for (std::int64_t j = 0; j < m; ++j) {
          const std::int64_t left = 2 * node[j];
          const T left_sum = t[left];
          const bool right = mass[j] >= left_sum;
          mass[j] -= left_sum * static_cast<T>(right);
          node[j] = left + static_cast<std::int64_t>(right);
          segment_tree_detail::prefetch(t + 2 * node[j]);
        }
      }
      for (std::int64_t j = 0; j < m; ++j) {
        if (t[node[j]] > T(0)) {
          segment_tree_detail::prefetch(leaves_.get() + (node[j] - size_) * kBlock);
        }
      }
      for (std::int64_t j = 0; j < m; ++j) {
        if (t[node[j]] > T(0)) {
          out[g + j] = scan_block(node[j] - size_, mass[j]);
        } else {
          const T v = start_mass(values[g + j], total);
          T rest = v;
          const std::int64_t block = descend_careful(v, &rest);
          out[g + j] = scan_block(block, rest);
        }
      }
    }
  }

  // v >= total has no index whose prefix sum exceeds it: +inf sends it to the last nonzero leaf.
  static T start_mass(T v, T total) {
    return v >= total ? std::numeric_limits<T>::infinity() : v;
  }

  // One query, careful rule: go right when v >= left sum and the right subtree has mass, else
  // left. Every node visited has a positive sum (the root has), so the block reached has a
  // positive sum even when rounding breaks v < node sum. Returns the block, and the mass left
  // for it in *rest.
  std::int64_t descend_careful(T mass, T* rest) const {
    const T* const t = nodes_.data();
    std::int64_t node = 1;
    for (int level = 0; level < depth_; ++level) {
      const std::int64_t left = 2 * node;
      const bool right = mass >= t[left] && t[left + 1] > T(0);
      if (right) {
        mass -= t[left];
      }
      node = left + static_cast<std::int64_t>(right);
    }
    *rest = mass;
    return node - size_;
  }

  // Inside a block of positive sum: the first leaf whose running sum exceeds the mass (it has
  // a nonzero priority); when rounding leaves none, the block's last nonzero leaf.
  std::int64_t scan_block(std::int64_t block, T mass) const {
    const T* const leaf = leaves_.get() + block * kBlock;
    T running = T(0);
    std::int64_t below = 0;  // leaves whose running sum is <= mass
    for (std::int64_t i = 0; i < kBlock; ++i) {
      running += leaf[i];
      below += static_cast<std::int64_t>(running <= mass);
    }
    if (below == kBlock) {
      below = kBlock - 1;
      while (below > 0 && !(leaf[below] > T(0))) {
        --below;
      }
    }
    return block * kBlock + below;
  }

  std::int64_t capacity_;
  std::int64_t num_blocks_ = 0;
  std::int64_t size_ = 1;
  int depth_ = 0;
  std::unique_ptr<T[], segment_tree_detail::AlignedDelete> leaves_;
  std::vector<T> nodes_;
};

template <typename T>
using SumSegmentTree = SegmentTree<T, SegmentOp::kSum>;
template <typename T>
using MinSegmentTree = SegmentTree<T, SegmentOp::kMin>;

}  // namespace marlkit
