"""The /proc parsers on text in the kernel's own format, and the rates computed from two readings."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from moetune import procfs

STAT = """cpu  200 0 100 700 0 0 0 0 0 0
cpu0 100 0 50 340 10 0 0 0 0 0
cpu1 100 0 50 360 0 0 0 0 0 0
intr 123
"""
STAT_LATER = """cpu  300 0 150 850 0 0 0 0 0 0
cpu0 190 0 50 350 10 0 0 0 0 0
cpu1 110 0 60 440 0 0 0 0 0 0
"""


def test_cpu_busy_per_core() -> None:
    a, b = procfs.parse_cpu_times(STAT), procfs.parse_cpu_times(STAT_LATER)
    assert len(a) == 2  # the "cpu" total line is not a core
    busy = procfs.cpu_busy_pct(a, b)
    assert busy == (90.0, 20.0)  # core 0: 90 of 100 ticks busy; core 1: 20 of 100
    assert procfs.cpu_busy_pct(a, b[:1]) is None  # a core went away: no pairing


def test_iowait_counts_as_idle() -> None:
    a = procfs.parse_cpu_times("cpu0 0 0 0 0 0 0 0 0\n")
    b = procfs.parse_cpu_times("cpu0 10 0 0 40 50 0 0 0\n")
    assert procfs.cpu_busy_pct(a, b) == (10.0,)


def test_meminfo_in_bytes() -> None:
    m = procfs.parse_meminfo(
        "MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\nMlocked:  1024 kB\nHugePages_Total:       0\n"
    )
    assert m["MemTotal"] == 24000000 * 1024 and m["Mlocked"] == 1024 * 1024
    assert m["HugePages_Total"] == 0  # a count, not kB


def test_proc_stat_with_a_hostile_comm() -> None:
    # comm may hold spaces and parentheses: the fields start after the last ")"
    line = (
        "4242 (llama (srv) x) S 1 4242 4242 0 -1 4194304 9000 0 7 0 300 100 0 0 20 0 12 0 555 "
        "1000000 2560 18446744073709551615"
    )
    st = procfs.parse_proc_stat(line)
    assert st is not None
    assert (st.state, st.pgrp, st.minflt, st.majflt, st.cpu_ticks, st.threads, st.start_ticks, st.rss_pages) == (
        "S",
        4242,
        9000,
        7,
        400,
        12,
        555,
        2560,
    )
    assert procfs.parse_proc_stat("") is None and procfs.parse_proc_stat("12 (x) S 1") is None


def test_process_cpu_rate_and_reused_pids() -> None:
    line = "1 (x) S 1 1 1 0 -1 0 0 0 0 0 {u} 0 0 0 20 0 1 0 {start} 0 0"
    a = procfs.parse_proc_stat(line.format(u=100, start=5))
    b = procfs.parse_proc_stat(line.format(u=250, start=5))
    assert procfs.proc_cpu_pct(a, b, 1.0, clk_tck=100) == 150.0  # one and a half cores
    other = procfs.parse_proc_stat(line.format(u=250, start=9))
    assert procfs.proc_cpu_pct(a, other, 1.0, clk_tck=100) is None  # another process got the pid


def test_this_machines_files() -> None:
    assert len(procfs.read_cpu_times()) == os.cpu_count()
    assert procfs.read_meminfo()["MemTotal"] > 0
    st = procfs.read_proc_stat(os.getpid())
    assert st is not None and st.threads >= 1 and st.rss_pages > 0
    assert procfs.read_proc_stat(2**22 + 12345) is None


def test_listening_pid_finds_a_server_moetune_did_not_start() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    code = (
        f"import socket,time; s=socket.socket(); s.bind(('127.0.0.1',{port})); s.listen(); "
        "print('up', flush=True); time.sleep(30)"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "up"
        assert procfs.listening_pid(port) == p.pid
    finally:
        p.kill()
        p.wait()
    assert procfs.listening_pid(port) is None


def test_catches_signal_reads_the_handlers_of_a_process() -> None:
    import signal

    code = "import signal,time; signal.signal(signal.SIGTERM, lambda *a: None); print('up', flush=True); time.sleep(30)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "up"
        assert procfs.catches_signal(p.pid, signal.SIGTERM) is True
        assert procfs.catches_signal(p.pid, signal.SIGUSR2) is False
    finally:
        p.kill()
        p.wait()
    assert procfs.catches_signal(2**22 + 12345, signal.SIGTERM) is None
