/// @file flags.h
/// @brief Command-line flags for tools and daemons: long names only (`--name value` or
/// `--name=value`), a default shown in --help, an environment mirror (PREFIX_NAME), and
/// `--config FILE` with the same names as `name = value` lines. Precedence:
/// command line > environment > config file > default.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hack {

class FlagSet {
 public:
  /// program: shown in usage; env_prefix: e.g. "HACK_RUN" makes --max-tokens mirror
  /// HACK_RUN_MAX_TOKENS.
  FlagSet(std::string program, std::string summary, std::string env_prefix);

  void add_string(std::string name, std::string* target, std::string help);
  void add_int(std::string name, int* target, std::string help);
  void add_int64(std::string name, int64_t* target, std::string help);
  void add_float(std::string name, float* target, std::string help);
  void add_bool(std::string name, bool* target, std::string help);  ///< `--x`, `--x=false`
  /// Repeatable flag; each occurrence appends.
  void add_list(std::string name, std::vector<std::string>* target, std::string help);
  /// A secret: from its environment mirror, the config file, or `--NAME-file PATH` (the
  /// file's first line) — never from the command line itself, where every user of the
  /// machine reads it with `ps`. Registers both NAME and NAME-file.
  void add_secret(std::string name, std::string* target, std::string help);
  /// Optional value: stays unset unless given.
  void add_optional_uint64(std::string name, std::optional<uint64_t>* target, std::string help);

  /// Parses argv. Returns false if --help was given (usage already printed to stdout).
  /// Throws hack::Error naming the flag on an unknown flag, a missing or malformed value.
  bool parse(int argc, const char* const* argv);
  std::string usage() const;
  /// Whether the flag was given on the command line, environment or config file.
  bool was_set(const std::string& name) const;

 private:
  struct Flag {
    std::string name, help, default_text;
    bool is_bool = false;
    bool is_list = false;
    std::function<void(const std::string& value, const std::string& source)> set;
  };
  Flag& add(std::string name, std::string help, std::string default_text);
  void apply(Flag& f, const std::string& value, const std::string& source);
  void load_config_file(const std::string& path);
  std::string env_name(const std::string& flag) const;

  std::string program_, summary_, env_prefix_;
  std::vector<Flag> flags_;
  std::map<std::string, size_t> index_;
  std::map<std::string, bool> set_;
};

/// Items of a list-valued flag ("1024,2048"), split at `sep`; empty items are dropped.
std::vector<std::string> split_list(std::string_view text, char sep = ',');
/// Integers of a list-valued flag; throws hack::Error naming --`flag` on a malformed item.
std::vector<int> parse_int_list(std::string_view text, const std::string& flag);
/// Token ids as users type them: "1,2,3", "1 2 3" or a JSON array "[1, 2, 3]" (commas,
/// whitespace and brackets separate); throws hack::Error naming --`flag` on a non-integer.
std::vector<int> parse_id_list(std::string_view text, const std::string& flag);

/// A byte size as users type it: "1073741824", "512M", "8G", "1GiB" (K/M/G/T, powers of
/// 1024); throws hack::Error naming --`flag` for a malformed one.
size_t parse_byte_size(const std::string& text, const std::string& flag);

}  // namespace hack
