"""A FastMCP stdio child that reports who it is and tries to read other processes' /proc files.

Used by tests/python/test_process_secrets.py: what a child can reach of the gateway (its parent)
and of a sibling child. Every attempt answers `ok:<bytes read>` or `error:<errno name>`.
"""
import errno
import os
import struct

from fastmcp import FastMCP

mcp = FastMCP("proc-probe")


def status_fields():
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def at_secure():
    """The AT_SECURE (23) entry of this process's auxiliary vector."""
    with open("/proc/self/auxv", "rb") as f:
        data = f.read()
    for i in range(0, len(data) - 15, 16):
        key, value = struct.unpack("QQ", data[i:i + 16])
        if key == 23:
            return value
    return None


@mcp.tool
def whoami() -> dict:
    """This process: pid, parent pid, credentials, capabilities, dumpable."""
    st = status_fields()
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    dumpable = libc.prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "uid": st.get("Uid"),
        "gid": st.get("Gid"),
        "cap_eff": st.get("CapEff"),
        "cap_prm": st.get("CapPrm"),
        "cap_bnd": st.get("CapBnd"),
        "cap_inh": st.get("CapInh"),
        "cap_amb": st.get("CapAmb"),
        "dumpable": dumpable,
        "at_secure": at_secure(),
    }


@mcp.tool
def env_names() -> dict:
    """The names of this process's environment variables (from the kernel's copy)."""
    with open("/proc/self/environ", "rb") as f:
        raw = f.read()
    return {"names": sorted({entry.split(b"=", 1)[0].decode() for entry in raw.split(b"\0") if entry})}


@mcp.tool
def try_read(paths: list[str]) -> dict:
    """Tries to open and read each path: `ok:<bytes>` or `error:<errno name>`."""
    out = {}
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            out[path] = f"error:{errno.errorcode.get(e.errno, e.errno)}"
            continue
        try:
            # mem: an opened file is already a hole; read where the stack or heap lives anyway.
            data = os.read(fd, 4096)
            out[path] = f"ok:{len(data)}"
        except OSError as e:
            out[path] = f"opened-then-error:{errno.errorcode.get(e.errno, e.errno)}"
        finally:
            os.close(fd)
    return out


if __name__ == "__main__":
    mcp.run(show_banner=False)
