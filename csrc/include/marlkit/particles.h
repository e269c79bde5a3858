// Particle-world kernels: soft-contact point agents in a square box, and k-nearest neighbours.
//
// Header-only, no Python: every function takes raw pointers to C-contiguous float32 arrays and
// their sizes; csrc/bindings.cpp checks the NumPy arrays and releases the GIL around the calls.
// The torch twin in platform/marlkit/native/particles.py does the same float32 operations in the
// same order, F_i = force_i + (sum over ascending j of f_ij, starting from 0), so the two agree
// to rounding (bit for bit wherever the twin's sum adds its terms in the same order, as torch's
// CPU sum does for short rows, or an agent has at most two contacts).
//
// Layouts (E environments, N agents, K neighbours):
//   pos, vel, force  float32 [E, N, 2]      contacts  int32 [E, N]
//   rel              float32 [E, N, K, 2]   idx       int64 [E, N, K]
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "marlkit/common.h"

namespace marlkit {
namespace particles {

// Physical parameters of particle_step, as the caller gives them (double / int).
struct StepParams {
  double radius = 0.0;       // agent radius r > 0
  double mass = 1.0;         // agent mass m > 0
  double drag = 0.0;         // velocity damping per substep, in [0, 1)
  double dt = 0.1;           // time per step > 0
  int substeps = 1;          // integration substeps S >= 1
  double stiffness = 0.0;    // contact spring constant k >= 0
  double half_extent = 1.0;  // the box is [-L, L]^2, L > r
};

// The float32 constants both backends derive from StepParams, computed once per call.
struct StepConstants {
  float two_r;    // 2r
  float contact2; // (2r)^2: pairs with d2 below this touch
  float k;        // stiffness
  float h;        // dt / S
  float a;        // 1 - drag
  float b;        // h / m
  float lim;      // L - r: the bound on each coordinate of a centre
  int substeps;
};

namespace detail {

inline std::string fmt(double v) {
  // std::to_string(double) prints fixed 6 decimals, which hides 1e-9; use the shortest form.
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

inline void require(bool ok, const std::string& message) {
  if (!ok) {
    throw std::invalid_argument(message);
  }
}

// parallel_for whose workers never let an exception escape a std::thread (which would call
// std::terminate): the first one is kept and rethrown on the calling thread.
template <typename Fn>
void parallel_for_checked(std::int64_t total, std::int64_t min_per_thread, Fn&& fn) {
  std::exception_ptr error;
  std::mutex error_mutex;
  parallel_for(total, min_per_thread, [&](std::int64_t begin, std::int64_t end) {
    try {
      fn(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) {
        error = std::current_exception();
      }
    }
  });
  if (error) {
    std::rethrow_exception(error);
  }
}

// Items per thread so that each thread gets at least ~64k work units (a pair evaluation or an
// agent update: ~100 us, well above the cost of starting a std::thread).
inline std::int64_t grain_for(std::int64_t work_per_item) {
  constexpr std::int64_t kMinWorkPerThread = 65536;
  return std::max<std::int64_t>(1, kMinWorkPerThread / std::max<std::int64_t>(1, work_per_item));
}

}  // namespace detail

// Throws std::invalid_argument naming the first bad parameter.
inline StepConstants make_constants(const StepParams& p) {
  using detail::fmt;
  using detail::require;
  require(std::isfinite(p.radius) && p.radius > 0.0,
          "particle_step: radius must be a finite number > 0, got " + fmt(p.radius));
  require(std::isfinite(p.mass) && p.mass > 0.0,
          "particle_step: mass must be a finite number > 0, got " + fmt(p.mass));
  require(p.drag >= 0.0 && p.drag < 1.0,
          "particle_step: drag must be in [0, 1), got " + fmt(p.drag));
  require(std::isfinite(p.dt) && p.dt > 0.0,
          "particle_step: dt must be a finite number > 0, got " + fmt(p.dt));
  require(p.substeps >= 1,
          "particle_step: substeps must be an int >= 1, got " + std::to_string(p.substeps));
  require(std::isfinite(p.stiffness) && p.stiffness >= 0.0,
          "particle_step: stiffness must be a finite number >= 0, got " + fmt(p.stiffness));
  StepConstants c{};
  const float r = static_cast<float>(p.radius);
  const float L = static_cast<float>(p.half_extent);
  require(std::isfinite(p.half_extent) && L > r,
          "particle_step: half_extent must be a finite number > radius (" + fmt(p.radius) +
              ") in float32, got " + fmt(p.half_extent));
  c.two_r = 2.0f * r;
  c.contact2 = c.two_r * c.two_r;
  c.k = static_cast<float>(p.stiffness);
  c.h = static_cast<float>(p.dt) / static_cast<float>(p.substeps);
  c.a = 1.0f - static_cast<float>(p.drag);
  c.b = c.h / static_cast<float>(p.mass);
  c.lim = L - r;
  c.substeps = p.substeps;
  return c;
}

// Sum of the contact forces on every agent of one environment, from positions `pos` [N, 2],
// into `sum` [N, 2]. For agent i the terms f_ij are added in ascending j (starting from 0);
// each pair is evaluated once, with f_ji = -f_ij exactly (negating a float subtraction is
// exact), and the outer ascending i keeps every agent's own additions in ascending j.
inline void contact_force_sums(const float* pos, std::int64_t n, const StepConstants& c,
                               float* sum) {
  std::fill(sum, sum + 2 * n, 0.0f);
  for (std::int64_t i = 0; i < n; ++i) {
    const float xi = pos[2 * i];
    const float yi = pos[2 * i + 1];
    float sx = sum[2 * i];
    float sy = sum[2 * i + 1];
    for (std::int64_t j = i + 1; j < n; ++j) {
      const float dx = xi - pos[2 * j];
      const float dy = yi - pos[2 * j + 1];
      const float d2 = dx * dx + dy * dy;
      if (!(d2 < c.contact2)) {
        continue;
      }
      const float d = std::sqrt(d2);
      const float pen = c.two_r - d;
      float nx = 1.0f;  // i < j here: the coincident-centre normal of i is (1, 0)
      float ny = 0.0f;
      if (d > 1e-6f) {
        nx = dx / d;
        ny = dy / d;
      }
      const float kp = c.k * pen;
      const float fx = kp * nx;
      const float fy = kp * ny;
      sx += fx;
      sy += fy;
      sum[2 * j] += -fx;
      sum[2 * j + 1] += -fy;
    }
    sum[2 * i] = sx;
    sum[2 * i + 1] = sy;
  }
}

// contacts[i] = number of j != i with d2 < (2r)^2, for one environment.
inline void count_contacts(const float* pos, std::int64_t n, const StepConstants& c,
                           std::int32_t* contacts) {
  std::fill(contacts, contacts + n, 0);
  for (std::int64_t i = 0; i < n; ++i) {
    const float xi = pos[2 * i];
    const float yi = pos[2 * i + 1];
    for (std::int64_t j = i + 1; j < n; ++j) {
      const float dx = xi - pos[2 * j];
      const float dy = yi - pos[2 * j + 1];
      if (dx * dx + dy * dy < c.contact2) {
        ++contacts[i];
        ++contacts[j];
      }
    }
  }
}

// One environment: S substeps of forces -> velocity -> position -> bounds, then contacts.
// `scratch` holds at least 2n floats.
inline void step_env(float* pos, float* vel, const float* force, std::int32_t* contacts,
                     std::int64_t n, const StepConstants& c, float* scratch) {
  for (int s = 0; s < c.substeps; ++s) {
    contact_force_sums(pos, n, c, scratch);
    for (std::int64_t q = 0; q < 2 * n; ++q) {
      const float f = force[q] + scratch[q];
      float v = vel[q] * c.a + f * c.b;
      float x = pos[q] + v * c.h;
      if (x > c.lim) {
        x = c.lim;
        v = 0.0f;
      } else if (x < -c.lim) {
        x = -c.lim;
        v = 0.0f;
      }
      vel[q] = v;
      pos[q] = x;
    }
  }
  count_contacts(pos, n, c, contacts);
}

// All environments, in parallel over E. pos, vel updated in place; contacts written.
// Throws std::invalid_argument for bad parameters before touching any array.
inline void step(float* pos, float* vel, const float* force, std::int32_t* contacts,
                 std::int64_t num_envs, std::int64_t n, const StepParams& params) {
  const StepConstants c = make_constants(params);
  const double pairs = 0.5 * static_cast<double>(n) * static_cast<double>(n - 1);
  const double units = (pairs + 2.0 * static_cast<double>(n)) * c.substeps + pairs + 1.0;
  const std::int64_t work = static_cast<std::int64_t>(std::min(units, 1e15));
  detail::parallel_for_checked(
      num_envs, detail::grain_for(work), [&](std::int64_t begin, std::int64_t end) {
        std::vector<float> scratch(static_cast<std::size_t>(2 * n));
        for (std::int64_t e = begin; e < end; ++e) {
          const std::int64_t off = e * n * 2;
          step_env(pos + off, vel + off, force + off, contacts + e * n, n, c, scratch.data());
        }
      });
}

// ---- k nearest neighbours --------------------------------------------------------------------

struct Candidate {
  float d2;
  std::int64_t j;
};

inline bool candidate_less(const Candidate& x, const Candidate& y) {
  return x.d2 < y.d2 || (x.d2 == y.d2 && x.j < y.j);
}

// Keep the best k candidates seen so far in buf[0, count), sorted by (d2, j).
inline void insert_top_k(Candidate c, Candidate* buf, std::int64_t& count, std::int64_t k) {
  std::int64_t slot = count;
  if (count < k) {
    ++count;
  } else if (candidate_less(c, buf[k - 1])) {
    slot = k - 1;
  } else {
    return;
  }
  while (slot > 0 && candidate_less(c, buf[slot - 1])) {
    buf[slot] = buf[slot - 1];
    --slot;
  }
  buf[slot] = c;
}

// The neighbour search of one environment (the function a uniform grid will replace):
// for every agent i of `pos` [N, 2], the k nearest other agents ordered by (d2, j), only those
// with d2 <= radius2, into rel [N, k, 2] (pos_j - pos_i) and idx [N, k]; missing slots get
// rel 0 and idx -1. Small k keeps a sorted top-k buffer (one pass, O(N) for random data);
// larger k collects all candidates and partially sorts them (O(N log k)).
// `scratch` is reused across calls (grows to N candidates).
inline void knn_env_bruteforce(const float* pos, std::int64_t n, std::int64_t k, float radius2,
                               float* rel, std::int64_t* idx, std::vector<Candidate>& scratch) {
  constexpr std::int64_t kInsertionMaxK = 32;
  scratch.resize(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)));
  Candidate* buf = scratch.data();
  for (std::int64_t i = 0; i < n; ++i) {
    const float xi = pos[2 * i];
    const float yi = pos[2 * i + 1];
    std::int64_t found = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      if (j == i) {
        continue;
      }
      const float rx = pos[2 * j] - xi;
      const float ry = pos[2 * j + 1] - yi;
      const float d2 = rx * rx + ry * ry;
      if (!(d2 <= radius2)) {  // also drops NaN
        continue;
      }
      if (k <= kInsertionMaxK) {
        insert_top_k(Candidate{d2, j}, buf, found, k);
      } else {
        buf[found++] = Candidate{d2, j};
      }
    }
    if (k > kInsertionMaxK) {
      const std::int64_t all = found;
      found = std::min(k, all);
      std::partial_sort(buf, buf + found, buf + all, candidate_less);
    }
    float* rel_i = rel + i * k * 2;
    std::int64_t* idx_i = idx + i * k;
    for (std::int64_t s = 0; s < found; ++s) {
      const std::int64_t j = buf[s].j;
      rel_i[2 * s] = pos[2 * j] - xi;
      rel_i[2 * s + 1] = pos[2 * j + 1] - yi;
      idx_i[s] = j;
    }
    for (std::int64_t s = found; s < k; ++s) {
      rel_i[2 * s] = 0.0f;
      rel_i[2 * s + 1] = 0.0f;
      idx_i[s] = -1;
    }
  }
}

// All environments, in parallel over E. radius may be +inf; radius2 = float(radius)^2 in float32.
// Throws std::invalid_argument for k < 0, k > N - 1 (N > 0) or radius not > 0.
inline void knn(const float* pos, std::int64_t num_envs, std::int64_t n, std::int64_t k,
                double radius, float* rel, std::int64_t* idx) {
  using detail::require;
  require(k >= 0, "knn: k must be >= 0, got " + std::to_string(k));
  require(k <= std::max<std::int64_t>(n - 1, 0),
          "knn: k must be <= N - 1 = " + std::to_string(n - 1) + " (other agents), got " +
              std::to_string(k));
  require(radius > 0.0, "knn: radius must be > 0 (inf allowed), got " + detail::fmt(radius));
  const float rf = static_cast<float>(radius);
  const float radius2 = rf * rf;
  if (k == 0) {
    return;
  }
  detail::parallel_for_checked(
      num_envs, detail::grain_for(n * n + 1), [&](std::int64_t begin, std::int64_t end) {
        std::vector<Candidate> scratch;
        for (std::int64_t e = begin; e < end; ++e) {
          knn_env_bruteforce(pos + e * n * 2, n, k, radius2, rel + e * n * k * 2,
                             idx + e * n * k, scratch);
        }
      });
}

}  // namespace particles
}  // namespace marlkit
