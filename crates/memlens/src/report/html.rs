//! Rendering a [`ReportData`] as one self-contained HTML page.
//!
//! The template has placeholders `{{NAME}}` that are replaced in a single pass,
//! so text substituted into the page is never scanned for placeholders again.

use super::model::ReportData;
use crate::error::{Error, Result};
use std::path::PathBuf;

const TEMPLATE: &str = include_str!("../../assets/report/template.html");
const CSS: &str = include_str!("../../assets/report/report.css");
const JS: &str = include_str!("../../assets/report/report.js");
/// The overview and OOM sections (run by report.js, so included before it).
const VIEWS_JS: &str = include_str!("../../assets/report/views.js");
/// Any moment inspectable: clicks on the timeline (included before report.js).
const MOMENTS_JS: &str = include_str!("../../assets/report/moments.js");
/// The timeline filled with the cached segments (included before report.js).
const SEGMENTS_JS: &str = include_str!("../../assets/report/segments.js");
const UPLOT_JS: &str = include_str!("../../assets/report/vendor/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../../assets/report/vendor/uPlot.min.css");

/// Renders the report as one HTML page that needs no network.
pub fn render_html(data: &ReportData) -> String {
    // Serializing plain structs of strings, numbers and lists cannot fail.
    let json = serde_json::to_string(data).unwrap_or_else(|_| "{}".to_string());
    let title = if data.meta.title.is_empty() {
        "memlens report"
    } else {
        data.meta.title.as_str()
    };
    let mut out = String::with_capacity(
        TEMPLATE.len()
            + UPLOT_JS.len()
            + JS.len()
            + VIEWS_JS.len()
            + MOMENTS_JS.len()
            + SEGMENTS_JS.len()
            + json.len()
            + 4096,
    );
    let mut rest = TEMPLATE;
    while let Some(start) = rest.find("{{") {
        let Some(len) = rest[start..].find("}}") else {
            break;
        };
        let key = &rest[start + 2..start + len];
        out.push_str(&rest[..start]);
        match key {
            "TITLE" => escape_html(title, &mut out),
            "CSS" => out.push_str(CSS),
            "UPLOT_CSS" => out.push_str(UPLOT_CSS),
            "UPLOT_JS" => out.push_str(UPLOT_JS),
            "JS" => out.push_str(JS),
            "VIEWS_JS" => out.push_str(VIEWS_JS),
            "MOMENTS_JS" => out.push_str(MOMENTS_JS),
            "SEGMENTS_JS" => out.push_str(SEGMENTS_JS),
            "DATA" => script_json_into(&json, &mut out),
            // Not a placeholder: keep the text as it is.
            _ => out.push_str(&rest[start..start + len + 2]),
        }
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    out
}

/// Renders a report from its JSON form (a serialized [`ReportData`]); for
/// tests and for tools that compute the data elsewhere.
pub fn render_html_from_json(json: &str) -> Result<String> {
    let data: ReportData = serde_json::from_str(json).map_err(|e| Error::Json {
        path: PathBuf::from("<report data>"),
        what: e.to_string(),
    })?;
    Ok(render_html(&data))
}

/// Makes JSON text safe inside `<script type="application/json">`: `<` becomes
/// `\u003c` (so neither `</script>` nor `<!--` can appear) and U+2028/U+2029
/// become escapes. `<` only occurs inside JSON strings, so the result is the
/// same JSON value.
pub fn script_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    script_json_into(json, &mut out);
    out
}

fn script_json_into(json: &str, out: &mut String) {
    let mut last = 0;
    for (i, c) in json.char_indices() {
        let esc = match c {
            '<' => "\\u003c",
            '\u{2028}' => "\\u2028",
            '\u{2029}' => "\\u2029",
            _ => continue,
        };
        out.push_str(&json[last..i]);
        out.push_str(esc);
        last = i + c.len_utf8();
    }
    out.push_str(&json[last..]);
}

/// Escapes text for HTML element content and attribute values.
fn escape_html(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_json_escapes_lt_and_line_separators() {
        let s = script_json("{\"a\":\"</script><!--\u{2028}\u{2029}é\"}");
        assert_eq!(s, "{\"a\":\"\\u003c/script>\\u003c!--\\u2028\\u2029é\"}");
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["a"], "</script><!--\u{2028}\u{2029}é");
    }

    #[test]
    fn assets_cannot_close_their_tags() {
        for (name, text) in [
            ("report.js", JS),
            ("views.js", VIEWS_JS),
            ("moments.js", MOMENTS_JS),
            ("segments.js", SEGMENTS_JS),
            ("uPlot", UPLOT_JS),
        ] {
            assert!(!text.to_ascii_lowercase().contains("</script"), "{name}");
        }
        for (name, text) in [("report.css", CSS), ("uPlot.css", UPLOT_CSS)] {
            assert!(!text.to_ascii_lowercase().contains("</style"), "{name}");
        }
    }
}
