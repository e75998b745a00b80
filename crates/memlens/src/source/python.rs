//! The keeper search over Python text (the rules are in the parent module's
//! doc): statements are read one physical line at a time, split at their
//! top-level `=` and scanned for container calls, with string literals and
//! brackets respected.

use super::KeepPattern;

/// Where and how the allocating line's result is kept, with the fix.
#[derive(Debug)]
pub(super) struct KeptAt {
    /// The keeping line, from 0.
    pub index: usize,
    /// How it keeps the tensor.
    pub pattern: KeepPattern,
    /// The expression kept.
    pub kept: String,
    /// What to change.
    pub fix: String,
    /// The statement rewritten.
    pub replacement: String,
}

/// Methods that put their argument into a container.
const CONTAINER_METHODS: &[&str] = &[".append(", ".extend(", ".insert(", ".add(", ".appendleft("];

/// Words in a function's name that say it evaluates (no backward wanted).
const EVAL_WORDS: &[&str] = &[
    "eval", "valid", "val_", "test", "predict", "infer", "generate",
];

/// Calls after which the kept value no longer holds the tensor's graph (or the
/// tensor at all).
const SAFE_CALLS: &[&str] = &[
    ".item()",
    ".detach()",
    ".tolist()",
    ".numpy()",
    "float(",
    "int(",
];

/// The line that keeps the result of line `alloc` (from 0) alive, searched in
/// the same function: the allocating statement itself, then the lines after
/// it, then those before it (in a loop they see the previous iteration's value).
/// Only a line for which `ran` holds is named: a store in a branch that never
/// ran keeps nothing, and quoting it would send the user to the wrong line.
pub(super) fn find_keeper(
    lines: &[String],
    alloc: usize,
    ran: impl Fn(usize) -> bool,
) -> Option<KeptAt> {
    let first = lines.get(alloc)?;
    let f = Function::around(lines, alloc);
    let globals = f.globals(lines);
    let mut tracked: Vec<String> = Vec::new();
    let stmt = code(first).trim();
    if let Some(a) = split_assign(stmt) {
        if let Some(pattern) = store_kind(&a, &globals) {
            return Some(f.kept_at(lines, alloc, pattern, a.rhs.trim(), stmt));
        }
        tracked = assigned_names(a.lhs);
    } else if let Some((_, arg)) = container_call(stmt) {
        return Some(f.kept_at(lines, alloc, KeepPattern::Append, arg, stmt));
    }
    if tracked.is_empty() {
        return None;
    }
    let order = (alloc + 1..f.end).chain(f.body_start..alloc);
    for j in order {
        let stmt = code(&lines[j]).trim();
        if stmt.is_empty() {
            continue;
        }
        if let Some(a) = split_assign(stmt) {
            let rhs = a.rhs.trim();
            if !holds_tracked(rhs, &tracked) {
                // A tracked name given a new, unrelated value is no longer followed.
                for n in assigned_names(a.lhs) {
                    tracked.retain(|t| *t != n);
                }
                continue;
            }
            if let Some(pattern) = store_kind(&a, &globals) {
                if ran(j) {
                    return Some(f.kept_at(lines, j, pattern, rhs, stmt));
                }
                continue;
            }
            let names = assigned_names(a.lhs);
            if names.iter().any(|n| tracked.contains(n)) && !derives(rhs, &tracked) {
                // `x = x + self.mlp(x)`, `x = block(x)`: the tracked name now
                // holds a new tensor made from the old one; the name keeps
                // nothing past this line (and a layer's residual is not an
                // accumulation). Stop following it.
                tracked.retain(|t| !names.contains(t));
                if tracked.is_empty() {
                    return None;
                }
                continue;
            }
            if names.len() == 1 && mentions(rhs, &names[0]) && !derives(rhs, &tracked) {
                // `total = total + loss`: an accumulation spelled out.
                if ran(j) {
                    return Some(f.kept_at(lines, j, KeepPattern::AugmentedAssign, rhs, stmt));
                }
                continue;
            }
            // `loss = out.loss` names a part of it; `loss = loss_fn(logits, y)`
            // a tensor whose autograd graph keeps it. Follow the new name too.
            tracked.extend(names);
        } else if let Some((_, arg)) = container_call(stmt) {
            if holds_tracked(arg, &tracked) && ran(j) {
                return Some(f.kept_at(lines, j, KeepPattern::Append, arg, stmt));
            }
        }
    }
    None
}

/// Statements after which the rest of a block may not run.
const EXITS: &[&str] = &["return", "break", "continue", "raise"];

/// Whether line `k` (from 0) surely ran, given lines known to have run
/// (`recorded`, from 0: the lines of the recorded stacks). It is one of them,
/// or it lies in one straight run of statements with one: the same
/// indentation, nothing between them less indented (that would be another
/// block: an `else:`, the end of a loop), and, when `k` comes after the
/// recorded line, no `return`, `break`, `continue` or `raise` between them at
/// any depth (an exit in an `if` may have skipped it every time).
pub(super) fn surely_ran(lines: &[String], recorded: &[usize], k: usize) -> bool {
    if recorded.contains(&k) {
        return true;
    }
    let Some(line) = lines.get(k) else {
        return false;
    };
    let level = indent(line);
    recorded.iter().any(|&r| {
        let Some(other) = lines.get(r) else {
            return false;
        };
        if indent(other) != level || code(other).trim().is_empty() {
            return false;
        }
        let (from, to) = (r.min(k), r.max(k));
        lines[from + 1..to].iter().all(|l| {
            let stmt = code(l).trim();
            if stmt.is_empty() {
                return true;
            }
            let exits = EXITS
                .iter()
                .any(|e| stmt == *e || stmt.starts_with(&format!("{e} ")));
            indent(l) >= level && !(r < k && exits)
        })
    })
}

/// The function holding a line, bounded by indentation.
struct Function {
    /// The function's name (None at module level).
    name: Option<String>,
    /// The first line of its body.
    body_start: usize,
    /// One past its last line.
    end: usize,
}

impl Function {
    fn around(lines: &[String], at: usize) -> Self {
        let level = indent(&lines[at]);
        let def = (0..at).rev().find(|&j| {
            let t = code(&lines[j]).trim_start();
            (t.starts_with("def ") || t.starts_with("async def ")) && indent(&lines[j]) < level
        });
        let Some(def) = def else {
            return Function {
                name: None,
                body_start: 0,
                end: lines.len(),
            };
        };
        let def_level = indent(&lines[def]);
        let end = (def + 1..lines.len())
            .find(|&j| !code(&lines[j]).trim().is_empty() && indent(&lines[j]) <= def_level)
            .unwrap_or(lines.len());
        let head = code(&lines[def]).trim_start();
        let name = head
            .trim_start_matches("async ")
            .trim_start_matches("def ")
            .split('(')
            .next()
            .map(|n| n.trim().to_string());
        Function {
            name,
            body_start: def + 1,
            end,
        }
    }

    fn body<'a>(&self, lines: &'a [String]) -> impl Iterator<Item = &'a str> {
        lines[self.body_start..self.end].iter().map(|l| code(l))
    }

    /// Names the function declares `global`.
    fn globals(&self, lines: &[String]) -> Vec<String> {
        self.body(lines)
            .filter_map(|l| l.trim().strip_prefix("global "))
            .flat_map(|names| names.split(',').map(|n| n.trim().to_string()))
            .collect()
    }

    /// Whether this is evaluation code that should run under no_grad: its name
    /// says evaluation, and it neither runs backward nor turns autograd off.
    /// (A training `compute_loss` or `forward` runs no backward either: the
    /// caller does, so the name must say evaluation.)
    fn needs_no_grad(&self, lines: &[String]) -> bool {
        let Some(name) = self.name.as_deref() else {
            return false;
        };
        let name = name.to_ascii_lowercase();
        if !EVAL_WORDS.iter().any(|w| name.contains(w)) {
            return false;
        }
        // Strings are left out: a message naming `torch.no_grad()` is not a use.
        !self.body(lines).map(without_strings).any(|l| {
            l.contains(".backward(")
                || l.contains("no_grad")
                || l.contains("inference_mode")
                || l.contains("autograd.grad(")
        })
    }

    fn kept_at(
        &self,
        lines: &[String],
        index: usize,
        pattern: KeepPattern,
        kept: &str,
        stmt: &str,
    ) -> KeptAt {
        let (mut fix, replacement) = fix_for(pattern, kept, stmt);
        if self.needs_no_grad(lines) {
            fix.push_str(
                "; and run this code under `with torch.no_grad():`: it never calls backward, \
                 so the autograd graph is never needed",
            );
        }
        KeptAt {
            index,
            pattern,
            kept: kept.to_string(),
            fix,
            replacement,
        }
    }
}

/// The fix sentence and the rewritten statement.
fn fix_for(pattern: KeepPattern, kept: &str, stmt: &str) -> (String, String) {
    let lower = kept.to_ascii_lowercase();
    let scalar = pattern == KeepPattern::AugmentedAssign
        || lower.contains("loss")
        || [".sum()", ".mean()", ".norm()"]
            .iter()
            .any(|s| kept.ends_with(s));
    let on_object = pattern == KeepPattern::Attribute || stmt.starts_with("self.");
    let suffix = if scalar {
        ".item()"
    } else if on_object {
        ".detach()"
    } else {
        ".detach().cpu()"
    };
    let wrapped = if is_atom(kept) {
        format!("{kept}{suffix}")
    } else {
        format!("({kept}){suffix}")
    };
    let replacement = match stmt.rfind(kept) {
        Some(at) => format!("{}{}{}", &stmt[..at], wrapped, &stmt[at + kept.len()..]),
        None => stmt.to_string(),
    };
    let fix = if scalar {
        format!(
            "keep a Python number, not the tensor (it holds its autograd graph and every saved \
             activation alive): `{replacement}`"
        )
    } else if on_object {
        format!(
            "store the tensor without its autograd graph, `{replacement}`, or stop keeping it \
             (clear the container each step)"
        )
    } else {
        format!(
            "keep a copy off the GPU without the autograd graph: `{replacement}` (or a Python \
             number with `.item()`)"
        )
    };
    (fix, replacement)
}

/// How an assignment stores its value where it outlives the step, if it does.
fn store_kind(a: &Assign<'_>, globals: &[String]) -> Option<KeepPattern> {
    let lhs = a.lhs.trim();
    if lhs.starts_with("self.") || (lhs.contains('.') && !lhs.ends_with(']')) {
        return Some(KeepPattern::Attribute);
    }
    if lhs.ends_with(']') {
        return Some(KeepPattern::ItemAssign);
    }
    if globals.iter().any(|g| g == lhs) {
        return Some(KeepPattern::Global);
    }
    (a.op != "=").then_some(KeepPattern::AugmentedAssign)
}

/// A statement split at its top-level assignment operator.
#[derive(Debug, PartialEq)]
struct Assign<'a> {
    lhs: &'a str,
    op: &'a str,
    rhs: &'a str,
}

/// Splits `lhs op rhs` at the first `=`, `+=`, ... outside brackets and
/// strings (not `==`, `<=`, `>=`, `!=`, `:=`); an annotation `x: T = v` is
/// dropped from the left side.
fn split_assign(stmt: &str) -> Option<Assign<'_>> {
    let b = stmt.as_bytes();
    for i in top_level(stmt) {
        if b[i] != b'=' {
            continue;
        }
        let next = b.get(i + 1).copied();
        let prev = if i > 0 { b[i - 1] } else { 0 };
        if next == Some(b'=') || prev == b'=' || prev == b'!' || prev == b':' {
            continue;
        }
        if (prev == b'<' || prev == b'>') && !(i >= 2 && b[i - 2] == prev) {
            continue; // `<=` / `>=`, not `<<=` / `>>=`
        }
        let mut start = i;
        while start > 0 && b"+-*/%@&|^<>".contains(&b[start - 1]) {
            start -= 1;
        }
        let lhs = &stmt[..start];
        let lhs = top_level_find(lhs, b':').map_or(lhs, |c| &lhs[..c]);
        return Some(Assign {
            lhs,
            op: &stmt[start..=i],
            rhs: &stmt[i + 1..],
        });
    }
    None
}

/// The simple names an assignment's left side binds (`a, (b, *c) = ...`).
fn assigned_names(lhs: &str) -> Vec<String> {
    lhs.split(',')
        .map(|p| {
            p.trim()
                .trim_matches(|c| matches!(c, '(' | ')' | '[' | ']' | '*'))
        })
        .filter(|p| is_identifier(p))
        .map(str::to_string)
        .collect()
}

/// A container method call in a statement: (method, its argument holding the
/// value: the second of `insert(i, x)`, else the whole argument list).
fn container_call(stmt: &str) -> Option<(&'static str, &str)> {
    for m in CONTAINER_METHODS {
        let Some(at) = stmt.find(m) else { continue };
        let open = at + m.len() - 1;
        let close = matching_paren(stmt, open)?;
        let args = &stmt[open + 1..close];
        let arg = if *m == ".insert(" {
            top_level_find(args, b',').map_or(args, |c| &args[c + 1..])
        } else {
            args
        };
        return Some((m, arg.trim()));
    }
    None
}

/// Whether `expr` holds one of the tracked tensors (and no call that drops it).
fn holds_tracked(expr: &str, tracked: &[String]) -> bool {
    tracked.iter().any(|t| mentions(expr, t)) && !SAFE_CALLS.iter().any(|s| expr.contains(s))
}

/// Whether `expr` is a tracked name or a part of one (`out.loss`, `out[0]`).
fn derives(expr: &str, tracked: &[String]) -> bool {
    tracked.iter().any(|t| {
        expr.strip_prefix(t.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.') || rest.starts_with('['))
    }) && !SAFE_CALLS.iter().any(|s| expr.contains(s))
}

/// Whether `name` occurs in `expr` as a whole name (not `self.name`, not `name2`).
fn mentions(expr: &str, name: &str) -> bool {
    let b = expr.as_bytes();
    expr.match_indices(name).any(|(at, _)| {
        let before = at.checked_sub(1).map(|k| b[k]);
        let after = b.get(at + name.len()).copied();
        !before.is_some_and(|c| is_ident_byte(c) || c == b'.') && !after.is_some_and(is_ident_byte)
    })
}

/// A name, attribute or subscript chain with no operator or space: `out.loss`,
/// `x[0]`; `a + b` is not one.
fn is_atom(expr: &str) -> bool {
    !expr.is_empty()
        && top_level(expr).all(|i| {
            let c = expr.as_bytes()[i];
            is_ident_byte(c) || c == b'.' || c == b'[' || c == b']' || c == b'(' || c == b')'
        })
}

fn is_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && bytes.all(is_ident_byte)
}

fn is_ident_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The class whose method holds line `at` (0-based): the nearest `def` above
/// it with less indentation, then the nearest `class` above that one with less
/// indentation than the `def`. `None` for a function outside a class, or one
/// nested in another function (its class is not the module's). Read by
/// indentation, like the rest of this module: a multi-line string that
/// starts at column 0 inside the method can mislead it.
pub(super) fn enclosing_class(lines: &[String], at: usize) -> Option<String> {
    let mut limit = lines.get(at).map(|l| indent(l))?;
    let mut def_indent: Option<usize> = None;
    for line in lines[..=at].iter().rev() {
        let c = code(line);
        let t = c.trim_start();
        if t.is_empty() {
            continue;
        }
        let ind = indent(c);
        let header = |kw: &str| t.strip_prefix(kw).filter(|r| r.starts_with([' ', '\t']));
        match def_indent {
            None => {
                if ind < limit || header("def").is_some() || header("async").is_some() {
                    let is_def = header("def").is_some()
                        || header("async").is_some_and(|r| r.trim_start().starts_with("def "));
                    if is_def && ind <= limit {
                        def_indent = Some(ind);
                        limit = ind;
                    } else if ind < limit {
                        // A block header (if/for/with) of the function body.
                        limit = ind;
                    }
                }
            }
            Some(d) => {
                if ind < d {
                    if let Some(rest) = header("class") {
                        let name: String = rest
                            .trim_start()
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        return (!name.is_empty()).then_some(name);
                    }
                    // A def or anything else at a smaller indent: not a method.
                    return None;
                }
            }
        }
        if def_indent.is_none() && ind == 0 && limit == 0 {
            return None;
        }
    }
    None
}

/// Leading whitespace, a tab counting 8.
fn indent(line: &str) -> usize {
    line.chars()
        .take_while(|c| *c == ' ' || *c == '\t')
        .map(|c| if c == '\t' { 8 } else { 1 })
        .sum()
}

/// The line without its comment (a `#` outside string literals).
fn code(line: &str) -> &str {
    let mut quote: Option<u8> = None;
    let b = line.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match quote {
            Some(_) if c == b'\\' => i += 1,
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == b'\'' || c == b'"' => quote = Some(c),
            None if c == b'#' => return &line[..i],
            None => {}
        }
        i += 1;
    }
    line
}

/// The line with its string literals emptied (`f("no_grad")` -> `f("")`).
fn without_strings(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for c in line.chars() {
        match quote {
            Some(_) if escaped => escaped = false,
            Some(_) if c == '\\' => escaped = true,
            Some(q) if c == q => {
                quote = None;
                out.push(c);
            }
            Some(_) => {}
            None => {
                if c == '\'' || c == '"' {
                    quote = Some(c);
                }
                out.push(c);
            }
        }
    }
    out
}

/// Byte offsets of `s` outside brackets and string literals (the closing
/// brackets themselves excluded, the opening ones included).
fn top_level(s: &str) -> impl Iterator<Item = usize> + '_ {
    let b = s.as_bytes();
    let mut depth = 0i32;
    let mut quote: Option<u8> = None;
    let mut escaped = false;
    (0..b.len()).filter(move |&i| {
        let c = b[i];
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == b'\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            return false;
        }
        match c {
            b'\'' | b'"' => {
                quote = Some(c);
                false
            }
            b'(' | b'[' | b'{' => {
                depth += 1;
                depth == 1
            }
            b')' | b']' | b'}' => {
                depth -= 1;
                false
            }
            _ => depth == 0,
        }
    })
}

/// The first top-level occurrence of byte `c`.
fn top_level_find(s: &str, c: u8) -> Option<usize> {
    top_level(s).find(|&i| s.as_bytes()[i] == c)
}

/// The `)` closing the `(` at `open`.
fn matching_paren(s: &str, open: usize) -> Option<usize> {
    let mut depth = 0i32;
    let mut quote: Option<u8> = None;
    let b = s.as_bytes();
    let mut i = open;
    while i < b.len() {
        let c = b[i];
        match quote {
            Some(_) if c == b'\\' => i += 1,
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None => match c {
                b'\'' | b'"' => quote = Some(c),
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(i);
                    }
                }
                _ => {}
            },
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enclosing_class_of_a_method_line() {
        let src: Vec<String> = [
            "import torch",
            "class GPT2Attention(nn.Module):",
            "    def __init__(self):",
            "        pass",
            "",
            "    def forward(self, x):",
            "        if x is None:",
            "            y = x * 2",
            "        return y",
            "def helper():",
            "    return 1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(enclosing_class(&src, 7).as_deref(), Some("GPT2Attention"));
        assert_eq!(enclosing_class(&src, 8).as_deref(), Some("GPT2Attention"));
        assert_eq!(enclosing_class(&src, 10), None);
    }

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_string).collect()
    }

    fn keeper(text: &str, alloc_line: usize) -> Option<KeptAt> {
        find_keeper(&lines(text), alloc_line - 1, |_| true)
    }

    #[test]
    fn splits_assignments_not_comparisons_or_keywords() {
        let a = split_assign("out = model(input_ids=x, labels=x)").unwrap();
        assert_eq!(
            (a.lhs, a.op, a.rhs),
            ("out ", "=", " model(input_ids=x, labels=x)")
        );
        let a = split_assign("total += loss").unwrap();
        assert_eq!((a.lhs, a.op), ("total ", "+="));
        let a = split_assign("x >>= 2").unwrap();
        assert_eq!(a.op, ">>=");
        let a = split_assign("best: float = loss").unwrap();
        assert_eq!(a.lhs, "best");
        assert_eq!(split_assign("if a == b and c <= d:"), None);
        assert_eq!(split_assign("f(a=1)"), None);
        assert_eq!(split_assign("print('x = 1')"), None);
        assert_eq!(assigned_names("a, (b, *c) "), ["a", "b", "c"]);
    }

    #[test]
    fn strips_comments_outside_strings() {
        assert_eq!(code("x = 1  # note"), "x = 1  ");
        assert_eq!(code("s = '#' + \"#\"  # c"), "s = '#' + \"#\"  ");
    }

    #[test]
    fn append_after_the_allocation_in_an_eval_loop() {
        let src = "\
def evaluate(model, batches):
    losses = []
    for x in batches:
        out = model(x)
        losses.append(out.loss)  # keeps the graph
    return losses
";
        let k = keeper(src, 4).unwrap();
        assert_eq!(k.index, 4);
        assert_eq!(k.pattern, KeepPattern::Append);
        assert_eq!(k.kept, "out.loss");
        assert_eq!(k.replacement, "losses.append(out.loss.item())");
        assert!(
            k.fix.contains("`losses.append(out.loss.item())`"),
            "{}",
            k.fix
        );
        assert!(k.fix.contains("torch.no_grad()"), "{}", k.fix);
    }

    #[test]
    fn follows_names_assigned_from_the_result() {
        let src = "\
def train(model, xs, opt):
    for x in xs:
        out = model(x)
        loss = out.loss
        loss.backward()
        history[x.shape] = loss
";
        let k = keeper(src, 3).unwrap();
        assert_eq!((k.index, k.pattern), (5, KeepPattern::ItemAssign));
        assert_eq!(k.replacement, "history[x.shape] = loss.item()");
        assert!(!k.fix.contains("no_grad"), "it calls backward: {}", k.fix);
    }

    #[test]
    fn module_cache_gets_detach_and_no_no_grad_in_forward() {
        let src = "\
class Pyramid:
    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
            self.features.append(x)  # bug
        return self.head(x)
";
        let k = keeper(src, 4).unwrap();
        assert_eq!((k.index, k.pattern), (4, KeepPattern::Append));
        assert_eq!(k.replacement, "self.features.append(x.detach())");
        assert!(!k.fix.contains("no_grad"), "{}", k.fix);
    }

    #[test]
    fn no_no_grad_advice_for_a_training_compute_loss() {
        let src = "\
class T(Trainer):
    def compute_loss(self, model, inputs):
        outputs = model(**inputs)
        KEPT.append(outputs.logits)
        return outputs.loss
";
        let k = keeper(src, 3).unwrap();
        assert_eq!(k.replacement, "KEPT.append(outputs.logits.detach().cpu())");
        assert!(!k.fix.contains("no_grad"), "{}", k.fix);
    }

    #[test]
    fn attribute_global_and_accumulation() {
        let src = "\
def step(self, x):
    y = self.net(x)
    self.last = y
";
        let k = keeper(src, 2).unwrap();
        assert_eq!(
            (k.pattern, k.replacement.as_str()),
            (KeepPattern::Attribute, "self.last = y.detach()")
        );
        let src = "\
def step(x):
    global CACHE
    y = net(x) * 2
    y.sum().backward()
    CACHE = y
";
        let k = keeper(src, 3).unwrap();
        assert_eq!(
            (k.pattern, k.replacement.as_str()),
            (KeepPattern::Global, "CACHE = y.detach().cpu()")
        );
        let src = "\
def run(xs):
    total = 0
    for x in xs:
        loss = crit(net(x))
        loss.backward()
        total += loss
";
        let k = keeper(src, 4).unwrap();
        assert_eq!(
            (k.pattern, k.replacement.as_str()),
            (KeepPattern::AugmentedAssign, "total += loss.item()")
        );
        let src = "\
def run(xs):
    for x in xs:
        loss = crit(net(x))
        loss.backward()
        total = total + loss
";
        let k = keeper(src, 3).unwrap();
        assert_eq!(
            (k.pattern, k.replacement.as_str()),
            (
                KeepPattern::AugmentedAssign,
                "total = (total + loss).item()"
            )
        );
    }

    #[test]
    fn nothing_kept_when_the_value_is_made_safe_or_replaced() {
        let src = "\
def evaluate(model, xs):
    losses = []
    with torch.no_grad():
        for x in xs:
            out = model(x)
            losses.append(out.loss.item())
";
        assert!(keeper(src, 5).is_none());
        let src = "\
def f(x):
    y = g(x)
    y = None
    kept.append(y)
";
        assert!(keeper(src, 2).is_none());
    }

    #[test]
    fn the_allocating_statement_can_keep_it_itself() {
        let src = "\
def f(model, x):
    outputs.append(model(x))
";
        let k = keeper(src, 2).unwrap();
        assert_eq!((k.index, k.pattern), (1, KeepPattern::Append));
        assert_eq!(k.replacement, "outputs.append(model(x).detach().cpu())");
        let src = "\
def f(self, x):
    self.cache[x.shape] = self.net(x)
";
        let k = keeper(src, 2).unwrap();
        assert_eq!(k.pattern, KeepPattern::Attribute);
    }

    #[test]
    fn stays_inside_the_function() {
        let src = "\
def f(x):
    y = g(x)
    return 1

def other(y):
    kept.append(y)
";
        assert!(keeper(src, 2).is_none());
    }

    /// Issue 32: the planted forward-hook leak quoted `kept_outputs.append(outputs)`,
    /// a line in an `if` branch that never ran. Only a line the recorded
    /// stacks show ran, or one in a straight run with such a line, is named.
    #[test]
    fn a_store_in_a_branch_that_never_ran_is_not_the_keeper() {
        let src = "\
def step(model, x, keep):
    outputs = model(x)
    if keep:
        kept_outputs.append(outputs)
    cache.append(outputs)
";
        let text = lines(src);
        let ran = |j| surely_ran(&text, &[1], j);
        let k = find_keeper(&text, 1, ran).unwrap();
        assert_eq!(k.index, 4, "the unconditional store, not the branch's");
        assert!(!surely_ran(&text, &[1], 3));
        assert!(surely_ran(&text, &[1], 4));
        // The branch's store is named when the stacks show the branch ran.
        assert!(surely_ran(&text, &[1, 3], 3));
        let only_branch = "\
def step(model, x, keep):
    outputs = model(x)
    if keep:
        kept_outputs.append(outputs)
";
        let text = lines(only_branch);
        assert!(find_keeper(&text, 1, |j| surely_ran(&text, &[1], j)).is_none());
    }

    #[test]
    fn straight_runs_end_at_other_blocks_and_exits() {
        let src = "\
def f(xs):
    for x in xs:
        y = g(x)
        if x:
            continue
        kept.append(y)
    else:
        other.append(y)
    done.append(y)
";
        let text = lines(src);
        // After an exit (even one inside an `if`): not sure.
        assert!(!surely_ran(&text, &[2], 5));
        // Another block (the loop's `else:`), or a different depth: not sure.
        assert!(!surely_ran(&text, &[2], 7));
        assert!(!surely_ran(&text, &[2], 8));
        // Before the recorded line in its block: it ran on the way there.
        let before = "\
def f(xs):
    for x in xs:
        kept.append(y)
        if x:
            continue
        y = g(x)
";
        let text = lines(before);
        assert!(surely_ran(&text, &[5], 2));
    }

    /// The corpus's GPT: a residual (`x = x + self.mlp(x)`), a layer applied
    /// in a loop (`x = block(x)`) and a softmax over itself were named as
    /// accumulations that keep the tensor. A name given a new tensor made
    /// from its old one keeps nothing.
    #[test]
    fn a_name_rebound_to_a_new_tensor_keeps_nothing() {
        let src = "\
def forward(self, x):
    x = x + self.attn(self.ln1(x))
    x = x + self.mlp(self.ln2(x))
    return x
";
        assert!(keeper(src, 2).is_none());
        assert!(keeper(src, 3).is_none());
        let src = "\
def forward(self, idx):
    x = self.tok(idx) + self.pos(idx)
    for block in self.blocks:
        x = block(x)
    return self.head(x)
";
        assert!(keeper(src, 2).is_none());
        // An accumulator that is another name still keeps it.
        let src = "\
def train(model, xs):
    for x in xs:
        loss = model(x)
        total = total + loss
";
        let k = keeper(src, 3).unwrap();
        assert_eq!((k.index, k.pattern), (3, KeepPattern::AugmentedAssign));
    }

    /// The corpus's `leak_losses`: the leak is allocated in the model, the
    /// loss made from its output is what the loop keeps.
    #[test]
    fn follows_a_value_made_from_the_tracked_one() {
        let src = "\
def losses_loop(model, opt):
    logits = model(x)
    loss = loss_fn(logits, y)
    loss.backward(retain_graph=True)
    losses.append(loss)
";
        let k = keeper(src, 2).unwrap();
        assert_eq!((k.index, k.kept.as_str()), (4, "loss"));
    }
}
