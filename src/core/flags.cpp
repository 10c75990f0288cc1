#include "hack/core/flags.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "hack/core/error.h"

namespace hack {

namespace {

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

int64_t parse_integer(const std::string& value, const std::string& flag, const std::string& source) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  HACK_CHECK(!value.empty() && end != nullptr && *end == '\0' && errno == 0, "{}: --{} expects an integer, got '{}'",
             source, flag, value);
  return v;
}

}  // namespace

FlagSet::FlagSet(std::string program, std::string summary, std::string env_prefix)
    : program_(std::move(program)), summary_(std::move(summary)), env_prefix_(std::move(env_prefix)) {}

FlagSet::Flag& FlagSet::add(std::string name, std::string help, std::string default_text) {
  HACK_CHECK(!index_.contains(name), "flag --{} defined twice", name);
  index_[name] = flags_.size();
  flags_.push_back(Flag{std::move(name), std::move(help), std::move(default_text), false, false, nullptr});
  return flags_.back();
}

void FlagSet::add_string(std::string name, std::string* target, std::string help) {
  Flag& f = add(std::move(name), std::move(help), target->empty() ? "" : "\"" + *target + "\"");
  f.set = [target](const std::string& v, const std::string&) { *target = v; };
}

void FlagSet::add_int(std::string name, int* target, std::string help) {
  Flag& f = add(name, std::move(help), std::to_string(*target));
  f.set = [target, name](const std::string& v, const std::string& src) {
    const int64_t x = parse_integer(v, name, src);
    HACK_CHECK(x >= INT32_MIN && x <= INT32_MAX, "{}: --{} value {} out of range", src, name, v);
    *target = static_cast<int>(x);
  };
}

void FlagSet::add_int64(std::string name, int64_t* target, std::string help) {
  Flag& f = add(name, std::move(help), std::to_string(*target));
  f.set = [target, name](const std::string& v, const std::string& src) { *target = parse_integer(v, name, src); };
}

void FlagSet::add_float(std::string name, float* target, std::string help) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(*target));
  Flag& f = add(name, std::move(help), buf);
  f.set = [target, name](const std::string& v, const std::string& src) {
    char* end = nullptr;
    errno = 0;
    const float x = std::strtof(v.c_str(), &end);
    HACK_CHECK(!v.empty() && *end == '\0' && errno == 0, "{}: --{} expects a number, got '{}'", src, name, v);
    *target = x;
  };
}

void FlagSet::add_bool(std::string name, bool* target, std::string help) {
  Flag& f = add(name, std::move(help), *target ? "true" : "false");
  f.is_bool = true;
  f.set = [target, name](const std::string& v, const std::string& src) {
    if (v == "true" || v == "1" || v == "yes" || v == "on") *target = true;
    else if (v == "false" || v == "0" || v == "no" || v == "off") *target = false;
    else fail("{}: --{} expects true or false, got '{}'", src, name, v);
  };
}

void FlagSet::add_list(std::string name, std::vector<std::string>* target, std::string help) {
  Flag& f = add(std::move(name), std::move(help), "");
  f.is_list = true;
  f.set = [target](const std::string& v, const std::string&) { target->push_back(v); };
}

void FlagSet::add_optional_uint64(std::string name, std::optional<uint64_t>* target, std::string help) {
  Flag& f = add(name, std::move(help), "unset");
  f.set = [target, name](const std::string& v, const std::string& src) {
    const int64_t x = parse_integer(v, name, src);
    HACK_CHECK(x >= 0, "{}: --{} must be >= 0, got {}", src, name, v);
    *target = static_cast<uint64_t>(x);
  };
}

std::string FlagSet::env_name(const std::string& flag) const {
  std::string e = env_prefix_ + "_";
  for (char c : flag) e += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return e;
}

void FlagSet::add_secret(std::string name, std::string* target, std::string help) {
  const std::string env = env_name(name);
  Flag& f = add(name, help + " (never on the command line: set " + env + " or use --" + name + "-file)", "");
  f.set = [target, name, env](const std::string& value, const std::string& source) {
    HACK_CHECK(source != "command line",
               "--{} on the command line is visible to every user of this machine (ps); set {} in the environment, "
               "put it in the --config file, or use --{}-file PATH",
               name, env, name);
    *target = value;
  };
  Flag& file = add(name + "-file", "file whose first line is the " + name + " (keep it readable by this user only)", "");
  file.set = [target, name](const std::string& path, const std::string& source) {
    std::ifstream in(path);
    HACK_CHECK(in.good(), "{}: --{}-file {}: cannot read the file", source, name, path);
    std::string line;
    std::getline(in, line);
    *target = trim(line);
    HACK_CHECK(!target->empty(), "{}: --{}-file {}: the file is empty", source, name, path);
  };
}

void FlagSet::apply(Flag& f, const std::string& value, const std::string& source) {
  f.set(value, source);
  set_[f.name] = true;
}

void FlagSet::load_config_file(const std::string& path) {
  std::ifstream in(path);
  HACK_CHECK(in.good(), "cannot read config file {}", path);
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const std::string t = trim(line);
    if (t.empty() || t[0] == '#') continue;
    const size_t eq = t.find('=');
    HACK_CHECK(eq != std::string::npos, "{}:{}: expected 'name = value', got '{}'", path, line_no, t);
    const std::string name = trim(t.substr(0, eq));
    std::string value = trim(t.substr(eq + 1));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
    auto it = index_.find(name);
    HACK_CHECK(it != index_.end(), "{}:{}: unknown setting '{}'", path, line_no, name);
    apply(flags_[it->second], value, path + ":" + std::to_string(line_no));
  }
}

bool FlagSet::parse(int argc, const char* const* argv) {
  // Pass 1: command line into (name, value) pairs; --help and --config handled here.
  std::vector<std::pair<std::string, std::string>> cli;
  std::string config_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(usage().c_str(), stdout);
      return false;
    }
    // No tool takes positional arguments: a stray word is a mistake (e.g. "--balance 0",
    // which would otherwise turn the bool flag on and drop the 0).
    HACK_CHECK(a.rfind("--", 0) == 0, "unexpected argument '{}' (flags are --name VALUE; a bool flag is --name or "
               "--name=true|false)", a);
    a = a.substr(2);
    std::string value;
    bool has_value = false;
    if (const size_t eq = a.find('='); eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_value = true;
    }
    if (a == "config") {
      if (!has_value) {
        HACK_CHECK(i + 1 < argc, "--config needs a file");
        value = argv[++i];
      }
      config_path = value;
      continue;
    }
    auto it = index_.find(a);
    HACK_CHECK(it != index_.end(), "unknown flag --{} (see --help)", a);
    if (!has_value) {
      if (flags_[it->second].is_bool) {
        value = "true";
      } else {
        HACK_CHECK(i + 1 < argc, "flag --{} needs a value", a);
        value = argv[++i];
      }
    }
    cli.emplace_back(a, value);
  }
  // Lowest precedence first, so later sources overwrite.
  if (!config_path.empty()) load_config_file(config_path);
  for (Flag& f : flags_) {
    if (const char* env = std::getenv(env_name(f.name).c_str())) apply(f, env, env_name(f.name));
  }
  for (const auto& [name, value] : cli) apply(flags_[index_[name]], value, "command line");
  return true;
}

bool FlagSet::was_set(const std::string& name) const { return set_.contains(name); }

std::string FlagSet::usage() const {
  std::ostringstream o;
  o << "usage: " << program_ << " [flags]\n" << summary_ << "\n\nflags (environment mirror in brackets):\n";
  for (const Flag& f : flags_) {
    o << "  --" << f.name << (f.is_bool ? "" : " VALUE") << "\n      " << f.help;
    if (!f.default_text.empty()) o << " (default: " << f.default_text << ")";
    o << " [" << env_name(f.name) << "]\n";
  }
  o << "  --config FILE\n      read 'name = value' lines with the same names\n";
  return o.str();
}

std::vector<std::string> split_list(std::string_view text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(sep, start), text.size());
    if (end > start) out.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

namespace {

std::vector<int> parse_ints(const std::vector<std::string>& items, const std::string& flag) {
  std::vector<int> out;
  for (const std::string& item : items) {
    const int64_t v = parse_integer(trim(item), flag, "command line");
    HACK_CHECK(v >= INT32_MIN && v <= INT32_MAX, "--{} value {} out of range", flag, v);
    out.push_back(static_cast<int>(v));
  }
  return out;
}

}  // namespace

std::vector<int> parse_int_list(std::string_view text, const std::string& flag) {
  return parse_ints(split_list(text), flag);
}

std::vector<int> parse_id_list(std::string_view text, const std::string& flag) {
  std::string separated(text);
  for (char& c : separated)
    if (c == '[' || c == ']' || std::isspace(static_cast<unsigned char>(c))) c = ',';
  return parse_ints(split_list(separated), flag);
}

size_t parse_byte_size(const std::string& text, const std::string& flag) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  HACK_CHECK(digits > 0 && digits <= 15, "--{}: '{}' is not a size (a number with an optional K, M, G or T)", flag, text);
  size_t value = std::stoull(text.substr(0, digits));
  std::string unit = text.substr(digits);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  if (unit.size() == 2 && (unit[1] == 'i' || unit[1] == 'I')) unit.pop_back();
  int shift = 0;
  if (unit.empty()) {
    shift = 0;
  } else if (unit == "K" || unit == "k") {
    shift = 10;
  } else if (unit == "M" || unit == "m") {
    shift = 20;
  } else if (unit == "G" || unit == "g") {
    shift = 30;
  } else if (unit == "T" || unit == "t") {
    shift = 40;
  } else {
    fail("--{}: '{}' has an unknown unit '{}' (K, M, G or T)", flag, text, unit);
  }
  return value << shift;
}


}  // namespace hack
