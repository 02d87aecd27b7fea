"""The listening TCP sockets of an engine's processes, and those processes, read from the kernel
directly rather than through psutil.

The runner checks after every turn that no engine process listens beyond loopback (DESIGN §5).
psutil answers that with a scan of every process on the host (``children(recursive=True)``) and,
per process, a parse of all four inet tables (``net_connections``): ~16 ms a turn on a 2-core
host. Here:

- a process's children come from ``/proc/<pid>/task/<tid>/children``;
- its sockets are its ``/proc/<pid>/fd`` links (``socket:[inode]``), and a listener belongs to the
  engine when one of its processes holds that inode;
- the listeners themselves come from a sock_diag netlink dump asking for LISTEN sockets only,
  for processes in shadowlab's own network namespace (where engines run), and from that
  process's ``/proc/<pid>/net/tcp`` and ``tcp6`` otherwise (once per namespace: processes in one
  share its table), or when netlink is refused. The /proc tables are the documented interface,
  but the kernel prints them by walking every bucket of the host's connection hash: 3.7 ms a
  table on a host with 262,144 buckets, however few sockets it holds, where the LISTEN-only dump
  walks the listening hash alone (0.04 ms).

When an engine is stopped, what left its process group and tree is found here too: the processes
whose environment carries its marker (``/proc/<pid>/environ``), and those holding its listening
socket (the inode in their fd links).

Everything read here comes from the kernel; a process that exits, or whose files we may not read,
between two reads is skipped (the next check sees what is left).
"""

from __future__ import annotations

import os
import re
import socket
import struct
import sys
from collections.abc import Iterable
from dataclasses import dataclass

TCP_LISTEN = 10  # include/net/tcp_states.h; `0A` in the /proc tables

# A line of /proc/net/tcp{,6}: `sl: local rem st tx:rx tr:when retrnsmt uid timeout inode ...`.
# Matched on the whole table at once: most of its lines are the host's other connections
# (TIME_WAIT after every request), rejected at their state.
_LISTEN_LINE = re.compile(
    rb"^ *\d+: ([0-9A-Fa-f]+):([0-9A-Fa-f]+) [0-9A-Fa-f]+:[0-9A-Fa-f]+ 0A "
    rb"[0-9A-Fa-f]+:[0-9A-Fa-f]+ [0-9A-Fa-f]+:[0-9A-Fa-f]+ [0-9A-Fa-f]+ +\d+ +-?\d+ +(\d+)",
    re.M,
)
_TABLES = (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6))

# linux/netlink.h, linux/sock_diag.h, linux/inet_diag.h
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x1 | 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_NLMSG_HEADER = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_DIAG_REQUEST = struct.Struct("=BBBBI48x")  # family, protocol, ext, pad, states, inet_diag_sockid
# inet_diag_msg: family, state, timer, retrans; sockid (sport, dport big-endian; src[16], dst[16];
# if; cookie[2]); expires, rqueue, wqueue, uid, inode
_DIAG_MESSAGE = struct.Struct("=BBBB2s2s16s16sI8sIIIII")
_NETLINK_TIMEOUT_S = 1.0


class NetlinkUnavailable(Exception):
    """The kernel refused or did not answer a sock_diag dump (the /proc tables are read instead)."""


@dataclass(frozen=True)
class Listener:
    """A listening TCP socket: its local address as text (IPv6 as inet_ntop writes it, so a
    v4-mapped one reads `::ffff:127.0.0.1`), its port and its socket inode."""

    ip: str
    port: int
    inode: int

    def address(self) -> str:
        return f"[{self.ip}]:{self.port}" if ":" in self.ip else f"{self.ip}:{self.port}"


def available() -> bool:
    """True where this module can answer (Linux with /proc mounted and its children files)."""
    pid = os.getpid()
    return os.path.exists(f"/proc/{pid}/net/tcp") and os.path.exists(f"/proc/{pid}/task/{pid}/children")


# ---------------------------------------------------------------------------- processes


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (forked by any of its threads); [] when it is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    kids: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                kids += [int(k) for k in fh.read().split()]
        except OSError:
            continue  # the thread ended meanwhile
    return kids


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` in the process tree, parents before their children."""
    found: list[int] = []
    todo = [pid]
    while todo:
        kids = children(todo.pop())
        found += kids
        todo += kids
    return found


def socket_inodes(pid: int) -> set[int]:
    """Inodes of the sockets ``pid`` holds open; empty when it is gone or not ours to read."""
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return set()
    inodes = set()
    for fd in fds:
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _pids() -> list[int]:
    """Every process on the host now (those that end meanwhile fail their next read)."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def environment_values(name: str) -> dict[int, str]:
    """pid -> the value of ``name`` in that process's environment, for every process that has it
    and whose environment we may read. The kernel shows the block exec wrote (inherited through
    fork and setsid alike; setenv() does not change it, though a process may overwrite that memory
    itself); a zombie shows none."""
    found = {pid: environment_value(pid, name) for pid in _pids()}
    return {pid: value for pid, value in found.items() if value is not None}


def environment_value(pid: int, name: str) -> str | None:
    """The value of ``name`` in ``pid``'s environment (see environment_values); None: it has none,
    is gone, or is not ours to read."""
    prefix = name.encode() + b"="
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            block = fh.read()
    except OSError:
        return None
    for entry in block.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix):].decode("utf-8", "replace")
    return None


def socket_holders(inodes: set[int]) -> list[int]:
    """Every process that holds one of the sockets ``inodes`` open (one read of every process's
    fd links: a scan of the host, for the rare case that asks who holds a socket)."""
    return [pid for pid in _pids() if inodes and socket_inodes(pid) & inodes]


def command_line(pid: int, limit: int = 200) -> str:
    """What ``pid`` runs: its argv joined by spaces on one line (a character that does not print,
    a newline or a bidi control among them, written as its escape), at most ``limit`` characters
    of it; "" when it is gone or not ours to read. The process chose that text: escape it for
    where it is shown too."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read(limit * 4 + 1)
    except OSError:
        return ""
    text = raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")[:limit + 1]
    text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[:limit] + "…"


# ---------------------------------------------------------------------------- listeners


def listeners(pids: Iterable[int]) -> list[Listener]:
    """The listening TCP sockets (IPv4 and IPv6) that any of ``pids`` holds."""
    by_netns: dict[str, tuple[int, set[int]]] = {}  # namespace -> (a pid in it, its inodes)
    for pid in pids:
        inodes = socket_inodes(pid)
        if inodes:
            _, held = by_netns.setdefault(_netns(pid), (pid, set()))
            held |= inodes
    own = _netns(os.getpid())
    found = []
    for netns, (reader, inodes) in by_netns.items():
        found += [entry for entry in _namespace_listeners(reader, netns == own) if entry.inode in inodes]
    return found


def on_port(port: int) -> list[Listener]:
    """The listening TCP sockets on ``port`` (any address, IPv4 or IPv6) in shadowlab's own network
    namespace, whoever holds them."""
    return [entry for entry in _namespace_listeners(os.getpid(), True) if entry.port == port]


def _namespace_listeners(reader: int, own_namespace: bool) -> list[Listener]:
    if own_namespace:  # a netlink socket dumps the namespace of the process that opened it
        try:
            return [entry for _, family in _TABLES for entry in netlink_listeners(family)]
        except NetlinkUnavailable:
            pass
    found = []
    for name, family in _TABLES:
        try:
            with open(f"/proc/{reader}/net/{name}", "rb") as fh:
                found += parse_tcp_table(fh.read(), family)
        except OSError:
            continue  # the process left, or no IPv6 in this kernel
    return found


def parse_tcp_table(text: bytes, family: int, byteorder: str = sys.byteorder) -> list[Listener]:
    """The LISTEN sockets of a /proc/net/tcp (AF_INET) or tcp6 (AF_INET6) table.

    The kernel prints an address as its 32-bit words in host byte order (`%08X` of each
    ``__be32``): 127.0.0.1 is ``0100007F`` on x86. ``byteorder`` is that of the host that wrote it."""
    width = 4 if family == socket.AF_INET else 16
    word = "<I" if byteorder == "little" else ">I"
    found = []
    for match in _LISTEN_LINE.finditer(text):
        hex_ip, hex_port, inode = match.groups()
        if len(hex_ip) != 2 * width:
            continue  # not this table's address format
        raw = b"".join(struct.pack(word, int(hex_ip[i:i + 8], 16)) for i in range(0, 2 * width, 8))
        found.append(Listener(socket.inet_ntop(family, raw), int(hex_port, 16), int(inode)))
    return found


def netlink_listeners(family: int) -> list[Listener]:
    """The LISTEN TCP sockets of one address family in this process's network namespace, by a
    sock_diag dump that asks the kernel for that state alone."""
    request = _DIAG_REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN)
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as sock:
            sock.settimeout(_NETLINK_TIMEOUT_S)
            sock.send(_NLMSG_HEADER.pack(_NLMSG_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY,
                                         _NLM_F_REQUEST_DUMP, 1, 0) + request)
            found: list[Listener] = []
            while not _read_dump(sock.recv(1 << 16), found):
                pass
            return found
    except OSError as exc:  # no AF_NETLINK (a sandbox), refused, or no answer in time
        raise NetlinkUnavailable(str(exc)) from None


def _read_dump(data: bytes, found: list[Listener]) -> bool:
    """Append one recv's messages to ``found``; True once the dump is done."""
    offset = 0
    while offset + _NLMSG_HEADER.size <= len(data):
        length, kind, _, _, _ = _NLMSG_HEADER.unpack_from(data, offset)
        if kind == _NLMSG_DONE:
            return True
        if kind == _NLMSG_ERROR or length < _NLMSG_HEADER.size + _DIAG_MESSAGE.size:
            raise OSError(f"sock_diag answered message type {kind} of {length} bytes")
        family, state, _, _, sport, _, src, _, _, _, _, _, _, _, inode = \
            _DIAG_MESSAGE.unpack_from(data, offset + _NLMSG_HEADER.size)
        if state == TCP_LISTEN:
            ip = socket.inet_ntop(family, src[:4] if family == socket.AF_INET else src)
            found.append(Listener(ip, int.from_bytes(sport, "big"), inode))
        offset += (length + 3) & ~3  # NLMSG_ALIGN
    if not data:
        raise OSError("sock_diag closed the dump before its end")
    return False


def _netns(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")  # `net:[4026531833]`
    except OSError:
        return f"pid:{pid}"  # unreadable: read that process's own tables
