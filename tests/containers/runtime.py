#!/usr/bin/env python3
"""Stand-ins for the container runtimes of GPU clusters, made of unshare, mount and chroot (as
root), for the container tests: each runs its command in a foreign root file system (tests/containers/
make_image.sh) the way the real runtime would, and passes on only what that runtime passes by
default.

  runtime.py srun [srun options] [--container-image=ROOT [--container-mounts=S:D[:ro],...]
                  [--container-workdir=DIR]] COMMAND...
      pyxis: srun's task itself runs inside the image. Every other srun option and the
      command go to the real srun (the first `srun` on PATH after this one's folder).
  runtime.py apptainer exec [--nv] [--bind S[:D[:ro]],...] [--cleanenv] ROOT COMMAND...
  runtime.py enroot start [--conf FILE] [--mount S:D] [--env NAME[=VALUE]] [--rw] ROOT COMMAND...

tests/containers/bin/ holds `srun`, `apptainer` and `enroot` scripts that call this one, so
that a test (or an sbatch template) with that folder first on PATH uses these runtimes as it
would use the real ones.

What each passes, from its documentation:
- pyxis (github.com/NVIDIA/pyxis): the task's whole environment, except that a variable the
  image sets (its PATH here) keeps the image's value; enroot's default mounts (below) and
  --container-mounts; host network. The tasks of a step on one node share its container
  (RDZV_TEST_PYXIS_STATE: a folder for their shared /tmp; unset, each task has its own).
- Apptainer (apptainer.org, "Environment and metadata", "Bind paths and mounts"): the host's
  environment but PATH and LD_LIBRARY_PATH (the image's PATH instead); none of it with
  --cleanenv; binds $HOME, /tmp, /var/tmp, the working directory, /proc, /sys, /dev,
  /etc/hosts, /etc/localtime and /etc/resolv.conf; host network; the same working directory.
- enroot start (github.com/NVIDIA/enroot, doc/cmd/start.md, conf/mounts, bin/switchroot.c):
  an empty environment (switchroot's clearenv), filled with the image's /etc/environment,
  TERM, --env and a --conf file's environ(); mounts /proc, /sys (read-only), /dev, /dev/shm,
  a fresh tmpfs on /tmp and /run, the host's /etc/hosts, /etc/hostname, /etc/resolv.conf,
  plus --mount and the conf's mounts(); closes every descriptor above 3; host network.

Every runtime here keeps the host's PID namespace (as enroot, pyxis and Apptainer do by
default) and shows the image read-only over an overlay in memory, in which the mount points
are made (as enroot's x-create and Apptainer's underlay do): a mount namespace of the
container's own (unshare) holds the overlay, on /mnt, and goes with it. RDZV_TEST_HOSTS_FILE
(when set) is bound as the image's /etc/hosts instead of the host's, standing in for a cluster
whose /etc/hosts names its nodes. Exits 125 with one line when its own arguments are wrong.
"""
import os
import shlex
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHIMS = os.path.join(HERE, "bin")
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def fail(message):
    print(f"runtime.py: {message}", file=sys.stderr)
    sys.exit(125)


def hosts_file():
    return os.environ.get("RDZV_TEST_HOSTS_FILE") or "/etc/hosts"


def image_environment(root):
    """The image's /etc/environment (pam_env format, NAME=VALUE a line), as enroot reads it."""
    env = {}
    try:
        with open(os.path.join(root, "etc/environment")) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#") and "=" in line:
                    name, value = line.split("=", 1)
                    env[name] = value.strip('"')
    except FileNotFoundError:
        pass
    return env


class Container:
    """A container as the real runtimes make one: a mount namespace of its own (unshare), the
    image read-only over an overlay in memory (where the mount points are made, as enroot's
    x-create and Apptainer's underlay do), /proc, /sys, /dev, the runtime's mounts, then chroot
    into it. Every step execs the next: the command becomes the process that started it, as
    under pyxis and enroot, so that Slurm's signals and the agent's reach it directly."""

    def __init__(self, root):
        if not os.path.isfile(os.path.join(root, "bin/sh")):
            fail(f"{root} is not a root file system (no bin/sh)")
        q = shlex.quote
        self.lines = [
            "set -e",
            "mount -t tmpfs rdzv-container /mnt",
            "mkdir /mnt/upper /mnt/work /mnt/merged",
            f"mount -t overlay overlay -o lowerdir={q(os.path.abspath(root))},"
            "upperdir=/mnt/upper,workdir=/mnt/work /mnt/merged",
            "cd /mnt/merged",
            "mount --rbind /dev dev",
            "mount -t proc proc proc",
            "mount --rbind /sys sys",
            "mount -o remount,bind,ro sys",
        ]

    def tmpfs(self, path):
        self.lines.append(f"mkdir -p .{shlex.quote(path)}")
        self.lines.append(f"mount -t tmpfs tmpfs .{shlex.quote(path)}")

    def bind(self, source, dest, read_only=False):
        if not os.path.exists(source):
            fail(f"cannot mount {source}: no such file or directory")
        q = shlex.quote
        target = "." + q(os.path.normpath(dest))
        if os.path.isdir(source):
            self.lines.append(f"mkdir -p {target}")
        else:
            self.lines.append(f"mkdir -p $(dirname {target}); [ -e {target} ] || touch {target}")
        self.lines.append(f"mount --bind {q(source)} {target}")
        if read_only:
            self.lines.append(f"mount -o remount,bind,ro {target}")

    def exec(self, command, env, workdir):
        if not command:
            fail("no command to run in the container")
        self.lines.append("mount -o remount,ro /mnt/merged")
        self.lines.append('exec unshare --root=/mnt/merged --wd="$0" -- "$@"')
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                "\n".join(self.lines), workdir or "/", *command]
        os.execve(shutil.which("unshare") or "/usr/bin/unshare", argv, env)


def mount_spec(spec, sep):
    """SRC[sep DST[sep ro]] -> (src, dst, read_only)."""
    parts = spec.split(sep)
    if not parts[0] or len(parts) > 3:
        fail(f"malformed mount {spec!r}")
    src = parts[0]
    dst = parts[1] if len(parts) > 1 and parts[1] else src
    flags = parts[2] if len(parts) > 2 else ""
    return src, dst, "ro" in flags.split(",")


def enroot_system_mounts(c, tmp=None):
    """enroot's conf/mounts/10-system.fstab and 20-config.fstab (TMP: a folder for /tmp instead
    of a tmpfs of its own)."""
    if tmp:
        c.bind(tmp, "/tmp")
    else:
        c.tmpfs("/tmp")
    c.tmpfs("/run")
    c.bind(hosts_file(), "/etc/hosts", read_only=True)
    for f in ("/etc/hostname", "/etc/resolv.conf"):
        if os.path.exists(f):
            c.bind(f, f, read_only=True)


# --- pyxis: srun --container-image=... ------------------------------------------------------

# srun's options that take their value as the next argument (a subset: those a test or a
# template uses; an unknown option with a separate value would be taken for the command).
SRUN_VALUE_OPTIONS = {
    "-N", "-n", "-c", "-w", "-x", "-p", "-t", "-J", "-o", "-e", "-i", "-D", "-A", "-G",
    "--nodes", "--ntasks", "--ntasks-per-node", "--cpus-per-task", "--nodelist", "--exclude",
    "--partition", "--time", "--job-name", "--output", "--error", "--input", "--chdir",
    "--mpi", "--export", "--gpus", "--gpus-per-node", "--gpus-per-task", "--gres", "--mem",
    "--kill-on-bad-exit", "--signal", "--distribution", "--account",
}
PYXIS_OPTIONS = ("--container-image", "--container-mounts", "--container-workdir")


def srun(argv):
    pyxis = {}
    passed = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in PYXIS_OPTIONS:
            if not eq:
                i += 1
                if i == len(argv):
                    fail(f"{name} needs a value")
                value = argv[i]
            pyxis[name] = value
            i += 1
            continue
        if arg == "--" or not arg.startswith("-"):
            break
        passed.append(arg)
        if not eq and arg in SRUN_VALUE_OPTIONS and i + 1 < len(argv):
            passed.append(argv[i + 1])
            i += 1
        i += 1
    command = argv[i:]
    if command and command[0] == "--":
        command = command[1:]
    path = [p for p in os.environ.get("PATH", "").split(":")
            if p and os.path.abspath(p) != SHIMS]
    real = shutil.which("srun", path=":".join(path))
    if real is None:
        fail("no srun on PATH besides this stand-in")
    if "--container-image" in pyxis:
        task = [sys.executable, os.path.abspath(__file__), "pyxis-task",
                pyxis["--container-image"], pyxis.get("--container-mounts", ""),
                pyxis.get("--container-workdir", "")]
        command = task + ["--"] + command
    os.execv(real, [real] + passed + command)


def pyxis_task(argv):
    """In each task of the step: becomes the task inside the image."""
    if len(argv) < 4 or argv[3] != "--":
        fail("usage: runtime.py pyxis-task ROOT MOUNTS WORKDIR -- COMMAND...")
    root, mounts, workdir, command = argv[0], argv[1], argv[2], argv[4:]
    c = Container(root)
    # pyxis starts one container per node for a step and its tasks join it, so they share its
    # /tmp: a folder per step and node under RDZV_TEST_PYXIS_STATE stands in for it.
    tmp = None
    state = os.environ.get("RDZV_TEST_PYXIS_STATE")
    if state:
        e = os.environ
        tmp = os.path.join(state, "{}.{}-{}".format(e.get("SLURM_JOB_ID"), e.get("SLURM_STEP_ID"),
                                                    e.get("SLURMD_NODENAME")))
        os.makedirs(tmp, exist_ok=True)
        os.chmod(tmp, 0o1777)
    enroot_system_mounts(c, tmp)
    for spec in filter(None, mounts.split(",")):
        src, dst, ro = mount_spec(spec, ":")
        c.bind(src, dst, read_only=ro)
    env = dict(os.environ)
    env["PATH"] = IMAGE_PATH
    env.update(image_environment(root))
    c.exec(command, env, workdir or None)


# --- apptainer exec --------------------------------------------------------------------------

def apptainer(argv):
    if not argv or argv[0] != "exec":
        fail("only `apptainer exec` is stood in for")
    binds, cleanenv = [], False
    i = 1
    while i < len(argv) and argv[i].startswith("-"):
        arg = argv[i]
        if arg in ("--bind", "-B"):
            i += 1
            binds += argv[i].split(",")
        elif arg.startswith("--bind="):
            binds += arg.split("=", 1)[1].split(",")
        elif arg in ("--cleanenv", "-e"):
            cleanenv = True
        elif arg != "--nv":
            fail(f"apptainer exec option {arg} is not stood in for")
        i += 1
    if i >= len(argv):
        fail("apptainer exec needs an image and a command")
    root, command = argv[i], argv[i + 1:]
    c = Container(root)
    home = os.environ.get("HOME", "/root")
    cwd = os.getcwd()
    for path in ("/tmp", "/var/tmp", home, cwd):
        if os.path.isdir(path):
            c.bind(path, path)
    c.bind(hosts_file(), "/etc/hosts", read_only=True)
    # /etc/localtime too, in Apptainer; left out here, where the image's is a dangling link
    # and nothing reads it.
    if os.path.exists("/etc/resolv.conf"):
        c.bind("/etc/resolv.conf", "/etc/resolv.conf", read_only=True)
    for spec in filter(None, binds):
        src, dst, ro = mount_spec(spec, ":")
        c.bind(src, dst, read_only=ro)
    if cleanenv:
        env = {k: os.environ[k] for k in ("HOME", "TERM", "LANG") if k in os.environ}
    else:
        env = {k: v for k, v in os.environ.items() if k not in ("PATH", "LD_LIBRARY_PATH")}
    for k, v in list(os.environ.items()):
        if k.startswith("APPTAINERENV_"):
            env[k[len("APPTAINERENV_"):]] = v
    env["PATH"] = IMAGE_PATH
    c.exec(command, env, cwd)


# --- enroot start ----------------------------------------------------------------------------

def run_conf(conf, function, command):
    """The output of FUNCTION of an enroot configuration script, run as enroot runs it: bash,
    with the host's environment, the container's command as its arguments."""
    script = (f"source {shlex.quote(conf)}; "
              f"if declare -F {function} >/dev/null; then {function}; fi")
    out = subprocess.run(["bash", "-c", script, "enroot-conf", *command], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return out.splitlines()


def enroot(argv):
    if not argv or argv[0] != "start":
        fail("only `enroot start` is stood in for")
    conf, mounts, envs = None, [], []
    i = 1
    while i < len(argv) and argv[i].startswith("-"):
        arg = argv[i]
        if arg in ("--conf", "-c", "--mount", "-m", "--env", "-e"):
            i += 1
            if i == len(argv):
                fail(f"{arg} needs a value")
            value = argv[i]
            if arg in ("--conf", "-c"):
                conf = value
            elif arg in ("--mount", "-m"):
                mounts.append(value)
            else:
                envs.append(value)
        elif arg == "--":
            i += 1
            break
        elif arg not in ("--rw", "-w", "--root", "-r"):
            fail(f"enroot start option {arg} is not stood in for")
        i += 1
    if i >= len(argv):
        fail("enroot start needs an image")
    root, command = argv[i], argv[i + 1:]
    if conf is not None and not os.path.isfile(conf):
        fail(f"No such file or directory: {conf}")
    c = Container(root)
    enroot_system_mounts(c)
    fstab = [m.replace(":", " ") for m in mounts]
    if conf:
        fstab += run_conf(conf, "mounts", command)
    for line in fstab:
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) < 2:
            fail(f"malformed mount {line!r}")
        options = fields[3].split(",") if len(fields) > 3 else []
        c.bind(fields[0], fields[1], read_only="ro" in options)
    env = image_environment(root)
    if "TERM" in os.environ:
        env["TERM"] = os.environ["TERM"]
    lines = run_conf(conf, "environ", command) if conf else []
    for spec in envs:
        name, eq, value = spec.partition("=")
        lines.append(f"{name}={value if eq else os.environ.get(name, '')}")
    for line in lines:
        name, eq, value = line.partition("=")
        if eq and name and not name.startswith("ENROOT_") and name.replace("_", "a").isalnum():
            env[name] = value
    env.setdefault("PATH", IMAGE_PATH)
    # switchroot's closefrom: only stdin, stdout, stderr and its script's descriptor (3) go in.
    os.closerange(3, 65536)
    c.exec(command, env, None)


def main():
    if len(sys.argv) < 2:
        fail(__doc__.splitlines()[0])
    verb, argv = sys.argv[1], sys.argv[2:]
    handlers = {"srun": srun, "pyxis-task": pyxis_task, "apptainer": apptainer,
                "enroot": enroot}
    if verb not in handlers:
        fail(f"unknown runtime {verb!r}; expected one of {', '.join(handlers)}")
    handlers[verb](argv)


if __name__ == "__main__":
    main()
