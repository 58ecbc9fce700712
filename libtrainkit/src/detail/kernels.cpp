// The fused optimizer kernels. This file includes no LibTorch header (it compiles in about a second);
// threading happens in the callers, which hand each task one contiguous chunk.
//
// Each loop is written so that GCC vectorizes it (checked with -fopt-info-vec): restrict pointers, no
// calls but std::sqrt (which needs -fno-math-errno, set on the target) and std::max, branches on
// loop-invariant flags only. Each is compiled for AVX-512, AVX2 and baseline x86-64 and the widest one the
// CPU supports is picked at load time (GCC function multiversioning).
#include "detail/kernels.h"

#include <algorithm>
#include <cmath>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TRAINKIT_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TRAINKIT_MULTIVERSION
#endif

namespace trainkit::detail {

std::vector<Chunk> make_chunks(const std::vector<int64_t>& numels, int64_t grain) {
  return make_chunks(numels, 0, numels.size(), grain);
}

std::vector<std::pair<size_t, size_t>> make_blocks(const std::vector<int64_t>& numels, int64_t target) {
  std::vector<std::pair<size_t, size_t>> blocks;
  size_t first = 0;
  int64_t size = 0;
  for (size_t t = 0; t < numels.size(); ++t) {
    if (size > 0 && size + numels[t] > target) {
      blocks.emplace_back(first, t);
      first = t;
      size = 0;
    }
    size += numels[t];
  }
  if (first < numels.size()) {
    blocks.emplace_back(first, numels.size());
  }
  return blocks;
}

std::vector<Chunk> make_chunks(const std::vector<int64_t>& numels, size_t first, size_t last, int64_t grain) {
  std::vector<Chunk> chunks;
  for (size_t t = first; t < last; ++t) {
    for (int64_t begin = 0; begin < numels[t]; begin += grain) {
      chunks.push_back({static_cast<int64_t>(t), begin, std::min(grain, numels[t] - begin)});
    }
  }
  return chunks;
}

namespace {

template <class T, bool Amsgrad>
inline void adam_loop(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m, T* __restrict__ v,
                      T* __restrict__ vmax, int64_t n, const AdamCoef<T> c) {
  // The roundings follow PyTorch's single-tensor Adam op by op (add with alpha and lerp are fused
  // multiply-adds in ATen's CPU kernels, addcdiv divides last), so that float64 trajectories agree to the
  // last bits over hundreds of steps; this file is compiled with -ffp-contract=off for that reason.
  for (int64_t i = 0; i < n; ++i) {
    const T pi = p[i];
    const T gi = std::fma(c.l2, pi, c.grad_mul * g[i]);
    const T mi = std::fma(c.lerp_weight, gi - m[i], c.lerp_from_m ? m[i] : gi);
    const T vi = std::fma(c.one_minus_beta2 * gi, gi, c.beta2 * v[i]);
    m[i] = mi;
    v[i] = vi;
    T vh = vi;
    if constexpr (Amsgrad) {
      vh = std::max(vmax[i], vi);
      vmax[i] = vh;
    }
    const T denom = std::sqrt(vh) / c.bc2_sqrt + c.eps;
    p[i] = c.decay * pi + (c.neg_step_size * mi) / denom;
  }
}

template <class T>
inline void sgd_loop(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ buf, int64_t n, const SgdCoef<T> c,
                     MomentumMode mode) {
  // Rounds like PyTorch's SGD / timm's LARS op by op: add with alpha is a fused multiply-add in ATen.
  const T neg_lr = -c.lr;
  switch (mode) {
    case MomentumMode::kNone:
      for (int64_t i = 0; i < n; ++i) {
        const T pi = p[i];
        const T d = c.trust * std::fma(c.l2, pi, c.grad_mul * g[i]);
        p[i] = std::fma(neg_lr, d, pi);
      }
      break;
    case MomentumMode::kFirst:
      for (int64_t i = 0; i < n; ++i) {
        const T pi = p[i];
        const T d = c.trust * std::fma(c.l2, pi, c.grad_mul * g[i]);
        buf[i] = d;
        p[i] = std::fma(neg_lr, c.nesterov ? std::fma(c.momentum, d, d) : d, pi);
      }
      break;
    case MomentumMode::kRunning:
      for (int64_t i = 0; i < n; ++i) {
        const T pi = p[i];
        const T d = c.trust * std::fma(c.l2, pi, c.grad_mul * g[i]);
        const T b = std::fma(c.keep, d, c.momentum * buf[i]);
        buf[i] = b;
        p[i] = std::fma(neg_lr, c.nesterov ? std::fma(c.momentum, b, d) : b, pi);
      }
      break;
  }
}

// Reductions keep kLanes independent double accumulators: one AVX-512 register, which GCC vectorizes at full
// width (a 2-D set of accumulators made it fall back to 16-byte vectors).
constexpr int kLanes = 8;

template <class T>
inline void sum_squares2_loop(const T* __restrict__ a, const T* __restrict__ b, int64_t n, double& sa, double& sb) {
  double acc_a[kLanes] = {};
  double acc_b[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const double x = static_cast<double>(a[i + k]);
      const double y = static_cast<double>(b[i + k]);
      acc_a[k] += x * x;
      acc_b[k] += y * y;
    }
  }
  double ta = 0;
  double tb = 0;
  for (; i < n; ++i) {
    const double x = static_cast<double>(a[i]);
    const double y = static_cast<double>(b[i]);
    ta += x * x;
    tb += y * y;
  }
  for (int k = 0; k < kLanes; ++k) {
    ta += acc_a[k];
    tb += acc_b[k];
  }
  sa += ta;
  sb += tb;
}

template <class T>
inline double sum_squares_loop(const T* __restrict__ a, int64_t n) {
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const double x = static_cast<double>(a[i + k]);
      acc[k] += x * x;
    }
  }
  double s = 0;
  for (; i < n; ++i) {
    const double x = static_cast<double>(a[i]);
    s += x * x;
  }
  for (double x : acc) {
    s += x;
  }
  return s;
}

template <class T>
inline double nonfinite_probe_loop(const T* __restrict__ x, int64_t n) {
  T acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int k = 0; k < 16; ++k) {
      acc[k] += x[i + k] * T(0);
    }
  }
  T s = 0;
  for (; i < n; ++i) {
    s += x[i] * T(0);
  }
  for (T a : acc) {
    s += a;
  }
  return static_cast<double>(s);
}

template <class T>
inline T lamb_first_moment(T m, T g, const LambCoef<T>& c) {
  return c.lerp ? m + c.beta3 * (g - m) : c.beta1 * m + c.beta3 * g;
}

template <class T>
inline T lamb_update(T m, T v, T p, const LambCoef<T>& c) {
  return (m * c.inv_bc1) / (std::sqrt(v) * c.inv_bc2_sqrt + c.eps) + c.wd * p;
}

template <class T>
inline void lamb_moments_loop(const T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m,
                              T* __restrict__ v, int64_t n, const LambCoef<T> c, double& sum_p2, double& sum_u2) {
  double acc_p[kLanes] = {};
  double acc_u[kLanes] = {};
  const auto one = [&](int64_t j, double& ap, double& au) {
    const T gj = c.grad_mul * g[j];
    const T mj = lamb_first_moment(m[j], gj, c);
    const T vj = c.beta2 * v[j] + c.one_minus_beta2 * (gj * gj);
    m[j] = mj;
    v[j] = vj;
    const T u = lamb_update(mj, vj, p[j], c);
    ap += static_cast<double>(p[j]) * static_cast<double>(p[j]);
    au += static_cast<double>(u) * static_cast<double>(u);
  };
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      one(i + k, acc_p[k], acc_u[k]);
    }
  }
  double tp = 0;
  double tu = 0;
  for (; i < n; ++i) {
    one(i, tp, tu);
  }
  for (int k = 0; k < kLanes; ++k) {
    tp += acc_p[k];
    tu += acc_u[k];
  }
  sum_p2 += tp;
  sum_u2 += tu;
}

template <class T>
inline void lamb_apply_loop(T* __restrict__ p, const T* __restrict__ m, const T* __restrict__ v, int64_t n,
                            const LambCoef<T> c, T step) {
  for (int64_t i = 0; i < n; ++i) {
    const T pi = p[i];
    p[i] = pi - step * lamb_update(m[i], v[i], pi, c);
  }
}

template <class T>
inline void lamb_moments_apply_loop(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m,
                                    T* __restrict__ v, int64_t n, const LambCoef<T> c, T step) {
  for (int64_t i = 0; i < n; ++i) {
    const T gi = c.grad_mul * g[i];
    const T mi = lamb_first_moment(m[i], gi, c);
    const T vi = c.beta2 * v[i] + c.one_minus_beta2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    const T pi = p[i];
    p[i] = pi - step * lamb_update(mi, vi, pi, c);
  }
}

// One multiversioned entry per loop and dtype (target_clones needs concrete functions, not templates).
TRAINKIT_MULTIVERSION void adam_f32(float* p, const float* g, float* m, float* v, float* vmax, int64_t n,
                                    const AdamCoef<float>& c) {
  if (vmax != nullptr) {
    adam_loop<float, true>(p, g, m, v, vmax, n, c);
  } else {
    adam_loop<float, false>(p, g, m, v, vmax, n, c);
  }
}
TRAINKIT_MULTIVERSION void adam_f64(double* p, const double* g, double* m, double* v, double* vmax, int64_t n,
                                    const AdamCoef<double>& c) {
  if (vmax != nullptr) {
    adam_loop<double, true>(p, g, m, v, vmax, n, c);
  } else {
    adam_loop<double, false>(p, g, m, v, vmax, n, c);
  }
}
TRAINKIT_MULTIVERSION void sgd_f32(float* p, const float* g, float* buf, int64_t n, const SgdCoef<float>& c,
                                   MomentumMode mode) {
  sgd_loop(p, g, buf, n, c, mode);
}
TRAINKIT_MULTIVERSION void sgd_f64(double* p, const double* g, double* buf, int64_t n, const SgdCoef<double>& c,
                                   MomentumMode mode) {
  sgd_loop(p, g, buf, n, c, mode);
}
TRAINKIT_MULTIVERSION void sum_squares2_f32(const float* a, const float* b, int64_t n, double& sa, double& sb) {
  sum_squares2_loop(a, b, n, sa, sb);
}
TRAINKIT_MULTIVERSION void sum_squares2_f64(const double* a, const double* b, int64_t n, double& sa, double& sb) {
  sum_squares2_loop(a, b, n, sa, sb);
}
TRAINKIT_MULTIVERSION void scale_f32(float* __restrict__ x, int64_t n, float c) {
  for (int64_t i = 0; i < n; ++i) {
    x[i] *= c;
  }
}
TRAINKIT_MULTIVERSION void scale_f64(double* __restrict__ x, int64_t n, double c) {
  for (int64_t i = 0; i < n; ++i) {
    x[i] *= c;
  }
}
TRAINKIT_MULTIVERSION double sum_squares_f32(const float* a, int64_t n) { return sum_squares_loop(a, n); }
TRAINKIT_MULTIVERSION double sum_squares_f64(const double* a, int64_t n) { return sum_squares_loop(a, n); }
TRAINKIT_MULTIVERSION double nonfinite_probe_f32(const float* x, int64_t n) { return nonfinite_probe_loop(x, n); }
TRAINKIT_MULTIVERSION double nonfinite_probe_f64(const double* x, int64_t n) { return nonfinite_probe_loop(x, n); }
TRAINKIT_MULTIVERSION void lamb_moments_f32(const float* p, const float* g, float* m, float* v, int64_t n,
                                            const LambCoef<float>& c, double& sp, double& su) {
  lamb_moments_loop(p, g, m, v, n, c, sp, su);
}
TRAINKIT_MULTIVERSION void lamb_moments_f64(const double* p, const double* g, double* m, double* v, int64_t n,
                                            const LambCoef<double>& c, double& sp, double& su) {
  lamb_moments_loop(p, g, m, v, n, c, sp, su);
}
TRAINKIT_MULTIVERSION void lamb_apply_f32(float* p, const float* m, const float* v, int64_t n,
                                          const LambCoef<float>& c, float step) {
  lamb_apply_loop(p, m, v, n, c, step);
}
TRAINKIT_MULTIVERSION void lamb_apply_f64(double* p, const double* m, const double* v, int64_t n,
                                          const LambCoef<double>& c, double step) {
  lamb_apply_loop(p, m, v, n, c, step);
}
TRAINKIT_MULTIVERSION void lamb_moments_apply_f32(float* p, const float* g, float* m, float* v, int64_t n,
                                                  const LambCoef<float>& c, float step) {
  lamb_moments_apply_loop(p, g, m, v, n, c, step);
}
TRAINKIT_MULTIVERSION void lamb_moments_apply_f64(double* p, const double* g, double* m, double* v, int64_t n,
                                                  const LambCoef<double>& c, double step) {
  lamb_moments_apply_loop(p, g, m, v, n, c, step);
}

}  // namespace

void adam_kernel(float* p, const float* g, float* m, float* v, float* vmax, int64_t n, const AdamCoef<float>& c) {
  adam_f32(p, g, m, v, vmax, n, c);
}
void adam_kernel(double* p, const double* g, double* m, double* v, double* vmax, int64_t n,
                 const AdamCoef<double>& c) {
  adam_f64(p, g, m, v, vmax, n, c);
}
void sgd_kernel(float* p, const float* g, float* buf, int64_t n, const SgdCoef<float>& c, MomentumMode mode) {
  sgd_f32(p, g, buf, n, c, mode);
}
void sgd_kernel(double* p, const double* g, double* buf, int64_t n, const SgdCoef<double>& c, MomentumMode mode) {
  sgd_f64(p, g, buf, n, c, mode);
}
void sum_squares2(const float* a, const float* b, int64_t n, double& sa, double& sb) {
  sum_squares2_f32(a, b, n, sa, sb);
}
void sum_squares2(const double* a, const double* b, int64_t n, double& sa, double& sb) {
  sum_squares2_f64(a, b, n, sa, sb);
}
void scale(float* x, int64_t n, float c) { scale_f32(x, n, c); }
void scale(double* x, int64_t n, double c) { scale_f64(x, n, c); }
double sum_squares(const float* a, int64_t n) { return sum_squares_f32(a, n); }
double sum_squares(const double* a, int64_t n) { return sum_squares_f64(a, n); }
double nonfinite_probe(const float* x, int64_t n) { return nonfinite_probe_f32(x, n); }
double nonfinite_probe(const double* x, int64_t n) { return nonfinite_probe_f64(x, n); }
void lamb_moments(const float* p, const float* g, float* m, float* v, int64_t n, const LambCoef<float>& c,
                  double& sum_p2, double& sum_u2) {
  lamb_moments_f32(p, g, m, v, n, c, sum_p2, sum_u2);
}
void lamb_moments(const double* p, const double* g, double* m, double* v, int64_t n, const LambCoef<double>& c,
                  double& sum_p2, double& sum_u2) {
  lamb_moments_f64(p, g, m, v, n, c, sum_p2, sum_u2);
}
void lamb_apply(float* p, const float* m, const float* v, int64_t n, const LambCoef<float>& c, float step) {
  lamb_apply_f32(p, m, v, n, c, step);
}
void lamb_apply(double* p, const double* m, const double* v, int64_t n, const LambCoef<double>& c, double step) {
  lamb_apply_f64(p, m, v, n, c, step);
}
void lamb_moments_apply(float* p, const float* g, float* m, float* v, int64_t n, const LambCoef<float>& c,
                        float step) {
  lamb_moments_apply_f32(p, g, m, v, n, c, step);
}
void lamb_moments_apply(double* p, const double* g, double* m, double* v, int64_t n, const LambCoef<double>& c,
                        double step) {
  lamb_moments_apply_f64(p, g, m, v, n, c, step);
}

}  // namespace trainkit::detail
