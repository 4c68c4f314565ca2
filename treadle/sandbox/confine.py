"""Confinement of a sandboxed run without privileges: Landlock and seccomp; used by ``runner.Sandbox``.

The env and services images run as uid 65532 with every capability dropped, and a Pod Security
"restricted" pod adds none and filters syscalls with the runtime's default seccomp profile, which
refuses ``unshare`` (so no user, network or mount namespace) without CAP_SYS_ADMIN. What such a
process may still do to itself, and what this module does in the child between fork and exec:

- ``PR_SET_NO_NEW_PRIVS`` (which ``allowPrivilegeEscalation: false`` sets anyway);
- a **Landlock** domain (kernel >= 5.13, ``landlock`` among the active LSMs): reads and execution
  only beneath the interpreter's prefix and the system library directories, a few ``/dev`` files,
  and everything only beneath the run's own directory. ``/proc`` (the service's environment,
  command line and memory), ``/tmp``, ``/var/run/secrets`` (the pod's token) and the service's home
  are out of reach. From ABI 4 TCP bind/connect are refused too; from ABI 6 signals and abstract
  unix sockets are scoped to the domain;
- a **seccomp** filter, built once with libseccomp (``libseccomp.so.2``) and exported as BPF so the
  child only loads bytes: no ``socket`` (no network, not even 127.0.0.1), no new process (``fork``,
  ``vfork``, ``clone`` without ``CLONE_THREAD``; ``clone3`` answers ENOSYS so threads fall back to
  ``clone``), no signal to any process (``kill``, ``tgkill``, ...), no ``ptrace`` or cross-process
  memory access, no ``io_uring`` (its ops bypass the socket filter), no namespaces, no ``truncate`` by
  path (Landlock ABI < 3 does not cover it).

A run is therefore one process and its threads: killing it ends everything it started, a double fork
cannot escape, and a fork bomb stops at the first fork. Threads are bounded by the address-space
limit (each has a stack) and the CPU and wall clocks.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import errno
import os
import stat
import sys
from collections.abc import Callable, Iterable

CREATE_RULESET, ADD_RULE, RESTRICT_SELF = 444, 445, 446  # the same number on every architecture
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2

# Landlock filesystem rights by the ABI that introduced them.
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_V1 = (1 << 13) - 1
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
"""The only rights a rule on a file (not a directory) may carry."""
NET_TCP = 0b11  # BIND_TCP | CONNECT_TCP, ABI 4
SCOPES = 0b11  # ABSTRACT_UNIX_SOCKET | SIGNAL, ABI 6

READ_ONLY_TREES = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")
READ_ONLY_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/dev/zero", "/dev/urandom", "/dev/random")
READ_WRITE_FILES = ("/dev/null",)

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_MASKED_EQ = 7
CLONE_THREAD = 0x00010000
DENIED = (
    "socket", "socketcall", "fork", "vfork", "kill", "tkill", "tgkill", "rt_sigqueueinfo",
    "rt_tgsigqueueinfo", "pidfd_open", "pidfd_getfd", "pidfd_send_signal", "ptrace",
    "process_vm_readv", "process_vm_writev", "process_madvise", "kcmp", "unshare", "setns", "mount",
    "umount2", "pivot_root", "chroot", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key", "truncate",
    "name_to_handle_at", "open_by_handle_at",
)  # fmt: skip
"""Syscalls refused with EPERM (names this architecture lacks are skipped)."""


class Unavailable(RuntimeError):
    """The kernel or the image lacks what the confinement needs; the message says what."""


class ArgCmp(ctypes.Structure):
    """libseccomp's ``struct scmp_arg_cmp``: compare argument ``arg`` with ``op`` (7: masked equal)."""

    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def errno_action(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)  # SCMP_ACT_ERRNO(code)


@dataclasses.dataclass(frozen=True)
class Confinement:
    """What every confined run loads: the Landlock ABI and the seccomp program (BPF bytes)."""

    abi: int
    bpf: bytes
    libc: ctypes.CDLL

    def ruleset(self, workdir: str, read_trees: Iterable[str]) -> int:
        """A Landlock ruleset fd (close-on-exec) for one run: read beneath ``read_trees`` and the
        system directories, everything beneath ``workdir``. The caller closes it once the child started."""
        fs = FS_V1 | (REFER if self.abi >= 2 else 0) | (TRUNCATE if self.abi >= 3 else 0)
        fs |= IOCTL_DEV if self.abi >= 5 else 0
        attr = _RulesetAttr(fs, NET_TCP if self.abi >= 4 else 0, SCOPES if self.abi >= 6 else 0)
        size = 8 if self.abi < 4 else 16 if self.abi < 6 else 24  # older kernels refuse unknown fields
        fd = self._syscall(CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
        try:
            read = EXECUTE | READ_FILE | READ_DIR
            for tree in (*READ_ONLY_TREES, *read_trees):
                self._allow(fd, tree, read)
            for path in READ_ONLY_FILES:
                self._allow(fd, path, READ_FILE)
            for path in READ_WRITE_FILES:
                self._allow(fd, path, READ_FILE | WRITE_FILE)
            self._allow(fd, workdir, fs, required=True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def child_setup(self, ruleset_fd: int) -> Callable[[], None]:
        """The pre-exec step: no new privileges, the Landlock domain, then the seccomp filter (last:
        it refuses nothing the first two need, and nothing exec needs)."""
        libc = self.libc
        buf = ctypes.create_string_buffer(self.bpf, len(self.bpf))
        # The program points into ``buf``: the closure holds both, so the bytes outlive the fork.
        held = (buf, _SockFprog(len(self.bpf) // 8, ctypes.cast(buf, ctypes.c_char_p)))

        def setup() -> None:
            prog = held[1]
            if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
            if libc.syscall(RESTRICT_SELF, ruleset_fd, 0) != 0:
                raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
            if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")

        return setup

    def _allow(self, ruleset_fd: int, path: str, rights: int, *, required: bool = False) -> None:
        try:
            target = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            if required:
                raise
            return
        try:
            if not stat.S_ISDIR(os.fstat(target).st_mode):
                rights &= FILE_RIGHTS
            rule = _PathBeneath(rights, target)
            self._syscall(ADD_RULE, ruleset_fd, RULE_PATH_BENEATH, ctypes.byref(rule), 0)
        finally:
            os.close(target)

    def _syscall(self, number: int, *args: object) -> int:
        result = int(self.libc.syscall(number, *args))
        if result < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"Landlock syscall {number} failed: {os.strerror(code)}")
        return result


def load() -> Confinement:
    """Check the kernel and libseccomp and build the seccomp program; raise ``Unavailable`` naming what
    is missing rather than run untrusted code with less."""
    name = ctypes.util.find_library("c")
    if name is None:
        raise Unavailable("the sandbox needs the C library (libc) to set up Landlock and seccomp")
    libc = ctypes.CDLL(name, use_errno=True)
    abi = int(libc.syscall(CREATE_RULESET, None, ctypes.c_size_t(0), CREATE_RULESET_VERSION))
    if abi < 1:
        reason = os.strerror(ctypes.get_errno())
        raise Unavailable(
            f"the sandbox needs Landlock (Linux >= 5.13 built with CONFIG_SECURITY_LANDLOCK and "
            f"'landlock' in the lsm= boot parameter) when the service runs without CAP_SYS_ADMIN; "
            f"landlock_create_ruleset said: {reason}. Run untrusted code on nodes whose kernel has it."
        )
    return Confinement(abi=abi, bpf=_seccomp_program(), libc=libc)


def libseccomp() -> ctypes.CDLL:
    """``libseccomp.so.2`` with the signatures of the calls made here (and by the tests, which load a
    stand-in for the runtime's default profile with it)."""
    try:
        lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    except OSError as e:
        raise Unavailable(f"the sandbox needs libseccomp.so.2 (Debian package libseccomp2): {e}") from e
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(ArgCmp),
    ]  # fmt: skip
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def _seccomp_program() -> bytes:
    lib = libseccomp()
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise Unavailable("seccomp_init failed (libseccomp.so.2)")
    try:

        def rule(action: int, name: str, *cmps: ArgCmp) -> None:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:
                return  # not a syscall of this architecture (socketcall on x86_64)
            array = (ArgCmp * max(len(cmps), 1))(*cmps)
            if lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), array) != 0:
                raise Unavailable(f"libseccomp refused the rule for {name}")

        for name in DENIED:
            rule(errno_action(errno.EPERM), name)
        rule(errno_action(errno.ENOSYS), "clone3")  # glibc then creates threads with clone
        rule(errno_action(errno.EPERM), "clone", ArgCmp(0, SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0))
        read, write = os.pipe()
        try:
            if lib.seccomp_export_bpf(ctx, write) != 0:
                raise Unavailable("seccomp_export_bpf failed (libseccomp.so.2)")
            os.close(write)
            write = -1
            chunks = []
            while chunk := os.read(read, 65536):
                chunks.append(chunk)
        finally:
            os.close(read)
            if write >= 0:
                os.close(write)
        return b"".join(chunks)
    finally:
        lib.seccomp_release(ctx)


def capable(*caps: int) -> bool:
    """Every one of ``caps`` (capability numbers) is in this process's effective set."""
    with open("/proc/self/status") as f:
        effective = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    return all(effective >> cap & 1 for cap in caps)


def interpreter(*, needs_world_access: bool) -> str:
    """A Python the run may execute: this one's base, else the system's. ``needs_world_access``: the
    run takes a uid of its own, which must reach the file (pyenv's and a venv's may sit under a home
    directory only their owner enters); else this process must."""
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    for candidate in (base, "/usr/bin/python3", "/usr/local/bin/python3"):
        path = os.path.realpath(candidate)
        if not os.path.isfile(path):
            continue
        if _world_reachable(path) if needs_world_access else os.access(path, os.X_OK):
            return path
    raise Unavailable(
        "no Python interpreter the sandboxed run may execute (tried the base, /usr, /usr/local)"
    )


def _world_reachable(path: str) -> bool:
    """Every directory above ``path`` is world-searchable and the file world-executable."""
    parts = path.split(os.sep)
    try:
        for i in range(2, len(parts)):
            if not os.stat(os.sep.join(parts[:i])).st_mode & 0o001:
                return False
        return bool(os.stat(path).st_mode & 0o001)
    except OSError:
        return False
