// Header-only software rasteriser for the native 2-D scenarios: agents, goals and landmarks as
// (optionally anti-aliased) filled circles or rings, and the world bounds as a pixel border.
// No Python here: frames are raw row-major uint8 [height, width, 3] buffers.
//
// Conventions (the NumPy twin in platform/marlkit/native/render.py follows them operation by
// operation, so that both produce the same bytes; keep the two in step):
//  * World: the square [-L, L]^2 (L = half_extent), y pointing up. It maps onto the centred
//    side x side pixel square of the frame, side = min(height, width), offset by
//    ((width - side) / 2, (height - side) / 2) whole pixels.
//  * Pixel (row i, column j) covers [j, j + 1) x [i, i + 1) in pixel coordinates; its centre is
//    (j + 0.5, i + 0.5). Row 0 is the top of the picture.
//  * Coverage of a pixel by a circle of radius r (pixels) whose centre is at distance d from the
//    pixel centre: anti-aliased a = clamp((r + 0.5) - d, 0, 1) (filled) or
//    min((r + 0.5) - d, (d - r_in) + 0.5) (ring, r_in = max(r - line_width, 0)); quantised to
//    alpha = floor(a * 255 + 0.5); without anti-aliasing alpha = 255 where d <= r (and d >= r_in
//    for rings), else 0.
//  * Blending is integer: out = (src * alpha + dst * (255 - alpha) + 127) / 255.
//  * The pixel that contains the centre is painted fully for filled circles and for any circle
//    whose pixel radius is below 1, so a tiny agent still shows as one pixel.
//  * Circles partly or wholly outside the frame are clipped; circles whose pixel centre or
//    radius overflows to a non-finite value are skipped.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "marlkit/common.h"

namespace marlkit {
namespace render {

struct Rgb {
  std::uint8_t r;
  std::uint8_t g;
  std::uint8_t b;
};

// One frame: row-major [height, width, 3] uint8 pixels, row 0 at the top.
struct Frame {
  std::uint8_t* data;
  std::int64_t height;
  std::int64_t width;
};

// World-to-pixel transform of a frame (see the conventions at the top of this file).
struct Viewport {
  double half_extent;
  double scale;     // pixels per world unit
  double offset_x;  // whole pixels left of the world square
  double offset_y;  // whole pixels above the world square
  std::int64_t side;

  double to_px(double x) const { return (x + half_extent) * scale + offset_x; }
  double to_py(double y) const { return (half_extent - y) * scale + offset_y; }
};

inline Viewport make_viewport(double half_extent, std::int64_t height, std::int64_t width) {
  if (!(std::isfinite(half_extent) && half_extent > 0.0)) {
    throw std::invalid_argument("render: half_extent must be a finite number > 0, got " +
                                std::to_string(half_extent));
  }
  if (height <= 0 || width <= 0) {
    throw std::invalid_argument("render: frame size must be positive, got height=" +
                                std::to_string(height) + ", width=" + std::to_string(width));
  }
  Viewport v{};
  v.half_extent = half_extent;
  v.side = std::min(height, width);
  v.scale = static_cast<double>(v.side) / (2.0 * half_extent);
  v.offset_x = static_cast<double>((width - v.side) / 2);
  v.offset_y = static_cast<double>((height - v.side) / 2);
  return v;
}

// Fill the whole frame with one colour.
inline void clear(Frame f, Rgb c) {
  const std::int64_t row_bytes = f.width * 3;
  if (f.height <= 0 || f.width <= 0) {
    return;
  }
  std::uint8_t* row0 = f.data;
  for (std::int64_t j = 0; j < f.width; ++j) {
    row0[3 * j] = c.r;
    row0[3 * j + 1] = c.g;
    row0[3 * j + 2] = c.b;
  }
  for (std::int64_t i = 1; i < f.height; ++i) {
    std::memcpy(f.data + i * row_bytes, row0, static_cast<std::size_t>(row_bytes));
  }
}

// Fill the pixel rectangle rows [r0, r1) x columns [c0, c1), clipped to the frame.
inline void fill_rect(Frame f, std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1,
                      Rgb c) {
  r0 = std::max<std::int64_t>(r0, 0);
  c0 = std::max<std::int64_t>(c0, 0);
  r1 = std::min(r1, f.height);
  c1 = std::min(c1, f.width);
  for (std::int64_t i = r0; i < r1; ++i) {
    std::uint8_t* p = f.data + (i * f.width + c0) * 3;
    for (std::int64_t j = c0; j < c1; ++j, p += 3) {
      p[0] = c.r;
      p[1] = c.g;
      p[2] = c.b;
    }
  }
}

// Draw the world bounds as a border `width` pixels thick, inside the world square.
inline void draw_border(Frame f, const Viewport& v, std::int64_t width, Rgb c) {
  if (width <= 0) {
    return;
  }
  const auto ox = static_cast<std::int64_t>(v.offset_x);
  const auto oy = static_cast<std::int64_t>(v.offset_y);
  const std::int64_t s = v.side;
  const std::int64_t w = std::min(width, s);
  fill_rect(f, oy, oy + w, ox, ox + s, c);          // top
  fill_rect(f, oy + s - w, oy + s, ox, ox + s, c);  // bottom
  fill_rect(f, oy, oy + s, ox, ox + w, c);          // left
  fill_rect(f, oy, oy + s, ox + s - w, ox + s, c);  // right
}

// Blend `c` over the pixel at `p` with integer alpha in [0, 255].
inline void blend(std::uint8_t* p, Rgb c, int alpha) {
  if (alpha >= 255) {
    p[0] = c.r;
    p[1] = c.g;
    p[2] = c.b;
    return;
  }
  const auto a = static_cast<std::uint32_t>(alpha);
  const std::uint32_t na = 255u - a;
  p[0] = static_cast<std::uint8_t>((c.r * a + p[0] * na + 127u) / 255u);
  p[1] = static_cast<std::uint8_t>((c.g * a + p[1] * na + 127u) / 255u);
  p[2] = static_cast<std::uint8_t>((c.b * a + p[2] * na + 127u) / 255u);
}

// Alpha in [0, 255] of a pixel whose centre lies at distance d from the circle centre.
inline int coverage_alpha(double d, double r, double r_in, bool filled, bool antialias) {
  if (!antialias) {
    const bool inside = d <= r && (filled || d >= r_in);
    return inside ? 255 : 0;
  }
  double a = (r + 0.5) - d;
  if (!filled) {
    a = std::min(a, (d - r_in) + 0.5);
  }
  if (a <= 0.0) {
    return 0;
  }
  if (a >= 1.0) {
    return 255;
  }
  return static_cast<int>(std::floor(a * 255.0 + 0.5));
}

// Draw one circle given in pixel coordinates (centre (cx, cy), radius r, y down).
// `line_width` (pixels) is the thickness of a ring, measured inwards from r; unused when filled.
inline void draw_circle(Frame f, double cx, double cy, double r, Rgb c, bool filled,
                        double line_width, bool antialias) {
  if (!(std::isfinite(cx) && std::isfinite(cy) && std::isfinite(r))) {
    return;
  }
  r = std::max(r, 0.0);
  const double reach = r + 1.0;
  const double x_lo = std::floor(cx - reach);
  const double x_hi = std::floor(cx + reach);
  const double y_lo = std::floor(cy - reach);
  const double y_hi = std::floor(cy + reach);
  const auto w_last = static_cast<double>(f.width - 1);
  const auto h_last = static_cast<double>(f.height - 1);
  if (x_hi < 0.0 || y_hi < 0.0 || x_lo > w_last || y_lo > h_last) {
    return;  // the whole box (and so the centre pixel) is outside the frame
  }
  const auto j0 = static_cast<std::int64_t>(std::max(x_lo, 0.0));
  const auto j1 = static_cast<std::int64_t>(std::min(x_hi, w_last));
  const auto i0 = static_cast<std::int64_t>(std::max(y_lo, 0.0));
  const auto i1 = static_cast<std::int64_t>(std::min(y_hi, h_last));
  const double r_in = std::max(r - line_width, 0.0);
  for (std::int64_t i = i0; i <= i1; ++i) {
    const double dy = (static_cast<double>(i) + 0.5) - cy;
    const double dy2 = dy * dy;
    std::uint8_t* p = f.data + (i * f.width + j0) * 3;
    for (std::int64_t j = j0; j <= j1; ++j, p += 3) {
      const double dx = (static_cast<double>(j) + 0.5) - cx;
      const double d = std::sqrt(dx * dx + dy2);
      const int alpha = coverage_alpha(d, r, r_in, filled, antialias);
      if (alpha > 0) {
        blend(p, c, alpha);
      }
    }
  }
  if (filled || r < 1.0) {
    const double ci = std::floor(cy);
    const double cj = std::floor(cx);
    if (ci >= 0.0 && ci <= h_last && cj >= 0.0 && cj <= w_last) {
      blend(f.data + (static_cast<std::int64_t>(ci) * f.width + static_cast<std::int64_t>(cj)) * 3,
            c, 255);
    }
  }
}

// A layer of M circles in world coordinates, drawn in index order.
struct CircleLayer {
  const double* centers;       // [B, M, 2] or [M, 2] (then frame_stride == 0)
  std::int64_t frame_stride;   // doubles between consecutive frames' centres: M * 2 or 0
  const double* radius;        // [M], world units
  const std::uint8_t* colors;  // [M, 3]
  std::int64_t count;          // M
  bool filled;
  double line_width;           // pixels, rings only
};

// Draw frame `b` of a batch: background, world border, then the layers in order.
inline void render_one(Frame f, const Viewport& v, std::int64_t b,
                       const std::vector<CircleLayer>& layers, Rgb background, Rgb border,
                       std::int64_t border_width, bool antialias) {
  clear(f, background);
  draw_border(f, v, border_width, border);
  for (const CircleLayer& layer : layers) {
    const double* xy = layer.centers + b * layer.frame_stride;
    for (std::int64_t m = 0; m < layer.count; ++m) {
      const std::uint8_t* col = layer.colors + 3 * m;
      draw_circle(f, v.to_px(xy[2 * m]), v.to_py(xy[2 * m + 1]), layer.radius[m] * v.scale,
                  Rgb{col[0], col[1], col[2]}, layer.filled, layer.line_width, antialias);
    }
  }
}

// Render `batch` frames into `out` (row-major [batch, height, width, 3]), frames spread over
// threads. Inputs are assumed checked (finite centres and radii, radius >= 0, line_width > 0).
inline void render_batch(std::uint8_t* out, std::int64_t batch, std::int64_t height,
                         std::int64_t width, double half_extent,
                         const std::vector<CircleLayer>& layers, Rgb background, Rgb border,
                         std::int64_t border_width, bool antialias) {
  if (batch < 0) {
    throw std::invalid_argument("render: batch must be >= 0, got " + std::to_string(batch));
  }
  const Viewport v = make_viewport(half_extent, height, width);
  const std::int64_t frame_bytes = height * width * 3;
  // A 256x256 frame with ~100 circles takes tens of microseconds: spawning a thread costs about
  // as much, so each thread gets several frames.
  parallel_for(batch, 4, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t b = begin; b < end; ++b) {
      render_one(Frame{out + b * frame_bytes, height, width}, v, b, layers, background, border,
                 border_width, antialias);
    }
  });
}

}  // namespace render
}  // namespace marlkit
