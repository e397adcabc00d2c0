#!/usr/bin/python3
"""A custom launcher in Python on librdzv's C interface (client/rdzv.h), through ctypes only:
joins a rendezvous at rdzvd, starts --nproc workers with torchrun's environment, reports a
worker's failure to the job, and stops its workers when the job fails elsewhere.

usage: ctypes_launcher.py --rdzv-endpoint HOST:PORT --rdzv-id JOB --nnodes N[:M] --nproc P
                          [--node-rank I] [--join-timeout SECONDS] [--auth auto|munge|token|none]
                          [--token-file PATH] [--munge-socket PATH] [--host-name NAME]
                          [--master-addr ADDR] [--master-port PORT] -- COMMAND [ARG...]

librdzv.so.0 is taken from $RDZV_LIBRARY, else from this script's directory, else from the
dynamic loader's path. Exit code: 0 when every worker exited 0; the job's exit code when a worker
failed here or elsewhere; 1 when the rendezvous failed; 2 for a usage error.
"""
import argparse
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

PROG = os.path.basename(sys.argv[0]) or "ctypes_launcher.py"

RDZV_OK = 0
RDZV_CANCELLED = 1
RDZV_INVALID_ARGUMENT = 3
AUTH_MODES = {"auto": 0, "munge": 1, "token": 2, "none": 3}
ABORT_WORKER_FAILED = 1
ABORT_AGENT_SIGNALLED = 2


# The structs and callbacks of client/rdzv.h; ctypes lays them out as the C compiler does.
class JoinSpec(ctypes.Structure):
    _fields_ = [("job_id", ctypes.c_char_p), ("min_nodes", ctypes.c_int32),
                ("max_nodes", ctypes.c_int32), ("node_index", ctypes.c_int64),
                ("nproc", ctypes.c_int32), ("host", ctypes.c_char_p),
                ("agent_id", ctypes.c_char_p), ("master_addr", ctypes.c_char_p),
                ("master_port", ctypes.c_int32)]


ProgressFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32)
AbortFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_int32, ctypes.c_char_p)
LostFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)


class Callbacks(ctypes.Structure):
    _fields_ = [("on_progress", ProgressFn), ("on_abort", AbortFn), ("on_lost", LostFn),
                ("user_data", ctypes.c_void_p)]


class Assignment(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int32) for name in (
        "round", "rank_offset", "local_rank_offset", "local_world_size", "world_size",
        "group_rank", "group_world_size", "restart_count", "master_port")] + [
        ("master_addr", ctypes.c_char * 256)]


class Failure(ctypes.Structure):
    _fields_ = [("cause", ctypes.c_int), ("rank", ctypes.c_int32),
                ("local_rank", ctypes.c_int32), ("exit_code", ctypes.c_int32),
                ("signal", ctypes.c_int32), ("message", ctypes.c_char_p)]


class AbortInfo(ctypes.Structure):
    _fields_ = [("cause", ctypes.c_int), ("exit_code", ctypes.c_int32),
                ("reason", ctypes.c_char * 1024)]


def die(message, code=1):
    print("%s: %s" % (PROG, message), file=sys.stderr, flush=True)
    sys.exit(code)


def load_library():
    """librdzv.so.0 with the argument and result types of the calls used here."""
    path = os.environ.get("RDZV_LIBRARY", "")
    if not path:
        beside = os.path.join(os.path.dirname(os.path.abspath(__file__)), "librdzv.so.0")
        path = beside if os.path.exists(beside) else "librdzv.so.0"
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        die("cannot load %s (%s); set RDZV_LIBRARY to the path of librdzv.so.0" % (path, e))
    p = ctypes.POINTER
    client = ctypes.c_void_p
    signatures = {
        "rdzv_last_error": (ctypes.c_char_p, []),
        "rdzv_code_name": (ctypes.c_char_p, [ctypes.c_int]),
        "rdzv_client_create": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_double, ctypes.c_int,
                                              ctypes.c_char_p, ctypes.c_char_p, p(client)]),
        "rdzv_client_destroy": (None, [client]),
        "rdzv_join_spec_init": (None, [p(JoinSpec)]),
        "rdzv_join": (ctypes.c_int, [client, p(JoinSpec), p(Callbacks), p(Assignment)]),
        "rdzv_report_failure": (ctypes.c_int, [client, p(Failure), p(AbortInfo)]),
        "rdzv_leave": (ctypes.c_int, [client]),
        "rdzv_cancel": (ctypes.c_int, [client]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    return lib


def error_text(lib, code):
    """rdzv_last_error() of this thread, or the code's name when the message is empty."""
    message = lib.rdzv_last_error().decode("utf-8", "replace")
    return message or lib.rdzv_code_name(code).decode()


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        die("%s (see --help)" % message, 2)


def parse_args(argv):
    parser = ArgumentParser(
        prog=PROG,
        usage="%(prog)s --rdzv-endpoint HOST:PORT --rdzv-id JOB --nnodes N[:M] --nproc P "
        "[options] -- COMMAND [ARG...]",
        description="Join a rendezvous at rdzvd through librdzv's C interface and run --nproc "
        "workers with torchrun's environment.")
    parser.add_argument("--rdzv-endpoint", required=True, metavar="HOST:PORT")
    parser.add_argument("--rdzv-id", required=True, metavar="JOB")
    parser.add_argument("--nnodes", required=True, metavar="N[:M]")
    parser.add_argument("--nproc", required=True, type=int, metavar="P")
    parser.add_argument("--node-rank", type=int, default=-1, metavar="I")
    parser.add_argument("--join-timeout", type=float, default=600, metavar="SECONDS")
    parser.add_argument("--auth", choices=sorted(AUTH_MODES), default="auto")
    parser.add_argument("--token-file", default="", metavar="PATH")
    parser.add_argument("--munge-socket", default="", metavar="PATH")
    parser.add_argument("--host-name", default="", metavar="NAME")
    parser.add_argument("--master-addr", default="", metavar="ADDR")
    parser.add_argument("--master-port", type=int, default=0, metavar="PORT")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG...]")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("no worker command; put it after --, e.g. -- python3 train.py")
    try:
        low, _, high = args.nnodes.partition(":")
        args.min_nodes, args.max_nodes = int(low), int(high or low)
    except ValueError:
        parser.error("--nnodes %r is malformed; expected N or MIN:MAX, e.g. 2 or 1:4"
                     % args.nnodes)
    return args


class Launcher:
    """One rdzv_client and the workers started under it. The callbacks run on librdzv's threads:
    they only record what happened, for the main thread to act on."""

    def __init__(self, lib, client):
        self.lib = lib
        self.client = client
        self.aborted = threading.Event()
        self.abort = (0, 1, "")
        self.lost = threading.Event()
        self.lost_message = ""
        self.stop_signal = 0
        self.progress = None
        # Kept referenced until rdzv_client_destroy: librdzv may call them until then.
        self.callbacks = Callbacks(ProgressFn(self._on_progress), AbortFn(self._on_abort),
                                   LostFn(self._on_lost), None)

    def _on_progress(self, _, joined, expected):
        if (joined, expected) == self.progress:
            return  # the server repeats it every few seconds; say it once
        self.progress = (joined, expected)
        print("%s: waiting for nodes: %d of %d joined" % (PROG, joined, expected),
              file=sys.stderr, flush=True)

    def _on_abort(self, _, cause, exit_code, reason):
        self.abort = (cause, exit_code, reason.decode("utf-8", "replace"))
        self.aborted.set()

    def _on_lost(self, _, code, message):
        self.lost_message = message.decode("utf-8", "replace")
        self.lost.set()

    def join(self, spec):
        """rdzv_join on a thread of its own, so that SIGTERM/SIGINT can cancel it meanwhile."""
        assignment = Assignment()
        result = {}

        def run():
            code = self.lib.rdzv_join(self.client, ctypes.byref(spec),
                                      ctypes.byref(self.callbacks), ctypes.byref(assignment))
            result["code"] = code
            result["error"] = error_text(self.lib, code) if code != RDZV_OK else ""

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.2)
        if result["code"] != RDZV_OK:
            if self.stop_signal:
                die("stopped by signal %d while joining" % self.stop_signal,
                    128 + self.stop_signal)
            die(result["error"], 2 if result["code"] == RDZV_INVALID_ARGUMENT else 1)
        return assignment

    def on_signal(self, signum, _):
        self.stop_signal = signum
        self.lib.rdzv_cancel(self.client)

    def report(self, cause, rank, local_rank, exit_code, sig, message):
        """Reports a failure; returns the job's exit code (its first failure's)."""
        failure = Failure(cause, rank, local_rank, exit_code, sig, message.encode())
        first = AbortInfo()
        code = self.lib.rdzv_report_failure(self.client, ctypes.byref(failure),
                                            ctypes.byref(first))
        if code != RDZV_OK:
            print("%s: could not report the failure: %s" % (PROG, error_text(self.lib, code)),
                  file=sys.stderr, flush=True)
            return exit_code or 1
        return first.exit_code


def worker_env(args, a, local):
    """torchrun's variables for local worker `local` of assignment `a`."""
    env = dict(os.environ)
    env.update({
        "RANK": str(a.rank_offset + local),
        "LOCAL_RANK": str(a.local_rank_offset + local),
        "WORLD_SIZE": str(a.world_size),
        "LOCAL_WORLD_SIZE": str(a.local_world_size),
        "GROUP_RANK": str(a.group_rank),
        "GROUP_WORLD_SIZE": str(a.group_world_size),
        "MASTER_ADDR": a.master_addr.decode(),
        "MASTER_PORT": str(a.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(a.restart_count),
        "TORCHELASTIC_RUN_ID": args.rdzv_id,
    })
    return env


def stop_workers(workers, grace=5.0):
    """SIGTERM to the workers still running, SIGKILL after `grace` seconds; reaps them all."""
    for w in workers:
        if w.poll() is None:
            w.terminate()
    deadline = time.monotonic() + grace
    for w in workers:
        try:
            w.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait()


def supervise(launcher, args, a, workers):
    """Waits for the workers; returns the launcher's exit code."""
    while True:
        if launcher.stop_signal:
            stop_workers(workers)
            sig = launcher.stop_signal
            launcher.report(ABORT_AGENT_SIGNALLED, a.rank_offset, a.local_rank_offset,
                            128 + sig, sig, "the launcher got signal %d" % sig)
            print("%s: stopped by signal %d" % (PROG, sig), file=sys.stderr, flush=True)
            return 128 + sig
        if launcher.aborted.is_set():
            stop_workers(workers)
            _, exit_code, reason = launcher.abort
            print("%s: job %s aborted: %s" % (PROG, args.rdzv_id, reason), file=sys.stderr,
                  flush=True)
            return exit_code
        if launcher.lost.is_set():
            stop_workers(workers)
            print("%s: lost the rendezvous server: %s" % (PROG, launcher.lost_message),
                  file=sys.stderr, flush=True)
            return 1
        codes = [w.poll() for w in workers]
        for local, rc in enumerate(codes):
            if rc is None or rc == 0:
                continue
            sig = -rc if rc < 0 else 0
            exit_code = 128 + sig if sig else rc
            rank = a.rank_offset + local
            stop_workers(workers)
            job_code = launcher.report(ABORT_WORKER_FAILED, rank, a.local_rank_offset + local,
                                       exit_code, sig, "")
            print("%s: rank %d exited with %s" % (
                PROG, rank, "signal %d" % sig if sig else "code %d" % rc), file=sys.stderr,
                flush=True)
            return job_code
        if all(rc == 0 for rc in codes):
            return 0
        time.sleep(0.1)


def main(argv):
    args = parse_args(argv)
    lib = load_library()
    client = ctypes.c_void_p()
    code = lib.rdzv_client_create(args.rdzv_endpoint.encode(), args.join_timeout,
                                  AUTH_MODES[args.auth], args.token_file.encode(),
                                  args.munge_socket.encode(), ctypes.byref(client))
    if code != RDZV_OK:
        die(error_text(lib, code), 2 if code == RDZV_INVALID_ARGUMENT else 1)
    launcher = Launcher(lib, client)
    try:
        signal.signal(signal.SIGTERM, launcher.on_signal)
        signal.signal(signal.SIGINT, launcher.on_signal)
        spec = JoinSpec()
        lib.rdzv_join_spec_init(ctypes.byref(spec))
        spec.job_id = args.rdzv_id.encode()
        spec.min_nodes, spec.max_nodes = args.min_nodes, args.max_nodes
        spec.node_index = args.node_rank
        spec.nproc = args.nproc
        spec.host = args.host_name.encode()
        spec.master_addr = args.master_addr.encode()
        spec.master_port = args.master_port
        a = launcher.join(spec)
        print("%s: node %d of %d, ranks %d-%d of %d, master %s:%d" % (
            PROG, a.group_rank, a.group_world_size, a.rank_offset,
            a.rank_offset + args.nproc - 1, a.world_size, a.master_addr.decode(),
            a.master_port), file=sys.stderr, flush=True)
        workers = []
        try:
            for local in range(args.nproc):
                workers.append(subprocess.Popen(args.command, env=worker_env(args, a, local)))
        except OSError as e:
            stop_workers(workers)
            launcher.report(ABORT_WORKER_FAILED, a.rank_offset + len(workers),
                            a.local_rank_offset + len(workers), 127, 0, str(e))
            die("cannot start %s: %s" % (args.command[0], e.strerror or e), 127)
        exit_code = supervise(launcher, args, a, workers)
        code = lib.rdzv_leave(client)
        if code != RDZV_OK and exit_code == 0:
            print("%s: leave: %s" % (PROG, error_text(lib, code)), file=sys.stderr, flush=True)
        return exit_code
    finally:
        # Blocks until librdzv runs no more callbacks; only then may they be freed.
        lib.rdzv_client_destroy(client)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
