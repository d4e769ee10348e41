"""The GPU path (docs/gpu.md): is a GPU usable, device arrays and copies (DeviceArrays,
HostArrays' twin), the engine's placement and update phase on the device, ZeRO-Offload,
CUDA-aware MPI. Below comm (which stages device buffers with these copies) and above
optim (whose CUDA kernels DeviceCompute runs); the kernels themselves sit beside their
NumPy twins: zero_ref/optim/*_cuda.py, zero_ref/numerics/rounding_cuda.py,
zero_ref/models/layers_cuda.py."""
