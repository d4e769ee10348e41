"""Mixed precision: which dtype each model-sized array has (the roundings: zero_ref/dtypes.py).

The ZeRO paper's memory model (Sec. 3.1) is mixed-precision Adam (Micikevicius et
al., 2018): 16-bit parameters (2 Psi bytes) and gradients (2 Psi) that the model
reads and writes, and in the optimizer K = 12 bytes per parameter of float32
state: master weights, m and v. The optimizer updates the float32 master weights;
the 16-bit parameters are the master weights rounded to 16 bits.

Here the model's math runs in float32 on 16-bit values, as tensor cores multiply
16-bit inputs and accumulate in float32: a unit's 16-bit parameters are widened
(exactly) when it runs, and its float32 gradients rounded to 16 bits once, when
written. Every rounding is to nearest, ties to even (NumPy's float16 cast,
ml_dtypes' bfloat16 cast), so the single-rank oracle can make the same roundings.

  fp32  everything float32; the master weights are the parameters themselves.
  fp16  IEEE half: 10 mantissa bits, max 65504; small gradients underflow, so the
        loss is scaled (zero_ref/optim/loss_scale.py).
  bf16  bfloat16 (ml_dtypes): float32's range, 7 mantissa bits; no loss scaling.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zero_ref.dtypes import ElementBytes, dtype_of, element_bytes, name_of


@dataclass(frozen=True)
class Precision:
    """The dtypes of one run: parameters, gradients (stored and accumulated), wire."""

    name: str
    param: np.dtype  # what the model reads: 16-bit, or float32
    grad: np.dtype  # gradient buffers and their accumulation (data_types.grad_accum_dtype)
    comm: np.dtype  # gradient reduction on the wire (communication_data_type)

    @classmethod
    def of(cls, cfg) -> Precision:
        """The dtypes a zero_ref.config.ZeroConfig asks for."""
        names = cfg.precision, cfg.grad_dtype, cfg.comm_dtype
        return cls(names[0], *(dtype_of(n) for n in names))

    @property
    def mixed(self) -> bool:
        """True when a float32 master copy exists beside 16-bit parameters."""
        return self.param != np.float32

    @property
    def bytes(self) -> ElementBytes:
        """Bytes per element, for the memory and communication formulas."""
        return element_bytes(self.name, name_of(self.grad), name_of(self.comm))

    @property
    def scaled(self) -> bool:
        """fp16 needs loss scaling; bf16 has float32's exponent range and does not."""
        return self.name == "fp16"
