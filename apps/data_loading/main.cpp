// data_loading: what worker threads, pinned memory and on-device preprocessing buy. Fashion-MNIST images
// are stored zlib-compressed (upscaled, so that decoding costs what a real image does) and decoded and
// augmented per sample by a ParallelLoader, swept over num_workers; then the host-to-device measurements
// of the notes: pinned vs pageable copies, uint8 + normalize on the device vs float32 from the host, and
// tensors created on the device vs created on the host and moved; and what each batch transform costs on
// the CPU per batch of Fashion-MNIST images (crop, flip, random erasing). Every table interleaves its
// configurations over --rounds rounds and prints medians. The CUDA tables need a GPU and say so without one.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <thread>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <zlib.h>

#include "trainkit/app/cli.h"
#include "trainkit/app/main.h"
#include "trainkit/app/stats.h"
#include "trainkit/data/idx.h"
#include "trainkit/data/parallel_loader.h"
#include "trainkit/data/transforms.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace data = trainkit::data;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

using trainkit::app::median;

/// Fashion-MNIST images upscaled to side x side, each stored zlib-compressed, with their labels.
struct CompressedImages {
  std::vector<std::vector<Bytef>> blobs;
  at::Tensor labels;
  int64_t side = 0;
};

CompressedImages compress(const std::string& dir, int64_t limit, int64_t side) {
  const auto set = data::load_mnist_split(dir, true, limit);
  // back to the file's uint8 pixels (load_mnist_split normalizes with mean 0.2860, std 0.3530)
  at::Tensor pixels = ((set.images * 0.3530 + 0.2860) * 255).round();
  pixels = torch::nn::functional::interpolate(
      pixels, torch::nn::functional::InterpolateFuncOptions().size(std::vector<int64_t>{side, side}).mode(
                  torch::kBilinear).align_corners(false));
  pixels = pixels.clamp(0, 255).to(torch::kUInt8).contiguous();
  CompressedImages out;
  out.labels = set.labels;
  out.side = side;
  const auto bytes = static_cast<uLong>(side * side);
  for (int64_t i = 0; i < pixels.size(0); ++i) {
    std::vector<Bytef> blob(compressBound(bytes));
    uLongf len = blob.size();
    if (compress2(blob.data(), &len, pixels[i].data_ptr<uint8_t>(), bytes, 6) != Z_OK) {
      throw std::runtime_error("zlib compress2 failed");
    }
    blob.resize(len);
    out.blobs.push_back(std::move(blob));
  }
  return out;
}

/// The per-sample work: inflate the image `repeats` times (the cost knob), then RandomCrop(padding 4)
/// and a horizontal flip drawn from the sample's generator.
data::ParallelLoader::SampleFn decode_sample(const CompressedImages& images, int64_t repeats) {
  return [&images, repeats](int64_t i, at::Generator& gen) {
    const int64_t side = images.side;
    at::Tensor image = torch::empty({1, 1, side, side}, torch::kUInt8);
    const auto& blob = images.blobs[static_cast<size_t>(i)];
    for (int64_t r = 0; r < repeats; ++r) {
      uLongf len = static_cast<uLongf>(side * side);
      if (uncompress(image.data_ptr<uint8_t>(), &len, blob.data(), blob.size()) != Z_OK) {
        throw std::runtime_error(fmt::format("image {}: corrupt zlib stream", i));
      }
    }
    image = data::random_horizontal_flip(data::random_crop(image, 4, gen), 0.5, gen);
    return data::Batch(image.squeeze(0), images.labels[i]);
  };
}

struct SweepRow {
  int64_t workers;
  std::vector<double> seconds;
};

void worker_sweep(const CompressedImages& images, const std::vector<int64_t>& workers, int64_t repeats,
                  int64_t batch_size, int64_t rounds, const std::string& csv) {
  const auto sample = decode_sample(images, repeats);
  const int64_t n = static_cast<int64_t>(images.blobs.size());
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::vector<SweepRow> rows;
  for (const int64_t w : workers) {
    rows.push_back({w, {}});
  }
  int64_t batches = 0;
  for (int64_t round = 0; round < rounds; ++round) {
    for (auto& row : rows) {
      // One whole epoch, from the first request to the last batch: no work is left in flight at the end to
      // flatter or penalize a worker count.
      const auto options =
          data::ParallelLoaderOptions().batch_size(batch_size).drop_last(true).seed(0).num_workers(row.workers);
      data::ParallelLoader loader(n, sample, options);
      loader.set_epoch(round);
      batches = loader.num_batches();
      const auto start = Clock::now();
      while (loader.next()) {
      }
      row.seconds.push_back(seconds_since(start) / static_cast<double>(batches));
    }
  }
  const double base = median(rows.front().seconds);
  fmt::print("\nnum_workers sweep: epochs of {} batches of {} {}x{} uint8 images, {} rounds (medians), {} cores\n",
             batches, batch_size, images.side, images.side, rounds, cores);
  fmt::print("{:>11} {:>10} {:>10} {:>10} {:>10} {:>15}\n", "num_workers", "batches/s", "samples/s", "ms/sample",
             "speed-up", "ideal speed-up");
  std::ofstream out;
  if (!csv.empty()) {
    out.open(csv);
    out << "num_workers,batches_per_s,samples_per_s,ms_per_sample,speedup,ideal_speedup\n";
  }
  for (const auto& row : rows) {
    const double s = median(row.seconds);
    const double ideal = row.workers == 0 ? 1.0 : static_cast<double>(std::min<int64_t>(row.workers, cores));
    const double per_sample_ms = 1e3 * s / static_cast<double>(batch_size);
    fmt::print("{:>11} {:>10.1f} {:>10.0f} {:>10.3f} {:>9.2f}x {:>14.0f}x\n", row.workers, 1 / s, batch_size / s,
               per_sample_ms, base / s, ideal);
    if (out) {
      out << fmt::format("{},{:.3f},{:.1f},{:.4f},{:.3f},{:.0f}\n", row.workers, 1 / s, batch_size / s, per_sample_ms,
                         base / s, ideal);
    }
  }
  if (rows.front().workers == 0) {
    fmt::print("(one sample costs {:.2f} ms in the calling thread: --decode-repeats sets it)\n",
               1e3 * base / static_cast<double>(batch_size));
  }
}

/// Median seconds of `f` over `rounds` interleaved rounds, each followed by a CUDA synchronize.
template <class... F>
std::vector<double> interleaved(int64_t rounds, F... fs) {
  std::vector<std::function<void()>> runs{fs...};
  std::vector<std::vector<double>> times(runs.size());
  for (int64_t r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < runs.size(); ++i) {
      torch::cuda::synchronize();
      const auto start = Clock::now();
      runs[i]();
      torch::cuda::synchronize();
      times[i].push_back(seconds_since(start));
    }
  }
  std::vector<double> out;
  for (auto& t : times) {
    out.push_back(median(t));
  }
  return out;
}

void pinned_vs_pageable(int64_t batch_size, int64_t side, int64_t rounds) {
  fmt::print("\npinned vs pageable host memory (host -> device copy of a float32 batch [{}, 3, {}, {}])\n",
             batch_size, side, side);
  if (!torch::cuda::is_available()) {
    fmt::print("  needs a CUDA device: none is available here, so nothing is measured\n");
    return;
  }
  const at::Tensor pageable = torch::rand({batch_size, 3, side, side});
  const at::Tensor pinned = pageable.pin_memory();
  const double gb = static_cast<double>(pageable.nbytes()) / 1e9;
  pageable.to(torch::kCUDA);  // warm-up: context and caching allocator
  const auto t = interleaved(
      rounds, [&] { pageable.to(torch::kCUDA); }, [&] { pinned.to(torch::kCUDA, /*non_blocking=*/true); });
  fmt::print("{:>10} {:>10} {:>10}\n", "memory", "ms", "GB/s");
  fmt::print("{:>10} {:>10.3f} {:>10.2f}\n", "pageable", 1e3 * t[0], gb / t[0]);
  fmt::print("{:>10} {:>10.3f} {:>10.2f}\n", "pinned", 1e3 * t[1], gb / t[1]);
}

void host_vs_device_normalize(int64_t batch_size, int64_t side, int64_t rounds) {
  const at::Tensor images = torch::randint(0, 256, {batch_size, 1, side, side}, torch::kUInt8);
  const std::vector<double> mean{0.2860}, std{0.3530};
  fmt::print("\nnormalize on the host vs on the device (batch [{}, 1, {}, {}])\n", batch_size, side, side);
  fmt::print("  bytes moved per batch: uint8 {} B, float32 {} B ({}x)\n", images.nbytes(), images.nbytes() * 4, 4);
  if (!torch::cuda::is_available()) {
    // Without a device the copy is the part that cannot be measured; the host work the loader saves is.
    std::vector<double> t;
    for (int64_t r = 0; r < rounds; ++r) {
      const auto start = Clock::now();
      data::normalize(images, mean, std);
      t.push_back(seconds_since(start));
    }
    fmt::print("  CPU time of normalize (the host path's extra work per batch): {:.3f} ms (median)\n",
               1e3 * median(t));
    fmt::print("  the copy and the on-device path need a CUDA device: none is available here\n");
    return;
  }
  const at::Tensor pinned = images.pin_memory();
  const auto t = interleaved(
      rounds,
      [&] { data::normalize(pinned, mean, std).pin_memory().to(torch::kCUDA, true); },
      [&] { data::normalize(pinned.to(torch::kCUDA, true), mean, std); });
  fmt::print("{:>28} {:>10}\n", "path", "ms");
  fmt::print("{:>28} {:>10.3f}\n", "host normalize, pin, f32 copy", 1e3 * t[0]);
  fmt::print("{:>28} {:>10.3f}\n", "uint8 copy, device normalize", 1e3 * t[1]);
}

void create_on_device(int64_t batch_size, int64_t side, int64_t rounds) {
  fmt::print("\ntensors created on the device vs created on the host and moved (randn [{}, 3, {}, {}])\n",
             batch_size, side, side);
  if (!torch::cuda::is_available()) {
    fmt::print("  needs a CUDA device: none is available here, so nothing is measured\n");
    return;
  }
  const std::vector<int64_t> shape{batch_size, 3, side, side};
  torch::randn(shape, torch::kCUDA);  // warm-up
  const auto t = interleaved(
      rounds, [&] { torch::randn(shape, torch::TensorOptions().device(torch::kCUDA)); },
      [&] { torch::randn(shape).to(torch::kCUDA); });
  fmt::print("{:>28} {:>10}\n", "creation", "ms");
  fmt::print("{:>28} {:>10.3f}\n", "torch::randn(..., device)", 1e3 * t[0]);
  fmt::print("{:>28} {:>10.3f}\n", "torch::randn(...).to(device)", 1e3 * t[1]);
}

void batch_transform_costs(int64_t batch_size, int64_t rounds) {
  fmt::print("\nbatch transforms on the CPU (float32 batch [{}, 1, 28, 28], generator draws included)\n", batch_size);
  const at::Tensor images = torch::rand({batch_size, 1, 28, 28});
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(0);
  // CPU work only: timed here rather than by interleaved(), which synchronizes a CUDA device.
  const std::vector<std::function<void()>> runs{
      [&] { data::random_crop(images, 2, gen); }, [&] { data::random_horizontal_flip(images, 0.5, gen); },
      [&] { data::random_erasing(images, 0.5, {0.02, 0.33}, {0.3, 3.3}, 0.0, gen); },
      [&] { data::random_erasing(images, 1.0, {0.02, 0.33}, {0.3, 3.3}, 0.0, gen); }};
  std::vector<std::vector<double>> times(runs.size());
  for (int64_t r = 0; r < std::max<int64_t>(rounds, 20); ++r) {
    for (size_t i = 0; i < runs.size(); ++i) {
      const auto start = Clock::now();
      runs[i]();
      times[i].push_back(seconds_since(start));
    }
  }
  std::vector<double> t;
  for (auto& v : times) {
    t.push_back(median(v));
  }
  fmt::print("{:>28} {:>10}\n", "transform", "ms");
  fmt::print("{:>28} {:>10.3f}\n", "random_crop(padding 2)", 1e3 * t[0]);
  fmt::print("{:>28} {:>10.3f}\n", "random_horizontal_flip(0.5)", 1e3 * t[1]);
  fmt::print("{:>28} {:>10.3f}\n", "random_erasing(p 0.5)", 1e3 * t[2]);
  fmt::print("{:>28} {:>10.3f}\n", "random_erasing(p 1)", 1e3 * t[3]);
}

}  // namespace

int main(int argc, char** argv) {
  trainkit::app::Cli cli{"Data loading: num_workers sweep of a ParallelLoader on decoded + augmented Fashion-MNIST, "
                         "pinned vs pageable copies, host vs device normalization, creating tensors on the device, "
                         "the batch transforms' CPU cost"};
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t limit = 1024;
  int64_t side = 112;
  int64_t repeats = 75;
  int64_t batch_size = 32;
  int64_t rounds = 3;
  std::vector<int64_t> workers{0, 1, 2, 4, 8};
  std::string csv;
  cli.option("--data-dir", data_dir, "Directory with the gzip'd IDX files").show_default();
  cli.option("--limit", limit, "Training images to compress and load (one epoch is timed)").show_default().positive();
  cli.option("--side", side, "Images are upscaled to side x side before compression").show_default().range(8, 1024);
  cli.option("--decode-repeats", repeats, "Inflate each image this many times (the per-sample cost knob)")
      .show_default()
      .positive();
  cli.option("--batch-size", batch_size, "Samples per batch").show_default().positive();
  cli.option("--rounds", rounds, "Interleaved rounds (medians are printed)").show_default().positive();
  cli.option("--workers", workers, "num_workers values of the sweep (the first is the baseline)").show_default()
      .non_negative();
  cli.option("--csv", csv, "Also write the sweep's table here");
  if (auto rc = cli.parse(argc, argv)) return *rc;
  trainkit::app::set_log_level("info");

  return trainkit::app::run_main([&] {
    if (limit < batch_size) {
      throw std::invalid_argument(
          fmt::format("--limit {} is less than one batch (--batch-size {})", limit, batch_size));
    }
    const auto start = Clock::now();
    const CompressedImages images = compress(data_dir, limit, side);
    size_t stored = 0;
    for (const auto& b : images.blobs) {
      stored += b.size();
    }
    fmt::print("{} images of {}x{} compressed to {:.1f} KiB on average ({:.1f} s to prepare)\n",
               images.blobs.size(), side, side, static_cast<double>(stored) / images.blobs.size() / 1024,
               seconds_since(start));
    worker_sweep(images, workers, repeats, batch_size, rounds, csv);
    pinned_vs_pageable(batch_size * 4, 224, std::max<int64_t>(rounds, 5));
    host_vs_device_normalize(batch_size * 4, 224, std::max<int64_t>(rounds, 5));
    create_on_device(batch_size * 4, 224, std::max<int64_t>(rounds, 5));
    batch_transform_costs(batch_size * 4, rounds);
    return 0;
  });
}
