"""The folders say what is pure, and the includes agree.

Every file under a core/ folder (common/core, client/agent/core, guard/core, server/core) is pure:
it may include the standard library, abseil, other core/ headers and librdzv's public types
(client/client.h, abseil only), and nothing that brings a socket, a thread, a process, gRPC,
protobuf, asio or spdlog. Each product folder includes only the folders below it: common/core is
at the bottom, librdzv (client/) never includes the agent, rdzvctl or the server, and what both
rdzvd and the agent's relays keep between their callers and their work (guard/: who calls, how
many connections, how large a request) stands below both. The agent embeds rdzvd through
server/server.h alone.
"""
import os
import re
import sys
import unittest

SOURCE_DIR = os.environ.get(
    "RDZV_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.MULTILINE)

# System headers a pure file may use: the C++ standard library (no threads, clocks or files).
PURE_STD = {
    "algorithm", "array", "cctype", "cerrno", "charconv", "cmath", "cstddef", "cstdint",
    "cstdlib", "cstring", "deque", "functional", "initializer_list", "iterator", "limits",
    "map", "memory", "numeric", "optional", "set", "string", "string.h", "string_view",
    "tuple", "type_traits", "utility", "variant", "vector", "sys/types.h", "signal.h",
    "arpa/inet.h",  # inet_pton: an address parsed from text, nothing resolved
}

# The project folders each folder may include from (its own and those below it).
ALLOWED = {
    "common/core": {"common/core"},
    "common": {"common", "common/core", "rdzv/v1"},
    "client/agent/core": {"client/agent/core", "common/core", "client/client.h"},
    "client": {"client", "common", "common/core", "rdzv/v1", "grpc/health/v1"},
    "client/ctl": {"client/ctl", "client/client.h", "client/local_endpoint.h", "common",
                   "common/core", "rdzv/v1", "grpc/health/v1"},
    # The agent hosts servers: the embedded rdzvd (server/server.h), and its node's relay, which
    # speaks the protocol on both sides: to its callers behind the guard, upstream over librdzv's
    # way to a server.
    "client/agent": {"client/agent", "client/agent/core", "client/client.h",
                     "client/local_endpoint.h", "client/join_stream.h", "client/server_list.h",
                     "common", "common/core", "guard", "server/server.h", "rdzv/v1"},
    "guard/core": {"guard/core", "common/core"},
    "guard": {"guard", "guard/core", "common", "common/core", "rdzv/v1"},
    "server/core": {"server/core", "common/core"},
    "server": {"server", "server/core", "guard", "guard/core", "common", "common/core", "rdzv/v1",
               "grpc/health/v1"},
}


def folder_of(path):
    return os.path.dirname(path)


def sources():
    for folder in ALLOWED:
        full = os.path.join(SOURCE_DIR, folder)
        for name in sorted(os.listdir(full)):
            if name.endswith((".h", ".cc")):
                yield os.path.join(folder, name)


def project_include(target):
    """The folder (or public header) a project include names, or None for a library's."""
    for prefix in ("client/", "common/", "guard/", "server/", "rdzv/v1/", "grpc/health/v1/"):
        if target.startswith(prefix):
            return target
    return None


def allowed(folder, target):
    for entry in ALLOWED[folder]:
        if target == entry or folder_of(target) == entry:
            return True
    return False


class LayeringTest(unittest.TestCase):

    def test_core_folders_include_nothing_that_does_io(self):
        crossings = []
        for path in sources():
            if not folder_of(path).endswith("core"):
                continue
            with open(os.path.join(SOURCE_DIR, path)) as f:
                for kind, target in INCLUDE.findall(f.read()):
                    if kind == "<" and target not in PURE_STD:
                        crossings.append(f"{path}: <{target}>")
                    elif kind == '"' and not target.startswith("absl/"):
                        if not allowed(folder_of(path), target):
                            crossings.append(f'{path}: "{target}"')
        self.assertEqual(crossings, [], "pure files that include I/O or a higher layer")

    def test_each_folder_includes_only_the_layers_below_it(self):
        crossings = []
        for path in sources():
            with open(os.path.join(SOURCE_DIR, path)) as f:
                for kind, target in INCLUDE.findall(f.read()):
                    if kind != '"' or project_include(target) is None:
                        continue
                    if not allowed(folder_of(path), target):
                        crossings.append(f'{path}: "{target}"')
        self.assertEqual(crossings, [], "includes that climb to a product above")


if __name__ == "__main__":
    sys.exit(unittest.main())
