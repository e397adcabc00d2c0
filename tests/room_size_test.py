"""Rooms stay small enough to keep in mind: no source file over 700 lines, no function over 100.

A file grows past the bound, or a function past its own, when a feature lands in a shell instead
of a core: find the decision inside and give it a home of its own first. A function is counted
from the line of its opening brace to the line of its closing one; a file by its lines. Tests and
the bench are not counted, nor the declarative flag tables (EXEMPT), which read as tables however
long they are; an exemption no longer over its bound fails the test too.
"""
import os
import re
import sys
import unittest

SOURCE_DIR = os.environ.get(
    "RDZV_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 100

# The folders whose sources are counted: everything but the tests, the bench and the docs.
FOLDERS = ("client", "common", "guard", "server", "deploy", "proto", "cmake")
SOURCE_ENDINGS = (".h", ".cc", ".c", ".py", ".sh", ".proto")
CXX_ENDINGS = (".h", ".cc", ".c")

# Over a bound by design: a flag table is one Add() per flag, read as a table.
EXEMPT = {
    "client/agent/core/agent_flags.cc:MakeParser",
    "server/server_flags.cc:MakeParser",
}


def source_files():
    for folder in FOLDERS:
        top = os.path.join(SOURCE_DIR, folder)
        for root, dirs, files in os.walk(top):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(SOURCE_ENDINGS):
                    yield os.path.relpath(os.path.join(root, name), SOURCE_DIR)


def blank_out(text):
    """`text` with comments, string and character literals and preprocessor lines replaced by
    spaces, line breaks kept: braces and parentheses that remain are the code's own."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#" or (line_start and c in " \t" and
                                        text[i:].lstrip(" \t").startswith("#")):
            # A preprocessor line, with its continuations.
            j = i
            while j < n:
                k = text.find("\n", j)
                if k < 0:
                    k = n
                if k > 0 and text[k - 1] == "\\":
                    j = k + 1
                    continue
                break
            out.append(re.sub(r"[^\n]", " ", text[i:k]))
            i = k
            continue
        line_start = c == "\n"
        if text.startswith("//", i):
            k = text.find("\n", i)
            k = n if k < 0 else k
            out.append(" " * (k - i))
            i = k
        elif text.startswith("/*", i):
            k = text.find("*/", i + 2)
            k = n if k < 0 else k + 2
            out.append(re.sub(r"[^\n]", " ", text[i:k]))
            i = k
        elif c == "R" and text.startswith('"', i + 1) and not (i > 0 and
                                                                 (text[i - 1].isalnum() or
                                                                  text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if m is None:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            k = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:k]))
            i = k
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():
                # A digit separator (1'000).
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            k = min(j + 1, n)
            out.append(" " * (k - i))
            i = k
        else:
            out.append(c)
            i += 1
    return "".join(out)


CONTAINER = re.compile(r"^(template\s*<.*>\s*)?(namespace|class|struct|union)\b|^extern\b",
                       re.DOTALL)
ENUM = re.compile(r"^(typedef\s+)?enum\b")
NAME = re.compile(r"((?:[A-Za-z_]\w*\s*::\s*)*~?\s*(?:operator\s*[^\s(]+|[A-Za-z_]\w*))\s*$")


def assigns(header):
    """Whether `header` assigns at parenthesis depth 0: a variable's initializer, not a
    function (whose default arguments stand inside parentheses)."""
    depth = 0
    for m in re.finditer(r"operator\s*(?:==|=|!=|<=|>=)|[()=<>!]=?", header):
        t = m.group(0)
        if t.startswith("operator"):
            continue
        if t == "(":
            depth += 1
        elif t == ")":
            depth -= 1
        elif t == "=" and depth == 0:
            return True
    return False


def function_name(header):
    depth = 0
    for i, c in enumerate(header):
        if c == "(" and depth == 0:
            m = NAME.search(header[:i])
            if m:
                return re.sub(r"\s+", "", m.group(1))
            return None
        if c == "<":
            depth += 1
        elif c == ">" and depth > 0:
            depth -= 1
    return None


def functions(text):
    """(name, first line, last line) of each function defined in `text` (C or C++): from the
    line of its body's opening brace to that of its closing one. Lambdas and local classes count
    as part of the function they stand in."""
    code = blank_out(text)
    found = []
    # Each open brace: "container" (namespace, class), "function", or "block" (anything else).
    stack = []
    header = []
    paren = 0
    line = 1
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        if c == "\n":
            line += 1
        in_function = any(kind == "function" for kind, _, _ in stack)
        if in_function:
            if c == "{":
                stack.append(("block", line, None))
            elif c == "}":
                kind, start, name = stack.pop()
                if kind == "function":
                    found.append((name, start, line))
            i += 1
            continue
        if c == "(":
            paren += 1
        elif c == ")":
            paren -= 1
        if paren > 0 or c not in "{};":
            header.append(c)
            i += 1
            continue
        text_before = "".join(header).strip()
        if c == "{":
            ctor_init = re.search(r"\)\s*(?:const\s*)?(?:noexcept\s*)?:(?!:)", text_before)
            if ctor_init and re.search(r"[\w>]\s*$", text_before):
                # A member's braced initializer in a constructor's initializer list.
                depth, j = 0, i
                while j < n:
                    if code[j] == "{":
                        depth += 1
                    elif code[j] == "}":
                        depth -= 1
                        if depth == 0:
                            break
                    elif code[j] == "\n":
                        line += 1
                    j += 1
                header.append(" ")
                i = j + 1
                continue
            if CONTAINER.search(text_before):
                stack.append(("container", line, None))
            elif ENUM.search(text_before) or assigns(text_before) or "(" not in text_before:
                stack.append(("block", line, None))
            else:
                stack.append(("function", line, function_name(text_before)))
            header = []
        elif c == "}":
            if stack:
                kind, start, name = stack.pop()
                if kind == "function":
                    found.append((name, start, line))
            header = []
        else:
            header = []
        i += 1
    return found


def measure(path):
    """(lines of the file, [(function, length)]) for the source at `path`."""
    with open(os.path.join(SOURCE_DIR, path), encoding="utf-8") as f:
        text = f.read()
    lines = text.count("\n")
    if not path.endswith(CXX_ENDINGS):
        return lines, []
    return lines, [(name, last - first + 1) for name, first, last in functions(text)]


def over_bounds():
    """Everything over a bound: {"path": lines} and {"path:function": lines}."""
    over = {}
    for path in source_files():
        lines, funcs = measure(path)
        if lines > MAX_FILE_LINES:
            over[path] = lines
        for name, length in funcs:
            if length > MAX_FUNCTION_LINES:
                over[f"{path}:{name}"] = max(length, over.get(f"{path}:{name}", 0))
    return over


class FunctionsTest(unittest.TestCase):
    """The counter itself, on the shapes the tree has."""

    def test_counts_from_brace_to_brace(self):
        text = ("namespace rdzv {\n"
                "class A {\n"
                " public:\n"
                "  int F() const {\n"
                "    return [] { return 1; }();\n"
                "  }\n"
                "  A() : x_{1}, y_(2) {\n"
                "  }\n"
                "  int x_, y_;\n"
                "};\n"
                "const int kTable[] = {1, 2};\n"
                "// void Commented() {\n"
                "bool A::operator==(const A& o) const {\n"
                "  const char* s = \"}\";\n"
                "  if (x_ == 1) {\n"
                "    return true;\n"
                "  }\n"
                "  return s[0] == '}';\n"
                "}\n"
                "}  // namespace rdzv\n")
        self.assertEqual(functions(text), [("F", 4, 6), ("A", 7, 8), ("A::operator==", 13, 19)])

    def test_raw_strings_and_defaults(self):
        text = ('constexpr char kUsage[] = R"(usage: { )";\n'
                "void G(int x = 1,\n"
                "       int y = 2) {\n"
                "  x = y;\n"
                "}\n")
        self.assertEqual(functions(text), [("G", 3, 5)])


class RoomSizeTest(unittest.TestCase):

    def test_no_room_over_its_bound(self):
        over = over_bounds()
        unexpected = {k: v for k, v in over.items()
                      if k.split(":")[-1] != "" and k not in EXEMPT}
        self.assertEqual(
            unexpected, {},
            f"files over {MAX_FILE_LINES} lines or functions over {MAX_FUNCTION_LINES}: split "
            "them (find the decision inside and give it a pure home)")

    def test_exemptions_are_still_needed(self):
        over = over_bounds()
        exempt_gone = sorted(k for k in EXEMPT if k not in over)
        self.assertEqual(exempt_gone, [], "within bounds now: take them off EXEMPT")


def report():
    """The longest files and functions, for a look at the house."""
    files, funcs = [], []
    for path in source_files():
        lines, fs = measure(path)
        files.append((lines, path))
        funcs.extend((length, f"{path}:{name}") for name, length in fs)
    for lines, path in sorted(files, reverse=True)[:15]:
        print(f"{lines:6d}  {path}")
    print()
    for length, name in sorted(funcs, reverse=True)[:20]:
        print(f"{length:6d}  {name}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--report"]:
        report()
        sys.exit(0)
    sys.exit(unittest.main())
