// Anchor of the precompiled header that trainkit's apps, benchmarks and tests share (see TrainkitHelpers.cmake).
