"""The real-world corpus (tests/corpus) against its ground truth: every
snapshot's state at the dump reproduces torch.cuda.memory_stats()' current
figures, and a replay of its trace the peaks; the lines named in the truth files
are the tagged lines of the workload sources in tests/corpus/gen."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import memlens

CORPUS = Path(__file__).resolve().parent.parent / "corpus"


def snapshots():
    """(snapshot file, its memory_stats) for every final and periodic snapshot,
    and the category recordings (tests/corpus/categories)."""
    out = []
    for truth_file in sorted(CORPUS.glob("*.truth.json")) + sorted(CORPUS.glob("categories/*.truth.json")):
        truth = json.loads(truth_file.read_text())
        folder = truth_file.parent.relative_to(CORPUS)
        out.append((str(folder / f"{truth['name']}.pickle.zst"), truth["memory_stats"]))
        for name, stats in sorted(truth.get("periodic_memory_stats", {}).items()):
            out.append((str(folder / f"{name}.zst"), stats))
    return out


def test_the_corpus_is_all_there():
    names = {p.name for p in CORPUS.glob("*.truth.json")}
    assert len(names) == 20 and len(snapshots()) == 36 + 7
    for file, _ in snapshots():
        assert (CORPUS / file).is_file(), file


@pytest.mark.parametrize("file,stats", snapshots(), ids=[f for f, _ in snapshots()])
def test_state_and_peaks_equal_torchs_figures(file, stats):
    snap = memlens.load(str(CORPUS / file))
    summary = snap.summary()
    assert summary.allocated_bytes == stats["allocated_bytes.all.current"]
    assert summary.reserved_bytes == stats["reserved_bytes.all.current"]
    assert summary.segments == stats["segment.all.current"]
    if "allocated_bytes.all.peak" in stats:  # the legacy pair has no trace, so no peaks
        peak = snap.peak()
        assert peak.peak_allocated_bytes == stats["allocated_bytes.all.peak"]
        assert peak.peak_reserved_bytes == stats["reserved_bytes.all.peak"]


def test_truth_lines_are_the_tagged_source_lines():
    checked = 0
    for truth_file in sorted(CORPUS.glob("*.truth.json")):
        truth = json.loads(truth_file.read_text())
        lines = dict(truth.get("lines", {}))
        leak = truth.get("leak") or {}
        for key in ("planted_line",):
            if key in leak:
                lines[key] = leak[key]
        for i, where in enumerate(leak.get("alloc_path", []) + leak.get("entry_lines", [])):
            lines[f"leak{i}"] = where
        for key, where in lines.items():
            path, line = where.rsplit(":", 1)
            if "/ipykernel_" in path:  # a notebook cell: its source is model.py or train.py's CELL2
                continue
            text = (CORPUS / "gen" / Path(path).name).read_text().splitlines()[int(line) - 1]
            assert "# MARK:" in text or "# PLANT:" in text, (truth_file.name, key, where, text)
            checked += 1
    assert checked >= 30
