"""Registration checks of the scheduler: every worker must reduce locally alike and cut
tensors alike; and who pushes to the servers (one per worker, or one per host)."""
from __future__ import annotations


def _check_local_reduce(info: dict, workers: dict, hosts: dict) -> str | None:
    """Every worker must use one BYTEPS_LOCAL_REDUCE; with it on, one local size."""
    mode = info["local_reduce"]
    other = next(iter(workers.values()), None)
    if other is not None and other.get("local_reduce", "off") != mode:
        return (f"host {info['host_id']} local rank {info['local_rank']} has BYTEPS_LOCAL_REDUCE="
                f"{mode} but host {other['host_id']} local rank {other['local_rank']} has "
                f"{other.get('local_reduce', 'off')}; every worker must use the same value")
    sizes = {h["local_size"] for h in hosts.values()}
    if mode != "off" and sizes and sizes != {info["local_size"]}:
        return (f"host {info['host_id']} has BYTEPS_LOCAL_SIZE={info['local_size']} but other "
                f"hosts have {sorted(sizes)}; local reduction (BYTEPS_LOCAL_REDUCE={mode}) needs "
                f"the same local size on every host (or set BYTEPS_LOCAL_REDUCE=0)")
    return None


def _check_tuning(info: dict, workers: dict) -> str | None:
    """Every worker must cut tensors alike: the same BYTEPS_AUTOTUNE and the same explicit
    BYTEPS_PARTITION_BYTES / BYTEPS_SCHEDULING_CREDIT (or none)."""
    other = next(iter(workers.values()), None)
    if other is None or other.get("tuning") == info["tuning"]:
        return None

    def say(t) -> str:
        if t is None:
            return "an older BytePS without autotune"
        return (f"BYTEPS_AUTOTUNE={t[0]}, BYTEPS_PARTITION_BYTES={t[1] or 'unset'}, "
                f"BYTEPS_SCHEDULING_CREDIT={t[2] or 'unset'}")
    return (f"settings mismatch: host {info['host_id']} local rank {info['local_rank']} (pid "
            f"{info['pid']}) has {say(info['tuning'])} but host {other['host_id']} local rank "
            f"{other['local_rank']} (pid {other['pid']}) has {say(other.get('tuning'))}; every "
            f"worker must use the same values (partitions would differ between ranks)")


def _pushers(workers: dict) -> dict:
    """Who pushes: with local reduction one push per host and key, else one per worker."""
    ws = list(workers.values())
    mode = ws[0].get("local_reduce", "off") if ws else "off"
    if mode == "off":
        return {"local_reduce": mode, "push_count": len(ws),
                "pushers": sorted(w["rank"] for w in ws)}
    nhosts = len({w["host_id"] for w in ws})
    if mode == "root":
        ranks = [w["rank"] for w in ws if w["local_rank"] == 0 or w["local_size"] == 1]
    else:
        ranks = [w["rank"] for w in ws]
    return {"local_reduce": mode, "push_count": nhosts, "pushers": sorted(ranks)}
