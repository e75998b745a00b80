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
use std::io::Read;
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
    let mut name = snapshot.as_os_str().to_os_string();
    name.push(DEVICE_SUFFIX);
    let file = std::fs::File::open(Path::new(&name)).ok()?;
    let mut text = String::new();
    file.take(MAX_BYTES).read_to_string(&mut text).ok()?;
    let parsed: DeviceFile = serde_json::from_str(&text).ok()?;
    (parsed.format == FORMAT).then_some(parsed.devices)
}

/// The limits of `device` recorded beside the snapshot at `snapshot`.
pub fn limits_beside(snapshot: &Path, device: u32) -> Option<PrintedLimits> {
    beside(snapshot)?
        .iter()
        .find(|d| d.device == device)
        .map(RecordedDevice::limits)
}
