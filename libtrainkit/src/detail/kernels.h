#pragma once
// Fused single-pass CPU kernels shared by trainkit's optimizers (Adam/AdamW, SGD/LARS, LAMB, Lion), gradient
// clipping and the GradScaler overflow check, and the chunking that spreads many tensors over threads with
// no per-tensor dispatch. Neutral ground below optim, grad and amp; includes no LibTorch header.
//
// Every kernel takes raw pointers of one contiguous slice and the hyperparameters folded into a few
// per-tensor coefficients, so that variants (Adam vs AdamW, SGD vs LARS, maximize, L2 vs decoupled decay)
// are the same loop with different coefficients instead of separate code.
//
// bfloat16 and float16 parameters (and gradients) are stored as raw 16-bit words here (BFloat16Bits,
// HalfBits: the layout of c10::BFloat16 / c10::Half); their kernels keep float32 state, compute in float32
// and round the new parameter to nearest even once per step.

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace trainkit::detail {

/// A bfloat16 value as its bits (c10::BFloat16's layout).
struct BFloat16Bits {
  uint16_t x;
};
/// An IEEE float16 value as its bits (c10::Half's layout).
struct HalfBits {
  uint16_t x;
};

/// Whether the kernels run their AVX2+FMA+F16C build on this CPU (else baseline x86-64). Checked once with
/// the CPU's feature flags at first use; on non-x86 targets always false.
bool kernels_use_avx2();

/// How for_each_even splits a group's elements over the threads.
enum class SplitMode {
  kChunks,      ///< make_chunks's fixed kChunkGrain chunks, dealt out by at::parallel_for (bench_optim compares it)
  kContiguous,  ///< even_split: one contiguous range of the concatenated tensors per thread
  kPerTensor,   ///< per_tensor_split: every tensor cut into one aligned slice per thread (ATen's pattern)
};

/// Benchmarking switches, so that bench_optim can time both sides of a change in one interleaved run (no
/// library code calls them): `avx2` false forces the baseline x86-64 kernels; `split` picks the split of
/// for_each_even (default kContiguous: robust to many small tensors, where a per-tensor cut leaves whole tensors to one thread).
void set_kernel_choices(bool avx2, SplitMode split);
/// The split for_each_even uses.
SplitMode split_mode();

/// Elements per work item: large enough to amortize scheduling, small enough to balance threads.
constexpr int64_t kChunkGrain = 1 << 15;

/// A slice [begin, begin + n) of the `tensor`-th tensor of a group.
struct Chunk {
  int64_t tensor;
  int64_t begin;
  int64_t n;
};

/// Splits tensors of the given sizes into chunks of at most `grain` elements.
std::vector<Chunk> make_chunks(const std::vector<int64_t>& numels, int64_t grain = kChunkGrain);
/// The same for tensors [first, last) only (Chunk::tensor stays the index into `numels`).
std::vector<Chunk> make_chunks(const std::vector<int64_t>& numels, std::size_t first, std::size_t last,
                               int64_t grain = kChunkGrain);

/// Boundaries of even_split() fall on multiples of this many elements inside a tensor: a 64-byte cache line
/// or more for every dtype, and a multiple of every vector width, so no two threads write one cache line.
constexpr int64_t kSplitAlign = 64;
/// Below this many elements per thread a group runs on fewer threads (ATen's own grain size).
constexpr int64_t kSplitMinPerThread = 1 << 15;

/// The concatenation of tensors of the given sizes split into `parts` contiguous ranges of nearly equal
/// size, each a list of chunks that may cross tensor boundaries; a boundary inside a tensor falls on a
/// multiple of `align` elements. Every element is in exactly one chunk; some parts may be empty.
std::vector<std::vector<Chunk>> even_split(const std::vector<int64_t>& numels, int64_t parts,
                                           int64_t align = kSplitAlign);

/// Every tensor cut into `parts` slices of nearly equal size (boundaries on multiples of `align`), slice k
/// of every tensor in part k: each thread walks all tensors, as ATen's per-tensor parallel_for does, but in
/// one parallel region. Every element is in exactly one chunk.
std::vector<std::vector<Chunk>> per_tensor_split(const std::vector<int64_t>& numels, int64_t parts,
                                                 int64_t align = kSplitAlign);

/// Elements per block of the two-phase optimizers (LARS, LAMB; two_phase_blocks in parallel.h): a per-tensor
/// norm must be complete before that tensor is updated, so they run phase 1 and phase 2 block by block; a
/// block of this size (4 MB per float32 stream) is still in the last-level cache when phase 2 reads it again.
constexpr int64_t kBlockElements = 1 << 20;

/// Consecutive tensors grouped into [first, last) blocks of about `target` elements; a larger tensor is a
/// block of its own.
std::vector<std::pair<std::size_t, std::size_t>> make_blocks(const std::vector<int64_t>& numels,
                                                   int64_t target = kBlockElements);

/// Adam/AdamW in one pass, per element (PyTorch's single-tensor Adam, folded):
///   g' = grad_mul·g + l2·p;  m ← m + (1-β1)(g' - m);  v ← β2·v + (1-β2)·g'²;
///   v̂ = amsgrad ? max(v̂, v) : v;  p ← decay·p - step_size · m / (√v̂ / bc2_sqrt + eps)
/// grad_mul = ±1 (maximize) times the gradient unscale factor; l2 = Adam's weight decay; decay =
/// 1 - lr·wd for AdamW; neg_step_size = -lr / (1 - β1^t); bc2_sqrt = √(1 - β2^t). The m update is
/// ATen's lerp: m + w(g' - m) when w = 1-β1 < 0.5 (lerp_weight = w, lerp_from_m), else g' + (w-1)(g' - m).
template <class T>
struct AdamCoef {
  T grad_mul, l2, decay, lerp_weight, beta2, one_minus_beta2, eps, bc2_sqrt, neg_step_size;
  bool lerp_from_m;
};
/// `vmax` is null unless amsgrad.
void adam_kernel(float* p, const float* g, float* m, float* v, float* vmax, int64_t n, const AdamCoef<float>& c);
void adam_kernel(double* p, const double* g, double* m, double* v, double* vmax, int64_t n,
                 const AdamCoef<double>& c);
/// bfloat16 / float16 p and g, float32 m, v, vmax: the float32 update of p, rounded to nearest even.
void adam_kernel(BFloat16Bits* p, const BFloat16Bits* g, float* m, float* v, float* vmax, int64_t n,
                 const AdamCoef<float>& c);
void adam_kernel(HalfBits* p, const HalfBits* g, float* m, float* v, float* vmax, int64_t n, const AdamCoef<float>& c);
/// bfloat16 / float16 p, g and state (as torch.optim keeps it for such parameters): float32 arithmetic, p, m, v
/// and vmax each rounded to nearest even once.
void adam_kernel(BFloat16Bits* p, const BFloat16Bits* g, BFloat16Bits* m, BFloat16Bits* v, BFloat16Bits* vmax,
                 int64_t n, const AdamCoef<float>& c);
void adam_kernel(HalfBits* p, const HalfBits* g, HalfBits* m, HalfBits* v, HalfBits* vmax, int64_t n,
                 const AdamCoef<float>& c);

/// How the SGD kernel treats the momentum buffer.
enum class MomentumMode { kNone, kFirst, kRunning };

/// SGD with momentum/nesterov and the LARS trust ratio, per element:
///   d = trust·(grad_mul·g + l2·p);  first: b = d;  running: b ← momentum·b + keep·d  (keep = 1 - dampening)
///   d ← nesterov ? d + momentum·b : b   (none: d);   p ← p - lr·d
template <class T>
struct SgdCoef {
  T grad_mul, l2, trust, momentum, keep, lr;
  bool nesterov;
};
void sgd_kernel(float* p, const float* g, float* buf, int64_t n, const SgdCoef<float>& c, MomentumMode mode);
void sgd_kernel(double* p, const double* g, double* buf, int64_t n, const SgdCoef<double>& c, MomentumMode mode);
/// bfloat16 / float16 p and g, float32 momentum buffer (null when mode is kNone).
void sgd_kernel(BFloat16Bits* p, const BFloat16Bits* g, float* buf, int64_t n, const SgdCoef<float>& c,
                MomentumMode mode);
void sgd_kernel(HalfBits* p, const HalfBits* g, float* buf, int64_t n, const SgdCoef<float>& c, MomentumMode mode);

/// Σa² and Σb² in double (eight independent accumulators each).
void sum_squares2(const float* a, const float* b, int64_t n, double& sa, double& sb);
void sum_squares2(const double* a, const double* b, int64_t n, double& sa, double& sb);
/// x ← c·x (gradient clipping's rescale).
void scale(float* x, int64_t n, float c);
void scale(double* x, int64_t n, double c);

/// Σa² in double.
double sum_squares(const float* a, int64_t n);
double sum_squares(const double* a, int64_t n);

/// 0 when every x is finite, NaN otherwise (Σ x·0, read-only, vectorized): the overflow check that lets
/// GradScaler hand unscaling to a fused optimizer instead of rewriting the gradients.
double nonfinite_probe(const float* x, int64_t n);
double nonfinite_probe(const double* x, int64_t n);

/// LAMB (timm's semantics), per element:
///   g' = grad_mul·g;  m ← beta1·m + beta3·g' (as a lerp when beta3 = 1-β1);  v ← β2·v + (1-β2)·g'²;
///   u = (m·inv_bc1) / (√v · inv_bc2_sqrt + eps) + wd·p
template <class T>
struct LambCoef {
  T grad_mul, beta1, beta3, beta2, one_minus_beta2, inv_bc1, inv_bc2_sqrt, eps, wd;
  bool lerp;
  /// The same coefficients rounded to U.
  template <class U>
  LambCoef<U> cast() const {
    LambCoef<U> c{};
    c.grad_mul = static_cast<U>(grad_mul);
    c.beta1 = static_cast<U>(beta1);
    c.beta3 = static_cast<U>(beta3);
    c.beta2 = static_cast<U>(beta2);
    c.one_minus_beta2 = static_cast<U>(one_minus_beta2);
    c.inv_bc1 = static_cast<U>(inv_bc1);
    c.inv_bc2_sqrt = static_cast<U>(inv_bc2_sqrt);
    c.eps = static_cast<U>(eps);
    c.wd = static_cast<U>(wd);
    c.lerp = lerp;
    return c;
  }
};
/// Pass 1 when the trust ratio is needed: updates m and v, adds Σp² and Σu² to the sums.
void lamb_moments(const float* p, const float* g, float* m, float* v, int64_t n, const LambCoef<float>& c,
                  double& sum_p2, double& sum_u2);
void lamb_moments(const double* p, const double* g, double* m, double* v, int64_t n, const LambCoef<double>& c,
                  double& sum_p2, double& sum_u2);
/// Pass 2: p ← p - step·u, with u recomputed from the updated m and v.
void lamb_apply(float* p, const float* m, const float* v, int64_t n, const LambCoef<float>& c, float step);
void lamb_apply(double* p, const double* m, const double* v, int64_t n, const LambCoef<double>& c, double step);
/// One pass when no trust ratio is needed: updates m and v and applies p ← p - step·u.
void lamb_moments_apply(float* p, const float* g, float* m, float* v, int64_t n, const LambCoef<float>& c, float step);
void lamb_moments_apply(double* p, const double* g, double* m, double* v, int64_t n, const LambCoef<double>& c,
                        double step);

/// The moments RAdam, NAdam and Adamax share with Adam, per element (PyTorch's single-tensor ops):
///   g' = grad_mul·g + l2·p;  m ← lerp(m, g', 1-β1) (as AdamCoef's lerp_weight/lerp_from_m);
///   v ← β2·v + (1-β2)·g'² (RAdam, NAdam; Adamax keeps u ← max(β2·u, |g'| + eps) instead).
template <class T>
struct MomentCoef {
  T grad_mul, l2, decay, lerp_weight, beta2, one_minus_beta2, eps;
  bool lerp_from_m;
};
/// RAdam (Liu et al. 2020), per element after the moments, with p' = decay·p:
///   rectified: p ← p' - (((m / bc1)·lr)·((1 / (√v + eps))·bc2_sqrt))·rect;  else p ← p' - (m / bc1)·lr
template <class T>
struct RAdamCoef {
  MomentCoef<T> moments;
  T bc1, lr, bc2_sqrt, rect;
  bool rectified;
};
void radam_kernel(float* p, const float* g, float* m, float* v, int64_t n, const RAdamCoef<float>& c);
void radam_kernel(double* p, const double* g, double* m, double* v, int64_t n, const RAdamCoef<double>& c);
/// NAdam (Dozat 2016), per element after the moments, with p' = decay·p and d = √(v / bc2) + eps:
///   p ← (p' + (grad_step·g') / d) + (avg_step·m) / d
template <class T>
struct NAdamCoef {
  MomentCoef<T> moments;
  T bc2, grad_step, avg_step;
};
void nadam_kernel(float* p, const float* g, float* m, float* v, int64_t n, const NAdamCoef<float>& c);
void nadam_kernel(double* p, const double* g, double* m, double* v, int64_t n, const NAdamCoef<double>& c);
/// Adamax (Kingma & Ba 2015, section 7), per element after the first moment:
///   u ← max(β2·u, |g'| + eps);  p ← p + (neg_step_size·m) / u   (neg_step_size = -lr / (1 - β1^t))
template <class T>
struct AdamaxCoef {
  MomentCoef<T> moments;
  T neg_step_size;
};
void adamax_kernel(float* p, const float* g, float* m, float* u, int64_t n, const AdamaxCoef<float>& c);
void adamax_kernel(double* p, const double* g, double* m, double* u, int64_t n, const AdamaxCoef<double>& c);
/// Lion (timm's semantics), per element, each rounding as ATen's op-by-op path (lerps as fused multiply-adds):
///   g' = grad_mul·g;  p ← decay·p;  u = sign(lerp(m, g', 1-β1));  p ← p - lr·u;  m ← lerp(m, g', 1-β2)
/// grad_mul = ±1 (maximize) times the gradient unscale factor; decay = 1 - lr·weight_decay. A lerp of weight
/// w is m + w(g' - m) when w < 0.5 (`*_from_m`, `*_weight` = w), else g' + (w-1)(g' - m) (`*_weight` = w-1),
/// as ATen's.
template <class T>
struct LionCoef {
  T grad_mul, decay, lr, update_weight, momentum_weight;
  bool update_from_m, momentum_from_m;
};
void lion_kernel(float* p, const float* g, float* m, int64_t n, const LionCoef<float>& c);
void lion_kernel(double* p, const double* g, double* m, int64_t n, const LionCoef<double>& c);
/// Adagrad, per element (PyTorch's single-tensor Adagrad, folded):
///   g' = grad_mul·g + l2·p;  sum ← sum + g'²;  p ← p + neg_clr · g' / (√sum + eps)
/// grad_mul = ±1 (maximize) times the gradient unscale factor; neg_clr = -lr / (1 + (t-1)·lr_decay).
template <class T>
struct AdagradCoef {
  T grad_mul, l2, eps, neg_clr;
};
void adagrad_kernel(float* p, const float* g, float* sum, int64_t n, const AdagradCoef<float>& c);
void adagrad_kernel(double* p, const double* g, double* sum, int64_t n, const AdagradCoef<double>& c);

}  // namespace trainkit::detail
