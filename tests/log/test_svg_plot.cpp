// SvgPlot: document structure, exact tick labels on linear and log axes, segmenting around undrawable points,
// escaping, errors, and byte-for-byte determinism. Labels are read back from the SVG text itself.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "trainkit/log/svg_plot.h"

using Catch::Matchers::Contains;
using trainkit::log::PlotOptions;
using trainkit::log::Series;
using trainkit::log::SvgPlot;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

size_t count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = haystack.find(needle); pos != std::string::npos; pos = haystack.find(needle, pos + 1)) {
    ++n;
  }
  return n;
}

std::vector<std::string> matches(const std::string& svg, const std::string& pattern) {
  const std::regex re(pattern);
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it) {
    out.push_back((*it)[1].str());
  }
  return out;
}

// Tick labels are the only texts whose last attribute is the anchor: middle below the x axis, end left of the y axis.
std::vector<std::string> x_tick_labels(const std::string& svg) {
  return matches(svg, "text-anchor=\"middle\">([^<]*)</text>");
}
std::vector<std::string> y_tick_labels(const std::string& svg) {
  return matches(svg, "text-anchor=\"end\">([^<]*)</text>");
}

// Well-formed enough for any XML parser: tags balance, and text holds no raw '<' and only known entities.
bool well_formed(const std::string& svg) {
  std::vector<std::string> open;
  size_t pos = 0;
  while (pos < svg.size()) {
    const size_t lt = svg.find('<', pos);
    const std::string text = svg.substr(pos, lt == std::string::npos ? std::string::npos : lt - pos);
    for (size_t amp = text.find('&'); amp != std::string::npos; amp = text.find('&', amp + 1)) {
      const std::string rest = text.substr(amp);
      if (rest.rfind("&amp;", 0) != 0 && rest.rfind("&lt;", 0) != 0 && rest.rfind("&gt;", 0) != 0 &&
          rest.rfind("&quot;", 0) != 0 && rest.rfind("&apos;", 0) != 0) {
        return false;
      }
    }
    if (lt == std::string::npos) {
      break;
    }
    const size_t gt = svg.find('>', lt);
    if (gt == std::string::npos) {
      return false;
    }
    const std::string tag = svg.substr(lt + 1, gt - lt - 1);
    if (tag.empty() || tag.find('<') != std::string::npos || count(tag, "\"") % 2 != 0) {
      return false;
    }
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) {
        return false;
      }
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(tag.substr(0, tag.find_first_of(" \n")));
    }
    pos = gt + 1;
  }
  return open.empty();
}

Series line(std::string name, std::vector<double> x, std::vector<double> y) {
  Series s;
  s.name = std::move(name);
  s.x = std::move(x);
  s.y = std::move(y);
  return s;
}

}  // namespace

TEST_CASE("SvgPlot renders a standalone SVG document", "[log][svg]") {
  SvgPlot plot(PlotOptions().title("Loss").x_label("epoch").y_label("loss"));
  plot.add_series(line("train", {0, 1, 2}, {3, 2, 1}));
  const std::string svg = plot.render();
  CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"720\" height=\"420\" viewBox=\"0 0 720 420\" "
                  "font-family=\"sans-serif\">\n",
                  0) == 0);
  CHECK(svg.size() > 7);
  CHECK(svg.substr(svg.size() - 7) == "</svg>\n");
  CHECK(count(svg, "<svg") == 1);
  CHECK_THAT(svg, Contains("<rect width=\"720\" height=\"420\" fill=\"#ffffff\"/>"));
  CHECK_THAT(svg, Contains(">Loss</text>"));
  CHECK_THAT(svg, Contains(">epoch</text>"));
  CHECK_THAT(svg, Contains("rotate(-90)"));
  CHECK_THAT(svg, Contains(">loss</text>"));
  CHECK(well_formed(svg));
}

TEST_CASE("SvgPlot puts linear ticks on 1-2-5 steps", "[log][svg]") {
  SvgPlot plot;
  plot.add_series(line("a", {0, 50, 100}, {0, 0.5, 1}));
  const std::string svg = plot.render();
  CHECK(x_tick_labels(svg) == std::vector<std::string>{"0", "20", "40", "60", "80", "100"});
  CHECK(y_tick_labels(svg) == std::vector<std::string>{"0", "0.2", "0.4", "0.6", "0.8", "1"});
}

TEST_CASE("SvgPlot formats tick labels compactly", "[log][svg]") {
  SECTION("large values switch to exponents") {
    SvgPlot plot;
    plot.add_series(line("a", {0, 2e6}, {-0.003, 0.001}));
    const std::string svg = plot.render();
    CHECK(x_tick_labels(svg) == std::vector<std::string>{"0", "500000", "1e+06", "1.5e+06", "2e+06"});
    CHECK(y_tick_labels(svg) == std::vector<std::string>{"-0.003", "-0.002", "-0.001", "0", "0.001"});
  }
  SECTION("narrow ranges far from zero get enough digits to stay distinct") {
    SvgPlot plot;
    plot.add_series(line("a", {1000000, 1000001}, {0, 1}));
    CHECK(x_tick_labels(plot.render()) ==
          std::vector<std::string>{"1000000", "1000000.2", "1000000.4", "1000000.6", "1000000.8", "1000001"});
  }
}

TEST_CASE("SvgPlot puts log ticks on decades", "[log][svg]") {
  SECTION("y in [1e-5, 1]") {
    SvgPlot plot(PlotOptions().log_y(true));
    plot.add_series(line("a", {0, 1, 2}, {1e-5, 3e-3, 1}));
    CHECK(y_tick_labels(plot.render()) == std::vector<std::string>{"1e-05", "0.0001", "0.001", "0.01", "0.1", "1"});
  }
  SECTION("x in [1e-7, 10], as a learning-rate sweep") {
    SvgPlot plot(PlotOptions().log_x(true));
    plot.add_series(line("a", {1e-7, 1e-3, 10}, {2, 1, 5}));
    CHECK(x_tick_labels(plot.render()) ==
          std::vector<std::string>{"1e-07", "1e-06", "1e-05", "0.0001", "0.001", "0.01", "0.1", "1", "10"});
  }
  SECTION("data inside one decade extends to the decade's ends") {
    SvgPlot plot(PlotOptions().log_y(true));
    plot.add_series(line("a", {0, 1}, {2, 5}));
    CHECK(y_tick_labels(plot.render()) == std::vector<std::string>{"1", "10"});
  }
  SECTION("many decades on a short axis label every third decade") {
    SvgPlot plot(PlotOptions().log_y(true).height(200));
    plot.add_series(line("a", {0, 1}, {1e-6, 1e6}));
    CHECK(y_tick_labels(plot.render()) == std::vector<std::string>{"1e-06", "0.001", "1", "1000", "1e+06"});
  }
}

TEST_CASE("SvgPlot draws one polyline per finite segment", "[log][svg]") {
  SECTION("one per series") {
    SvgPlot plot;
    plot.add_series(line("a", {0, 1, 2}, {0, 1, 4}));
    plot.add_series(line("b", {0, 1, 2}, {4, 1, 0}));
    const std::string svg = plot.render();
    CHECK(count(svg, "<polyline") == 2);
    CHECK_THAT(svg, Contains("stroke=\"#1f77b4\""));
    CHECK_THAT(svg, Contains("stroke=\"#ff7f0e\""));
  }
  SECTION("NaN splits a series in two") {
    SvgPlot plot;
    plot.add_series(line("a", {0, 1, 2, 3, 4}, {1, 2, kNaN, 2, 1}));
    const std::string svg = plot.render();
    CHECK(count(svg, "<polyline") == 2);
    CHECK(count(svg, "nan") == 0);
  }
  SECTION("infinities split too, and leading or trailing gaps add nothing") {
    SvgPlot plot;
    plot.add_series(line("a", {kNaN, 0, 1, kInf, 2, 3, 4, 5}, {0, 1, 2, 3, 4, -kInf, 5, 6}));
    const std::string svg = plot.render();
    CHECK(count(svg, "<polyline") == 2);
    CHECK(count(svg, "<circle") == 1);  // the lone point between the infinities
    CHECK(count(svg, "inf") == 0);
  }
  SECTION("non-positive values split a series on a log axis but not on a linear one") {
    SvgPlot log_plot(PlotOptions().log_y(true));
    log_plot.add_series(line("a", {0, 1, 2, 3, 4}, {1, 2, 0, 2, -1}));
    CHECK(count(log_plot.render(), "<polyline") == 1);  // the lone point after 0 becomes a dot
    CHECK(count(log_plot.render(), "<circle") == 1);
    SvgPlot linear_plot;
    linear_plot.add_series(line("a", {0, 1, 2, 3, 4}, {1, 2, 0, 2, -1}));
    CHECK(count(linear_plot.render(), "<polyline") == 1);
    CHECK(count(linear_plot.render(), "<circle") == 0);
  }
  SECTION("the polyline has one coordinate pair per point") {
    SvgPlot plot;
    plot.add_series(line("a", {0, 1, 2, 3}, {0, 1, 0, 1}));
    const std::vector<std::string> points = matches(plot.render(), "points=\"([^\"]*)\"");
    REQUIRE(points.size() == 1);
    CHECK(count(points[0], ",") == 4);
    CHECK(count(points[0], " ") == 3);
  }
  SECTION("points on the same output pixel are written once") {
    SvgPlot plot;
    plot.add_series(line("a", {0, 1e-9, 2e-9, 1}, {0, 0, 0, 1}));
    const std::vector<std::string> points = matches(plot.render(), "points=\"([^\"]*)\"");
    REQUIRE(points.size() == 1);
    CHECK(count(points[0], ",") == 2);
  }
}

TEST_CASE("SvgPlot tells series beyond the palette apart by dashes", "[log][svg]") {
  SvgPlot plot;
  for (int i = 0; i < 11; ++i) {
    std::string name = "s";  // not "s" + to_string(i): GCC 12 warns falsely on that (PR 105651)
    name += std::to_string(i);
    plot.add_series(line(name, {0, 1}, {0, static_cast<double>(i)}));
  }
  const std::string svg = plot.render();
  CHECK(count(svg, "<polyline") == 11);
  CHECK(count(svg, "stroke=\"#1f77b4\"") == 4);  // the 1st and 11th series, each a group and a legend sample
  // The 11th series' polyline and its legend sample, and nothing else.
  CHECK(count(svg, "stroke-dasharray=\"7 3\"") == 2);
  CHECK(count(svg, "stroke-dasharray") == 2);
}

TEST_CASE("SvgPlot draws markers, annotations and a legend", "[log][svg]") {
  SvgPlot plot;
  Series with_markers = line("val", {0, 1, 2}, {1, 2, 3});
  with_markers.markers = true;
  plot.add_series(line("train", {0, 1, 2}, {3, 2, 1}));
  plot.add_series(with_markers);
  plot.add_series(line("", {0, 2}, {2, 2}));
  plot.add_marker(1, 2, "suggested lr");
  plot.add_vline(1.5, "warmup end");
  const std::string svg = plot.render();
  // Legend: the two named series, the unnamed one has no entry.
  CHECK(count(svg, ">train</text>") == 1);
  CHECK(count(svg, ">val</text>") == 1);
  CHECK(count(svg, "fill=\"#222222\">") == 2);
  // Three point markers on "val", one in its legend entry, one annotation ring.
  CHECK(count(svg, "r=\"3\"") == 4);
  CHECK(count(svg, "r=\"5\"") == 1);
  CHECK(count(svg, ">suggested lr</text>") == 1);
  CHECK(count(svg, "stroke-dasharray") == 1);
  CHECK(count(svg, ">warmup end</text>") == 1);
  CHECK(well_formed(svg));
}

TEST_CASE("SvgPlot escapes text", "[log][svg]") {
  SvgPlot plot(PlotOptions().title("a<b & \"c\"").x_label("x > 0").y_label("it's"));
  plot.add_series(line("<train>", {0, 1}, {0, 1}));
  plot.add_marker(0.5, 0.5, "lr & co");
  const std::string svg = plot.render();
  CHECK_THAT(svg, Contains(">a&lt;b &amp; &quot;c&quot;</text>"));
  CHECK_THAT(svg, Contains(">x &gt; 0</text>"));
  CHECK_THAT(svg, Contains(">it&apos;s</text>"));
  CHECK_THAT(svg, Contains(">&lt;train&gt;</text>"));
  CHECK_THAT(svg, Contains(">lr &amp; co</text>"));
  CHECK(count(svg, "a<b") == 0);
  CHECK(count(svg, "<train>") == 0);
  CHECK(well_formed(svg));
}

TEST_CASE("SvgPlot renders axes without drawable data", "[log][svg]") {
  SECTION("empty linear plot") {
    const std::string svg = SvgPlot().render();
    CHECK(well_formed(svg));
    CHECK(count(svg, "<polyline") == 0);
    CHECK(y_tick_labels(svg) == std::vector<std::string>{"0", "0.2", "0.4", "0.6", "0.8", "1"});
    CHECK(x_tick_labels(svg) == std::vector<std::string>{"0", "0.2", "0.4", "0.6", "0.8", "1"});
  }
  SECTION("all points skipped on log axes") {
    SvgPlot plot(PlotOptions().log_x(true).log_y(true));
    plot.add_series(line("a", {-1, 0, kNaN}, {1, 2, 3}));
    const std::string svg = plot.render();
    CHECK(well_formed(svg));
    CHECK(count(svg, "<polyline") == 0);
    CHECK(x_tick_labels(svg) == std::vector<std::string>{"1", "10"});
    CHECK(y_tick_labels(svg) == std::vector<std::string>{"1", "10"});
    CHECK_THAT(svg, Contains(">a</text>"));  // still in the legend
  }
}

TEST_CASE("SvgPlot gives a constant series a non-zero range", "[log][svg]") {
  SECTION("non-zero constant") {
    SvgPlot plot;
    plot.add_series(line("a", {0, 1, 2}, {5, 5, 5}));
    const std::string svg = plot.render();
    CHECK(y_tick_labels(svg) == std::vector<std::string>{"4.6", "4.8", "5", "5.2", "5.4"});
    // Centred vertically: the plot area runs from y=14 to y=388.
    const std::vector<std::string> points = matches(svg, "points=\"([^\"]*)\"");
    REQUIRE(points.size() == 1);
    CHECK_THAT(points[0], Contains(",201 "));
  }
  SECTION("on a log axis, a power of ten gets the decades either side") {
    SvgPlot plot(PlotOptions().log_y(true));
    plot.add_series(line("a", {0, 1}, {1, 1}));
    CHECK(y_tick_labels(plot.render()) == std::vector<std::string>{"0.1", "1", "10"});
  }
  SECTION("zero") {
    SvgPlot plot;
    plot.add_series(line("a", {0, 1}, {0, 0}));
    CHECK(y_tick_labels(plot.render()) == std::vector<std::string>{"-1", "-0.5", "0", "0.5", "1"});
  }
  SECTION("single point") {
    SvgPlot plot;
    plot.add_series(line("a", {3}, {7}));
    const std::string svg = plot.render();
    CHECK(count(svg, "<polyline") == 0);
    CHECK(count(svg, "<circle") == 1);
    CHECK(x_tick_labels(svg).size() >= 3);
    CHECK(y_tick_labels(svg).size() >= 3);
  }
}

TEST_CASE("SvgPlot rejects bad input", "[log][svg]") {
  SvgPlot plot;
  CHECK_THROWS_MATCHES(plot.add_series(line("my series", {0, 1, 2}, {0, 1})), std::invalid_argument,
                       Catch::Matchers::Message("SvgPlot: series \"my series\" has 3 x values but 2 y values"));
  CHECK(count(plot.render(), "<polyline") == 0);  // nothing was added
  CHECK_THROWS_AS(SvgPlot(PlotOptions().width(100)), std::invalid_argument);
}

TEST_CASE("SvgPlot saves the rendered document", "[log][svg]") {
  SvgPlot plot;
  plot.add_series(line("a", {0, 1}, {1, 0}));
  const std::filesystem::path dir = std::filesystem::temp_directory_path();
  SECTION("to a file") {
    const std::string path = (dir / "trainkit-test-svg-plot.svg").string();
    plot.save(path);
    std::ifstream in(path, std::ios::binary);
    const std::string written{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    std::filesystem::remove(path);
    CHECK(written == plot.render());
  }
  SECTION("into a missing directory") {
    const std::string path = (dir / "trainkit-test-no-such-dir" / "plot.svg").string();
    REQUIRE_FALSE(std::filesystem::exists(dir / "trainkit-test-no-such-dir"));
    CHECK_THROWS_MATCHES(plot.save(path), std::runtime_error,
                         Catch::Matchers::Message(path + ": cannot open for writing"));
  }
}

TEST_CASE("SvgPlot renders deterministically", "[log][svg]") {
  const auto build = [] {
    SvgPlot plot(PlotOptions().title("lr finder").log_x(true));
    Series s;
    s.name = "loss";
    for (int i = 0; i <= 200; ++i) {
      s.x.push_back(std::pow(10.0, -7 + i * 0.04));
      s.y.push_back(2 + std::sin(i * 0.1) + (i == 50 ? kNaN : 0));
    }
    plot.add_series(s);
    plot.add_marker(1e-3, 2.5, "suggested lr");
    return plot;
  };
  const SvgPlot a = build();
  const SvgPlot b = build();
  const std::string first = a.render();
  CHECK(first == a.render());
  CHECK(first == b.render());
  CHECK(count(first, "<polyline") == 2);
  CHECK(well_formed(first));
}
