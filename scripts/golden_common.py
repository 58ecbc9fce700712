"""What every golden file shares: the line that records where it was generated, and the values that the
freshness check (scripts/check_golden.py) must judge at float32's precision although they are stored as
float64 numbers.

A golden value computed in float32 moves in its last bits between CPUs (ATen's vectorised kernels, MKL's
GEMM and LAPACK paths and oneDNN differ between AVX2, AVX-512 and AMX machines); one computed in float64
does not, beyond BLAS's reassociation. The TOML files record the CPU they were written on so that a reader
of a difference knows which machine each side came from.
"""
import platform

import torch

# Values stored as float64 numbers that are functions of float32 results, per golden file: a dotted key
# path, "[]" standing for any array index. Stored float32 values need no entry (check_golden.py recognises
# them: every float32 number is a double exactly, a float64 result almost never is).
FLOAT32_DERIVED = {
    # The exponential smoothing is done in float64 over float32 losses of a bfloat16-autocast model; the
    # consumer (tests/tune/test_lr_finder.cpp) compares them at a relative 1e-6.
    "tune.toml": ["range_test_amp[].smoothed"],
}


def cpu_name():
    """The CPU's model name as the kernel reports it ("AMD EPYC", "Intel(R) Xeon(R) Platinum 8481C")."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def generated_on():
    """The comment line each golden TOML file carries second: the CPU and the kernels PyTorch chose."""
    return "# generated on: {} (ATen CPU capability {}, {} threads)\n".format(
        cpu_name(), torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())
