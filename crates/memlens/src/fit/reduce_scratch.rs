//! The scratch memory of PyTorch's CUDA reduction kernel (`sum`, `mean`):
//! the staging buffer of a reduction split across thread blocks, asked of
//! the caching allocator and given back when the kernel is launched.
//!
//! A bias's gradient is such a reduction: the output's gradient summed over
//! the batch and sequence. Past a few thousand rows PyTorch splits every
//! column's sum across blocks (to fill the GPU) and stages the partial sums
//! in global memory, 17 MiB for a 2048-wide bias over 1,040 rows on an
//! H100, at the backward's peak. A probe at a small batch runs no such
//! split, so a prediction at a larger one must add them ([`super::probes`]).
//!
//! The figures follow `setReduceConfig` and `gpu_reduce_kernel` in
//! `aten/src/ATen/native/cuda/Reduce.cuh` (PyTorch 2.11): TensorIterator's
//! view of the input, the block shape, the split across warps and blocks,
//! and `global_memory_size()` / `semaphore_size()`. This is memlens's one
//! model of them: the fake tracer calls it too, through
//! `memlens._native.reduction_scratch` (`python/memlens/_reduce_scratch.py`).

/// An H100's (and an H200's) multiprocessors.
pub const HOPPER_SMS: u64 = 132;
/// An H100's (and an H200's) threads per multiprocessor.
pub const HOPPER_THREADS_PER_SM: u64 = 2048;

const WARP: u64 = 32;
/// `mnt_wrapper<T>::MAX_NUM_THREADS` for every real type.
const MAX_THREADS: u64 = 512;
const MIN_VALUES_PER_THREAD: u64 = 16;
const MAX_VALUES_PER_THREAD: u64 = 256;
/// `sum`'s and `mean`'s `vt0` and `input_vec_size`.
const VT0: u64 = 4;

/// The GPU a reduction runs on, as the kernel's launch shape sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// Streaming multiprocessors.
    pub sms: u64,
    /// Threads per multiprocessor.
    pub threads_per_sm: u64,
}

impl Default for Gpu {
    /// An H100's or H200's.
    fn default() -> Self {
        Gpu {
            sms: HOPPER_SMS,
            threads_per_sm: HOPPER_THREADS_PER_SM,
        }
    }
}

/// One reduction: the tensor summed and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reduction {
    /// The input's shape.
    pub shape: Vec<u64>,
    /// The input's strides, in elements.
    pub strides: Vec<u64>,
    /// The dimensions reduced.
    pub reduced: Vec<usize>,
    /// Bytes of one input element.
    pub elem_size: u64,
    /// Bytes of the accumulator (4 for floating types but double).
    pub acc_size: u64,
}

impl Reduction {
    /// A sum of a contiguous `rows x width` matrix over its rows: a bias's
    /// gradient (the output's gradient over the batch and sequence).
    pub fn over_rows(rows: u64, width: u64, elem_size: u64) -> Reduction {
        Reduction {
            shape: vec![rows, width],
            strides: vec![width, 1],
            reduced: vec![0],
            elem_size,
            acc_size: 4,
        }
    }

    /// `(staging buffer bytes, semaphore bytes)` the CUDA kernel allocates
    /// on `gpu`; `(0, 0)` when it reduces within each block.
    pub fn scratch(&self, gpu: Gpu) -> (u64, u64) {
        let numel: u64 = self.shape.iter().product();
        if numel == 0 || self.shape.len() != self.strides.len() {
            return (0, 0);
        }
        let (sh, in_st, out_st) = iterator_view(self);
        let ndim = sh.len();
        let elem = self.elem_size;
        let num_reduce = out_st.iter().filter(|&&s| s == 0).count();
        let num_outputs: u64 = sh
            .iter()
            .zip(&out_st)
            .filter(|(_, &o)| o != 0)
            .map(|(&s, _)| s)
            .product();
        let inputs_per_output = numel / num_outputs.max(1);
        let (on_fastest, mut dim0, dim1, fastest) = if ndim > 0 {
            let on_fastest = num_reduce == ndim || in_st[0] < in_st[num_reduce];
            if on_fastest {
                (true, inputs_per_output, num_outputs, in_st[0])
            } else {
                (false, num_outputs, inputs_per_output, in_st[num_reduce])
            }
        } else {
            (true, 1, 1, elem)
        };
        let mut output_vec = 1u64;
        if fastest == elem {
            if on_fastest && dim0 >= 128 && num_reduce == 1 {
                dim0 /= VT0;
            } else if !on_fastest {
                output_vec = 4;
                let others = in_st
                    .iter()
                    .enumerate()
                    .filter(|&(j, _)| j != num_reduce)
                    .map(|(_, &s)| s / elem);
                for n in std::iter::once(sh[num_reduce]).chain(others) {
                    while output_vec > 1 && n % output_vec != 0 {
                        output_vec /= 2;
                    }
                }
                dim0 /= output_vec;
            }
        }
        // set_block_dimension
        let max_t = MAX_THREADS / output_vec;
        let d0 = if dim0 < max_t { last_pow2(dim0) } else { max_t };
        let d1 = if dim1 < max_t { last_pow2(dim1) } else { max_t };
        let width = d0.min(WARP);
        let height = d1.min(max_t / width);
        let width = d0.min(max_t / height);
        let threads = width * height;
        let (mut step_in, mut step_out) = (1u64, 1u64);
        let block_x_reduce = ndim == 0 || on_fastest;
        if block_x_reduce {
            step_in *= width;
        } else {
            step_out *= width;
        }
        let split_warps =
            inputs_per_output.div_ceil(step_in) >= (height * 16).min(MAX_VALUES_PER_THREAD);
        if split_warps {
            step_in *= height;
        } else {
            step_out *= height;
        }
        let grid_x = (num_outputs / output_vec).div_ceil(step_out);
        let target = gpu.sms * (gpu.threads_per_sm / threads.max(1));
        let values = inputs_per_output.div_ceil(step_in);
        if !(split_warps && values >= MAX_VALUES_PER_THREAD && grid_x <= target) {
            return (0, 0);
        }
        let ctas = target
            .div_ceil(grid_x.max(1))
            .min(values.div_ceil(MIN_VALUES_PER_THREAD))
            .max(values.div_ceil(MAX_VALUES_PER_THREAD));
        if ctas <= 1 {
            return (0, 0);
        }
        let mut size = self.acc_size * num_outputs * ctas;
        if !block_x_reduce {
            size *= width * output_vec;
        }
        (size, 4 * grid_x)
    }
}

/// The largest power of two not above `n` (at least 1), as Reduce.cuh's.
fn last_pow2(n: u64) -> u64 {
    1 << (63 - n.max(1).leading_zeros())
}

/// TensorIterator's dimensions for the reduction: (shape, input strides in
/// bytes, output strides in bytes), fastest first, reduced dimensions first,
/// neighbours that walk memory as one merged.
fn iterator_view(r: &Reduction) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
    let ndim = r.shape.len();
    let shape = &r.shape;
    let mut out_strides = vec![0u64; ndim];
    let mut step = r.elem_size;
    for d in (0..ndim).rev() {
        if !r.reduced.contains(&d) {
            out_strides[d] = if shape[d] != 1 { step } else { 0 };
            step *= shape[d];
        }
    }
    let in_strides: Vec<u64> = r.strides.iter().map(|s| s * r.elem_size).collect();
    let ops = [&out_strides, &in_strides];
    let should_swap = |d0: usize, d1: usize| -> i32 {
        for (n, st) in ops.iter().enumerate() {
            let (s0, s1) = (st[d0], st[d1]);
            if n == 0 && (s0 == 0) != (s1 == 0) {
                return if s1 == 0 { 1 } else { -1 };
            }
            if s0 == 0 || s1 == 0 {
                continue;
            }
            if s0 < s1 {
                return -1;
            }
            if s0 > s1 {
                return 1;
            }
            if shape[d0] > shape[d1] {
                return 1;
            }
        }
        0
    };
    let mut perm: Vec<usize> = (0..ndim).rev().collect();
    for i in 1..ndim {
        let mut d1 = i;
        for d0 in (0..i).rev() {
            let c = should_swap(perm[d0], perm[d1]);
            if c > 0 {
                perm.swap(d0, d1);
                d1 = d0;
            } else if c < 0 {
                break;
            }
        }
    }
    let mut sh: Vec<u64> = perm.iter().map(|&p| shape[p]).collect();
    let mut st: [Vec<u64>; 2] = [
        perm.iter().map(|&p| out_strides[p]).collect(),
        perm.iter().map(|&p| in_strides[p]).collect(),
    ];
    // coalesce_dimensions
    let mut prev = 0usize;
    for d in 1..sh.len() {
        let mergeable =
            sh[prev] == 1 || sh[d] == 1 || st.iter().all(|s| sh[prev] * s[prev] == s[d]);
        if mergeable {
            if sh[prev] == 1 {
                for s in st.iter_mut() {
                    s[prev] = s[d];
                }
            }
            sh[prev] *= sh[d];
        } else {
            prev += 1;
            if prev != d {
                for s in st.iter_mut() {
                    s[prev] = s[d];
                }
                sh[prev] = sh[d];
            }
        }
    }
    let n = if sh.is_empty() { 0 } else { prev + 1 };
    sh.truncate(n);
    let [mut out, mut inp] = st;
    out.truncate(n);
    inp.truncate(n);
    (sh, inp, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contiguous(shape: &[u64]) -> Vec<u64> {
        let mut strides = vec![1u64; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1];
        }
        strides
    }

    fn sum(shape: &[u64], strides: &[u64], reduced: &[usize]) -> Reduction {
        Reduction {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            reduced: reduced.to_vec(),
            elem_size: 4,
            acc_size: 4,
        }
    }

    /// Every `gpu_reduce_kernel` buffer of the H100 recordings in
    /// tests/corpus/fit, with the tensor each reduced (the same cases as
    /// tests/python/test_reduce_scratch.py).
    #[test]
    fn a_bias_gradient_s_staging_buffer_is_the_recorded_one() {
        let recorded: [([u64; 3], u64, u64); 9] = [
            ([16, 65, 2048], 17825792, 64),
            ([16, 65, 1536], 13369344, 48),
            ([16, 65, 512], 4456448, 16),
            ([32, 65, 2048], 34603008, 64),
            ([32, 65, 1536], 25952256, 48),
            ([32, 65, 512], 8650752, 16),
            ([4, 256, 2048], 16777216, 64),
            ([4, 256, 1536], 12582912, 48),
            ([4, 256, 512], 4194304, 16),
        ];
        for (shape, staging, semaphores) in recorded {
            let r = sum(&shape, &contiguous(&shape), &[0, 1]);
            assert_eq!(
                r.scratch(Gpu::default()),
                (staging, semaphores),
                "{shape:?}"
            );
            // The same as rows x width.
            let rows = Reduction::over_rows(shape[0] * shape[1], shape[2], 4);
            assert_eq!(rows.scratch(Gpu::default()), (staging, semaphores));
        }
    }

    #[test]
    fn the_patch_embedding_s_bias_gradient_sums_a_permuted_gradient() {
        let r = sum(&[32, 512, 8, 8], &[64 * 512, 1, 8 * 512, 512], &[0, 2, 3]);
        assert_eq!(r.scratch(Gpu::default()), (8388608, 16));
    }

    #[test]
    fn short_reductions_stay_within_a_block() {
        for shape in [
            [2u64, 256, 512],
            [2, 256, 2048],
            [4, 65, 512],
            [4, 65, 2048],
        ] {
            let r = sum(&shape, &contiguous(&shape), &[0, 1]);
            assert_eq!(r.scratch(Gpu::default()), (0, 0), "{shape:?}");
        }
        let nchw = [32u64, 512, 8, 8];
        let r = sum(&nchw, &contiguous(&nchw), &[0, 2, 3]);
        assert_eq!(r.scratch(Gpu::default()), (0, 0));
        assert_eq!(
            sum(&[0, 512], &[512, 1], &[0]).scratch(Gpu::default()),
            (0, 0)
        );
    }

    #[test]
    fn the_buffer_grows_with_fewer_multiprocessors_to_fill_less() {
        let r = Reduction::over_rows(16 * 65, 2048, 4);
        let small = Gpu {
            sms: 8,
            threads_per_sm: 1536,
        };
        assert!(r.scratch(small).0 < r.scratch(Gpu::default()).0);
    }
}
