#!/usr/bin/env python3
"""Clang's thread-safety analysis over every C++ translation unit of a build (docs/architecture.md#locks).

Reads BUILD/compile_commands.json (the g++ build's), and compiles each .cc of the source tree with
clang++ -fsyntax-only -Wthread-safety -Werror=thread-safety: the analysis runs in clang's semantic
pass, so no object code is made and the g++ build is untouched. Generated code (protobuf) and CUDA
files are skipped, and so are test and benchmark files that hold no lock of their own (no Mutex,
CondVar or annotation in them): the locks they would check are the product's, which its own files
check, and half of CI's time on this check went to them. Prints every warning; exits 1 if any TU has one, 2 on a usage error.

  scripts/thread_safety_check.py BUILD_DIR [--only PATH_PREFIX ...] [--jobs N]
  scripts/thread_safety_check.py --file SOURCE.cc [-- EXTRA CLANG ARGS]   (one file, repo includes)
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLANG_FLAGS = ["-fsyntax-only", "-Wno-everything", "-Wthread-safety", "-Wthread-safety-beta",
               "-Werror=thread-safety", "-Werror=thread-safety-beta"]


def clang_args(command):
    """The g++ command's include paths, defines, language and target flags, for clang."""
    argv = shlex.split(command)
    keep, i = [], 1
    while i < len(argv):
        a = argv[i]
        if a in ("-o", "-MF", "-MT", "-MQ"):
            i += 2
            continue
        if a in ("-I", "-isystem", "-D", "-include", "-iquote"):
            keep += [a, argv[i + 1]]
            i += 2
            continue
        if a.startswith(("-I", "-D", "-std=", "-isystem", "-iquote", "-m", "-pthread", "-U")) \
                or a in ("-fPIC", "-fopenmp"):
            keep.append(a)
        i += 1
    return keep


# A test or benchmark file is checked when it names one of these: it has locks of its own.
OWN_LOCKS = re.compile(r"\b(Mutex|SharedMutex|MutexLock|CondVar|GUARDED_BY|PT_GUARDED_BY|REQUIRES|"
                       r"REQUIRES_SHARED|EXCLUDES|ACQUIRE|RELEASE|NO_THREAD_SAFETY_ANALYSIS)\b")
NOT_PRODUCT = ("tests", "bench")


def worth_checking(path):
    """Product sources always; test and benchmark sources only when they hold locks themselves."""
    if os.path.relpath(path, ROOT).split(os.sep)[0] not in NOT_PRODUCT:
        return True
    try:
        return bool(OWN_LOCKS.search(open(path, errors="replace").read()))
    except OSError:
        return True


def check(clang, entry):
    src = entry["file"]
    cmd = [clang] + clang_args(entry["command"]) + CLANG_FLAGS + [src]
    r = subprocess.run(cmd, cwd=entry["directory"], capture_output=True, text=True)
    return src, r.returncode, (r.stdout + r.stderr).strip()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("build", nargs="?")
    p.add_argument("--only", action="append", default=[], help="check only sources under this path")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    p.add_argument("--file", help="check one source file with the repository's include paths")
    a, extra = p.parse_known_args()
    clang = shutil.which("clang++") or shutil.which("clang++-14")
    if not clang:
        print("thread_safety_check: clang++ not found (scripts/install-deps.sh installs clang)", file=sys.stderr)
        return 2
    if a.file:
        extra = [x for x in extra if x != "--"]
        entry = {"file": os.path.abspath(a.file), "directory": ROOT,
                 "command": "c++ -std=c++20 -pthread -I%s -I%s/include %s" % (ROOT, ROOT, shlex.join(extra))}
        src, rc, out = check(clang, entry)
        if out:
            print(out)
        return 1 if rc else 0
    if not a.build or extra:
        p.print_usage(sys.stderr)
        return 2
    db = os.path.join(a.build, "compile_commands.json")
    try:
        entries = json.load(open(db))
    except (OSError, ValueError) as e:
        print("thread_safety_check: cannot read %s: %s" % (db, e), file=sys.stderr)
        return 2
    build_abs = os.path.abspath(a.build)
    only = [os.path.abspath(x) for x in a.only]
    todo, seen = [], set()
    for e in entries:
        f = os.path.abspath(os.path.join(e["directory"], e["file"]))
        if not f.endswith(".cc") or f.startswith(build_abs + os.sep) or not f.startswith(ROOT + os.sep):
            continue
        if only and not any(f.startswith(o) for o in only):
            continue
        if f in seen or not worth_checking(f):
            continue
        seen.add(f)
        todo.append(dict(e, file=f))
    start = time.monotonic()
    bad = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        for src, rc, out in pool.map(lambda e: check(clang, e), todo):
            if rc != 0:
                bad += 1
                print(out if out else "%s: clang++ exited %d" % (src, rc))
    print("thread_safety_check: %d translation units, %d with findings, %.0f s" %
          (len(todo), bad, time.monotonic() - start))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
