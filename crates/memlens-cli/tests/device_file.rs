//! The device file `memlens.record` writes beside a snapshot: `doctor`
//! reconciles nvidia-smi's figure with PyTorch's, part by part.

mod run;

use run::json;

/// A copy of the resnet fixture in a scratch folder with `device_json`
/// written beside it as memlens.record names it; the folder (keep it alive)
/// and the snapshot's path.
fn beside_resnet(device_json: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("run.pickle.zst");
    std::fs::copy(run::fixture("resnet.pickle.zst"), &snap).unwrap();
    std::fs::write(dir.path().join("run.pickle.zst.device.json"), device_json).unwrap();
    (dir, snap.to_string_lossy().into_owned())
}

/// `memlens doctor`'s text on `snap`, its lines joined by single spaces.
fn doctor_text(snap: &str) -> String {
    String::from_utf8_lossy(&run::memlens(&["doctor", snap, "--no-report"]).stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The figures of a real H100 run (tests/gpu/RESULTS.md, 2026-11-27: a
/// 1 GiB tensor, NVML and torch read at once): nvidia-smi's 2.07 GiB is
/// PyTorch's 1 GiB, 614 MiB of CUDA context, 480 MiB the driver keeps and
/// 8.8 MiB unexplained.
#[test]
fn doctor_reconciles_nvidia_smi_with_pytorch() {
    let (_dir, snap) = beside_resnet(
        r#"{"format": "memlens-device/1", "devices": [{"device": 0, "total_memory": 85017493504,
            "memory_fraction": 1.0, "free_memory": 83294879744, "reserved_memory": 1073741824,
            "nvml_total_memory": 85520809984, "nvml_used_memory": 2225930240,
            "process_used_memory": 1713373184, "other_processes_memory": 0}]}"#,
    );
    let v = json(&["doctor", &snap, "--json", "--no-report"]);
    let d = &v["diagnosis"]["device"];
    assert_eq!(d["nvidia_smi_used_bytes"], 2_225_930_240u64);
    assert_eq!(d["pytorch_reserved_bytes"], 1_073_741_824u64);
    assert_eq!(d["outside_pytorch_bytes"], 1_713_373_184u64 - 1_073_741_824);
    assert_eq!(d["driver_bytes"], 85_520_809_984u64 - 85_017_493_504);
    assert_eq!(d["unexplained_bytes"], 9_240_576);
    let text = doctor_text(&snap);
    assert!(
        text.contains("NVML counts 2.07 GiB used on cuda:0 = PyTorch reserved 1.00 GiB + 610.00 MiB outside PyTorch"),
        "{text}"
    );
    assert_eq!(d["driver_in_used"], true);
    // No cap below the total: the fraction of 1.0 sets none.
    let tune = json(&["tune", &snap, "--json"]);
    assert!(tune["limits"]["memory_cap"].is_null(), "{}", tune["limits"]);
}

/// With what was outside PyTorch when recording began (memlens.record
/// measures it at start), the part outside PyTorch splits into the CUDA
/// context and what the run added since (NCCL, workspaces, graphs).
#[test]
fn doctor_splits_what_is_outside_pytorch_at_the_start_of_recording() {
    let (_dir, snap) = beside_resnet(
        r#"{"format": "memlens-device/1", "devices": [{"device": 0, "total_memory": 85017493504,
            "memory_fraction": 1.0, "free_memory": 83294879744, "reserved_memory": 1073741824,
            "nvml_total_memory": 85520809984, "nvml_used_memory": 2225930240,
            "process_used_memory": 1713373184, "other_processes_memory": 0,
            "outside_pytorch_at_start": 534773760}]}"#,
    );
    let d = json(&["doctor", &snap, "--json", "--no-report"])["diagnosis"]["device"].clone();
    assert_eq!(d["outside_pytorch_at_start_bytes"], 534_773_760u64);
    assert_eq!(
        d["outside_pytorch_since_start_bytes"],
        1_713_373_184i64 - 1_073_741_824 - 534_773_760
    );
    let text = doctor_text(&snap);
    assert!(
        text.contains("610.00 MiB outside PyTorch in this process (510.00 MiB when recording began: the CUDA context and libraries; 100.00 MiB since"),
        "{text}"
    );
}

/// NVML's v2 query, as nvidia-smi uses it (a real H200 run with CuPy in the
/// process, tests/gpu/RESULTS.md, 2026-11-27): "used" leaves the driver's
/// 615 MiB reserve out and gives it apart; counting it in as well (as for
/// v1) would leave -606 MiB unexplained. The account is nvidia-smi's
/// figure, the reserve told beside it.
#[test]
fn doctor_reconciles_nvidia_smi_s_own_figure_from_nvml_v2() {
    let (_dir, snap) = beside_resnet(
        r#"{"format": "memlens-device/1", "devices": [{"device": 0, "total_memory": 150109880320,
            "memory_fraction": 1.0, "free_memory": 148668284928, "reserved_memory": 117440512,
            "nvml_total_memory": 150754820096, "nvml_used_memory": 1441595392,
            "nvml_reserved_memory": 644939776, "process_used_memory": 1432354816,
            "other_processes_memory": 0, "outside_pytorch_at_start": 543162368}]}"#,
    );
    let d = json(&["doctor", &snap, "--json", "--no-report"])["diagnosis"]["device"].clone();
    assert_eq!(d["nvidia_smi_used_bytes"], 1_441_595_392u64);
    assert_eq!(d["driver_bytes"], 644_939_776u64);
    assert_eq!(d["driver_in_used"], false);
    assert_eq!(d["unexplained_bytes"], 1_441_595_392i64 - 1_432_354_816);
    let text = doctor_text(&snap);
    assert!(
        text.contains("nvidia-smi shows 1.34 GiB used on cuda:0 = PyTorch reserved 112.00 MiB")
            && text.contains("+ 8.81 MiB unexplained; the driver reserves 615.06 MiB besides"),
        "{text}"
    );
}
