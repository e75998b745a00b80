"""Writes the configs that tests/gpu/estimate_truth.py stored in truth.json as
NAME.config.json files beside it, for memlens to read.

    python3 tests/gpu/estimate_truth_split.py tests/estimate/truth.json
"""

import json
import os
import sys

path = sys.argv[1]
truth = json.load(open(path))
out = os.path.join(os.path.dirname(path), "configs")
os.makedirs(out, exist_ok=True)
for name, cfg in truth.get("configs", {}).items():
    with open(os.path.join(out, f"{name}.config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
        f.write("\n")
print(f"{len(truth.get('configs', {}))} configs in {out}")
