#include "lbfgs.h"

#include <algorithm>
#include <cmath>
#include <deque>

#include "dense.h"

namespace trainkit::tune::detail {
namespace {

constexpr double kC1 = 1e-4;  // sufficient decrease (Armijo)
constexpr double kC2 = 0.9;   // curvature

// The minimizer of the cubic through (x1, f1, g1) and (x2, f2, g2), clamped to [lo, hi] (to the interval
// between x1 and x2 when not bounded); the middle when the cubic has no minimizer.
double cubic_interpolate(double x1, double f1, double g1, double x2, double f2, double g2, const double* bounds) {
  const double lo = bounds ? bounds[0] : std::min(x1, x2);
  const double hi = bounds ? bounds[1] : std::max(x1, x2);
  const double d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2);
  const double d2_square = d1 * d1 - g1 * g2;
  if (d2_square >= 0) {
    const double d2 = std::sqrt(d2_square);
    const double min_pos = x1 <= x2 ? x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
                                    : x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2));
    return std::min(std::max(min_pos, lo), hi);
  }
  return (lo + hi) / 2;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// One point of the line search: step t, value f, gradient g and directional derivative gtd.
struct Probe {
  double t = 0, f = 0, gtd = 0;
  std::vector<double> g;
};

class LineSearch {
 public:
  LineSearch(const LbfgsObjective& f, const std::vector<double>& x, const std::vector<double>& d)
      : f_(f), x_(x), d_(d), at_(x.size()) {}

  // The objective at x + t d; false when it cannot be evaluated.
  bool probe(double t, Probe& p) {
    for (size_t i = 0; i < x_.size(); ++i) at_[i] = x_[i] + t * d_[i];
    p.t = t;
    p.g.resize(x_.size());
    ++evaluations;
    if (!f_(at_, p.f, p.g)) return false;
    p.gtd = dot(p.g.data(), d_.data(), static_cast<int64_t>(d_.size()));
    return true;
  }

  // torch.optim.lbfgs._strong_wolfe from `start` (t = 0) with a first step t; writes the accepted probe.
  bool run(const Probe& start, double t, double tolerance_change, int64_t max_ls, Probe& out) {
    const double f = start.f, gtd = start.gtd;
    const double d_norm = max_abs(d_);
    Probe now, prev = start;
    if (!probe(t, now)) return false;
    std::vector<Probe> bracket;
    bool done = false;
    int64_t ls_iter = 0;
    while (ls_iter < max_ls) {
      if (now.f > f + kC1 * now.t * gtd || (ls_iter > 1 && now.f >= prev.f)) {
        bracket = {prev, now};
        break;
      }
      if (std::abs(now.gtd) <= -kC2 * gtd) {
        bracket = {now};
        done = true;
        break;
      }
      if (now.gtd >= 0) {
        bracket = {prev, now};
        break;
      }
      const double bounds[2] = {now.t + 0.01 * (now.t - prev.t), now.t * 10};
      const double next = cubic_interpolate(prev.t, prev.f, prev.gtd, now.t, now.f, now.gtd, bounds);
      prev = now;
      if (!probe(next, now)) return false;
      ++ls_iter;
    }
    if (ls_iter == max_ls || bracket.empty()) bracket = {start, now};

    // Zoom: shrink the bracket until a point satisfies the strong Wolfe conditions.
    bool insufficient_progress = false;
    size_t low = bracket.front().f <= bracket.back().f ? 0 : 1, high = 1 - low;
    while (!done && ls_iter < max_ls) {
      Probe& a = bracket[0];
      Probe& b = bracket[1];
      if (std::abs(b.t - a.t) * d_norm < tolerance_change) break;
      double next = cubic_interpolate(a.t, a.f, a.gtd, b.t, b.f, b.gtd, nullptr);
      const double hi = std::max(a.t, b.t), lo = std::min(a.t, b.t);
      const double eps = 0.1 * (hi - lo);
      if (std::min(hi - next, next - lo) < eps) {
        if (insufficient_progress || next >= hi || next <= lo) {
          next = std::abs(next - hi) < std::abs(next - lo) ? hi - eps : lo + eps;
          insufficient_progress = false;
        } else {
          insufficient_progress = true;
        }
      } else {
        insufficient_progress = false;
      }
      if (!probe(next, now)) return false;
      ++ls_iter;
      if (now.f > f + kC1 * now.t * gtd || now.f >= bracket[low].f) {
        bracket[high] = now;
        low = bracket[0].f <= bracket[1].f ? 0 : 1;
        high = 1 - low;
      } else {
        if (std::abs(now.gtd) <= -kC2 * gtd) {
          done = true;
        } else if (now.gtd * (bracket[high].t - bracket[low].t) >= 0) {
          bracket[high] = bracket[low];
        }
        bracket[low] = now;
      }
    }
    out = bracket[low];
    return true;
  }

  int64_t evaluations = 0;

 private:
  const LbfgsObjective& f_;
  const std::vector<double>& x_;
  const std::vector<double>& d_;
  std::vector<double> at_;
};

}  // namespace

LbfgsResult lbfgs_minimize(const LbfgsObjective& f, std::vector<double> x0, const LbfgsOptions& o) {
  const int64_t max_eval = o.max_eval > 0 ? o.max_eval : o.max_iter * 5 / 4;
  const int64_t p = static_cast<int64_t>(x0.size());
  LbfgsResult r;
  r.x = std::move(x0);
  std::vector<double> g(r.x.size());
  r.evaluations = 1;
  if (!f(r.x, r.f, g)) return r;
  r.ok = true;
  if (max_abs(g) <= o.tolerance_grad) return r;

  std::deque<std::vector<double>> old_dirs, old_stps;  // y = Δg and s = Δx of the last history_size steps
  std::deque<double> ro;
  std::vector<double> d(r.x.size()), prev_g, q, al;
  double t = 0, h_diag = 1;
  while (r.iterations < o.max_iter) {
    ++r.iterations;
    if (r.iterations == 1) {
      for (int64_t i = 0; i < p; ++i) d[i] = -g[i];
    } else {
      std::vector<double> y(r.x.size()), s(r.x.size());
      for (int64_t i = 0; i < p; ++i) {
        y[i] = g[i] - prev_g[i];
        s[i] = d[i] * t;
      }
      const double ys = dot(y.data(), s.data(), p);
      if (ys > 1e-10) {
        if (static_cast<int64_t>(old_dirs.size()) == o.history_size) {
          old_dirs.pop_front();
          old_stps.pop_front();
          ro.pop_front();
        }
        h_diag = ys / dot(y.data(), y.data(), p);
        old_dirs.push_back(std::move(y));
        old_stps.push_back(std::move(s));
        ro.push_back(1.0 / ys);
      }
      // The two-loop recursion: d = −H g.
      const size_t num_old = old_dirs.size();
      al.assign(num_old, 0);
      q.resize(r.x.size());
      for (int64_t i = 0; i < p; ++i) q[i] = -g[i];
      for (size_t i = num_old; i-- > 0;) {
        al[i] = dot(old_stps[i].data(), q.data(), p) * ro[i];
        for (int64_t k = 0; k < p; ++k) q[k] -= al[i] * old_dirs[i][k];
      }
      for (int64_t k = 0; k < p; ++k) d[k] = q[k] * h_diag;
      for (size_t i = 0; i < num_old; ++i) {
        const double be = dot(old_dirs[i].data(), d.data(), p) * ro[i];
        for (int64_t k = 0; k < p; ++k) d[k] += (al[i] - be) * old_stps[i][k];
      }
    }
    prev_g = g;
    const double prev_f = r.f;
    if (r.iterations == 1) {
      double sum = 0;
      for (double v : g) sum += std::abs(v);
      t = std::min(1.0, 1.0 / sum) * o.lr;
    } else {
      t = o.lr;
    }
    const double gtd = dot(g.data(), d.data(), p);
    if (gtd > -o.tolerance_change) break;

    LineSearch search(f, r.x, d);
    Probe start{0, r.f, gtd, g}, accepted;
    const bool evaluated = search.run(start, t, o.tolerance_change, max_eval - r.evaluations, accepted);
    r.evaluations += search.evaluations;
    if (!evaluated) {
      r.ok = false;
      return r;
    }
    t = accepted.t;
    r.f = accepted.f;
    g = std::move(accepted.g);
    for (int64_t i = 0; i < p; ++i) r.x[i] += t * d[i];

    if (r.iterations == o.max_iter || r.evaluations >= max_eval || max_abs(g) <= o.tolerance_grad) break;
    double step = 0;
    for (int64_t i = 0; i < p; ++i) step = std::max(step, std::abs(d[i] * t));
    if (step <= o.tolerance_change || std::abs(r.f - prev_f) < o.tolerance_change) break;
  }
  return r;
}

}  // namespace trainkit::tune::detail
