#!/usr/bin/python3
"""Runs one command inside the unpacked Trellis image the way a container runtime would, with
no container engine: `podman run` fails on these machines (setrlimit), `chroot` works.

ROOTFS is the rootfs/ of what `umoci unpack` writes (make image: build/image/bundle/rootfs); the
config.json beside it holds the image's user, environment, working directory, entrypoint and cmd.

In a private mount namespace (nothing leaks to the host, everything goes when the process ends):
an overlay over rootfs/ (writes land in STATE/upper; the unpacked image stays as built), /proc,
the host's /dev, /etc/hosts and /etc/resolv.conf bound in (as a runtime does), each --bind
SRC[:DST] bound in; then chroot, chdir to the image's working directory, drop to the image's
user (uid and gid from config.json; --root keeps root) and exec. This process becomes the
command: no child, so signals and exit codes are the command's own.

The environment is the image's, then each --env K=V; nothing else from the caller's (a command
inside the image must not depend on the host's PATH) except TRELLIS_ENVTEST_MARK, which the
envtest fixture uses to sweep strays. Without a command: the image's entrypoint + cmd.

Usage: run_in_image.py ROOTFS STATE_DIR [--bind SRC[:DST]]... [--env K=V]... [--workdir DIR]
                       [--root] [--die-with-parent] [-- COMMAND ARGS...]
Needs root (CAP_SYS_ADMIN, CAP_SYS_CHROOT). Exits 125 with a message when it cannot set up.
"""
import argparse
import ctypes
import json
import os
import signal
import sys

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_BIND, MS_REC, MS_PRIVATE = 1, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG = 1
SETUP_FAILED = 125  # like `docker run`: the runtime, not the command, failed

_libc = ctypes.CDLL(None, use_errno=True)


def die(msg):
    sys.stderr.write("run_in_image: %s\n" % msg)
    sys.exit(SETUP_FAILED)


def mount(src, target, fstype, flags, data=None):
    enc = (lambda s: s.encode() if s is not None else None)
    if _libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        e = ctypes.get_errno()
        die("mount %s on %s (%s): %s" % (src, target, fstype or "bind", os.strerror(e)))


def inside(root, path):
    """The host path of the image's `path` under `root`, symlinks resolved as inside the image:
    /var/run -> /run must land in the image's /run, never in the host's (no escape via '..')."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    cur, hops = root, 0
    while parts:
        p = parts.pop(0)
        if p == "..":
            cur = os.path.dirname(cur) if cur != root else root
            continue
        nxt = os.path.join(cur, p)
        if os.path.islink(nxt):
            hops += 1
            if hops > 40:
                die("too many symbolic links in %s" % path)
            target = os.readlink(nxt)
            if target.startswith("/"):
                cur = root
            parts = [q for q in target.split("/") if q not in ("", ".")] + parts
            continue
        cur = nxt
    return cur


def bind(src, root, dst, readonly=False):
    target = inside(root, dst)
    if os.path.isdir(src):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            open(target, "a").close()
    mount(src, target, None, MS_BIND | MS_REC)
    if readonly:
        mount(None, target, None, MS_BIND | MS_REC | MS_RDONLY | 32)  # 32: MS_REMOUNT


def home_of(uid):
    try:
        with open("/etc/passwd") as f:
            for line in f:
                p = line.rstrip("\n").split(":")
                if len(p) >= 6 and p[2] == str(uid):
                    return p[5]
    except OSError:
        pass
    return "/"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rootfs")
    ap.add_argument("state")
    ap.add_argument("--bind", action="append", default=[], metavar="SRC[:DST]")
    ap.add_argument("--env", action="append", default=[], metavar="K=V")
    ap.add_argument("--workdir")
    ap.add_argument("--root", action="store_true", help="stay root inside (default: the image's user)")
    ap.add_argument("--die-with-parent", action="store_true", help="SIGKILL when the caller dies")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:split])
    cmd = argv[split + 1:]  # everything after "--", options included, is the command

    if os.geteuid() != 0:
        die("needs root (mount namespace, overlay, chroot)")
    rootfs = os.path.abspath(a.rootfs)
    try:
        with open(os.path.join(rootfs, "..", "config.json")) as f:
            proc = json.load(f)["process"]
    except (OSError, ValueError, KeyError) as e:
        die("%s is not the rootfs of an unpacked image (umoci unpack): %s" % (rootfs, e))
    state = os.path.abspath(a.state)
    for d in ("upper", "work", "merged"):
        os.makedirs(os.path.join(state, d), exist_ok=True)

    if _libc.unshare(CLONE_NEWNS) != 0:
        die("unshare(CLONE_NEWNS): %s" % os.strerror(ctypes.get_errno()))
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount propagates to the host
    merged = os.path.join(state, "merged")
    mount("overlay", merged, "overlay", 0,
          "lowerdir=%s,upperdir=%s,workdir=%s" % (rootfs, os.path.join(state, "upper"), os.path.join(state, "work")))
    mount("proc", inside(merged, "/proc"), "proc", 0)
    bind("/dev", merged, "/dev")
    for f in ("/etc/hosts", "/etc/resolv.conf"):
        if os.path.exists(f):
            bind(f, merged, f, readonly=True)
    for spec in a.bind:
        src, _, dst = spec.partition(":")
        if not os.path.exists(src):
            die("--bind %s: no such file or directory" % src)
        bind(os.path.abspath(src), merged, dst or os.path.abspath(src))

    env = dict(e.split("=", 1) for e in proc.get("env", []) if "=" in e)
    if "TRELLIS_ENVTEST_MARK" in os.environ:
        env["TRELLIS_ENVTEST_MARK"] = os.environ["TRELLIS_ENVTEST_MARK"]
    for e in a.env:
        k, _, v = e.partition("=")
        env[k] = v
    argv = cmd or proc.get("args", [])
    if not argv:
        die("no command and the image has no entrypoint/cmd")
    user = proc.get("user", {})
    uid, gid = (0, 0) if a.root else (user.get("uid", 0), user.get("gid", 0))

    os.chroot(merged)
    os.chdir(a.workdir or proc.get("cwd", "/"))
    env.setdefault("HOME", home_of(uid))  # as container runtimes do: the user's home from the image
    if uid != 0 or gid != 0:
        os.setgroups(list(user.get("additionalGids", [])))
        os.setgid(gid)
        os.setuid(uid)
    if a.die_with_parent:  # after setuid: a credential change clears the parent-death signal
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        sys.stderr.write("run_in_image: exec %s: %s\n" % (argv[0], e.strerror))
        sys.exit(127 if isinstance(e, FileNotFoundError) else 126)


if __name__ == "__main__":
    main()
