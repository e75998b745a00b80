"""Writes a snapshot whose device traces lose their first part, as a ring
buffer that wrapped leaves them (18 of 19 real snapshots from other people's
repositories began late): the dumped segments stay as they are.

    python3 bench/cut_trace.py SRC.pickle DST.pickle [FRACTION]   (default 1/3)
"""
import pickle
import sys


def main():
    src, dst = sys.argv[1], sys.argv[2]
    fraction = float(sys.argv[3]) if len(sys.argv) > 3 else 1 / 3
    with open(src, "rb") as f:
        snap = pickle.load(f)
    for i, trace in enumerate(snap["device_traces"]):
        cut = int(len(trace) * fraction)
        snap["device_traces"][i] = trace[cut:]
    with open(dst, "wb") as f:
        pickle.dump(snap, f, protocol=pickle.HIGHEST_PROTOCOL)
    print(f"{dst}: first {fraction:.0%} of each trace cut")


if __name__ == "__main__":
    main()
