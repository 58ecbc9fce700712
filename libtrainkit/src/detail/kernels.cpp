// The fused optimizer kernels. This file includes no LibTorch header but the header-only float16 conversions
// (it compiles in seconds); threading happens in the callers, which hand each task one contiguous chunk.
//
// Each loop is written so that GCC vectorizes it (checked with -fopt-info-vec): restrict pointers, no
// calls but std::sqrt (which needs -fno-math-errno, set on the target), std::fma and std::max, branches on
// loop-invariant flags only. Each entry point is compiled twice, for AVX2+FMA+F16C and for baseline x86-64,
// and picked at run time from the CPU's feature flags (kernels_use_avx2). GCC's target_clones did this
// before, but its ifunc resolver picked the baseline clone on VMs that hide the OSXSAVE bit even though
// AVX2 runs; and its "avx2" clone lacks FMA, so every std::fma became a call to fmaf and no loop vectorized.
#include "detail/kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>

// LibTorch's header-only float16 conversions moved to torch/headeronly/ in recent releases; older ones (2.1 to
// 2.7 at least) have them in c10/util/Half.h. A version difference kept here rather than in trainkit/compat.h,
// which includes ATen's tensor header: this file includes no other LibTorch header.
#if __has_include(<torch/headeronly/util/Half.h>)
#include <torch/headeronly/util/Half.h>
#else
#include <c10/util/Half.h>
#endif

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define TRAINKIT_X86 1
#define TRAINKIT_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define TRAINKIT_X86 0
#define TRAINKIT_TARGET_AVX2
#endif
#if defined(__GNUC__) || defined(__clang__)
// The loops are inlined into each target's entry point, so that they are compiled for that target.
#define TRAINKIT_INLINE __attribute__((always_inline)) inline
#else
#define TRAINKIT_INLINE inline
#endif

namespace trainkit::detail {

namespace {
std::atomic<bool> allow_avx2{true};
std::atomic<SplitMode> split_choice{SplitMode::kContiguous};
}  // namespace

bool kernels_use_avx2() {
#if TRAINKIT_X86
  static const bool cpu = [] {
    __builtin_cpu_init();
    // F16C through CPUID (leaf 1, ECX bit 29): clang 14's __builtin_cpu_supports does not know "f16c".
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  }();
  return cpu && allow_avx2.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

void set_kernel_choices(bool avx2, SplitMode split) {
  allow_avx2.store(avx2);
  split_choice.store(split);
}

SplitMode split_mode() { return split_choice.load(std::memory_order_relaxed); }

std::vector<std::vector<Chunk>> per_tensor_split(const std::vector<int64_t>& numels, int64_t parts, int64_t align) {
  parts = std::max<int64_t>(parts, 1);
  std::vector<std::vector<Chunk>> out(static_cast<size_t>(parts));
  for (size_t t = 0; t < numels.size(); ++t) {
    const int64_t n = numels[t];
    int64_t lo = 0;
    for (int64_t k = 0; k < parts; ++k) {
      const int64_t even = n / parts * (k + 1) + n % parts * (k + 1) / parts;  // ⌊n·(k+1)/parts⌋
      const int64_t hi = k + 1 == parts ? n : std::max(lo, even / align * align);
      if (hi > lo) {
        out[static_cast<size_t>(k)].push_back({static_cast<int64_t>(t), lo, hi - lo});
      }
      lo = hi;
    }
  }
  return out;
}

std::vector<std::vector<Chunk>> even_split(const std::vector<int64_t>& numels, int64_t parts, int64_t align) {
  parts = std::max<int64_t>(parts, 1);
  std::vector<int64_t> prefix(numels.size() + 1, 0);
  for (size_t t = 0; t < numels.size(); ++t) {
    prefix[t + 1] = prefix[t] + numels[t];
  }
  const int64_t total = prefix.back();
  // Boundaries in the concatenation: k·total/parts, moved down to a multiple of `align` inside its tensor.
  std::vector<int64_t> bounds{0};
  size_t t = 0;
  for (int64_t k = 1; k < parts; ++k) {
    const int64_t target = total / parts * k + total % parts * k / parts;  // ⌊total·k/parts⌋, no overflow
    while (t + 1 < numels.size() && prefix[t + 1] <= target) {
      ++t;
    }
    const int64_t local = (target - prefix[t]) / align * align;
    bounds.push_back(std::max(bounds.back(), std::min(prefix[t] + local, total)));
  }
  bounds.push_back(total);
  std::vector<std::vector<Chunk>> out(static_cast<size_t>(parts));
  size_t tensor = 0;
  for (int64_t k = 0; k < parts; ++k) {
    int64_t at = bounds[static_cast<size_t>(k)];
    const int64_t end = bounds[static_cast<size_t>(k) + 1];
    while (at < end) {
      while (prefix[tensor + 1] <= at) {
        ++tensor;
      }
      const int64_t stop = std::min(end, prefix[tensor + 1]);
      out[static_cast<size_t>(k)].push_back({static_cast<int64_t>(tensor), at - prefix[tensor], stop - at});
      at = stop;
    }
  }
  return out;
}

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

enum class Isa { kBase, kAvx2 };

// How a storage type is read into and written from the arithmetic type inside a loop: identity for float
// and double; bfloat16 through its raw bits, so that the loop sees plain 16-bit integers, with integer
// operations that vectorize in place (float16 needs F16C's instructions, used by the block loops below).
template <class S>
struct Storage {
  using raw = S;
  static TRAINKIT_INLINE S load(S x) { return x; }
  static TRAINKIT_INLINE S save(S x) { return x; }
};
// bfloat16 <-> float32: the upper half of the bits; rounding to nearest even, NaN kept quiet (c10::BFloat16).
template <>
struct Storage<BFloat16Bits> {
  using raw = uint16_t;
  static TRAINKIT_INLINE float load(uint16_t x) {
    const uint32_t u = static_cast<uint32_t>(x) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  static TRAINKIT_INLINE uint16_t save(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    return static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : rounded);  // NaN: integer test
  }
};
TRAINKIT_INLINE float to_float(BFloat16Bits b) { return Storage<BFloat16Bits>::load(b.x); }
TRAINKIT_INLINE BFloat16Bits to_bf16(float f) { return {Storage<BFloat16Bits>::save(f)}; }
template <class S>
TRAINKIT_INLINE typename Storage<S>::raw* raw_ptr(S* x) {
  return reinterpret_cast<typename Storage<S>::raw*>(x);  // BFloat16Bits: its one uint16_t member
}
template <class S>
TRAINKIT_INLINE const typename Storage<S>::raw* raw_ptr(const S* x) {
  return reinterpret_cast<const typename Storage<S>::raw*>(x);
}

/// Adam's gradient and moments, element by element (shared with RAdam, NAdam and Adamax): g' = grad_mul·g +
/// l2·p (add with alpha: a fused multiply-add in ATen); m as ATen's lerp; v ← β2·v + (1-β2)·g'² (addcmul).
template <class T>
TRAINKIT_INLINE T adam_grad(T l2, T grad_mul, T p, T g) {
  return std::fma(l2, p, grad_mul * g);
}
template <bool LerpFromM, class T>
TRAINKIT_INLINE T adam_first_moment(T lerp_weight, T g, T m0) {
  return std::fma(lerp_weight, g - m0, LerpFromM ? m0 : g);
}
template <class T>
TRAINKIT_INLINE T adam_second_moment(T one_minus_beta2, T beta2, T g, T v0) {
  return std::fma(one_minus_beta2 * g, g, beta2 * v0);
}

/// Adam in arithmetic type T over parameters/gradients stored as P and state stored as S (each T, or
/// bfloat16 with T = float): every value is widened once when read and rounded once when stored.
/// The loop-invariant choices are template parameters (a select on a runtime flag keeps GCC from vectorizing
/// loops that mix 16- and 32-bit types).
template <class T, bool Amsgrad, bool LerpFromM, class P, class S>
TRAINKIT_INLINE void adam_loop(P* p_, const P* g_, S* m_, S* v_, S* vmax_, int64_t n, const AdamCoef<T> c) {
  using LP = Storage<P>;
  using LS = Storage<S>;
  auto* __restrict__ p = raw_ptr(p_);
  const auto* __restrict__ g = raw_ptr(g_);
  auto* __restrict__ m = raw_ptr(m_);
  auto* __restrict__ v = raw_ptr(v_);
  auto* __restrict__ vmax = raw_ptr(vmax_);
  // The roundings follow PyTorch's single-tensor Adam op by op (add with alpha and lerp are fused
  // multiply-adds in ATen's CPU kernels, addcdiv divides last), so that float64 trajectories agree to the
  // last bits over hundreds of steps; this file is compiled with -ffp-contract=off for that reason.
  for (int64_t i = 0; i < n; ++i) {
    const T pi = LP::load(p[i]);
    const T gi = adam_grad(c.l2, c.grad_mul, pi, LP::load(g[i]));
    const T mi = adam_first_moment<LerpFromM>(c.lerp_weight, gi, LS::load(m[i]));
    const T vi = adam_second_moment(c.one_minus_beta2, c.beta2, gi, LS::load(v[i]));
    m[i] = LS::save(mi);
    v[i] = LS::save(vi);
    T vh = vi;
    if constexpr (Amsgrad) {
      vh = std::max(LS::load(vmax[i]), vi);
      vmax[i] = LS::save(vh);
    }
    const T denom = std::sqrt(vh) / c.bc2_sqrt + c.eps;
    p[i] = LP::save(c.decay * pi + (c.neg_step_size * mi) / denom);
  }
}

template <class T>
TRAINKIT_INLINE void sgd_loop(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ buf, int64_t n, const SgdCoef<T> c,
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

/// Σx² in double. The slice is read as four quarters side by side, kLanes partial sums each (a core with one
/// read stream cannot keep enough cache-line misses in flight to reach the memory's bandwidth; see
/// nonfinite_probe_loop); the partial sums are added in a fixed order, so the result depends on n only.
template <class T>
TRAINKIT_INLINE double sum_squares_loop(const T* __restrict__ a, int64_t n) {
  const int64_t quarter = n / 4 / kLanes * kLanes;
  const T* __restrict__ a1 = a + quarter;
  const T* __restrict__ a2 = a + 2 * quarter;
  const T* __restrict__ a3 = a + 3 * quarter;
  double acc0[kLanes] = {};
  double acc1[kLanes] = {};
  double acc2[kLanes] = {};
  double acc3[kLanes] = {};
  for (int64_t i = 0; i < quarter; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const double x0 = static_cast<double>(a[i + k]);
      const double x1 = static_cast<double>(a1[i + k]);
      const double x2 = static_cast<double>(a2[i + k]);
      const double x3 = static_cast<double>(a3[i + k]);
      acc0[k] += x0 * x0;
      acc1[k] += x1 * x1;
      acc2[k] += x2 * x2;
      acc3[k] += x3 * x3;
    }
  }
  double s = 0;
  for (int64_t i = 4 * quarter; i < n; ++i) {
    const double x = static_cast<double>(a[i]);
    s += x * x;
  }
  for (int k = 0; k < kLanes; ++k) {
    s += (acc0[k] + acc1[k]) + (acc2[k] + acc3[k]);
  }
  return s;
}

/// Σa² and Σb² in double: sum_squares of each, one array after the other (each read as four streams).
template <class T>
TRAINKIT_INLINE void sum_squares2_loop(const T* __restrict__ a, const T* __restrict__ b, int64_t n, double& sa, double& sb) {
  sa += sum_squares_loop(a, n);
  sb += sum_squares_loop(b, n);
}

template <class T>
TRAINKIT_INLINE double nonfinite_probe_loop(const T* __restrict__ x, int64_t n) {
  // Four quarters of the slice read side by side: a core with one read stream cannot keep enough cache-line
  // misses in flight to reach the memory's bandwidth (a read-only pass is latency-bound, unlike the
  // optimizers' four-stream loops). Each product is 0 or NaN, so the order of the sums does not matter.
  constexpr int64_t kWidth = 16;
  const int64_t quarter = n / 4 / kWidth * kWidth;
  const T* __restrict__ x1 = x + quarter;
  const T* __restrict__ x2 = x + 2 * quarter;
  const T* __restrict__ x3 = x + 3 * quarter;
  T acc[kWidth] = {};
  for (int64_t i = 0; i < quarter; i += kWidth) {
    for (int64_t k = 0; k < kWidth; ++k) {
      acc[k] += (x[i + k] * T(0) + x1[i + k] * T(0)) + (x2[i + k] * T(0) + x3[i + k] * T(0));
    }
  }
  T s = 0;
  for (int64_t i = 4 * quarter; i < n; ++i) {
    s += x[i] * T(0);
  }
  for (T a : acc) {
    s += a;
  }
  return static_cast<double>(s);
}

template <class T>
TRAINKIT_INLINE T lamb_first_moment(T m, T g, const LambCoef<T>& c) {
  return c.lerp ? m + c.beta3 * (g - m) : c.beta1 * m + c.beta3 * g;
}
/// The same with the choice made at compile time (lamb_moments_loop).
template <bool Lerp, class T>
TRAINKIT_INLINE T lamb_first_moment(T m, T g, const LambCoef<T>& c) {
  return Lerp ? m + c.beta3 * (g - m) : c.beta1 * m + c.beta3 * g;
}

template <class T>
TRAINKIT_INLINE T lamb_update(T m, T v, T p, const LambCoef<T>& c) {
  return (m * c.inv_bc1) / (std::sqrt(v) * c.inv_bc2_sqrt + c.eps) + c.wd * p;
}

/// LAMB's first pass: the moments, and Σp², Σu² (u the unadapted update) in double, kLanes partial sums
/// each. The element code is written out in both loops rather than shared through a lambda: through a
/// lambda's captures GCC loses the pointers' __restrict__, checks aliasing every kLanes elements and does not
/// vectorize the outer loop (found with -fopt-info-vec; the pass ran at 0.6 of Adam's bandwidth). `Lerp` is a
/// template parameter for the same reason as adam_loop's flags.
template <class T, bool Lerp>
TRAINKIT_INLINE void lamb_moments_loop(const T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m,
                                       T* __restrict__ v, int64_t n, const LambCoef<T> c, double& sum_p2,
                                       double& sum_u2) {
  double acc_p[kLanes] = {};
  double acc_u[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const T gj = c.grad_mul * g[i + k];
      const T mj = lamb_first_moment<Lerp>(m[i + k], gj, c);
      const T vj = c.beta2 * v[i + k] + c.one_minus_beta2 * (gj * gj);
      m[i + k] = mj;
      v[i + k] = vj;
      const T u = lamb_update(mj, vj, p[i + k], c);
      acc_p[k] += static_cast<double>(p[i + k]) * static_cast<double>(p[i + k]);
      acc_u[k] += static_cast<double>(u) * static_cast<double>(u);
    }
  }
  double tp = 0;
  double tu = 0;
  for (; i < n; ++i) {
    const T gj = c.grad_mul * g[i];
    const T mj = lamb_first_moment<Lerp>(m[i], gj, c);
    const T vj = c.beta2 * v[i] + c.one_minus_beta2 * (gj * gj);
    m[i] = mj;
    v[i] = vj;
    const T u = lamb_update(mj, vj, p[i], c);
    tp += static_cast<double>(p[i]) * static_cast<double>(p[i]);
    tu += static_cast<double>(u) * static_cast<double>(u);
  }
  for (int k = 0; k < kLanes; ++k) {
    tp += acc_p[k];
    tu += acc_u[k];
  }
  sum_p2 += tp;
  sum_u2 += tu;
}

template <class T>
TRAINKIT_INLINE void lamb_apply_loop(T* __restrict__ p, const T* __restrict__ m, const T* __restrict__ v, int64_t n,
                            const LambCoef<T> c, T step) {
  for (int64_t i = 0; i < n; ++i) {
    const T pi = p[i];
    p[i] = pi - step * lamb_update(m[i], v[i], pi, c);
  }
}

template <class T>
TRAINKIT_INLINE void lamb_moments_apply_loop(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m,
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

// The float16 kernels (and SGD's bfloat16 ones) convert p and g of a block to float32 in L1-resident buffers,
// run the float32 loop on them and the float32 state, and convert p back (bfloat16 Adam converts inside
// adam_loop instead: Storage above).
constexpr int64_t kConvertBlock = 512;

template <Isa I>
TRAINKIT_INLINE void to_float_n(const BFloat16Bits* __restrict__ in, float* __restrict__ out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = to_float(in[i]);
  }
}
template <Isa I>
TRAINKIT_INLINE void from_float_n(const float* __restrict__ in, BFloat16Bits* __restrict__ out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = to_bf16(in[i]);
  }
}
// float16: F16C's conversions (round to nearest even, as c10::Half) on AVX2, c10::Half's own bit-exact
// software conversions otherwise (not _Float16: clang before 15 lacks it on x86). The
// F16C loops are functions of their own (called once per block): intrinsics only inline into their target.
#if TRAINKIT_X86
TRAINKIT_TARGET_AVX2 int64_t half_to_float_f16c(const HalfBits* __restrict__ in, float* __restrict__ out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
  return i;
}
TRAINKIT_TARGET_AVX2 int64_t float_to_half_f16c(const float* __restrict__ in, HalfBits* __restrict__ out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  return i;
}
#endif
template <Isa I>
TRAINKIT_INLINE void to_float_n(const HalfBits* __restrict__ in, float* __restrict__ out, int64_t n) {
  int64_t i = 0;
#if TRAINKIT_X86
  if constexpr (I == Isa::kAvx2) {
    i = half_to_float_f16c(in, out, n);
  }
#endif
  for (; i < n; ++i) {
    out[i] = c10::detail::fp16_ieee_to_fp32_value(in[i].x);
  }
}
template <Isa I>
TRAINKIT_INLINE void from_float_n(const float* __restrict__ in, HalfBits* __restrict__ out, int64_t n) {
  int64_t i = 0;
#if TRAINKIT_X86
  if constexpr (I == Isa::kAvx2) {
    i = float_to_half_f16c(in, out, n);
  }
#endif
  for (; i < n; ++i) {
    out[i].x = c10::detail::fp16_ieee_from_fp32_value(in[i]);
  }
}

/// Runs body(p32, g32, offset, len) block by block on float32 copies of p and g, then stores p back.
template <Isa I, class P, class Body>
TRAINKIT_INLINE void converted_blocks(P* p, const P* g, int64_t n, const Body& body) {
  alignas(64) float pf[kConvertBlock];
  alignas(64) float gf[kConvertBlock];
  for (int64_t b = 0; b < n; b += kConvertBlock) {
    const int64_t len = std::min(kConvertBlock, n - b);
    to_float_n<I>(p + b, pf, len);
    to_float_n<I>(g + b, gf, len);
    body(pf, gf, b, len);
    from_float_n<I>(pf, p + b, len);
  }
}

template <Isa I, class T, class P, class S>
TRAINKIT_INLINE void adam_impl(P* p, const P* g, S* m, S* v, S* vmax, int64_t n, const AdamCoef<T>& c) {
  if (vmax != nullptr) {
    c.lerp_from_m ? adam_loop<T, true, true>(p, g, m, v, vmax, n, c)
                  : adam_loop<T, true, false>(p, g, m, v, vmax, n, c);
  } else {
    c.lerp_from_m ? adam_loop<T, false, true>(p, g, m, v, vmax, n, c)
                  : adam_loop<T, false, false>(p, g, m, v, vmax, n, c);
  }
}
// bfloat16 parameters (float32 or bfloat16 state): one loop that converts in registers. float16: float32
// copies of a block (converted_blocks), as its conversions vectorize only as F16C loops of their own.
template <Isa I, class P>
TRAINKIT_INLINE void adam_reduced_impl(P* p, const P* g, float* m, float* v, float* vmax, int64_t n,
                                       const AdamCoef<float>& c) {
  if constexpr (std::is_same_v<P, BFloat16Bits>) {
    adam_impl<I, float>(p, g, m, v, vmax, n, c);
  } else {
    converted_blocks<I>(p, g, n, [&](float* pf, const float* gf, int64_t b, int64_t len) {
      adam_impl<I, float>(pf, gf, m + b, v + b, vmax == nullptr ? nullptr : vmax + b, len, c);
    });
  }
}
template <Isa I, class P>
TRAINKIT_INLINE void adam_lowp_state_impl(P* p, const P* g, P* m, P* v, P* vmax, int64_t n, const AdamCoef<float>& c) {
  if constexpr (std::is_same_v<P, BFloat16Bits>) {
    adam_impl<I, float>(p, g, m, v, vmax, n, c);
  } else {
    alignas(64) float mf[kConvertBlock];
    alignas(64) float vf[kConvertBlock];
    alignas(64) float xf[kConvertBlock];
    converted_blocks<I>(p, g, n, [&](float* pf, const float* gf, int64_t b, int64_t len) {
      to_float_n<I>(m + b, mf, len);
      to_float_n<I>(v + b, vf, len);
      if (vmax != nullptr) {
        to_float_n<I>(vmax + b, xf, len);
      }
      adam_impl<I, float>(pf, gf, mf, vf, vmax == nullptr ? nullptr : xf, len, c);
      from_float_n<I>(mf, m + b, len);
      from_float_n<I>(vf, v + b, len);
      if (vmax != nullptr) {
        from_float_n<I>(xf, vmax + b, len);
      }
    });
  }
}
template <Isa I, class T>
TRAINKIT_INLINE void sgd_impl(T* p, const T* g, T* buf, int64_t n, const SgdCoef<T>& c, MomentumMode mode) {
  sgd_loop(p, g, buf, n, c, mode);
}
template <Isa I, class P>
TRAINKIT_INLINE void sgd_reduced_impl(P* p, const P* g, float* buf, int64_t n, const SgdCoef<float>& c,
                                      MomentumMode mode) {
  converted_blocks<I>(p, g, n, [&](float* pf, const float* gf, int64_t b, int64_t len) {
    sgd_loop<float>(pf, gf, buf == nullptr ? nullptr : buf + b, len, c, mode);
  });
}
template <Isa I, class T>
TRAINKIT_INLINE void sum_squares2_impl(const T* a, const T* b, int64_t n, double& sa, double& sb) {
  sum_squares2_loop(a, b, n, sa, sb);
}
template <Isa I, class T>
TRAINKIT_INLINE void scale_impl(T* __restrict__ x, int64_t n, T c) {
  for (int64_t i = 0; i < n; ++i) {
    x[i] *= c;
  }
}
template <Isa I, class T>
TRAINKIT_INLINE double sum_squares_impl(const T* a, int64_t n) {
  return sum_squares_loop(a, n);
}
template <Isa I, class T>
TRAINKIT_INLINE double nonfinite_probe_impl(const T* x, int64_t n) {
  return nonfinite_probe_loop(x, n);
}
template <Isa I, class T>
TRAINKIT_INLINE void lamb_moments_impl(const T* p, const T* g, T* m, T* v, int64_t n, const LambCoef<T>& c,
                                       double& sp, double& su) {
  c.lerp ? lamb_moments_loop<T, true>(p, g, m, v, n, c, sp, su) : lamb_moments_loop<T, false>(p, g, m, v, n, c, sp, su);
}
template <Isa I, class T>
TRAINKIT_INLINE void lamb_apply_impl(T* p, const T* m, const T* v, int64_t n, const LambCoef<T>& c, T step) {
  lamb_apply_loop(p, m, v, n, c, step);
}
template <Isa I, class T>
TRAINKIT_INLINE void lamb_moments_apply_impl(T* p, const T* g, T* m, T* v, int64_t n, const LambCoef<T>& c,
                                             T step) {
  lamb_moments_apply_loop(p, g, m, v, n, c, step);
}

// RAdam, NAdam and Adamax: Adam's moments (adam_grad, adam_first_moment, adam_second_moment), then each one's
// own update, rounded like PyTorch's single-tensor implementation op by op (see each Coef in kernels.h).
template <class T, bool LerpFromM, bool Rectified>
TRAINKIT_INLINE void radam_loop(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m, T* __restrict__ v,
                                int64_t n, const RAdamCoef<T> c) {
  const MomentCoef<T> k = c.moments;
  for (int64_t i = 0; i < n; ++i) {
    const T pi = p[i];
    const T gi = adam_grad(k.l2, k.grad_mul, pi, g[i]);
    const T mi = adam_first_moment<LerpFromM>(k.lerp_weight, gi, m[i]);
    const T vi = adam_second_moment(k.one_minus_beta2, k.beta2, gi, v[i]);
    m[i] = mi;
    v[i] = vi;
    const T step = (mi / c.bc1) * c.lr;
    const T update = Rectified ? (step * ((T(1) / (std::sqrt(vi) + k.eps)) * c.bc2_sqrt)) * c.rect : step;
    p[i] = k.decay * pi - update;
  }
}

template <class T, bool LerpFromM>
TRAINKIT_INLINE void nadam_loop(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m, T* __restrict__ v,
                                int64_t n, const NAdamCoef<T> c) {
  const MomentCoef<T> k = c.moments;
  for (int64_t i = 0; i < n; ++i) {
    const T pi = p[i];
    const T gi = adam_grad(k.l2, k.grad_mul, pi, g[i]);
    const T mi = adam_first_moment<LerpFromM>(k.lerp_weight, gi, m[i]);
    const T vi = adam_second_moment(k.one_minus_beta2, k.beta2, gi, v[i]);
    m[i] = mi;
    v[i] = vi;
    const T denom = std::sqrt(vi / c.bc2) + k.eps;
    const T after_grad = k.decay * pi + (c.grad_step * gi) / denom;
    p[i] = after_grad + (c.avg_step * mi) / denom;
  }
}

template <class T, bool LerpFromM>
TRAINKIT_INLINE void adamax_loop(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m, T* __restrict__ u,
                                 int64_t n, const AdamaxCoef<T> c) {
  const MomentCoef<T> k = c.moments;
  for (int64_t i = 0; i < n; ++i) {
    const T pi = p[i];
    const T gi = adam_grad(k.l2, k.grad_mul, pi, g[i]);
    const T mi = adam_first_moment<LerpFromM>(k.lerp_weight, gi, m[i]);
    const T ui = std::max(k.beta2 * u[i], std::abs(gi) + k.eps);
    m[i] = mi;
    u[i] = ui;
    p[i] = pi + (c.neg_step_size * mi) / ui;
  }
}

template <Isa I, class T>
TRAINKIT_INLINE void radam_impl(T* p, const T* g, T* m, T* v, int64_t n, const RAdamCoef<T>& c) {
  if (c.rectified) {
    c.moments.lerp_from_m ? radam_loop<T, true, true>(p, g, m, v, n, c) : radam_loop<T, false, true>(p, g, m, v, n, c);
  } else {
    c.moments.lerp_from_m ? radam_loop<T, true, false>(p, g, m, v, n, c) : radam_loop<T, false, false>(p, g, m, v, n, c);
  }
}
template <Isa I, class T>
TRAINKIT_INLINE void nadam_impl(T* p, const T* g, T* m, T* v, int64_t n, const NAdamCoef<T>& c) {
  c.moments.lerp_from_m ? nadam_loop<T, true>(p, g, m, v, n, c) : nadam_loop<T, false>(p, g, m, v, n, c);
}
template <Isa I, class T>
TRAINKIT_INLINE void adamax_impl(T* p, const T* g, T* m, T* u, int64_t n, const AdamaxCoef<T>& c) {
  c.moments.lerp_from_m ? adamax_loop<T, true>(p, g, m, u, n, c) : adamax_loop<T, false>(p, g, m, u, n, c);
}
/// Lion's loop; the lerps' directions are template parameters, as adam_loop's flags. sign() is ATen's:
/// (x > 0) - (x < 0), so 0 for 0.
template <class T, bool UpdateFromM, bool MomentumFromM>
TRAINKIT_INLINE void lion_loop(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m, int64_t n,
                               const LionCoef<T> c) {
  for (int64_t i = 0; i < n; ++i) {
    const T gi = c.grad_mul * g[i];
    const T mi = m[i];
    const T d = gi - mi;
    const T blend = std::fma(c.update_weight, d, UpdateFromM ? mi : gi);
    const T u = static_cast<T>(blend > T(0)) - static_cast<T>(blend < T(0));
    const T pd = c.decay * p[i];
    p[i] = pd - c.lr * u;
    m[i] = std::fma(c.momentum_weight, d, MomentumFromM ? mi : gi);
  }
}
template <Isa I, class T>
TRAINKIT_INLINE void lion_impl(T* p, const T* g, T* m, int64_t n, const LionCoef<T>& c) {
  if (c.update_from_m) {
    c.momentum_from_m ? lion_loop<T, true, true>(p, g, m, n, c) : lion_loop<T, true, false>(p, g, m, n, c);
  } else {
    c.momentum_from_m ? lion_loop<T, false, true>(p, g, m, n, c) : lion_loop<T, false, false>(p, g, m, n, c);
  }
}
template <class T>
TRAINKIT_INLINE void adagrad_loop(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ sum, int64_t n,
                                  const AdagradCoef<T> c) {
  for (int64_t i = 0; i < n; ++i) {
    const T pi = p[i];
    const T gi = std::fma(c.l2, pi, c.grad_mul * g[i]);  // ATen's add with alpha is a fused multiply-add
    const T s = sum[i] + gi * gi;
    sum[i] = s;
    p[i] = std::fma(c.neg_clr, gi / (std::sqrt(s) + c.eps), pi);
  }
}
template <Isa I, class T>
TRAINKIT_INLINE void adagrad_impl(T* p, const T* g, T* sum, int64_t n, const AdagradCoef<T>& c) {
  adagrad_loop(p, g, sum, n, c);
}

}  // namespace

// Each public entry: the same impl compiled for AVX2+FMA+F16C and for the baseline, picked at run time.
#define TRAINKIT_KERNEL(ret, name, impl, params, args)                                          \
  namespace {                                                                                  \
  TRAINKIT_TARGET_AVX2 ret name##_avx2 params { return impl<Isa::kAvx2> args; }               \
  ret name##_base params { return impl<Isa::kBase> args; }                                     \
  }                                                                                            \
  ret name params { return kernels_use_avx2() ? name##_avx2 args : name##_base args; }

TRAINKIT_KERNEL(void, adam_kernel, adam_impl,
                (float* p, const float* g, float* m, float* v, float* vmax, int64_t n, const AdamCoef<float>& c),
                (p, g, m, v, vmax, n, c))
TRAINKIT_KERNEL(void, adam_kernel, adam_impl,
                (double* p, const double* g, double* m, double* v, double* vmax, int64_t n,
                 const AdamCoef<double>& c),
                (p, g, m, v, vmax, n, c))
TRAINKIT_KERNEL(void, adam_kernel, adam_reduced_impl,
                (BFloat16Bits* p, const BFloat16Bits* g, float* m, float* v, float* vmax, int64_t n,
                 const AdamCoef<float>& c),
                (p, g, m, v, vmax, n, c))
TRAINKIT_KERNEL(void, adam_kernel, adam_reduced_impl,
                (HalfBits* p, const HalfBits* g, float* m, float* v, float* vmax, int64_t n, const AdamCoef<float>& c),
                (p, g, m, v, vmax, n, c))
TRAINKIT_KERNEL(void, adam_kernel, adam_lowp_state_impl,
                (BFloat16Bits* p, const BFloat16Bits* g, BFloat16Bits* m, BFloat16Bits* v, BFloat16Bits* vmax,
                 int64_t n, const AdamCoef<float>& c),
                (p, g, m, v, vmax, n, c))
TRAINKIT_KERNEL(void, adam_kernel, adam_lowp_state_impl,
                (HalfBits* p, const HalfBits* g, HalfBits* m, HalfBits* v, HalfBits* vmax, int64_t n,
                 const AdamCoef<float>& c),
                (p, g, m, v, vmax, n, c))
TRAINKIT_KERNEL(void, sgd_kernel, sgd_impl,
                (float* p, const float* g, float* buf, int64_t n, const SgdCoef<float>& c, MomentumMode mode),
                (p, g, buf, n, c, mode))
TRAINKIT_KERNEL(void, sgd_kernel, sgd_impl,
                (double* p, const double* g, double* buf, int64_t n, const SgdCoef<double>& c, MomentumMode mode),
                (p, g, buf, n, c, mode))
TRAINKIT_KERNEL(void, sgd_kernel, sgd_reduced_impl,
                (BFloat16Bits* p, const BFloat16Bits* g, float* buf, int64_t n, const SgdCoef<float>& c,
                 MomentumMode mode),
                (p, g, buf, n, c, mode))
TRAINKIT_KERNEL(void, sgd_kernel, sgd_reduced_impl,
                (HalfBits* p, const HalfBits* g, float* buf, int64_t n, const SgdCoef<float>& c, MomentumMode mode),
                (p, g, buf, n, c, mode))
TRAINKIT_KERNEL(void, sum_squares2, sum_squares2_impl,
                (const float* a, const float* b, int64_t n, double& sa, double& sb), (a, b, n, sa, sb))
TRAINKIT_KERNEL(void, sum_squares2, sum_squares2_impl,
                (const double* a, const double* b, int64_t n, double& sa, double& sb), (a, b, n, sa, sb))
TRAINKIT_KERNEL(void, scale, scale_impl, (float* x, int64_t n, float c), (x, n, c))
TRAINKIT_KERNEL(void, scale, scale_impl, (double* x, int64_t n, double c), (x, n, c))
TRAINKIT_KERNEL(double, sum_squares, sum_squares_impl, (const float* a, int64_t n), (a, n))
TRAINKIT_KERNEL(double, sum_squares, sum_squares_impl, (const double* a, int64_t n), (a, n))
TRAINKIT_KERNEL(double, nonfinite_probe, nonfinite_probe_impl, (const float* x, int64_t n), (x, n))
TRAINKIT_KERNEL(double, nonfinite_probe, nonfinite_probe_impl, (const double* x, int64_t n), (x, n))
TRAINKIT_KERNEL(void, lamb_moments, lamb_moments_impl,
                (const float* p, const float* g, float* m, float* v, int64_t n, const LambCoef<float>& c,
                 double& sum_p2, double& sum_u2),
                (p, g, m, v, n, c, sum_p2, sum_u2))
TRAINKIT_KERNEL(void, lamb_moments, lamb_moments_impl,
                (const double* p, const double* g, double* m, double* v, int64_t n, const LambCoef<double>& c,
                 double& sum_p2, double& sum_u2),
                (p, g, m, v, n, c, sum_p2, sum_u2))
TRAINKIT_KERNEL(void, lamb_apply, lamb_apply_impl,
                (float* p, const float* m, const float* v, int64_t n, const LambCoef<float>& c, float step),
                (p, m, v, n, c, step))
TRAINKIT_KERNEL(void, lamb_apply, lamb_apply_impl,
                (double* p, const double* m, const double* v, int64_t n, const LambCoef<double>& c, double step),
                (p, m, v, n, c, step))
TRAINKIT_KERNEL(void, lamb_moments_apply, lamb_moments_apply_impl,
                (float* p, const float* g, float* m, float* v, int64_t n, const LambCoef<float>& c, float step),
                (p, g, m, v, n, c, step))
TRAINKIT_KERNEL(void, lamb_moments_apply, lamb_moments_apply_impl,
                (double* p, const double* g, double* m, double* v, int64_t n, const LambCoef<double>& c,
                 double step),
                (p, g, m, v, n, c, step))
TRAINKIT_KERNEL(void, lion_kernel, lion_impl, (float* p, const float* g, float* m, int64_t n, const LionCoef<float>& c),
                (p, g, m, n, c))
TRAINKIT_KERNEL(void, lion_kernel, lion_impl,
                (double* p, const double* g, double* m, int64_t n, const LionCoef<double>& c), (p, g, m, n, c))

// RAdam, NAdam, Adamax: one signature (p, g, m, second moment, n, coefficients), float and double.
#define TRAINKIT_MOMENT_KERNEL(name, Coef)                                                                 \
  TRAINKIT_KERNEL(void, name##_kernel, name##_impl,                                                       \
                  (float* p, const float* g, float* m, float* s, int64_t n, const Coef<float>& c),       \
                  (p, g, m, s, n, c))                                                                     \
  TRAINKIT_KERNEL(void, name##_kernel, name##_impl,                                                       \
                  (double* p, const double* g, double* m, double* s, int64_t n, const Coef<double>& c),  \
                  (p, g, m, s, n, c))
TRAINKIT_MOMENT_KERNEL(radam, RAdamCoef)
TRAINKIT_MOMENT_KERNEL(nadam, NAdamCoef)
TRAINKIT_MOMENT_KERNEL(adamax, AdamaxCoef)

#undef TRAINKIT_MOMENT_KERNEL
TRAINKIT_KERNEL(void, adagrad_kernel, adagrad_impl,
                (float* p, const float* g, float* sum, int64_t n, const AdagradCoef<float>& c), (p, g, sum, n, c))
TRAINKIT_KERNEL(void, adagrad_kernel, adagrad_impl,
                (double* p, const double* g, double* sum, int64_t n, const AdagradCoef<double>& c), (p, g, sum, n, c))

#undef TRAINKIT_KERNEL

}  // namespace trainkit::detail
