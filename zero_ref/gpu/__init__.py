"""The GPU path: device kernels beside their NumPy twins, CUDA-aware MPI (docs/gpu.md)."""
