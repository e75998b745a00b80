"""The pattern of a measured kernel call (memlens._kernel_scratch): what the
allocator's trace of one real call says it allocated, returned and freed."""

from memlens._kernel_scratch import MEASURED_OPS, call_pattern


def alloc(addr, size, *functions):
    return {"action": "alloc", "addr": addr, "size": size, "frames": [{"name": f} for f in functions]}


RUN_CONV_PLAN = "at::native::run_conv_plan(cudnnContext*, at::Tensor const&, at::Tensor const&)"


def free(addr, size, action="free_requested"):
    return {"action": action, "addr": addr, "size": size}


def test_a_convolution_backward_returns_two_gradients_around_its_workspaces():
    # cuDNN's backward as PyTorch runs it: the input's gradient, its
    # workspace, then the weight's gradient and its own workspace.
    entries = [
        alloc(0x1000, 4096),
        {"action": "segment_alloc", "addr": 0x9000, "size": 2 << 20},
        alloc(0x2000, 1 << 20, "at::native::cudnn_convolution_backward_input", RUN_CONV_PLAN),
        free(0x2000, 1 << 20),
        free(0x2000, 1 << 20, "free_completed"),
        alloc(0x3000, 512),
        alloc(0x4000, 8 << 20, "at::native::contiguous"),
        free(0x4000, 8 << 20),
    ]
    # The first scratch block is cuDNN's workspace (its stack says so), the
    # second a copy the call made.
    assert call_pattern(entries) == [
        ("output", 4096),
        ("alloc", 0, 1 << 20, True),
        ("free", 0),
        ("output", 512),
        ("alloc", 1, 8 << 20, False),
        ("free", 1),
    ]


def test_an_address_reused_inside_the_call_is_two_blocks():
    entries = [alloc(0x2000, 1024), free(0x2000, 1024), alloc(0x2000, 1024), free(0x2000, 1024),
               alloc(0x2000, 2048)]
    assert call_pattern(entries) == [("alloc", 0, 1024, False), ("free", 0), ("alloc", 1, 1024, False),
                                     ("free", 1), ("output", 2048)]


def test_a_free_of_a_block_made_before_the_call_is_not_the_call_s():
    assert call_pattern([free(0x5000, 512), alloc(0x6000, 512)]) == [("output", 512)]


def test_the_measured_operators_are_cudnn_s_convolutions():
    # Not attention: its fp32 backward crashed on uninitialised inputs.
    assert MEASURED_OPS == {"convolution", "convolution_backward"}


def test_with_the_user_s_own_recording_on_each_layout_is_counted_unmeasured_once():
    # A stand-in for torch whose allocator is already recording: nothing is
    # run, and each layout (not each call) counts once.
    import types

    from memlens._kernel_scratch import KernelScratch

    class Tensor:
        def __init__(self, shape):
            self.shape, self.dtype, self.device = shape, "float32", types.SimpleNamespace(type="cuda")

        def stride(self):
            return (1,) * len(self.shape)

    def record(enabled="all", context="all", stacks="all", max_entries=0, clear_history=False):
        raise AssertionError("a measurement must not touch the user's recording")

    torch = types.SimpleNamespace(
        Tensor=Tensor,
        _C=types.SimpleNamespace(_cuda_isHistoryEnabled=lambda: True),
        backends=types.SimpleNamespace(cudnn=types.SimpleNamespace(benchmark=False, deterministic=False,
                                                                   allow_tf32=True)),
        cuda=types.SimpleNamespace(memory=types.SimpleNamespace(_record_memory_history=record)),
    )
    scratch = KernelScratch(torch)
    assert not scratch.enabled
    for shape in [(8, 3), (8, 3), (16, 3)]:
        assert scratch.pattern("convolution", [Tensor(shape)], {}) is None
    assert (scratch.measured, scratch.unmeasured) == (0, 2)
