//! `memlens report`: the self-contained HTML report alone.

use crate::output;
use memlens::render::documents::report_doc_in;
use std::path::PathBuf;

/// Arguments of `memlens report`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Example:\n  memlens report run.pickle.zst -o run.html")]
pub struct Args {
    /// Snapshots of one run, oldest first (or one Chrome trace exported by
    /// torch.profiler with profile_memory=True).
    #[arg(required = true)]
    pub snapshots: Vec<PathBuf>,
    /// Where to write the report (default: memlens-report.html, which is
    /// replaced only if memlens wrote it; a file named here is replaced).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Print the JSON document (`report`: the path written).
    #[arg(long)]
    pub json: bool,
    /// Serve the report at this address (`127.0.0.1:8600`; port 0 picks a
    /// free one) instead of writing it: a click on the timeline then shows
    /// the exact state at that event, replayed by memlens, whatever the
    /// trace's size. Runs until stopped (Ctrl-C).
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["output", "json"])]
    pub serve: Option<String>,
}

/// The report's default name, in the working directory.
const DEFAULT_OUTPUT: &str = "memlens-report.html";

/// Runs `memlens report`.
pub fn run(mut args: Args) -> anyhow::Result<u8> {
    if let Some(addr) = args.serve.take() {
        return serve(&args.snapshots, &addr);
    }
    let out_path = match args.output.take() {
        Some(p) => p,
        None => {
            let p = PathBuf::from(DEFAULT_OUTPUT);
            if p.exists() && !memlens::report::written_by_memlens(&p) {
                anyhow::bail!(
                    "{DEFAULT_OUTPUT}: exists and memlens did not write it; name the report with -o FILE (a file named with -o is replaced)"
                );
            }
            p
        }
    };
    run_to(args, out_path)
}

fn run_to(args: Args, out_path: PathBuf) -> anyhow::Result<u8> {
    if let [one] = args.snapshots.as_slice() {
        if let Some(trace) = super::profiler_trace(one)? {
            let name = one.display().to_string();
            if std::fs::canonicalize(&out_path).ok() == std::fs::canonicalize(one).ok() {
                anyhow::bail!("{}: is the input; write the report elsewhere (-o)", name);
            }
            let page = memlens::render::profiler::html(
                &memlens::profiler::summary(&trace),
                &memlens::profiler::peak(&trace, 15),
                &name,
            );
            std::fs::write(&out_path, page)
                .map_err(|e| anyhow::anyhow!("{}: {e}", out_path.display()))?;
            let doc = memlens::render::documents::ReportDoc {
                report: out_path.display().to_string(),
            };
            output::print(&doc, args.json, |d| format!("Report: {}\n", d.report))?;
            return Ok(output::OK);
        }
    }
    let read = super::load_all_for_peak(&args.snapshots)?;
    let named = super::named(&read.snaps);
    let set = memlens::analysis::peak::AnalysedSet::with_passes(&named, read.passes);
    let doc = report_doc_in(&set, &named, &out_path)?;
    output::print(&doc, args.json, |d| format!("Report: {}\n", d.report))?;
    Ok(output::OK)
}

/// `memlens report --serve ADDR`: the report and the state at any event, over
/// HTTP on `addr`, until the process is stopped.
fn serve(snapshots: &[PathBuf], addr: &str) -> anyhow::Result<u8> {
    if let [one] = snapshots {
        if super::profiler_trace(one)?.is_some() {
            anyhow::bail!(
                "{}: a torch.profiler trace has no allocator state to replay: write its report with -o FILE.html; --serve needs a memory snapshot",
                one.display()
            );
        }
    }
    let server = memlens::http::Server::bind(addr)
        .map_err(|e| anyhow::anyhow!("--serve {addr}: cannot listen: {e}"))?;
    let bound = server
        .local_addr()
        .map_err(|e| anyhow::anyhow!("--serve {addr}: {e}"))?;
    let read = super::load_all_for_peak(snapshots)?;
    let named = super::named(&read.snaps);
    let set = memlens::analysis::peak::AnalysedSet::with_passes(&named, read.passes);
    let d = memlens::doctor::diagnose_inputs_in(
        &set,
        &named,
        &memlens::doctor::DoctorOptions::default(),
    );
    let mut explorer = memlens::report::Explorer::new(&set, &named, &d);
    // The address first, alone on its line, for scripts that start memlens
    // on port 0 and read where it listens.
    println!("http://{bound}/");
    eprintln!("memlens: serving the report at http://{bound}/ (Ctrl-C stops)");
    server.serve(|req| (explorer.answer(req), true));
    Ok(output::OK)
}
