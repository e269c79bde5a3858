// The one bindings file of marlkit._C. Kernels live in csrc/include/marlkit/*.h (no Python there);
// this file checks arrays, releases the GIL around the work and documents each function.
// Arrays cross as NumPy buffers: torch CPU tensors convert zero-copy through tensor.numpy().
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "marlkit/common.h"

namespace py = pybind11;

#ifndef MARLKIT_SOURCE_HASH
#define MARLKIT_SOURCE_HASH "unknown"
#endif

// Bumped whenever a binding's signature changes; the Python loader checks it.
static constexpr int kAbiVersion = 4;

// --- section: particles (bind_particles) ---------------------------------------------------
#include "marlkit/lidar.h"
#include "marlkit/particles.h"

namespace particles_bind {

std::string shape_str(const py::array& a) {
  std::string s = "[";
  for (py::ssize_t d = 0; d < a.ndim(); ++d) {
    s += (d ? ", " : "") + std::to_string(a.shape(d));
  }
  return s + "]";
}

std::string dims_str(const std::vector<py::ssize_t>& dims) {
  std::string s = "[";
  for (std::size_t d = 0; d < dims.size(); ++d) {
    s += (d ? ", " : "") + std::to_string(dims[d]);
  }
  return s + "]";
}

// Check that `obj` is a NumPy array of dtype T, shape `dims` (described as `layout`),
// C-contiguous and, when `writable`, writeable; return it without any copy.
template <typename T>
py::array checked(const py::object& obj, const char* fn, const char* name, const char* dtype_name,
                  const char* layout, const std::vector<py::ssize_t>& dims, bool writable) {
  const std::string article = dtype_name[0] == 'i' ? " must be an " : " must be a ";
  const std::string what = std::string(fn) + ": " + name + article + dtype_name +
                           " array of shape " + layout + " = " + dims_str(dims);
  if (!py::isinstance<py::array>(obj)) {
    throw py::type_error(what + ", got an object of type " +
                         std::string(py::str(py::type::of(obj).attr("__name__"))));
  }
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (a.ndim() != static_cast<py::ssize_t>(dims.size())) {
    throw std::invalid_argument(what + ", got " + std::to_string(a.ndim()) +
                                " dimensions (shape " + shape_str(a) + ")");
  }
  for (std::size_t d = 0; d < dims.size(); ++d) {
    if (a.shape(static_cast<py::ssize_t>(d)) != dims[d]) {
      throw std::invalid_argument(what + ", got shape " + shape_str(a));
    }
  }
  if (!py::isinstance<py::array_t<T>>(a)) {
    throw std::invalid_argument(what + ", got dtype " + std::string(py::str(a.dtype())));
  }
  if (!(a.flags() & py::array::c_style)) {
    throw std::invalid_argument(what + " and C-contiguous, got a non-contiguous array");
  }
  if (writable && !a.writeable()) {
    throw std::invalid_argument(what + " and writeable (it is written in place), got a "
                                       "read-only array");
  }
  return a;
}

// The [E, N, 2] layout of an agent-state array, checked before E and N are read from it:
// TypeError when it is not an array, ValueError for another shape (dtype and layout are checked
// by `checked` once the sizes are known).
py::array state_layout(const py::object& obj, const char* fn, const char* name) {
  const std::string what =
      std::string(fn) + ": " + name + " must be a float32 array of shape [E, N, 2], got ";
  if (!py::isinstance<py::array>(obj)) {
    throw py::type_error(what + "an object of type " +
                         std::string(py::str(py::type::of(obj).attr("__name__"))));
  }
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (a.ndim() != 3 || a.shape(2) != 2) {
    throw std::invalid_argument(what + "shape " + shape_str(a));
  }
  return a;
}

// The first array is written; it must not share memory with the second.
void check_no_overlap(const py::array& out, const char* out_name, const py::array& other,
                      const char* other_name, const char* fn) {
  const auto* o0 = static_cast<const char*>(out.data());
  const auto* t0 = static_cast<const char*>(other.data());
  const auto on = out.nbytes();
  const auto tn = other.nbytes();
  if (on > 0 && tn > 0 && o0 < t0 + tn && t0 < o0 + on) {
    throw std::invalid_argument(std::string(fn) + ": " + out_name + " is written in place and " +
                                "must not share memory with " + other_name);
  }
}

// A float32 array of `n` values, or one number broadcast to all: what `radius`, `max_speed` and
// `landmark_radius` accept. Keeps the array (or the broadcast copy) alive while in use.
struct FloatValues {
  py::array array;
  std::vector<float> copy;
  const float* data = nullptr;
};

FloatValues float_values(const py::object& obj, const char* fn, const char* name,
                         const char* layout, py::ssize_t n) {
  FloatValues out;
  if (py::isinstance<py::array>(obj)) {
    out.array = checked<float>(obj, fn, name, "float32", layout, {n}, false);
    out.data = static_cast<const float*>(out.array.data());
    return out;
  }
  if (!py::isinstance<py::float_>(obj) && !py::isinstance<py::int_>(obj)) {
    throw py::type_error(std::string(fn) + ": " + name + " must be a number or a float32 array " +
                         "of shape " + layout + ", got an object of type " +
                         std::string(py::str(py::type::of(obj).attr("__name__"))));
  }
  out.copy.assign(static_cast<std::size_t>(n), static_cast<float>(obj.cast<double>()));
  out.data = out.copy.data();
  return out;
}

void particle_step(const py::object& pos_obj, const py::object& vel_obj,
                   const py::object& force_obj, const py::object& contacts_obj,
                   const py::object& radius, double mass, double drag, double dt, int substeps,
                   double stiffness, double half_extent, const py::object& max_speed,
                   const py::object& active_obj, const py::object& landmarks_obj,
                   const py::object& landmark_radius) {
  const char* fn = "particle_step";
  const py::array pos0 = state_layout(pos_obj, fn, "pos");
  const py::ssize_t E = pos0.shape(0);
  const py::ssize_t N = pos0.shape(1);
  const std::vector<py::ssize_t> state{E, N, 2};
  py::array pos = checked<float>(pos_obj, fn, "pos", "float32", "[E, N, 2]", state, true);
  py::array vel = checked<float>(vel_obj, fn, "vel", "float32", "[E, N, 2]", state, true);
  py::array force = checked<float>(force_obj, fn, "force", "float32", "[E, N, 2]", state, false);
  py::array contacts =
      checked<std::int32_t>(contacts_obj, fn, "contacts_out", "int32", "[E, N]", {E, N}, true);
  check_no_overlap(pos, "pos", vel, "vel", fn);
  check_no_overlap(pos, "pos", force, "force", fn);
  check_no_overlap(vel, "vel", force, "force", fn);
  check_no_overlap(contacts, "contacts_out", pos, "pos", fn);
  check_no_overlap(contacts, "contacts_out", vel, "vel", fn);
  check_no_overlap(contacts, "contacts_out", force, "force", fn);
  marlkit::particles::StepParams p;
  marlkit::particles::StepOptions o;
  FloatValues radii;
  if (py::isinstance<py::array>(radius)) {
    radii = float_values(radius, fn, "radius", "[N]", N);
    o.radii = radii.data;
  } else {
    p.radius = radius.cast<double>();
  }
  p.mass = mass;
  p.drag = drag;
  p.dt = dt;
  p.substeps = substeps;
  p.stiffness = stiffness;
  p.half_extent = half_extent;
  FloatValues speeds;
  if (!max_speed.is_none()) {
    speeds = float_values(max_speed, fn, "max_speed", "[N]", N);
    o.max_speed = speeds.data;
  }
  py::array active;
  if (!active_obj.is_none()) {
    active = checked<bool>(active_obj, fn, "active", "bool", "[E, N]", {E, N}, false);
    o.active = static_cast<const bool*>(active.data());
  }
  py::array landmarks;
  FloatValues landmark_radii;
  if (!landmarks_obj.is_none()) {
    const py::ssize_t M = py::isinstance<py::array>(landmarks_obj) &&
                                  py::reinterpret_borrow<py::array>(landmarks_obj).ndim() == 3
                              ? py::reinterpret_borrow<py::array>(landmarks_obj).shape(1)
                              : 0;
    landmarks =
        checked<float>(landmarks_obj, fn, "landmarks", "float32", "[E, M, 2]", {E, M, 2}, false);
    if (landmark_radius.is_none()) {
      throw std::invalid_argument("particle_step: landmarks need landmark_radius (a number or a "
                                  "float32 array of shape [M])");
    }
    landmark_radii = float_values(landmark_radius, fn, "landmark_radius", "[M]", M);
    o.landmarks = static_cast<const float*>(landmarks.data());
    o.landmark_radii = landmark_radii.data;
    o.num_landmarks = M;
  } else if (!landmark_radius.is_none()) {
    throw std::invalid_argument("particle_step: landmark_radius was given without landmarks");
  }
  const marlkit::particles::StepParams checked_params =
      marlkit::particles::check_options(p, o, N);  // throws with the GIL held, nothing written
  auto* pos_ptr = static_cast<float*>(pos.mutable_data());
  auto* vel_ptr = static_cast<float*>(vel.mutable_data());
  const auto* force_ptr = static_cast<const float*>(force.data());
  auto* contacts_ptr = static_cast<std::int32_t*>(contacts.mutable_data());
  py::gil_scoped_release release;
  marlkit::particles::step(pos_ptr, vel_ptr, force_ptr, contacts_ptr, E, N, checked_params, o);
}

void knn(const py::object& pos_obj, std::int64_t k, double radius, const py::object& rel_obj,
         const py::object& idx_obj, const py::object& active_obj) {
  const char* fn = "knn";
  const py::array pos0 = state_layout(pos_obj, fn, "pos");
  const py::ssize_t E = pos0.shape(0);
  const py::ssize_t N = pos0.shape(1);
  if (k < 0 || k > std::max<py::ssize_t>(N - 1, 0)) {
    throw std::invalid_argument("knn: k must be in [0, N - 1] = [0, " + std::to_string(N - 1) +
                                "] (other agents), got " + std::to_string(k));
  }
  if (!(radius > 0.0)) {
    throw std::invalid_argument("knn: radius must be > 0 (inf allowed), got " +
                                marlkit::particles::detail::fmt(radius));
  }
  const auto K = static_cast<py::ssize_t>(k);
  py::array pos = checked<float>(pos_obj, fn, "pos", "float32", "[E, N, 2]", {E, N, 2}, false);
  py::array rel =
      checked<float>(rel_obj, fn, "rel_out", "float32", "[E, N, k, 2]", {E, N, K, 2}, true);
  py::array idx =
      checked<std::int64_t>(idx_obj, fn, "idx_out", "int64", "[E, N, k]", {E, N, K}, true);
  check_no_overlap(rel, "rel_out", pos, "pos", fn);
  check_no_overlap(idx, "idx_out", pos, "pos", fn);
  check_no_overlap(rel, "rel_out", idx, "idx_out", fn);
  const bool* active_ptr = nullptr;
  py::array active;
  if (!active_obj.is_none()) {
    active = checked<bool>(active_obj, fn, "active", "bool", "[E, N]", {E, N}, false);
    active_ptr = static_cast<const bool*>(active.data());
  }
  const auto* pos_ptr = static_cast<const float*>(pos.data());
  auto* rel_ptr = static_cast<float*>(rel.mutable_data());
  auto* idx_ptr = static_cast<std::int64_t*>(idx.mutable_data());
  py::gil_scoped_release release;
  marlkit::particles::knn(pos_ptr, E, N, k, radius, rel_ptr, idx_ptr, active_ptr);
}

void lidar(const py::object& pos_obj, const py::object& angles_obj, double max_range,
           double radius, const py::object& out_obj) {
  const char* fn = "lidar";
  const py::array pos0 = state_layout(pos_obj, fn, "pos");
  if (!py::isinstance<py::array>(angles_obj)) {
    throw py::type_error("lidar: angles must be a float32 array of shape [R], got an object of "
                         "type " +
                         std::string(py::str(py::type::of(angles_obj).attr("__name__"))));
  }
  const auto angles0 = py::reinterpret_borrow<py::array>(angles_obj);
  if (angles0.ndim() != 1) {
    throw std::invalid_argument("lidar: angles must be a float32 array of shape [R], got shape " +
                                shape_str(angles0));
  }
  const py::ssize_t E = pos0.shape(0);
  const py::ssize_t N = pos0.shape(1);
  const py::ssize_t R = angles0.shape(0);
  py::array pos = checked<float>(pos_obj, fn, "pos", "float32", "[E, N, 2]", {E, N, 2}, false);
  py::array angles = checked<float>(angles_obj, fn, "angles", "float32", "[R]", {R}, false);
  py::array out = checked<float>(out_obj, fn, "out", "float32", "[E, N, R]", {E, N, R}, true);
  check_no_overlap(out, "out", pos, "pos", fn);
  check_no_overlap(out, "out", angles, "angles", fn);
  const auto* pos_ptr = static_cast<const float*>(pos.data());
  const auto* angles_ptr = static_cast<const float*>(angles.data());
  // Parameters and inputs are checked with the GIL held: nothing is written on error.
  marlkit::particles::check_lidar(N, R, max_range, radius);
  marlkit::particles::check_lidar_inputs(pos_ptr, E, N, angles_ptr, R);
  auto* out_ptr = static_cast<float*>(out.mutable_data());
  py::gil_scoped_release release;
  marlkit::particles::lidar(pos_ptr, E, N, angles_ptr, R, max_range, radius, out_ptr);
}

}  // namespace particles_bind

void bind_particles(py::module_& m) {
  m.def("particle_step", &particles_bind::particle_step, py::arg("pos"), py::arg("vel"),
        py::arg("force"), py::arg("contacts_out"), py::kw_only(), py::arg("radius"),
        py::arg("mass"), py::arg("drag"), py::arg("dt"), py::arg("substeps"),
        py::arg("stiffness"), py::arg("half_extent"), py::arg("max_speed") = py::none(),
        py::arg("active") = py::none(), py::arg("landmarks") = py::none(),
        py::arg("landmark_radius") = py::none(),
        R"doc(Advance E particle worlds by one step of `substeps` substeps, in place.

Arrays (C-contiguous, no copies made):
    pos, vel: float32 [E, N, 2], updated in place.
    force: float32 [E, N, 2], the (already scaled and clipped) action force, held over the step.
    contacts_out: int32 [E, N], written: per agent, the number of other active agents closer
        than r_i + r_j after the step.
radius: a number or float32 [N] (per agent). max_speed: None, a number or float32 [N] (inf
allowed): speeds above it are scaled down to it after each velocity update. active: None or
bool [E, N]: inactive agents keep pos and vel, exert and feel no force, count 0 contacts.
landmarks: None or float32 [E, M, 2] static circles with landmark_radius (a number or float32
[M]): they push touching agents and do not move.
Per substep h = dt / substeps, with the positions at its start: F_i = force_i + the running sum,
from 0, of k * (r_i + r_j - d_ij) * n_ij over touching agents j ascending, then touching landmarks
ascending; vel = vel * (1 - drag) + F * (h / mass); the speed limit; pos = pos + vel * h; each
coordinate clamped to [-(L - r_i), L - r_i] with its velocity zeroed. Touching pairs are found
through a uniform grid per environment: O(N) per step.
Raises ValueError (bad shape, dtype, layout or parameter) or TypeError (not an array).
Releases the GIL; runs on marlkit's thread pool over environments (or over the agents of one
environment when there are fewer environments than threads).)doc");
  m.def("knn", &particles_bind::knn, py::arg("pos"), py::arg("k"), py::arg("radius"),
        py::arg("rel_out"), py::arg("idx_out"), py::kw_only(), py::arg("active") = py::none(),
        R"doc(The k nearest other agents of every agent, within `radius` (may be inf).

Arrays (C-contiguous): pos float32 [E, N, 2]; rel_out float32 [E, N, k, 2] written with
pos_j - pos_i; idx_out int64 [E, N, k] written with j; active None or bool [E, N]. Neighbours
are active agents ordered by squared distance, ties by the smaller index; slots without a
neighbour within radius, and every slot of an inactive agent, get rel 0 and idx -1. Found through
a uniform grid searched in growing rings of cells: exactly the brute-force result, O(N k).
Raises ValueError for k outside [0, N - 1], radius <= 0, or a bad array. Releases the GIL.)doc");
  m.def("lidar", &particles_bind::lidar, py::arg("pos"), py::arg("angles"),
        py::arg("max_range"), py::arg("radius"), py::arg("out"),
        R"doc(LiDAR readings of every agent against the other agents' discs, as VMAS's Lidar.

Arrays (C-contiguous): pos float32 [E, N, 2] agent centres; angles float32 [R] ray angles in
radians; out float32 [E, N, R], written. For agent i, ray k (direction (cos a_k, sin a_k)) and
every other agent j (radius `radius`), with w = pos_j - pos_i: t = w . u, c = w x u,
q = radius^2 - c^2; j is hit when t > 0 (in front) and q > 0, at t - sqrt(q) (negative when
agent i lies inside j's disc). out[e, i, k] = min(max_range, the nearest hit). Only agents
within max_range + radius are tested, found through a uniform grid: O(N R) per environment.
Raises ValueError for n_rays < 1, max_range or radius not finite and > 0, a non-finite
position or angle, or a bad array (TypeError when pos is not an array). Releases the GIL; runs
on marlkit's thread pool over environments (or over the agents of one environment when there
are fewer environments than threads).)doc");
}
// --- end section: particles ------------------------------------------------------------------

// --- section: segment_tree (bind_segment_tree) -------------------------------------------
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "marlkit/segment_tree.h"

namespace segment_tree_bindings {

// A tree plus the lock that makes GIL-free batched calls safe: updates are exclusive, reads
// (get, query, scan) shared.
template <typename T, marlkit::SegmentOp Op>
struct Handle {
  explicit Handle(std::int64_t capacity) : tree(capacity) {}
  marlkit::SegmentTree<T, Op> tree;
  mutable std::shared_mutex mutex;
};

template <typename T>
const char* dtype_name() {
  return std::is_same<T, float>::value ? "float32" : "float64";
}

// A C-contiguous 1-D array of exactly dtype T (no silent casts): TypeError for a wrong dtype,
// ValueError for a wrong ndim. A strided array of the right dtype is copied to contiguous.
template <typename T>
py::array_t<T, py::array::c_style> checked_vector(const py::array& array, const std::string& what,
                                                  const std::string& where) {
  if (!py::isinstance<py::array_t<T>>(array)) {
    throw py::type_error(where + ": " + what + " must be a numpy array of dtype " +
                         std::string(std::is_same<T, std::int64_t>::value ? "int64"
                                                                         : dtype_name<T>()) +
                         ", got dtype " + py::str(array.dtype()).cast<std::string>());
  }
  if (array.ndim() != 1) {
    throw std::invalid_argument(where + ": " + what + " must be 1-D [B], got " +
                                std::to_string(array.ndim()) + "-D with shape " +
                                py::str(array.attr("shape")).cast<std::string>());
  }
  auto contiguous = py::array_t<T, py::array::c_style>::ensure(array);
  if (!contiguous) {
    throw std::invalid_argument(where + ": could not make " + what + " contiguous");
  }
  return contiguous;
}

template <typename T, marlkit::SegmentOp Op>
py::class_<Handle<T, Op>> bind_common(py::module_& m, const char* name, const char* doc,
                                      const char* reduction) {
  using H = Handle<T, Op>;
  const std::string cls(name);
  py::class_<H> c(m, name, doc);
  c.def(py::init<std::int64_t>(), py::arg("capacity"),
        py::call_guard<py::gil_scoped_release>(),
        (std::string("Allocate a tree over `capacity` leaves (1 <= capacity <= 10**8), every "
                     "leaf set to ") +
         (Op == marlkit::SegmentOp::kSum ? "0" : "+inf (the neutral element of min)") +
         ". Memory: about 1.1 to 1.5 values per leaf (see nbytes). ValueError for a capacity "
         "out of range, MemoryError when the allocation fails.")
            .c_str());
  c.def_property_readonly(
      "capacity", [](const H& h) { return h.tree.capacity(); }, "Number of leaves usable.");
  c.def_property_readonly(
      "nbytes", [](const H& h) { return h.tree.nbytes(); },
      "Bytes held by the leaves and the tree nodes.");
  c.def("__len__", [](const H& h) { return h.tree.capacity(); });
  c.def("__repr__", [cls](const H& h) {
    return cls + "(capacity=" + std::to_string(h.tree.capacity()) + ")";
  });
  c.def(
      "update",
      [cls](H& h, const py::array& indices, const py::array& values) {
        const std::string where = cls + ".update";
        auto idx = checked_vector<std::int64_t>(indices, "indices", where);
        auto val = checked_vector<T>(values, "values", where);
        if (idx.shape(0) != val.shape(0)) {
          throw std::invalid_argument(where + ": indices and values must have the same length, "
                                      "got " + std::to_string(idx.shape(0)) + " indices and " +
                                      std::to_string(val.shape(0)) + " values");
        }
        const std::int64_t* ip = idx.data();
        const T* vp = val.data();
        const std::int64_t n = idx.shape(0);
        py::gil_scoped_release release;
        std::unique_lock<std::shared_mutex> lock(h.mutex);
        h.tree.update(ip, vp, n);
      },
      py::arg("indices"), py::arg("values"),
      (std::string("Set leaf indices[b] to values[b] for each b, in order (a repeated index keeps "
                   "the last value). indices: int64 [B]; values: ") +
       dtype_name<T>() +
       " [B]. IndexError for an index outside [0, capacity); ValueError for a negative, NaN or "
       "infinite value or mismatched lengths; TypeError for a wrong dtype. The whole batch is "
       "checked first: nothing is written on error. O(B log capacity), GIL released.")
          .c_str());
  c.def(
      "get",
      [cls](const H& h, const py::array& indices) {
        auto idx = checked_vector<std::int64_t>(indices, "indices", cls + ".get");
        const std::int64_t n = idx.shape(0);
        py::array_t<T> out(n);
        const std::int64_t* ip = idx.data();
        T* op = out.mutable_data();
        {
          py::gil_scoped_release release;
          std::shared_lock<std::shared_mutex> lock(h.mutex);
          h.tree.get(ip, op, n);
        }
        return out;
      },
      py::arg("indices"),
      (std::string("Leaf values at indices (int64 [B]) as ") + dtype_name<T>() +
       " [B]. IndexError for an index outside [0, capacity).")
          .c_str());
  c.def(
      "query",
      [](const H& h, std::int64_t start, std::int64_t end) {
        std::shared_lock<std::shared_mutex> lock(h.mutex);
        return static_cast<double>(h.tree.query(start, end));
      },
      py::arg("start"), py::arg("end"),
      (std::string("The ") + reduction +
       " of leaves [start, end), end exclusive. IndexError when start or end is out of range, "
       "ValueError for an empty range. O(log capacity).")
          .c_str());
  return c;
}

template <typename T>
void bind_sum(py::module_& m, const char* name) {
  using H = Handle<T, marlkit::SegmentOp::kSum>;
  const std::string cls(name);
  auto c = bind_common<T, marlkit::SegmentOp::kSum>(
      m, name,
      (std::string("Sum segment tree over ") + dtype_name<T>() +
       " priorities, for proportional prioritized sampling. Leaves start at 0.")
          .c_str(),
      "sum");
  c.def(
      "total",
      [](const H& h) {
        std::shared_lock<std::shared_mutex> lock(h.mutex);
        return static_cast<double>(h.tree.reduce_all());
      },
      "Sum of all leaves (the root). O(1).");
  c.def(
      "scan_lower_bound",
      [cls](const H& h, const py::array& values) {
        auto val = checked_vector<T>(values, "values", cls + ".scan_lower_bound");
        const std::int64_t n = val.shape(0);
        py::array_t<std::int64_t> out(n);
        const T* vp = val.data();
        std::int64_t* op = out.mutable_data();
        {
          py::gil_scoped_release release;
          std::shared_lock<std::shared_mutex> lock(h.mutex);
          h.tree.scan_lower_bound(vp, op, n);
        }
        return out;
      },
      py::arg("values"),
      (std::string("Batched prefix-sum search. values: ") + dtype_name<T>() +
       " [B], each finite and >= 0. Returns int64 [B]: for each v the smallest index i with "
       "sum(leaves[0..i]) > v (inclusive), which always has a nonzero priority; v >= total() "
       "gives the last index with a nonzero priority. ValueError for a negative, NaN or "
       "infinite v, or when total() is 0 and B > 0. O(B log capacity), GIL released, "
       "multi-threaded for large B.")
          .c_str());
}

template <typename T>
void bind_min(py::module_& m, const char* name) {
  using H = Handle<T, marlkit::SegmentOp::kMin>;
  auto c = bind_common<T, marlkit::SegmentOp::kMin>(
      m, name,
      (std::string("Min segment tree over ") + dtype_name<T>() +
       " priorities. Leaves start at +inf (the neutral element); writing inf is an error.")
          .c_str(),
      "minimum");
  c.def(
      "min",
      [](const H& h) {
        std::shared_lock<std::shared_mutex> lock(h.mutex);
        return static_cast<double>(h.tree.reduce_all());
      },
      "Minimum of all leaves (the root; +inf when nothing was written). O(1).");
}

// Prioritized replay's two steps on a (sum, min) pair of one dtype, each in one call (the
// Python sampler's torch calls between the trees cost as much as the trees' own work).
template <typename T>
void bind_prioritized(py::module_& m) {
  using Sum = Handle<T, marlkit::SegmentOp::kSum>;
  using Min = Handle<T, marlkit::SegmentOp::kMin>;
  m.def(
      "prioritized_update",
      [](Sum& total, Min& lowest, const py::array& indices, const py::array& priorities,
         std::int64_t length, double eps, double alpha) {
        const std::string where = "prioritized_update";
        auto idx = checked_vector<std::int64_t>(indices, "indices", where);
        auto pri = checked_vector<T>(priorities, "priorities", where);
        const std::int64_t n = idx.shape(0);
        if (pri.shape(0) != n) {
          throw std::invalid_argument("update_priority: " + std::to_string(n) +
                                      " indices but " + std::to_string(pri.shape(0)) +
                                      " priorities");
        }
        if (length < 0 || length > total.tree.capacity() || length > lowest.tree.capacity()) {
          throw std::invalid_argument(where + ": length " + std::to_string(length) +
                                      " is outside [0, capacity]");
        }
        const std::int64_t* ip = idx.data();
        const T* pp = pri.data();
        py::gil_scoped_release release;
        if (n == 0) {
          return -std::numeric_limits<double>::infinity();
        }
        std::int64_t low = ip[0], high = ip[0];
        for (std::int64_t b = 1; b < n; ++b) {
          low = std::min(low, ip[b]);
          high = std::max(high, ip[b]);
        }
        if (low < 0 || high >= length) {
          throw std::out_of_range("update_priority: index " +
                                  std::to_string(low < 0 ? low : high) +
                                  " is out of range for " + std::to_string(length) +
                                  " stored items (nothing was updated)");
        }
        if (!marlkit::SumSegmentTree<T>::all_finite_nonnegative(pp, n)) {
          for (std::int64_t b = 0; b < n; ++b) {
            if (!(pp[b] >= T(0)) || !std::isfinite(pp[b])) {  // the first bad one, named
              throw std::invalid_argument(
                  "priority " +
                  marlkit::segment_tree_detail::format_value(static_cast<double>(pp[b])) +
                  " at position " + std::to_string(b) +
                  " is not a finite number >= 0 (nothing was updated)");
            }
          }
        }
        // The tree values (priority + eps) ** alpha, in T as the torch path computes them.
        std::vector<T> values(static_cast<std::size_t>(n));
        const T shift = static_cast<T>(eps), power = static_cast<T>(alpha);
        T largest = T(0);
        for (std::int64_t b = 0; b < n; ++b) {
          largest = std::max(largest, pp[b]);
          values[static_cast<std::size_t>(b)] = std::pow(pp[b] + shift, power);
        }
        std::unique_lock<std::shared_mutex> sum_lock(total.mutex);
        std::unique_lock<std::shared_mutex> min_lock(lowest.mutex);
        total.tree.update(ip, values.data(), n);  // checks every value before writing any
        lowest.tree.update(ip, values.data(), n);  // the same values: passes the same checks
        return static_cast<double>(largest);
      },
      py::arg("total"), py::arg("lowest"), py::arg("indices"), py::arg("priorities"),
      py::arg("length"), py::arg("eps"), py::arg("alpha"),
      "Set the priorities of slots indices (int64 [B], each in [0, length)) in a sum tree and a "
      "min tree of one dtype to (priorities + eps) ** alpha (priorities [B] of the trees' "
      "dtype, each finite and >= 0); returns the largest of the batch's priorities (-inf for an "
      "empty batch). IndexError for an index outside [0, length), ValueError for a bad priority; "
      "nothing is written on error. GIL released.");
  m.def(
      "prioritized_sample",
      [](const Sum& total, const Min& lowest, const py::array& uniforms, double beta) {
        auto u = checked_vector<T>(uniforms, "uniforms", "prioritized_sample");
        const std::int64_t n = u.shape(0);
        py::array_t<std::int64_t> index(n);
        py::array_t<float> weight(n);
        const T* up = u.data();
        std::int64_t* ip = index.mutable_data();
        float* wp = weight.mutable_data();
        {
          py::gil_scoped_release release;
          std::shared_lock<std::shared_mutex> sum_lock(total.mutex);
          std::shared_lock<std::shared_mutex> min_lock(lowest.mutex);
          const T mass_total = total.tree.reduce_all();
          std::vector<T> buffer(static_cast<std::size_t>(n));
          for (std::int64_t b = 0; b < n; ++b) {
            buffer[static_cast<std::size_t>(b)] = up[b] * mass_total;
          }
          total.tree.scan_lower_bound(buffer.data(), ip, n);
          total.tree.get(ip, buffer.data(), n);
          // (N p / sum)^-beta over its largest value (N min(p) / sum)^-beta: (p / min)^-beta.
          const T smallest = lowest.tree.reduce_all(), power = static_cast<T>(-beta);
          for (std::int64_t b = 0; b < n; ++b) {
            wp[b] = static_cast<float>(std::pow(buffer[static_cast<std::size_t>(b)] / smallest,
                                                power));
          }
        }
        return py::make_tuple(index, weight);
      },
      py::arg("total"), py::arg("lowest"), py::arg("uniforms"), py::arg("beta"),
      "Proportional sampling: for uniforms u [B] in [0, 1) of the trees' dtype, the indices "
      "scan_lower_bound(u * total) (int64 [B]) and their importance weights "
      "(priority / min priority) ** -beta (float32 [B], in (0, 1]). ValueError as "
      "scan_lower_bound. GIL released.");
}

}  // namespace segment_tree_bindings

void bind_segment_tree(py::module_& m) {
  segment_tree_bindings::bind_sum<float>(m, "SumSegmentTreeFp32");
  segment_tree_bindings::bind_sum<double>(m, "SumSegmentTreeFp64");
  segment_tree_bindings::bind_min<float>(m, "MinSegmentTreeFp32");
  segment_tree_bindings::bind_min<double>(m, "MinSegmentTreeFp64");
  segment_tree_bindings::bind_prioritized<float>(m);
  segment_tree_bindings::bind_prioritized<double>(m);
  m.attr("SEGMENT_TREE_MAX_CAPACITY") = marlkit::SumSegmentTree<float>::kMaxCapacity;
}
// --- end section: segment_tree ---------------------------------------------------------------

// --- section: render (bind_render) -------------------------------------------------------------
#include <array>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "marlkit/render.h"

namespace {

using RenderDoubles = py::array_t<double, py::array::c_style | py::array::forcecast>;
using RenderInts = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>;

marlkit::render::Rgb render_rgb(const std::array<std::int64_t, 3>& c, const char* what) {
  for (std::int64_t v : c) {
    if (v < 0 || v > 255) {
      throw std::invalid_argument(std::string("render_frames: ") + what +
                                  " must be 3 integers in [0, 255], got a component " +
                                  std::to_string(v));
    }
  }
  return marlkit::render::Rgb{static_cast<std::uint8_t>(c[0]), static_cast<std::uint8_t>(c[1]),
                              static_cast<std::uint8_t>(c[2])};
}

// Arrays of one layer, kept alive (and converted) while the kernel runs without the GIL.
struct RenderLayerArrays {
  RenderDoubles centers;
  RenderDoubles radius;
  std::vector<std::uint8_t> colors;
};

RenderLayerArrays render_layer_arrays(const py::handle& item, std::size_t index,
                                      std::int64_t batch, bool* filled, double* line_width) {
  const std::string name = "render_frames: layer " + std::to_string(index);
  auto t = py::reinterpret_borrow<py::object>(item);
  if (!py::isinstance<py::tuple>(t) || py::len(t) != 5) {
    throw std::invalid_argument(name +
                                " must be a tuple (centers, radius, colors, filled, line_width)");
  }
  auto tup = t.cast<py::tuple>();
  RenderLayerArrays a{RenderDoubles::ensure(tup[0]), RenderDoubles::ensure(tup[1]), {}};
  RenderInts colors = RenderInts::ensure(tup[2]);
  if (!a.centers || !a.radius || !colors) {
    throw std::invalid_argument(name + ": centers, radius and colors must be numeric arrays");
  }
  const py::ssize_t nd = a.centers.ndim();
  if ((nd != 2 && nd != 3) || a.centers.shape(nd - 1) != 2 ||
      (nd == 3 && a.centers.shape(0) != batch)) {
    throw std::invalid_argument(name + ": centers must have shape [M, 2] or [" +
                                std::to_string(batch) + ", M, 2], got ndim " + std::to_string(nd));
  }
  const py::ssize_t m = a.centers.shape(nd - 2);
  if (a.radius.ndim() != 1 || a.radius.shape(0) != m) {
    throw std::invalid_argument(name + ": radius must have shape [" + std::to_string(m) + "]");
  }
  if (colors.ndim() != 2 || colors.shape(0) != m || colors.shape(1) != 3) {
    throw std::invalid_argument(name + ": colors must have shape [" + std::to_string(m) + ", 3]");
  }
  const double* xy = a.centers.data();
  for (py::ssize_t k = 0; k < a.centers.size(); ++k) {
    if (!std::isfinite(xy[k])) {
      throw std::invalid_argument(name + ": centers contain a non-finite value (NaN or inf)");
    }
  }
  const double* rad = a.radius.data();
  for (py::ssize_t k = 0; k < m; ++k) {
    if (!(std::isfinite(rad[k]) && rad[k] >= 0.0)) {
      throw std::invalid_argument(name + ": radius must be finite and >= 0, got " +
                                  std::to_string(rad[k]) + " at index " + std::to_string(k));
    }
  }
  const std::int64_t* col = colors.data();
  a.colors.resize(static_cast<std::size_t>(m) * 3);
  for (py::ssize_t k = 0; k < m * 3; ++k) {
    if (col[k] < 0 || col[k] > 255) {
      throw std::invalid_argument(name + ": colors must lie in [0, 255], got " +
                                  std::to_string(col[k]));
    }
    a.colors[static_cast<std::size_t>(k)] = static_cast<std::uint8_t>(col[k]);
  }
  *filled = tup[3].cast<bool>();
  *line_width = tup[4].cast<double>();
  if (!(std::isfinite(*line_width) && *line_width > 0.0)) {
    throw std::invalid_argument(name + ": line_width must be finite and > 0, got " +
                                std::to_string(*line_width));
  }
  return a;
}

py::array_t<std::uint8_t> render_frames_binding(std::int64_t batch, std::int64_t height,
                                                std::int64_t width, double half_extent,
                                                const py::sequence& layers,
                                                const std::array<std::int64_t, 3>& background,
                                                const std::array<std::int64_t, 3>& border,
                                                std::int64_t border_width, bool antialias) {
  if (batch < 0) {
    throw std::invalid_argument("render_frames: batch must be >= 0, got " + std::to_string(batch));
  }
  if (height <= 0 || width <= 0) {
    throw std::invalid_argument("render_frames: height and width must be > 0, got " +
                                std::to_string(height) + " x " + std::to_string(width));
  }
  if (!(std::isfinite(half_extent) && half_extent > 0.0)) {
    throw std::invalid_argument("render_frames: half_extent must be finite and > 0, got " +
                                std::to_string(half_extent));
  }
  if (border_width < 0) {
    throw std::invalid_argument("render_frames: border_width must be >= 0, got " +
                                std::to_string(border_width));
  }
  const marlkit::render::Rgb bg = render_rgb(background, "background");
  const marlkit::render::Rgb bd = render_rgb(border, "border");
  std::vector<RenderLayerArrays> held;
  std::vector<marlkit::render::CircleLayer> specs;
  held.reserve(py::len(layers));
  specs.reserve(py::len(layers));
  for (std::size_t i = 0; i < py::len(layers); ++i) {
    bool filled = true;
    double line_width = 1.0;
    held.push_back(render_layer_arrays(layers[i], i, batch, &filled, &line_width));
    const RenderLayerArrays& a = held.back();
    const py::ssize_t nd = a.centers.ndim();
    const std::int64_t m = a.centers.shape(nd - 2);
    specs.push_back(marlkit::render::CircleLayer{a.centers.data(), nd == 3 ? m * 2 : 0,
                                                 a.radius.data(), a.colors.data(), m, filled,
                                                 line_width});
  }
  py::array_t<std::uint8_t> out({batch, height, width, std::int64_t{3}});
  std::uint8_t* data = out.mutable_data();
  {
    py::gil_scoped_release release;
    marlkit::render::render_batch(data, batch, height, width, half_extent, specs, bg, bd,
                                  border_width, antialias);
  }
  return out;
}

}  // namespace

void bind_render(py::module_& m) {
  m.def("render_frames", &render_frames_binding, py::arg("batch"), py::arg("height"),
        py::arg("width"), py::arg("half_extent"), py::arg("layers"), py::arg("background"),
        py::arg("border"), py::arg("border_width"), py::arg("antialias"),
        R"doc(Render `batch` frames of 2-D circle scenes; returns uint8 [batch, height, width, 3].

The world square [-half_extent, half_extent]^2 (y up) maps onto the centred min(height, width)
pixel square. Each frame is cleared to `background`, gets the world bounds as a border
`border_width` pixels thick, then the layers in order. A layer is a tuple
(centers [M, 2] (shared by all frames) or [batch, M, 2] float64 world coordinates,
 radius [M] float64 world units, colors [M, 3] integers in [0, 255],
 filled: bool, line_width: float pixels (ring thickness, used when not filled)).
Frames are spread over the kernel threads (see set_num_threads); the GIL is released.
Raises ValueError on bad shapes, non-finite centres or radii, negative radii, colours
outside [0, 255], a non-positive size or half_extent.)doc");
}
// --- end section: render -----------------------------------------------------------------------

// --- section: gather (bind_gather) -------------------------------------------------------------
#include "marlkit/gather.h"
#include "marlkit/memory.h"

namespace gather_bind {

// A C-contiguous array with rows along dim 0 (any dtype: rows are copied as bytes), or
// TypeError / ValueError naming it. Returns its bytes per row.
std::int64_t row_bytes(const py::handle& item, const char* what, std::size_t position) {
  const std::string name = std::string("gather_rows: ") + what + "[" + std::to_string(position) +
                           "]";
  if (!py::isinstance<py::array>(item)) {
    throw py::type_error(name + " must be a numpy array, got " +
                         py::str(py::type::of(item)).cast<std::string>());
  }
  auto array = py::reinterpret_borrow<py::array>(item);
  if (array.ndim() < 1 || !(array.flags() & py::array::c_style)) {
    throw std::invalid_argument(name + " must be C-contiguous with rows along dim 0");
  }
  return array.shape(0) > 0 ? static_cast<std::int64_t>(array.nbytes()) / array.shape(0) : 0;
}

void gather_rows_binding(const py::sequence& sources, const py::array& index,
                         const py::sequence& outputs) {
  if (py::len(sources) != py::len(outputs)) {
    throw std::invalid_argument("gather_rows: " + std::to_string(py::len(sources)) +
                                " sources but " + std::to_string(py::len(outputs)) + " outputs");
  }
  if (!py::isinstance<py::array_t<std::int64_t>>(index) || index.ndim() != 1 ||
      !(index.flags() & py::array::c_style)) {
    throw py::type_error("gather_rows: index must be a contiguous 1-D int64 numpy array");
  }
  const std::int64_t count = index.shape(0);
  std::int64_t rows = -1;
  std::vector<marlkit::GatherColumn> columns;
  // The arrays (and so their buffers) stay referenced by the caller's sequences while the GIL
  // is released: the sequences are arguments of this call.
  for (std::size_t k = 0; k < py::len(sources); ++k) {
    const std::int64_t width = row_bytes(sources[k], "sources", k);
    auto source = py::reinterpret_borrow<py::array>(sources[k]);
    if (rows < 0) {
      rows = source.shape(0);
    } else if (source.shape(0) != rows) {
      throw std::invalid_argument("gather_rows: sources[" + std::to_string(k) + "] has " +
                                  std::to_string(source.shape(0)) + " rows, sources[0] " +
                                  std::to_string(rows));
    }
    const std::int64_t out_width = row_bytes(outputs[k], "outputs", k);
    auto out = py::reinterpret_borrow<py::array>(outputs[k]);
    if (out.shape(0) != count || (count > 0 && out_width != width)) {
      throw std::invalid_argument(
          "gather_rows: outputs[" + std::to_string(k) + "] must hold " + std::to_string(count) +
          " rows of " + std::to_string(width) + " bytes, got " + std::to_string(out.shape(0)) +
          " of " + std::to_string(out_width));
    }
    if (!out.writeable()) {
      throw std::invalid_argument("gather_rows: outputs[" + std::to_string(k) +
                                  "] is read-only");
    }
    columns.push_back(marlkit::GatherColumn{static_cast<const std::uint8_t*>(source.data()),
                                            static_cast<std::uint8_t*>(out.mutable_data()),
                                            width});
  }
  if (columns.empty()) {
    return;
  }
  const auto* idx = static_cast<const std::int64_t*>(index.data());
  py::gil_scoped_release release;
  marlkit::gather_rows(columns, idx, count, rows);
}

}  // namespace gather_bind

void bind_gather(py::module_& m) {
  m.def("gather_rows", &gather_bind::gather_rows_binding, py::arg("sources"), py::arg("index"),
        py::arg("outputs"),
        R"doc(outputs[k][i] = sources[k][index[i]] for every k: rows copied as raw bytes.

sources: C-contiguous arrays [rows, ...] of any dtype, all with the same number of rows; index:
contiguous int64 [B]; outputs: writeable C-contiguous arrays [B, ...] with the same bytes per
row as their source. Rows are prefetched ahead of the copy (many cache misses in flight at once) and
large batches are split over the kernel threads (see set_num_threads); the GIL is released.
Raises IndexError (naming the index and its position) before copying anything when an index is
outside [0, rows); TypeError / ValueError on wrong dtypes, shapes or counts.)doc");
  m.def(
      "advise_huge_pages",
      [](const py::array& array) -> std::size_t {
        if (!(array.flags() & py::array::c_style) || !array.writeable()) {
          throw std::invalid_argument("advise_huge_pages: the array must be C-contiguous and "
                                      "writeable");
        }
        return marlkit::advise_huge_pages(const_cast<void*>(array.data()),
                                          static_cast<std::size_t>(array.nbytes()));
      },
      py::arg("array"),
      R"doc(Advise the kernel to back the array's whole 2 MiB pages with transparent huge pages
(Linux madvise MADV_HUGEPAGE); returns the bytes advised (0: no whole huge page in it, not
Linux, or no THP). Pages touched before the advice keep their 4 KiB pages: advise a fresh
allocation, then write it.)doc");
  m.def(
      "huge_zeros",
      [](std::size_t nbytes) -> py::array {
        marlkit::MappedRegion region{};  // map_huge_zeros refuses nbytes == 0 (ValueError)
        {
          py::gil_scoped_release release;
          region = marlkit::map_huge_zeros(nbytes);
        }
        // The array owns the mapping: unmapped when its last view (a torch tensor made by
        // torch.from_numpy included) is released, or here when an owner cannot be made.
        marlkit::MappedRegion* owned = nullptr;
        py::capsule owner;
        try {
          owned = new marlkit::MappedRegion(region);
          owner = py::capsule(owned, [](void* p) {
            auto* r = static_cast<marlkit::MappedRegion*>(p);
            marlkit::unmap_region(*r);
            delete r;
          });
        } catch (...) {
          marlkit::unmap_region(region);
          delete owned;
          throw;
        }
        return py::array_t<std::uint8_t>({static_cast<py::ssize_t>(nbytes)}, {1},
                                         static_cast<std::uint8_t*>(region.data), owner);
      },
      py::arg("nbytes"),
      R"doc(nbytes zeroed bytes (uint8 [nbytes]) in a fresh anonymous mapping of their own, 2 MiB
aligned, advised for transparent huge pages before any page is touched, then faulted in; the
mapping is released when the array (and every view of it) is. Linux only (RuntimeError
elsewhere); ValueError for nbytes == 0, MemoryError when the kernel cannot map it. The GIL is
released while the pages fault in.)doc");
}
// --- end section: gather -----------------------------------------------------------------------

// --- section: smax (bind_smax) -----------------------------------------------------------------
#include "marlkit/smax.h"

namespace smax_bind {

using particles_bind::checked;

// The world arrays of E battles of N units, checked (shapes from health [E, N]).
struct WorldArrays {
  py::array pos, health, cooldown, alive, types, prev_move, prev_attack;
  py::ssize_t E, N;
};

WorldArrays world_arrays(const char* fn, const py::object& pos, const py::object& health,
                         const py::object& cooldown, const py::object& alive,
                         const py::object& types, const py::object& prev_move,
                         const py::object& prev_attack, bool writable) {
  if (!py::isinstance<py::array>(health) || py::reinterpret_borrow<py::array>(health).ndim() != 2) {
    throw std::invalid_argument(std::string(fn) + ": health must be a float32 array [E, N]");
  }
  const auto h = py::reinterpret_borrow<py::array>(health);
  const py::ssize_t E = h.shape(0), N = h.shape(1);
  WorldArrays w;
  w.E = E;
  w.N = N;
  w.pos = checked<float>(pos, fn, "pos", "float32", "[E, N, 2]", {E, N, 2}, writable);
  w.health = checked<float>(health, fn, "health", "float32", "[E, N]", {E, N}, writable);
  w.cooldown = checked<float>(cooldown, fn, "cooldown", "float32", "[E, N]", {E, N}, writable);
  w.alive = checked<bool>(alive, fn, "alive", "bool", "[E, N]", {E, N}, writable);
  w.types = checked<std::int64_t>(types, fn, "types", "int64", "[E, N]", {E, N}, false);
  w.prev_move =
      checked<float>(prev_move, fn, "prev_move", "float32", "[E, N, 2]", {E, N, 2}, writable);
  w.prev_attack = checked<std::int64_t>(prev_attack, fn, "prev_attack", "int64", "[E, N]", {E, N},
                                        writable);
  const auto* t = static_cast<const std::int64_t*>(w.types.data());
  for (py::ssize_t i = 0; i < E * N; ++i) {
    if (t[i] < 0 || t[i] >= marlkit::smax::kTypes) {
      throw std::invalid_argument(std::string(fn) + ": types must be unit type ids in [0, 5], got " +
                                  std::to_string(t[i]));
    }
  }
  return w;
}

marlkit::smax::World world(WorldArrays& a, std::int64_t n_allies, const char* fn) {
  if (n_allies < 1 || n_allies >= a.N) {
    throw std::invalid_argument(std::string(fn) + ": n_allies must be in [1, N - 1] = [1, " +
                                std::to_string(a.N - 1) + "], got " + std::to_string(n_allies));
  }
  return marlkit::smax::World{static_cast<float*>(a.pos.mutable_data()),
                              static_cast<float*>(a.health.mutable_data()),
                              static_cast<float*>(a.cooldown.mutable_data()),
                              static_cast<bool*>(a.alive.mutable_data()),
                              static_cast<const std::int64_t*>(a.types.data()),
                              static_cast<float*>(a.prev_move.mutable_data()),
                              static_cast<std::int64_t*>(a.prev_attack.mutable_data()),
                              a.E,
                              a.N,
                              n_allies};
}

const float* table_ptr(const py::object& table, const char* fn, py::array& keep) {
  keep = checked<float>(table, fn, "table", "float32", "[6, 7]",
                        {marlkit::smax::kTypes, marlkit::smax::kStats}, false);
  return static_cast<const float*>(keep.data());
}

marlkit::smax::Map map_of(double width, double height, const char* fn) {
  if (!(width > 0.0) || !(height > 0.0) || !std::isfinite(width) || !std::isfinite(height)) {
    throw std::invalid_argument(std::string(fn) + ": map_width and map_height must be finite "
                                                  "and > 0");
  }
  return {static_cast<float>(width), static_cast<float>(height)};
}

void ticks(const py::object& pos, const py::object& health, const py::object& cooldown,
           const py::object& alive, const py::object& types, const py::object& prev_move,
           const py::object& prev_attack, const py::object& actions_obj,
           const py::object& jitter_obj, const py::object& table, std::int64_t n_allies,
           double map_width, double map_height, double dt, bool walls_cause_death) {
  const char* fn = "smax_ticks";
  WorldArrays a = world_arrays(fn, pos, health, cooldown, alive, types, prev_move, prev_attack,
                               true);
  const marlkit::smax::World w = world(a, n_allies, fn);
  py::array actions = checked<std::int64_t>(actions_obj, fn, "actions", "int64", "[E, N]",
                                            {a.E, a.N}, false);
  if (!py::isinstance<py::array>(jitter_obj) ||
      py::reinterpret_borrow<py::array>(jitter_obj).ndim() != 3) {
    throw std::invalid_argument("smax_ticks: jitter must be a float32 array [E, T, N]");
  }
  const py::ssize_t T = py::reinterpret_borrow<py::array>(jitter_obj).shape(1);
  py::array jitter =
      checked<float>(jitter_obj, fn, "jitter", "float32", "[E, T, N]", {a.E, T, a.N}, false);
  py::array keep;
  const float* tab = table_ptr(table, fn, keep);
  const marlkit::smax::Map map = map_of(map_width, map_height, fn);
  if (!(dt > 0.0) || !std::isfinite(dt)) {
    throw std::invalid_argument("smax_ticks: dt must be finite and > 0");
  }
  const auto* act = static_cast<const std::int64_t*>(actions.data());
  const std::int64_t M = a.N - n_allies;
  for (py::ssize_t e = 0; e < a.E; ++e) {
    for (py::ssize_t i = 0; i < a.N; ++i) {
      const std::int64_t v = act[e * a.N + i];
      const std::int64_t n = marlkit::smax::kMoves + (i < n_allies ? M : n_allies);
      if (v < 0 || v >= n) {
        throw std::invalid_argument("smax_ticks: actions[" + std::to_string(e) + ", " +
                                    std::to_string(i) + "] must be in [0, " +
                                    std::to_string(n - 1) + "], got " + std::to_string(v));
      }
    }
  }
  const auto* jit = static_cast<const float*>(jitter.data());
  py::gil_scoped_release release;
  marlkit::smax::ticks(w, act, jit, T, tab, map, static_cast<float>(dt), walls_cause_death);
}

void observe(const py::object& pos, const py::object& health, const py::object& cooldown,
             const py::object& alive, const py::object& types, const py::object& prev_move,
             const py::object& prev_attack, const py::object& table, const py::object& obs_obj,
             const py::object& visible_obj, const py::object& ally_mask_obj,
             const py::object& enemy_mask_obj, const py::object& state_obj, std::int64_t n_allies,
             double map_width, double map_height, bool see_enemy_actions) {
  const char* fn = "smax_observe";
  WorldArrays a = world_arrays(fn, pos, health, cooldown, alive, types, prev_move, prev_attack,
                               false);
  const marlkit::smax::World w = world(a, n_allies, fn);
  const py::ssize_t E = a.E, N = a.N, A = n_allies, M = N - A;
  const py::ssize_t n_obs = enemy_mask_obj.is_none() ? A : N;
  const py::ssize_t D = marlkit::smax::kUnitFeatures * (N - 1) + marlkit::smax::kOwnFeatures;
  py::array obs = checked<float>(obs_obj, fn, "obs_out", "float32", "[E, n_obs, 13 (N - 1) + 10]",
                                 {E, n_obs, D}, true);
  py::array visible = checked<bool>(visible_obj, fn, "visible_out", "bool", "[E, n_obs, N - 1]",
                                    {E, n_obs, N - 1}, true);
  py::array ally_mask = checked<bool>(ally_mask_obj, fn, "ally_mask_out", "bool", "[E, A, 5 + M]",
                                      {E, A, marlkit::smax::kMoves + M}, true);
  py::array enemy_mask;
  bool* enemy_ptr = nullptr;
  if (!enemy_mask_obj.is_none()) {
    enemy_mask = checked<bool>(enemy_mask_obj, fn, "enemy_mask_out", "bool", "[E, M, 5 + A]",
                               {E, M, marlkit::smax::kMoves + A}, true);
    enemy_ptr = static_cast<bool*>(enemy_mask.mutable_data());
  }
  py::array state = checked<float>(state_obj, fn, "state_out", "float32", "[E, 12 N]",
                                   {E, (marlkit::smax::kOwnFeatures + 2) * N}, true);
  py::array keep;
  const float* tab = table_ptr(table, fn, keep);
  const marlkit::smax::Map map = map_of(map_width, map_height, fn);
  auto* obs_ptr = static_cast<float*>(obs.mutable_data());
  auto* vis_ptr = static_cast<bool*>(visible.mutable_data());
  auto* ally_ptr = static_cast<bool*>(ally_mask.mutable_data());
  auto* state_ptr = static_cast<float*>(state.mutable_data());
  py::gil_scoped_release release;
  marlkit::smax::observe(w, tab, map, see_enemy_actions, n_obs, obs_ptr, vis_ptr, ally_ptr,
                         enemy_ptr, state_ptr);
}

void heuristic(const py::object& pos, const py::object& health, const py::object& cooldown,
               const py::object& alive, const py::object& types, const py::object& prev_move,
               const py::object& prev_attack, const py::object& target_obj,
               const py::object& last_obj, const py::object& u_obj, const py::object& table,
               const py::object& out_obj, std::int64_t n_allies, double map_width,
               double map_height) {
  const char* fn = "smax_heuristic";
  WorldArrays a = world_arrays(fn, pos, health, cooldown, alive, types, prev_move, prev_attack,
                               false);
  const marlkit::smax::World w = world(a, n_allies, fn);
  const py::ssize_t E = a.E, M = a.N - n_allies;
  py::array target =
      checked<float>(target_obj, fn, "target", "float32", "[E, M, 2]", {E, M, 2}, true);
  py::array last = checked<std::int64_t>(last_obj, fn, "last", "int64", "[E, M]", {E, M}, true);
  py::array u = checked<float>(u_obj, fn, "u", "float32", "[E, M]", {E, M}, false);
  py::array out = checked<std::int64_t>(out_obj, fn, "out", "int64", "[E, M]", {E, M}, true);
  const auto* last_ptr = static_cast<std::int64_t*>(last.mutable_data());
  for (py::ssize_t i = 0; i < E * M; ++i) {
    if (last_ptr[i] < -1 || last_ptr[i] >= n_allies) {
      throw std::invalid_argument("smax_heuristic: last must be -1 or an ally slot in [0, " +
                                  std::to_string(n_allies - 1) + "], got " +
                                  std::to_string(last_ptr[i]));
    }
  }
  py::array keep;
  const float* tab = table_ptr(table, fn, keep);
  const marlkit::smax::Map map = map_of(map_width, map_height, fn);
  auto* target_ptr = static_cast<float*>(target.mutable_data());
  auto* lp = static_cast<std::int64_t*>(last.mutable_data());
  const auto* u_ptr = static_cast<const float*>(u.data());
  auto* out_ptr = static_cast<std::int64_t*>(out.mutable_data());
  py::gil_scoped_release release;
  marlkit::smax::heuristic(w, target_ptr, lp, u_ptr, tab, map, out_ptr);
}

}  // namespace smax_bind

void bind_smax(py::module_& m) {
  m.def("smax_ticks", &smax_bind::ticks, py::arg("pos"), py::arg("health"), py::arg("cooldown"),
        py::arg("alive"), py::arg("types"), py::arg("prev_move"), py::arg("prev_attack"),
        py::arg("actions"), py::arg("jitter"), py::arg("table"), py::kw_only(),
        py::arg("n_allies"), py::arg("map_width"), py::arg("map_height"), py::arg("dt"),
        py::arg("walls_cause_death"),
        R"doc(Advance E SMAX battles by T world ticks, in place (JaxMARL's SMAX rules).

World arrays (C-contiguous, updated in place): pos float32 [E, N, 2], health float32 [E, N],
cooldown float32 [E, N], alive bool [E, N], types int64 [E, N] (read only, in [0, 5]),
prev_move float32 [E, N, 2], prev_attack int64 [E, N]. actions int64 [E, N] (moves 0..3, stop 4,
5 + k attacks the other team's k-th unit; allies first), jitter float32 [E, T, N] (the cooldown
jitter of each tick), table float32 [6, 7] (per type: speed, damage, attack range, sight range,
radius, health, cooldown). Per tick: moves clipped to the map, attacks on live targets in range
once the cooldown is spent (damage summed per target, health floored at 0, reload to cooldown +
jitter, else cooldown -= dt), deaths at the walls, pushing apart of overlapping live units.
Raises ValueError for a bad array, type id, action or parameter. Releases the GIL; threads over
environments.)doc");
  m.def("smax_observe", &smax_bind::observe, py::arg("pos"), py::arg("health"),
        py::arg("cooldown"), py::arg("alive"), py::arg("types"), py::arg("prev_move"),
        py::arg("prev_attack"), py::arg("table"), py::arg("obs_out"), py::arg("visible_out"),
        py::arg("ally_mask_out"), py::arg("enemy_mask_out"), py::arg("state_out"), py::kw_only(),
        py::arg("n_allies"), py::arg("map_width"), py::arg("map_height"),
        py::arg("see_enemy_actions"),
        R"doc(SMAX's unit-list observations of the first n_obs units (A, or N when enemy_mask_out is
given), their action masks and the world state, written into the *_out arrays: obs_out float32
[E, n_obs, 13 (N - 1) + 10], visible_out bool [E, n_obs, N - 1], ally_mask_out bool [E, A, 5 + M],
enemy_mask_out None or bool [E, M, 5 + A], state_out float32 [E, 12 N]. World arrays as in
smax_ticks (read only). Releases the GIL; threads over environments.)doc");
  m.def("smax_heuristic", &smax_bind::heuristic, py::arg("pos"), py::arg("health"),
        py::arg("cooldown"), py::arg("alive"), py::arg("types"), py::arg("prev_move"),
        py::arg("prev_attack"), py::arg("target"), py::arg("last"), py::arg("u"),
        py::arg("table"), py::arg("out"), py::kw_only(), py::arg("n_allies"),
        py::arg("map_width"), py::arg("map_height"),
        R"doc(SMAX's heuristic enemy (attack_mode "closest"): writes the M enemies' actions into out
int64 [E, M]; target float32 [E, M, 2] (where each heads when it sees nobody) and last int64
[E, M] (the ally slot it keeps attacking, or -1) are updated in place; u float32 [E, M] uniform
draws choose which seen ally to chase. World arrays as in smax_ticks (read only). Releases the
GIL; threads over environments.)doc");
}
// --- end section: smax -------------------------------------------------------------------------

PYBIND11_MODULE(_C, m) {
  m.doc() = "marlkit native kernels (C++17, no libtorch).";
  m.attr("ABI_VERSION") = kAbiVersion;
  m.attr("SOURCE_HASH") = MARLKIT_SOURCE_HASH;
  m.def("set_num_threads", &marlkit::set_num_threads, py::arg("n"),
        "Set the number of threads kernels use (0 = all hardware threads).");
  m.def("get_num_threads", &marlkit::resolved_num_threads,
        "Number of threads kernels use now.");
  m.def("set_min_work_per_thread", &marlkit::set_min_work_per_thread, py::arg("units"),
        "Set the least work (kernel work units, >= 1) a particle or LiDAR job gives each thread.");
  m.def("get_min_work_per_thread", &marlkit::min_work_per_thread,
        "The least work (kernel work units) a particle or LiDAR job gives each thread.");
  // --- module registrations (one line per section) ---
  bind_segment_tree(m);
  bind_particles(m);
  bind_render(m);
  bind_gather(m);
  bind_smax(m);
}
