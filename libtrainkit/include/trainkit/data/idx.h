#pragma once
/// @file
/// Readers for the IDX format (MNIST, Fashion-MNIST), plain or gzip'd as Debian ships them.

#include <cstdint>
#include <stdexcept>
#include <string>

#include <ATen/core/Tensor.h>
#include <torch/data/datasets/base.h>
#include <torch/data/example.h>

namespace trainkit::data {

/// Raised for any unreadable or inconsistent data file; what() names the file and the problem.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Reads one IDX file (gzip'd or not, detected from its first bytes) into a uint8 tensor of the
/// shape its header gives. Only the unsigned-byte element type (0x08) is accepted.
/// Throws DataError on a missing file, bad magic, truncated data, a corrupt gzip stream or trailing bytes.
at::Tensor read_idx(const std::string& path);

/// Mean and standard deviation of Fashion-MNIST's training pixels scaled to [0, 1].
constexpr double kFashionMnistMean = 0.2860;
constexpr double kFashionMnistStd = 0.3530;

/// Images and labels of one split of an MNIST-like data set.
struct ImageSet {
  at::Tensor images;  ///< float32 [N, 1, H, W] normalized (load_mnist_split), or uint8 (load_mnist_split_uint8)
  at::Tensor labels;  ///< int64 [N], class indices
};

/// Loads `train` (60k) or `t10k` (10k) images and labels from `dir`, accepting both `NAME` and
/// `NAME.gz`. Checks that counts agree and labels lie in [0, 9]; `limit` > 0 keeps the first `limit`.
/// Pixels are scaled to [0,1] then normalized by (x - mean) / std.
ImageSet load_mnist_split(const std::string& dir, bool train, int64_t limit = 0, double mean = kFashionMnistMean,
                          double std = kFashionMnistStd);
/// The same split with the pixels as stored: `images` uint8 [N, 1, H, W] (for normalizing on the
/// training device: 4x fewer bytes move than float32). Same checks and errors as load_mnist_split.
ImageSet load_mnist_split_uint8(const std::string& dir, bool train, int64_t limit = 0);

/// A `torch::data` dataset over an ImageSet, for code written against `torch::data` loaders.
/// For speed prefer TensorLoader, which slices the preloaded tensors directly.
class MnistDataset : public torch::data::datasets::Dataset<MnistDataset> {
 public:
  /// Wraps an already loaded split.
  explicit MnistDataset(ImageSet set);
  /// Example `index`: image [1, H, W] and label (scalar int64).
  torch::data::Example<> get(size_t index) override;
  /// Number of examples.
  torch::optional<size_t> size() const override;

 private:
  ImageSet set_;
};

}  // namespace trainkit::data
