"""What bench_torch.py and bench_models.py share: running DDP's ranks, and a figure's format."""
import statistics
import subprocess


def run_ranks(cmds, timeout, env=None):
    """Starts one process per command line and waits for all of them; returns their output,
    joined. RuntimeError when one fails, or when they are not done within `timeout` seconds
    (then every one is killed)."""
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env) for cmd in cmds]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
                q.wait()
            raise RuntimeError("no result within %d s" % timeout)
    log = "\n".join(logs)
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError("failed:\n" + log[-4000:])
    return log


def fmt(values, digits=1):
    """The median of `values`, and their range when there is more than one."""
    m = statistics.median(values)
    if len(values) == 1:
        return "%.*f" % (digits, m)
    return "%.*f (%.*f-%.*f)" % (digits, m, digits, min(values), digits, max(values))
