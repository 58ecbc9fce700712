#include "trainkit/log/svg_plot.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

namespace trainkit::log {
namespace {

// Matplotlib's "tab10": ten colours that stay distinguishable from one another, also for most colour-blind readers.
constexpr std::array<const char*, 10> kPalette = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                                  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
// Series beyond the palette reuse its colours, told apart by dashes.
constexpr std::array<const char*, 3> kDashes = {"", " stroke-dasharray=\"7 3\"", " stroke-dasharray=\"2 3\""};
// Black is not in the palette, so annotations never look like one of the series.
constexpr const char* kAnnotationColour = "#000000";

constexpr double kTickFont = 11;
constexpr double kLabelFont = 12;
constexpr double kTitleFont = 14;
constexpr double kTickLength = 5;
// Linear axes leave this fraction of the data span free on each side, so that extreme points do not sit on the frame.
constexpr double kPadding = 0.03;
// Beyond these magnitudes spans overflow (linear) or powers of ten underflow (log); such points are not drawable.
constexpr double kMaxMagnitude = 1e300;
constexpr double kMinLogValue = 1e-300;

std::string escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // XML 1.0 forbids these control characters even when escaped, so a stray one would break the document.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n' || c == '\r') {
          out += c;
        }
    }
  }
  return out;
}

// The document is laid out without knowing the viewer's font, so widths are estimated (0.6 em per character
// over-estimates digits and most Latin text slightly, which errs towards more room).
double text_width(const std::string& text, double font_px) {
  const auto chars =
      std::count_if(text.begin(), text.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
  return static_cast<double>(chars) * 0.6 * font_px;
}

// Coordinates with at most two decimals and no trailing zeros: compact, and identical bytes for identical input.
std::string num(double v) {
  std::string s = fmt::format("{:.2f}", v);
  while (s.back() == '0') {
    s.pop_back();
  }
  if (s.back() == '.') {
    s.pop_back();
  }
  return s == "-0" ? "0" : s;
}

bool drawable(double v, bool log) {
  if (!std::isfinite(v)) {
    return false;
  }
  return log ? (v >= kMinLogValue && v <= kMaxMagnitude) : std::abs(v) <= kMaxMagnitude;
}

// Powers of ten by repeated multiplication are exact up to 1e22, which keeps tick values such as 3 / 10 at the
// double nearest 0.3 (and their labels short).
double exact_pow10(int k) {
  if (k < -22 || k > 22) {
    return std::pow(10.0, k);
  }
  double p = 1;
  for (int i = 0; i < std::abs(k); ++i) {
    p *= 10;
  }
  return k < 0 ? 1 / p : p;
}

struct Extent {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return lo > hi; }
};

struct Axis {
  bool log = false;
  double lo = 0;  // limits, in data units
  double hi = 1;
  std::vector<double> major;
  std::vector<std::string> labels;  // one per major tick
  std::vector<double> minor;        // grid lines only

  // Position of `v` along the axis, 0 at `lo` and 1 at `hi`.
  double frac(double v) const {
    if (log) {
      const double l = std::log10(lo);
      return (std::log10(v) - l) / (std::log10(hi) - l);
    }
    return (v - lo) / (hi - lo);
  }
};

// The shortest "{:g}"-style labels that still tell neighbouring ticks apart (narrow ranges far from zero need more
// than the default six significant digits).
std::vector<std::string> tick_labels(const std::vector<double>& values) {
  std::vector<std::string> labels;
  for (int precision = 6;; ++precision) {
    labels.clear();
    for (const double v : values) {
      labels.push_back(fmt::format("{:.{}g}", v, precision));
    }
    const bool distinct = std::adjacent_find(labels.begin(), labels.end()) == labels.end();
    if (distinct || precision >= 17) {
      return labels;
    }
  }
}

// Whether major ticks `spacing_px` apart are sparse enough: a minimum spacing keeps the grid calm (decades may be
// closer, as their labels step through orders of magnitude), and on a horizontal axis the labels, centred on their
// ticks, must also not run into each other. On a short axis the minimum gives way, so that it still gets about
// three ticks.
bool ticks_fit(const std::vector<std::string>& labels, double spacing_px, double length_px, bool horizontal, bool log) {
  const double calm = std::min(horizontal ? (log ? 50.0 : 70.0) : (log ? 30.0 : 48.0), length_px / 3);
  if (!horizontal) {
    return spacing_px >= calm;
  }
  double widest = 0;
  for (const std::string& l : labels) {
    widest = std::max(widest, text_width(l, kTickFont));
  }
  return spacing_px >= std::max(calm, widest + 12);
}

Axis linear_axis(const Extent& e, double length_px, bool horizontal) {
  Axis a;
  if (e.empty()) {
    a.lo = 0;
    a.hi = 1;
  } else if (e.hi - e.lo <= 1e-12 * std::max(std::abs(e.lo), std::abs(e.hi))) {
    // A constant series would give a zero span; centre it in a band proportional to its value instead.
    const double mid = e.lo + (e.hi - e.lo) / 2;
    const double half = mid == 0 ? 1 : std::abs(mid) * 0.1;
    a.lo = mid - half;
    a.hi = mid + half;
  } else {
    const double pad = (e.hi - e.lo) * kPadding;
    a.lo = e.lo - pad;
    a.hi = e.hi + pad;
  }
  const double span = a.hi - a.lo;
  // Steps m * 10^k in increasing order, starting well below any step that could fit.
  for (int k = static_cast<int>(std::floor(std::log10(span))) - 3;; ++k) {
    for (const int m : {1, 2, 5}) {
      const double step = m * exact_pow10(k);
      const double spacing_px = step / span * length_px;
      // A step as wide as the axis is taken whatever it looks like, so that even a tiny axis ends the search.
      const bool last_resort = step >= span;
      if (spacing_px < 20 && !last_resort) {
        continue;  // too dense by any measure; skips formatting thousands of labels
      }
      const auto first = static_cast<int64_t>(std::ceil(a.lo / step - 1e-9));
      const auto last = static_cast<int64_t>(std::floor(a.hi / step + 1e-9));
      std::vector<double> values;
      for (int64_t i = first; i <= last; ++i) {
        // Integer multiples, divided rather than multiplied by a fraction, land on the double nearest the decimal.
        const double im = static_cast<double>(i) * m;
        values.push_back(k >= 0 ? im * exact_pow10(k) : im / exact_pow10(-k));
      }
      std::vector<std::string> labels = tick_labels(values);
      if (last_resort || ticks_fit(labels, spacing_px, length_px, horizontal, false)) {
        a.major = std::move(values);
        a.labels = std::move(labels);
        return a;
      }
    }
  }
}

Axis log_axis(const Extent& e, double length_px, bool horizontal) {
  Axis a;
  a.log = true;
  int lo_dec = 0;
  int hi_dec = 1;
  if (!e.empty()) {
    // The tolerance keeps exact powers of ten (whose log10 may be off by an ulp) on their own decade.
    lo_dec = static_cast<int>(std::floor(std::log10(e.lo) + 1e-9));
    hi_dec = static_cast<int>(std::ceil(std::log10(e.hi) - 1e-9));
    if (hi_dec <= lo_dec) {
      --lo_dec;
      ++hi_dec;
    }
  }
  a.lo = exact_pow10(lo_dec);
  a.hi = exact_pow10(hi_dec);
  const double decade_px = length_px / (hi_dec - lo_dec);
  // Label every d-th decade, d in 1, 2, 3, 5, 10, 20, 30, 50, ...
  int d = 1;
  for (int base = 1;; base *= 10) {
    bool found = false;
    for (const int m : {1, 2, 3, 5}) {
      d = m * base;
      std::vector<double> values;
      for (int k = lo_dec; k <= hi_dec; ++k) {
        if (((k % d) + d) % d == 0) {
          values.push_back(exact_pow10(k));
        }
      }
      std::vector<std::string> labels = tick_labels(values);
      if (d >= hi_dec - lo_dec || ticks_fit(labels, d * decade_px, length_px, horizontal, true)) {
        a.major = std::move(values);
        a.labels = std::move(labels);
        found = true;
        break;
      }
    }
    if (found) {
      break;
    }
  }
  if (d == 1) {
    // 2..9 within each decade only where a decade is tall enough for them not to merge into a grey band.
    if (decade_px >= 40) {
      for (int k = lo_dec; k < hi_dec; ++k) {
        for (int m = 2; m <= 9; ++m) {
          a.minor.push_back(m * exact_pow10(k));
        }
      }
    }
  } else if (decade_px >= 4) {
    for (int k = lo_dec; k <= hi_dec; ++k) {
      if (((k % d) + d) % d != 0) {
        a.minor.push_back(exact_pow10(k));
      }
    }
  }
  return a;
}

Axis make_axis(const Extent& e, double length_px, bool horizontal, bool log) {
  return log ? log_axis(e, length_px, horizontal) : linear_axis(e, length_px, horizontal);
}

struct Point {
  double x;
  double y;
};

struct Rect {
  double x;
  double y;
  double w;
  double h;
  bool contains(const Point& p) const { return p.x >= x && p.x <= x + w && p.y >= y && p.y <= y + h; }
};

struct LabelPlace {
  double x;            // where the text is anchored
  const char* anchor;  // "start" right of the point, "end" left of it
  double left;         // left edge, as estimated
};

// A label `gap` pixels beside `x`: right of it where it fits in the plot area, else left of it where that fits,
// else on the roomier side; in any case inside the document.
LabelPlace place_label(double x, double gap, double text_w, double plot_left, double plot_right, double doc_width) {
  bool right = true;
  if (x + gap + text_w > plot_right) {
    right = x - gap - text_w < plot_left && plot_right - x >= x - plot_left;
  }
  const double left = std::clamp(right ? x + gap : x - gap - text_w, 4.0, std::max(4.0, doc_width - 4 - text_w));
  return right ? LabelPlace{left, "start", left} : LabelPlace{left + text_w, "end", left};
}

// Text with a white outline underneath, so that annotation labels stay legible where they cross lines or grid.
std::string halo_text(double x, double y, const char* anchor, const std::string& text) {
  return fmt::format(
      "<text x=\"{}\" y=\"{}\" text-anchor=\"{}\" font-size=\"{}\" fill=\"{}\" stroke=\"#ffffff\" "
      "stroke-width=\"3\" stroke-linejoin=\"round\" paint-order=\"stroke\">{}</text>\n",
      num(x), num(y), anchor, num(kTickFont), kAnnotationColour, escape(text));
}

// The plot area in pixels and the axes that map data onto it.
struct Layout {
  double width = 0;  // of the document
  double height = 0;
  Axis xa;
  Axis ya;
  double top = 0;  // of the plot area
  double left = 0;
  double plot_w = 0;
  double plot_h = 0;

  double plot_bottom() const { return top + plot_h; }
  double plot_right() const { return left + plot_w; }
  double px(double x) const { return left + xa.frac(x) * plot_w; }
  double py(double y) const { return top + (1 - ya.frac(y)) * plot_h; }
};

// The y axis first, because its labels' width decides where the plot area starts.
Layout make_layout(const PlotOptions& options, const Extent& ex, const Extent& ey) {
  Layout l;
  l.width = options.width();
  l.height = options.height();
  l.top = options.title().empty() ? 14 : 40;
  const double bottom = options.x_label().empty() ? 32 : 54;
  l.plot_h = l.height - l.top - bottom;
  l.ya = make_axis(ey, l.plot_h, false, options.log_y());
  double widest_y = 0;
  for (const std::string& label : l.ya.labels) {
    widest_y = std::max(widest_y, text_width(label, kTickFont));
  }
  l.left = std::min(l.width / 2, (options.y_label().empty() ? 8 : 30) + widest_y + kTickLength + 4);
  // The last x label is centred on its tick and may overhang the plot area, so the right margin depends on it.
  double right = 16;
  l.xa = make_axis(ex, l.width - l.left - right, true, options.log_x());
  if (!l.xa.labels.empty()) {
    const double overhang = text_width(l.xa.labels.back(), kTickFont) / 2 + 4;
    if (overhang > right) {
      right = std::min(overhang, l.width - l.left - 40);
      l.xa = make_axis(ex, l.width - l.left - right, true, options.log_x());
    }
  }
  l.plot_w = l.width - l.left - right;
  return l;
}

}  // namespace

SvgPlot::SvgPlot(PlotOptions options) : options_(std::move(options)) {
  if (options_.width() < 200 || options_.height() < 150) {
    throw std::invalid_argument(
        fmt::format("SvgPlot: size {}x{} is below the minimum of 200x150", options_.width(), options_.height()));
  }
}

void SvgPlot::add_series(Series series) {
  if (series.x.size() != series.y.size()) {
    throw std::invalid_argument(fmt::format("SvgPlot: series \"{}\" has {} x values but {} y values", series.name,
                                            series.x.size(), series.y.size()));
  }
  series_.push_back(std::move(series));
}

void SvgPlot::add_marker(double x, double y, std::string label) { markers_.push_back({x, y, std::move(label)}); }

void SvgPlot::add_vline(double x, std::string label) { vlines_.push_back({x, std::move(label)}); }

// Each step appends its part of the document in drawing order: later parts are drawn on top.
class SvgPlot::Renderer {
 public:
  explicit Renderer(const SvgPlot& plot) : plot_(plot), options_(plot.options_) {}

  std::string render() {
    layout();
    document();
    grid();
    series();
    axes();
    annotations();
    legend();
    out_ += "</svg>\n";
    return std::move(out_);
  }

 private:
  bool drawable_x(double x) const { return drawable(x, options_.log_x()); }
  bool drawable_point(double x, double y) const { return drawable_x(x) && drawable(y, options_.log_y()); }

  // Axes that fit every drawable point, marker and vertical line.
  void layout() {
    Extent ex;
    Extent ey;
    for (const Series& s : plot_.series_) {
      for (size_t i = 0; i < s.x.size(); ++i) {
        if (drawable_point(s.x[i], s.y[i])) {
          ex.add(s.x[i]);
          ey.add(s.y[i]);
        }
      }
    }
    for (const Marker& m : plot_.markers_) {
      if (drawable_point(m.x, m.y)) {
        ex.add(m.x);
        ey.add(m.y);
      }
    }
    for (const VLine& v : plot_.vlines_) {
      if (drawable_x(v.x)) {
        ex.add(v.x);
      }
    }
    l_ = make_layout(options_, ex, ey);
  }

  // The root element, a white background and the title.
  void document() {
    auto put = std::back_inserter(out_);
    fmt::format_to(put,
                   "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
                   "font-family=\"sans-serif\">\n",
                   options_.width(), options_.height());
    fmt::format_to(put, "<rect width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n", options_.width(), options_.height());
    if (!options_.title().empty()) {
      // Centred over the plot area, but shifted back inside the document when it is wider than the plot area.
      const double tw = text_width(options_.title(), kTitleFont);
      const double cx = std::clamp(l_.left + l_.plot_w / 2, std::min(l_.width / 2, tw / 2 + 6),
                                   std::max(l_.width / 2, l_.width - tw / 2 - 6));
      fmt::format_to(put,
                     "<text x=\"{}\" y=\"26\" text-anchor=\"middle\" font-size=\"{}\" font-weight=\"bold\">{}</text>\n",
                     num(cx), num(kTitleFont), escape(options_.title()));
    }
  }

  // Minor lines first, so that the darker major lines stay unbroken where they cross them.
  void grid() {
    out_ += "<g stroke-width=\"1\" shape-rendering=\"crispEdges\">\n";
    grid_lines(l_.xa.minor, l_.ya.minor, "#f3f3f3");
    grid_lines(l_.xa.major, l_.ya.major, "#e0e0e0");
    out_ += "</g>\n";
  }

  // Vertical lines at data x values `xs`, then horizontal ones at data y values `ys`.
  void grid_lines(const std::vector<double>& xs, const std::vector<double>& ys, const char* stroke) {
    auto put = std::back_inserter(out_);
    const std::string top = num(l_.top);
    const std::string bottom = num(l_.plot_bottom());
    const std::string left = num(l_.left);
    const std::string right = num(l_.plot_right());
    for (const double v : xs) {
      fmt::format_to(put, "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"{3}\"/>\n", num(l_.px(v)), top,
                     bottom, stroke);
    }
    for (const double v : ys) {
      fmt::format_to(put, "<line x1=\"{1}\" y1=\"{0}\" x2=\"{2}\" y2=\"{0}\" stroke=\"{3}\"/>\n", num(l_.py(v)), left,
                     right, stroke);
    }
  }

  // Each series as pixel segments (an undrawable point ends the current one), kept for the legend placement.
  void series() {
    const std::vector<Series>& all = plot_.series_;
    segments_.assign(all.size(), {});
    for (size_t si = 0; si < all.size(); ++si) {
      const Series& s = all[si];
      std::vector<Point> current;
      for (size_t i = 0; i <= s.x.size(); ++i) {
        if (i < s.x.size() && drawable_point(s.x[i], s.y[i])) {
          current.push_back({l_.px(s.x[i]), l_.py(s.y[i])});
        } else if (!current.empty()) {
          segments_[si].push_back(std::move(current));
          current.clear();
        }
      }
    }
    auto put = std::back_inserter(out_);
    for (size_t si = 0; si < all.size(); ++si) {
      fmt::format_to(put, "<g fill=\"{0}\" stroke=\"{0}\">\n", colour(si));
      for (const std::vector<Point>& seg : segments_[si]) {
        if (seg.size() == 1) {
          // A lone point has no line to show it; unless markers will draw it anyway, give it a dot of its own.
          if (!all[si].markers) {
            fmt::format_to(put, "<circle cx=\"{}\" cy=\"{}\" r=\"2\" stroke=\"none\"/>\n", num(seg[0].x),
                           num(seg[0].y));
          }
          continue;
        }
        polyline(seg, dashes(si));
      }
      if (all[si].markers) {
        for (const std::vector<Point>& seg : segments_[si]) {
          for (const Point& p : seg) {
            fmt::format_to(put, "<circle cx=\"{}\" cy=\"{}\" r=\"3\" stroke=\"#ffffff\" stroke-width=\"0.8\"/>\n",
                           num(p.x), num(p.y));
          }
        }
      }
      out_ += "</g>\n";
    }
  }

  void polyline(const std::vector<Point>& seg, const char* dashes) {
    fmt::format_to(std::back_inserter(out_),
                   "<polyline fill=\"none\" stroke-width=\"1.8\" stroke-linejoin=\"round\" "
                   "stroke-linecap=\"round\"{} points=\"",
                   dashes);
    // Points closer than the output resolution add bytes but nothing visible (long runs have thousands of them).
    std::string previous;
    for (const Point& p : seg) {
      std::string xy = num(p.x) + "," + num(p.y);
      if (xy != previous) {
        out_ += previous.empty() ? "" : " ";
        out_ += xy;
        previous = std::move(xy);
      }
    }
    out_ += "\"/>\n";
  }

  // Frame, ticks, tick labels and axis labels (after the series, so that lines along an edge do not cover the
  // frame).
  void axes() {
    auto put = std::back_inserter(out_);
    const double plot_bottom = l_.plot_bottom();
    fmt::format_to(put,
                   "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333333\" "
                   "stroke-width=\"1\" shape-rendering=\"crispEdges\"/>\n",
                   num(l_.left), num(l_.top), num(l_.plot_w), num(l_.plot_h));
    out_ += "<g stroke=\"#333333\" stroke-width=\"1\" shape-rendering=\"crispEdges\">\n";
    for (const double v : l_.xa.major) {
      fmt::format_to(put, "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\"/>\n", num(l_.px(v)), num(plot_bottom),
                     num(plot_bottom + kTickLength));
    }
    for (const double v : l_.ya.major) {
      fmt::format_to(put, "<line x1=\"{1}\" y1=\"{0}\" x2=\"{2}\" y2=\"{0}\"/>\n", num(l_.py(v)),
                     num(l_.left - kTickLength), num(l_.left));
    }
    out_ += "</g>\n";
    fmt::format_to(put, "<g font-size=\"{}\" fill=\"#333333\">\n", num(kTickFont));
    for (size_t i = 0; i < l_.xa.major.size(); ++i) {
      fmt::format_to(put, "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", num(l_.px(l_.xa.major[i])),
                     num(plot_bottom + kTickLength + 3 + kTickFont), escape(l_.xa.labels[i]));
    }
    for (size_t i = 0; i < l_.ya.major.size(); ++i) {
      // +4 puts the digits' middle on the tick; dominant-baseline would do it, but not in every renderer.
      fmt::format_to(put, "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", num(l_.left - kTickLength - 3),
                     num(l_.py(l_.ya.major[i]) + 4), escape(l_.ya.labels[i]));
    }
    out_ += "</g>\n";
    if (!options_.x_label().empty()) {
      fmt::format_to(put, "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"{}\">{}</text>\n",
                     num(l_.left + l_.plot_w / 2), num(l_.height - 12), num(kLabelFont), escape(options_.x_label()));
    }
    if (!options_.y_label().empty()) {
      fmt::format_to(
          put, "<text transform=\"translate(18 {}) rotate(-90)\" text-anchor=\"middle\" font-size=\"{}\">{}</text>\n",
          num(l_.top + l_.plot_h / 2), num(kLabelFont), escape(options_.y_label()));
    }
  }

  // Vertical lines and point markers with their labels, whose boxes are kept for the legend placement.
  void annotations() {
    auto put = std::back_inserter(out_);
    const std::vector<VLine>& vlines = plot_.vlines_;
    for (size_t i = 0; i < vlines.size(); ++i) {
      const VLine& v = vlines[i];
      if (!drawable_x(v.x)) {
        continue;
      }
      const double x = l_.px(v.x);
      fmt::format_to(put,
                     "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"{3}\" stroke-width=\"1.2\" "
                     "stroke-dasharray=\"5 4\"/>\n",
                     num(x), num(l_.top), num(l_.plot_bottom()), kAnnotationColour);
      if (!v.label.empty()) {
        // Staggered, so that labels of nearby lines do not print over each other.
        const double y = l_.top + 4 + kTickFont + static_cast<double>(i % 4) * (kTickFont + 4);
        label(x, 4, y, v.label);
      }
    }
    for (const Marker& m : plot_.markers_) {
      if (!drawable_point(m.x, m.y)) {
        continue;
      }
      const double x = l_.px(m.x);
      const double y = l_.py(m.y);
      fmt::format_to(put, "<circle cx=\"{}\" cy=\"{}\" r=\"5\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"/>\n",
                     num(x), num(y), kAnnotationColour);
      annotation_boxes_.push_back({x - 6, y - 6, 12, 12});
      if (!m.label.empty()) {
        // Above the point unless that leaves the plot area.
        const double ly = y - 7 - kTickFont < l_.top ? y + 7 + kTickFont : y - 7;
        label(x, 7, ly, m.label);
      }
    }
  }

  // An annotation label `gap` pixels beside `x`, with baseline `y`.
  void label(double x, double gap, double y, const std::string& text) {
    const double tw = text_width(text, kTickFont);
    const LabelPlace place = place_label(x, gap, tw, l_.left, l_.plot_right(), l_.width);
    out_ += halo_text(place.x, y, place.anchor, text);
    annotation_boxes_.push_back({place.left, y - kTickFont, tw, kTickFont + 3});
  }

  static constexpr double kLegendRow = 16;
  static constexpr double kLegendPad = 6;
  static constexpr double kLegendSample = 20;

  // A legend entry for each named series.
  void legend() {
    const std::vector<Series>& all = plot_.series_;
    std::vector<size_t> entries;
    for (size_t si = 0; si < all.size(); ++si) {
      if (!all[si].name.empty()) {
        entries.push_back(si);
      }
    }
    if (entries.empty()) {
      return;
    }
    double widest = 0;
    for (const size_t si : entries) {
      widest = std::max(widest, text_width(all[si].name, kTickFont));
    }
    const Rect box = legend_box(kLegendPad + kLegendSample + 6 + widest + kLegendPad,
                                2 * kLegendPad + static_cast<double>(entries.size()) * kLegendRow - 4);
    auto put = std::back_inserter(out_);
    fmt::format_to(put, "<g font-size=\"{}\">\n", num(kTickFont));
    fmt::format_to(put,
                   "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"3\" fill=\"#ffffff\" fill-opacity=\"0.85\" "
                   "stroke=\"#cccccc\"/>\n",
                   num(box.x), num(box.y), num(box.w), num(box.h));
    for (size_t e = 0; e < entries.size(); ++e) {
      const size_t si = entries[e];
      const double row_mid = box.y + kLegendPad + 6 + static_cast<double>(e) * kLegendRow;
      fmt::format_to(put,
                     "<line x1=\"{0}\" y1=\"{2}\" x2=\"{1}\" y2=\"{2}\" stroke=\"{3}\" stroke-width=\"1.8\"{4}/>\n",
                     num(box.x + kLegendPad), num(box.x + kLegendPad + kLegendSample), num(row_mid), colour(si),
                     dashes(si));
      if (all[si].markers) {
        fmt::format_to(put, "<circle cx=\"{}\" cy=\"{}\" r=\"3\" fill=\"{}\"/>\n",
                       num(box.x + kLegendPad + kLegendSample / 2), num(row_mid), colour(si));
      }
      fmt::format_to(put, "<text x=\"{}\" y=\"{}\" fill=\"#222222\">{}</text>\n",
                     num(box.x + kLegendPad + kLegendSample + 6), num(row_mid + 4), escape(all[si].name));
    }
    out_ += "</g>\n";
  }

  // The legend's box (`w` x `h`) in the corner of the plot area that hides the least of the lines and annotations.
  Rect legend_box(double w, double h) const {
    constexpr double kInset = 8;
    const double top = l_.top;
    const double bottom = l_.plot_bottom();
    // Preference order on ties: top right, top left, bottom right, bottom left.
    const std::array<Rect, 4> candidates = {Rect{l_.plot_right() - kInset - w, top + kInset, w, h},
                                            Rect{l_.left + kInset, top + kInset, w, h},
                                            Rect{l_.plot_right() - kInset - w, bottom - kInset - h, w, h},
                                            Rect{l_.left + kInset, bottom - kInset - h, w, h}};
    std::array<double, 4> cost{};
    const auto count = [&](const Point& p, double weight) {
      for (size_t c = 0; c < candidates.size(); ++c) {
        const Rect& r = candidates[c];
        if (Rect{r.x - 3, r.y - 3, r.w + 6, r.h + 6}.contains(p)) {
          cost[c] += weight;
        }
      }
    };
    for (const auto& series_segments : segments_) {
      for (const std::vector<Point>& seg : series_segments) {
        count(seg[0], 1);
        for (size_t i = 1; i < seg.size(); ++i) {
          // Sampled every few pixels, so that a long straight stretch through a corner counts, not just its ends.
          const double len = std::hypot(seg[i].x - seg[i - 1].x, seg[i].y - seg[i - 1].y);
          const int n = std::max(1, static_cast<int>(std::ceil(len / 4)));
          for (int j = 1; j <= n; ++j) {
            const double t = static_cast<double>(j) / n;
            count({seg[i - 1].x + t * (seg[i].x - seg[i - 1].x), seg[i - 1].y + t * (seg[i].y - seg[i - 1].y)}, 1);
          }
        }
      }
    }
    for (const VLine& v : plot_.vlines_) {
      if (drawable_x(v.x)) {
        for (double y = top; y <= bottom; y += 4) {
          count({l_.px(v.x), y}, 1);
        }
      }
    }
    // Hiding an annotation label is worse than hiding a stretch of line.
    for (const Rect& b : annotation_boxes_) {
      for (size_t c = 0; c < candidates.size(); ++c) {
        const Rect& r = candidates[c];
        if (b.x < r.x + r.w && r.x < b.x + b.w && b.y < r.y + r.h && r.y < b.y + b.h) {
          cost[c] += 1000;
        }
      }
    }
    return candidates[static_cast<size_t>(std::min_element(cost.begin(), cost.end()) - cost.begin())];
  }

  static const char* colour(size_t si) { return kPalette[si % kPalette.size()]; }
  static const char* dashes(size_t si) { return kDashes[(si / kPalette.size()) % kDashes.size()]; }

  const SvgPlot& plot_;
  const PlotOptions& options_;
  Layout l_;
  std::string out_;
  std::vector<std::vector<std::vector<Point>>> segments_;  // per series
  std::vector<Rect> annotation_boxes_;                     // label and marker boxes, which the legend avoids
};

std::string SvgPlot::render() const { return Renderer(*this).render(); }

void SvgPlot::save(const std::string& path) const {
  const std::string svg = render();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) {
    throw std::runtime_error(fmt::format("{}: cannot open for writing", path));
  }
  f.write(svg.data(), static_cast<std::streamsize>(svg.size()));
  f.close();
  if (!f) {
    throw std::runtime_error(fmt::format("{}: write failed", path));
  }
}

}  // namespace trainkit::log
