//! `memlens diff A B`: what B holds that A did not, and the reverse.

use crate::output;
use memlens::analysis::diff::{diff, SiteChange};
use memlens::units::{format_bytes, format_delta};
use std::fmt::Write;
use std::path::PathBuf;

/// Arguments of `memlens diff`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The earlier snapshot.
    pub a: PathBuf,
    /// The later snapshot.
    pub b: PathBuf,
    /// How many sites to show each way.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Print the JSON document.
    #[arg(long)]
    pub json: bool,
}

/// Runs `memlens diff`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    let a = super::load(&args.a)?;
    let b = super::load(&args.b)?;
    let d = diff(&a, &b);
    if args.json {
        output::print_json(&d)?;
        return Ok(output::OK);
    }
    let mut o = String::new();
    let _ = writeln!(
        o,
        "allocated: {} -> {} ({})",
        format_bytes(d.allocated_a),
        format_bytes(d.allocated_b),
        format_delta(d.allocated_b as i64 - d.allocated_a as i64)
    );
    let section = |o: &mut String, title: &str, list: &[SiteChange], sign: &str| {
        let _ = writeln!(o, "\n{title}");
        if list.is_empty() {
            let _ = writeln!(o, "  (none)");
        }
        for c in list.iter().take(args.top) {
            let _ = writeln!(
                o,
                "  {sign}{:>11}  {:>+6} blocks  {} in {}",
                format_bytes(c.bytes),
                c.count_b as i64 - c.count_a as i64,
                c.site,
                c.function
            );
        }
    };
    section(&mut o, "grown in B (held in B, not in A):", &d.grown, "+");
    section(&mut o, "shrunk in B:", &d.shrunk, "-");
    output::print_text(&o)?;
    Ok(output::OK)
}
