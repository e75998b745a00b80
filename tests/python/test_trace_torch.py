"""The tracer's view of PyTorch's defaults against the real torch, with no
GPU (fake CUDA tensors need none until a backward pass): an optimizer built
without ``foreach=``/``fused=`` picks its multi-tensor kernels for fake CUDA
parameters inside ``memlens._trace._fake_as_plain_tensors``, as it does for
real ones on a GPU, and PyTorch is left as it was after. Run by
frameworks.sh (tests/gpu/fake_curve.py checks the traces on an H200)."""

import pytest

torch = pytest.importorskip("torch")


def _fake_linear():
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        model = torch.nn.Linear(8, 8, device="cuda")
    return mode, list(model.parameters())


def test_an_optimizer_s_default_is_foreach_for_fake_cuda_parameters_while_tracing():
    import torch.optim.optimizer as optimizer
    import torch.utils._foreach_utils as foreach_utils

    from memlens._trace import _fake_as_plain_tensors

    mode, params = _fake_linear()
    before = (list(optimizer._foreach_supported_types), list(foreach_utils._foreach_supported_types))
    with mode:
        # PyTorch alone: a fake parameter is not a plain tensor, the loop runs.
        assert optimizer._default_to_fused_or_foreach(params, False) == (False, False)
        with _fake_as_plain_tensors(torch):
            assert optimizer._default_to_fused_or_foreach(params, False) == (False, True)
            assert foreach_utils._has_foreach_support(params, params[0].device)
            for p in params:
                p.grad = torch.ones_like(p)
            opt = torch.optim.AdamW(params)
            opt.step()
            assert set(opt.state[params[0]]) == {"step", "exp_avg", "exp_avg_sq"}
        assert optimizer._default_to_fused_or_foreach(params, False) == (False, False)
    assert (list(optimizer._foreach_supported_types), list(foreach_utils._foreach_supported_types)) == before
