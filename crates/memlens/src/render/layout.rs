//! Text layout shared by every renderer: the width rules, word wrapping,
//! clipping of long names, and series shown as `first -> last`, a slope and a
//! sparkline (the full series is only in `--json`).

use crate::units::{format_bytes, format_delta};

/// No line of human output is wider than this many columns.
pub const MAX_WIDTH: usize = 120;
/// Prose (fixes, explanations, notes) is wrapped at this many columns.
pub const PROSE_WIDTH: usize = 100;
/// A sparkline has at most this many characters.
pub const SPARK_WIDTH: usize = 40;

/// Display width of `s` in columns (one per `char`: memlens prints no wide glyphs).
pub fn width(s: &str) -> usize {
    s.chars().count()
}

/// Word-wraps `text` to lines of at most `width` columns (a single word longer
/// than that stays whole on its own line; callers clip names that can be).
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && self::width(&line) + 1 + self::width(word) > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// Appends the [`crate::trace::categories::category_mix`] of a table row on
/// the lines under it, in parentheses, indented by `indent` columns.
pub fn push_category_mix<'a>(
    out: &mut String,
    indent: usize,
    parts: impl IntoIterator<Item = (&'a str, u64)>,
) {
    let pad = " ".repeat(indent);
    push_wrapped(
        out,
        &format!("{pad}("),
        &pad,
        &format!("{})", crate::trace::categories::category_mix(parts)),
    );
}

/// Appends `text` wrapped to [`PROSE_WIDTH`]: the first line after `first`,
/// the next ones after `rest` (usually spaces as wide as `first`). Each line ends
/// with a newline.
pub fn push_wrapped(out: &mut String, first: &str, rest: &str, text: &str) {
    let room = PROSE_WIDTH.saturating_sub(width(first)).max(20);
    let lines = wrap(text, room);
    if lines.is_empty() {
        out.push_str(first.trim_end());
        out.push('\n');
    }
    for (i, line) in lines.iter().enumerate() {
        out.push_str(if i == 0 { first } else { rest });
        out.push_str(&clip(line, MAX_WIDTH.saturating_sub(width(rest))));
        out.push('\n');
    }
}

/// Appends `items` joined by `, ` and wrapped to [`PROSE_WIDTH`] between
/// items (an item is never split): the first line after `first`, the next
/// ones after `rest`.
pub fn push_list(out: &mut String, first: &str, rest: &str, items: &[String]) {
    let mut line = first.to_string();
    let mut empty = true;
    for (i, item) in items.iter().enumerate() {
        let piece = if i + 1 < items.len() {
            format!("{item},")
        } else {
            item.clone()
        };
        if !empty && width(&line) + 1 + width(&piece) > PROSE_WIDTH {
            out.push_str(&line);
            out.push('\n');
            line = rest.to_string();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(&piece);
        empty = false;
    }
    out.push_str(&line);
    out.push('\n');
}

/// `text` with every line kept within [`MAX_WIDTH`]: a longer line is wrapped
/// at spaces, continuation lines indented two more than the line, and a single
/// word wider than the room left is clipped at its start. Every renderer ends
/// with it, so no table row with a long path can break the rule.
pub fn fit(text: String) -> String {
    if text.lines().all(|l| width(l) <= MAX_WIDTH) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 64);
    for line in text.lines() {
        if width(line) <= MAX_WIDTH {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let indent = line.len() - line.trim_start_matches(' ').len();
        let first = " ".repeat(indent);
        let rest = " ".repeat((indent + 2).min(MAX_WIDTH / 2));
        let room = MAX_WIDTH - rest.len();
        for (i, piece) in wrap(line, room).iter().enumerate() {
            out.push_str(if i == 0 { &first } else { &rest });
            out.push_str(&clip(piece, room));
            out.push('\n');
        }
    }
    if !text.ends_with('\n') {
        out.pop();
    }
    out
}

/// `s` shortened to at most `max` columns by cutting its start (a site's
/// `file:line` is at its end): `…/models/block.py:41`. A pseudo-site
/// (`<cuBLAS workspace: first matmul at train.py:25>`) says what it is at
/// its start, so it loses its end instead.
pub fn clip(s: &str, max: usize) -> String {
    let n = width(s);
    if n <= max || max == 0 {
        return s.to_string();
    }
    if s.starts_with('<') {
        return clip_end(s, max);
    }
    let keep: String = s.chars().skip(n - (max - 1)).collect();
    format!("…{keep}")
}

/// A site and its function as `site in function`, or the site alone when the
/// function has no name (never a trailing ` in `), clipped to `max` columns.
pub fn site_in(site: &str, function: &str, max: usize) -> String {
    let whole = if function.trim().is_empty() {
        site.to_string()
    } else {
        format!("{site} in {function}")
    };
    if width(&whole) <= max {
        return whole;
    }
    // Too wide: the site (file:line) matters more than the function name.
    let site_room = max.saturating_sub(width(function) + 4).max(max / 2);
    let site = clip(site, site_room);
    let whole = if function.trim().is_empty() {
        site
    } else {
        format!("{site} in {function}")
    };
    clip_end(&whole, max)
}

/// `s` shortened to at most `max` columns by cutting its end.
pub fn clip_end(s: &str, max: usize) -> String {
    if width(s) <= max || max == 0 {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max - 1).collect();
    out.push('…');
    out
}

/// A sparkline of `values`, at most [`SPARK_WIDTH`] characters: longer series
/// are cut into that many buckets, each shown by its largest value.
pub fn sparkline(values: &[u64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    if values.is_empty() {
        return String::new();
    }
    let buckets = values.len().min(SPARK_WIDTH);
    let points: Vec<u64> = (0..buckets)
        .map(|b| {
            let lo = b * values.len() / buckets;
            let hi = ((b + 1) * values.len() / buckets).max(lo + 1);
            values[lo..hi].iter().copied().max().unwrap_or(0)
        })
        .collect();
    let min = points.iter().copied().min().unwrap_or(0);
    let max = points.iter().copied().max().unwrap_or(0);
    let span = max - min;
    points
        .iter()
        .map(|&v| {
            if span == 0 {
                BARS[0]
            } else {
                // u128: (v - min) * 7 cannot overflow however large the bytes.
                let level = (u128::from(v - min) * 7 / u128::from(span)) as usize;
                BARS[level.min(7)]
            }
        })
        .collect()
}

/// A series of byte figures as `first -> last (+delta over N points, +X/point) ▁▃▅█`.
pub fn byte_series(values: &[u64]) -> String {
    match values {
        [] => "(no points)".to_string(),
        [only] => format_bytes(*only),
        [first, .., last] => {
            let delta = *last as i128 - *first as i128;
            let per = delta / (values.len() as i128 - 1);
            format!(
                "{} -> {} ({} over {} points, {}/point)  {}",
                format_bytes(*first),
                format_bytes(*last),
                format_delta(clamp_i64(delta)),
                values.len(),
                format_delta(clamp_i64(per)),
                sparkline(values)
            )
        }
    }
}

fn clamp_i64(v: i128) -> i64 {
    v.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_and_clips() {
        assert_eq!(wrap("a bb ccc dddd", 6), vec!["a bb", "ccc", "dddd"]);
        assert_eq!(clip("abcdefghij", 5), "…ghij");
        // Issue 31 item 6: a pseudo-site keeps the name at its start.
        assert_eq!(
            clip("<cuBLAS workspace: first matmul at /a/b/c.py:25>", 20),
            "<cuBLAS workspace: …"
        );
        assert_eq!(clip_end("abcdefghij", 5), "abcd…");
        assert_eq!(site_in("model.py:41", "", 80), "model.py:41");
        assert_eq!(
            site_in("model.py:41", "forward", 80),
            "model.py:41 in forward"
        );
        let long = format!("{}/model.py:41", "x".repeat(200));
        let shown = site_in(&long, "forward", 60);
        assert_eq!(width(&shown), 60);
        assert!(shown.ends_with("model.py:41 in forward"));
        let mut l = String::new();
        let items: Vec<String> = (0..40).map(|i| format!("oom {i}")).collect();
        push_list(&mut l, "  trace: ", "    ", &items);
        assert!(l.lines().count() > 1 && l.lines().all(|x| width(x) <= PROSE_WIDTH));
        assert!(l.contains("oom 39") && l.starts_with("  trace: oom 0, oom 1,"));
        let mut o = String::new();
        push_wrapped(&mut o, "  fix: ", "       ", &"word ".repeat(60));
        assert!(o.lines().count() > 1);
        assert!(o.lines().all(|l| width(l) <= PROSE_WIDTH));
        assert!(o.lines().skip(1).all(|l| l.starts_with("       w")));
    }

    #[test]
    fn fit_keeps_every_line_within_the_width() {
        let long = format!("  {} {}", "word ".repeat(40), "x".repeat(300));
        let text = fit(format!("short\n{long}\n"));
        assert!(text.starts_with("short\n  word"));
        assert!(text.lines().all(|l| width(l) <= MAX_WIDTH), "{text}");
        assert!(
            text.lines().skip(2).all(|l| l.starts_with("    ")),
            "{text}"
        );
        assert_eq!(fit("a\nb".to_string()), "a\nb");
    }

    #[test]
    fn sparkline_is_bounded() {
        let series: Vec<u64> = (0..289).map(|i| i * 1_000_000).collect();
        let s = sparkline(&series);
        assert_eq!(width(&s), SPARK_WIDTH);
        assert!(s.starts_with('▁') && s.ends_with('█'));
        assert_eq!(sparkline(&[5, 5, 5]), "▁▁▁");
        assert_eq!(sparkline(&[0, u64::MAX]), "▁█");
        let line = byte_series(&series);
        assert!(line.starts_with("0 B -> "), "{line}");
        assert!(line.contains("289 points"), "{line}");
        assert!(width(&line) <= MAX_WIDTH);
    }
}
