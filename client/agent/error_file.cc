#include "client/agent/error_file.h"

#include <fcntl.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace rdzv {
namespace {

// Why `path` is not read, for the warning; "" when it was.
std::string ReadCapped(const std::string& path, std::string& text) {
  // Not following links, not blocking on a FIFO (open and read would wait for a writer), and
  // only a regular file: the worker decides what is at this path.
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return "";
    return errno == ELOOP ? "it is a symbolic link" : strerror(errno);
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return "it is not a regular file";
  }
  if (st.st_size > static_cast<off_t>(kMaxErrorFileBytes)) {
    close(fd);
    return absl::StrCat("it is over ", kMaxErrorFileBytes, " bytes");
  }
  // The file may still grow: read one byte past the cap to notice.
  text.resize(kMaxErrorFileBytes + 1);
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  text.resize(got);
  if (got > kMaxErrorFileBytes) {
    text.clear();
    return absl::StrCat("it is over ", kMaxErrorFileBytes, " bytes");
  }
  return "";
}

// `text` with control characters escaped, except the line breaks and tabs of a call stack.
std::string Printable(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\n' && c != '\t') || u == 0x7f) {
      absl::StrAppend(&out, absl::StrFormat("\\x%02x", u));
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string ReadErrorFile(const std::string& path) {
  if (path.empty()) return "";
  std::string text;
  if (std::string why = ReadCapped(path, text); !why.empty()) {
    spdlog::warn("ignoring the worker's error file {}: {}", absl::CHexEscape(path), why);
    return "";
  }
  if (text.empty()) return "";
  google::protobuf::Struct root;
  if (!google::protobuf::util::JsonStringToMessage(text, &root).ok()) {
    return absl::StrCat("unreadable error file ", path);
  }
  const auto& fields = root.fields();
  auto message = fields.find("message");
  if (message == fields.end()) return "";
  if (message->second.has_string_value()) return Printable(message->second.string_value());
  if (!message->second.has_struct_value()) return "";
  const auto& inner = message->second.struct_value().fields();
  std::string out;
  if (auto m = inner.find("message"); m != inner.end()) out = m->second.string_value();
  if (auto extra = inner.find("extraInfo"); extra != inner.end()) {
    const auto& info = extra->second.struct_value().fields();
    if (auto stack = info.find("py_callstack"); stack != info.end()) {
      absl::StrAppend(&out, "\n", absl::StripTrailingAsciiWhitespace(stack->second.string_value()));
    }
  }
  return Printable(out);
}

}  // namespace rdzv
