//! The model behind `memlens top`: the latest sample, a bounded history per
//! GPU and per process, and the alerts.

use super::alerts::{detect_growth, AboveRule, Alert, AlertKind, AlertTracker, GrowthRule};
use super::history::Series;
use super::sample::Sample;
use std::collections::{HashMap, VecDeque};

/// How many fired alerts the model remembers for display.
const LOG_LEN: usize = 50;

/// Settings of the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Points kept per series (history length / refresh interval).
    pub history_len: usize,
    /// The growth rule, when `--alert-growth` is on.
    pub growth: Option<GrowthRule>,
    /// The near-full rule, when `--alert-above` is on.
    pub above: Option<AboveRule>,
    /// Seconds a condition must be gone before it may fire again.
    pub clear_after_s: f64,
}

impl Default for ModelConfig {
    /// Five minutes of history at one sample a second, no alert rules.
    fn default() -> Self {
        ModelConfig {
            history_len: 300,
            growth: None,
            above: None,
            clear_after_s: 10.0,
        }
    }
}

/// A process on a GPU: (GPU index, PID).
pub type ProcKey = (u32, u32);

/// The state of `memlens top` across samples.
#[derive(Debug, Clone)]
pub struct Model {
    cfg: ModelConfig,
    gpus: HashMap<u32, Series>,
    procs: HashMap<ProcKey, Series>,
    tracker: AlertTracker,
    latest: Option<Sample>,
    log: VecDeque<Alert>,
}

impl Model {
    /// An empty model.
    pub fn new(cfg: ModelConfig) -> Self {
        Model {
            tracker: AlertTracker::new(cfg.clear_after_s),
            cfg,
            gpus: HashMap::new(),
            procs: HashMap::new(),
            latest: None,
            log: VecDeque::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Takes a sample: extends the histories, evaluates the alert rules, fills
    /// `sample.alerts` with the conditions holding now, keeps the sample as
    /// the latest, and returns the alerts that just fired.
    pub fn observe(&mut self, mut sample: Sample) -> Vec<Alert> {
        let now = sample.time;
        let cap = self.cfg.history_len;
        self.gpus
            .retain(|k, _| sample.gpus.iter().any(|g| g.index == *k));
        self.procs.retain(|(gi, pid), _| {
            sample
                .gpus
                .iter()
                .any(|g| g.index == *gi && g.processes.iter().any(|p| p.pid == *pid))
        });
        let mut holding = Vec::new();
        for g in &sample.gpus {
            self.gpus
                .entry(g.index)
                .or_insert_with(|| Series::new(cap))
                .push(now, g.used_bytes);
            if let Some(rule) = &self.cfg.above {
                if rule.reached(g.used_bytes, g.total_bytes) {
                    holding.push(alert(
                        AlertKind::GpuFull,
                        g.index,
                        None,
                        Alert::full_message(g.index, g.used_bytes, g.total_bytes),
                    ));
                }
            }
            for p in &g.processes {
                if let Some(bytes) = p.memory() {
                    let series = self
                        .procs
                        .entry((g.index, p.pid))
                        .or_insert_with(|| Series::new(cap));
                    series.push(now, bytes);
                    if let Some(rule) = &self.cfg.growth {
                        let window = series.since(now - rule.window_s);
                        if let Some(found) = detect_growth(&window, rule) {
                            let msg = Alert::growth_message(p.pid, g.index, &found, rule.window_s);
                            holding.push(alert(AlertKind::Growth, g.index, Some(p.pid), msg));
                        }
                    }
                }
                if let Some(alarm) = p.torch.as_ref().and_then(|t| t.leak_alarm.as_ref()) {
                    let msg = format!("pid {} on GPU {}: leak alarm: {alarm}", p.pid, g.index);
                    holding.push(alert(AlertKind::LeakAlarm, g.index, Some(p.pid), msg));
                }
            }
        }
        let fired = self.tracker.update(now, &mut holding);
        for a in &fired {
            if self.log.len() == LOG_LEN {
                self.log.pop_front();
            }
            self.log.push_back(a.clone());
        }
        sample.alerts = holding;
        self.latest = Some(sample);
        fired
    }

    /// The latest sample.
    pub fn latest(&self) -> Option<&Sample> {
        self.latest.as_ref()
    }

    /// The history of a process's memory on a GPU.
    pub fn process_history(&self, gpu: u32, pid: u32) -> Option<&Series> {
        self.procs.get(&(gpu, pid))
    }

    /// The history of a GPU's used memory.
    pub fn gpu_history(&self, gpu: u32) -> Option<&Series> {
        self.gpus.get(&gpu)
    }

    /// The alerts fired so far, oldest first (the last few dozen).
    pub fn alert_log(&self) -> impl DoubleEndedIterator<Item = &Alert> {
        self.log.iter()
    }
}

fn alert(kind: AlertKind, gpu: u32, pid: Option<u32>, message: String) -> Alert {
    Alert {
        kind,
        gpu,
        pid,
        message,
        since: 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::super::sample::testing::*;
    use super::*;

    const NOW: f64 = 1_800_000_000.0;
    const MIB: u64 = 1 << 20;

    fn cfg() -> ModelConfig {
        ModelConfig {
            history_len: 120,
            growth: Some(GrowthRule {
                min_rate: MIB as f64,
                window_s: 20.0,
            }),
            above: Some(AboveRule::Percent(90.0)),
            clear_after_s: 10.0,
        }
    }

    #[test]
    fn growing_process_fires_once_and_plateau_does_not() {
        // pid 4242 leaks 8 MiB/s; pid 9999 warms up then holds.
        let frames: Vec<_> = (0..40u64)
            .map(|t| {
                let leak = 2 * GIB + t * 8 * MIB;
                let cache = 3 * GIB + t.min(3) * 512 * MIB;
                vec![gpu(0, leak + cache, &[(4242, leak), (9999, cache)])]
            })
            .collect();
        let (mut sampler, root) = world(frames, NOW);
        let mut model = Model::new(cfg());
        let mut fired = Vec::new();
        for t in 0..40 {
            let s = sampler.sample(NOW + t as f64).unwrap();
            fired.extend(model.observe(s));
        }
        assert_eq!(fired.len(), 1, "{fired:?}");
        assert_eq!(fired[0].kind, AlertKind::Growth);
        assert_eq!(fired[0].pid, Some(4242));
        assert!(fired[0]
            .message
            .contains("pid 4242 on GPU 0 grows steadily"));
        // Still holding at the end, with its original start time.
        let latest = model.latest().unwrap();
        assert_eq!(latest.alerts.len(), 1);
        assert!(latest.alerts[0].since < NOW + 39.0);
        assert_eq!(model.process_history(0, 4242).unwrap().len(), 40);
        assert_eq!(model.gpu_history(0).unwrap().len(), 40);
        assert_eq!(model.alert_log().count(), 1);
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn full_gpu_and_leak_alarm_fire_and_gone_processes_are_forgotten() {
        let (mut sampler, root) = world(
            vec![
                vec![gpu(0, 79 * GIB, &[(4242, 70 * GIB)])],
                vec![gpu(0, 79 * GIB, &[(4242, 70 * GIB)])],
                vec![gpu(0, GIB, &[])],
            ],
            NOW,
        );
        // The trainer's own detector fired.
        let pubs = root.join("pubs");
        let doc = std::fs::read_to_string(pubs.join("4242-0.json")).unwrap();
        let doc = doc.replace(
            r#""leak_alarm":null"#,
            r#""leak_alarm":"+12 MiB/step over 50 steps""#,
        );
        std::fs::write(pubs.join("4242-0.json"), doc).unwrap();

        let mut model = Model::new(cfg());
        let fired = model.observe(sampler.sample(NOW).unwrap());
        let kinds: Vec<AlertKind> = fired.iter().map(|a| a.kind).collect();
        assert_eq!(kinds, [AlertKind::GpuFull, AlertKind::LeakAlarm]);
        assert!(fired[0].message.contains("GPU 0 is 99% full"));
        assert!(fired[1].message.contains("+12 MiB/step"));
        assert!(model.observe(sampler.sample(NOW + 1.0).unwrap()).is_empty());
        // The trainer exits: NVML drops it and its publication goes.
        std::fs::remove_file(pubs.join("4242-0.json")).unwrap();
        assert!(model.observe(sampler.sample(NOW + 2.0).unwrap()).is_empty());
        assert!(model.process_history(0, 4242).is_none());
        assert!(model.latest().unwrap().alerts.is_empty());
        std::fs::remove_dir_all(root).unwrap();
    }
}
