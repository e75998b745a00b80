//! `memlens top`: live per-process GPU memory with the allocator's view.
//!
//! NVML gives what each process holds on each GPU; processes running
//! `memlens.record` add PyTorch's own figures (allocated, reserved, step) in
//! small publication files. `top` shows both side by side, with the gap
//! between them (memory outside PyTorch's allocator), a history per process,
//! and alerts for steady growth and near-full GPUs.
//!
//! Modes: the terminal UI (default on a terminal); one line per sample
//! (`--no-ui`, or when stdout is not a terminal; JSON lines with `--json`);
//! one sample and exit (`--once`, with `--json` for scripts).

use crate::output;
use crate::tui;
use anyhow::Context;
use memlens::live::record::Recorder;
use memlens::live::{
    AboveRule, Alert, FakeSource, GpuSource, GrowthRule, LiveError, Model, ModelConfig, Sample,
    Sampler,
};
use memlens::units::format_bytes;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Arguments of `memlens top`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Example:\n  memlens top --interval 2")]
pub struct Args {
    /// Seconds between samples (e.g. 1, 0.5, 2s, 500ms).
    #[arg(long, value_name = "SECS", default_value = "1", value_parser = parse_seconds)]
    interval: f64,
    /// Take one sample, print it and exit.
    #[arg(long)]
    once: bool,
    /// Print JSON: one document with --once, else one JSON line per sample.
    #[arg(long)]
    json: bool,
    /// With --once: `openmetrics` prints the sample as OpenMetrics text (what
    /// Prometheus scrapes) instead of the table.
    #[arg(long, value_name = "FORMAT", value_parser = ["text", "openmetrics"], default_value = "text")]
    format: String,
    /// Serve OpenMetrics at http://ADDR/metrics (e.g. 127.0.0.1:9400) for
    /// Prometheus: each scrape takes a fresh sample. With --count N, stop
    /// after N scrapes.
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["once", "json", "no_ui"])]
    serve: Option<String>,
    /// Append every sample to FILE: JSON lines when it ends in .jsonl, CSV when .csv.
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
    /// No terminal UI: print one line per sample (the default when stdout is
    /// not a terminal).
    #[arg(long)]
    no_ui: bool,
    /// Stop after N samples.
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Alert when a process's memory grows steadily by RATE or more
    /// (e.g. 100MiB/min, 1MiB/s; default 100MiB/min): a least-squares slope
    /// over --growth-window that fits well (R² ≥ 0.8), with at least three
    /// separate rises and almost no drops.
    #[arg(long, value_name = "RATE", num_args = 0..=1, default_missing_value = "100MiB/min")]
    alert_growth: Option<String>,
    /// The window --alert-growth fits over, seconds.
    #[arg(long, value_name = "SECS", default_value = "60", value_parser = parse_seconds)]
    growth_window: f64,
    /// Alert when a GPU's used memory reaches THRESHOLD: a percentage (90%)
    /// or a size (75GiB).
    #[arg(long, value_name = "THRESHOLD")]
    alert_above: Option<String>,
    /// Run CMD (with `sh -c`) once when an alert fires, with MEMLENS_ALERT
    /// (the message), MEMLENS_ALERT_KIND (growth, gpu_full, leak_alarm),
    /// MEMLENS_PID (empty for a GPU alert) and MEMLENS_GPU set.
    #[arg(long, value_name = "CMD")]
    on_alert: Option<String>,
    /// Seconds of history kept for the graphs.
    #[arg(long, value_name = "SECS", default_value = "300", value_parser = parse_seconds)]
    history: f64,
    /// Read GPU figures from FILE (a JSON list of frames, each a list of GPU
    /// readings) instead of NVML: for trying `top` and testing with no GPU.
    #[arg(long, value_name = "FILE", hide = true)]
    fake_source: Option<PathBuf>,
}

/// Parses seconds: `1`, `0.5`, `2s`, `500ms`; between 0.05 s and one day.
fn parse_seconds(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let (num, scale) = if let Some(ms) = t.strip_suffix("ms") {
        (ms, 0.001)
    } else {
        (t.strip_suffix('s').unwrap_or(t), 1.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if (0.05..=86_400.0).contains(&(v * scale)) => Ok(v * scale),
        _ => Err(format!(
            "invalid duration {text:?}: expected seconds between 0.05 and 86400 (e.g. 1, 0.5, 500ms)"
        )),
    }
}

/// Runs `memlens top`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    let cfg = model_config(&args)?;
    let source = open_source(&args)?;
    let ui = !args.once
        && !args.no_ui
        && !args.json
        && args.serve.is_none()
        && std::io::stdout().is_terminal();
    let sampler = match &args.fake_source {
        // A fake source's PIDs hold no GPU device: trust them as they are.
        Some(_) => {
            let procfs = memlens::live::procfs::ProcFs::system().without_device_check();
            let dir = memlens::live::publication::default_dir(procfs.own_uid());
            Sampler::with_parts(source, procfs, dir)
        }
        None => Sampler::new(source),
    };
    let recorder = match &args.record {
        Some(path) => Some(Recorder::open(path)?),
        None => None,
    };
    let mut engine = Engine {
        sampler,
        model: Model::new(cfg),
        recorder,
        runner: args.on_alert.clone().map(|cmd| AlertRunner::new(cmd, ui)),
    };
    let interval = Duration::from_secs_f64(args.interval);
    if let Some(addr) = &args.serve {
        return serve(&mut engine, addr, args.count);
    }
    if args.once {
        return once(&mut engine, args.json, args.format == "openmetrics");
    }
    if ui {
        tui::run(&mut engine, interval, args.count).context("terminal UI")?;
        engine.finish();
        return Ok(output::OK);
    }
    headless(&mut engine, interval, args.count, args.json)
}

fn model_config(args: &Args) -> anyhow::Result<ModelConfig> {
    let growth = match &args.alert_growth {
        Some(rate) => Some(GrowthRule {
            min_rate: GrowthRule::parse_rate(rate)?,
            window_s: args.growth_window,
        }),
        None => None,
    };
    let above = args
        .alert_above
        .as_deref()
        .map(AboveRule::parse)
        .transpose()?;
    // Keep enough points for the history graphs and the growth window.
    let window = growth.map_or(0.0, |g| g.window_s);
    let len = (args.history.max(window) / args.interval).ceil() + 2.0;
    Ok(ModelConfig {
        history_len: len.min(100_000.0) as usize,
        growth,
        above,
        clear_after_s: (10.0f64).max(3.0 * args.interval),
    })
}

fn open_source(args: &Args) -> anyhow::Result<Box<dyn GpuSource>> {
    if let Some(path) = &args.fake_source {
        let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
        return Ok(Box::new(FakeSource::from_json(&text)?));
    }
    nvml_source()
}

#[cfg(feature = "nvml")]
fn nvml_source() -> anyhow::Result<Box<dyn GpuSource>> {
    let source = memlens::live::nvml::NvmlSource::open()?;
    Ok(Box::new(source))
}

#[cfg(not(feature = "nvml"))]
fn nvml_source() -> anyhow::Result<Box<dyn GpuSource>> {
    Err(LiveError::NoDriver(
        "this memlens was built without NVML support (cargo feature `nvml`)".to_string(),
    )
    .into())
}

/// One tick's work: sample, update the model, run alert commands, record.
struct Engine {
    sampler: Sampler,
    model: Model,
    recorder: Option<Recorder>,
    runner: Option<AlertRunner>,
}

impl Engine {
    /// Takes a sample; returns the alerts that just fired.
    fn step(&mut self) -> Result<Vec<Alert>, LiveError> {
        let sample = self.sampler.sample(memlens::live::unix_now())?;
        let fired = self.model.observe(sample);
        if let Some(r) = &mut self.runner {
            r.reap();
            for a in &fired {
                r.fire(a);
            }
        }
        if let (Some(rec), Some(s)) = (&mut self.recorder, self.model.latest()) {
            rec.write(s)?;
        }
        Ok(fired)
    }

    fn latest(&self) -> Option<&Sample> {
        self.model.latest()
    }

    /// Lets alert commands still running finish (a few seconds at most).
    fn finish(&mut self) {
        if let Some(r) = &mut self.runner {
            r.wait(Duration::from_secs(10));
        }
    }
}

impl tui::Ticker for Engine {
    fn tick(&mut self) -> Result<(), String> {
        let r = self.step().map(|_| ()).map_err(|e| e.to_string());
        match (&r, self.runner.as_mut().and_then(|r| r.error.take())) {
            (Ok(()), Some(e)) => Err(e),
            _ => r,
        }
    }

    fn model(&self) -> &Model {
        &self.model
    }
}

fn once(engine: &mut Engine, json: bool, openmetrics: bool) -> anyhow::Result<u8> {
    engine.step()?;
    engine.finish();
    let Some(sample) = engine.latest() else {
        return Ok(output::OK);
    };
    if openmetrics {
        output::print_text(&memlens::live::openmetrics::render(sample))?;
    } else if json {
        output::print_json(sample)?;
    } else {
        output::print_text(&table(sample))?;
    }
    Ok(output::OK)
}

/// `--serve`: a fresh sample at each scrape of /metrics.
fn serve(engine: &mut Engine, addr: &str, count: Option<u64>) -> anyhow::Result<u8> {
    let server = memlens::live::serve::MetricsServer::bind(addr)?;
    // The bound address first (port 0 picks one), for people and scripts.
    let url = format!("http://{}/metrics\n", server.local_addr()?);
    emit(&format!("memlens top: serving OpenMetrics at {url}"));
    let mut scrapes = 0u64;
    server.serve(
        || {
            engine.step()?;
            Ok(engine
                .latest()
                .map(memlens::live::openmetrics::render)
                .unwrap_or_default())
        },
        || {
            scrapes += 1;
            count.is_none_or(|c| scrapes < c)
        },
    )?;
    engine.finish();
    Ok(output::OK)
}

fn headless(
    engine: &mut Engine,
    interval: Duration,
    count: Option<u64>,
    json: bool,
) -> anyhow::Result<u8> {
    let mut next = Instant::now();
    let mut taken = 0u64;
    while count.is_none_or(|c| taken < c) {
        match engine.step() {
            Ok(fired) => {
                let mut text = String::new();
                if let Some(s) = engine.latest() {
                    if json {
                        let doc = serde_json::json!({"schema": memlens::JSON_SCHEMA});
                        let mut doc = doc.as_object().cloned().unwrap_or_default();
                        if let serde_json::Value::Object(m) = serde_json::to_value(s)? {
                            doc.extend(m);
                        }
                        text = serde_json::Value::Object(doc).to_string();
                        text.push('\n');
                    } else {
                        text = line(s);
                        for a in &fired {
                            text.push_str(&format!("ALERT {}: {}\n", a.kind.as_str(), a.message));
                        }
                    }
                }
                if !emit(&text) {
                    break; // stdout closed (`| head`): stop quietly.
                }
            }
            // No GPU figures at all on the first sample: nothing to watch.
            Err(e) if taken == 0 => return Err(e.into()),
            Err(e) => eprintln!("memlens: warning: {e}"),
        }
        if let Some(e) = engine.runner.as_mut().and_then(|r| r.error.take()) {
            eprintln!("memlens: warning: {e}");
        }
        taken += 1;
        if count.is_some_and(|c| taken >= c) {
            break;
        }
        next += interval;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
    engine.finish();
    Ok(output::OK)
}

/// Writes to stdout; false once stdout is closed.
fn emit(text: &str) -> bool {
    let mut out = std::io::stdout().lock();
    !matches!(
        out.write_all(text.as_bytes()).and_then(|_| out.flush()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe
    )
}

/// One line per sample: time, then each GPU and its processes.
fn line(s: &Sample) -> String {
    use tui::format::{clock, delta_or_dash, percent};
    let mut parts = vec![clock(s.time)];
    for g in &s.gpus {
        let mut part = format!(
            "GPU{} {}/{} ({:.0}%){}",
            g.index,
            format_bytes(g.used_bytes),
            format_bytes(g.total_bytes),
            percent(g.used_bytes, g.total_bytes),
            g.utilization_pct
                .map_or_else(String::new, |u| format!(" util {u}%"))
        );
        for p in &g.processes {
            part.push_str(&format!(
                " | pid {} {}",
                p.pid,
                p.memory().map_or_else(|| "?".to_string(), format_bytes)
            ));
            if let Some(t) = &p.torch {
                part.push_str(&format!(
                    " (reserved {}, allocated {}, gap {}{})",
                    format_bytes(t.reserved_bytes),
                    format_bytes(t.allocated_bytes),
                    delta_or_dash(t.gap_bytes),
                    t.step.map_or_else(String::new, |s| format!(", step {s}"))
                ));
            }
        }
        parts.push(part);
    }
    if s.gpus.is_empty() {
        parts.push("no GPU".to_string());
    }
    format!("{}\n", parts.join("  "))
}

/// The plain-text table of `--once`.
fn table(s: &Sample) -> String {
    use tui::format::{bytes_or_dash, command_label, delta_or_dash, percent, user_label};
    let mut out = String::new();
    if s.gpus.is_empty() {
        out.push_str("no GPU\n");
    }
    for g in &s.gpus {
        out.push_str(&format!(
            "GPU {}  {}  {} / {} ({:.0}%)  util {}\n",
            g.index,
            g.name,
            format_bytes(g.used_bytes),
            format_bytes(g.total_bytes),
            percent(g.used_bytes, g.total_bytes),
            g.utilization_pct
                .map_or_else(|| "—".to_string(), |u| format!("{u}%"))
        ));
        if let Some(a) = &g.account {
            let processes = format!(
                "  = processes {} (PyTorch reserved {})",
                format_bytes(a.processes_bytes),
                format_bytes(a.pytorch_reserved_bytes)
            );
            let unexplained = memlens::units::format_signed_bytes(a.unexplained_bytes);
            out.push_str(&if a.driver_in_used {
                format!(
                    "{processes} + kept by the driver {} + unexplained {unexplained}\n",
                    format_bytes(a.driver_bytes)
                )
            } else {
                format!(
                    "{processes} + unexplained {unexplained}; the driver keeps {} besides\n",
                    format_bytes(a.driver_bytes)
                )
            });
        }
        if g.processes.is_empty() {
            out.push_str("  no process\n");
            continue;
        }
        out.push_str(&format!(
            "  {:>8}  {:<10} {:>11} {:>11} {:>11} {:>12} {:>7}  COMMAND\n",
            "PID", "USER", "NVML USED", "RESERVED", "ALLOCATED", "GAP", "STEP"
        ));
        for p in &g.processes {
            let t = p.torch.as_ref();
            out.push_str(&format!(
                "  {:>8}  {:<10} {:>11} {:>11} {:>11} {:>12} {:>7}  {}\n",
                p.pid,
                user_label(p),
                bytes_or_dash(p.used_bytes),
                bytes_or_dash(t.map(|t| t.reserved_bytes)),
                bytes_or_dash(t.map(|t| t.allocated_bytes)),
                delta_or_dash(t.and_then(|t| t.gap_bytes)),
                t.and_then(|t| t.step)
                    .map_or_else(|| "—".to_string(), |s| s.to_string()),
                command_label(p)
            ));
        }
    }
    for a in &s.alerts {
        out.push_str(&format!("ALERT {}: {}\n", a.kind.as_str(), a.message));
    }
    out
}

/// Runs `--on-alert` commands without blocking the sampling, and reaps them.
struct AlertRunner {
    cmd: String,
    /// In the UI, a command's output would scribble over the screen.
    quiet: bool,
    children: Vec<Child>,
    /// The last failure to start the command, to report.
    error: Option<String>,
}

impl AlertRunner {
    fn new(cmd: String, quiet: bool) -> Self {
        AlertRunner {
            cmd,
            quiet,
            children: Vec::new(),
            error: None,
        }
    }

    fn fire(&mut self, a: &Alert) {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(&self.cmd)
            .env("MEMLENS_ALERT", &a.message)
            .env("MEMLENS_ALERT_KIND", a.kind.as_str())
            .env(
                "MEMLENS_PID",
                a.pid.map(|p| p.to_string()).unwrap_or_default(),
            )
            .env("MEMLENS_GPU", a.gpu.to_string())
            .stdin(Stdio::null());
        if self.quiet {
            c.stdout(Stdio::null()).stderr(Stdio::null());
        }
        match c.spawn() {
            Ok(child) => self.children.push(child),
            Err(e) => self.error = Some(format!("--on-alert: cannot run sh: {e}")),
        }
    }

    /// Forgets the commands that finished (so no zombie stays).
    fn reap(&mut self) {
        self.children
            .retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_)) | Err(_)));
    }

    fn wait(&mut self, within: Duration) {
        let end = Instant::now() + within;
        while !self.children.is_empty() && Instant::now() < end {
            self.reap();
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds() {
        assert_eq!(parse_seconds("1"), Ok(1.0));
        assert_eq!(parse_seconds("2s"), Ok(2.0));
        assert_eq!(parse_seconds("500ms"), Ok(0.5));
        assert!(parse_seconds("0").is_err());
        assert!(parse_seconds("-1").is_err());
        assert!(parse_seconds("NaN").is_err());
        assert!(parse_seconds("soon").is_err());
    }
}
