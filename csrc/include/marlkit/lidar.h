// LiDAR of the particle worlds: rays from every agent's centre against the other agents' discs,
// with VMAS's semantics (vmas/simulator/core.py, World._cast_rays_to_sphere), in O(N) per
// environment through the uniform grid of particles.h.
//
// Header-only, no Python: raw pointers to C-contiguous arrays; csrc/bindings.cpp checks the
// NumPy arrays and releases the GIL around the call.
//
// For agent i at p_i, ray k with unit direction u_k = (cos a_k, sin a_k) and another agent j
// (every j != i, all of radius r), with w = p_j - p_i in float32:
//   t = w . u_k                  (how far along the ray the centre projects)
//   c = w x u_k = wx uy - wy ux  (the centre's signed distance from the ray's line)
//   q = r^2 - c^2
//   the ray hits j when t > 0 (the centre is in front) and q > 0 (the line crosses the disc),
//   at distance t - sqrt(q): the near crossing, negative when p_i lies inside j's disc;
// and reading[i, k] = min(max_range, the smallest hit distance). A disc whose centre is behind
// the origin (t <= 0) is never hit, even when the origin lies inside it; the agent itself is
// skipped. Each of those is one float32 operation, in this order, with a correctly rounded
// square root: the torch twin in platform/marlkit/native/lidar.py does the same operations, so
// the two agree bit for bit, and the result does not depend on the grid or the threads (a min).
//
// Only agents closer than max_range + r can be hit before max_range (a hit point lies on the
// disc, so |w| <= distance + r): the grid has cells at least that wide and each agent tests the
// 3x3 block around its cell, after a prefilter |w|^2 <= (max_range + r)^2 (1 + 1e-5) that keeps
// every candidate whose reading could be below max_range.
//
// Layouts (E environments, N agents, R rays):
//   pos float32 [E, N, 2]   angles float32 [R]   out float32 [E, N, R]
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "marlkit/common.h"
#include "marlkit/particles.h"

namespace marlkit {
namespace particles {

namespace detail {

// The ray directions of one call, padded with copies of the last ray to a multiple of kLanes
// (their readings are computed and dropped).
struct Rays {
  std::int64_t n = 0;       // rays asked for
  std::int64_t padded = 0;  // n rounded up to kLanes
  std::vector<float> ux, uy;
  float r2 = 0.0f;          // r^2 in float32
  float max_range = 0.0f;
  float reach2 = 0.0f;      // prefilter on |w|^2
  double cell = 0.0;        // grid cell width
};

inline Rays make_rays(const float* angles, std::int64_t n_rays, double max_range,
                      double radius) {
  Rays rays;
  rays.n = n_rays;
  rays.padded = (n_rays + kLanes - 1) / kLanes * kLanes;
  rays.ux.resize(static_cast<std::size_t>(rays.padded));
  rays.uy.resize(static_cast<std::size_t>(rays.padded));
  for (std::int64_t k = 0; k < rays.padded; ++k) {
    const double a = angles[std::min(k, n_rays - 1)];
    rays.ux[static_cast<std::size_t>(k)] = static_cast<float>(std::cos(a));
    rays.uy[static_cast<std::size_t>(k)] = static_cast<float>(std::sin(a));
  }
  const float r = static_cast<float>(radius);
  rays.r2 = r * r;
  rays.max_range = static_cast<float>(max_range);
  const double reach = static_cast<double>(rays.max_range) + static_cast<double>(r);
  rays.reach2 = static_cast<float>(reach * reach * (1.0 + 1e-5));
  rays.cell = contact_cell(static_cast<float>(reach * (1.0 + 1e-5)));
  return rays;
}

// Fold the hits of every ray on the disc at offset (wx, wy) into best[0 .. padded).
inline void cast_to_disc(const Rays& rays, float wx, float wy, float* best) {
  const float* ux = rays.ux.data();
  const float* uy = rays.uy.data();
#if defined(MARLKIT_SSE2)
  const __m128 vx = _mm_set1_ps(wx);
  const __m128 vy = _mm_set1_ps(wy);
  const __m128 r2 = _mm_set1_ps(rays.r2);
  const __m128 zero = _mm_setzero_ps();
  for (std::int64_t k = 0; k < rays.padded; k += kLanes) {
    const __m128 cx = _mm_loadu_ps(ux + k);
    const __m128 cy = _mm_loadu_ps(uy + k);
    const __m128 t = _mm_add_ps(_mm_mul_ps(vx, cx), _mm_mul_ps(vy, cy));
    const __m128 c = _mm_sub_ps(_mm_mul_ps(vx, cy), _mm_mul_ps(vy, cx));
    const __m128 q = _mm_sub_ps(r2, _mm_mul_ps(c, c));
    const __m128 hit = _mm_and_ps(_mm_cmpgt_ps(t, zero), _mm_cmpgt_ps(q, zero));
    const __m128 d = _mm_sub_ps(t, _mm_sqrt_ps(_mm_and_ps(hit, q)));
    const __m128 old = _mm_loadu_ps(best + k);
    const __m128 closer = _mm_and_ps(hit, _mm_cmplt_ps(d, old));
    _mm_storeu_ps(best + k, _mm_or_ps(_mm_and_ps(closer, d), _mm_andnot_ps(closer, old)));
  }
#else
  for (std::int64_t k = 0; k < rays.padded; ++k) {
    const float t = wx * ux[k] + wy * uy[k];
    const float c = wx * uy[k] - wy * ux[k];
    const float q = rays.r2 - c * c;
    if (t > 0.0f && q > 0.0f) {
      const float d = t - std::sqrt(q);
      best[k] = d < best[k] ? d : best[k];
    }
  }
#endif
}

inline void start_readings(const Rays& rays, float* best) {
  std::fill(best, best + rays.padded, rays.max_range);
}

inline void write_readings(const Rays& rays, const float* best, float* out_i) {
  std::copy(best, best + rays.n, out_i);
}

// All pairs of one environment (small N).
inline void lidar_brute(const float* pos, std::int64_t n, const Rays& rays, float* out,
                        std::vector<float>& best) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float xi = pos[2 * i];
    const float yi = pos[2 * i + 1];
    start_readings(rays, best.data());
    for (std::int64_t j = 0; j < n; ++j) {
      const float wx = pos[2 * j] - xi;
      const float wy = pos[2 * j + 1] - yi;
      if (j != i && wx * wx + wy * wy <= rays.reach2) {
        cast_to_disc(rays, wx, wy, best.data());
      }
    }
    write_readings(rays, best.data(), out + i * rays.n);
  }
}

// The agents in sorted slots [s0, s1) of grid g: the candidates of the 3x3 block of cells.
inline void lidar_slots(const Grid& g, const Rays& rays, std::int64_t s0, std::int64_t s1,
                        float* out, std::vector<float>& best) {
  const float* xs = g.xs.data();
  const float* ys = g.ys.data();
  for (auto s = static_cast<std::int32_t>(s0); s < s1; ++s) {
    const float xi = xs[s];
    const float yi = ys[s];
    std::int32_t lo[3], hi[3];
    g.rows_near(g.qs[static_cast<std::size_t>(s)], lo, hi);
    start_readings(rays, best.data());
    for (int w = 0; w < 3; ++w) {
      // The prefilter kLanes candidates at a time (the arrays are padded), then the rays.
      for (std::int32_t t0 = lo[w]; t0 < hi[w]; t0 += kLanes) {
        Lanes d;
        unsigned m = lanes_within(xs, ys, t0, xi, yi, rays.reach2, d) & lanes_below(t0, hi[w]);
        while (m != 0) {
          const std::int32_t t = t0 + lowest_bit(m);
          m &= m - 1;
          if (t != s) {
            cast_to_disc(rays, xs[t] - xi, ys[t] - yi, best.data());
          }
        }
      }
    }
    write_readings(rays, best.data(), out + g.ids[static_cast<std::size_t>(s)] * rays.n);
  }
}

inline std::vector<float>& lidar_buffer(const Rays& rays) {
  static thread_local std::vector<float> best;
  best.resize(static_cast<std::size_t>(rays.padded));
  return best;
}

// Agents per cell of the LiDAR grid, tuned on navigation's densities (about 1 agent per unit
// area, reach 0.45): low enough that cells shrink to the reach, their lower bound, so that the
// 3x3 block holds few candidates beyond it (1.0 gave cells twice as wide, 25% slower).
constexpr double kLidarPerCell = 0.25;

inline void lidar_env(const float* pos, std::int64_t n, const Rays& rays, float* out, Grid& g,
                      bool parallel) {
  if (n <= kBruteForceMaxAgents || !g.build(pos, n, nullptr, nullptr, rays.cell, kLidarPerCell)) {
    lidar_brute(pos, n, rays, out, lidar_buffer(rays));
    return;
  }
  if (!parallel) {
    lidar_slots(g, rays, 0, g.count, out, lidar_buffer(rays));
    return;
  }
  parallel_for(g.count, grain_for(20.0 * static_cast<double>(rays.padded)),
               [&](std::int64_t s0, std::int64_t s1) {
                 lidar_slots(g, rays, s0, s1, out, lidar_buffer(rays));
               });
}

}  // namespace detail

// Throws std::invalid_argument naming the first bad parameter.
inline void check_lidar(std::int64_t n, std::int64_t n_rays, double max_range, double radius) {
  using detail::fmt;
  detail::check_count("lidar", "agents", n);
  if (n_rays < 1) {
    throw std::invalid_argument("lidar: n_rays must be an int >= 1, got " +
                                std::to_string(n_rays));
  }
  if (!(std::isfinite(max_range) && max_range > 0.0)) {
    throw std::invalid_argument("lidar: max_range must be a finite number > 0, got " +
                                fmt(max_range));
  }
  if (!(std::isfinite(radius) && radius > 0.0)) {
    throw std::invalid_argument("lidar: radius must be a finite number > 0, got " + fmt(radius));
  }
}

// Throws std::invalid_argument for the first non-finite coordinate (in memory order) or angle.
inline void check_lidar_inputs(const float* pos, std::int64_t num_envs, std::int64_t n,
                               const float* angles, std::int64_t n_rays) {
  for (std::int64_t q = 0; q < num_envs * n * 2; ++q) {
    if (!std::isfinite(pos[q])) {
      const std::int64_t e = q / (2 * n);
      const std::int64_t i = q / 2 % n;
      throw std::invalid_argument("lidar: pos must be finite, got " + detail::fmt(pos[q]) +
                                  " at pos[" + std::to_string(e) + ", " + std::to_string(i) +
                                  ", " + std::to_string(q % 2) + "]");
    }
  }
  for (std::int64_t k = 0; k < n_rays; ++k) {
    if (!std::isfinite(angles[k])) {
      throw std::invalid_argument("lidar: angles must be finite, got " +
                                  detail::fmt(angles[k]) + " at angles[" + std::to_string(k) +
                                  "]");
    }
  }
}

// All environments: out[e, i, k] = the reading of ray k (angle angles[k]) of agent i (see the
// top of this file). Parallel over environments, or over the agents of one environment at a time
// when there are fewer environments than threads and many agents. Throws std::invalid_argument
// (bad parameters, a non-finite position or angle) before writing anything.
inline void lidar(const float* pos, std::int64_t num_envs, std::int64_t n, const float* angles,
                  std::int64_t n_rays, double max_range, double radius, float* out) {
  check_lidar(n, n_rays, max_range, radius);
  check_lidar_inputs(pos, num_envs, n, angles, n_rays);
  const detail::Rays rays = detail::make_rays(angles, n_rays, max_range, radius);
  auto env_out = [&](std::int64_t e) { return out + e * n * n_rays; };
  if (num_envs < resolved_num_threads() && n >= detail::kIntraEnvMinAgents) {
    detail::Grid& g = detail::thread_scratch().agents;
    for (std::int64_t e = 0; e < num_envs; ++e) {
      detail::lidar_env(pos + e * n * 2, n, rays, env_out(e), g, true);
    }
    return;
  }
  // Work units per environment: candidates per agent (all others, or ~9 in the 3x3 block) times
  // the rays, with most candidates rejected by the prefilter.
  const double candidates = n <= detail::kBruteForceMaxAgents ? static_cast<double>(n) : 9.0;
  const double rays_cost = 0.3 * static_cast<double>(rays.padded);
  const double per_env = static_cast<double>(n) * (10.0 + candidates * rays_cost);
  parallel_for(num_envs, detail::grain_for(per_env), [&](std::int64_t begin, std::int64_t end) {
    detail::Grid& g = detail::thread_scratch().agents;
    for (std::int64_t e = begin; e < end; ++e) {
      detail::lidar_env(pos + e * n * 2, n, rays, env_out(e), g, false);
    }
  });
}

}  // namespace particles
}  // namespace marlkit
