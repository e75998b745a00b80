//! Building and pruning the flame graph's flat node array.

use super::model::Flame;
use hashbrown::HashMap;

/// Nodes smaller than this fraction of the root are merged by default (0.1 %):
/// narrower than a pixel on most screens.
pub const DEFAULT_FLAME_MIN_FRACTION: f64 = 0.001;

/// Label of the root node.
pub const FLAME_ROOT: &str = "all live memory";

/// Label of the node that holds bytes allocated with no stack recorded, so
/// that the root's children add up to the root.
pub const FLAME_NO_STACK: &str = "<no stack>";

/// Label of the node that holds a parent's pruned children.
pub const FLAME_OTHER: &str = "\u{2026}other";

/// Builds a [`Flame`] from stacks and their bytes by merging common prefixes.
#[derive(Debug)]
pub struct FlameBuilder {
    flame: Flame,
    names: HashMap<String, u32>,
    children: HashMap<(u32, u32), u32>,
}

impl FlameBuilder {
    /// An empty graph titled `title` (e.g. "live at the peak").
    pub fn new(title: impl Into<String>) -> FlameBuilder {
        let mut b = FlameBuilder {
            flame: Flame {
                title: title.into(),
                ..Flame::default()
            },
            names: HashMap::default(),
            children: HashMap::default(),
        };
        let root = b.intern(FLAME_ROOT);
        b.flame.parent.push(0);
        b.flame.name.push(root);
        b.flame.value.push(0);
        b
    }

    fn intern(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.names.get(s) {
            return id;
        }
        let id = self.flame.names.len() as u32;
        self.flame.names.push(s.to_string());
        self.names.insert(s.to_string(), id);
        id
    }

    /// Adds `bytes` under a stack given outermost frame first; an empty stack
    /// goes under [`FLAME_NO_STACK`].
    pub fn add<I, S>(&mut self, frames_outermost_first: I, bytes: u64)
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.flame.value[0] = self.flame.value[0].saturating_add(bytes);
        let mut node = 0u32;
        let mut frames = frames_outermost_first.into_iter().peekable();
        if frames.peek().is_none() {
            let name = self.intern(FLAME_NO_STACK);
            self.child(0, name, bytes);
            return;
        }
        for f in frames {
            let name = self.intern(f.as_ref());
            node = self.child(node, name, bytes);
        }
    }

    /// The child `name` of `node` (created if new), with `bytes` added.
    fn child(&mut self, node: u32, name: u32, bytes: u64) -> u32 {
        let next = match self.children.get(&(node, name)) {
            Some(&c) => c,
            None => {
                let c = self.flame.parent.len() as u32;
                self.flame.parent.push(node);
                self.flame.name.push(name);
                self.flame.value.push(0);
                self.children.insert((node, name), c);
                c
            }
        };
        let v = &mut self.flame.value[next as usize];
        *v = v.saturating_add(bytes);
        next
    }

    /// Adds `bytes` under a stack given innermost frame first, as memlens
    /// stores stacks.
    pub fn add_innermost_first<S: AsRef<str>>(&mut self, stack: &[S], bytes: u64) {
        self.add(stack.iter().rev(), bytes);
    }

    /// The finished graph.
    pub fn finish(self) -> Flame {
        self.flame
    }
}

/// Merges every node smaller than `min_fraction` of the root into one
/// [`FLAME_OTHER`] child of its parent (with its whole subtree). The values of
/// the kept nodes do not change. A malformed graph (a parent after its child,
/// columns of unequal lengths) is cut at the first bad node.
pub fn prune_flame(f: &Flame, min_fraction: f64) -> Flame {
    let n = f.parent.len().min(f.name.len()).min(f.value.len());
    let mut out = Flame {
        title: f.title.clone(),
        ..Flame::default()
    };
    if n == 0 {
        return out;
    }
    let threshold = (f.value[0] as f64 * min_fraction.max(0.0)).ceil() as u64;
    let mut names: HashMap<u32, u32> = HashMap::default();
    let mut name_of = |old: Option<u32>, out: &mut Flame| -> u32 {
        // `None` is the "…other" label.
        let key = old.unwrap_or(u32::MAX);
        *names.entry(key).or_insert_with(|| {
            let s = match old {
                Some(id) => f.names.get(id as usize).map_or("?", String::as_str),
                None => FLAME_OTHER,
            };
            out.names.push(s.to_string());
            (out.names.len() - 1) as u32
        })
    };
    // New index of each old node; `None` for a node merged away.
    let mut map: Vec<Option<u32>> = vec![None; n];
    // The "…other" child of each new node, created on demand.
    let mut other_child: HashMap<u32, u32> = HashMap::default();
    let root_name = name_of(Some(f.name[0]), &mut out);
    out.parent.push(0);
    out.name.push(root_name);
    out.value.push(f.value[0]);
    map[0] = Some(0);
    for i in 1..n {
        let p = f.parent[i] as usize;
        if p >= i {
            break;
        }
        let Some(np) = map[p] else { continue };
        if f.value[i] >= threshold {
            let nm = name_of(Some(f.name[i]), &mut out);
            out.parent.push(np);
            out.name.push(nm);
            out.value.push(f.value[i]);
            map[i] = Some((out.parent.len() - 1) as u32);
        } else {
            let o = match other_child.get(&np) {
                Some(&o) => o,
                None => {
                    let nm = name_of(None, &mut out);
                    out.parent.push(np);
                    out.name.push(nm);
                    out.value.push(0);
                    let o = (out.parent.len() - 1) as u32;
                    other_child.insert(np, o);
                    o
                }
            };
            let v = &mut out.value[o as usize];
            *v = v.saturating_add(f.value[i]);
        }
    }
    out
}
