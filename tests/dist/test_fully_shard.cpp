// ZeRO stage 3 (FullyShardedDataParallel) in several processes on loopback: tests/dist/dist_worker.cpp's "fsdp"
// mode under `trainkit launch` (or alone, as one rank), compared with one process training on the full batch
// with the unsharded optimizer (zero_common.h's reference).
#include <filesystem>
#include <fstream>

#include <torch/torch.h>

#include "dist/dist_common.h"
#include "dist/zero_common.h"
#include "support.h"
#include "trainkit/dist/fully_shard.h"
#include "trainkit/io/safetensors.h"

using Catch::Matchers::Contains;

namespace fsdp_test {

/// Bytes of the unsharded model's parameters.
int64_t parameter_bytes(const std::vector<at::Tensor>& params) {
  int64_t bytes = 0;
  for (const auto& p : params) bytes += static_cast<int64_t>(p.nbytes());
  return bytes;
}

}  // namespace fsdp_test

TEST_CASE("ZeRO-3 over 2 ranks equals DDP with the unsharded optimizer, with accumulation, global-norm clipping and "
          "layer-decay param groups, and holds 1/world of the bytes plus one unit",
          "[dist][fsdp]") {
  using namespace zero_test;
  struct Variant {
    const char* optim;
    const char* extra;
  };
  // Accumulation: the first micro-batch of each step under no_sync, the second reduces to the owners; with
  // --sync-every both reduce (the owners add the second's gradients to the means they hold).
  for (const Variant v : {Variant{"adam", ""}, Variant{"adamw", ""}, Variant{"sgd", ""}, Variant{"lamb", ""},
                          Variant{"layer_decay", ""}, Variant{"sgd", " --sync-every"}}) {
    DYNAMIC_SECTION(v.optim << v.extra) {
      TempDir tmp("fsdp");
      const int64_t steps = 4;
      const double clip = 0.005;
      const Outcome out = two_ranks("--optim " + std::string(v.optim) + v.extra +
                                        " --steps 4 --accum 2 --clip 0.005 --out " + tmp.str(),
                                    tmp, "fsdp.txt", "fsdp");
      INFO(out.output);
      REQUIRE(out.code == 0);
      const Reference ref = reference(v.optim, steps, 2, clip);
      // The test can fail: clipping is active at every step, and training moves the parameters.
      for (double norm : ref.norms) CHECK(norm > clip);
      CHECK(largest_difference(td::snapshot(*td::make_chain_net(7)), ref.params) > 1e-4);
      CHECK(largest_difference(params_of(tmp.str("rank0.pt")), ref.params) <= 1e-10);
      const int64_t full_params = fsdp_test::parameter_bytes(ref.params);
      const int64_t unsharded = full_params + ref.gradient_bytes + ref.state_bytes;
      for (int64_t r = 0; r < 2; ++r) {
        const int64_t params = reported(out.output, r, "parameter bytes ");
        const int64_t grads = reported(out.output, r, "gradient bytes ");
        const int64_t state = reported(out.output, r, "optimizer state bytes ");
        const int64_t unit = reported(out.output, r, "largest unit ");
        CHECK(unit == 8 * (8 * 8 + 8));  // a hidden Linear in float64
        WARN(v.optim << v.extra << " rank " << r << ": parameters " << params << " B, gradients " << grads
                     << " B, optimizer state " << state << " B; unsharded " << full_params << " + "
                     << ref.gradient_bytes << " + " << ref.state_bytes << " B: "
                     << static_cast<double>(params + grads + state) / static_cast<double>(unsharded)
                     << " of the unsharded bytes");
        CHECK(params + grads + state <= unsharded / 2 + unit);
        // Between passes a rank holds its own parameters only; while a unit runs, that unit's on top.
        CHECK(params < full_params * 6 / 10);
        CHECK(reported(out.output, r, "after forward ") == params);
        CHECK(reported(out.output, r, "peak ") <= params + unit);
        CHECK(reported(out.output, r, "peak ") > params);
        CHECK(reported(out.output, r, "units left gathered ") == 0);
      }
      // An evaluation forward (no autograd) frees every unit it gathered and gives the unsharded model's
      // logits; the full state dict lands on rank 0 only.
      CHECK_THAT(out.output, Contains("rank 0: evaluation: units left gathered 0, largest difference from the "
                                      "unsharded model 0\n"));
      CHECK_THAT(out.output, Contains("[rank 1] rank 1: full state dict entries 0"));
    }
  }
}

TEST_CASE("ZeRO-3 with a GradScaler: an inf in one rank's shard makes every rank skip the step", "[dist][fsdp]") {
  using namespace zero_test;
  TempDir tmp("fsdp-scaler");
  const Outcome out = two_ranks("--optim adam --steps 5 --clip 0.05 --scaler --out " + tmp.str(), tmp, "scaler.txt",
                                "fsdp");
  INFO(out.output);
  REQUIRE(out.code == 0);
  CHECK_THAT(out.output, Contains("[rank 0] rank 0: skipped steps: 2; scale 512"));
  CHECK_THAT(out.output, Contains("[rank 1] rank 1: skipped steps: 2; scale 512"));
  CHECK(largest_difference(params_of(tmp.str("rank0.pt")), reference("adam", 5, 1, 0.05, 2).params) <= 1e-10);
}

TEST_CASE("ZeRO-3 sharded checkpoints: resume bitwise, 2 ranks into 1 and 1 into 2", "[dist][fsdp]") {
  using namespace zero_test;
  TempDir tmp("fsdp-ckpt");
  const std::string common = "--optim lamb --data-steps 8 --steps ";
  const auto launch = [&](bool two, const std::string& args, const std::string& name) {
    std::filesystem::create_directories(tmp.str(name));
    const Outcome out = two ? two_ranks(args + " --out " + tmp.str(name), tmp, name + ".txt", "fsdp")
                            : one_rank(args + " --out " + tmp.str(name), tmp, name + ".txt", "fsdp");
    INFO(out.output);
    REQUIRE(out.code == 0);
    return params_of(tmp.str(name + "/rank0.pt"));
  };
  const auto expected = launch(true, common + "8", "whole");
  CHECK(largest_difference(expected, reference("lamb", 8, 1, 0.0).params) <= 1e-10);
  launch(true, common + "4 --save-dir " + tmp.str("two"), "first");
  CHECK(std::filesystem::exists(tmp.str("two/fsdp_shard_1_of_2.pt")));
  CHECK(bitwise_equal(launch(true, common + "8 --load-dir " + tmp.str("two"), "resumed"), expected));
  CHECK(largest_difference(launch(false, common + "8 --load-dir " + tmp.str("two"), "into_one"), expected) <= 1e-10);
  launch(false, common + "4 --save-dir " + tmp.str("one"), "one");
  CHECK(largest_difference(launch(true, common + "8 --load-dir " + tmp.str("one"), "into_two"), expected) <= 1e-10);
  // A shard missing: the error names it.
  std::filesystem::remove(tmp.str("two/fsdp_shard_1_of_2.pt"));
  const Outcome missing =
      one_rank(common + "8 --load-dir " + tmp.str("two") + " --out " + tmp.str("into_one"), tmp, "missing.txt", "fsdp");
  CHECK(missing.code != 0);
  CHECK_THAT(missing.output, Contains("needs the shard of rank 1 of the 2-rank run"));
}

TEST_CASE("ZeRO-3: unknown units, parameters in no unit or in two, and unknown unit names are refused",
          "[dist][fsdp]") {
  auto pg = trainkit::dist::ProcessGroup::init(trainkit::dist::InitOptions());
  auto net = td::make_chain_net(1);
  const auto factory = [](std::vector<at::Tensor> p) { return td::make_zero_test_optimizer("sgd", std::move(p)); };
  using trainkit::dist::FullyShardedDataParallel;
  std::vector<std::string> units;
  for (int i = 0; i < 12; ++i) units.push_back("layer" + std::to_string(i));
  CHECK_THROWS_WITH(FullyShardedDataParallel(net, units, pg, factory), Contains("parameter 'head.weight' is in no unit"));
  auto twice = units;
  twice.push_back("head");
  twice.push_back("layer3");
  CHECK_THROWS_WITH(FullyShardedDataParallel(net, twice, pg, factory),
                    Contains("parameter 'layer3.weight' is in units 'layer3' and 'layer3'"));
  auto unknown = units;
  unknown.push_back("tail");
  CHECK_THROWS_WITH(FullyShardedDataParallel(net, unknown, pg, factory),
                    Contains("the model has no submodule 'tail' (its children: layer0, "));
  units.push_back("head");
  FullyShardedDataParallel fsdp(net, units, pg, factory);
  CHECK(fsdp.unit_index("head") == 12);
  CHECK_THROWS_WITH(fsdp.unit_index("tail"), Contains("no unit 'tail' (units: layer0, "));
  // One rank: nothing is sharded, a unit runs as it is.
  const at::Tensor x = torch::randn({3, 8}, torch::kFloat64);
  CHECK(torch::equal(fsdp.run(0, [&](const at::Tensor& in) { return net->layers[0]->forward(in); }, x),
                     net->layers[0]->forward(x)));
  CHECK(fsdp.local_parameter_bytes() == fsdp_test::parameter_bytes(net->parameters()));
}

TEST_CASE("trainkit train under the launcher with [zero] stage = 3: the model of plain DDP, sharded checkpoints "
          "resumed on 1 process, hooks that read every parameter refused",
          "[dist][fsdp][cli]") {
  using namespace zero_test;
  TempDir tmp("fsdp-train");
  // SGD with momentum, 2-step accumulation, the gradient norm clipped (by the norm over both shards), batch
  // norm (buffers broadcast from rank 0, updated again by the recomputation in backward).
  const std::string config = tmp.str("tiny.toml");
  std::ofstream(config) << "[data]\nval_size = 100\nlimit_train = 600\nlimit_test = 200\n"
                           "[model]\nchannels = [4, 8]\nhidden = 16\ndropout = 0.0\n"
                           "[optimizer]\nname = \"sgd\"\nlr = 0.05\nmomentum = 0.9\n"
                           "[train]\nepochs = 2\nbatch_size = 25\nseed = 3\nthreads = 1\n"
                           "[grad]\nclip_norm = 0.5\naccumulation_steps = 2\n"
                           "[checkpoint]\nevery_steps = 4\n[log]\nprogress = \"lines\"\n"
                           "[distributed]\nbackend = \"gloo\"\ntimeout = 20\nbucket_cap_mb = 0.01\n";
  const auto train = [&](const std::string& name, const std::string& extra, bool launch = true) {
    return train_job(config, tmp, name, extra, launch);
  };
  const auto summary = [&tmp](const std::string& name, const std::string& key) {
    return summary_number(trainkit::test::read_text(tmp.str(name + "/summary.json")), key);
  };
  // Rank 0's exported weights (gathered from both ranks' shards) against plain DDP's.
  const auto largest_weight_difference = [&tmp](const std::string& a, const std::string& b) {
    const auto wa = trainkit::io::load_safetensors(tmp.str(a + "/model.safetensors")).tensors;
    const auto wb = trainkit::io::load_safetensors(tmp.str(b + "/model.safetensors")).tensors;
    REQUIRE(wa.size() == wb.size());
    double d = 0;
    for (const auto& item : wa) {
      const at::Tensor* other = wb.find(item.key());
      REQUIRE(other != nullptr);
      d = std::max(d, (item.value().to(at::kDouble) - other->to(at::kDouble)).abs().max().item<double>());
    }
    return d;
  };
  train("plain", "");
  const std::string sharded = train("sharded", "--set zero.stage=3");
  CHECK_THAT(sharded, Contains("units fully sharded"));
  CHECK_THAT(sharded, Contains("zero: stage 3, 1 param group, rank 0 owns"));
  CHECK(summary("sharded", "zero_stage") == 3);
  CHECK(summary("sharded", "optimizer_state_bytes") < summary("plain", "optimizer_state_bytes"));
  CHECK(std::abs(summary("sharded", "test_loss") - summary("plain", "test_loss")) < 1e-4);
  CHECK(largest_weight_difference("sharded", "plain") < 1e-5);
  // `trainkit checkpoint` verifies a commit record's shards against it; a shard changed after the commit
  // (one bit) is an error naming it.
  const std::string cli = TRAINKIT_CLI_PATH;
  const std::string commit = tmp.str("sharded/checkpoints/ckpt-000000010.commit");
  const Outcome verified = run(cli + " checkpoint " + commit, tmp, "verify.txt");
  CHECK(verified.code == 0);
  CHECK_THAT(verified.output, Contains(commit + ": ok, step 10 committed by 2 ranks"));
  CHECK_THAT(verified.output, Contains("ckpt-000000010.rank1-of-2.tkpt: ok, epoch 2 batch 0 step 10"));
  const std::string shard = tmp.str("sharded/checkpoints/ckpt-000000010.rank1-of-2.tkpt");
  const std::string original = trainkit::test::read_text(shard);
  std::string flipped = original;
  flipped[flipped.size() / 2] = static_cast<char>(flipped[flipped.size() / 2] ^ 1);
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << flipped;
  const Outcome damaged = run(cli + " checkpoint " + commit, tmp, "damaged.txt");
  CHECK(damaged.code != 0);
  CHECK_THAT(damaged.output, Contains("ckpt-000000010.rank1-of-2.tkpt"));
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << original;
  // Each rank's shard of every checkpoint (its parameters, not the full model) resumes on 1 process,
  // resharded: it continues as the whole checkpoint of plain DDP does.
  CHECK_THAT(train("sharded", "--set zero.stage=3 --resume auto --set train.epochs=3", false),
             Contains("(saved by 2 ranks, resharded onto 1)"));
  train("plain", "--resume auto --set train.epochs=3", false);
  CHECK(summary("sharded", "steps") == summary("plain", "steps"));
  CHECK(std::abs(summary("sharded", "test_loss") - summary("plain", "test_loss")) < 1e-4);
  CHECK(largest_weight_difference("sharded", "plain") < 1e-5);
  // A hook that reads every parameter on every rank, and a model without Sequential units, are refused.
  const Outcome ema = run(cli + " train --config " + config + " --out " + tmp.str("ema") +
                              " --set zero.stage=3 --set ema.enabled=true",
                          tmp, "ema.txt");
  CHECK(ema.code != 0);
  CHECK_THAT(ema.output, Contains("[zero] stage = 3 shards the parameters (each rank holds its own between the units' "
                                  "passes), but ema.enabled averages every parameter on every rank: use stage 2"));
}
