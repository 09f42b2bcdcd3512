"""How much memory this process may still take: the machine's, its cgroup's and its address-space cap's.

Its own module because several owners need the answer and none of them is
about memory: the engine's longest input (:func:`core.runs.engine.max_tokens`),
Ray's object store (:mod:`core.experiments.cluster`), the app's cache bounds. Linux
sources (``/proc``, cgroup v1/v2, ``RLIMIT_AS``); elsewhere a stated guess.
"""

from __future__ import annotations

import torch


def free_bytes(device: torch.device) -> int:
    """Memory this process can still take: the least of the machine's, its cgroup's and its address-space cap's.

    ``MemAvailable`` alone overstates it in a container (cgroup ``memory.max``)
    or under ``ulimit -v`` (``RLIMIT_AS``): a check against it passed and the
    pass then died with an out-of-memory error instead of a refusal.
    """
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    limits = [meminfo_kib("/proc/meminfo", "MemAvailable")]
    limits.append(cgroup_room())
    limits.append(address_space_room())
    known = [x for x in limits if x is not None]
    return min(known) if known else 8 * 2**30  # not Linux: assume 8 GB


def meminfo_kib(path: str, key: str) -> int | None:
    try:
        with open(path) as f:
            info = dict(line.split(":", 1) for line in f if ":" in line)
        return int(info[key].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def cgroup_room() -> int | None:
    """Room left under this process's cgroup memory limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``).

    None when unlimited or unknown. The mount point seen from a container is
    often the group itself, so the group's own path is tried first, then the root.
    """
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.strip().split(":", 2) for line in f if line.count(":") >= 2]
    except OSError:
        return None
    for hier, ctrls, rel in lines:
        if hier == "0" and ctrls == "":
            root, cap_file, used_file = "/sys/fs/cgroup", "memory.max", "memory.current"
        elif "memory" in ctrls.split(","):
            root, cap_file, used_file = "/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        for base in (root + rel.rstrip("/"), root):
            try:
                with open(f"{base}/{cap_file}") as f:
                    cap = f.read().strip()
                with open(f"{base}/{used_file}") as f:
                    used = int(f.read().strip())
            except (OSError, ValueError):
                continue
            if cap == "max" or int(cap) >= 2**62:  # unlimited (v1 writes a page-rounded 2^63)
                return None
            return max(0, int(cap) - used)
    return None


def address_space_room() -> int | None:
    """``RLIMIT_AS`` minus this process's current virtual size; None when unlimited."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    used = meminfo_kib("/proc/self/status", "VmSize") or 0
    return max(0, soft - used)


def peak_bytes(device: torch.device | str) -> int:
    """The most memory this process has held so far: the CUDA allocator's high-water mark on a GPU (what a
    pass can be charged with), else the process's peak resident set (``ru_maxrss``: model, runtime and
    every pass so far), in bytes. What the CLI prints beside a run's time."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource
    import sys

    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r * (1 if sys.platform == "darwin" else 1024)
