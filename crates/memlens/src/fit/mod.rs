//! `memlens fit`: will a training run fit at another batch size, and what is
//! the largest batch that fits under a limit.
//!
//! The run is taken from two probes, recordings of the same code at two
//! small batch sizes ([`probes::ScaledRun`]); at any batch its operations are
//! replayed through the allocator model (`sim::program`) under the recorded
//! settings, so the prediction carries what an allocated-bytes estimate
//! lacks: the cache, the rounding, the fragmentation. Under a limit (the
//! bytes PyTorch's allocator may reserve, as
//! `set_per_process_memory_fraction` sets), the model frees its cache and
//! retries as PyTorch does before it fails; "fits" means no allocation failed.
//! Where `cudaMalloc` puts new segments decides the allocator's tie-breaks
//! and cannot be known ahead, so every run is replayed twice, with addresses
//! rising and falling ([`AddressOrder`]): the prediction is the higher peak,
//! and a batch fits only when it fits both ways.
//!
//! Activation checkpointing of a module is predicted from one recording
//! with its module scopes ([`checkpoint`], [`fit_checkpoint`]).
//!
//! A model with no recording is predicted from a training step traced with
//! fake tensors in Python (`memlens.trace_step`: every allocation and free
//! its operators made, no GPU used), replayed as it ran ([`fit_run`]); a
//! change of precision, optimizer or sequence length is traced anew there.
//!
//! Not yet: those changes made to a GPU recording, checkpointing and a batch
//! change together, an OOM snapshot as a probe. Those are refused, not
//! guessed.

pub mod checkpoint;
pub mod probes;
pub mod reduce_scratch;

use crate::replay::config::recorded_config;
use crate::replay::during_read::RecordedPasses;
use crate::replay::simulate::{simulate_ops_in, SimulateOptions};
use crate::sim::program::Op;
use crate::sim::{AddressOrder, AllocatorConfig};
use probes::{Probe, ScaledRun};
use serde::Serialize;

/// The largest batch [`fit`] searches for.
pub const MAX_BATCH: u32 = 1 << 16;

/// Both ways CUDA may lay out new segments; every prediction takes the worse.
const ADDRESS_ORDERS: [AddressOrder; 2] = [AddressOrder::Downward, AddressOrder::Upward];

/// What to predict.
#[derive(Clone, Debug, Default)]
pub struct FitOptions {
    /// The batch size to predict (`None`: only the largest that fits).
    pub batch: Option<u32>,
    /// The bytes the allocator may reserve (`None`: no limit, no search).
    pub limit: Option<u64>,
    /// Allocator settings to predict under (`None`: the probes').
    pub config: Option<AllocatorConfig>,
    /// With a limit, also find each run's least limit ([`least_limit`]):
    /// the model's edge, which `memlens.predict`'s largest-batch search
    /// steers by. Not a size to run under: on the H200 a traced step run
    /// under exactly its least limit failed 15 times in 25 (traces made
    /// before the tracer ran the optimizer's foreach kernels; under 1.04
    /// times it, 3 failed, all small batches those traces got wrong): the
    /// GPU's peaks are within a few percent of the model's and the edge is
    /// sharp, so no answer gives it.
    pub least_limit: bool,
}

impl FitOptions {
    /// The allocator settings to predict under: those asked, else `snap`'s
    /// recorded ones.
    fn config_for(&self, snap: &crate::snapshot::Snapshot) -> AllocatorConfig {
        self.config
            .clone()
            .unwrap_or_else(|| recorded_config(&snap.settings))
    }
}

/// The prediction at one batch size.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Prediction {
    /// The batch size.
    pub batch: u32,
    /// `allocated_bytes.all.peak` the run would reach (no limit).
    pub peak_allocated_bytes: u64,
    /// `reserved_bytes.all.peak` the run would reach (no limit).
    pub peak_reserved_bytes: u64,
    /// Whether it runs under the limit without an allocation failing
    /// (`None`: no limit given).
    pub fits: Option<bool>,
}

/// One probe as the prediction used it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProbeBasis {
    /// The file.
    pub file: String,
    /// Its batch size.
    pub batch: u32,
    /// Its peaks as recorded (the model's replay of it).
    pub peak_allocated_bytes: u64,
    /// Reserved, likewise.
    pub peak_reserved_bytes: u64,
}

/// What the prediction rests on.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Basis {
    /// How sizes were scaled.
    pub method: String,
    /// The probes.
    pub probes: Vec<ProbeBasis>,
    /// Allocations in the run.
    pub allocations: usize,
    /// Of them, those whose size changes with the batch.
    pub scaling_allocations: usize,
    /// Bytes per extra sample over every allocation that scales.
    pub bytes_per_sample: u64,
    /// The allocator settings predicted under (`PYTORCH_CUDA_ALLOC_CONF`).
    pub config: String,
    /// Sums of bias gradients whose reduction kernel's staging buffers are
    /// computed at each batch (PyTorch's `Reduce.cuh`, for `multiprocessors`):
    /// a small probe runs none, a large batch does. 0 when the probes have
    /// no C++ frames to name them.
    pub modelled_reductions: usize,
    /// The multiprocessors those buffers are computed for: the probes' GPU
    /// as `memlens.record` wrote it beside them (`<probe>.device.json`),
    /// else an H100's or H200's 132.
    pub multiprocessors: u64,
    /// Whether `multiprocessors` was recorded (else assumed).
    pub multiprocessors_recorded: bool,
    /// Allocations of cuDNN convolutions' workspaces (made by
    /// `run_conv_plan`, told by C++ frames): under the limit, one that
    /// cannot be had is done without, as PyTorch runs the convolution with
    /// another algorithm then, so none decides whether a batch fits.
    pub conv_workspaces: usize,
}

/// `memlens fit`'s answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FitReport {
    /// The prediction at the batch asked for.
    pub predicted: Option<Prediction>,
    /// The largest batch that runs under the limit (`None`: no limit, or not
    /// even batch 1 fits).
    pub largest_batch: Option<u32>,
    /// The largest batch's prediction.
    pub at_largest_batch: Option<Prediction>,
    /// The limit, in bytes the allocator may reserve.
    pub limit_bytes: Option<u64>,
    /// What the prediction rests on.
    pub basis: Basis,
    /// Caveats: how far the answer reaches beyond the probes.
    pub warnings: Vec<String>,
}

/// Predicts the run of `probes` (two, at different batch sizes) under `opts`.
pub fn fit(probes: &[Probe<'_>], opts: &FitOptions) -> crate::Result<FitReport> {
    let [a, b] = probes else {
        return Err(crate::Error::usage(format!(
            "fit needs two probes (snapshots of the same run at two batch sizes), got {}",
            probes.len()
        )));
    };
    let (a, b) = if a.batch <= b.batch { (a, b) } else { (b, a) };
    let mut run = ScaledRun::from_probes(a, b)?;
    let recorded_gpu = recorded_gpu(b);
    if let Some(gpu) = recorded_gpu {
        run.gpu = gpu;
    }
    let config = opts.config_for(b.snap);
    let model = Model {
        run: &run,
        config: &config,
        device: b.snap.first_traced_device(),
        limit: opts.limit,
    };
    let probe_basis = |p: &Probe<'_>| -> crate::Result<ProbeBasis> {
        let (pa, pr) = model.peaks(p.batch)?;
        Ok(ProbeBasis {
            file: p.name.to_string(),
            batch: p.batch,
            peak_allocated_bytes: pa,
            peak_reserved_bytes: pr,
        })
    };
    let basis = Basis {
        method: "each allocation's size linear in the batch, from the two probes; the run \
                 replayed through the allocator model with new segments at rising and at falling \
                 addresses, the higher peak taken"
            .into(),
        probes: vec![probe_basis(a)?, probe_basis(b)?],
        allocations: run.allocations,
        scaling_allocations: run.scaling_allocations,
        bytes_per_sample: run.bytes_per_sample.max(0.0).round() as u64,
        config: config.to_conf_string(),
        modelled_reductions: run.modelled_reductions,
        multiprocessors: run.gpu.sms,
        multiprocessors_recorded: recorded_gpu.is_some(),
        conv_workspaces: run.conv_workspaces,
    };
    let predicted = opts.batch.map(|n| model.predict(n)).transpose()?;
    let largest_batch = match opts.limit {
        Some(_) => model.largest_batch()?,
        None => None,
    };
    let at_largest_batch = largest_batch.map(|n| model.predict(n)).transpose()?;
    let farthest = opts.batch.into_iter().chain(largest_batch).max();
    let warnings = farthest
        .and_then(|n| extrapolation_warning(n, b.batch, run.modelled_reductions > 0))
        .into_iter()
        .collect();
    Ok(FitReport {
        predicted,
        largest_batch,
        at_largest_batch,
        limit_bytes: opts.limit,
        basis,
        warnings,
    })
}

/// The GPU probe `p` ran on, as `memlens.record` wrote it in the device
/// file beside it; `None` without one (a snapshot from `_dump_snapshot`).
fn recorded_gpu(p: &Probe<'_>) -> Option<reduce_scratch::Gpu> {
    let devices = crate::device_file::beside(std::path::Path::new(p.name))?;
    let d = crate::device_file::of_device(&devices, p.snap.first_traced_device())?;
    Some(reduce_scratch::Gpu {
        sms: d.multiprocessors.filter(|&n| n > 0)?,
        threads_per_sm: d
            .threads_per_multiprocessor
            .filter(|&n| n > 0)
            .unwrap_or(reduce_scratch::HOPPER_THREADS_PER_SM),
    })
}

/// The caveat on an answer at `batch`, far past the larger probe's
/// (`probe`): what was measured there (tests/gpu/RESULTS.md). With
/// `reductions_modelled`, the probes named their bias gradients' sums, whose
/// staging buffers (the one thing a small probe did not show on five
/// measured workloads) are computed at `batch`.
fn extrapolation_warning(batch: u32, probe: u32, reductions_modelled: bool) -> Option<String> {
    let times = f64::from(batch) / f64::from(probe.max(1));
    (batch > probe.saturating_mul(2)).then(|| {
        if reductions_modelled {
            format!(
                "batch {batch} is {times:.0}x the larger probe's ({probe}): an extrapolation, \
                 within 3% of the GPU on five measured workloads at 2-8x; a kernel that \
                 allocates only past a size the probes did not reach (other than the bias \
                 gradients' sums, which are modelled) would not be in it: a probe nearer batch \
                 {batch} narrows it"
            )
        } else {
            format!(
                "batch {batch} is {times:.0}x the larger probe's ({probe}): an extrapolation. \
                 Some kernels allocate only past a size (the sum of bias gradients stages its \
                 partial sums in buffers of up to tens of MiB: a ViT's reserved peak came out 6% \
                 under at 4-8x without them) and no smaller probe shows them; probes recorded \
                 with C++ frames (torch's _record_memory_history() default, or \
                 memlens.record(..., stacks=\"all\")) let fit compute those sums' buffers; a \
                 probe nearer batch {batch} narrows it"
            )
        }
    })
}

/// Peak allocated and reserved bytes of the program `ops` under `config`,
/// with no limit: the higher of the runs under both address orders, each
/// figure on its own (real addresses mix both orders: on the ViT at batch 32
/// one order gave the GPU's reserved peak and the other came nearer its
/// allocated).
pub fn program_peaks(
    ops: &[Op],
    device: u32,
    config: &AllocatorConfig,
) -> crate::Result<(u64, u64)> {
    let mut peaks = (0, 0);
    for order in ADDRESS_ORDERS {
        let r = simulate_program(ops, device, config, None, order)?;
        peaks.0 = peaks.0.max(r.peak_allocated_bytes);
        peaks.1 = peaks.1.max(r.peak_reserved_bytes);
    }
    Ok(peaks)
}

/// Whether the program `ops` completes with at most `limit` bytes reserved,
/// whichever way CUDA lays out the segments.
pub fn program_fits(
    ops: &[Op],
    device: u32,
    config: &AllocatorConfig,
    limit: u64,
) -> crate::Result<bool> {
    for order in ADDRESS_ORDERS {
        if simulate_program(ops, device, config, Some(limit), order)?
            .first_oom
            .is_some()
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The unit of [`least_limit`]: no segment is smaller than 2 MiB, so a
/// finer limit tells no two runs apart that matter.
pub const LEAST_LIMIT_STEP: u64 = 2 << 20;

/// The smallest limit, a multiple of [`LEAST_LIMIT_STEP`], under which the
/// program `ops` fits ([`program_fits`]), found by bisection between nothing
/// and `peak_reserved` (its reserved peak with no limit, under which it
/// fits: the allocator never asks for more). Under a limit the allocator
/// frees its cache and retries before it fails, and a cuDNN workspace is
/// done without, so this is often well below the reserved peak, and it is
/// what decides where a larger batch stops fitting. Whether a program fits
/// need not rise with the limit everywhere (a limit changes which blocks
/// the cache frees); the answer is the edge the bisection meets.
pub fn least_limit(
    ops: &[Op],
    device: u32,
    config: &AllocatorConfig,
    peak_reserved: u64,
) -> crate::Result<u64> {
    // In steps: `hi` fits, `lo` does not (nothing fits under no memory).
    let (mut lo, mut hi) = (0, peak_reserved.div_ceil(LEAST_LIMIT_STEP));
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if program_fits(ops, device, config, mid * LEAST_LIMIT_STEP)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi * LEAST_LIMIT_STEP)
}

/// The peaks of the program `ops` under `config` ([`program_peaks`]) and,
/// under a `limit`, whether it fits ([`program_fits`]) and, when `least`,
/// the least limit it fits under ([`least_limit`]), plus `held_beyond`
/// (bytes the run holds that the program does not: a DDP rank's extra
/// buckets).
fn run_peaks(
    ops: &[Op],
    device: u32,
    config: &AllocatorConfig,
    limit: Option<u64>,
    held_beyond: u64,
    least: bool,
) -> crate::Result<RunPeaks> {
    let (peak_allocated_bytes, peak_reserved_bytes) = program_peaks(ops, device, config)?;
    let judged = limit.map(|l| l.saturating_sub(held_beyond));
    Ok(RunPeaks {
        peak_allocated_bytes,
        peak_reserved_bytes,
        fits: judged
            .map(|l| program_fits(ops, device, config, l))
            .transpose()?,
        least_limit_bytes: judged
            .filter(|_| least)
            .map(|_| least_limit(ops, device, config, peak_reserved_bytes))
            .transpose()?
            .map(|l| l + held_beyond),
    })
}

fn simulate_program(
    ops: &[Op],
    device: u32,
    config: &AllocatorConfig,
    cap: Option<u64>,
    order: AddressOrder,
) -> crate::Result<crate::replay::simulate::SimulationResult> {
    let opts = SimulateOptions {
        config: config.clone(),
        device_memory: None,
        overhead: Some(0),
        allowed_memory_maximum: cap,
    };
    simulate_ops_in(ops, device, &opts, order)
}

/// Peaks of a run, as recorded or as predicted, and whether it fits.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunPeaks {
    /// `allocated_bytes.all.peak` the run reaches.
    pub peak_allocated_bytes: u64,
    /// `reserved_bytes.all.peak` the run reaches (no limit).
    pub peak_reserved_bytes: u64,
    /// Whether it runs under the limit (`None`: no limit given).
    pub fits: Option<bool>,
    /// With a limit and [`FitOptions::least_limit`]: the least limit it
    /// runs under in the model, to 2 MiB ([`least_limit`]; the model's
    /// edge, not a size to run under).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub least_limit_bytes: Option<u64>,
}

/// `memlens fit --checkpoint`'s answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CheckpointReport {
    /// The run as recorded, replayed through the same model.
    pub recorded: RunPeaks,
    /// The run with the module checkpointed.
    pub predicted: RunPeaks,
    /// The limit, in bytes the allocator may reserve.
    pub limit_bytes: Option<u64>,
    /// How the prediction was made.
    pub method: String,
    /// What the rewrite changed.
    pub basis: checkpoint::CheckpointBasis,
    /// The allocator settings predicted under (`PYTORCH_CUDA_ALLOC_CONF`).
    pub config: String,
    /// Caveats.
    pub warnings: Vec<String>,
}

/// What a one-recording prediction ([`fit_run`]) replayed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunBasis {
    /// The file.
    pub file: String,
    /// `recorded` (a GPU's recording) or `fake tensors` (a step traced by
    /// `memlens.trace_step`, with no GPU).
    pub source: String,
    /// Allocations in the run.
    pub allocations: usize,
    /// Training steps traced (fake traces).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<u64>,
    /// The precision the traced steps ran in (fake traces).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precision: Option<String>,
    /// The ranks of the DDP job the traced step is one rank of (fake
    /// traces of a distributed step).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u64>,
}

/// `memlens fit` on one recording or fake trace, no change asked.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunReport {
    /// The run replayed through the allocator model.
    pub predicted: RunPeaks,
    /// The limit, in bytes the allocator may reserve.
    pub limit_bytes: Option<u64>,
    /// How the prediction was made.
    pub method: String,
    /// What was replayed.
    pub basis: RunBasis,
    /// The allocator settings predicted under (`PYTORCH_CUDA_ALLOC_CONF`).
    pub config: String,
    /// Caveats.
    pub warnings: Vec<String>,
}

/// `memlens fit`'s answer: a batch size predicted from two probes, the
/// recorded run with a module checkpointed, or one run (recorded, or traced
/// with fake tensors) replayed under the limit and settings asked.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum FitAnswer {
    /// From two probes ([`fit`]).
    Batch(FitReport),
    /// From one recording ([`fit_checkpoint`]).
    Checkpoint(CheckpointReport),
    /// One run as it is ([`fit_run`]).
    Run(RunReport),
}

/// `memlens fit` on named `recordings`: with `checkpoint` (a module), one
/// recording with that module checkpointed; else the probes, at
/// `recorded_batch`, predicted under `opts` (every front calls this).
pub fn answer(
    recordings: &[(&str, &crate::snapshot::Snapshot)],
    recorded_batch: &[u32],
    checkpoint: Option<&str>,
    opts: &FitOptions,
) -> crate::Result<FitAnswer> {
    let Some(module) = checkpoint else {
        if let ([(name, snap)], []) = (recordings, recorded_batch) {
            return Ok(FitAnswer::Run(fit_run(name, snap, opts)?));
        }
        let probes = probes::probes(recordings, recorded_batch)?;
        return Ok(FitAnswer::Batch(fit(&probes, opts)?));
    };
    match recordings {
        [(name, snap)] if recorded_batch.is_empty() => Ok(FitAnswer::Checkpoint(fit_checkpoint(
            name, snap, module, opts,
        )?)),
        [_] => Err(crate::Error::usage(
            "a checkpointing prediction is made from one recording at its own batch: no recorded \
             batch sizes with it",
        )),
        _ => Err(crate::Error::usage(format!(
            "a checkpointing prediction is made from one recording: got {}",
            recordings.len()
        ))),
    }
}

/// A run's every allocation and free, in order, as the program `fit_run`
/// replays: a cuDNN workspace is one the run can do without, as in every
/// program made from a trace ([`Op::Optional`]), and a workspace the run gave
/// up is tried again. A run that failed is refused.
pub fn recorded_program(probe: &Probe<'_>) -> crate::Result<Vec<Op>> {
    let rec = probes::Recorded::of_late_start(probe, &RecordedPasses::default())?;
    let workspaces = probe.snap.cudnn_workspace_stacks();
    Ok(rec
        .ops
        .iter()
        .map(|&(op, stack)| match op {
            Op::Alloc {
                id,
                size,
                stream,
                tag,
            } => Op::allocation(
                id,
                size,
                stream,
                tag,
                stack.is_some_and(|s| workspaces.contains(s)),
            ),
            op => op,
        })
        .collect())
}

/// The run in `snap` (named `name`: a recording, or a step traced with fake
/// tensors by `memlens.trace_step`) replayed through the allocator model
/// under `opts`' limit and settings: its peaks, and whether it fits. A fake
/// trace's allocator state is the model's alone: this is how its reserved
/// memory is known.
pub fn fit_run(
    name: &str,
    snap: &crate::snapshot::Snapshot,
    opts: &FitOptions,
) -> crate::Result<RunReport> {
    if opts.batch.is_some() {
        return Err(crate::Error::usage(
            "--batch needs two probes at different batch sizes (--recorded-batch A,B); one \
             recording is predicted as it ran (with --limit and --config)",
        ));
    }
    let ops = recorded_program(&Probe {
        name,
        snap,
        batch: 1,
    })?;
    let config = opts.config_for(snap);
    let device = snap.first_traced_device();
    let fake = snap.fake_trace.as_ref();
    // One rank of a DDP job: some runs of the same job held one more set of
    // gradient buckets at the peak than the trace does (see
    // `fake_trace_warnings`); whether it fits is judged with them.
    let outliving = fake.map_or(0, |f| f.outliving_buckets());
    Ok(RunReport {
        predicted: run_peaks(
            &ops,
            device,
            &config,
            opts.limit,
            outliving,
            opts.least_limit,
        )?,
        limit_bytes: opts.limit,
        method: "every allocation and free of the run replayed through the allocator model \
                 with new segments at rising and at falling addresses, the higher peak taken"
            .into(),
        basis: RunBasis {
            file: name.to_string(),
            source: if fake.is_some() {
                "fake tensors"
            } else {
                "recorded"
            }
            .into(),
            allocations: ops
                .iter()
                .filter(|o| matches!(o, Op::Alloc { .. } | Op::Optional { .. }))
                .count(),
            steps: fake.map(|f| f.steps),
            precision: fake.map(|f| f.precision.clone()),
            world_size: fake.map(|f| f.world_size).filter(|&n| n > 1),
        },
        config: config.to_conf_string(),
        warnings: fake
            .map(|f| fake_trace_warnings(f, convolutions(snap, device)))
            .unwrap_or_default(),
    })
}

/// Allocations made by convolutions in a fake trace (its allocations'
/// innermost frame names the operator, `aten::convolution.default`).
fn convolutions(snap: &crate::snapshot::Snapshot, device: u32) -> usize {
    snap.device_trace(device)
        .iter()
        .filter(|e| e.action == crate::snapshot::Action::Alloc)
        .filter(|e| {
            snap.stack(e.stack).first().is_some_and(|&f| {
                snap.str(snap.frame(f).name)
                    .starts_with("aten::convolution")
            })
        })
        .count()
}

/// What a fake trace cannot hold, said with each prediction made from one
/// (`convolutions`: its allocations made by convolutions).
fn fake_trace_warnings(f: &crate::snapshot::FakeTrace, convolutions: usize) -> Vec<String> {
    let mut out = vec![scratch_caveat(f, convolutions)];
    if !f.foreach_as_gpu {
        out.push(
            "traced by a memlens that ran an optimizer built without foreach= or fused= one \
             tensor at a time, where on a GPU PyTorch runs its multi-tensor kernels, which hold \
             a copy of every parameter at once during AdamW's step: where that step sets the \
             peak (a small batch) the prediction is under (a ViT at batch 2: 15% allocated, \
             12% reserved); trace the step again"
                .to_string(),
        );
    }
    if f.unknown_values > 0 {
        out.push(format!(
            "the step read {} values back from the GPU (.item(), if tensor: ...), which a fake \
             tensor has not got: each test was taken as False, each number as 1; a size or a \
             branch that depends on them may differ on the GPU",
            f.unknown_values
        ));
    }
    if f.world_size > 1 {
        let outliving = if f.outliving_buckets() > 0 {
            format!(
                "up to {} more (one set of DDP's gradient buckets)",
                crate::units::format_bytes(f.outliving_buckets())
            )
        } else {
            "up to one set of DDP's gradient buckets more".to_string()
        };
        out.push(format!(
            "one rank of a DistributedDataParallel job of {} (PyTorch's fake process group: no \
             communication): DDP's gradient buckets are in the trace, NCCL's own memory is not. \
             The prediction is a run whose old buckets are freed when DDP rebuilds them in the \
             second step (within 0.5% of such runs of three models on two H200s); in other runs \
             of the same job they outlived the rebuild and the rank peaked {outliving}: leave \
             that much headroom (`fits` counts it when the trace gives its size)",
            f.world_size
        ));
    }
    if f.comm_hooks_ignored > 0 {
        out.push(format!(
            "the step registered {} DDP comm hook(s), which the trace ran without: what a hook \
             allocates (a compressed copy of each bucket) is not in the prediction",
            f.comm_hooks_ignored
        ));
    }
    out
}

/// What a fake trace holds of kernels' own scratch memory, and how far the
/// GPU's peaks were from predictions made with as much.
fn scratch_caveat(f: &crate::snapshot::FakeTrace, convolutions: usize) -> String {
    if convolutions == 0 {
        return "a fake trace holds what PyTorch's operators return, not a kernel's own scratch \
                memory nor memory outside PyTorch (the CUDA context, NCCL); on transformers the \
                GPU's peaks were within 1.1% (allocated) and 1.9% (reserved) of the prediction \
                (an H200: ten families in fp32 and bf16, three models at batch 2)"
            .to_string();
    }
    if f.scratch_measuring && f.scratch_unmeasured == 0 {
        return format!(
            "this step runs convolutions ({convolutions} tensors made by them): cuDNN's \
             workspaces were measured on the GPU ({} layouts, each run once) and are in the \
             trace, done without where they cannot be had, as PyTorch does; the fused attention \
             kernels' workspaces and memory outside PyTorch (the CUDA context, NCCL) are not. On \
             an H200 the GPU's peaks were within 0.6% (allocated) and 3.3% (reserved) of the \
             prediction (ResNet-50, a ViT)",
            f.scratch_measured
        );
    }
    let why = if f.scratch_measuring {
        format!(
            "{} of its convolutions' layouts could not be run on the GPU to measure them",
            f.scratch_unmeasured
        )
    } else {
        "the trace was made without measuring them (measure_scratch=False, or a memlens before \
         the measuring)"
            .to_string()
    };
    format!(
        "this step runs convolutions ({convolutions} tensors made by them): cuDNN's workspaces, \
         made and freed inside each call, are not in this trace ({why}); without them an H200 \
         reserved up to 3.9% more than predicted (ResNet-50 2.7%, a ViT 3.9%): leave that much \
         headroom"
    )
}

/// Predicts the run recorded in `snap` (named `name`) with every call of
/// `module` under activation checkpointing, under `opts`' limit and
/// settings (`opts.batch` must be unset: one recording, one batch).
pub fn fit_checkpoint(
    name: &str,
    snap: &crate::snapshot::Snapshot,
    module: &str,
    opts: &FitOptions,
) -> crate::Result<CheckpointReport> {
    fit_checkpoint_with(name, snap, module, opts, &RecordedPasses::default())
}

/// [`fit_checkpoint`] reading the trace's one replay from `passes` (doctor
/// hands its own, so that its advice does not replay the trace again).
pub fn fit_checkpoint_with(
    name: &str,
    snap: &crate::snapshot::Snapshot,
    module: &str,
    opts: &FitOptions,
    passes: &RecordedPasses,
) -> crate::Result<CheckpointReport> {
    if opts.batch.is_some() {
        return Err(crate::Error::usage(
            "--checkpoint predicts the recorded batch; with --batch too, that needs two probes \
             and is not built yet: predict one change at a time",
        ));
    }
    let run = checkpoint::checkpointed_run(name, snap, module, passes)?;
    let config = opts.config_for(snap);
    let device = snap.first_traced_device();
    Ok(CheckpointReport {
        recorded: run_peaks(
            &run.recorded,
            device,
            &config,
            opts.limit,
            0,
            opts.least_limit,
        )?,
        predicted: run_peaks(
            &run.checkpointed,
            device,
            &config,
            opts.limit,
            0,
            opts.least_limit,
        )?,
        limit_bytes: opts.limit,
        method: "the recorded run rewritten as non-reentrant torch.utils.checkpoint runs it: \
                 the tensors each call kept for the backward freed when the module that holds \
                 them returns (the call's output kept), its forward run again where the backward \
                 reaches it; replayed through \
                 the allocator model with new segments at rising and at falling addresses, the \
                 higher peak taken"
            .into(),
        basis: run.basis,
        config: config.to_conf_string(),
        warnings: Vec::new(),
    })
}

/// The run, the settings and the limit: a prediction at any batch.
struct Model<'a> {
    run: &'a ScaledRun,
    config: &'a AllocatorConfig,
    device: u32,
    limit: Option<u64>,
}

impl Model<'_> {
    /// Peak allocated and reserved bytes at `batch`, with no limit.
    fn peaks(&self, batch: u32) -> crate::Result<(u64, u64)> {
        program_peaks(&self.run.ops_at(batch), self.device, self.config)
    }

    /// Whether the run at `batch` completes under the limit, whichever way
    /// CUDA lays out the segments.
    fn fits(&self, batch: u32) -> crate::Result<Option<bool>> {
        self.limit
            .map(|limit| program_fits(&self.run.ops_at(batch), self.device, self.config, limit))
            .transpose()
    }

    fn predict(&self, batch: u32) -> crate::Result<Prediction> {
        let (peak_allocated_bytes, peak_reserved_bytes) = self.peaks(batch)?;
        Ok(Prediction {
            batch,
            peak_allocated_bytes,
            peak_reserved_bytes,
            fits: self.fits(batch)?,
        })
    }

    /// The largest batch that fits under the limit: doubling, then halving
    /// the gap (fitting only gets harder as the batch grows).
    fn largest_batch(&self) -> crate::Result<Option<u32>> {
        if self.fits(1)? != Some(true) {
            return Ok(None);
        }
        let (mut lo, mut hi) = (1u32, 2u32);
        while hi <= MAX_BATCH && self.fits(hi)? == Some(true) {
            lo = hi;
            hi *= 2;
        }
        if hi > MAX_BATCH {
            return Ok(Some(lo));
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.fits(mid)? == Some(true) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok(Some(lo))
    }
}

#[cfg(test)]
mod tests {
    use super::{fake_trace_warnings, scratch_caveat};
    use crate::snapshot::FakeTrace;

    #[test]
    fn a_trace_whose_optimizer_ran_one_tensor_at_a_time_says_so() {
        let older = fake_trace_warnings(&FakeTrace::default(), 0);
        assert!(
            older.iter().any(|w| w.contains("one tensor at a time")),
            "{older:?}"
        );
        let now = FakeTrace {
            foreach_as_gpu: true,
            ..FakeTrace::default()
        };
        let w = fake_trace_warnings(&now, 0);
        assert!(
            !w.iter().any(|w| w.contains("one tensor at a time")),
            "{w:?}"
        );
    }

    #[test]
    fn a_trace_with_convolutions_says_whether_their_workspaces_were_measured() {
        let measured = FakeTrace {
            scratch_measuring: true,
            scratch_measured: 46,
            ..FakeTrace::default()
        };
        let w = &scratch_caveat(&measured, 10);
        assert!(w.contains("were measured on the GPU (46 layouts"), "{w}");
        // An older trace, or one made with measure_scratch=False.
        let w = &scratch_caveat(&FakeTrace::default(), 10);
        assert!(
            w.contains("without measuring them") && w.contains("headroom"),
            "{w}"
        );
        // Some layouts the GPU could not run.
        let short = FakeTrace {
            scratch_unmeasured: 2,
            ..measured
        };
        let w = &scratch_caveat(&short, 10);
        assert!(
            w.contains("2 of its convolutions' layouts could not be run"),
            "{w}"
        );
        // No convolution: the general caveat, measuring or not.
        let w = &scratch_caveat(&FakeTrace::default(), 0);
        assert!(w.contains("not a kernel's own scratch memory"), "{w}");
    }
}
