#pragma once
/// @file
/// A hyperparameter search space: float (linear or log), integer (linear or log) and categorical
/// parameters, and its encoding into the unit cube that the samplers and the Gaussian process work in
/// (one coordinate per float or integer parameter, one per choice for a categorical, one-hot).

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace trainkit::tune {

/// One parameter's value: a float, an integer or a categorical choice (a string).
using ParamValue = std::variant<double, int64_t, std::string>;
/// A point of a search space: parameter name -> value.
using ParamSet = std::map<std::string, ParamValue>;

/// The value as text: `0.001` (shortest round-trip form), `64`, or the choice itself.
std::string to_string(const ParamValue& value);

/// One dimension of a SearchSpace.
struct Param {
  enum class Kind { Float, Int, Categorical };
  std::string name;
  Kind kind = Kind::Float;
  double low = 0;    ///< Float, Int: lower bound (inclusive)
  double high = 1;   ///< Float, Int: upper bound (inclusive)
  bool log = false;  ///< Float, Int: uniform in log(value) (bounds > 0)
  std::vector<std::string> choices;  ///< Categorical: the choices
};

/// An ordered set of parameters. Names are unique; adding checks the bounds and throws
/// std::invalid_argument naming the parameter ("lr: empty range [0.1, 0.01]", "lr: log range needs
/// low > 0, got 0").
class SearchSpace {
 public:
  /// A float in [low, high], uniform in value or (log) in log(value).
  SearchSpace& add_float(const std::string& name, double low, double high, bool log = false);
  /// An integer in [low, high], uniform in value or (log) in log(value).
  SearchSpace& add_int(const std::string& name, int64_t low, int64_t high, bool log = false);
  /// One of `choices` (at least one, distinct).
  SearchSpace& add_categorical(const std::string& name, std::vector<std::string> choices);

  const std::vector<Param>& params() const { return params_; }
  bool empty() const { return params_.empty(); }
  /// Coordinates of the unit-cube encoding: 1 per float or integer, one per choice of a categorical.
  int64_t dims() const;

  /// The point that unit-cube coordinates `u` (dims() of them, clamped to [0, 1]) decode to: floats
  /// map linearly (or log-linearly) from [0, 1] to [low, high]; integers round to the nearest;
  /// a categorical takes the choice with the largest coordinate (the first on ties).
  ParamSet decode(const std::vector<double>& u) const;
  /// The unit-cube coordinates of `point` (one-hot for categoricals); throws std::invalid_argument naming
  /// a parameter that is missing, of the wrong type, out of bounds or not a choice.
  std::vector<double> encode(const ParamSet& point) const;
  /// decode(encode-able u) snapped back to the unit cube: what the point u really evaluates is.
  std::vector<double> snap(const std::vector<double>& u) const { return encode(decode(u)); }

  /// A canonical one-line description of every parameter (`lr:float:log:[1e-05,0.1];...`): two spaces with
  /// equal fingerprints describe the same parameters in the same order.
  std::string fingerprint() const;

 private:
  void add(Param p);
  std::vector<Param> params_;
};

}  // namespace trainkit::tune
