//! The device as the process saw it at a dump, written by `memlens.record`
//! beside each snapshot in `<snapshot>.device.json`:
//!
//! ```json
//! {"format": "memlens-device/1",
//!  "devices": [{"device": 0, "total_memory": 85520809984, "memory_fraction": 0.05,
//!               "free_memory": 83000000000}]}
//! ```
//!
//! A snapshot stores neither the device's total nor the per-process cap
//! (`torch.cuda.set_per_process_memory_fraction`), and an OOM in the trace
//! only bounds the cap (issue 31: on a run with expandable segments the
//! bounds were 2.60-4.60 GiB around a 4 GiB cap, and `tune` judged the
//! defaults under the lower end: 115 OOMs where the real run had one). This
//! file gives both exactly, so the what-ifs (`simulate`, `tune`, `doctor`'s
//! settings ranking) run under the limits the run had. Missing is normal (a
//! snapshot from elsewhere); a bad file is ignored like a missing one.

use crate::replay::limits::{LimitsOrigin, PrintedLimits};
use serde::Deserialize;
use std::path::Path;

/// What the device file beside a snapshot is called: the snapshot's own
/// name with this appended.
pub const DEVICE_SUFFIX: &str = ".device.json";

/// The `format` of a device file this version reads.
pub const FORMAT: &str = "memlens-device/1";

/// Larger device files are not read (a real one holds a few numbers per GPU).
const MAX_BYTES: u64 = 1 << 20;

/// One GPU at the dump.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct RecordedDevice {
    /// The device ordinal.
    pub device: u32,
    /// Its total memory (`torch.cuda.get_device_properties(d).total_memory`).
    pub total_memory: u64,
    /// The per-process fraction in force (`get_per_process_memory_fraction`;
    /// absent where torch cannot tell).
    #[serde(default)]
    pub memory_fraction: Option<f64>,
    /// Free memory on the device at the dump (`torch.cuda.mem_get_info`).
    #[serde(default)]
    pub free_memory: Option<u64>,
    /// PyTorch's reserved memory at the dump (`torch.cuda.memory_reserved`).
    #[serde(default)]
    pub reserved_memory: Option<u64>,
    /// The device's total as NVML (and nvidia-smi) count it: more than
    /// CUDA's, by what the driver keeps.
    #[serde(default)]
    pub nvml_total_memory: Option<u64>,
    /// Used memory as NVML gives it: nvidia-smi's figure where NVML's v2
    /// query answered (`nvml_reserved_memory` present), else v1's, which
    /// counts the driver's reserve too.
    #[serde(default)]
    pub nvml_used_memory: Option<u64>,
    /// What the driver reserves for itself, outside `nvml_used_memory`
    /// (NVML v2's `reserved`); absent where only v1 answered.
    #[serde(default)]
    pub nvml_reserved_memory: Option<u64>,
    /// This process's memory on the device, as NVML lists it.
    #[serde(default)]
    pub process_used_memory: Option<u64>,
    /// Every other process's memory on the device, as NVML lists them.
    #[serde(default)]
    pub other_processes_memory: Option<u64>,
    /// This process's memory outside PyTorch's allocator when recording
    /// began (NVML's figure for the process less `memory_reserved`): the
    /// CUDA context and the libraries loaded by then.
    #[serde(default)]
    pub outside_pytorch_at_start: Option<u64>,
    /// Its streaming multiprocessors (`multi_processor_count`): how
    /// PyTorch's reduction kernels split their sums, and so their staging
    /// buffers (`fit::reduce_scratch`).
    #[serde(default)]
    pub multiprocessors: Option<u64>,
    /// Threads per multiprocessor (`max_threads_per_multi_processor`).
    #[serde(default)]
    pub threads_per_multiprocessor: Option<u64>,
}

/// The device's used memory as nvidia-smi shows it, reconciled part by
/// part with what PyTorch holds (issue 35: "nvidia-smi says 9 GiB, PyTorch
/// 7"). The residual is shown, never hidden.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceAccount {
    /// The device.
    pub device: u32,
    /// Used memory, as nvidia-smi shows it.
    pub nvidia_smi_used_bytes: u64,
    /// PyTorch's caching allocator (`memory_reserved`).
    pub pytorch_reserved_bytes: u64,
    /// This process's memory outside PyTorch's allocator: the CUDA context,
    /// cuBLAS/cuDNN handles, NCCL's buffers, other allocators (CuPy, Triton).
    pub outside_pytorch_bytes: u64,
    /// Of it, what was there when recording began (the CUDA context and the
    /// libraries loaded by then), when memlens.record measured it.
    pub outside_pytorch_at_start_bytes: Option<u64>,
    /// Of it, what came since recording began (NCCL communicators, cuBLAS
    /// workspaces, CUDA-graph and other allocators' memory); negative when
    /// some was given back.
    pub outside_pytorch_since_start_bytes: Option<i64>,
    /// Other processes on the device.
    pub other_processes_bytes: u64,
    /// What the driver keeps: NVML v2's `reserved`, else NVML's total less
    /// CUDA's.
    pub driver_bytes: u64,
    /// Whether the used figure counts `driver_bytes` (NVML v1) or leaves it
    /// out, as nvidia-smi does (v2).
    pub driver_in_used: bool,
    /// Used memory that none of the above explains (negative: counted twice).
    pub unexplained_bytes: i64,
}

/// What the driver keeps of a GPU's memory, and whether NVML's "used"
/// figure counts it: NVML's v2 query gives it apart (`reserved`), outside
/// "used", as nvidia-smi shows it; where only v1 answered, it is NVML's
/// total less CUDA's, inside "used". The one rule of `doctor`'s account and
/// `top`'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverPart {
    /// What the driver keeps.
    pub bytes: u64,
    /// Whether NVML's "used" counts it (v1) or leaves it out (v2).
    pub in_used: bool,
}

impl DriverPart {
    /// From v2's `reserved` when NVML gave it, else from NVML's total less
    /// CUDA's (`None` when CUDA's total is unknown too).
    pub fn of(v2_reserved: Option<u64>, nvml_total: u64, cuda_total: Option<u64>) -> Option<Self> {
        match v2_reserved {
            Some(bytes) => Some(DriverPart {
                bytes,
                in_used: false,
            }),
            None => cuda_total.map(|c| DriverPart {
                bytes: nvml_total.saturating_sub(c),
                in_used: true,
            }),
        }
    }

    /// The bytes of it that NVML's "used" counts.
    pub fn counted(self) -> u64 {
        if self.in_used {
            self.bytes
        } else {
            0
        }
    }
}

impl RecordedDevice {
    /// The reconciliation of the device's used memory, when NVML listed
    /// this process (memlens.record wrote its figures).
    pub fn account(&self) -> Option<DeviceAccount> {
        let used = self.nvml_used_memory?;
        let reserved = self.reserved_memory?;
        let process = self.process_used_memory?;
        let others = self.other_processes_memory.unwrap_or(0);
        // Without NVML's total, its total less CUDA's is taken as 0.
        let driver = DriverPart::of(
            self.nvml_reserved_memory,
            self.nvml_total_memory.unwrap_or(self.total_memory),
            Some(self.total_memory),
        )?;
        let explained = i128::from(process) + i128::from(others) + i128::from(driver.counted());
        let outside = process.saturating_sub(reserved);
        Some(DeviceAccount {
            device: self.device,
            nvidia_smi_used_bytes: used,
            pytorch_reserved_bytes: reserved,
            outside_pytorch_bytes: outside,
            outside_pytorch_at_start_bytes: self.outside_pytorch_at_start,
            outside_pytorch_since_start_bytes: self
                .outside_pytorch_at_start
                .map(|s| (i128::from(outside) - i128::from(s)) as i64),
            other_processes_bytes: others,
            driver_bytes: driver.bytes,
            driver_in_used: driver.in_used,
            unexplained_bytes: (i128::from(used) - explained) as i64,
        })
    }
}

impl RecordedDevice {
    /// The cap the allocator enforced: `fraction * total`, as PyTorch
    /// computes `allowed_memory_maximum`; `None` without a cap below the total.
    pub fn memory_cap(&self) -> Option<u64> {
        let f = self
            .memory_fraction
            .filter(|f| f.is_finite() && *f > 0.0 && *f < 1.0)?;
        // PyTorch: static_cast<size_t>(fraction * static_cast<double>(total)).
        Some((f * self.total_memory as f64) as u64)
    }

    /// The limits this device had, as the what-ifs take them.
    pub fn limits(&self) -> PrintedLimits {
        PrintedLimits {
            memory_cap: self.memory_cap(),
            device_total: Some(self.total_memory),
            other_processes: 0,
            origin: LimitsOrigin::Recorder,
        }
    }
}

#[derive(Deserialize)]
struct DeviceFile {
    format: String,
    devices: Vec<RecordedDevice>,
}

/// The devices recorded beside the snapshot at `snapshot` (`None`: no file,
/// or one this version cannot read).
pub fn beside(snapshot: &Path) -> Option<Vec<RecordedDevice>> {
    let path = crate::beside::path_of(snapshot, DEVICE_SUFFIX);
    let parsed: DeviceFile = crate::beside::read_json(&path, MAX_BYTES, "device file")
        .ok()
        .flatten()?;
    (parsed.format == FORMAT).then_some(parsed.devices)
}

/// What was recorded of `device` among `recorded` (one file lists each GPU
/// the process used).
pub fn of_device(recorded: &[RecordedDevice], device: u32) -> Option<&RecordedDevice> {
    recorded.iter().find(|d| d.device == device)
}

/// The limits of `device` recorded beside the snapshot at `snapshot`.
pub fn limits_beside(snapshot: &Path, device: u32) -> Option<PrintedLimits> {
    of_device(&beside(snapshot)?, device).map(RecordedDevice::limits)
}
