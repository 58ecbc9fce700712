// The test accelerator itself (device/testdev.h): it counts each kind of copy to the host once, each
// copy to the device once, nothing for ops that stay on the device, gives each device its own generator,
// and refuses a CPU tensor mixed into a device op as a GPU does.
#include <filesystem>

#include <ATen/DeviceAccelerator.h>
#include <torch/torch.h>

#include "device/testdev.h"
#include "support.h"
#include "trainkit/subprocess.h"

using trainkit::test::test_device;
using trainkit::test::TransferCounter;

// Run in a fresh process by the case below: linking the test device registers nothing.
TEST_CASE("the test device is registered by its first use, not by linking it", "[.testdev-first-use]") {
  CHECK_FALSE(c10::is_privateuse1_backend_registered());
  CHECK(at::getAccelerator(false) != std::optional<c10::DeviceType>(c10::DeviceType::PrivateUse1));
  CHECK(test_device(1).str() == "testdev:1");
  CHECK(c10::is_privateuse1_backend_registered());
  // Why it waits: a registered PrivateUse1 backend is torch's accelerator from then on, so the autograd of a
  // CUDA tensor finds no stream (an internal assert in every backward) and pin_memory() asks this device.
  CHECK(at::getAccelerator(false) == std::optional<c10::DeviceType>(c10::DeviceType::PrivateUse1));
}

TEST_CASE("a process that never uses the test device keeps CUDA as torch's accelerator", "[testdev]") {
  trainkit::test::TempDir tmp("testdev-first-use");
  trainkit::Subprocess child(
      trainkit::SubprocessOptions()
          .argv({std::filesystem::read_symlink("/proc/self/exe").string(), "[.testdev-first-use]"})
          .log_file(tmp.str("child.log")));
  const auto status = child.wait();
  INFO(trainkit::test::read_text(tmp.str("child.log")));
  CHECK(status.ok());
}

TEST_CASE("The test device counts every copy to the host once", "[testdev]") {
  const at::Tensor x = torch::arange(6, torch::kFloat32).reshape({2, 3}).to(test_device());
  TransferCounter counter;
  int64_t expected = 1;
  SECTION("item") {
    CHECK(x.sum().item<float>() == 15.0f);
  }
  SECTION("a truth value") {
    CHECK(static_cast<bool>((x.sum() > 1).item<bool>()));
    CHECK(counter.to_host() == 1);
    CHECK((x > 1).any().is_nonzero());
    expected = 2;
  }
  SECTION(".cpu()") {
    CHECK(x.cpu().sum().item<float>() == 15.0f);  // the item() is the CPU's: not counted
  }
  SECTION(".to(kCPU) with a dtype") {
    CHECK(x.to(torch::kCPU, torch::kFloat64)[1][2].item<double>() == 5.0);
  }
  SECTION("copy_ into a CPU tensor") {
    at::Tensor host = torch::zeros({2, 3});
    host.copy_(x);
    CHECK(host.equal(torch::arange(6, torch::kFloat32).reshape({2, 3})));
  }
  SECTION("equal") {
    CHECK(x.equal(x.clone()));
  }
  SECTION("nonzero: an output shaped by the data") {
    CHECK(x.nonzero().size(0) == 5);
  }
  INFO(counter.causes());
  CHECK(counter.to_host() == expected);
  CHECK(counter.to_device() == 0);
}

TEST_CASE("The test device counts every copy to the device once", "[testdev]") {
  const at::Tensor host = torch::ones({4});
  TransferCounter counter;
  const at::Tensor a = host.to(test_device());
  CHECK(counter.to_device() == 1);
  at::Tensor b = torch::zeros({4}, torch::TensorOptions().device(test_device()));
  b.copy_(host);
  CHECK(counter.to_device() == 2);
  const at::Tensor c = torch::tensor({1.0f, 2.0f}, torch::TensorOptions().device(test_device()));
  CHECK(counter.to_device() == 3);
  CHECK(counter.to_host() == 0);
  CHECK(a.device() == test_device());
  CHECK(c.device() == test_device());
}

TEST_CASE("Ops that stay on the test device count nothing", "[testdev]") {
  torch::manual_seed(0);
  const auto dev = torch::TensorOptions().device(test_device());
  auto model = torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Dropout(0.5),
                                     torch::nn::Linear(8, 3));
  model->to(test_device());
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const at::Tensor x = torch::randn({5, 4}, dev);
  const at::Tensor y = torch::randint(0, 3, {5}, dev.dtype(torch::kLong));
  TransferCounter counter;
  for (int step = 0; step < 2; ++step) {
    sgd.zero_grad();
    const at::Tensor loss = torch::cross_entropy_loss(model->forward(x), y);
    loss.backward();
    torch::nn::utils::clip_grad_value_(model->parameters(), 1.0);  // (LibTorch's clip_grad_norm_ returns a double: a read)
    sgd.step();
  }
  at::Tensor views = x.t().narrow(0, 1, 2).reshape({-1}).clone();
  views.mul_(2).add_(x.view({-1}).slice(0, 0, 10));
  const at::Tensor other_device = views.to(test_device(1));
  const at::Tensor mean = views.mean() + other_device.to(test_device(0)).sum();
  INFO(counter.causes());
  CHECK(counter.to_host() == 0);
  CHECK(counter.to_device() == 0);
  CHECK(other_device.device() == test_device(1));
  CHECK(mean.device() == test_device(0));
  // The values are the CPU's.
  const at::Tensor expected = x.cpu().t().narrow(0, 1, 2).reshape({-1}) * 2 + x.cpu().view({-1}).slice(0, 0, 10);
  CHECK(torch::allclose(views.cpu(), expected));
}

TEST_CASE("Views on the test device alias its memory", "[testdev]") {
  at::Tensor x = torch::zeros({3, 4}, torch::TensorOptions().device(test_device()));
  x.select(0, 1).fill_(2.0);
  x.view({-1}).narrow(0, 0, 2).add_(1.0);
  x.t()[3].copy_(torch::full({3}, 5.0));
  const at::Tensor expected = torch::tensor({{1.f, 1.f, 0.f, 5.f}, {2.f, 2.f, 2.f, 5.f}, {0.f, 0.f, 0.f, 5.f}});
  CHECK(torch::equal(x.cpu(), expected));
}

TEST_CASE("Each test device draws from a generator of its own", "[testdev]") {
  const auto on = [](int i) { return torch::TensorOptions().device(test_device(i)); };
  torch::manual_seed(7);  // seeds the CPU and every test device alike
  const at::Tensor cpu_first = torch::rand({8});
  torch::manual_seed(7);
  const at::Tensor dev0_first = torch::rand({8}, on(0));
  const at::Tensor dev1_first = torch::rand({8}, on(1));
  // Same seed, same algorithm: each stream starts where the CPU's starts; drawing on one device leaves the
  // CPU's and the other device's streams where they were.
  CHECK(torch::equal(dev0_first.cpu(), cpu_first));
  CHECK(torch::equal(dev1_first.cpu(), cpu_first));
  CHECK(torch::equal(torch::rand({8}), cpu_first));

  at::Generator gen0 = at::globalContext().defaultGenerator(test_device(0));
  CHECK(gen0.device() == test_device(0));
  at::Tensor saved;
  {
    std::lock_guard<std::mutex> lock(gen0.mutex());
    saved = gen0.get_state();
  }
  const at::Tensor dropped = torch::dropout(torch::ones({64}, on(0)), 0.5, true);
  const at::Tensor noise = torch::randn({4}, on(0));
  {
    std::lock_guard<std::mutex> lock(gen0.mutex());
    gen0.set_state(saved);
  }
  CHECK(torch::equal(torch::dropout(torch::ones({64}, on(0)), 0.5, true).cpu(), dropped.cpu()));
  CHECK(torch::equal(torch::randn({4}, on(0)).cpu(), noise.cpu()));
  // An explicit generator of the device is used as it is.
  at::Generator own = at::globalContext().getAcceleratorHooksInterface(c10::DeviceType::PrivateUse1).getNewGenerator(0);
  own.set_current_seed(3);
  at::Generator cpu_gen = at::make_generator<at::CPUGeneratorImpl>(3);
  CHECK(torch::equal(at::empty({5}, on(0)).uniform_(0, 1, own).cpu(), at::empty({5}).uniform_(0, 1, cpu_gen)));
}

TEST_CASE("A CPU tensor in an op on the test device fails as on a GPU", "[testdev]") {
  const at::Tensor x = torch::ones({3}, torch::TensorOptions().device(test_device()));
  CHECK_THROWS_WITH(x + torch::ones({3}), Catch::Contains("same device"));
  CHECK_THROWS_WITH(torch::mm(x.view({1, 3}), torch::ones({3, 1})), Catch::Contains("same device"));
  // As on CUDA, a 0-dimensional CPU tensor is a scalar and mixes in.
  CHECK((x * torch::tensor(2.0f)).device() == test_device());
}
