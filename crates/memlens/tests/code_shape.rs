//! Two rules on the shape of the library's own sources (`crates/memlens/src`,
//! leaving out `#[cfg(test)]` items and files named `tests.rs`), read with syn:
//!
//! * no function (free function, method, trait default, nested function) is
//!   longer than [`MAX_LINES`] lines, from its signature to its closing brace,
//!   except the few in [`ALLOWED_LONG`] that are being rewritten;
//! * no import circle between the crate's top-level modules (`crate::X`,
//!   `super::` paths that leave a top-level module, in `use` items, in types and
//!   expressions, and inside macro calls): the flow runs one way (see
//!   docs/architecture.md), so a cycle is listed with the lines that make it.

use proc_macro2::{TokenStream, TokenTree};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};
use syn::visit::{self, Visit};

/// The longest a library function may be, in lines.
const MAX_LINES: usize = 120;

/// Functions over [`MAX_LINES`] that the core is rewriting (file under
/// `src/`, function name). An entry that is no longer over the limit fails the
/// test, so the list only shrinks.
const ALLOWED_LONG: &[(&str, &str)] = &[];

/// The library's source folder.
fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// One source file: its path under `src/` (with `/`) and its syntax tree.
struct Source {
    rel: String,
    file: syn::File,
}

/// Every `.rs` file under `src/` but those named `tests.rs`, parsed, in path order.
fn sources() -> Vec<Source> {
    let root = src_dir();
    let mut paths = Vec::new();
    let mut todo = vec![root.clone()];
    while let Some(dir) = todo.pop() {
        let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|x| x == "rs")
                && path.file_name().is_some_and(|n| n != "tests.rs")
            {
                paths.push(path);
            }
        }
    }
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text =
                fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let rel = path
                .strip_prefix(&root)
                .expect("under src/")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            Source { rel, file }
        })
        .collect()
}

/// Whether `attrs` hold `#[cfg(test)]` (or a `cfg` naming `test` beside others,
/// as `cfg(all(test, ...))`, but not `cfg(not(test))`).
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        if !attr.path().is_ident("cfg") {
            return false;
        }
        let Ok(list) = attr.meta.require_list() else {
            return false;
        };
        let text = list.tokens.to_string();
        !text.contains("not")
            && text
                .split(|c: char| !c.is_alphanumeric() && c != '_')
                .any(|w| w == "test")
    })
}

/// Whether a struct, impl, module or other item is test-only.
fn item_is_test_only(item: &syn::Item) -> bool {
    match item {
        syn::Item::Fn(i) => is_test_only(&i.attrs),
        syn::Item::Mod(i) => is_test_only(&i.attrs),
        syn::Item::Impl(i) => is_test_only(&i.attrs),
        syn::Item::Use(i) => is_test_only(&i.attrs),
        syn::Item::Struct(i) => is_test_only(&i.attrs),
        syn::Item::Enum(i) => is_test_only(&i.attrs),
        syn::Item::Trait(i) => is_test_only(&i.attrs),
        syn::Item::Const(i) => is_test_only(&i.attrs),
        syn::Item::Static(i) => is_test_only(&i.attrs),
        syn::Item::Type(i) => is_test_only(&i.attrs),
        syn::Item::Macro(i) => is_test_only(&i.attrs),
        _ => false,
    }
}

/// A function found in the sources, with its length.
struct LongFn {
    rel: String,
    /// `Type::method`, `outer::inner` or the plain name.
    qualified: String,
    name: String,
    line: usize,
    lines: usize,
}

/// Collects every function's length in one file.
struct FnLengths<'a> {
    rel: &'a str,
    /// Names of the enclosing impl types and functions.
    scope: Vec<String>,
    found: Vec<LongFn>,
}

impl FnLengths<'_> {
    /// Records one function from its `fn` keyword's line to its closing brace.
    fn record(&mut self, sig: &syn::Signature, block: &syn::Block) {
        let start = sig.fn_token.span.start().line;
        let end = block.brace_token.span.close().end().line;
        let name = sig.ident.to_string();
        let mut qualified = self.scope.join("::");
        if !qualified.is_empty() {
            qualified.push_str("::");
        }
        qualified.push_str(&name);
        self.found.push(LongFn {
            rel: self.rel.to_string(),
            qualified,
            name,
            line: start,
            lines: end + 1 - start,
        });
    }
}

impl<'ast> Visit<'ast> for FnLengths<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !item_is_test_only(item) {
            visit::visit_item(self, item);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.record(&f.sig, &f.block);
        self.scope.push(f.sig.ident.to_string());
        visit::visit_item_fn(self, f);
        self.scope.pop();
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        let ty = &i.self_ty;
        let name = match &**ty {
            syn::Type::Path(p) => p
                .path
                .segments
                .last()
                .map_or_else(|| "?".to_string(), |s| s.ident.to_string()),
            _ => "?".to_string(),
        };
        self.scope.push(name);
        visit::visit_item_impl(self, i);
        self.scope.pop();
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if is_test_only(&f.attrs) {
            return;
        }
        self.record(&f.sig, &f.block);
        self.scope.push(f.sig.ident.to_string());
        visit::visit_impl_item_fn(self, f);
        self.scope.pop();
    }

    fn visit_item_trait(&mut self, t: &'ast syn::ItemTrait) {
        self.scope.push(t.ident.to_string());
        visit::visit_item_trait(self, t);
        self.scope.pop();
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.record(&f.sig, block);
        }
        self.scope.push(f.sig.ident.to_string());
        visit::visit_trait_item_fn(self, f);
        self.scope.pop();
    }
}

#[test]
fn no_function_is_longer_than_120_lines() {
    let mut long = Vec::new();
    for source in sources() {
        let mut lengths = FnLengths {
            rel: &source.rel,
            scope: Vec::new(),
            found: Vec::new(),
        };
        lengths.visit_file(&source.file);
        long.extend(lengths.found.into_iter().filter(|f| f.lines > MAX_LINES));
    }
    let allowed = |f: &LongFn| ALLOWED_LONG.contains(&(f.rel.as_str(), f.name.as_str()));
    let mut problems: Vec<String> = long
        .iter()
        .filter(|f| !allowed(f))
        .map(|f| {
            format!(
                "src/{}:{}: {} is {} lines (at most {MAX_LINES}): split it",
                f.rel, f.line, f.qualified, f.lines
            )
        })
        .collect();
    for (rel, name) in ALLOWED_LONG {
        if !long.iter().any(|f| f.rel == *rel && f.name == *name) {
            problems.push(format!(
                "src/{rel}: {name} is allowed to be long but is not (or is gone): \
                 take it off ALLOWED_LONG"
            ));
        }
    }
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
}

/// Where one module names another: file and line.
type Uses = BTreeMap<(String, String), Vec<String>>;

/// Collects the top-level modules each path in one file reaches.
struct ModuleUses<'a> {
    rel: &'a str,
    /// The module the code being read is in (file path, then inline modules).
    module: Vec<String>,
    /// Top-level module names (`mod X;` in lib.rs).
    tops: &'a BTreeSet<String>,
    /// Names re-exported at the crate root (`pub use x::Name;` in lib.rs) -> module.
    root_names: &'a BTreeMap<String, String>,
    uses: &'a mut Uses,
}

impl ModuleUses<'_> {
    /// Resolves a path given as its leading segment names (`crate`, `super`,
    /// `self`, or other) to the top-level module it reaches, if any.
    fn reached(&self, segments: &[String]) -> Option<String> {
        let first = segments.first()?;
        let rest: &[String] = if first == "crate" {
            &segments[1..]
        } else if first == "super" {
            let ups = segments.iter().take_while(|s| *s == "super").count();
            let depth = self.module.len().checked_sub(ups)?;
            if depth > 0 {
                return Some(self.module[0].clone());
            }
            &segments[ups..]
        } else {
            return None;
        };
        let name = rest.first()?;
        if self.tops.contains(name) {
            Some(name.clone())
        } else {
            self.root_names.get(name).cloned()
        }
    }

    /// Records an edge from this file's top-level module when `segments` leave it.
    fn note(&mut self, segments: &[String], line: usize) {
        let Some(from) = self.module.first().cloned() else {
            return;
        };
        if let Some(to) = self.reached(segments) {
            if to != from {
                let at = format!("src/{}:{line}", self.rel);
                let lines = self.uses.entry((from, to)).or_default();
                if lines.last() != Some(&at) {
                    lines.push(at);
                }
            }
        }
    }

    /// Walks a `use` tree, noting every leaf path.
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                prefix.push(n.ident.to_string());
                self.note(prefix, n.ident.span().start().line);
                prefix.pop();
            }
            syn::UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.note(prefix, r.ident.span().start().line);
                prefix.pop();
            }
            syn::UseTree::Glob(g) => {
                prefix.push("*".to_string());
                self.note(prefix, g.star_token.span.start().line);
                prefix.pop();
            }
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    /// Scans macro tokens for `crate :: name` and `super :: ...` paths.
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id) if id == "crate" || id == "super" => {
                    let line = id.span().start().line;
                    let mut segments = vec![id.to_string()];
                    let mut j = i + 1;
                    loop {
                        let colons = matches!((trees.get(j), trees.get(j + 1)),
                            (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
                                if a.as_char() == ':' && b.as_char() == ':');
                        match (colons, trees.get(j + 2)) {
                            (true, Some(TokenTree::Ident(next))) => {
                                segments.push(next.to_string());
                                j += 3;
                            }
                            _ => break,
                        }
                    }
                    self.note(&segments, line);
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for ModuleUses<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !item_is_test_only(item) {
            visit::visit_item(self, item);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test_only(&f.attrs) {
            visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        self.module.push(m.ident.to_string());
        visit::visit_item_mod(self, m);
        self.module.pop();
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        let line = path
            .segments
            .first()
            .map_or(0, |s| s.ident.span().start().line);
        self.note(&segments, line);
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
        visit::visit_macro(self, m);
    }

    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {
        // `pub(crate)` and `pub(in crate::x)` name no dependency.
    }
}

/// The module a file under `src/` is: `analysis/leaks.rs` -> [analysis, leaks],
/// `analysis/mod.rs` -> [analysis], `lib.rs` -> [].
fn module_of(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs");
        if stem != "mod" && stem != "lib" {
            parts.push(stem.to_string());
        }
    }
    parts
}

/// The edges between top-level modules, each with the lines that make it.
fn module_graph() -> Uses {
    let all = sources();
    let lib = &all
        .iter()
        .find(|s| s.rel == "lib.rs")
        .expect("src/lib.rs")
        .file;
    let mut tops = BTreeSet::new();
    let mut root_names = BTreeMap::new();
    for item in &lib.items {
        match item {
            syn::Item::Mod(m) if !is_test_only(&m.attrs) => {
                tops.insert(m.ident.to_string());
            }
            syn::Item::Use(u) => {
                let mut leaves = Vec::new();
                use_leaves(&mut Vec::new(), &u.tree, &mut leaves);
                for path in leaves {
                    if let (Some(first), Some(last)) = (path.first(), path.last()) {
                        root_names.insert(last.clone(), first.clone());
                    }
                }
            }
            _ => {}
        }
    }
    let mut uses = Uses::new();
    for source in all.iter().filter(|s| s.rel != "lib.rs") {
        let mut walker = ModuleUses {
            rel: &source.rel,
            module: module_of(&source.rel),
            tops: &tops,
            root_names: &root_names,
            uses: &mut uses,
        };
        walker.visit_file(&source.file);
    }
    uses
}

/// The leaf paths of a `use` tree, each as its segments (a rename keeps the
/// new name last).
fn use_leaves(prefix: &mut Vec<String>, tree: &syn::UseTree, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_leaves(prefix, &p.tree, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut path = prefix.clone();
            path.push(n.ident.to_string());
            out.push(path);
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            path.push(r.rename.to_string());
            out.push(path);
        }
        syn::UseTree::Glob(_) => {}
        syn::UseTree::Group(g) => {
            for tree in &g.items {
                use_leaves(prefix, tree, out);
            }
        }
    }
}

/// The shortest path from `from` to `to` in `edges`, both ends included.
fn shortest_path(
    edges: &BTreeMap<String, BTreeSet<String>>,
    from: &str,
    to: &str,
) -> Option<Vec<String>> {
    let mut came_from: BTreeMap<String, String> = BTreeMap::new();
    let mut queue = VecDeque::from([from.to_string()]);
    let mut seen = BTreeSet::from([from.to_string()]);
    while let Some(at) = queue.pop_front() {
        if at == to {
            let mut path = vec![at.clone()];
            let mut cur = at;
            while let Some(prev) = came_from.get(&cur) {
                path.push(prev.clone());
                cur = prev.clone();
            }
            path.reverse();
            return Some(path);
        }
        for next in edges.get(&at).into_iter().flatten() {
            if seen.insert(next.clone()) {
                came_from.insert(next.clone(), at.clone());
                queue.push_back(next.clone());
            }
        }
    }
    None
}

/// The cycles of the module graph: for every edge `a -> b` that some path
/// `b -> ... -> a` closes, the shortest such circle, each listed once
/// (rotated to start at its smallest module).
fn cycles(uses: &Uses) -> Vec<Vec<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in uses.keys() {
        edges.entry(from.clone()).or_default().insert(to.clone());
    }
    let mut found = BTreeSet::new();
    for (from, to) in uses.keys() {
        if let Some(back) = shortest_path(&edges, to, from) {
            let mut circle = vec![from.clone()];
            circle.extend(back.into_iter().take_while(|m| m != from));
            let smallest = (0..circle.len()).min_by_key(|&i| &circle[i]).unwrap_or(0);
            circle.rotate_left(smallest);
            found.insert(circle);
        }
    }
    found.into_iter().collect()
}

/// Circles allowed: none (issue 29 took the last, `Snapshot` holding the
/// replay beside its reader, out). The list only shrinks.
const KNOWN_CYCLES: &[&[&str]] = &[];

#[test]
fn no_import_circle_between_top_level_modules() {
    let uses = module_graph();
    let found = cycles(&uses);
    let mut report = String::new();
    for circle in &found {
        report.push_str(&format!(
            "cycle: {} -> {}\n",
            circle.join(" -> "),
            circle[0]
        ));
        for (i, from) in circle.iter().enumerate() {
            let to = &circle[(i + 1) % circle.len()];
            let lines = &uses[&(from.clone(), to.clone())];
            let shown: Vec<&str> = lines.iter().take(3).map(String::as_str).collect();
            let more = lines.len().saturating_sub(shown.len());
            let more = if more > 0 {
                format!(" (+{more} more)")
            } else {
                String::new()
            };
            report.push_str(&format!("    {from} -> {to}: {}{more}\n", shown.join(", ")));
        }
    }
    println!(
        "{} import cycle(s) between top-level modules\n{report}",
        found.len()
    );
    let mut names: Vec<Vec<String>> = found
        .iter()
        .map(|c| {
            let mut c = c.clone();
            c.sort();
            c
        })
        .collect();
    names.sort();
    let known: Vec<Vec<String>> = KNOWN_CYCLES
        .iter()
        .map(|c| c.iter().map(|m| m.to_string()).collect())
        .collect();
    assert_eq!(names, known, "\n{report}");
}

#[test]
fn the_graph_sees_crate_and_super_paths() {
    // The reader of the graph itself: files map to modules, and a few edges
    // that the sources plainly hold are found (every analysis reads
    // snapshots; the doctor composes the analyses).
    assert_eq!(module_of("analysis/leaks.rs"), ["analysis", "leaks"]);
    assert_eq!(module_of("analysis/mod.rs"), ["analysis"]);
    assert_eq!(module_of("doctor.rs"), ["doctor"]);
    assert!(module_of("lib.rs").is_empty());
    let uses = module_graph();
    for edge in [("analysis", "snapshot"), ("doctor", "analysis")] {
        let key = (edge.0.to_string(), edge.1.to_string());
        assert!(
            uses.contains_key(&key),
            "{edge:?} not found in {:?}",
            uses.keys()
        );
    }
    assert!(uses.keys().all(|(from, to)| from != to));
}
