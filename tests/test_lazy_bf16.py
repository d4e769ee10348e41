"""bfloat16's dtype is made on first use: an fp32 or fp16 run never imports ml_dtypes
(about 0.7 s of CPU per rank), and bf16 arrays made before zero_ref asked for bf16 still
round with the bf16 kernel, not NumPy's cast. Each case runs in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_training_entry_point_does_not_import_ml_dtypes() -> None:
    code = "import sys, zero_ref.train; print('ml_dtypes' in sys.modules)"
    assert _run(code) == "False"


def test_asking_for_bf16_imports_it_once() -> None:
    code = (
        "import sys; from zero_ref.numerics.dtypes import DTYPES, dtype_of, name_of\n"
        "assert list(DTYPES) == ['fp32', 'fp16', 'bf16'] and 'ml_dtypes' not in sys.modules\n"
        "d = dtype_of('bf16'); assert DTYPES['bf16'] is d and name_of(d) == 'bf16'\n"
        "print(d.name, 'ml_dtypes' in sys.modules)"
    )
    assert _run(code) == "bfloat16 True"


def test_bf16_arrays_made_outside_round_and_widen_with_the_kernels() -> None:
    # A negative signalling NaN becomes the canonical quiet NaN 0x7FC0 under zero_ref's
    # rule, where ml_dtypes' own cast keeps its sign (0xFFC0): so a fall back to NumPy's
    # cast fails this test. 1 + 2^-8 is a tie (to even: 1); 1 + 3 * 2^-9 rounds up.
    code = (
        "import ml_dtypes, numpy as np\n"
        "from zero_ref.numerics import rounding\n"
        "from zero_ref.numerics.dtypes import round_into, widen_into, HOST\n"
        "x = np.array([1 + 2**-8, 1 + 3 * 2**-9, -0.0, np.inf, 0], np.float32)\n"
        "x.view(np.uint32)[4] = 0xFF800001\n"
        "y = round_into(np.empty(5, ml_dtypes.bfloat16), x)\n"
        "assert y.view(np.uint16)[4] == 0x7FC0, hex(y.view(np.uint16)[4])\n"
        "want = np.empty(5, np.uint16)\n"
        "rounding.round_bf16_reference(x.view(np.uint32), want)\n"
        "assert (y.view(np.uint16) == want).all(), (y.view(np.uint16), want)\n"
        "z = np.empty(4, ml_dtypes.bfloat16); z[...] = x[:4]\n"
        "back = widen_into(np.empty(4, np.float32), z)\n"
        "print(back.tolist(), HOST.dtype_name(y))"
    )
    assert _run(code) == "[1.0, 1.0078125, -0.0, inf] bfloat16"
