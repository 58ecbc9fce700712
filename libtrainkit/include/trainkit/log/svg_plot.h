#pragma once
/// @file
/// Line plots written as standalone SVG documents (loss curves, learning-rate finder sweeps), with no
/// graphics library, so that a run can leave a picture next to its metrics files.

#include <string>
#include <vector>

#include <torch/arg.h>

namespace trainkit::log {

/// One line of a plot.
struct Series {
  std::string name;       ///< legend label (a series with an empty name has no legend entry)
  std::vector<double> x;  ///< x coordinates, one per point
  std::vector<double> y;  ///< y coordinates, one per point
  bool markers = false;   ///< draw a small circle at each point
};

/// Options of an SvgPlot: `PlotOptions().title("loss").x_label("step").log_y(true)`.
struct PlotOptions {
  /// Drawn above the plot area (none when empty).
  TORCH_ARG(std::string, title);
  /// Drawn below the x axis (none when empty).
  TORCH_ARG(std::string, x_label);
  /// Drawn left of the y axis, rotated (none when empty).
  TORCH_ARG(std::string, y_label);
  /// Logarithmic x axis; non-positive x values are skipped.
  TORCH_ARG(bool, log_x) = false;
  /// Logarithmic y axis; non-positive y values are skipped.
  TORCH_ARG(bool, log_y) = false;
  /// Document width in pixels (at least 200).
  TORCH_ARG(int, width) = 720;
  /// Document height in pixels (at least 150).
  TORCH_ARG(int, height) = 420;
};

/// A 2-D line plot rendered as a standalone SVG document: axes with "nice" ticks (1-2-5 steps on linear axes,
/// decades on log axes), grid lines, several series in distinct colours, a legend, optional point markers, and
/// labelled vertical lines and points (e.g. "suggested lr").
///
/// Points that cannot be drawn (NaN, infinities, |v| > 1e300, and on a log axis values below 1e-300, zero and
/// negatives included) are skipped and split their series into separate segments. Rendering is deterministic: the same plot gives the same bytes.
class SvgPlot {
 public:
  /// A plot without series (std::invalid_argument when the size is below 200x150).
  explicit SvgPlot(PlotOptions options = {});

  /// Adds a series; x and y must have equal length (std::invalid_argument naming the series otherwise).
  void add_series(Series series);
  /// Marks one point with a labelled marker (drawn on top of the series).
  void add_marker(double x, double y, std::string label);
  /// Draws a labelled dashed vertical line at `x` across the plot area (drawn on top of the series).
  void add_vline(double x, std::string label);

  /// The SVG document (starts with "<svg", ends with "</svg>\n").
  std::string render() const;
  /// Writes render() to `path` (std::runtime_error naming the path on failure).
  void save(const std::string& path) const;

 private:
  // render()'s steps (layout, axes, series, annotations, legend) and the state they share; nested so that it
  // reads the series and annotations, defined in svg_plot.cpp.
  class Renderer;

  struct Marker {
    double x;
    double y;
    std::string label;
  };
  struct VLine {
    double x;
    std::string label;
  };

  PlotOptions options_;
  std::vector<Series> series_;
  std::vector<Marker> markers_;
  std::vector<VLine> vlines_;
};

}  // namespace trainkit::log
