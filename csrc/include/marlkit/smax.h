// SMAX: StarCraft-style unit micromanagement (JaxMARL's SMAX rules), batched over environments.
//
// Three kernels over E battles of N = A + M units (A allies first, then M enemies), each the
// float32 twin of platform/marlkit/native/smax.py's torch code, operation for operation:
//   * ticks: `T` world ticks of movement, attacks, wall deaths and pushing apart;
//   * observe: the unit-list observations, entity visibility, action masks and world state;
//   * heuristic: SMAX's scripted enemy (attack_mode "closest").
// Randomness (cooldown jitter, the heuristic's choice) comes in as uniform draws, so the result
// does not depend on the threads. Square roots are std::sqrt on floats (correctly rounded); sums
// run in index order. Environments are independent: parallel_for over them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "marlkit/common.h"

namespace marlkit {
namespace smax {

constexpr int kTypes = 6;
constexpr int kStats = 7;  // speed, damage, attack range, sight range, radius, health, cooldown
constexpr int kSpeed = 0, kDamage = 1, kRange = 2, kSight = 3, kRadius = 4, kHealth = 5,
              kCooldown = 6;
constexpr int kMoves = 5;  // +y, +x, -y, -x, stop; then 5 + k attacks the other team's k-th
constexpr int kUnitFeatures = 7 + kTypes;
constexpr int kOwnFeatures = 4 + kTypes;

// The world of E battles: pointers into [E, N] (pos, prev_move: [E, N, 2]) arrays.
struct World {
  float* pos;
  float* health;
  float* cooldown;
  bool* alive;
  const std::int64_t* types;
  float* prev_move;
  std::int64_t* prev_attack;
  std::int64_t E, N, A;
};

struct Map {
  float width, height;
};

inline float norm2(float x, float y) { return std::sqrt(x * x + y * y); }

// Environments per task so that a thread gets at least min_work_per_thread() units of work.
inline std::int64_t envs_per_thread(std::int64_t work_per_env) {
  return std::max<std::int64_t>(1, min_work_per_thread() / std::max<std::int64_t>(1, work_per_env));
}

// The move of discrete action a (SMAX writes a diagonal unit vector rotated by 45 degrees).
inline void decode_move(std::int64_t a, float& x, float& y) {
  if (a >= kMoves - 1 || a < 0) {
    x = 0.0f;
    y = 0.0f;
    return;
  }
  const float c = 1.0f / std::sqrt(2.0f);
  const float dx = ((a / 2) % 2 == 0 ? 1.0f : -1.0f) * c;
  const float dy = (((a / 2) + (a % 2)) % 2 == 0 ? 1.0f : -1.0f) * c;
  x = c * dx + -c * dy;
  y = c * dx + c * dy;
}

// The unit that unit i attacks with action a (i itself when a is not an attack).
inline std::int64_t attack_target(std::int64_t i, std::int64_t a, std::int64_t N, std::int64_t A) {
  if (a < kMoves) {
    return i;
  }
  const std::int64_t k = a - kMoves;
  const std::int64_t t = i < A ? k + A : A - 1 - k;
  return std::min<std::int64_t>(std::max<std::int64_t>(t, 0), N - 1);
}

// Push overlapping live units apart (one environment): p_i += sum_j (p_i - p_j) *
// relu((r_i + r_j) / (d_ij + 1e-6) - 1) / 2 over live j, in ascending j.
inline void push_apart(float* pos, const bool* alive, const float* radius, std::int64_t N,
                       float* scratch) {
  for (std::int64_t i = 0; i < N; ++i) {
    float sx = 0.0f, sy = 0.0f;
    if (alive[i]) {
      const float px = pos[2 * i], py = pos[2 * i + 1];
      for (std::int64_t j = 0; j < N; ++j) {
        if (j == i || !alive[j]) {
          continue;
        }
        const float dx = px - pos[2 * j], dy = py - pos[2 * j + 1];
        const float rsum = radius[i] + radius[j];
        const float s = dx * dx + dy * dy;
        if (s > rsum * rsum * 1.001f) {  // far apart: the overlap term is exactly 0
          continue;
        }
        const float dist = (std::sqrt(s) + 0.0f) + 1e-6f;
        const float overlap = std::max(rsum / dist - 1.0f, 0.0f);
        sx += dx * overlap;
        sy += dy * overlap;
      }
    }
    scratch[2 * i] = sx;
    scratch[2 * i + 1] = sy;
  }
  for (std::int64_t i = 0; i < N; ++i) {
    if (alive[i]) {
      pos[2 * i] = pos[2 * i] + scratch[2 * i] / 2.0f;
      pos[2 * i + 1] = pos[2 * i + 1] + scratch[2 * i + 1] / 2.0f;
    }
  }
}

// Advance every battle by T ticks. actions [E, N], jitter [E, T, N], table [6, 7].
inline void ticks(const World& w, const std::int64_t* actions, const float* jitter,
                  std::int64_t T, const float* table, Map map, float dt, bool walls_kill) {
  const std::int64_t N = w.N, A = w.A;
  auto run = [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> step(2 * N), moved(2 * N), scratch(2 * N), radius(N), health(N);
    std::vector<std::int64_t> target(N);
    std::vector<char> attack(N), valid(N);
    for (std::int64_t e = begin; e < end; ++e) {
      float* pos = w.pos + e * N * 2;
      float* hp = w.health + e * N;
      float* cd = w.cooldown + e * N;
      bool* alive = w.alive + e * N;
      const std::int64_t* types = w.types + e * N;
      const std::int64_t* act = actions + e * N;
      for (std::int64_t i = 0; i < N; ++i) {
        const float* s = table + types[i] * kStats;
        float mx, my;
        decode_move(std::min<std::int64_t>(act[i], kMoves), mx, my);
        step[2 * i] = mx * s[kSpeed] * dt;
        step[2 * i + 1] = my * s[kSpeed] * dt;
        w.prev_move[(e * N + i) * 2] = mx;
        w.prev_move[(e * N + i) * 2 + 1] = my;
        attack[i] = act[i] >= kMoves;
        target[i] = attack_target(i, act[i], N, A);
        radius[i] = s[kRadius];
      }
      for (std::int64_t t = 0; t < T; ++t) {
        const float* jit = jitter + (e * T + t) * N;
        for (std::int64_t i = 0; i < N; ++i) {
          const float* s = table + types[i] * kStats;
          float x = pos[2 * i], y = pos[2 * i + 1];
          if (alive[i]) {
            x = std::max(std::min(x + step[2 * i], map.width), 0.0f);
            y = std::max(std::min(y + step[2 * i + 1], map.height), 0.0f);
          }
          moved[2 * i] = x;
          moved[2 * i + 1] = y;
          const std::int64_t j = target[i];
          const float dx = pos[2 * i] - pos[2 * j], dy = pos[2 * i + 1] - pos[2 * j + 1];
          valid[i] = attack[i] && norm2(dx, dy) < s[kRange] && alive[i] && alive[j] && j != i &&
                     cd[i] <= 0.0f;
          health[i] = hp[i];
        }
        for (std::int64_t i = 0; i < N; ++i) {
          if (valid[i]) {
            health[target[i]] += -table[types[i] * kStats + kDamage];
          }
        }
        for (std::int64_t i = 0; i < N; ++i) {
          const float* s = table + types[i] * kStats;
          const float reload = (s[kCooldown] + jit[i]) - cd[i];
          cd[i] = cd[i] + (valid[i] ? reload : -dt);
          float h = std::max(health[i], 0.0f);
          const float x = moved[2 * i], y = moved[2 * i + 1];
          pos[2 * i] = x;
          pos[2 * i + 1] = y;
          if (walls_kill && (x <= 0.0f || y <= 0.0f || x >= map.width || y >= map.height)) {
            h = 0.0f;
          }
          hp[i] = h;
          alive[i] = h > 0.0f;
        }
        push_apart(pos, alive, radius.data(), N, scratch.data());
      }
      for (std::int64_t i = 0; i < N; ++i) {
        w.prev_attack[e * N + i] = attack[i] ? act[i] : 0;
      }
    }
  };
  parallel_for(w.E, envs_per_thread(T * N * N * 2), run);
}

// The k-th other unit that unit i observes: ascending for an ally, descending for an enemy.
inline std::int64_t observed(std::int64_t i, std::int64_t k, std::int64_t N, std::int64_t A) {
  if (i < A) {
    return k < i ? k : k + 1;
  }
  const std::int64_t j = N - 1 - k;
  return j > i ? j : j - 1;
}

// Observations [E, n_obs, 13 (N - 1) + 10], visibility [E, n_obs, N - 1], ally masks
// [E, A, 5 + M], enemy masks [E, M, 5 + A] (or null), world state [E, 12 N].
inline void observe(const World& w, const float* table, Map map, bool see_enemy_actions,
                    std::int64_t n_obs, float* obs, bool* visible, bool* ally_mask,
                    bool* enemy_mask, float* state) {
  const std::int64_t N = w.N, A = w.A, M = N - A;
  const std::int64_t D = kUnitFeatures * (N - 1) + kOwnFeatures;
  auto run = [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> unit(N * kUnitFeatures), own(N * kOwnFeatures);
    for (std::int64_t e = begin; e < end; ++e) {
      const float* pos = w.pos + e * N * 2;
      const float* hp = w.health + e * N;
      const float* cd = w.cooldown + e * N;
      const bool* alive = w.alive + e * N;
      const std::int64_t* types = w.types + e * N;
      const float* pm = w.prev_move + e * N * 2;
      const std::int64_t* pa = w.prev_attack + e * N;
      float* st = state + e * (kOwnFeatures + 2) * N;
      for (std::int64_t j = 0; j < N; ++j) {
        const float* s = table + types[j] * kStats;
        float* u = unit.data() + j * kUnitFeatures;
        std::fill(u, u + kUnitFeatures, 0.0f);
        const float health = hp[j] / s[kHealth];
        const float c = std::min(std::max(cd[j] / s[kCooldown], 0.0f), 1.0f);
        const float largest = j >= A ? static_cast<float>(A + kMoves - 1)
                                     : static_cast<float>(M + kMoves - 1);
        u[0] = health;
        u[3] = pm[2 * j];
        u[4] = pm[2 * j + 1];
        u[5] = static_cast<float>(pa[j]) / largest;
        u[6] = c;
        u[7 + types[j]] = 1.0f;
        float* o = own.data() + j * kOwnFeatures;
        float* sj = st + j * kOwnFeatures;
        std::fill(o, o + kOwnFeatures, 0.0f);
        std::fill(sj, sj + kOwnFeatures, 0.0f);
        if (alive[j]) {
          o[0] = health;
          o[1] = pos[2 * j] / map.width;
          o[2] = pos[2 * j + 1] / map.height;
          o[3] = c;
          o[4 + types[j]] = 1.0f;
          sj[0] = health;
          sj[1] = pos[2 * j];
          sj[2] = pos[2 * j + 1];
          sj[3] = cd[j];
          sj[4 + types[j]] = 1.0f;
        }
        st[kOwnFeatures * N + j] = j >= A ? 1.0f : 0.0f;
        st[(kOwnFeatures + 1) * N + j] = static_cast<float>(types[j]);
      }
      for (std::int64_t i = 0; i < n_obs; ++i) {
        const float sight = table[types[i] * kStats + kSight];
        const float reach = table[types[i] * kStats + kRange];
        float* o = obs + (e * n_obs + i) * D;
        bool* vis = visible + (e * n_obs + i) * (N - 1);
        for (std::int64_t k = 0; k < N - 1; ++k) {
          const std::int64_t j = observed(i, k, N, A);
          const float dx = pos[2 * j] - pos[2 * i], dy = pos[2 * j + 1] - pos[2 * i + 1];
          const bool v = norm2(dx, dy) < sight && alive[i] && alive[j];
          vis[k] = v;
          float* f = o + k * kUnitFeatures;
          if (!v) {
            std::fill(f, f + kUnitFeatures, 0.0f);
            continue;
          }
          std::copy(unit.data() + j * kUnitFeatures, unit.data() + (j + 1) * kUnitFeatures, f);
          f[1] = dx / sight;
          f[2] = dy / sight;
          if (!see_enemy_actions && ((i >= A) != (j >= A))) {
            f[3] = f[4] = f[5] = 0.0f;
          }
        }
        std::copy(own.data() + i * kOwnFeatures, own.data() + (i + 1) * kOwnFeatures,
                  o + (N - 1) * kUnitFeatures);
        // Action mask: moves while alive, stop always, attacks on live others in range.
        const bool ally = i < A;
        const std::int64_t others = ally ? M : A;
        bool* mk = ally ? ally_mask + (e * A + i) * (kMoves + M)
                        : enemy_mask + (e * M + (i - A)) * (kMoves + A);
        for (int a = 0; a < kMoves - 1; ++a) {
          mk[a] = alive[i];
        }
        mk[kMoves - 1] = true;
        for (std::int64_t k = 0; k < others; ++k) {
          const std::int64_t t = ally ? A + k : A - 1 - k;
          const float dx = pos[2 * t] - pos[2 * i], dy = pos[2 * t + 1] - pos[2 * i + 1];
          mk[kMoves + k] = norm2(dx, dy) < reach && alive[t] && alive[i];
        }
      }
    }
  };
  parallel_for(w.E, envs_per_thread(n_obs * N * kUnitFeatures), run);
}

// SMAX's heuristic enemy: actions [E, M]; target [E, M, 2] and last [E, M] updated in place;
// u [E, M] uniform draws choosing which seen ally to chase.
inline void heuristic(const World& w, float* target, std::int64_t* last, const float* u,
                      const float* table, Map map, std::int64_t* out) {
  const std::int64_t N = w.N, A = w.A, M = N - A;
  const float far = static_cast<float>(
      std::sqrt(static_cast<double>(map.width) * map.width +
                static_cast<double>(map.height) * map.height));
  const float cx = map.width / 2.0f, cy = map.height / 2.0f;
  auto run = [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> rx(A), ry(A), dist(A), cum(A);
    std::vector<char> vis(A), shoot(A);
    for (std::int64_t e = begin; e < end; ++e) {
      const float* pos = w.pos + e * N * 2;
      const float* hp = w.health + e * N;
      const bool* alive = w.alive + e * N;
      const std::int64_t* types = w.types + e * N;
      for (std::int64_t m = 0; m < M; ++m) {
        const std::int64_t me = A + m;
        const bool live = alive[me];
        const std::int64_t type = live ? types[me] : 0;
        const float sight_true = table[types[me] * kStats + kSight];
        const float sight = table[type * kStats + kSight];
        const float reach = table[type * kStats + kRange];
        const float ox = live ? pos[2 * me] : 0.0f, oy = live ? pos[2 * me + 1] : 0.0f;
        std::int64_t count = 0, closest = 0;
        bool can_shoot = false;
        float best = far;
        for (std::int64_t k = 0; k < A; ++k) {
          const std::int64_t j = A - 1 - k;
          const float dx = pos[2 * j] - pos[2 * me], dy = pos[2 * j + 1] - pos[2 * me + 1];
          const bool v = norm2(dx, dy) < sight_true && live && alive[j] && hp[j] > 0.0f;
          vis[k] = v;
          rx[k] = v ? (dx / sight_true) * sight : 0.0f;
          ry[k] = v ? (dy / sight_true) * sight : 0.0f;
          dist[k] = norm2(rx[k], ry[k]);
          shoot[k] = dist[k] < reach && v;
          count += v;
          can_shoot = can_shoot || shoot[k];
          const float key = shoot[k] ? dist[k] : far;
          if (k == 0 || key < best) {  // the first smallest, as argmin
            best = key;
            closest = k;
          }
        }
        std::int64_t& prev = last[e * M + m];
        const bool keep = prev != -1 && shoot[std::max<std::int64_t>(prev, 0)];
        const std::int64_t attacked = keep ? prev : closest;
        float* tg = target + (e * M + m) * 2;
        if (tg[0] == 0.0f && tg[1] == 0.0f && prev == -1) {
          tg[0] = -(ox - cx) + cx;
          tg[1] = -(oy - cy) + cy;
        }
        // The ally to chase: inverse CDF of u over the seen ones (as jax.random.choice).
        float gx = tg[0], gy = tg[1];
        if (count > 0) {
          double run_sum = 0.0;
          const float share = 1.0f / static_cast<float>(count);
          for (std::int64_t k = 0; k < A; ++k) {
            run_sum += static_cast<double>(vis[k] ? share : 0.0f);
            cum[k] = static_cast<float>(run_sum);
          }
          const float r = cum[A - 1] * (1.0f - u[e * M + m]);
          std::int64_t pick = std::lower_bound(cum.begin(), cum.end(), r) - cum.begin();
          pick = std::min<std::int64_t>(pick, A - 1);
          gx = rx[pick] + ox;
          gy = ry[pick] + oy;
        }
        const float vx = gx - ox, vy = gy - oy;
        const float sim[4] = {vy, vx, -vy, -vx};
        std::int64_t move = 0;
        for (int a = 1; a < 4; ++a) {
          if (sim[a] > sim[move]) {
            move = a;
          }
        }
        prev = shoot[attacked] ? attacked : -1;
        out[e * M + m] = can_shoot ? attacked + kMoves : move;
      }
    }
  };
  parallel_for(w.E, envs_per_thread(M * A * 8), run);
}

}  // namespace smax
}  // namespace marlkit
