#pragma once
// A non-CPU device for dist_worker: LibTorch's PrivateUse1, registered as "testdev" with two devices
// (testdev:0, testdev:1), whose memory is host memory. It lets the multi-process tests see what the CPU
// cannot: which backend of a process group carries a device tensor (a tensor here reports is_cpu() ==
// false, as a CUDA tensor does), and which device is current on a thread (the current device is
// thread-local, as CUDA's, and starts at 0 on every thread).
// Ops without a kernel of their own run through ATen's boxed CPU fallback (at::native::cpu_fallback).
// What it does not model: streams (one default stream per device), asynchrony, memory limits.
// Only dist_worker links it; trainkit_tests' own test accelerator is separate.

#include <c10/core/Device.h>

namespace trainkit::test::dist {

/// Registers the device (once; later calls do nothing) and returns testdev:`index` (0 or 1).
c10::Device host_device(int index = 0);

/// The current testdev device of the calling thread (its index).
int current_host_device();

}  // namespace trainkit::test::dist
