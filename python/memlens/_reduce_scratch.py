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
``aten/src/ATen/native/cuda/Reduce.cuh`` (PyTorch 2.11): TensorIterator's
view of the input (reduced dimensions first, each group ordered by stride,
neighbours merged), the block shape, the split across warps and blocks, and
``global_memory_size()`` / ``semaphore_size()``. They depend on the GPU's
multiprocessor count and threads per multiprocessor (an H100's: 132 and
2048). Checked against the staging buffers of real recordings
(``tests/python/test_reduce_scratch.py``). Not modelled: a reduction too large
for 32-bit indexing (split into several kernels) and the other reductions
(``amax``, ``var``, norms), whose buffers are smaller or rarer in training.
"""

from typing import List, Sequence, Tuple

# An H100's (and an H200's): the defaults of reduction_scratch.
HOPPER_SMS = 132
HOPPER_THREADS_PER_SM = 2048
_WARP = 32
_MAX_THREADS = 512  # mnt_wrapper<T>::MAX_NUM_THREADS for every real type
_MIN_VALUES_PER_THREAD = 16
_MAX_VALUES_PER_THREAD = 256
_VT0 = 4  # sum's and mean's vt0 and input_vec_size


def _div_up(a: int, b: int) -> int:
    return (a + b - 1) // b


def _last_pow2(n: int) -> int:
    """The largest power of two not above n (at least 1), as Reduce.cuh's."""
    return 1 << (max(1, n).bit_length() - 1)


def _iterator_view(
    shape: Sequence[int], strides: Sequence[int], reduced: Sequence[int], elem: int
) -> Tuple[List[int], List[int], List[int]]:
    """TensorIterator's dimensions for a reduction of a tensor of ``shape``
    and ``strides`` (elements) over the dimensions ``reduced``: (shape, input
    strides in bytes, output strides in bytes), fastest first, reduced
    dimensions first, neighbours that walk memory as one merged."""
    ndim = len(shape)
    out_strides = [0] * ndim
    step = elem
    for d in reversed(range(ndim)):
        if d not in reduced:
            out_strides[d] = step if shape[d] != 1 else 0
            step *= shape[d]
    in_strides = [s * elem for s in strides]
    ops = [out_strides, in_strides]

    def should_swap(d0: int, d1: int) -> int:
        for n, st in enumerate(ops):
            s0, s1 = st[d0], st[d1]
            if n == 0 and (s0 == 0) != (s1 == 0):
                return 1 if s1 == 0 else -1
            if s0 == 0 or s1 == 0:
                continue
            if s0 < s1:
                return -1
            if s0 > s1:
                return 1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    perm = list(reversed(range(ndim)))
    for i in range(1, ndim):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            c = should_swap(perm[d0], perm[d1])
            if c > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif c < 0:
                break
    sh = [shape[p] for p in perm]
    st = [[o[p] for p in perm] for o in ops]
    # coalesce_dimensions
    prev = 0
    for d in range(1, len(sh)):
        if sh[prev] == 1 or sh[d] == 1 or all(sh[prev] * s[prev] == s[d] for s in st):
            if sh[prev] == 1:
                for s in st:
                    s[prev] = s[d]
            sh[prev] *= sh[d]
        else:
            prev += 1
            if prev != d:
                for s in st:
                    s[prev] = s[d]
                sh[prev] = sh[d]
    n = prev + 1 if sh else 0
    return sh[:n], st[1][:n], st[0][:n]


def reduction_scratch(
    shape: Sequence[int],
    strides: Sequence[int],
    reduced: Sequence[int],
    elem_size: int,
    acc_size: int,
    sms: int = HOPPER_SMS,
    threads_per_sm: int = HOPPER_THREADS_PER_SM,
) -> Tuple[int, int]:
    """``(staging buffer bytes, semaphore bytes)`` PyTorch's CUDA sum or mean
    of a tensor of ``shape`` and ``strides`` (elements of ``elem_size``
    bytes) over the dimensions ``reduced`` allocates, accumulating in
    ``acc_size`` bytes; (0, 0) when it reduces within each block."""
    numel = 1
    for s in shape:
        numel *= s
    if numel == 0:
        return (0, 0)
    reduced = sorted({d % len(shape) for d in reduced}) if len(shape) else []
    sh, in_st, out_st = _iterator_view(shape, strides, reduced, elem_size)
    ndim = len(sh)
    num_reduce = sum(1 for s in out_st if s == 0)
    num_outputs = 1
    for size, o in zip(sh, out_st):
        if o != 0:
            num_outputs *= size
    inputs_per_output = numel // num_outputs
    if ndim > 0:
        on_fastest = num_reduce == ndim or in_st[0] < in_st[num_reduce]
        if on_fastest:
            dim0, dim1, fastest = inputs_per_output, num_outputs, in_st[0]
        else:
            dim0, dim1, fastest = num_outputs, inputs_per_output, in_st[num_reduce]
    else:
        on_fastest, dim0, dim1, fastest = True, 1, 1, elem_size
    output_vec = 1
    if fastest == elem_size:
        if on_fastest and dim0 >= 128 and num_reduce == 1:
            dim0 //= _VT0
        elif not on_fastest:
            output_vec = 4
            for n in [sh[num_reduce]] + [s // elem_size for j, s in enumerate(in_st) if j != num_reduce]:
                while n % output_vec:
                    output_vec //= 2
            dim0 //= output_vec
    # set_block_dimension
    max_t = _MAX_THREADS // output_vec
    d0 = _last_pow2(dim0) if dim0 < max_t else max_t
    d1 = _last_pow2(dim1) if dim1 < max_t else max_t
    width = min(d0, _WARP)
    height = min(d1, max_t // width)
    width = min(d0, max_t // height)
    threads = width * height
    step_in, step_out = 1, 1
    block_x_reduce = False
    if ndim == 0 or on_fastest:
        block_x_reduce = True
        step_in *= width
    else:
        step_out *= width
    split_warps = False
    if _div_up(inputs_per_output, step_in) >= min(height * 16, _MAX_VALUES_PER_THREAD):
        split_warps = True
        step_in *= height
    else:
        step_out *= height
    grid_x = _div_up(num_outputs // output_vec, step_out)
    target = sms * (threads_per_sm // threads)
    values = _div_up(inputs_per_output, step_in)
    if not (split_warps and values >= _MAX_VALUES_PER_THREAD and grid_x <= target):
        return (0, 0)
    ctas = max(min(_div_up(target, grid_x), _div_up(values, _MIN_VALUES_PER_THREAD)),
               _div_up(values, _MAX_VALUES_PER_THREAD))
    if ctas <= 1:
        return (0, 0)
    size = acc_size * num_outputs * ctas
    if not block_x_reduce:
        size *= width * output_vec
    return (size, 4 * grid_x)
