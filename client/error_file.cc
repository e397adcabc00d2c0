#include "client/error_file.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace rdzv {

std::string ReadErrorFile(const std::string& path) {
  if (path.empty()) return "";
  std::ifstream file(path);
  if (!file) return "";
  std::stringstream text;
  text << file.rdbuf();
  google::protobuf::Struct root;
  if (!google::protobuf::util::JsonStringToMessage(text.str(), &root).ok()) {
    return absl::StrCat("unreadable error file ", path);
  }
  const auto& fields = root.fields();
  auto message = fields.find("message");
  if (message == fields.end()) return "";
  if (message->second.has_string_value()) return message->second.string_value();
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
  return out;
}

}  // namespace rdzv
