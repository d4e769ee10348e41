"""The model's math on device arrays: given arrays of another module (CuPy on a GPU;
here zero_ref/testing/emulated_device.py's DeviceArray, as strict as CuPy) every layer
runs its twin in that module, never a Numba kernel or a host array; the results are
the NumPy run's to float32 rounding (the twins are not the kernels' bits)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from zero_ref.models.gpt import GPT, GPTConfig
from zero_ref.models.layers import gelu_forward, layernorm_forward
from zero_ref.models.mlp import CharMLP, MLPConfig
from zero_ref.models.unit import init_params, loss_and_grads
from zero_ref.numerics.array_module import array_module
from zero_ref.testing.emulated_device import EMULATED, DeviceArray, to_device

GPT_TINY = GPTConfig(vocab_size=13, context=6, n_layer=2, n_head=2, d_model=8)


def batch(vocab: int, shape: tuple[int, int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab, shape), rng.integers(0, vocab, shape)  # host ids


@pytest.mark.parametrize(
    "model",
    [GPT(GPT_TINY), CharMLP(MLPConfig(vocab_size=13, context=4, d_embed=6, d_hidden=10))],
    ids=["gpt", "char-mlp"],
)
def test_forward_and_backward_on_device_arrays_match_the_host(model):
    host_params = init_params(model, seed=3)
    ids, targets = batch(13, (3, 6 if isinstance(model, GPT) else 4), seed=1)
    if not isinstance(model, GPT):
        targets = targets[:, 0]
    loss, grads = loss_and_grads(model, host_params, ids, targets)
    device_params = {k: to_device(v) for k, v in host_params.items()}
    device_loss, device_grads = loss_and_grads(model, device_params, ids, targets)
    assert device_loss == pytest.approx(loss, rel=1e-6)
    for name, grad in grads.items():
        assert type(device_grads[name]) is DeviceArray, name  # stayed on the device
        np.testing.assert_allclose(
            EMULATED.asnumpy(device_grads[name]), grad, rtol=2e-4, atol=2e-7, err_msg=name
        )


def test_the_emulated_device_refuses_what_cupy_refuses():
    """The emulation can fail: each mistake a GPU would punish raises here."""
    x = to_device(np.ones(4, np.float32))
    with pytest.raises(TypeError, match="host array"):
        x + np.ones(4, np.float32)  # host array mixed in
    with pytest.raises(TypeError, match="host array"):
        np.copyto(np.empty(4, np.float32), x)  # copy out without .get()
    with pytest.raises(ValueError, match="cannot be used for fill"):
        x[...] = np.ones(4, np.float32)  # a host array assigned in without xp.asarray
    with pytest.raises(TypeError, match="float64"):
        x.get(out=np.empty(4, np.float64))  # CuPy's copies do not cast
    with pytest.raises(TypeError, match="bfloat16"):
        x.view(ml_dtypes.bfloat16)
    with pytest.raises(TypeError, match="bfloat16"):
        x.astype(ml_dtypes.bfloat16)
    assert array_module(x) is EMULATED and array_module(np.ones(2)) is np
    y, s = gelu_forward(x)  # the twin ran, in the device's module
    assert type(y) is DeviceArray and type(s) is DeviceArray
    y, cache = layernorm_forward(x.reshape(1, 4), x, x)
    assert type(y) is DeviceArray and type(cache.rstd) is DeviceArray
