// trainkit::amp::Autocast: CPU matmuls run in the region's dtype and in float32 outside; nested guards
// (a different dtype, enabled = false) restore the enclosing state; leaving every guard restores the
// initial flag, dtype and nesting depth, also when unwinding; unsupported dtypes are named. CUDA cases
// that need a GPU are skipped without one.
#include <stdexcept>

#include <torch/torch.h>

#include "support.h"
#include "trainkit/amp.h"
#include "trainkit/compat.h"

using trainkit::amp::Autocast;
using trainkit::amp::is_autocast_dtype_supported;
using namespace trainkit::compat;

using trainkit::test::WhatContains;

namespace {

at::ScalarType mm_dtype(c10::Device device = torch::kCPU) {
  const auto a = torch::ones({4, 4}, torch::TensorOptions().device(device));
  return torch::mm(a, a).scalar_type();
}

struct AutocastState {
  bool enabled;
  c10::ScalarType dtype;
  bool cache_enabled;
  explicit AutocastState(c10::DeviceType device)
      : enabled(autocast_enabled(device)), dtype(autocast_dtype(device)), cache_enabled(autocast_cache_enabled()) {}
  bool operator==(const AutocastState& o) const {
    return enabled == o.enabled && dtype == o.dtype && cache_enabled == o.cache_enabled;
  }
};

/// The current nesting depth, read without changing it.
int nesting_depth() {
  const int depth = autocast_increment_nesting() - 1;
  autocast_decrement_nesting();
  return depth;
}

}  // namespace

TEST_CASE("Autocast runs CPU matmuls in bfloat16 inside the region and float32 outside", "[amp][autocast]") {
  const AutocastState initial(torch::kCPU);
  REQUIRE_FALSE(initial.enabled);
  REQUIRE(mm_dtype() == torch::kFloat32);
  {
    Autocast autocast(torch::kCPU, torch::kBFloat16);
    CHECK(autocast_enabled(torch::kCPU));
    CHECK(autocast_dtype(torch::kCPU) == torch::kBFloat16);
    CHECK(mm_dtype() == torch::kBFloat16);
    CHECK(nesting_depth() == 1);
    // Ops on autocast's float32 list stay float32, and float64 inputs are never cast.
    CHECK(torch::ones({3}).exp().scalar_type() == torch::kFloat32);
    const auto d = torch::ones({2, 2}, torch::kFloat64);
    CHECK(torch::mm(d, d).scalar_type() == torch::kFloat64);
  }
  CHECK(mm_dtype() == torch::kFloat32);
  CHECK(AutocastState(torch::kCPU) == initial);
  CHECK(nesting_depth() == 0);
}

TEST_CASE("Autocast guards nest and restore the enclosing flag and dtype", "[amp][autocast]") {
  const AutocastState initial(torch::kCPU);
  {
    Autocast outer(torch::kCPU, torch::kBFloat16);
    REQUIRE(mm_dtype() == torch::kBFloat16);

    SECTION("an inner guard with enabled = false gives float32") {
      {
        Autocast inner(torch::kCPU, torch::kBFloat16, /*enabled=*/false);
        CHECK_FALSE(autocast_enabled(torch::kCPU));
        CHECK(mm_dtype() == torch::kFloat32);
        CHECK(nesting_depth() == 2);
        {
          Autocast innermost(torch::kCPU, torch::kBFloat16);
          CHECK(mm_dtype() == torch::kBFloat16);
        }
        CHECK(mm_dtype() == torch::kFloat32);
      }
      CHECK(autocast_enabled(torch::kCPU));
      CHECK(mm_dtype() == torch::kBFloat16);
    }

    SECTION("an inner guard with another dtype (float16 where CPU autocast supports it)") {
      if (is_autocast_dtype_supported(torch::kCPU, torch::kHalf)) {
        Autocast inner(torch::kCPU, torch::kHalf);
        CHECK(autocast_dtype(torch::kCPU) == torch::kHalf);
        CHECK(mm_dtype() == torch::kHalf);
      } else {
        WARN("CPU autocast does not support float16 in this LibTorch; float16 region skipped");
      }
      CHECK(autocast_dtype(torch::kCPU) == torch::kBFloat16);
      CHECK(mm_dtype() == torch::kBFloat16);
    }

    SECTION("a disabled guard accepts any dtype and still restores the enclosing one, as in Python") {
      {
        Autocast inner(torch::kCPU, torch::kFloat64, /*enabled=*/false);
        CHECK(mm_dtype() == torch::kFloat32);
      }
      CHECK(autocast_dtype(torch::kCPU) == torch::kBFloat16);
      CHECK(mm_dtype() == torch::kBFloat16);
    }

    SECTION("the cache flag is set for the region and restored") {
      const bool before = autocast_cache_enabled();
      {
        Autocast inner(torch::kCPU, torch::kBFloat16, true, /*cache_enabled=*/!before);
        CHECK(autocast_cache_enabled() == !before);
      }
      CHECK(autocast_cache_enabled() == before);
    }
    CHECK(nesting_depth() == 1);
  }
  CHECK(AutocastState(torch::kCPU) == initial);
  CHECK(nesting_depth() == 0);
  CHECK(mm_dtype() == torch::kFloat32);
}

TEST_CASE("Autocast restores the state when an exception unwinds the region", "[amp][autocast]") {
  const AutocastState initial(torch::kCPU);
  try {
    Autocast autocast(torch::kCPU, torch::kBFloat16);
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  CHECK(AutocastState(torch::kCPU) == initial);
  CHECK(nesting_depth() == 0);
}

TEST_CASE("gradients of float32 leaves stay float32 when the forward ran under autocast", "[amp][autocast]") {
  auto w = torch::ones({3, 3}, torch::requires_grad());
  at::Tensor loss;
  {
    Autocast autocast(torch::kCPU, torch::kBFloat16);
    loss = torch::mm(torch::ones({2, 3}), w).sum();
  }
  CHECK(loss.scalar_type() == torch::kBFloat16);
  loss.backward();
  CHECK(w.grad().scalar_type() == torch::kFloat32);
  CHECK(torch::allclose(w.grad(), torch::full({3, 3}, 2.0)));
}

TEST_CASE("Autocast rejects a dtype autocast cannot use, naming it", "[amp][autocast]") {
  const AutocastState initial(torch::kCPU);
  CHECK_THROWS_MATCHES(Autocast(torch::kCPU, torch::kFloat64), std::invalid_argument, WhatContains("Double"));
  CHECK_THROWS_MATCHES(Autocast(torch::kCPU, torch::kFloat32), std::invalid_argument, WhatContains("Float"));
  CHECK_THROWS_MATCHES(Autocast(torch::kCUDA, torch::kFloat64), std::invalid_argument, WhatContains("Double"));
  CHECK_THROWS_AS(Autocast(c10::kMPS, torch::kHalf), std::invalid_argument);
  CHECK(AutocastState(torch::kCPU) == initial);
  CHECK(nesting_depth() == 0);
}

TEST_CASE("Autocast on CUDA sets and restores the CUDA flag and dtype", "[amp][autocast][cuda]") {
  // The flags are thread-local state: no GPU is needed to set and restore them.
  const AutocastState initial(torch::kCUDA);
  const AutocastState initial_cpu(torch::kCPU);
  for (const auto dtype : {torch::kHalf, torch::kBFloat16}) {
    {
      Autocast autocast(torch::kCUDA, dtype);
      CHECK(autocast_enabled(torch::kCUDA));
      CHECK(autocast_dtype(torch::kCUDA) == dtype);
      CHECK(AutocastState(torch::kCPU) == initial_cpu);
      CHECK(mm_dtype() == torch::kFloat32);  // CPU ops are not affected by CUDA autocast
    }
    CHECK(AutocastState(torch::kCUDA) == initial);
  }
}

TEST_CASE("Autocast on CUDA casts matmuls and restores float32", "[amp][autocast][cuda]") {
  if (!torch::cuda::is_available()) {
    TRAINKIT_SKIP("no CUDA device: CUDA matmuls need a GPU");
  }
  for (const auto dtype : {torch::kHalf, torch::kBFloat16}) {
    Autocast autocast(torch::kCUDA, dtype);
    CHECK(mm_dtype(torch::kCUDA) == dtype);
  }
  CHECK(mm_dtype(torch::kCUDA) == torch::kFloat32);
}

TEST_CASE("loss_for_backward takes a half or bfloat16 loss to float32 and leaves float32 and float64 alone",
          "[amp][autocast]") {
  const at::Tensor f32 = torch::tensor(0.25f);
  for (const auto low : {torch::kHalf, torch::kBFloat16}) {
    const at::Tensor converted = trainkit::amp::loss_for_backward(f32.to(low));
    CHECK(converted.scalar_type() == torch::kFloat32);
    CHECK(converted.item<float>() == 0.25f);
  }
  CHECK(trainkit::amp::loss_for_backward(f32).is_same(f32));
  const at::Tensor f64 = torch::tensor(1.0 / 3.0, torch::kFloat64);
  CHECK(trainkit::amp::loss_for_backward(f64).is_same(f64));  // no precision lost
}
