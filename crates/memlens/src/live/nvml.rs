//! The real GPU source: NVML, through `nvml-wrapper`, which loads
//! `libnvidia-ml.so.1` at run time (so memlens builds and starts with no GPU).
//!
//! Two driver-age caveats are handled here:
//! * `Device::memory_info()` calls `nvmlDeviceGetMemoryInfo_v2`, absent before
//!   driver R510 and flaky on WSL: we fall back to the v1 call.
//! * `running_compute_processes()` calls the `_v3` entry point, absent on old
//!   drivers: we fall back to `_v2`.

use super::source::{GpuReading, GpuSource, ProcessReading};
use super::LiveError;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, Nvml};

/// GPU figures from the NVIDIA driver.
pub struct NvmlSource {
    nvml: Nvml,
    // Name and UUID per index: they never change, so they are read once.
    names: std::collections::HashMap<u32, (String, Option<String>)>,
}

impl NvmlSource {
    /// Loads the driver library and initialises NVML. With no driver this is
    /// [`LiveError::NoDriver`], never a panic.
    pub fn open() -> Result<Self, LiveError> {
        Nvml::init()
            .map(|nvml| NvmlSource {
                nvml,
                names: Default::default(),
            })
            .map_err(classify)
    }

    /// The driver version, e.g. "580.159.04".
    pub fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }

    fn read_device(&mut self, index: u32) -> Result<GpuReading, NvmlError> {
        let device = self.nvml.device_by_index(index)?;
        let (total_bytes, used_bytes, driver_reserved_bytes) = Self::memory(&self.nvml, &device)?;
        let (name, uuid) = self
            .names
            .entry(index)
            .or_insert_with(|| {
                (
                    device.name().unwrap_or_else(|_| "NVIDIA GPU".to_string()),
                    device.uuid().ok(),
                )
            })
            .clone();
        Ok(GpuReading {
            index,
            name,
            uuid,
            total_bytes,
            used_bytes,
            driver_reserved_bytes,
            utilization_pct: device.utilization_rates().ok().map(|u| u.gpu),
            processes: processes(&device),
        })
    }

    /// (total, used, the driver's reserved) bytes: v2 (what `nvidia-smi`
    /// shows; its `used` leaves out what the driver reserves, which it gives
    /// apart), else v1 (whose `used` counts it, and gives no figure for it).
    fn memory(nvml: &Nvml, device: &Device) -> Result<(u64, u64, Option<u64>), NvmlError> {
        let v2_err = match device.memory_info() {
            Ok(m) => return Ok((m.total, m.used, Some(m.reserved))),
            Err(e) => e,
        };
        let Ok(sym) = nvml.lib().nvmlDeviceGetMemoryInfo.as_ref() else {
            return Err(v2_err);
        };
        let mut v1 = nvml_wrapper_sys::bindings::nvmlMemory_t {
            total: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: `sym` is the driver's nvmlDeviceGetMemoryInfo (v1), called
        // with a live device handle of this Nvml and a valid out-pointer to a
        // struct of the v1 layout, as nvml.h specifies.
        // The workspace denies `unsafe_code`; this FFI call is its one exception.
        #[allow(unsafe_code)]
        let status = unsafe { sym(device.handle(), &mut v1) };
        nvml_try(status)?;
        Ok((v1.total, v1.used, None))
    }
}

/// Compute processes (v3, else v2), then graphics ones not already listed.
fn processes(device: &Device) -> Vec<ProcessReading> {
    let compute = device
        .running_compute_processes()
        .or_else(|_| device.running_compute_processes_v2())
        .unwrap_or_default();
    let graphics = device
        .running_graphics_processes()
        .or_else(|_| device.running_graphics_processes_v2())
        .unwrap_or_default();
    let mut out: Vec<ProcessReading> = Vec::new();
    for p in compute.into_iter().chain(graphics) {
        if !out.iter().any(|o| o.pid == p.pid) {
            out.push(reading(&p));
        }
    }
    out
}

fn reading(p: &ProcessInfo) -> ProcessReading {
    ProcessReading {
        pid: p.pid,
        used_bytes: match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => Some(b),
            UsedGpuMemory::Unavailable => None,
        },
    }
}

/// Sorts NVML's failures into "no driver here" and the rest.
fn classify(e: NvmlError) -> LiveError {
    match e {
        NvmlError::LibloadingError(_) => {
            LiveError::NoDriver("libnvidia-ml.so.1 could not be loaded".to_string())
        }
        NvmlError::DriverNotLoaded => {
            LiveError::NoDriver("the NVIDIA kernel driver is not loaded".to_string())
        }
        NvmlError::NoPermission => {
            LiveError::Source("no permission to query the NVIDIA driver".to_string())
        }
        other => LiveError::Source(other.to_string()),
    }
}

impl GpuSource for NvmlSource {
    fn name(&self) -> &str {
        "nvml"
    }

    fn read(&mut self) -> Result<Vec<GpuReading>, LiveError> {
        let count = self.nvml.device_count().map_err(classify)?;
        let mut gpus = Vec::new();
        let mut first_err = None;
        for index in 0..count {
            // One GPU fallen off the bus should not hide the others.
            match self.read_device(index) {
                Ok(g) => gpus.push(g),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) if gpus.is_empty() => Err(classify(e)),
            _ => Ok(gpus),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine with no NVIDIA driver (CI), opening fails cleanly with
    /// NoDriver; on a GPU machine it opens and reads.
    #[test]
    fn open_never_panics() {
        match NvmlSource::open() {
            Ok(mut s) => assert!(s.read().is_ok()),
            Err(e) => assert!(
                matches!(e, LiveError::NoDriver(_) | LiveError::Source(_)),
                "{e}"
            ),
        }
    }

    #[test]
    fn classifies_errors() {
        assert!(matches!(
            classify(NvmlError::DriverNotLoaded),
            LiveError::NoDriver(_)
        ));
        assert!(matches!(
            classify(NvmlError::NoPermission),
            LiveError::Source(_)
        ));
    }
}
