//! Dev tool: renders a report from a `ReportData` JSON file, so the page and
//! its browser test can run before (or apart from) the analyses.
//!
//! ```text
//! cargo run -p memlens --example render_report -- DATA.json OUT.html
//! ```
//! The level-of-detail bounds ([`ReportData::bounded`]) are applied first.

use memlens::report::{render_html, ReportData};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output] = args.as_slice() else {
        eprintln!("usage: render_report DATA.json OUT.html");
        return ExitCode::from(2);
    };
    let text = match std::fs::read_to_string(input) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("render_report: error: {input}: {e}");
            return ExitCode::from(2);
        }
    };
    let data: ReportData = match serde_json::from_str(&text) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("render_report: error: {input}: invalid report data: {e}");
            return ExitCode::from(2);
        }
    };
    let html = render_html(&data.bounded());
    if let Err(e) = std::fs::write(output, &html) {
        eprintln!("render_report: error: {output}: {e}");
        return ExitCode::from(2);
    }
    println!("{output}: {} bytes", html.len());
    ExitCode::SUCCESS
}
