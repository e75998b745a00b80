"""Prints the Markdown table of tests/corpus/README.md from the NAME.truth.json files.

    python3 tests/corpus/gen/table.py tests/corpus
"""
import glob
import json
import os
import sys


def mib(n):
    return f"{n / 2**20:,.1f} MiB"


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    print("| name | recording | steps | backward | allocated now / peak | reserved now / peak | truth |")
    print("|---|---|---|---|---|---|---|")
    for f in sorted(glob.glob(os.path.join(d, "*.truth.json"))):
        t = json.load(open(f))
        m = t["memory_stats"]
        if t.get("derived_from"):
            top = t["allocated_by_user_line"][0]
            print(f"| `{t['name']}` (1 file) | legacy form, converted from `{t['derived_from']}` by `gen/legacy.py` "
                  f"| - | - | {mib(m['allocated_bytes.all.current'])} / - | {mib(m['reserved_bytes.all.current'])} / - "
                  f"| largest holder `{os.path.basename(top['site'])}`: {mib(top['bytes'])} in {top['count']} blocks |")
            continue
        if t.get("leak"):
            lk = t["leak"]
            truth = (f"LEAK {mib(lk['bytes_kept_per_step'])}/step: `{os.path.basename(lk['planted_line'])}` "
                     f"planted; call path {' -> '.join('`' + os.path.basename(x) + '`' for x in lk['alloc_path'])}")
        else:
            truth = "clean"
            if t.get("dominant_at_end"):
                truth += f"; holds most at the end: `{os.path.basename(t['dominant_at_end'])}`"
        files = len(t.get("files", []))
        rec = t["recording"]["call"].replace("|", "\\|")
        print(f"| `{t['name']}` ({files} file{'s' if files > 1 else ''}) | `{rec}`, stacks {t['recording']['stacks']} "
              f"| {t['steps']} | {'yes' if t['backward'] else 'no'} "
              f"| {mib(m['allocated_bytes.all.current'])} / {mib(m['allocated_bytes.all.peak'])} "
              f"| {mib(m['reserved_bytes.all.current'])} / {mib(m['reserved_bytes.all.peak'])} | {truth} |")


if __name__ == "__main__":
    main()
