"""The optimizer's kernels, each beside its NumPy twin: AdamW, the gradient norm,
NaN/Inf checks, the learning-rate schedule; the CUDA twins in *_cuda.py beside them
(imported by the GPU path only)."""
