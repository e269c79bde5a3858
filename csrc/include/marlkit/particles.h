// Particle-world kernels: soft-contact circular agents in a square box, static circular
// landmarks, and k-nearest neighbours, in O(N) per environment through uniform grids.
//
// Header-only, no Python: every function takes raw pointers to C-contiguous arrays and their
// sizes; csrc/bindings.cpp checks the NumPy arrays and releases the GIL around the calls.
//
// Order of additions (what makes the result independent of the grid and of the threads, and
// equal to the torch twin in platform/marlkit/native/particles.py to rounding): the contact
// force on agent i is one running float32 sum, starting from 0, of the terms of its partners in
// ascending order: other agents j ascending, then landmarks m ascending; then
// F_i = force_i + that sum. The grid only finds the partners: they are sorted by index before
// summing, so the result is bit for bit the brute-force sum over all j (the twin's dense sum
// adds the same terms plus zeros, in the same order wherever torch sums a row sequentially).
//
// Layouts (E environments, N agents, M landmarks, K neighbours):
//   pos, vel, force  float32 [E, N, 2]      contacts  int32 [E, N]      active  bool [E, N]
//   radii, max_speed float32 [N]            landmarks float32 [E, M, 2] landmark_radii [M]
//   rel              float32 [E, N, K, 2]   idx       int64 [E, N, K]
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "marlkit/common.h"

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <emmintrin.h>
#define MARLKIT_SSE2 1
#endif

namespace marlkit {
namespace particles {

// Physical parameters of particle_step, as the caller gives them (double / int).
struct StepParams {
  double radius = 0.0;       // agent radius r > 0 (the largest one when `radii` is given)
  double mass = 1.0;         // agent mass m > 0
  double drag = 0.0;         // velocity damping per substep, in [0, 1)
  double dt = 0.1;           // time per step > 0
  int substeps = 1;          // integration substeps S >= 1
  double stiffness = 0.0;    // contact spring constant k >= 0
  double half_extent = 1.0;  // the box is [-L, L]^2, L > r
};

// Optional arrays of particle_step; nullptr (or num_landmarks 0) keeps the default.
struct StepOptions {
  const float* radii = nullptr;           // [N] per-agent radius (default: StepParams::radius)
  const float* max_speed = nullptr;       // [N] speed limit after each velocity update (none)
  const bool* active = nullptr;           // [E, N] agents that move and collide (all)
  const float* landmarks = nullptr;       // [E, M, 2] static circles (none)
  const float* landmark_radii = nullptr;  // [M], required when num_landmarks > 0
  std::int64_t num_landmarks = 0;         // M
};

// The float32 constants both backends derive from StepParams, computed once per call.
struct StepConstants {
  float two_r;     // 2r
  float contact2;  // (2r)^2: pairs with d2 below this touch
  float k;         // stiffness
  float h;         // dt / S
  float a;         // 1 - drag
  float b;         // h / m
  float lim;       // L - r: the bound on each coordinate of a centre
  int substeps;
};

namespace detail {

inline std::string fmt(double v) {
  // std::to_string(double) prints fixed 6 decimals, which hides 1e-9; use the shortest form.
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

// Items per thread so that each thread gets at least min_work_per_thread() work units (a pair
// evaluation or an agent update each; see common.h).
inline std::int64_t grain_for(double work_per_item) {
  const double w = std::max(1.0, std::min(work_per_item, 1e15));
  return std::max<std::int64_t>(
      1, static_cast<std::int64_t>(static_cast<double>(min_work_per_thread()) / w));
}

// Environments with at most this many agents use the all-pairs loops (faster than building a
// grid); both paths give bit-identical results.
constexpr std::int64_t kBruteForceMaxAgents = 24;
constexpr std::int64_t kBruteForceMaxLandmarks = 8;
// With fewer environments than threads, environments of at least this many agents are split
// over the threads by agent (one environment at a time).
constexpr std::int64_t kIntraEnvMinAgents = 512;
// Grid slots are int32: at most this many agents (or landmarks) per environment.
constexpr std::int64_t kMaxPerEnv = (std::int64_t{1} << 31) - 64;

inline void check_count(const char* fn, const char* what, std::int64_t count) {
  if (count < 0 || count > kMaxPerEnv) {
    throw std::invalid_argument(std::string(fn) + ": the number of " + what +
                                " per environment must be in [0, " + std::to_string(kMaxPerEnv) +
                                "], got " + std::to_string(count));
  }
}

}  // namespace detail

// Throws std::invalid_argument naming the first bad parameter.
inline StepConstants make_constants(const StepParams& p) {
  using detail::fmt;
  if (!(std::isfinite(p.radius) && p.radius > 0.0)) {
    throw std::invalid_argument("particle_step: radius must be a finite number > 0, got " +
                                fmt(p.radius));
  }
  if (!(std::isfinite(p.mass) && p.mass > 0.0)) {
    throw std::invalid_argument("particle_step: mass must be a finite number > 0, got " +
                                fmt(p.mass));
  }
  if (!(p.drag >= 0.0 && p.drag < 1.0)) {
    throw std::invalid_argument("particle_step: drag must be in [0, 1), got " + fmt(p.drag));
  }
  if (!(std::isfinite(p.dt) && p.dt > 0.0)) {
    throw std::invalid_argument("particle_step: dt must be a finite number > 0, got " + fmt(p.dt));
  }
  if (!(p.substeps >= 1)) {
    throw std::invalid_argument("particle_step: substeps must be an int >= 1, got " +
                                std::to_string(p.substeps));
  }
  if (!(std::isfinite(p.stiffness) && p.stiffness >= 0.0)) {
    throw std::invalid_argument("particle_step: stiffness must be a finite number >= 0, got " +
                                fmt(p.stiffness));
  }
  StepConstants c{};
  const float r = static_cast<float>(p.radius);
  const float L = static_cast<float>(p.half_extent);
  if (!(std::isfinite(p.half_extent) && L > r)) {
    throw std::invalid_argument("particle_step: half_extent must be a finite number > radius (" +
                                fmt(p.radius) + ") in float32, got " + fmt(p.half_extent));
  }
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

// Checks the optional arrays and the scalar parameters: radii finite and > 0, landmark radii
// finite and >= 0, speed limits > 0 (inf allowed); then make_constants with the largest radius
// (so float32(L) must exceed every radius). Returns the parameters with that radius. Throws
// std::invalid_argument naming the first bad entry.
inline StepParams check_options(const StepParams& p, const StepOptions& o, std::int64_t n) {
  using detail::fmt;
  auto bad = [](const char* name, std::int64_t i, const char* rule, float v) {
    return std::invalid_argument("particle_step: " + std::string(name) + "[" + std::to_string(i) +
                                 "] must be " + rule + ", got " + fmt(v));
  };
  detail::check_count("particle_step", "agents", n);
  detail::check_count("particle_step", "landmarks", o.num_landmarks);
  StepParams q = p;
  if (o.radii != nullptr) {
    float rmax = std::numeric_limits<float>::min();  // any N = 0 radius passes
    for (std::int64_t i = 0; i < n; ++i) {
      const float r = o.radii[i];
      if (!(std::isfinite(r) && r > 0.0f)) {
        throw bad("radius", i, "a finite number > 0", r);
      }
      rmax = std::max(rmax, r);
    }
    q.radius = rmax;
  }
  make_constants(q);
  for (std::int64_t i = 0; o.max_speed != nullptr && i < n; ++i) {
    if (!(o.max_speed[i] > 0.0f)) {
      throw bad("max_speed", i, "> 0 (inf allowed)", o.max_speed[i]);
    }
  }
  if (!(o.num_landmarks == 0 || (o.landmarks != nullptr && o.landmark_radii != nullptr))) {
    throw std::invalid_argument("particle_step: landmarks need their positions and radii");
  }
  for (std::int64_t m = 0; m < o.num_landmarks; ++m) {
    const float r = o.landmark_radii[m];
    if (!(std::isfinite(r) && r >= 0.0f)) {
      throw bad("landmark_radius", m, "a finite number >= 0", r);
    }
  }
  return q;
}

namespace detail {

// Everything a step needs besides the state: constants and per-agent float32 values.
struct Model {
  StepConstants c;
  std::int64_t n = 0;
  std::int64_t m = 0;
  bool uniform = true;            // every agent has the radius c.two_r / 2
  std::vector<float> r;           // [N] radius
  std::vector<float> lim;         // [N] L - r_i
  const float* max_speed = nullptr;
  std::vector<float> max_speed2;  // [N] max_speed^2, when max_speed is given
  const float* landmark_r = nullptr;
  float agent_reach = 0.0f;       // largest r_i + r_j
  float landmark_reach = 0.0f;    // largest r_i + R_m
};

// `p` as returned by check_options (its radius is the largest one).
inline Model make_model(const StepParams& p, const StepOptions& o, std::int64_t n) {
  Model md;
  md.c = make_constants(p);
  md.n = n;
  md.m = o.num_landmarks;
  const float L = static_cast<float>(p.half_extent);
  md.r.assign(static_cast<std::size_t>(n), static_cast<float>(p.radius));
  if (o.radii != nullptr) {
    std::copy(o.radii, o.radii + n, md.r.begin());
  }
  md.lim.resize(md.r.size());
  float rmax = 0.0f;
  for (std::size_t i = 0; i < md.r.size(); ++i) {
    md.lim[i] = L - md.r[i];
    rmax = std::max(rmax, md.r[i]);
    md.uniform = md.uniform && md.r[i] == md.r[0];
  }
  md.agent_reach = rmax + rmax;
  if (o.max_speed != nullptr) {
    md.max_speed = o.max_speed;
    md.max_speed2.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      md.max_speed2[static_cast<std::size_t>(i)] = o.max_speed[i] * o.max_speed[i];
    }
  }
  md.landmark_r = o.landmark_radii;
  float lmax = 0.0f;
  for (std::int64_t j = 0; j < md.m; ++j) {
    lmax = std::max(lmax, o.landmark_radii[j]);
  }
  md.landmark_reach = rmax + lmax;
  return md;
}

// The force term of one touching pair, from the point of view of the first: `dx, dy` is
// p_self - p_other, `d2` its float32 squared length, `rr` the contact distance. Coincident
// centres (d <= 1e-6) push along (fallback_x, 0): +1 for the smaller agent index (and for an
// agent against a landmark), -1 for the larger. Swapping the pair negates the term exactly.
inline void pair_force(float dx, float dy, float d2, float rr, float k, float fallback_x,
                       float& fx, float& fy) {
  const float d = std::sqrt(d2);
  const float kp = k * (rr - d);
  float nx = fallback_x;
  float ny = 0.0f;
  if (d > 1e-6f) {
    nx = dx / d;
    ny = dy / d;
  }
  fx = kp * nx;
  fy = kp * ny;
}

// One velocity and position update of agent i: F = force + contact sum, v = v a + F b, the
// speed limit, x = x + v h, then each coordinate clamped to [-lim_i, lim_i] (v zeroed there).
inline void integrate(float* p, float* v, const float* f, float sx, float sy, const Model& md,
                      std::int64_t i) {
  const StepConstants& c = md.c;
  float vx = v[0] * c.a + (f[0] + sx) * c.b;
  float vy = v[1] * c.a + (f[1] + sy) * c.b;
  if (md.max_speed != nullptr) {
    const float s2 = vx * vx + vy * vy;
    if (s2 > md.max_speed2[static_cast<std::size_t>(i)]) {
      const float scale = md.max_speed[i] / std::sqrt(s2);
      vx = vx * scale;
      vy = vy * scale;
    }
  }
  const float lim = md.lim[static_cast<std::size_t>(i)];
  float x = p[0] + vx * c.h;
  float y = p[1] + vy * c.h;
  if (x > lim) {
    x = lim;
    vx = 0.0f;
  } else if (x < -lim) {
    x = -lim;
    vx = 0.0f;
  }
  if (y > lim) {
    y = lim;
    vy = 0.0f;
  } else if (y < -lim) {
    y = -lim;
    vy = 0.0f;
  }
  p[0] = x;
  p[1] = y;
  v[0] = vx;
  v[1] = vy;
}

// ---- uniform grid ------------------------------------------------------------------------------

// Points of one environment sorted by cell (a counting sort, stable: ascending index within a
// cell), as structure-of-arrays copies padded with kLanes spare slots. Cells are squares of side
// `cell` covering the bounding box of the included points: gx * gy of them, stored row-major
// with a border of empty cells all round (stride gx + 2), so the 3x3 block around any cell
// exists. Storage cell q holds the sorted slots start[q] .. start[q + 1].
constexpr int kLanes = 4;  // candidates tested per batch, without branches

struct Grid {
  double lo_x = 0.0, lo_y = 0.0, cell = 1.0, inv = 1.0;
  std::int64_t gx = 1, gy = 1;        // logical cells
  std::int64_t stride = 3;            // gx + 2
  std::int64_t count = 0;             // points in the grid
  std::vector<std::int32_t> start;    // [(gx + 2) * (gy + 2) + 1]
  std::vector<std::int32_t> cell_of;  // [n] storage cell of each point, -1 when excluded
  std::vector<std::int32_t> fill;
  std::vector<std::int32_t> qs;       // storage cell of each sorted slot
  std::vector<float> xs, ys, rs;      // sorted coordinates (and radii, when given), padded
  std::vector<std::int32_t> ids;      // sorted original indices

  std::int64_t cx_of(double x) const { return clamp_cell((x - lo_x) * inv, gx); }
  std::int64_t cy_of(double y) const { return clamp_cell((y - lo_y) * inv, gy); }
  // The storage index of logical cell (cx, cy).
  std::int64_t at(std::int64_t cx, std::int64_t cy) const { return (cy + 1) * stride + cx + 1; }

  static std::int64_t clamp_cell(double u, std::int64_t g) {
    if (!(u >= 0.0)) {
      return 0;
    }
    if (u >= static_cast<double>(g)) {
      return g - 1;
    }
    return static_cast<std::int64_t>(u);
  }

  // Build over points pts [n, 2] (those with include[i]; all when include is null), copying
  // radii [n] too when given. Cells are at least `min_cell` wide and hold about `per_cell`
  // points on average (never more than 4n + 16 cells). Returns false, building nothing usable,
  // when an included point is not finite.
  bool build(const float* pts, std::int64_t n, const bool* include, const float* radii,
             double min_cell, double per_cell) {
    double x0 = std::numeric_limits<double>::infinity(), y0 = x0, x1 = -x0, y1 = -x0;
    count = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      if (include != nullptr && !include[i]) {
        continue;
      }
      const double x = pts[2 * i];
      const double y = pts[2 * i + 1];
      if (!(std::isfinite(x) && std::isfinite(y))) {
        return false;
      }
      x0 = std::min(x0, x);
      x1 = std::max(x1, x);
      y0 = std::min(y0, y);
      y1 = std::max(y1, y);
      ++count;
    }
    if (count == 0) {
      x0 = y0 = x1 = y1 = 0.0;
    }
    const double ex = x1 - x0;
    const double ey = y1 - y0;
    const double max_cells = 4.0 * static_cast<double>(count) + 16.0;
    double c = std::max(min_cell, std::sqrt(ex * ey * per_cell / std::max<double>(1, count)));
    c = std::max(c, std::max(ex, ey) / max_cells);
    if (!(c > 0.0)) {
      c = 1.0;  // every point at one spot (or none): one cell
    }
    auto cells_for = [&](double s) {
      return (std::floor(ex / s) + 1.0) * (std::floor(ey / s) + 1.0);
    };
    while (cells_for(c) > max_cells) {
      c *= 1.25;
    }
    lo_x = x0;
    lo_y = y0;
    cell = c;
    inv = 1.0 / c;
    gx = static_cast<std::int64_t>(std::floor(ex / c)) + 1;
    gy = static_cast<std::int64_t>(std::floor(ey / c)) + 1;
    stride = gx + 2;
    const auto num_cells = static_cast<std::size_t>(stride * (gy + 2));
    start.assign(num_cells + 1, 0);
    cell_of.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      std::int32_t id = -1;
      if (include == nullptr || include[i]) {
        id = static_cast<std::int32_t>(at(cx_of(pts[2 * i]), cy_of(pts[2 * i + 1])));
        ++start[static_cast<std::size_t>(id) + 1];
      }
      cell_of[static_cast<std::size_t>(i)] = id;
    }
    for (std::size_t q = 0; q < num_cells; ++q) {
      start[q + 1] += start[q];
    }
    fill.assign(start.begin(), start.end() - 1);
    const auto padded = static_cast<std::size_t>(count + kLanes);
    xs.resize(padded);  // the padding keeps finite values from earlier builds (masked out)
    ys.resize(padded);
    rs.resize(radii != nullptr ? padded : 0);
    ids.resize(static_cast<std::size_t>(count));
    qs.resize(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int32_t id = cell_of[static_cast<std::size_t>(i)];
      if (id < 0) {
        continue;
      }
      const auto s = static_cast<std::size_t>(fill[static_cast<std::size_t>(id)]++);
      xs[s] = pts[2 * i];
      ys[s] = pts[2 * i + 1];
      ids[s] = static_cast<std::int32_t>(i);
      qs[s] = id;
      if (radii != nullptr) {
        rs[s] = radii[i];
      }
    }
    return true;
  }

  // The sorted-slot ranges [lo[w], hi[w]) of the three rows of the 3x3 block of cells around
  // storage cell q (border cells are empty).
  void rows_near(std::int64_t q, std::int32_t* lo, std::int32_t* hi) const {
    for (int w = 0; w < 3; ++w) {
      const std::int64_t row = q + (w - 1) * stride;
      lo[w] = start[static_cast<std::size_t>(row - 1)];
      hi[w] = start[static_cast<std::size_t>(row + 2)];
    }
  }
};

// Number of set bits / lowest set bit of a lane mask (< 2^kLanes).
inline int bit_count(unsigned m) {
  static constexpr int kCount[16] = {0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4};
  return kCount[m & 15u];
}

inline int lowest_bit(unsigned m) {
  static constexpr int kLowest[16] = {0, 0, 1, 0, 2, 0, 1, 0, 3, 0, 1, 0, 2, 0, 1, 0};
  return kLowest[m & 15u];
}

// float32 squared distances d2 = (x_t - xi)^2 + (y_t - yi)^2 from (xi, yi) to slots t0 ..
// t0 + kLanes - 1 into `out`; returns the mask of lanes with d2 <= limit (never NaN). The same
// float32 operations as the scalar code, four lanes at a time with SSE2 where available.
struct Lanes {
  float d2[kLanes];
};

inline unsigned lanes_within(const float* xs, const float* ys, std::int32_t t0, float xi,
                             float yi, float limit, Lanes& out) {
#if defined(MARLKIT_SSE2)
  const __m128 dx = _mm_sub_ps(_mm_loadu_ps(xs + t0), _mm_set1_ps(xi));
  const __m128 dy = _mm_sub_ps(_mm_loadu_ps(ys + t0), _mm_set1_ps(yi));
  const __m128 d2 = _mm_add_ps(_mm_mul_ps(dx, dx), _mm_mul_ps(dy, dy));
  _mm_storeu_ps(out.d2, d2);
  return static_cast<unsigned>(_mm_movemask_ps(_mm_cmple_ps(d2, _mm_set1_ps(limit))));
#else
  unsigned m = 0;
  for (int l = 0; l < kLanes; ++l) {
    const float dx = xs[t0 + l] - xi;
    const float dy = ys[t0 + l] - yi;
    out.d2[l] = dx * dx + dy * dy;
    m |= static_cast<unsigned>(out.d2[l] <= limit) << l;
  }
  return m;
#endif
}

// Lanes of slots below `hi`.
inline unsigned lanes_below(std::int32_t t0, std::int32_t hi) {
  const std::int32_t left = hi - t0;
  return left >= kLanes ? (1u << kLanes) - 1u : (1u << left) - 1u;
}

// Bit l set where slot t0 + l (< hi) touches the point (xi, yi) of radius ri: float32
// d2 < (ri + r_t)^2, or d2 < contact2 with uniform radii. Branch-free over kLanes slots (the
// arrays are padded), so that short, varying ranges cost no mispredicted loop exits.
template <bool kUniform>
inline unsigned touch_mask(const float* xs, const float* ys, const float* rs, std::int32_t t0,
                           std::int32_t hi, float xi, float yi, float ri, float contact2) {
#if defined(MARLKIT_SSE2)
  const __m128 dx = _mm_sub_ps(_mm_set1_ps(xi), _mm_loadu_ps(xs + t0));
  const __m128 dy = _mm_sub_ps(_mm_set1_ps(yi), _mm_loadu_ps(ys + t0));
  const __m128 d2 = _mm_add_ps(_mm_mul_ps(dx, dx), _mm_mul_ps(dy, dy));
  __m128 reach2 = _mm_set1_ps(contact2);
  if (!kUniform) {
    const __m128 rr = _mm_add_ps(_mm_set1_ps(ri), _mm_loadu_ps(rs + t0));
    reach2 = _mm_mul_ps(rr, rr);
  }
  const auto m = static_cast<unsigned>(_mm_movemask_ps(_mm_cmplt_ps(d2, reach2)));
#else
  unsigned m = 0;
  for (int l = 0; l < kLanes; ++l) {
    const float dx = xi - xs[t0 + l];
    const float dy = yi - ys[t0 + l];
    const float rr = kUniform ? 0.0f : ri + rs[t0 + l];
    const float reach2 = kUniform ? contact2 : rr * rr;
    m |= static_cast<unsigned>(dx * dx + dy * dy < reach2) << l;
  }
#endif
  return m & lanes_below(t0, hi);
}

// A found contact partner: agents are keyed by their index j, landmarks by N + m.
struct Partner {
  std::int64_t key;
  float fx, fy;
};

// Sum the partners' terms from 0 in ascending key order (insertion sort: a handful of them).
inline void sum_partners(std::vector<Partner>& buf, float& sx, float& sy) {
  for (std::size_t a = 1; a < buf.size(); ++a) {
    const Partner p = buf[a];
    std::size_t b = a;
    while (b > 0 && buf[b - 1].key > p.key) {
      buf[b] = buf[b - 1];
      --b;
    }
    buf[b] = p;
  }
  for (const Partner& p : buf) {
    sx += p.fx;
    sy += p.fy;
  }
}

// Per-thread buffers, reused across calls (the pool's threads persist).
struct Scratch {
  Grid agents;
  Grid landmarks;
  std::vector<Partner> partners;
  std::vector<float> sums;
};

inline Scratch& thread_scratch() {
  static thread_local Scratch scratch;
  return scratch;
}

// One environment's view of the call.
struct EnvView {
  float* pos;
  float* vel;
  const float* force;
  std::int32_t* contacts;
  const bool* active;     // [N] or null (all active)
  const float* lm;        // [M, 2] or null
  bool lm_grid = false;   // landmarks through their grid (else all M are scanned)
};

inline bool is_active(const EnvView& ev, std::int64_t i) {
  return ev.active == nullptr || ev.active[i];
}

// The landmark terms of agent i at (xi, yi), ascending m, added to (sx, sy).
inline void add_landmark_terms(const EnvView& ev, const Model& md, const Grid& lg,
                               std::vector<Partner>& buf, std::int64_t i, float xi, float yi,
                               float& sx, float& sy) {
  const float ri = md.r[static_cast<std::size_t>(i)];
  auto term = [&](std::int64_t m, float& fx, float& fy) {
    const float dx = xi - ev.lm[2 * m];
    const float dy = yi - ev.lm[2 * m + 1];
    const float d2 = dx * dx + dy * dy;
    const float rr = ri + md.landmark_r[m];
    if (!(d2 < rr * rr)) {
      return false;
    }
    pair_force(dx, dy, d2, rr, md.c.k, 1.0f, fx, fy);
    return true;
  };
  if (!ev.lm_grid) {
    for (std::int64_t m = 0; m < md.m; ++m) {
      float fx, fy;
      if (term(m, fx, fy)) {
        sx += fx;
        sy += fy;
      }
    }
    return;
  }
  buf.clear();
  std::int32_t lo[3], hi[3];
  lg.rows_near(lg.at(lg.cx_of(xi), lg.cy_of(yi)), lo, hi);
  for (int w = 0; w < 3; ++w) {
    for (std::int32_t s = lo[w]; s < hi[w]; ++s) {
      const std::int64_t m = lg.ids[static_cast<std::size_t>(s)];
      float fx, fy;
      if (term(m, fx, fy)) {
        buf.push_back(Partner{m, fx, fy});
      }
    }
  }
  sum_partners(buf, sx, sy);
}

// Contact sums and the update of the agents in sorted slots [s0, s1) of the grid `g` of the
// current positions (copied there, so the update can write pos in place). Touching pairs lie in
// neighbouring cells: cells are wider than the largest contact distance.
template <bool kUniform>
inline void contact_slots(const EnvView& ev, const Model& md, const Grid& g, const Grid& lg,
                          std::int64_t s0, std::int64_t s1, std::vector<Partner>& buf) {
  const float* xs = g.xs.data();
  const float* ys = g.ys.data();
  const float* rs = g.rs.data();
  const std::int32_t* ids = g.ids.data();
  for (auto s = static_cast<std::int32_t>(s0); s < s1; ++s) {
    const std::int64_t i = ids[s];
    const float xi = xs[s];
    const float yi = ys[s];
    const float ri = kUniform ? 0.0f : rs[s];
    std::int32_t lo[3], hi[3];
    g.rows_near(g.qs[static_cast<std::size_t>(s)], lo, hi);
    buf.clear();
    for (int w = 0; w < 3; ++w) {
      for (std::int32_t t0 = lo[w]; t0 < hi[w]; t0 += kLanes) {
        unsigned m = touch_mask<kUniform>(xs, ys, rs, t0, hi[w], xi, yi, ri, md.c.contact2);
        while (m != 0) {
          const std::int32_t t = t0 + lowest_bit(m);
          m &= m - 1;
          if (t == s) {
            continue;
          }
          const std::int64_t j = ids[t];
          const float dx = xi - xs[t];
          const float dy = yi - ys[t];
          const float rr = kUniform ? md.c.two_r : ri + rs[t];
          float fx, fy;
          pair_force(dx, dy, dx * dx + dy * dy, rr, md.c.k, j > i ? 1.0f : -1.0f, fx, fy);
          buf.push_back(Partner{j, fx, fy});
        }
      }
    }
    float sx = 0.0f;
    float sy = 0.0f;
    sum_partners(buf, sx, sy);
    if (md.m > 0) {
      add_landmark_terms(ev, md, lg, buf, i, xi, yi, sx, sy);
    }
    integrate(ev.pos + 2 * i, ev.vel + 2 * i, ev.force + 2 * i, sx, sy, md, i);
  }
}

// contacts[i] for the agents in sorted slots [s0, s1): the others with d2 < (r_i + r_j)^2.
template <bool kUniform>
inline void count_slots(const EnvView& ev, const Model& md, const Grid& g, std::int64_t s0,
                        std::int64_t s1) {
  const float* xs = g.xs.data();
  const float* ys = g.ys.data();
  const float* rs = g.rs.data();
  for (auto s = static_cast<std::int32_t>(s0); s < s1; ++s) {
    std::int32_t lo[3], hi[3];
    g.rows_near(g.qs[static_cast<std::size_t>(s)], lo, hi);
    int count = 0;
    for (int w = 0; w < 3; ++w) {
      for (std::int32_t t0 = lo[w]; t0 < hi[w]; t0 += kLanes) {
        const float ri = kUniform ? 0.0f : rs[s];
        unsigned m =
            touch_mask<kUniform>(xs, ys, rs, t0, hi[w], xs[s], ys[s], ri, md.c.contact2);
        if (s >= t0 && s < t0 + kLanes) {
          m &= ~(1u << (s - t0));  // not itself
        }
        count += bit_count(m);
      }
    }
    ev.contacts[g.ids[static_cast<std::size_t>(s)]] = count;
  }
}

// All-pairs contact sums of one environment into `sum` [N, 2] (the small-N and non-finite
// path): each pair once, f_ji = -f_ij exactly, every agent's terms added in ascending partner
// index, landmarks after the agents.
template <bool kUniform>
inline void brute_contact_sums(const EnvView& ev, const Model& md, const Grid& lg,
                               std::vector<Partner>& buf, float* sum) {
  const std::int64_t n = md.n;
  const float* pos = ev.pos;
  const float* r = md.r.data();
  std::fill(sum, sum + 2 * n, 0.0f);
  for (std::int64_t i = 0; i < n; ++i) {
    if (!is_active(ev, i)) {
      continue;
    }
    const float xi = pos[2 * i];
    const float yi = pos[2 * i + 1];
    float sx = sum[2 * i];
    float sy = sum[2 * i + 1];
    for (std::int64_t j = i + 1; j < n; ++j) {
      const float dx = xi - pos[2 * j];
      const float dy = yi - pos[2 * j + 1];
      const float d2 = dx * dx + dy * dy;
      const float rr = kUniform ? md.c.two_r : r[i] + r[j];
      if (!(d2 < (kUniform ? md.c.contact2 : rr * rr)) || !is_active(ev, j)) {
        continue;
      }
      float fx, fy;
      pair_force(dx, dy, d2, rr, md.c.k, 1.0f, fx, fy);
      sx += fx;
      sy += fy;
      sum[2 * j] += -fx;
      sum[2 * j + 1] += -fy;
    }
    sum[2 * i] = sx;
    sum[2 * i + 1] = sy;
  }
  for (std::int64_t i = 0; md.m > 0 && i < n; ++i) {
    if (is_active(ev, i)) {
      add_landmark_terms(ev, md, lg, buf, i, pos[2 * i], pos[2 * i + 1], sum[2 * i],
                         sum[2 * i + 1]);
    }
  }
}

template <bool kUniform>
inline void brute_count_contacts(const EnvView& ev, const Model& md) {
  const std::int64_t n = md.n;
  const float* pos = ev.pos;
  const float* r = md.r.data();
  std::fill(ev.contacts, ev.contacts + n, 0);
  for (std::int64_t i = 0; i < n; ++i) {
    if (!is_active(ev, i)) {
      continue;
    }
    for (std::int64_t j = i + 1; j < n; ++j) {
      const float dx = pos[2 * i] - pos[2 * j];
      const float dy = pos[2 * i + 1] - pos[2 * j + 1];
      const float rr = kUniform ? md.c.two_r : r[i] + r[j];
      if (dx * dx + dy * dy < (kUniform ? md.c.contact2 : rr * rr) && is_active(ev, j)) {
        ++ev.contacts[i];
        ++ev.contacts[j];
      }
    }
  }
}

inline double contact_cell(float reach) {
  // Wider than the largest contact distance by a margin, so that the rounding of the cell
  // coordinates never puts a touching pair two cells apart.
  return static_cast<double>(reach) * (1.0 + 1e-5) + 1e-30;
}

// Agents per cell of the contact grid, tuned on the navigation densities: below 1, cells are
// mostly empty and the 3x3 scan sees few candidates.
constexpr double kContactPerCell = 0.5;

// Prepare the landmark grid of one environment (when M is large enough to need one).
inline void prepare_landmarks(EnvView& ev, const Model& md, Grid& lg) {
  ev.lm_grid = md.m > kBruteForceMaxLandmarks &&
               lg.build(ev.lm, md.m, nullptr, nullptr, contact_cell(md.landmark_reach), 1.0);
}

// The grid of the active agents' current positions; false for small N or a non-finite position
// (then the all-pairs loops, exact for any input, are used).
inline bool build_contact_grid(const EnvView& ev, const Model& md, Grid& g) {
  return md.n > kBruteForceMaxAgents &&
         g.build(ev.pos, md.n, ev.active, md.uniform ? nullptr : md.r.data(),
                 contact_cell(md.agent_reach), kContactPerCell);
}

template <bool kUniform>
inline void substep_brute(const EnvView& ev, const Model& md, Scratch& sc) {
  const std::int64_t n = md.n;
  sc.sums.resize(static_cast<std::size_t>(2 * n));
  brute_contact_sums<kUniform>(ev, md, sc.landmarks, sc.partners, sc.sums.data());
  if (kUniform && ev.active == nullptr && md.max_speed == nullptr) {
    // The same update as integrate(), one coordinate at a time (a loop the compiler vectorizes).
    const StepConstants& c = md.c;
    for (std::int64_t q = 0; q < 2 * n; ++q) {
      float v = ev.vel[q] * c.a + (ev.force[q] + sc.sums[static_cast<std::size_t>(q)]) * c.b;
      float x = ev.pos[q] + v * c.h;
      if (x > c.lim) {
        x = c.lim;
        v = 0.0f;
      } else if (x < -c.lim) {
        x = -c.lim;
        v = 0.0f;
      }
      ev.vel[q] = v;
      ev.pos[q] = x;
    }
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    if (is_active(ev, i)) {
      integrate(ev.pos + 2 * i, ev.vel + 2 * i, ev.force + 2 * i, sc.sums[2 * i],
                sc.sums[2 * i + 1], md, i);
    }
  }
}

// One environment: S substeps, then the contact counts. With `parallel`, each phase is split
// over the threads by cells (the grid is built by the calling thread; the workers only read it
// and write their own agents).
template <bool kUniform>
inline void step_env(EnvView ev, const Model& md, Scratch& sc, bool parallel) {
  prepare_landmarks(ev, md, sc.landmarks);
  const Grid& g = sc.agents;
  const std::int64_t grain = grain_for(40.0);
  for (int s = 0; s < md.c.substeps; ++s) {
    if (!build_contact_grid(ev, md, sc.agents)) {
      substep_brute<kUniform>(ev, md, sc);
    } else if (!parallel) {
      contact_slots<kUniform>(ev, md, g, sc.landmarks, 0, g.count, sc.partners);
    } else {
      parallel_for(g.count, grain, [&](std::int64_t s0, std::int64_t s1) {
        contact_slots<kUniform>(ev, md, g, sc.landmarks, s0, s1, thread_scratch().partners);
      });
    }
  }
  if (!build_contact_grid(ev, md, sc.agents)) {
    brute_count_contacts<kUniform>(ev, md);
    return;
  }
  if (ev.active != nullptr) {
    std::fill(ev.contacts, ev.contacts + md.n, 0);  // inactive agents are not in the grid
  }
  if (!parallel) {
    count_slots<kUniform>(ev, md, g, 0, g.count);
  } else {
    parallel_for(g.count, grain, [&](std::int64_t s0, std::int64_t s1) {
      count_slots<kUniform>(ev, md, g, s0, s1);
    });
  }
}

inline void step_env_any(const EnvView& ev, const Model& md, Scratch& sc, bool parallel) {
  if (md.uniform) {
    step_env<true>(ev, md, sc, parallel);
  } else {
    step_env<false>(ev, md, sc, parallel);
  }
}

}  // namespace detail

// All environments. pos, vel updated in place; contacts written. Per environment: S substeps
// of (contact sums at the substep's start positions, then integrate), then the contact counts.
// Inactive agents (active[e, i] false) keep their pos and vel, exert and feel no force and count
// 0 contacts. Parallel over environments, or over the cells of one environment at a time when
// there are fewer environments than threads and many agents. Throws std::invalid_argument for
// bad parameters before touching any array.
inline void step(float* pos, float* vel, const float* force, std::int32_t* contacts,
                 std::int64_t num_envs, std::int64_t n, const StepParams& params,
                 const StepOptions& options = StepOptions{}) {
  const StepParams checked = check_options(params, options, n);
  const detail::Model md = detail::make_model(checked, options, n);
  auto view = [&](std::int64_t e) {
    return detail::EnvView{pos + e * n * 2,
                           vel + e * n * 2,
                           force + e * n * 2,
                           contacts + e * n,
                           options.active != nullptr ? options.active + e * n : nullptr,
                           md.m > 0 ? options.landmarks + e * md.m * 2 : nullptr};
  };
  if (num_envs < resolved_num_threads() && n >= detail::kIntraEnvMinAgents) {
    detail::Scratch& sc = detail::thread_scratch();
    for (std::int64_t e = 0; e < num_envs; ++e) {
      detail::step_env_any(view(e), md, sc, true);
    }
    return;
  }
  const double brute = n <= detail::kBruteForceMaxAgents ? 0.5 * static_cast<double>(n * n) : 0.0;
  const double per_env = (40.0 * static_cast<double>(n) + brute) * (md.c.substeps + 1);
  parallel_for(num_envs, detail::grain_for(per_env), [&](std::int64_t begin, std::int64_t end) {
    detail::Scratch& sc = detail::thread_scratch();
    for (std::int64_t e = begin; e < end; ++e) {
      detail::step_env_any(view(e), md, sc, false);
    }
  });
}

// ---- k nearest neighbours --------------------------------------------------------------------

namespace detail {

// The best k candidates by (d2, j), each packed in one uint64 whose integer order is that order
// (d2 >= 0, never NaN here: its float32 bits order like the number), so that comparisons are
// single integer compares. Small k: a sorted buffer, updated by a branch-free min/max pass;
// larger k: a max-heap.
class TopK {
 public:
  static std::uint64_t pack(float d2, std::int64_t j) {
    std::uint32_t bits;
    std::memcpy(&bits, &d2, sizeof bits);
    return (static_cast<std::uint64_t>(bits) << 32) | static_cast<std::uint32_t>(j);
  }
  static float d2_of(std::uint64_t key) {
    const auto bits = static_cast<std::uint32_t>(key >> 32);
    float d2;
    std::memcpy(&d2, &bits, sizeof d2);
    return d2;
  }
  static std::int64_t j_of(std::uint64_t key) { return static_cast<std::uint32_t>(key); }

  void reset(std::int64_t k) {
    k_ = k;
    count_ = 0;
    const std::int64_t width = k <= 8 ? 8 : k <= 16 ? 16 : k <= kSortedMaxK ? kSortedMaxK : k;
    buf_.resize(static_cast<std::size_t>(width));
    if (k_ <= kSortedMaxK) {
      std::fill(buf_.begin(), buf_.end(), kEmpty);
    }
  }

  bool full() const { return count_ == k_; }
  std::int64_t size() const { return count_; }
  // The d2 of the k-th best so far (valid when full()).
  float worst_d2() const { return d2_of(k_ <= kSortedMaxK ? buf_[k_ - 1] : buf_[0]); }

  void insert(float d2, std::int64_t j) {
    std::uint64_t x = pack(d2, j);
    std::uint64_t* b = buf_.data();
    if (k_ <= kSortedMaxK) {
      if (!(x < b[k_ - 1])) {  // an empty slot holds kEmpty, above every key
        return;
      }
      switch (k_) {  // a pass of fixed length: unrolled, no branches
        case 1: merge<1>(b, x); break;
        case 2: merge<2>(b, x); break;
        case 3: merge<3>(b, x); break;
        case 4: merge<4>(b, x); break;
        case 5: merge<5>(b, x); break;
        case 6: merge<6>(b, x); break;
        case 7: merge<7>(b, x); break;
        case 8: merge<8>(b, x); break;
        default: k_ <= 16 ? merge<16>(b, x) : merge<32>(b, x);  // the rest of the buffer holds
      }                                                          // the next smallest keys
      count_ += count_ < k_ ? 1 : 0;
      return;
    }
    if (count_ < k_) {
      b[count_++] = x;
      std::push_heap(b, b + count_);
    } else if (x < b[0]) {
      std::pop_heap(b, b + count_);
      b[count_ - 1] = x;
      std::push_heap(b, b + count_);
    }
  }

  // The keys in ascending (d2, j) order.
  const std::uint64_t* sorted() {
    if (k_ > kSortedMaxK) {
      std::sort_heap(buf_.begin(), buf_.begin() + count_);
    }
    return buf_.data();
  }

 private:
  // Insert x into the sorted W smallest keys, dropping the largest: a fixed, branch-free pass.
  template <int W>
  static void merge(std::uint64_t* b, std::uint64_t x) {
    for (int s = 0; s < W; ++s) {
      const std::uint64_t y = b[s];
      b[s] = x < y ? x : y;
      x = x < y ? y : x;
    }
  }

  static constexpr std::int64_t kSortedMaxK = 32;
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
  std::int64_t k_ = 0;
  std::int64_t count_ = 0;
  std::vector<std::uint64_t> buf_;
};

inline void write_neighbours(const float* pos, std::int64_t i, std::int64_t k, TopK& top,
                             float* rel, std::int64_t* idx) {
  const float xi = pos[2 * i];
  const float yi = pos[2 * i + 1];
  float* rel_i = rel + i * k * 2;
  std::int64_t* idx_i = idx + i * k;
  const std::int64_t found = top.size();
  const std::uint64_t* best = top.sorted();
  for (std::int64_t s = 0; s < found; ++s) {
    const std::int64_t j = TopK::j_of(best[s]);
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

// The all-pairs search of agent i (small N, non-finite positions).
inline void knn_brute(const float* pos, const bool* active, std::int64_t n, std::int64_t i,
                      float radius2, TopK& top) {
  const float xi = pos[2 * i];
  const float yi = pos[2 * i + 1];
  for (std::int64_t j = 0; j < n; ++j) {
    const float rx = pos[2 * j] - xi;
    const float ry = pos[2 * j + 1] - yi;
    const float d2 = rx * rx + ry * ry;
    // d2 <= radius2 also drops NaN.
    if (d2 <= radius2 && j != i && (active == nullptr || active[j])) {
      top.insert(d2, j);
    }
  }
}

// The grid search of the agent in sorted slot `self`: rings of cells at Chebyshev distance
// R = 0, 1, ... around its cell, until no unscanned agent can qualify or beat the k-th best.
// Every unscanned agent lies outside the scanned block, at least `e` from the agent (its
// distance to the block's nearest inner side, less a margin for the rounding of cell
// coordinates), so its float32 d2 is at least e^2 (1 - 3e-7) (three roundings) > `bound` =
// e^2 (1 - 1e-5). Exact: the same neighbours in the same order as knn_brute.
inline void knn_grid(const Grid& g, std::int32_t self, float radius2, TopK& top) {
  const float xi = g.xs[static_cast<std::size_t>(self)];
  const float yi = g.ys[static_cast<std::size_t>(self)];
  const float* xs = g.xs.data();
  const float* ys = g.ys.data();
  const std::int32_t* ids = g.ids.data();
  const std::int32_t* start = g.start.data();
  const std::int64_t cx = g.cx_of(xi);  // as in build (no integer division)
  const std::int64_t cy = g.cy_of(yi);
  const double margin = 1e-9 * (g.cell + std::fabs(static_cast<double>(xi)) +
                                std::fabs(static_cast<double>(yi)));
  // Cells c0..c1 of one row: a batch prefilter (d2 within the radius and not beyond the k-th
  // best), then the exact insertion.
  auto scan = [&](std::int64_t row, std::int64_t c0, std::int64_t c1) {
    const std::int32_t hi = start[g.at(c1, row) + 1];
    for (std::int32_t t0 = start[g.at(c0, row)]; t0 < hi; t0 += kLanes) {
      const float limit = top.full() ? std::min(radius2, top.worst_d2()) : radius2;
      Lanes d;
      unsigned m = lanes_within(xs, ys, t0, xi, yi, limit, d) & lanes_below(t0, hi);
      while (m != 0) {
        const int l = lowest_bit(m);
        m &= m - 1;
        if (t0 + l != self) {
          top.insert(d.d2[l], ids[t0 + l]);
        }
      }
    }
  };
  // Rings 0 and 1 together: the 3x3 block as three row ranges (border cells are empty).
  scan(cy, cx - 1, cx + 1);  // the own row first: near candidates early, fewer insertions
  scan(cy - 1, cx - 1, cx + 1);
  scan(cy + 1, cx - 1, cx + 1);
  for (std::int64_t R = 1;; ++R) {
    const std::int64_t x0 = cx - R, x1 = cx + R, y0 = cy - R, y1 = cy + R;
    const std::int64_t c0 = std::max<std::int64_t>(x0, 0), c1 = std::min(x1, g.gx - 1);
    if (R > 1 && y0 >= 0) {
      scan(y0, c0, c1);
    }
    if (R > 1 && y1 < g.gy) {
      scan(y1, c0, c1);
    }
    for (std::int64_t row = std::max<std::int64_t>(y0 + 1, 0);
         R > 1 && row <= std::min(y1 - 1, g.gy - 1); ++row) {
      if (x0 >= 0) {
        scan(row, x0, x0);
      }
      if (x1 < g.gx) {
        scan(row, x1, x1);
      }
    }
    double e = std::numeric_limits<double>::infinity();
    if (x0 > 0) {
      e = std::min(e, xi - (g.lo_x + static_cast<double>(x0) * g.cell));
    }
    if (x1 < g.gx - 1) {
      e = std::min(e, g.lo_x + static_cast<double>(x1 + 1) * g.cell - xi);
    }
    if (y0 > 0) {
      e = std::min(e, yi - (g.lo_y + static_cast<double>(y0) * g.cell));
    }
    if (y1 < g.gy - 1) {
      e = std::min(e, g.lo_y + static_cast<double>(y1 + 1) * g.cell - yi);
    }
    if (e == std::numeric_limits<double>::infinity()) {
      return;  // the block covers the whole grid
    }
    e -= margin;
    const double bound = e > 0.0 ? e * e * (1.0 - 1e-5) : 0.0;
    if (bound > static_cast<double>(radius2)) {
      return;
    }
    if (top.full() && static_cast<double>(top.worst_d2()) < bound) {
      return;
    }
  }
}

// Agents per cell of the kNN grid, tuned on random layouts: the cost of a query is the cells
// visited plus the candidates seen.
inline double knn_per_cell(std::int64_t k) { return std::max(0.5, 0.5 * static_cast<double>(k)); }

// The queries of the agents in sorted slots [s0, s1) of grid g.
inline void knn_slots(const Grid& g, const float* pos, std::int64_t k, float radius2,
                      std::int64_t s0, std::int64_t s1, float* rel, std::int64_t* idx,
                      TopK& top) {
  for (auto s = static_cast<std::int32_t>(s0); s < s1; ++s) {
    top.reset(k);
    knn_grid(g, s, radius2, top);
    write_neighbours(pos, g.ids[static_cast<std::size_t>(s)], k, top, rel, idx);
  }
}

inline void knn_env(const float* pos, const bool* active, std::int64_t n, std::int64_t k,
                    float radius2, float* rel, std::int64_t* idx, Scratch& sc, TopK& top,
                    bool parallel) {
  Grid& g = sc.agents;
  const bool grid =
      n > kBruteForceMaxAgents && g.build(pos, n, active, nullptr, 0.0, knn_per_cell(k));
  if (!grid) {
    for (std::int64_t i = 0; i < n; ++i) {
      top.reset(k);
      if (active == nullptr || active[i]) {
        knn_brute(pos, active, n, i, radius2, top);
      }
      write_neighbours(pos, i, k, top, rel, idx);
    }
    return;
  }
  for (std::int64_t i = 0; active != nullptr && i < n; ++i) {
    if (!active[i]) {  // not in the grid: an empty row
      top.reset(k);
      write_neighbours(pos, i, k, top, rel, idx);
    }
  }
  if (!parallel) {
    knn_slots(g, pos, k, radius2, 0, g.count, rel, idx, top);
    return;
  }
  parallel_for(g.count, grain_for(30.0 + 2.0 * static_cast<double>(k)),
               [&](std::int64_t s0, std::int64_t s1) {
                 static thread_local TopK local;
                 knn_slots(g, pos, k, radius2, s0, s1, rel, idx, local);
               });
}

}  // namespace detail

// All environments. For every agent i, the k nearest other agents ordered by (d2, j), only
// active ones with d2 <= radius2 (radius2 = float(radius)^2 in float32; radius may be +inf),
// into rel [N, k, 2] (pos_j - pos_i) and idx [N, k]; missing slots and the rows of inactive
// agents get rel 0 and idx -1. Throws std::invalid_argument for k < 0, k > N - 1 (N > 0) or
// radius not > 0.
inline void knn(const float* pos, std::int64_t num_envs, std::int64_t n, std::int64_t k,
                double radius, float* rel, std::int64_t* idx, const bool* active = nullptr) {
  detail::check_count("knn", "agents", n);
  if (k < 0 || k > std::max<std::int64_t>(n - 1, 0)) {
    throw std::invalid_argument("knn: k must be in [0, N - 1] = [0, " + std::to_string(n - 1) +
                                "] (other agents), got " + std::to_string(k));
  }
  if (!(radius > 0.0)) {
    throw std::invalid_argument("knn: radius must be > 0 (inf allowed), got " +
                                detail::fmt(radius));
  }
  const float rf = static_cast<float>(radius);
  const float radius2 = rf * rf;
  if (k == 0) {
    return;
  }
  auto env_active = [&](std::int64_t e) { return active != nullptr ? active + e * n : nullptr; };
  if (num_envs < resolved_num_threads() && n >= detail::kIntraEnvMinAgents) {
    detail::Scratch& sc = detail::thread_scratch();
    detail::TopK top;
    for (std::int64_t e = 0; e < num_envs; ++e) {
      detail::knn_env(pos + e * n * 2, env_active(e), n, k, radius2, rel + e * n * k * 2,
                      idx + e * n * k, sc, top, true);
    }
    return;
  }
  const double per_env = static_cast<double>(n) * (30.0 + 2.0 * static_cast<double>(k));
  parallel_for(num_envs, detail::grain_for(per_env), [&](std::int64_t begin, std::int64_t end) {
    detail::Scratch& sc = detail::thread_scratch();
    detail::TopK top;
    for (std::int64_t e = begin; e < end; ++e) {
      detail::knn_env(pos + e * n * 2, env_active(e), n, k, radius2, rel + e * n * k * 2,
                      idx + e * n * k, sc, top, false);
    }
  });
}

}  // namespace particles
}  // namespace marlkit
