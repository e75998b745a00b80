//! Where GPU figures come from: the [`GpuSource`] trait the sampler reads
//! (NVML in real use) and [`FakeSource`], a scripted source for tests.

use super::LiveError;
use serde::{Deserialize, Serialize};

/// One GPU as the driver reports it at one instant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuReading {
    /// The driver's index (as `nvidia-smi` numbers GPUs).
    pub index: u32,
    /// The product name, e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    /// The GPU's UUID, when known.
    #[serde(default)]
    pub uuid: Option<String>,
    /// Total device memory in bytes.
    pub total_bytes: u64,
    /// Device memory in use in bytes (as `nvidia-smi` counts it).
    pub used_bytes: u64,
    /// What the driver keeps for itself outside `used_bytes`, when NVML's v2
    /// memory query says (its `reserved`); `None` where only v1 answered,
    /// whose `used` counts it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_reserved_bytes: Option<u64>,
    /// Percent of the last sample period a kernel was running, when known.
    #[serde(default)]
    pub utilization_pct: Option<u32>,
    /// The processes holding memory on this GPU.
    #[serde(default)]
    pub processes: Vec<ProcessReading>,
}

/// One process on one GPU as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessReading {
    /// The PID, in the driver's (the host's) PID namespace.
    pub pid: u32,
    /// Device memory the process holds, when the driver can tell (it cannot
    /// under MIG without privileges, nor under Windows' WDDM).
    pub used_bytes: Option<u64>,
}

/// A source of GPU readings. `memlens top` reads one per tick.
pub trait GpuSource {
    /// A short name for the source ("nvml", "fake").
    fn name(&self) -> &str;
    /// Reads every GPU and its processes now.
    fn read(&mut self) -> Result<Vec<GpuReading>, LiveError>;
}

/// A scripted source for tests: returns its frames in order, then repeats the
/// last one forever.
#[derive(Debug, Clone, Default)]
pub struct FakeSource {
    frames: Vec<Vec<GpuReading>>,
    next: usize,
}

impl FakeSource {
    /// A source that always returns `gpus`.
    pub fn fixed(gpus: Vec<GpuReading>) -> Self {
        Self::scripted(vec![gpus])
    }

    /// A source read from JSON: a list of frames, each a list of GPU readings
    /// (`memlens top --fake-source FILE`, for trying the UI with no GPU).
    pub fn from_json(text: &str) -> Result<Self, LiveError> {
        serde_json::from_str(text)
            .map(Self::scripted)
            .map_err(|e| LiveError::Usage(format!("invalid fake source: {e}")))
    }

    /// A source that returns `frames[0]`, `frames[1]`, ... then the last frame.
    pub fn scripted(frames: Vec<Vec<GpuReading>>) -> Self {
        FakeSource { frames, next: 0 }
    }
}

impl GpuSource for FakeSource {
    fn name(&self) -> &str {
        "fake"
    }

    fn read(&mut self) -> Result<Vec<GpuReading>, LiveError> {
        let frame = self
            .frames
            .get(self.next)
            .or_else(|| self.frames.last())
            .cloned()
            .unwrap_or_default();
        self.next = self.next.saturating_add(1);
        Ok(frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(used: u64) -> GpuReading {
        GpuReading {
            index: 0,
            name: "Fake GPU".into(),
            uuid: None,
            total_bytes: 100,
            used_bytes: used,
            driver_reserved_bytes: None,
            utilization_pct: Some(5),
            processes: vec![],
        }
    }

    #[test]
    fn scripted_frames_then_repeat_last() {
        let mut s = FakeSource::scripted(vec![vec![gpu(1)], vec![gpu(2)]]);
        let used: Vec<u64> = (0..4).map(|_| s.read().unwrap()[0].used_bytes).collect();
        assert_eq!(used, [1, 2, 2, 2]);
        assert!(FakeSource::default().read().unwrap().is_empty());
        let json = r#"[[{"index":0,"name":"G","total_bytes":100,"used_bytes":7,
            "processes":[{"pid":1,"used_bytes":null}]}]]"#;
        let g = FakeSource::from_json(json).unwrap().read().unwrap();
        assert_eq!(g[0].used_bytes, 7);
        assert_eq!(g[0].processes[0].used_bytes, None);
        assert!(FakeSource::from_json("[{").is_err());
    }
}
