#include "trainkit/tune/search_space.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace trainkit::tune {

std::string to_string(const ParamValue& value) {
  if (const auto* d = std::get_if<double>(&value)) {
    return fmt::format("{}", *d);
  }
  if (const auto* i = std::get_if<int64_t>(&value)) {
    return std::to_string(*i);
  }
  return std::get<std::string>(value);
}

void SearchSpace::add(Param p) {
  if (p.name.empty()) {
    throw std::invalid_argument("SearchSpace: a parameter needs a name");
  }
  for (const auto& q : params_) {
    if (q.name == p.name) {
      throw std::invalid_argument(fmt::format("{}: the parameter is defined twice", p.name));
    }
  }
  if (p.kind != Param::Kind::Categorical) {
    if (!std::isfinite(p.low) || !std::isfinite(p.high)) {
      throw std::invalid_argument(fmt::format("{}: bounds must be finite, got [{}, {}]", p.name, p.low, p.high));
    }
    if (!(p.low < p.high)) {
      throw std::invalid_argument(fmt::format("{}: empty range [{}, {}] (needs low < high)", p.name, p.low, p.high));
    }
    if (p.log && p.low <= 0) {
      throw std::invalid_argument(fmt::format("{}: log range needs low > 0, got [{}, {}]", p.name, p.low, p.high));
    }
  } else {
    if (p.choices.empty()) {
      throw std::invalid_argument(fmt::format("{}: a categorical parameter needs at least one choice", p.name));
    }
    for (size_t i = 0; i < p.choices.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (p.choices[i] == p.choices[j]) {
          throw std::invalid_argument(fmt::format("{}: choice \"{}\" is listed twice", p.name, p.choices[i]));
        }
      }
    }
  }
  params_.push_back(std::move(p));
}

SearchSpace& SearchSpace::add_float(const std::string& name, double low, double high, bool log) {
  Param p;
  p.name = name;
  p.kind = Param::Kind::Float;
  p.low = low;
  p.high = high;
  p.log = log;
  add(std::move(p));
  return *this;
}

SearchSpace& SearchSpace::add_int(const std::string& name, int64_t low, int64_t high, bool log) {
  Param p;
  p.name = name;
  p.kind = Param::Kind::Int;
  p.low = static_cast<double>(low);
  p.high = static_cast<double>(high);
  p.log = log;
  add(std::move(p));
  return *this;
}

SearchSpace& SearchSpace::add_categorical(const std::string& name, std::vector<std::string> choices) {
  Param p;
  p.name = name;
  p.kind = Param::Kind::Categorical;
  p.choices = std::move(choices);
  add(std::move(p));
  return *this;
}

int64_t SearchSpace::dims() const {
  int64_t n = 0;
  for (const auto& p : params_) {
    n += p.kind == Param::Kind::Categorical ? static_cast<int64_t>(p.choices.size()) : 1;
  }
  return n;
}

namespace {

double from_unit(const Param& p, double u) {
  u = std::clamp(u, 0.0, 1.0);
  if (p.log) {
    return std::exp(std::log(p.low) + u * (std::log(p.high) - std::log(p.low)));
  }
  return p.low + u * (p.high - p.low);
}

double to_unit(const Param& p, double v) {
  if (p.log) {
    return (std::log(v) - std::log(p.low)) / (std::log(p.high) - std::log(p.low));
  }
  return (v - p.low) / (p.high - p.low);
}

}  // namespace

ParamSet SearchSpace::decode(const std::vector<double>& u) const {
  if (static_cast<int64_t>(u.size()) != dims()) {
    throw std::invalid_argument(fmt::format("SearchSpace::decode: {} coordinates for a space of {}", u.size(), dims()));
  }
  ParamSet out;
  size_t k = 0;
  for (const auto& p : params_) {
    switch (p.kind) {
      case Param::Kind::Float:
        out[p.name] = std::clamp(from_unit(p, u[k]), p.low, p.high);
        ++k;
        break;
      case Param::Kind::Int: {
        // Widen the range by half a step on each side so that every integer gets an equal share.
        Param wide = p;
        if (p.log) {
          wide.low = std::max(p.low - 0.5, p.low * 0.5 + 1e-12);
          wide.high = p.high + 0.5;
        } else {
          wide.low = p.low - 0.5;
          wide.high = p.high + 0.5;
        }
        const double v = std::clamp(std::round(from_unit(wide, u[k])), p.low, p.high);
        out[p.name] = static_cast<int64_t>(v);
        ++k;
        break;
      }
      case Param::Kind::Categorical: {
        size_t best = 0;
        for (size_t c = 1; c < p.choices.size(); ++c) {
          if (u[k + c] > u[k + best]) {
            best = c;
          }
        }
        out[p.name] = p.choices[best];
        k += p.choices.size();
        break;
      }
    }
  }
  return out;
}

std::vector<double> SearchSpace::encode(const ParamSet& point) const {
  std::vector<double> u;
  u.reserve(static_cast<size_t>(dims()));
  for (const auto& p : params_) {
    const auto it = point.find(p.name);
    if (it == point.end()) {
      throw std::invalid_argument(fmt::format("{}: missing from the point", p.name));
    }
    const ParamValue& v = it->second;
    if (p.kind == Param::Kind::Categorical) {
      const auto* s = std::get_if<std::string>(&v);
      const auto c = s ? std::find(p.choices.begin(), p.choices.end(), *s) : p.choices.end();
      if (c == p.choices.end()) {
        throw std::invalid_argument(fmt::format("{}: \"{}\" is not one of its choices", p.name, to_string(v)));
      }
      for (size_t i = 0; i < p.choices.size(); ++i) {
        u.push_back(static_cast<int64_t>(i) == c - p.choices.begin() ? 1.0 : 0.0);
      }
      continue;
    }
    double x = 0;
    if (const auto* d = std::get_if<double>(&v); d && p.kind == Param::Kind::Float) {
      x = *d;
    } else if (const auto* i = std::get_if<int64_t>(&v)) {
      x = static_cast<double>(*i);
    } else {
      throw std::invalid_argument(fmt::format("{}: expected {}, got \"{}\"", p.name,
                                              p.kind == Param::Kind::Int ? "an integer" : "a number", to_string(v)));
    }
    if (!(x >= p.low && x <= p.high)) {
      throw std::invalid_argument(fmt::format("{}: {} is outside [{}, {}]", p.name, x, p.low, p.high));
    }
    if (p.kind == Param::Kind::Int) {
      Param wide = p;
      if (p.log) {
        wide.low = std::max(p.low - 0.5, p.low * 0.5 + 1e-12);
        wide.high = p.high + 0.5;
      } else {
        wide.low = p.low - 0.5;
        wide.high = p.high + 0.5;
      }
      // The centre of the integer's cell.
      const double a = to_unit(wide, std::max(x - 0.5, wide.low));
      const double b = to_unit(wide, x + 0.5);
      u.push_back(std::clamp((a + b) / 2, 0.0, 1.0));
    } else {
      u.push_back(std::clamp(to_unit(p, x), 0.0, 1.0));
    }
  }
  return u;
}

std::string SearchSpace::fingerprint() const {
  std::string out;
  for (const auto& p : params_) {
    if (!out.empty()) {
      out += ";";
    }
    switch (p.kind) {
      case Param::Kind::Float:
      case Param::Kind::Int:
        out += fmt::format("{}:{}:{}:[{},{}]", p.name, p.kind == Param::Kind::Float ? "float" : "int",
                           p.log ? "log" : "linear", p.low, p.high);
        break;
      case Param::Kind::Categorical: {
        out += p.name + ":categorical:[";
        for (size_t i = 0; i < p.choices.size(); ++i) {
          out += (i ? "," : "") + p.choices[i];
        }
        out += "]";
        break;
      }
    }
  }
  return out;
}

}  // namespace trainkit::tune
