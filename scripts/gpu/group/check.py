"""Judges the group check (run.sh): prints a JSON verdict.

  check.py RUNDIR

(a) the members' live bytes summed (their status files, every 0.25 s) never passed
the budget, nor NVML's per-process figures summed less each process's overhead
outside gpuguard's books (its smallest NVML − live, the CUDA context); (b) each
PyTorch member's torch.cuda.mem_get_info() showed its share of the budget: a total
no larger than the budget, and a free figure of what the group left it; (c) after member e
was SIGKILLed, b got at least e's share at its first try (seconds from the kill to
b's answer: the stated bound is a second); (d) after a dropped 4 GiB into PyTorch's
cache, c got more (the squeeze's trim of a); (e) after b released 8 GiB, the JAX
member's pool limit is no more than what the group had left, and at least half of
it (XLA preallocates 75% of the memory it is shown).
"""
import json
import os
import sys

d = sys.argv[1]
GIB = 1 << 30


def load(name):
    try:
        return json.load(open(os.path.join(d, name)))
    except (OSError, ValueError):
        return None


ready = {n: load(n + ".ready") for n in "abcej"}
pids = {str(r["pid"]): n for n, r in ready.items() if r}
live_sums, live_by = [], {}
for line in open(os.path.join(d, "ps.jsonl")):
    try:
        s = json.loads(line)
    except ValueError:
        continue
    tot = 0
    for st in s["ps"] if isinstance(s["ps"], list) else []:
        if str(st.get("pid")) in pids:
            v = sum(x.get("live_bytes", 0) for x in st.get("devices", []))
            tot += v
            live_by.setdefault(str(st["pid"]), []).append((s["t"], v))
    live_sums.append((s["t"], tot))
smi = {}
for line in open(os.path.join(d, "smi.csv")):
    p = [x.strip() for x in line.split(",")]
    if len(p) == 3 and p[1] in pids and p[2].isdigit():
        smi.setdefault(round(float(p[0]), 2), {})[p[1]] = int(p[2]) << 20
overhead = {}
for t, by in smi.items():
    for pid, used in by.items():
        lv = [v for (tt, v) in live_by.get(pid, []) if abs(tt - t) < 0.01]
        if lv:
            overhead[pid] = min(overhead.get(pid, 1 << 62), used - lv[0])
smi_net = [sum(u - overhead.get(p, 0) for p, u in by.items()) for by in smi.values()]
try:
    budget = load("group1.json")["devices"][0]["budget_bytes"]
except (TypeError, KeyError, IndexError):
    sys.exit("check: no budget in group1.json (gpuguard group --json failed?)")
v = {
    "budget": budget,
    "a_max_live_sum": max((x for _, x in live_sums), default=None),
    "a_max_nvml_net_sum": max(smi_net, default=None),
    "overhead_per_pid": overhead,
    "ready": {n: {k: r.get(k) for k in ("held_gib", "mem_get_info", "reserved", "error", "memory_stats")}
              for n, r in ready.items() if r},
    "b_more": load("b.more.1"),
    "c_more": load("c.more.1"),
    "group": [load("group%d.json" % i) for i in (1, 2, 3)],
}
# The four PyTorch members asked 56 GiB of the 40: a sample must have seen them near
# the budget, or the samples missed them and "never over" says nothing.
v["a_never_over"] = (v["a_max_live_sum"] is not None and budget - 4 * GIB <= v["a_max_live_sum"] <= budget)
v["b_mem_get_info_is_a_share"] = all(
    r and r.get("mem_get_info") and r["mem_get_info"][0] <= r["mem_get_info"][1] <= budget
    for n, r in ready.items() if n in "abce")
e_held = (ready.get("e") or {}).get("held_gib", 0)
bm = v["b_more"] or {}
v["c_b_gained_gib"] = bm.get("held_gib", 0) - (ready.get("b") or {}).get("held_gib", 0)
cm = v["c_more"] or {}
v["d_c_gained_gib"] = cm.get("held_gib", 0) - (ready.get("c") or {}).get("held_gib", 0)
first = (bm.get("tries") or [{}])[0]
v["c_b_first_try_gib"] = first.get("held_gib", 0) - (ready.get("b") or {}).get("held_gib", 0)
try:
    v["c_seconds_kill_to_b"] = round(bm["t_done"] - float(open(os.path.join(d, "kill_time")).read()), 3)
except (KeyError, OSError, ValueError):
    v["c_seconds_kill_to_b"] = None
g2 = v["group"][1] or {}
try:
    left = g2["devices"][0]["free_bytes"]
except (KeyError, IndexError, TypeError):
    left = None
stats = ((ready.get("j") or {}).get("memory_stats")) or {}
pool = stats.get("bytes_limit", stats.get("pool_bytes"))
v["e_group_left_at_join"] = left
v["e_jax_pool_limit"] = pool
v["e_jax_sized_to_what_was_left"] = (left is not None and pool is not None and left // 2 <= pool <= left)
# A second for the reclaim, a second for taking the tensors.
v["c_in_time"] = v["c_seconds_kill_to_b"] is not None and v["c_seconds_kill_to_b"] <= 2.0
v["pass"] = bool(v["a_never_over"] and v["b_mem_get_info_is_a_share"] and e_held > 0
                 and v["c_b_gained_gib"] >= e_held and v["c_b_first_try_gib"] >= e_held and v["c_in_time"]
                 and v["d_c_gained_gib"] >= 4
                 and v["e_jax_sized_to_what_was_left"])
print(json.dumps(v, indent=1, default=str))
