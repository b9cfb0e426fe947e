"""The GPU timer of the Python harnesses (memory_bound_peers.py, matmul_torch.py): implementations
timed interleaved in one process, under the same clocks and temperature.

Per call: L2's persisting lines reset to normal (cudaCtxResetPersistingL2Cache, after a synchronize),
a ~300 us GPU spin (so that the host has queued the call before the GPU reaches it), the L2 flushed
by reading 256 MiB, a CUDA event, the call, a CUDA event. Rounds: every impl once per
round, starting one later each round. Result per impl: median, min and max of its calls in ms.

FUSEBOX_PROFILE_TIMED=1 turns the CUDA profiler on around the timed rounds only (run_device.sh
peerprof: ncu --profile-from-start off then sees the timed calls alone). trace=True records the
timed rounds with torch.profiler, prints each kernel's GPU duration and the idle gap before it, and
leaves in Timer.kernel_us each impl's kernel time per call: from its first kernel's start to its
last kernel's end (CUPTI timestamps), i.e. the event time without the launch latency before it;
it also prints, per impl, its event time split call by call into that span and the rest.
"""
import ctypes
import json
import os
import statistics
import tempfile

import torch

PROFILE_TIMED = os.environ.get("FUSEBOX_PROFILE_TIMED") == "1"


def persisting_l2_reset():
    """cudaCtxResetPersistingL2Cache of the CUDA runtime that torch loaded (found by soname), or None."""
    names = ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    if torch.version.cuda:  # torch's own runtime first: dlopen by soname finds the loaded copy
        names.insert(0, f"libcudart.so.{torch.version.cuda.split('.')[0]}")
    for name in names:
        try:
            fn = ctypes.CDLL(name).cudaCtxResetPersistingL2Cache
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_int
        return fn
    return None


class Timer:
    def __init__(self, reps, trace=False):
        self.reps = reps
        self.trace = trace
        self.flush = torch.empty(64 << 20, dtype=torch.float32, device="cuda").uniform_(-1, 1)
        self.flush_fn = self.flush.sum  # the L2 flush: reads all of self.flush (replaceable)
        self.rounds = {}  # name -> the last time()'s call times in ms, in round order (pairable)
        self.kernel_us = {}  # trace: name -> (median kernel time per call in us, kernels per call)
        self.reset_l2 = persisting_l2_reset()
        if self.reset_l2 is None:
            print("WARNING: no CUDA runtime with cudaCtxResetPersistingL2Cache found: L2 lines that an impl "
                  "loaded with evict_last survive the flush", flush=True)

    def lead(self):
        """Before each timed call: a ~300 us spin on the GPU (torch.cuda._sleep, clock cycles), then
        the L2 flush. While the GPU spins, the host queues the events and the call, so no impl is
        timed waiting for its own Python launch path. Without it a slow host inflated the medians
        of the peers with heavy launch paths (torch.compile at bf16 2048x32768 on 2026-12-01: median
        62.7 us, min 31.9 us), which would have counted for ours.
        First, L2's persisting lines go back to normal: lines that an impl loaded with the evict_last
        policy (torch.compile's softmax reads its input so in its first pass) survive a flush by plain
        loads, and every later call on the same input then found part of it in L2 (softmax fp32 8192^2:
        ours and Triton ~2% faster in processes with torch.compile: NOTES.md run 37). The reset is not
        stream-ordered, hence the synchronize before it."""
        if self.reset_l2 is not None:
            torch.cuda.synchronize()
            rc = self.reset_l2()
            if rc != 0:
                print(f"WARNING: cudaCtxResetPersistingL2Cache failed ({rc}); not reset from here on", flush=True)
                self.reset_l2 = None
        torch.cuda._sleep(600_000)
        self.flush_fn()  # 256 MiB read: L2 holds only clean, unrelated lines afterwards

    def time(self, impls, reps=None):
        """impls: [(name, fn)]. 3 warm-ups each, then `reps` (default: the constructor's) rounds with
        every impl once per round, starting one later each round; lead() before each call. Returns
        {name: (median, min, max) in ms, or the exception that the impl raised}."""
        out, live = {}, []
        self.kernel_us, self.rounds = {}, {}
        for name, fn in impls:
            try:
                for _ in range(3):
                    self.flush_fn()
                    fn()
                torch.cuda.synchronize()
                live.append((name, fn))
            except Exception as e:  # an impl that fails is reported, not fatal
                out[name] = e
        times = {name: [] for name, _ in live}
        order = []  # the timed calls' names, in launch order (trace)
        if PROFILE_TIMED:
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
        prof = None
        if self.trace:
            torch.cuda.synchronize()
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        for rep in range(self.reps if reps is None else reps):
            k = rep % max(1, len(live))
            for name, fn in live[k:] + live[:k]:
                if name in out:
                    continue
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                self.lead()
                try:
                    a.record()
                    fn()
                    b.record()
                except Exception as e:
                    out[name] = e
                    continue
                times[name].append((a, b))
                order.append(name)
        torch.cuda.synchronize()
        if PROFILE_TIMED:
            torch.cuda.profiler.stop()
        calls = {}
        if prof is not None:
            prof.__exit__(None, None, None)
            self.kernel_us, calls = kernel_trace(prof, order)
        for name, ev in times.items():
            if name not in out:
                t = [a.elapsed_time(b) for a, b in ev]
                self.rounds[name] = list(t)
                if name in calls and len(calls[name]) == len(t):
                    split_event_time(name, t, calls[name])
                t.sort()
                out[name] = (statistics.median(t), t[0], t[-1])
        return out


def split_event_time(name, event_ms, calls):
    """Prints where an impl's event-timed calls go (trace): the kernel span, the idle gap from the
    flush kernel's end to the impl's first kernel (the start event and the launch), and what is left
    of the event time (the start event to the first kernel, the last kernel's end to the stop event):
    medians over the calls, paired call by call."""
    span = [s for s, _ in calls]
    left = [1000.0 * ms - s for ms, s in zip(event_ms, span)]
    print(f"trace split {name:24s} event {1000.0 * statistics.median(event_ms):8.2f} us = kernel span "
          f"{statistics.median(span):8.2f} + rest {statistics.median(left):5.2f} us (flush end to first kernel "
          f"{statistics.median(g for _, g in calls):5.2f} us)", flush=True)


def kernel_trace(prof, order):
    """Prints, per kernel name, the median GPU duration of its launches in the timed rounds and the
    median idle gap before it (its start minus the previous kernel's end: the flush, then the
    events, then the launch), from the CUDA activity trace (CUPTI timestamps, no replay). Returns
    ({name: (median us, kernels per call)}, {name: [(span us, idle gap us before it)] per call in
    launch order}) of each timed call's kernels: every call is the lead's spin and flush kernels,
    then the impl's, so the trace splits at the spins, one piece per name in `order` (({}, {}) and a
    warning when the counts disagree)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as fh:
            events = json.load(fh)["traceEvents"]
    # Kernels, and the copies and fills that run as DMA (torch's contiguous copy_: cudaMemcpyAsync).
    kernels = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                     key=lambda e: e["ts"])
    by_name = {}
    for prev, k in zip(kernels, kernels[1:]):
        gap = k["ts"] - (prev["ts"] + prev["dur"])
        by_name.setdefault(k["name"], []).append((k["dur"], gap))
    for name, v in sorted(by_name.items()):
        durs, gaps = sorted(d for d, _ in v), sorted(g for _, g in v)
        print(f"trace {len(v):4d}x dur med {statistics.median(durs):8.2f} us (min {durs[0]:8.2f}) "
              f"gap med {statistics.median(gaps):6.2f} us (min {gaps[0]:6.2f})  {name[:110]}", flush=True)
    spins = [i for i, k in enumerate(kernels) if "spin_kernel" in k["name"]]
    if len(spins) != len(order):
        print(f"trace: {len(spins)} spins for {len(order)} timed calls: no per-call kernel times", flush=True)
        return {}, {}
    per = {}
    for j, i in enumerate(spins):
        fl = i + 1  # the flush's kernel (a memset may come before it)
        while fl < len(kernels) and kernels[fl].get("cat") != "kernel":
            fl += 1
        mine = kernels[fl + 1:spins[j + 1] if j + 1 < len(spins) else len(kernels)]
        if mine:
            span = max(k["ts"] + k["dur"] for k in mine) - mine[0]["ts"]
            gap = mine[0]["ts"] - (kernels[fl]["ts"] + kernels[fl]["dur"]) if fl < len(kernels) else float("nan")
            per.setdefault(order[j], []).append((span, len(mine), gap))
    return ({name: (statistics.median(s for s, _, _ in v), statistics.median_low([n for _, n, _ in v]))
             for name, v in per.items()},
            {name: [(s, g) for s, _, g in v] for name, v in per.items()})
