//! `memlens mcp`: a Model Context Protocol server over stdio, for coding
//! agents. Each tool asks the question its command answers; the session
//! (`memlens::session`) reads each snapshot once, keeps it analysed, pages
//! the answers and refuses paths outside the folders given with `--root`.
//! This module only maps the protocol's calls onto that session.

use memlens::session::{Question, Session, Window};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, ServerCapabilities, ServerConfig};
use rmcp::{schemars, tool, tool_handler, tool_router, ServerHandler, ServiceExt};
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Arc;

/// Arguments of `memlens mcp`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Example (register with an agent client):\n  memlens mcp --root ~/runs\n\n\
                  The server speaks JSON-RPC on stdin/stdout; it logs nothing to stdout."
)]
pub struct Args {
    /// A folder the server may read snapshots from (repeatable; default:
    /// the current folder). Relative paths in questions are under the first.
    #[arg(long, value_name = "DIR")]
    pub root: Vec<PathBuf>,
}

/// Runs the server until the client closes stdin.
pub fn run(args: Args) -> anyhow::Result<u8> {
    let roots = if args.root.is_empty() {
        vec![std::env::current_dir()?]
    } else {
        args.root
    };
    let session = Arc::new(Session::new(&roots)?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let service = Server::new(session).serve(rmcp::transport::stdio()).await?;
        service.waiting().await?;
        anyhow::Ok(())
    })?;
    Ok(crate::output::OK)
}

/// Which page of an answer to give (every tool takes these).
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
struct Page {
    /// The `answer.next_cursor` of the previous answer, for the next page.
    cursor: Option<String>,
    /// Items of the main list per page (default 10, at most 1000).
    limit: Option<usize>,
    /// The whole document (stacks and other lists not cut; doctor's
    /// `diagnosis` included). Large: ask only when needed.
    full: Option<bool>,
}

impl Page {
    fn window(&self) -> Window {
        Window {
            cursor: self.cursor.clone(),
            limit: self.limit.unwrap_or(Window::default().limit),
            full: self.full.unwrap_or(false),
        }
    }
}

/// One snapshot.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct OneSnapshot {
    /// The snapshot file (.pickle, .pickle.gz, .pickle.zst or JSON).
    snapshot: String,
    #[serde(flatten)]
    page: Page,
}

/// Several snapshots.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct Snapshots {
    /// The snapshot files (of one run over time, or one per rank).
    snapshots: Vec<String>,
    #[serde(flatten)]
    page: Page,
}

/// `peak`'s question.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct PeakAsk {
    /// The snapshot file.
    snapshot: String,
    /// `site` (default) or `module`.
    by: Option<String>,
    #[serde(flatten)]
    page: Page,
}

/// `oom`'s question.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct OomAsk {
    /// A snapshot whose trace holds the OOM.
    snapshot: String,
    /// The GPU's total memory: `80GiB`, bytes, or a name such as `H100`.
    device_memory: Option<String>,
    /// The failing step's batch size.
    batch: Option<u64>,
    /// The run's optimizer (`adamw`, `adam`, `sgd-momentum`, `sgd`), whose
    /// state a run that failed in its first step had not made yet (Adam(W)'s
    /// is assumed without it).
    optimizer: Option<String>,
    /// The `OutOfMemoryError` text of the same failure (a traceback or log
    /// is fine): it tells the device's total and the memory cap.
    message: Option<String>,
    #[serde(flatten)]
    page: Page,
}

/// `fit`'s question.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct FitAsk {
    /// Two snapshots of the same run at two batch sizes; or one recording
    /// (with `checkpoint`, or alone: replayed as it ran), or one step
    /// traced with fake tensors by `memlens.trace_step`.
    probes: Vec<String>,
    /// The probes' batch sizes, in order (none with `checkpoint`).
    #[serde(default)]
    recorded_batch: Vec<u32>,
    /// A module to predict under activation checkpointing (a class such as
    /// `GPT2Block`, or an instance such as `transformer.h.3`), from one
    /// recording made with `memlens.record(model=...)`.
    checkpoint: Option<String>,
    /// The batch size to predict.
    batch: Option<u32>,
    /// Bytes the allocator may reserve, e.g. `70GiB` (the CLI's `--limit`).
    memory_limit: Option<String>,
    /// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax.
    config: Option<String>,
    #[serde(flatten)]
    page: Page,
}

/// `diff`'s question.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct DiffAsk {
    /// The earlier snapshot.
    a: String,
    /// The later snapshot.
    b: String,
    #[serde(flatten)]
    page: Page,
}

/// `state`'s question.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct StateAsk {
    /// The snapshot file.
    snapshot: String,
    /// The event index (the indices other answers give, e.g. peak_event_index).
    event: usize,
    /// The device (default: the first with a trace).
    device: Option<u32>,
    #[serde(flatten)]
    page: Page,
}

/// `doctor`'s question.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct DoctorAsk {
    /// The snapshot files.
    snapshots: Vec<String>,
    /// The GPU's total memory: `80GiB`, bytes, or a name such as `H100`.
    device_memory: Option<String>,
    #[serde(flatten)]
    page: Page,
}

/// The server: the session and the tools over it.
#[derive(Clone)]
struct Server {
    session: Arc<Session>,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Server {
    fn new(session: Arc<Session>) -> Server {
        Server {
            session,
            tool_router: Self::tool_router(),
        }
    }

    /// Answers `q` off the protocol's threads; a failure is a tool error the
    /// agent reads (the server goes on serving).
    async fn ask(&self, q: anyhow::Result<Question>, page: &Page) -> CallToolResult {
        let q = match q {
            Ok(q) => q,
            Err(e) => return failed(&format!("{e:#}")),
        };
        let session = Arc::clone(&self.session);
        let w = page.window();
        match tokio::task::spawn_blocking(move || session.answer(&q, &w)).await {
            Ok(Ok(doc)) => CallToolResult::structured(doc),
            Ok(Err(e)) => failed(&e.to_string()),
            Err(e) => failed(&format!("internal error: {e}")),
        }
    }

    #[tool(
        description = "Allocator state at dump time (memlens summary): reserved, allocated, fragmentation, trace event counts, allocator settings."
    )]
    async fn summary(&self, Parameters(p): Parameters<OneSnapshot>) -> CallToolResult {
        let q = Question::Summary {
            snapshot: p.snapshot,
        };
        self.ask(Ok(q), &p.page).await
    }

    #[tool(
        description = "The peak (memlens peak): peak allocated/reserved bytes, its event index, and what was live at it by allocation site (file:line) and category, or by module (by=\"module\"). Pages through live_at_peak (or groups)."
    )]
    async fn peak(&self, Parameters(p): Parameters<PeakAsk>) -> CallToolResult {
        let by_module = match p.by.as_deref() {
            None | Some("site") => Ok(false),
            Some("module") => Ok(true),
            Some(other) => Err(anyhow::anyhow!("by: {other:?} is neither site nor module")),
        };
        let q = by_module.map(|by_module| Question::Peak {
            snapshot: p.snapshot,
            by_module,
        });
        self.ask(q, &p.page).await
    }

    #[tool(
        description = "Leak candidates (memlens leaks): sites whose live memory grows across steps of one trace or across snapshots, with the line that keeps them and, when memlens.record wrote it, what holds them."
    )]
    async fn leaks(&self, Parameters(p): Parameters<Snapshots>) -> CallToolResult {
        let q = Question::Leaks {
            snapshots: p.snapshots,
        };
        self.ask(Ok(q), &p.page).await
    }

    #[tool(
        description = "Why an allocation failed (memlens oom): the cause, the state before the failure, and fixes checked by replaying the trace. Pages through live_at_oom."
    )]
    async fn oom(&self, Parameters(p): Parameters<OomAsk>) -> CallToolResult {
        let optimizer = p
            .optimizer
            .as_deref()
            .map(|name| {
                memlens::oom::FirstStepOptimizer::named(name)
                    .map_err(|e| anyhow::anyhow!("optimizer: {e}"))
            })
            .transpose();
        let q = device_memory(p.device_memory.as_deref()).and_then(|device_memory| {
            Ok(Question::Oom {
                snapshot: p.snapshot,
                device_memory,
                batch: p.batch,
                optimizer: optimizer?,
                message: p.message,
            })
        });
        self.ask(q, &p.page).await
    }

    #[tool(
        description = "Will the run fit at another batch size (memlens fit): from two probes at two batch sizes, the predicted peak and the largest batch under a limit; or, with checkpoint, the recorded run with that module under activation checkpointing; or one file alone (a recording, or a step traced with fake tensors by memlens.trace_step, no GPU) replayed through the allocator model under the limit."
    )]
    async fn fit(&self, Parameters(p): Parameters<FitAsk>) -> CallToolResult {
        let limit = p
            .memory_limit
            .as_deref()
            .map(memlens::units::parse_size)
            .transpose()
            .map_err(|e| anyhow::anyhow!("memory_limit: {e}"));
        let q = limit.map(|limit| Question::Fit {
            probes: p.probes,
            recorded_batch: p.recorded_batch,
            checkpoint: p.checkpoint,
            batch: p.batch,
            limit,
            config: p.config,
        });
        self.ask(q, &p.page).await
    }

    #[tool(
        description = "What snapshot b holds that a did not, and the reverse, by allocation site (memlens diff). Pages through grown and shrunk together."
    )]
    async fn diff(&self, Parameters(p): Parameters<DiffAsk>) -> CallToolResult {
        let q = Question::Diff { a: p.a, b: p.b };
        self.ask(Ok(q), &p.page).await
    }

    #[tool(
        description = "The ranks of a distributed job (memlens doctor on rank files): each rank's peak and the imbalance findings naming the line that makes one rank heavier."
    )]
    async fn ranks(&self, Parameters(p): Parameters<Snapshots>) -> CallToolResult {
        let q = Question::Ranks {
            snapshots: p.snapshots,
        };
        self.ask(Ok(q), &p.page).await
    }

    #[tool(
        description = "The allocator's exact state right after one event of the trace (memlens state): totals, segments, largest free block, and what was live by site. Use it to check an event index another answer gives."
    )]
    async fn state(&self, Parameters(p): Parameters<StateAsk>) -> CallToolResult {
        let q = Question::State {
            snapshot: p.snapshot,
            event: p.event,
            device: p.device,
        };
        self.ask(Ok(q), &p.page).await
    }

    #[tool(
        description = "The whole diagnosis (memlens doctor --no-report): findings, most serious first, each with its site and bytes. Start here; the other tools give each finding's evidence."
    )]
    async fn doctor(&self, Parameters(p): Parameters<DoctorAsk>) -> CallToolResult {
        let q = device_memory(p.device_memory.as_deref()).map(|device_memory| Question::Doctor {
            snapshots: p.snapshots,
            device_memory,
        });
        self.ask(q, &p.page).await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        let roots: Vec<String> = self
            .session
            .roots()
            .iter()
            .map(|r| r.display().to_string())
            .collect();
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_instructions(
            format!(
            "memlens explains PyTorch CUDA memory snapshots (torch.cuda.memory._dump_snapshot). \
                 Start with doctor, then ask peak, leaks, oom, diff, ranks or fit for the \
                 evidence, and state to check an event index. Answers are the memlens/1 JSON \
                 documents of the CLI, a page at a time (answer.next_cursor). Snapshots are read \
                 from: {}",
            roots.join(", ")
        ),
        )
    }
}

/// A tool error: the message, for the agent to read.
fn failed(message: &str) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!("memlens: {message}"))])
}

/// A device memory given as a size or a GPU name.
fn device_memory(s: Option<&str>) -> anyhow::Result<Option<u64>> {
    s.map(memlens::units::parse_device_memory)
        .transpose()
        .map_err(|e| anyhow::anyhow!("device_memory: {e}"))
}
