"""The reduction kernel's staging buffer (``memlens._reduce_scratch``)
against the buffers real recordings hold: every ``gpu_reduce_kernel``
allocation of the H100 recordings in tests/corpus/fit (C++ stacks), with
the tensor each reduced (a bias's gradient: batch x tokens x width)."""

import pytest

from memlens._reduce_scratch import reduction_scratch


def contiguous(shape):
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return tuple(strides)


# (recording, tensor summed, dims, staging bytes, semaphore bytes) as recorded.
RECORDED = [
    # vit.b16: 16 images x 65 tokens; the MLP's, attention's and projections' biases.
    ("vit.b16", (16, 65, 2048), (0, 1), 17825792, 64),
    ("vit.b16", (16, 65, 1536), (0, 1), 13369344, 48),
    ("vit.b16", (16, 65, 512), (0, 1), 4456448, 16),
    ("vit.b32", (32, 65, 2048), (0, 1), 34603008, 64),
    ("vit.b32", (32, 65, 1536), (0, 1), 25952256, 48),
    ("vit.b32", (32, 65, 512), (0, 1), 8650752, 16),
    # gpt.b4 / hf_gpt2.b4: 4 x 256 tokens.
    ("gpt.b4", (4, 256, 2048), (0, 1), 16777216, 64),
    ("gpt.b4", (4, 256, 1536), (0, 1), 12582912, 48),
    ("gpt.b4", (4, 256, 512), (0, 1), 4194304, 16),
]


@pytest.mark.parametrize("recording,shape,dims,staging,semaphores", RECORDED)
def test_a_bias_gradient_s_staging_buffer_is_the_recorded_one(recording, shape, dims, staging, semaphores):
    assert reduction_scratch(shape, contiguous(shape), dims, 4, 4) == (staging, semaphores)


def test_the_patch_embedding_s_bias_gradient_sums_a_permuted_gradient():
    # vit.b32: convolution_backward sums grad_output (32, 512, 8, 8) over
    # (0, 2, 3); the gradient is the permute of a contiguous (32, 64, 512)
    # tensor, so its rows walk memory as one: 8 MiB recorded (and three more
    # 16-byte semaphore blocks than the 512-wide biases account for).
    strides = (64 * 512, 1, 8 * 512, 512)
    assert reduction_scratch((32, 512, 8, 8), strides, (0, 2, 3), 4, 4) == (8388608, 16)


def test_short_reductions_stay_within_a_block():
    # The same runs at batch 2 (512 tokens) and the ViT at batch 4 recorded no staging.
    for shape in [(2, 256, 512), (2, 256, 2048), (4, 65, 512), (4, 65, 2048)]:
        assert reduction_scratch(shape, contiguous(shape), (0, 1), 4, 4) == (0, 0)
    # A contiguous NCHW convolution's bias: each channel's values lie apart.
    assert reduction_scratch((32, 512, 8, 8), contiguous((32, 512, 8, 8)), (0, 2, 3), 4, 4) == (0, 0)
    # Nothing to reduce.
    assert reduction_scratch((0, 512), (512, 1), (0,), 4, 4) == (0, 0)


def test_the_buffer_grows_with_fewer_multiprocessors_to_fill_less():
    shape = (16, 65, 2048)
    h100 = reduction_scratch(shape, contiguous(shape), (0, 1), 4, 4)
    small = reduction_scratch(shape, contiguous(shape), (0, 1), 4, 4, sms=8, threads_per_sm=1536)
    assert small[0] < h100[0]
