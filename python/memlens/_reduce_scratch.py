"""The scratch memory of PyTorch's CUDA reduction kernel (``sum``, ``mean``),
which no fake tensor shows: the kernel's own staging buffer for a reduction
split across thread blocks, asked of the caching allocator and given back
when the kernel is launched.

A bias's gradient is such a reduction: the output's gradient summed over
the batch and sequence, a few thousand columns each summed over thousands of
rows. PyTorch then splits every column's sum across up to a few dozen blocks
(to fill the GPU) and stages the partial sums in global memory: 4 bytes x
columns x blocks x 128 for a float sum, 17 MiB for a 2048-wide bias over
1,040 rows on an H100, at the backward's peak. A ViT's recording holds 75
of them in three steps (tests/corpus/fit/vit.b16), and the fake trace without
them was 6.5% under the GPU's reserved peak.

The figures follow ``setReduceConfig`` and ``gpu_reduce_kernel`` in
``aten/src/ATen/native/cuda/Reduce.cuh`` (PyTorch 2.11). The model is
memlens's one rulebook for them, in Rust (``memlens::fit::reduce_scratch``),
which ``memlens fit`` also uses to compute them at other batch sizes from
small probes; this module only normalises the arguments. Checked against
the staging buffers of real recordings (``tests/python/test_reduce_scratch.py``
and the Rust module's tests). Not modelled: a reduction too large for 32-bit
indexing (split into several kernels) and the other reductions (``amax``,
``var``, norms), whose buffers are smaller or rarer in training.
"""

from typing import Optional, Sequence, Tuple

from . import _native


def reduction_scratch(
    shape: Sequence[int],
    strides: Sequence[int],
    reduced: Sequence[int],
    elem_size: int,
    acc_size: int,
    sms: Optional[int] = None,
    threads_per_sm: Optional[int] = None,
) -> Tuple[int, int]:
    """``(staging buffer bytes, semaphore bytes)`` PyTorch's CUDA sum or mean
    of a tensor of ``shape`` and ``strides`` (elements of ``elem_size``
    bytes) over the dimensions ``reduced`` (negative ones counted from the
    end) allocates, accumulating in ``acc_size`` bytes, on a GPU of ``sms``
    multiprocessors of ``threads_per_sm`` threads (None: an H100's or
    H200's, the Rust model's default); (0, 0) when it reduces within each
    block."""
    ndim = len(shape)
    dims = sorted({d % ndim for d in reduced}) if ndim else []
    return tuple(
        _native.reduction_scratch(
            [int(s) for s in shape], [int(s) for s in strides], dims, elem_size, acc_size, sms, threads_per_sm
        )
    )
