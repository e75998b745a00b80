//! Reading PyTorch's out-of-memory messages: the real one from the `oom`
//! fixture, and one message per other form, written from the templates in
//! `docs/pytorch-memory-internals.md` section 4 (figures chosen here, so every
//! figure is known exactly as printed).

mod common;

use memlens::oom::message::{parse, parse_all, Allocator, Figure, MessageForm, OomMessage};
use memlens::oom::{diagnose, explain_message, Cause};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The bytes of a printed figure: value times unit, to the nearest byte.
fn b(value: f64, unit: u64) -> u64 {
    (value * unit as f64).round() as u64
}

/// Asserts a figure's text and bytes.
#[track_caller]
fn fig(f: &Option<Figure>, text: &str, bytes: u64) {
    let f = f
        .as_ref()
        .unwrap_or_else(|| panic!("missing figure {text}"));
    assert_eq!(f.text, text);
    assert_eq!(f.bytes, bytes, "{text}");
}

fn procs(m: &OomMessage) -> Vec<(u64, &str, bool)> {
    m.other_processes
        .iter()
        .map(|p| (p.pid, p.used.text.as_str(), p.likely_this_process))
        .collect()
}

fn collapse(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn fixture_message() -> String {
    let stats = common::stats("oom");
    stats["oom_message"]
        .as_str()
        .expect("oom_message")
        .to_string()
}

#[test]
fn real_fixture_message_every_figure() {
    let text = fixture_message();
    let m = parse(&text).expect("the fixture's message parses");
    assert_eq!(m.form, MessageForm::Current);
    assert_eq!(m.pytorch_versions, "2.10 or later");
    assert_eq!(m.device_kind.as_deref(), Some("CUDA"));
    assert_eq!(m.allocator, Allocator::Native);
    assert_eq!(m.device_index, Some(0));
    fig(&m.requested, "1000.00 MiB", 1000 * MIB);
    fig(&m.total_capacity, "79.18 GiB", b(79.18, GIB));
    fig(&m.device_free, "43.15 GiB", b(43.15, GIB));
    assert_eq!(
        procs(&m),
        [
            (443, "1.10 GiB", false),
            (439, "13.08 GiB", false),
            (436, "7.66 GiB", false),
            (438, "5.55 GiB", false)
        ]
    );
    assert_eq!(m.other_processes[1].used.bytes, b(13.08, GIB));
    fig(&m.this_process, "8.61 GiB", b(8.61, GIB));
    fig(&m.allowed, "7.92 GiB", b(7.92, GIB));
    fig(&m.allocated, "7.43 GiB", b(7.43, GIB));
    assert_eq!(m.private_pools, None);
    fig(&m.reserved_unallocated, "449.83 MiB", b(449.83, MIB));
    assert_eq!(m.reserved_total, None);
    // The whole message, whitespace collapsed (it has double spaces).
    assert_eq!(m.text, collapse(&text));
    assert_eq!(
        m.other_processes_bytes(),
        b(1.10 + 13.08 + 7.66 + 5.55, GIB)
    );
    assert_eq!(m.memory_cap(), Some(b(7.92, GIB)));
}

#[test]
fn real_fixture_message_agrees_with_stats_at_oom() {
    let stats = common::stats("oom");
    let s = &stats["stats_at_oom"];
    let at = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k}"));
    let m = parse(stats["oom_message"].as_str().unwrap()).unwrap();
    let alloc = m.allocated.as_ref().unwrap();
    let unalloc = m.reserved_unallocated.as_ref().unwrap();

    // Reserved = allocated + reserved-but-unallocated, to print precision.
    // `stats_at_oom` was taken in the `except` handler: the failing frame's
    // tensors were freed by then (allocated fell by about 71 MiB), but
    // freeing does not return segments, so reserved is unchanged.
    let reserved = at("reserved_bytes.all.current");
    let (alo, ahi) = alloc.bounds();
    let (ulo, uhi) = unalloc.bounds();
    assert!(
        (alo + ulo..=ahi + uhi).contains(&reserved),
        "reserved {reserved} outside [{}, {}]",
        alo + ulo,
        ahi + uhi
    );
    let reserved_from_message = m.reserved_bytes().unwrap();
    assert!(reserved_from_message.abs_diff(reserved) <= (ahi - alo) + (uhi - ulo));
    // Allocated at the message is at least allocated after unwinding.
    assert!(ahi >= at("allocated_bytes.all.current"));
    // And the unallocated figure is reserved minus allocated as printed then:
    // (reserved - allocated_at_message) prints as "449.83 MiB" for some
    // allocated figure that prints as "7.43 GiB".
    let lo = reserved.saturating_sub(ahi);
    let hi = reserved.saturating_sub(alo);
    let (plo, phi) = unalloc.bounds();
    assert!(lo <= phi && plo <= hi);
    // The cap is 10% of the capacity (set_per_process_memory_fraction(0.10)).
    let (tlo, thi) = m.total_capacity.as_ref().unwrap().bounds();
    let (clo, chi) = m.allowed.as_ref().unwrap().bounds();
    assert!(tlo / 10 <= chi && clo <= thi / 10);
    // This process holds at least what PyTorch reserved.
    assert!(m.this_process.as_ref().unwrap().bounds().1 >= reserved);
    assert_eq!(at("num_ooms"), 1);
}

#[test]
fn real_fixture_message_is_a_memory_cap() {
    let d = explain_message(&fixture_message()).unwrap();
    assert_eq!(d.cause, Cause::MemoryCap);
    assert_eq!(d.requested_bytes, Some(1000 * MIB));
    assert_eq!(d.largest_free_block_bytes, None);
    assert_eq!(d.reserved_unallocated_bytes, Some(b(449.83, MIB)));
    assert_eq!(d.memory_cap_bytes, Some(b(7.92, GIB)));
    for needle in ["7.92 GiB", "43.15 GiB", "10%", "1000.00 MiB", "449.83 MiB"] {
        assert!(
            d.explanation.contains(needle),
            "{needle}: {}",
            d.explanation
        );
    }
    assert!(d.fixes[0]
        .action
        .contains("set_per_process_memory_fraction"));
    // 449.83 MiB unallocated is not significant for a 1000 MiB request.
    assert!(d.fixes.iter().all(|f| !f.action.contains("expandable")));
    assert!(d
        .fixes
        .iter()
        .all(|f| f.fits.is_none() && f.predicted_peak_reserved_bytes.is_none()));
    let json = serde_json::to_value(&d).unwrap();
    assert_eq!(json["cause"], "memory_cap");
    assert_eq!(json["requested_bytes"], 1000 * MIB);
    assert!(json["largest_free_block_bytes"].is_null());
    assert_eq!(json["reserved_unallocated_bytes"], b(449.83, MIB));
    assert!(json["fixes"][0]["action"].is_string());
    assert!(json["fixes"][0].get("fits").is_none());
    assert_eq!(json["message"]["form"], "current");
    assert_eq!(json["message"]["allowed"]["text"], "7.92 GiB");
    assert_eq!(json["message"]["other_processes"][0]["pid"], 443);
}

#[test]
fn v2_4_to_2_9_with_private_pools_and_allowed() {
    let text = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a \
        total capacity of 39.39 GiB of which 1.25 GiB is free. Process 12345 has 3.50 GiB memory in \
        use. Including non-PyTorch memory, this process has 34.60 GiB memory in use. 35.45 GiB \
        allowed; Of the allocated memory 30.10 GiB is allocated by PyTorch, with 4.00 GiB allocated \
        in private pools (e.g., CUDA Graphs), and 3.80 GiB is reserved by PyTorch but unallocated. If \
        reserved but unallocated memory is large try setting \
        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation \
        for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";
    let m = parse(text).unwrap();
    assert_eq!(m.form, MessageForm::V2_2To2_9);
    assert_eq!(m.pytorch_versions, "2.4 to 2.9");
    assert_eq!(m.device_index, Some(1));
    fig(&m.requested, "2.00 GiB", 2 * GIB);
    fig(&m.total_capacity, "39.39 GiB", b(39.39, GIB));
    fig(&m.device_free, "1.25 GiB", b(1.25, GIB));
    assert_eq!(procs(&m), [(12345, "3.50 GiB", false)]);
    fig(&m.this_process, "34.60 GiB", b(34.60, GIB));
    fig(&m.allowed, "35.45 GiB", b(35.45, GIB));
    fig(&m.allocated, "30.10 GiB", b(30.10, GIB));
    fig(&m.private_pools, "4.00 GiB", 4 * GIB);
    fig(&m.reserved_unallocated, "3.80 GiB", b(3.80, GIB));
    assert!(m.text.ends_with("#environment-variables)"));
    // The cap binds, but the device had no room either; the private pools'
    // free 4 GiB would have been enough.
    assert_eq!(diagnose(m).cause, Cause::PrivatePools);
}

#[test]
fn v2_2_to_2_3_in_a_traceback_is_fragmentation() {
    let text = "Traceback (most recent call last):\n  File \"train.py\", line 42, in <module>\n    \
        loss.backward()\n  File \"/opt/conda/lib/python3.10/site-packages/torch/_tensor.py\", line \
        522, in backward\n    torch.autograd.backward(\ntorch.cuda.OutOfMemoryError: CUDA out of \
        memory. Tried to allocate 1.06 GiB. GPU 0 has a total capacity of 23.69 GiB of which 336.56 \
        MiB is free. Including non-PyTorch memory, this process has 23.35 GiB memory in use. Of the \
        allocated memory 20.31 GiB is allocated by PyTorch, and 2.72 GiB is reserved by PyTorch but \
        unallocated. If reserved but unallocated memory is large try setting \
        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation \
        for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n";
    let m = parse(text).unwrap();
    assert_eq!(m.form, MessageForm::V2_2To2_9);
    assert_eq!(m.pytorch_versions, "2.2 to 2.9");
    assert_eq!(m.device_index, Some(0));
    fig(&m.requested, "1.06 GiB", b(1.06, GIB));
    fig(&m.total_capacity, "23.69 GiB", b(23.69, GIB));
    fig(&m.device_free, "336.56 MiB", b(336.56, MIB));
    assert!(m.other_processes.is_empty());
    fig(&m.this_process, "23.35 GiB", b(23.35, GIB));
    assert_eq!(m.allowed, None);
    fig(&m.allocated, "20.31 GiB", b(20.31, GIB));
    assert_eq!(m.private_pools, None);
    fig(&m.reserved_unallocated, "2.72 GiB", b(2.72, GIB));
    assert!(m.text.starts_with("CUDA out of memory. Tried"));
    let d = diagnose(m);
    assert_eq!(d.cause, Cause::Fragmentation);
    assert!(d.fixes[0].action.contains("expandable_segments:True"));
}

#[test]
fn v2_1_capacty_typo() {
    let text = "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacty of 14.75 GiB \
        of which 3.06 MiB is free. Process 2871 has 14.74 GiB memory in use. Of the allocated memory \
        14.50 GiB is allocated by PyTorch, and 109.51 MiB is reserved by PyTorch but unallocated. If \
        reserved but unallocated memory is large try setting max_split_size_mb to avoid \
        fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF";
    let m = parse(text).unwrap();
    assert_eq!(m.form, MessageForm::V2_1);
    assert_eq!(m.pytorch_versions, "2.1");
    fig(&m.requested, "20.00 MiB", 20 * MIB);
    fig(&m.total_capacity, "14.75 GiB", b(14.75, GIB));
    fig(&m.device_free, "3.06 MiB", b(3.06, MIB));
    // No "this process" line, and process 2871 holds just over what PyTorch
    // reserved: it is this process, seen from a container.
    assert_eq!(procs(&m), [(2871, "14.74 GiB", true)]);
    assert_eq!(m.this_process, None);
    fig(&m.allocated, "14.50 GiB", b(14.50, GIB));
    fig(&m.reserved_unallocated, "109.51 MiB", b(109.51, MIB));
    assert!(m.text.ends_with("PYTORCH_CUDA_ALLOC_CONF"));
    assert_eq!(m.other_processes_bytes(), 0);
    let d = diagnose(m);
    assert_eq!(d.cause, Cause::Fragmentation);
    assert!(d.explanation.contains("Process 2871"));
}

#[test]
fn v1_10_to_2_0_parenthesised_with_allowed() {
    let text = "RuntimeError: CUDA out of memory. Tried to allocate 80.00 MiB (GPU 0; 79.35 GiB total \
        capacity; 7.85 GiB already allocated; 70.12 GiB free; 7.94 GiB allowed; 7.90 GiB reserved in \
        total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to \
        avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF";
    let m = parse(text).unwrap();
    assert_eq!(m.form, MessageForm::V1_10To2_0);
    assert_eq!(m.device_index, Some(0));
    fig(&m.requested, "80.00 MiB", 80 * MIB);
    fig(&m.total_capacity, "79.35 GiB", b(79.35, GIB));
    fig(&m.allocated, "7.85 GiB", b(7.85, GIB));
    fig(&m.device_free, "70.12 GiB", b(70.12, GIB));
    fig(&m.allowed, "7.94 GiB", b(7.94, GIB));
    fig(&m.reserved_total, "7.90 GiB", b(7.90, GIB));
    assert_eq!(m.reserved_unallocated, None);
    assert_eq!(
        m.reserved_unallocated_bytes(),
        Some(b(7.90, GIB) - b(7.85, GIB))
    );
    assert_eq!(m.this_process, None);
    assert!(m.text.ends_with("PYTORCH_CUDA_ALLOC_CONF"));
    let d = diagnose(m);
    assert_eq!(d.cause, Cause::MemoryCap);
    assert_eq!(d.reserved_bytes, Some(b(7.90, GIB)));
}

#[test]
fn npu_parenthesised_with_unknown_items() {
    let text =
        "RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB (NPU 3; 60.97 GiB total \
        capacity; 56.27 GiB already allocated; 56.27 GiB current active; 1.32 GiB free; 57.94 GiB \
        reserved in total by PyTorch) If reserved memory is >> allocated memory try setting \
        max_split_size_mb to avoid fragmentation.\nnext line of the log";
    let m = parse(text).unwrap();
    assert_eq!(m.form, MessageForm::V1_10To2_0);
    assert_eq!(m.device_kind.as_deref(), Some("NPU"));
    assert_eq!(m.device_index, Some(3));
    fig(&m.requested, "2.00 GiB", 2 * GIB);
    fig(&m.total_capacity, "60.97 GiB", b(60.97, GIB));
    fig(&m.allocated, "56.27 GiB", b(56.27, GIB));
    fig(&m.device_free, "1.32 GiB", b(1.32, GIB));
    fig(&m.reserved_total, "57.94 GiB", b(57.94, GIB));
    assert!(m.text.ends_with("to avoid fragmentation."));
    assert_eq!(diagnose(m).cause, Cause::Capacity);
}

#[test]
fn musa_parenthesised_with_its_own_conf() {
    let text =
        "MUSA out of memory. Tried to allocate 20.00 MiB (GPU 0; 47.99 GiB total capacity; 46.50 \
        GiB already allocated; 8.00 MiB free; 47.00 GiB reserved in total by PyTorch) If reserved \
        memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See \
        documentation for Memory Management and PYTORCH_MUSA_ALLOC_CONF";
    let m = parse(text).unwrap();
    assert_eq!(m.form, MessageForm::V1_10To2_0);
    assert_eq!(m.device_kind.as_deref(), Some("MUSA"));
    fig(&m.device_free, "8.00 MiB", 8 * MIB);
    fig(&m.reserved_total, "47.00 GiB", 47 * GIB);
    assert!(m.text.ends_with("PYTORCH_MUSA_ALLOC_CONF"));
    let d = diagnose(m);
    assert_eq!(d.cause, Cause::Fragmentation);
    assert!(d.fixes[0].action.contains("max_split_size_mb"));
}

#[test]
fn before_1_10_forms() {
    let text =
        "RuntimeError: CUDA out of memory. Tried to allocate 264.00 MiB (GPU 0; 2.00 GiB total \
        capacity; 788.51 MiB already allocated; 145.93 MiB free; 1.02 GiB reserved in total by \
        PyTorch)";
    let m = parse(text).unwrap();
    assert_eq!(m.form, MessageForm::Before1_10);
    fig(&m.requested, "264.00 MiB", 264 * MIB);
    fig(&m.total_capacity, "2.00 GiB", 2 * GIB);
    fig(&m.allocated, "788.51 MiB", b(788.51, MIB));
    fig(&m.device_free, "145.93 MiB", b(145.93, MIB));
    fig(&m.reserved_total, "1.02 GiB", b(1.02, GIB));
    assert!(m.text.ends_with("reserved in total by PyTorch)"));
    assert_eq!(diagnose(m).cause, Cause::Capacity);

    // Before 1.4: "cached" is the cached-but-unallocated part.
    let text = "RuntimeError: CUDA out of memory. Tried to allocate 1024.00 KiB (GPU 0; 11.17 GiB \
        total capacity; 10.90 GiB already allocated; 576.00 KiB free; 30.96 MiB cached)";
    let m = parse(text).unwrap();
    assert_eq!(m.form, MessageForm::Before1_10);
    fig(&m.requested, "1024.00 KiB", 1024 * KIB);
    fig(&m.device_free, "576.00 KiB", 576 * KIB);
    fig(&m.reserved_unallocated, "30.96 MiB", b(30.96, MIB));
    assert_eq!(m.reserved_total, None);
    assert_eq!(m.reserved_bytes(), Some(b(10.90, GIB) + b(30.96, MIB)));
    let d = diagnose(m);
    assert_eq!(d.cause, Cause::Fragmentation);
    assert!(d.fixes[0].action.starts_with("Upgrade PyTorch"));
}

#[test]
fn cuda_malloc_async_forms() {
    // No fraction set: the limit prints as 2^64 bytes and is no cap.
    let text =
        "torch.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of \
        memory)\nCurrently allocated     : 9.43 GiB\nRequested               : 640.00 MiB\nDevice \
        limit            : 11.59 GiB\nFree (according to CUDA): 7.12 MiB\nPyTorch limit (set by \
        user-supplied memory fraction)\n                        : 17179869184.00 GiB\n";
    let m = parse(text).unwrap();
    assert_eq!(m.form, MessageForm::CudaMallocAsync);
    assert_eq!(m.allocator, Allocator::CudaMallocAsync);
    assert_eq!(m.device_index, Some(0));
    fig(&m.allocated, "9.43 GiB", b(9.43, GIB));
    fig(&m.requested, "640.00 MiB", 640 * MIB);
    fig(&m.total_capacity, "11.59 GiB", b(11.59, GIB));
    fig(&m.device_free, "7.12 MiB", b(7.12, MIB));
    fig(&m.allowed, "17179869184.00 GiB", u64::MAX);
    assert_eq!(m.memory_cap(), None);
    assert!(m.text.ends_with(": 17179869184.00 GiB"));
    assert_eq!(m.reserved_bytes(), Some(b(9.43, GIB)));
    assert_eq!(diagnose(m).cause, Cause::Capacity);

    // A real limit, as a JSON-escaped one-line log.
    let text = r#"{"exception_message": "Allocation on device 2 would exceed allowed memory. (out of memory)\nCurrently allocated     : 9.80 GiB\nRequested               : 512.00 MiB\nDevice limit            : 39.39 GiB\nFree (according to CUDA): 29.21 GiB\nPyTorch limit (set by user-supplied memory fraction)\n                        : 10.00 GiB", "exception_type": "torch.OutOfMemoryError"}"#;
    let m = parse(text).unwrap();
    assert_eq!(m.device_index, Some(2));
    fig(&m.allowed, "10.00 GiB", 10 * GIB);
    fig(&m.device_free, "29.21 GiB", b(29.21, GIB));
    assert_eq!(m.memory_cap(), Some(10 * GIB));
    assert!(m.text.ends_with(": 10.00 GiB"));
    assert_eq!(diagnose(m).cause, Cause::MemoryCap);

    // The first line only, lower case as older builds wrote it.
    let m = parse(
        "RuntimeError: allocation on device 0 would exceed allowed memory. (out of memory)\n",
    )
    .unwrap();
    assert_eq!(m.form, MessageForm::CudaMallocAsyncShort);
    assert_eq!(m.device_index, Some(0));
    assert_eq!(m.requested, None);
    assert_eq!(
        m.text,
        "allocation on device 0 would exceed allowed memory. (out of memory)"
    );
    let d = diagnose(m);
    assert_eq!(d.cause, Cause::Capacity);
    assert!(d.explanation.contains("too few figures"));
}

#[test]
fn more_than_1eb() {
    let m =
        parse("RuntimeError: CUDA out of memory. Tried to allocate more than 1EB memory.").unwrap();
    assert_eq!(m.form, MessageForm::MoreThan1Eb);
    assert_eq!(m.device_kind.as_deref(), Some("CUDA"));
    fig(&m.requested, "more than 1EB", 1 << 60);
    assert_eq!(m.requested.as_ref().unwrap().bounds(), (1 << 60, u64::MAX));
    assert_eq!(
        m.text,
        "CUDA out of memory. Tried to allocate more than 1EB memory."
    );
    assert_eq!(diagnose(m).cause, Cause::Capacity);
}

#[test]
fn hip_and_xpu() {
    let text = "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 672.00 MiB. GPU 0 has a \
        total capacity of 191.98 GiB of which 0 bytes is free. Of the allocated memory 191.53 GiB is \
        allocated by PyTorch, and 520.00 KiB is reserved by PyTorch but unallocated. If reserved but \
        unallocated memory is large try setting PYTORCH_HIP_ALLOC_CONF=expandable_segments:True to \
        avoid fragmentation.  See documentation for Memory Management  \
        (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";
    let m = parse(text).unwrap();
    assert_eq!(m.device_kind.as_deref(), Some("HIP"));
    assert_eq!(m.form, MessageForm::V2_2To2_9);
    fig(&m.total_capacity, "191.98 GiB", b(191.98, GIB));
    fig(&m.device_free, "0 bytes", 0);
    fig(&m.allocated, "191.53 GiB", b(191.53, GIB));
    fig(&m.reserved_unallocated, "520.00 KiB", 520 * KIB);
    let d = diagnose(m);
    assert_eq!(d.cause, Cause::Capacity);
    assert!(d.fixes.iter().all(|f| !f.action.contains("expandable")));

    let text = "XPU out of memory. Tried to allocate 12.82 GiB. GPU 0 has a total capacity of 63.98 GiB \
        of which 10.40 GiB is free. 40.00 GiB allowed; Of the allocated memory 39.23 GiB is allocated \
        by PyTorch, and 14.29 GiB is reserved by PyTorch but unallocated. Please use `empty_cache` to \
        release all unoccupied cached memory.";
    let m = parse(text).unwrap();
    assert_eq!(m.device_kind.as_deref(), Some("XPU"));
    assert_eq!(m.form, MessageForm::Modern);
    assert_eq!(m.pytorch_versions, "2.4 or later");
    fig(&m.requested, "12.82 GiB", b(12.82, GIB));
    fig(&m.allowed, "40.00 GiB", 40 * GIB);
    fig(&m.reserved_unallocated, "14.29 GiB", b(14.29, GIB));
    assert!(m.text.ends_with("unoccupied cached memory."));
    // The cap binds (53.52 + 12.82 > 40) but the device had no room either.
    assert_eq!(diagnose(m).cause, Cause::Fragmentation);
}

#[test]
fn wrapped_with_rank_prefixes_in_a_container() {
    let text = "INFO 05-01 10:00:00 starting engine\n\
        [rank1]: Traceback (most recent call last):\n\
        [rank1]:   File \"/app/worker.py\", line 10, in <module>\n\
        [rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.25 GiB. GPU 1 has a\n\
        [rank1]: total capacity of 93.02 GiB of which 1.18 GiB is free. Process 2752205 has 91.82\n\
        [rank1]: GiB memory in use. Of the allocated memory 90.63 GiB is allocated by PyTorch, and\n\
        [rank1]: 120.54 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory\n\
        [rank1]: is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid\n\
        [rank1]: fragmentation.  See documentation for Memory Management\n\
        [rank1]: (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n\
        INFO 05-01 10:00:01 shutting down, 12.00 GiB free";
    let m = parse(text).unwrap();
    assert_eq!(m.device_index, Some(1));
    fig(&m.requested, "1.25 GiB", b(1.25, GIB));
    fig(&m.total_capacity, "93.02 GiB", b(93.02, GIB));
    fig(&m.device_free, "1.18 GiB", b(1.18, GIB));
    assert_eq!(procs(&m), [(2752205, "91.82 GiB", true)]);
    fig(&m.allocated, "90.63 GiB", b(90.63, GIB));
    fig(&m.reserved_unallocated, "120.54 MiB", b(120.54, MIB));
    assert!(!m.text.contains("[rank1]"), "{}", m.text);
    assert!(m.text.ends_with("#environment-variables)"));
    assert_eq!(m.other_processes_bytes(), 0);
    assert_eq!(diagnose(m).cause, Cause::Capacity);
}

#[test]
fn other_processes_in_a_noisy_log() {
    let text = "2026-03-01 12:00:00 | INFO | epoch 3: allocated 12.00 GiB, 3.00 GiB free\n\
        2026-03-01 12:00:01 | ERROR | step failed: CUDA out of memory. Tried to allocate 1.50 GiB. GPU \
        0 has a total capacity of 79.18 GiB of which 41.00 MiB is free. Process 568053 has 50.74 GiB \
        memory in use. Process 568050 has 14.72 GiB memory in use. Including non-PyTorch memory, this \
        process has 13.66 GiB memory in use. Of the allocated memory 12.90 GiB is allocated by \
        PyTorch, and 250.00 MiB is reserved by PyTorch but unallocated. If reserved but unallocated \
        memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid \
        fragmentation.  See documentation for Memory Management  \
        (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)\n\
        2026-03-01 12:00:02 | INFO | retrying with 8.00 GiB allowed; 2.00 GiB free";
    let m = parse(text).unwrap();
    assert_eq!(m.form, MessageForm::Current);
    fig(&m.requested, "1.50 GiB", b(1.50, GIB));
    fig(&m.device_free, "41.00 MiB", 41 * MIB);
    assert_eq!(
        procs(&m),
        [(568053, "50.74 GiB", false), (568050, "14.72 GiB", false)]
    );
    fig(&m.this_process, "13.66 GiB", b(13.66, GIB));
    // The "8.00 GiB allowed" of the later log line is not the message's.
    assert_eq!(m.allowed, None);
    fig(&m.allocated, "12.90 GiB", b(12.90, GIB));
    fig(&m.reserved_unallocated, "250.00 MiB", 250 * MIB);
    assert!(m.text.starts_with("CUDA out of memory"));
    let d = diagnose(m);
    assert_eq!(d.cause, Cause::OtherProcesses);
    assert!(d.fixes[0].action.contains("568053, 568050"));
    assert_eq!(d.other_processes_bytes, b(50.74, GIB) + b(14.72, GIB));
}

#[test]
fn escaped_newlines_and_cut_tail() {
    let text = r#"{"error": "CUDA out of memory. Tried to allocate 2.00 GiB.\nGPU 0 has a total capacity of 14.74 GiB of which 1.05 GiB is free.\nIncluding non-PyTorch memory, this process has 13.68 GiB memory in use.\nOf the allocated memory 13.20 GiB is allocated by PyTorch, and 360.00 MiB is reserved by PyTorch but unallocated.", "step": 7, "free": "9.00 GiB allowed"}"#;
    let m = parse(text).unwrap();
    assert_eq!(m.form, MessageForm::Modern);
    assert_eq!(m.pytorch_versions, "2.2 or later");
    fig(&m.requested, "2.00 GiB", 2 * GIB);
    fig(&m.total_capacity, "14.74 GiB", b(14.74, GIB));
    fig(&m.device_free, "1.05 GiB", b(1.05, GIB));
    fig(&m.this_process, "13.68 GiB", b(13.68, GIB));
    fig(&m.allocated, "13.20 GiB", b(13.20, GIB));
    fig(&m.reserved_unallocated, "360.00 MiB", 360 * MIB);
    assert!(
        m.text.ends_with("is reserved by PyTorch but unallocated."),
        "{}",
        m.text
    );
    // Cut before the line that prints a cap: the later "allowed" is not ours.
    assert_eq!(m.allowed, None);
    assert_eq!(diagnose(m).cause, Cause::Capacity);
}

#[test]
fn quoted_and_pytest_prefixes() {
    let body = "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of\n\
        7.51 GiB of which 40.75 MiB is free. Process 9500 has 148.91 MiB memory in use. Including\n\
        non-PyTorch memory, this process has 7.01 GiB memory in use. Of the allocated memory 6.81\n\
        GiB is allocated by PyTorch, and 17.19 MiB is reserved by PyTorch but unallocated.";
    for prefix in ["> ", "E       ", "# ", "(VllmWorker rank=1 pid=254) "] {
        let text: String = body.lines().map(|l| format!("{prefix}{l}\n")).collect();
        let m = parse(&text).unwrap_or_else(|| panic!("{prefix:?}"));
        fig(&m.total_capacity, "7.51 GiB", b(7.51, GIB));
        fig(&m.device_free, "40.75 MiB", b(40.75, MIB));
        assert_eq!(procs(&m), [(9500, "148.91 MiB", false)]);
        fig(&m.this_process, "7.01 GiB", b(7.01, GIB));
        fig(&m.allocated, "6.81 GiB", b(6.81, GIB));
        fig(&m.reserved_unallocated, "17.19 MiB", b(17.19, MIB));
    }
}

#[test]
fn headless_fragment() {
    let m = parse("torch.OutOfMemoryError: GPU 0 has a total capacity of 31.36 GiB of which 38.19 MiB is free.")
        .unwrap();
    assert_eq!(m.requested, None);
    assert_eq!(m.device_index, Some(0));
    fig(&m.total_capacity, "31.36 GiB", b(31.36, GIB));
    fig(&m.device_free, "38.19 MiB", b(38.19, MIB));
    assert_eq!(
        m.text,
        "GPU 0 has a total capacity of 31.36 GiB of which 38.19 MiB is free."
    );
}

#[test]
fn several_messages() {
    let a = "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 8.00 GiB \
        of which 0 bytes is free. Of the allocated memory 7.51 GiB is allocated by PyTorch, and 15.90 \
        MiB is reserved by PyTorch but unallocated.";
    let b2 = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 1; 15.78 GiB total \
        capacity; 13.10 GiB already allocated; 1.10 GiB free; 13.50 GiB reserved in total by PyTorch)";
    let all = parse_all(&format!("first: {a}\nthen later\n{b2}\n"));
    assert_eq!(all.len(), 2);
    fig(&all[0].reserved_unallocated, "15.90 MiB", b(15.90, MIB));
    assert_eq!(all[0].allowed, None);
    assert_eq!(all[1].device_index, Some(1));
    assert_eq!(all[1].form, MessageForm::Before1_10);
    assert_eq!(parse(a).unwrap().text, collapse(a));
}

#[test]
fn garbage_is_none_without_panic() {
    for text in [
        "",
        "   \n\n",
        "hello world",
        "out of memory",
        "RuntimeError: CUDA error: out of memory",
        "the disk has a total capacity of 2.00 GiB",
        "Tried to allocate 2.00 GiB",
        "GiB GiB 1.2.3 GiB 99999999999999999999999999999999 GiB",
        "\u{0}\u{1}\u{ffff}ÿ€ 한국어 \\n\\n\\",
    ] {
        assert!(parse(text).is_none(), "{text:?}");
    }
    let e = explain_message("RuntimeError: CUDA error: out of memory").unwrap_err();
    assert!(e.to_string().contains("CUDA runtime error"), "{e}");
    let e = explain_message("").unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
}

#[test]
fn every_cut_of_the_real_message_is_safe() {
    // Cut anywhere, with multi-byte characters around: never a panic, and a
    // message is still found while its anchor survives.
    let full = format!("ĳ→ {} ←ĳ", fixture_message());
    let mut found = 0;
    for (i, _) in full.char_indices() {
        if parse(&full[..i]).is_some() {
            found += 1;
        }
        let _ = parse(&full[i..]);
        let _ = parse_all(&full[i..]);
    }
    assert!(found > full.len() / 2);
    // Huge or odd numbers saturate instead of overflowing.
    let m = parse("CUDA out of memory. Tried to allocate 99999999999999999999999.00 GiB. GPU 0 has a total capacity of 1.00 GiB of which 0 bytes is free.").unwrap();
    assert_eq!(m.requested.unwrap().bytes, u64::MAX);
}
