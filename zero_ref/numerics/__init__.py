"""Numbers below every layer: the float formats and rounding between them, block
quantization, the rank-order sum, the array module, and what every CUDA kernel shares."""
