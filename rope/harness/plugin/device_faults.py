"""A kernel fault that takes a process's GPU context (an illegal memory access and its kind) fails
that test; every later GPU test of the process is skipped naming it, instead of failing for a reason
that is not its own."""

from __future__ import annotations


# A kernel fault (an illegal or misaligned address) leaves the process's GPU context unusable:
# every later GPU call in it fails with the same sticky error.  Measured on the H200 with four
# external kernels in one run: one fault failed 60 later tests of that worker.  The faulting test
# fails with its error; the worker's later GPU tests are skipped, naming it, instead of failing.
STICKY_DEVICE_ERRORS = ("illegal memory access", "misaligned address", "unspecified launch failure",
                        "illegal instruction", "device-side assert triggered", "hipErrorIllegalAddress")


_LOST_CONTEXT: list[str] = []          # the test whose fault took this process's GPU context


def sticky_device_error(exc: BaseException) -> str | None:
    """The first line of a sticky GPU error in ``exc``, its causes or its group, else None."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        text = str(e)
        if any(pattern in text for pattern in STICKY_DEVICE_ERRORS) and ("CUDA" in text or "HIP" in text
                                                                        or "hip" in text):
            return text.strip().splitlines()[0][:200]
        todo += [e.__cause__, e.__context__, *getattr(e, "exceptions", ())]
    return None


def note_device_fault(nodeid: str, device: str, exc: BaseException) -> None:
    if not _LOST_CONTEXT and device.startswith(("cuda", "rocm")):
        error = sticky_device_error(exc)
        if error:
            _LOST_CONTEXT.append(f"{nodeid} ({error})")


def lost_context_reason(device: str) -> str | None:
    if _LOST_CONTEXT and device.startswith(("cuda", "rocm")):
        return (f"this process's GPU context was lost to a kernel fault in {_LOST_CONTEXT[0]}: every later "
                f"GPU call in it fails; run this test in a fresh process")
    return None
