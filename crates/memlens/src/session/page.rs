//! Answers cut to fit an agent's context: a window of the main lists (with a
//! cursor for the next), stacks cut to their innermost frames, other long
//! lists cut, and a note of every cut in the answer's `answer` key.

use crate::{Error, Result};
use serde_json::{json, Map, Value};

/// Frames of each stack kept in a bounded answer (innermost first).
pub const STACK_FRAMES: usize = 8;
/// Items of a list other than the paged ones kept in a bounded answer.
pub const OTHER_ITEMS: usize = 20;
/// The largest page.
pub const MAX_LIMIT: usize = 1000;

/// Which part of an answer to give.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// Where the page starts: `None` for the first, else the `next_cursor`
    /// of the previous answer.
    pub cursor: Option<String>,
    /// Items of the main list per page.
    pub limit: usize,
    /// The whole document but for the paging of the main list: no stacks or
    /// other lists cut, nothing omitted.
    pub full: bool,
}

impl Default for Window {
    fn default() -> Self {
        Window {
            cursor: None,
            limit: 10,
            full: false,
        }
    }
}

/// The page of `doc` that `w` asks for, its `lists` cut to the window and
/// (unless `w.full`) its stacks and other lists bounded, with the `answer`
/// key saying what was cut and the cursor of the next page.
pub fn window(doc: &Value, lists: &[&str], w: &Window) -> Result<Value> {
    let offset = match &w.cursor {
        None => 0,
        Some(c) => c.parse::<usize>().map_err(|_| {
            Error::usage(format!(
                "cursor {c:?} is not one this server gave (pass the answer's next_cursor)"
            ))
        })?,
    };
    let limit = w.limit.clamp(1, MAX_LIMIT);
    let mut out = doc.clone();
    let mut totals = Map::new();
    let mut more = false;
    if let Some(obj) = out.as_object_mut() {
        for &key in lists {
            if let Some(Value::Array(items)) = obj.get_mut(key) {
                totals.insert(key.to_string(), items.len().into());
                more |= items.len() > offset + limit;
                let end = items.len().min(offset + limit);
                let start = offset.min(end);
                *items = items.drain(start..end).collect();
            }
        }
    }
    let mut cuts = Vec::new();
    let mut stacks_cut = 0usize;
    if !w.full {
        bound(&mut out, "", lists, &mut cuts, &mut stacks_cut);
    }
    let mut answer = json!({
        "paged": lists,
        "offset": offset,
        "limit": limit,
        "total": totals,
        "next_cursor": more.then(|| (offset + limit).to_string()),
    });
    if !cuts.is_empty() {
        answer["cut"] = Value::Array(cuts);
    }
    if stacks_cut > 0 {
        answer["stacks_cut_to"] = STACK_FRAMES.into();
        answer["stacks_cut"] = stacks_cut.into();
    }
    if let Some(obj) = out.as_object_mut() {
        obj.insert("answer".into(), answer);
    }
    Ok(out)
}

/// Drops the key `key` of the document (a part too large for an agent that
/// another tool answers), noting it in `answer.omitted`.
pub fn omit(doc: &mut Value, key: &str) {
    if let Some(obj) = doc.as_object_mut() {
        if obj.remove(key).is_some() {
            if let Some(Value::Object(a)) = obj.get_mut("answer") {
                let list = a.entry("omitted").or_insert_with(|| json!([]));
                if let Value::Array(l) = list {
                    l.push(key.into());
                }
            }
        }
    }
}

/// Sets `answer.key` of the document.
pub fn note(doc: &mut Value, key: &str, value: Value) {
    if let Some(Value::Object(a)) = doc.get_mut("answer") {
        a.insert(key.into(), value);
    }
}

/// Cuts every `stack` to [`STACK_FRAMES`] frames and every other list (but
/// the paged lists at the top) to [`OTHER_ITEMS`] items, noting each list
/// cut as `{at, total, kept}` (`at`: a JSON pointer).
fn bound(v: &mut Value, at: &str, paged: &[&str], cuts: &mut Vec<Value>, stacks: &mut usize) {
    match v {
        Value::Object(obj) => {
            for (k, child) in obj.iter_mut() {
                let here = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                if k == "stack" {
                    if let Value::Array(frames) = child {
                        if frames.len() > STACK_FRAMES {
                            frames.truncate(STACK_FRAMES);
                            *stacks += 1;
                        }
                        continue;
                    }
                }
                let top_paged = at.is_empty() && paged.contains(&k.as_str());
                if !top_paged {
                    if let Value::Array(items) = child {
                        if items.len() > OTHER_ITEMS {
                            cuts.push(
                                json!({"at": here, "total": items.len(), "kept": OTHER_ITEMS}),
                            );
                            items.truncate(OTHER_ITEMS);
                        }
                    }
                }
                bound(child, &here, paged, cuts, stacks);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter_mut().enumerate() {
                bound(child, &format!("{at}/{i}"), paged, cuts, stacks);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_the_main_list_and_cuts_the_rest() {
        let doc = json!({
            "schema": "memlens/1",
            "live": (0..25).map(|i| json!({"site": i, "stack": (0..12).collect::<Vec<_>>()})).collect::<Vec<_>>(),
            "steps": (0..30).collect::<Vec<_>>(),
        });
        let first = window(&doc, &["live"], &Window::default()).unwrap();
        assert_eq!(first["live"].as_array().unwrap().len(), 10);
        assert_eq!(
            first["live"][0]["stack"].as_array().unwrap().len(),
            STACK_FRAMES
        );
        assert_eq!(first["steps"].as_array().unwrap().len(), OTHER_ITEMS);
        assert_eq!(first["answer"]["total"]["live"], 25);
        assert_eq!(first["answer"]["next_cursor"], "10");
        assert_eq!(first["answer"]["cut"][0]["at"], "/steps");
        let last = window(
            &doc,
            &["live"],
            &Window {
                cursor: Some("20".into()),
                ..Window::default()
            },
        )
        .unwrap();
        assert_eq!(last["live"][0]["site"], 20);
        assert_eq!(last["live"].as_array().unwrap().len(), 5);
        assert!(last["answer"]["next_cursor"].is_null());
        let full = window(
            &doc,
            &["live"],
            &Window {
                limit: 100,
                full: true,
                ..Window::default()
            },
        )
        .unwrap();
        let mut back = full.clone();
        back.as_object_mut().unwrap().remove("answer");
        assert_eq!(back, doc, "a full page is the document");
        assert!(window(
            &doc,
            &["live"],
            &Window {
                cursor: Some("x".into()),
                ..Window::default()
            }
        )
        .is_err());
    }
}
