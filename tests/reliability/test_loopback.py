"""Nothing leaves the machine: the Ray sweep executor and the Flower audit, run as the real CLI
under strace (every process, every thread), bind AF_INET/AF_INET6 sockets to loopback only,
listen only on loopback, and connect or send to loopback only. The caller's environment is made
hostile on purpose (an off-machine HTTP proxy, usage stats and Flower telemetry switched on):
gradleak's own settings must win.

The trace is the evidence, not the settings: the parser below is strict (an address it cannot
read is a finding) and is itself tested on lines that must be flagged."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

TRACED = "bind,connect,listen,sendto,sendmsg,sendmmsg"
_CALL = re.compile(r"^\d+\s+(?:(?P<call>\w+)\(|<\.\.\. (?P<resumed>\w+) resumed>)")
_SOCKADDR = re.compile(r"\{sa_family=(?P<family>[^,}]+)(?P<body>[^{}]*)\}")
_IPV4 = re.compile(r'inet_addr\("(?P<addr>[^"]*)"\)')
_IPV6 = re.compile(r'inet_pton\(AF_INET6, "(?P<addr>[^"]*)"')
# strace -yy: <TCP:[127.0.0.1:5000]>, <TCPv6:[[::1]:5000->[::1]:6000]>, <UDP:[4711]> (inode: unbound)
_INET_FD = re.compile(r"<(?P<proto>(?:TCP|UDP|UDPLITE|RAW|SCTP|DCCP|MPTCP)(?:v6)?):"
                      r"\[(?P<inner>(?:[^\[\]]|\[[^\[\]]*\])*)\]>")
_ENDPOINT = re.compile(r"^(?:\[(?P<v6>[^\]]+)\]|(?P<v4>[0-9.]+)):(?P<port>\d+)$")
_HARMLESS_FAMILIES = {"AF_UNIX", "AF_NETLINK"}


def is_loopback(text: str) -> bool:
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def offending(lines) -> list[str]:
    """The lines of an ``strace -f -yy -e trace=bind,connect,listen,sendto,sendmsg,sendmmsg``
    log that bind, listen, connect or send outside loopback, each with the reason."""
    found = []
    for line in lines:
        m = _CALL.match(line)
        if not m:
            continue
        call = m.group("call") or m.group("resumed")
        if call not in TRACED.split(","):
            continue
        reasons = []
        for sa in _SOCKADDR.finditer(line):
            family, body = sa.group("family").strip(), sa.group("body")
            if family in _HARMLESS_FAMILIES or (family == "AF_UNSPEC" and call == "connect"):
                continue  # local sockets; connect(AF_UNSPEC) dissolves an association
            if family not in ("AF_INET", "AF_INET6"):
                reasons.append(f"{call} with address family {family}")
                continue
            addr = (_IPV4 if family == "AF_INET" else _IPV6).search(body)
            if addr is None:
                reasons.append(f"{call} with an {family} address strace did not decode")
            elif not is_loopback(addr.group("addr")):
                reasons.append(f"{call} {addr.group('addr')}")
        for fd in _INET_FD.finditer(line):
            inner = fd.group("inner")
            if inner.isdigit():   # a socket with no address yet
                if call == "listen":
                    reasons.append("listen on a socket never bound (the kernel binds it to all interfaces)")
                continue
            for end in inner.split("->"):
                e = _ENDPOINT.match(end)
                if e is None:
                    reasons.append(f"{call} on a {fd.group('proto')} socket strace shows as {inner!r}")
                elif not is_loopback(e.group("v6") or e.group("v4")):
                    reasons.append(f"{call} on a {fd.group('proto')} socket at {end}")
        found += [f"{r}: {line.strip()[:300]}" for r in reasons]
    return found


def tcp_listeners(lines) -> int:
    return sum(1 for line in lines if re.match(r"^\d+\s+listen\(\d+<TCP", line))


def find_strace() -> str:
    """strace on the PATH, or the one `make setup` unpacks into the venv."""
    path = shutil.which("strace")
    venv_copy = Path(sys.prefix) / "share" / "gradleak" / "debs" / "usr" / "bin" / "strace"
    if path is None and os.access(venv_copy, os.X_OK):
        path = str(venv_copy)
    if path is None:
        pytest.fail("strace is needed to check that Ray and Flower stay on loopback and was not found on the PATH "
                    f"nor at {venv_copy}: run `make setup` (or apt-get install strace)")
    return path


# A caller whose environment would send things off the machine if gradleak did not override it.
HOSTILE_ENV = {"http_proxy": "http://192.0.2.1:3128", "https_proxy": "http://192.0.2.1:3128",
               "HTTP_PROXY": "http://192.0.2.1:3128", "HTTPS_PROXY": "http://192.0.2.1:3128", "no_proxy": "*",
               "RAY_USAGE_STATS_ENABLED": "1", "FLWR_TELEMETRY_ENABLED": "1"}


def run_traced(args: list[str], tmp_path: Path, timeout: float = 300) -> list[str]:
    """Run ``python -m gradleak.cli ARGS`` under strace; return the log's lines (the run must succeed)."""
    log = tmp_path / "strace.log"
    cmd = [find_strace(), "-f", "--seccomp-bpf", "-yy", "-s", "0", "-e", f"trace={TRACED}", "-o", str(log),
           sys.executable, "-m", "gradleak.cli", *args]
    env = {**os.environ, **HOSTILE_ENV, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"gradleak {' '.join(args)} under strace did not finish in {timeout} s:\n{err[-3000:]}")
    assert proc.returncode == 0, f"gradleak {' '.join(args)} under strace failed ({proc.returncode}):\n{err[-3000:]}"
    lines = log.read_text(errors="replace").splitlines()
    # The trace followed Ray's processes: GCS, raylet, workers and agents listen (on loopback).
    assert tcp_listeners(lines) >= 4, "strace saw almost no listening sockets: did it follow Ray's processes?"
    return lines


# ------------------------------------------------------------------ the parser can fail
CLEAN = [
    '4008  bind(5<TCPv6:[31]>, {sa_family=AF_INET6, sin6_port=htons(0), sin6_flowinfo=htonl(0), '
    'inet_pton(AF_INET6, "::1", &sin6_addr), sin6_scope_id=0}, 28) = 0',
    '4017  bind(38<TCPv6:[32]>, {sa_family=AF_INET6, sin6_port=htons(0), sin6_flowinfo=htonl(0), '
    'inet_pton(AF_INET6, "::ffff:127.0.0.1", &sin6_addr), sin6_scope_id=0}, 28) = 0',
    '4018  bind(27<TCP:[33]>, {sa_family=AF_INET, sin_port=htons(0), sin_addr=inet_addr("127.0.0.1")}, 16) = 0',
    '4018  listen(27<TCP:[127.0.0.1:42477]>, 128) = 0',
    '4018  listen(22<TCPv6:[[::ffff:127.0.0.1]:32963]>, 4096 <unfinished ...>',
    '4019  connect(9<UNIX-STREAM:[34]>, {sa_family=AF_UNIX, sun_path="/tmp/ray/session/sockets/raylet"}, 110) = 0',
    '4019  connect(9<UDP:[35]>, {sa_family=AF_UNSPEC, sa_data="\\0\\0\\0\\0"}, 16) = 0',
    '4020  sendmsg(7<TCPv6:[[::ffff:127.0.0.1]:35900->[::ffff:127.0.0.1]:35809]>, {msg_name=NULL, msg_namelen=0, '
    'msg_iov=[{iov_base=""..., iov_len=24}], msg_iovlen=1, msg_controllen=0, msg_flags=0}, MSG_NOSIGNAL) = 24',
    '4021  sendto(3<NETLINK:[36]>, {{len=20, type=RTM_GETADDR, flags=NLM_F_REQUEST|NLM_F_DUMP, seq=1, pid=0}, '
    '{ifa_family=AF_UNSPEC, ...}}, 20, 0, {sa_family=AF_NETLINK, nl_pid=0, nl_groups=00000000}, 12) = 20',
    '4022  <... connect resumed>)            = 0',
    '4022  +++ exited with 0 +++',
]


def test_parser_passes_loopback_traffic():
    assert offending(CLEAN) == []
    assert tcp_listeners(CLEAN) == 2


@pytest.mark.parametrize("line, reason", [
    ('4017  bind(38<TCP:[31]>, {sa_family=AF_INET, sin_port=htons(0), sin_addr=inet_addr("0.0.0.0")}, 16) = 0',
     "bind 0.0.0.0"),
    ('4017  bind(38<TCPv6:[31]>, {sa_family=AF_INET6, sin6_port=htons(0), sin6_flowinfo=htonl(0), '
     'inet_pton(AF_INET6, "::", &sin6_addr), sin6_scope_id=0}, 28) = 0', "bind ::"),
    ('4128  bind(27<UDP:[31]>, {sa_family=AF_INET, sin_port=htons(0), sin_addr=inet_addr("192.0.2.2")}, 16) = 0',
     "bind 192.0.2.2"),
    ('4047  connect(23<TCP:[31]>, {sa_family=AF_INET, sin_port=htons(80), sin_addr=inet_addr("169.254.169.254")}, '
     '16) = -1 EINPROGRESS (Operation now in progress)', "connect 169.254.169.254"),
    ('4008  connect(8<UDP:[31]>, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("8.8.8.8")}, 16) = 0',
     "connect 8.8.8.8"),
    ('4008  connect(9<TCPv6:[31]>, {sa_family=AF_INET6, sin6_port=htons(37493), sin6_flowinfo=htonl(0), '
     'inet_pton(AF_INET6, "::ffff:192.0.2.2", &sin6_addr), sin6_scope_id=0}, 28) = -1 EINPROGRESS',
     "connect ::ffff:192.0.2.2"),
    ('4047  sendto(23<UDP:[31]>, ""..., 40, MSG_NOSIGNAL, {sa_family=AF_INET, sin_port=htons(53), '
     'sin_addr=inet_addr("10.255.255.53")}, 16) = 40', "sendto 10.255.255.53"),
    ('4047  sendmsg(23<UDP:[31]>, {msg_name={sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("1.1.1.1")}, '
     'msg_namelen=16, msg_iov=[{iov_base=""..., iov_len=40}], msg_iovlen=1, msg_controllen=0, msg_flags=0}, 0) = 40',
     "sendmsg 1.1.1.1"),
    ('4047  sendmsg(23<TCP:[10.0.0.5:41234->93.184.216.34:443]>, {msg_name=NULL, msg_namelen=0, msg_iov=[], '
     'msg_iovlen=0, msg_controllen=0, msg_flags=0}, 0) = 0', "socket at 10.0.0.5:41234"),
    ('4047  listen(26<TCPv6:[[::]:40381]>, 4096) = 0', "socket at [::]:40381"),
    ('4047  listen(3<TCP:[15614]>, 128) = 0', "never bound"),
    ('4047  bind(3<PACKET:[31]>, {sa_family=AF_PACKET, sll_protocol=htons(ETH_P_ALL), sll_ifindex=2}, 20) = 0',
     "family AF_PACKET"),
    ('4047  connect(3<TCP:[31]>, {sa_family=AF_INET, sin_port=htons(80), sin_addr=0x1020304}, 16) = 0',
     "did not decode"),
])
def test_parser_flags_traffic_off_loopback(line, reason):
    found = offending(CLEAN + [line])
    assert found and all(line.strip()[:300] in f for f in found) and any(reason in f for f in found), found


# ------------------------------------------------------------------ the real runs
def _assert_clean(lines: list[str]) -> None:
    bad = offending(lines)
    kinds: dict[str, int] = {}
    for finding in bad:
        kind = re.sub(r":\d+$", ":PORT", finding.split(": ", 1)[0])
        kinds[kind] = kinds.get(kind, 0) + 1
    assert not bad, (f"{len(bad)} socket calls off loopback:\n" + "\n".join(f"{n:5d} x {k}" for k, n in kinds.items())
                     + "\nfirst lines:\n" + "\n".join(bad[:8]))


@pytest.mark.timeout(420)
def test_ray_sweep_stays_on_loopback(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"base": {"attack": "dlg", "model": "lenet-dlg", "iterations": 2, "paper_metrics": False,
                                         "threads": 1},
                                "grid": {"seed": [0, 1]}}))
    lines = run_traced(["sweep", str(spec), "--out", "sw", "--executor", "ray", "--workers", "2", "--no-progress"],
                       tmp_path)
    _assert_clean(lines)
    assert (tmp_path / "sw" / "results.csv").read_text().count("\n") == 3      # header + 2 cells


@pytest.mark.timeout(420)
def test_flower_audit_stays_on_loopback(tmp_path):
    lines = run_traced(["audit-flower", "--rounds", "1", "--clients", "2", "--attack", "idlg", "--iterations", "2",
                        "--out", "audit"], tmp_path)
    _assert_clean(lines)
    assert (tmp_path / "audit" / "audit.csv").read_text().count("\n") == 3    # header + 2 clients
