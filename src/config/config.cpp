// Settings from defaults, chimaera.yaml (libyaml events), CHI_* environment
// variables and chi_config_t, validated with errors that name their origin:
// "PATH:LINE:COLUMN: ...", "CHI_VAR: ..." or "chi_config_t.field ...".
#include "config/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>

#include "ipc/address.h"

namespace chi {
namespace {

// A configuration file is a few hundred bytes; the caps keep a wrong path
// (a log, a device) or a hostile file from costing memory or stack.
constexpr size_t kMaxFileBytes = size_t{1} << 20;
constexpr size_t kMaxDepth = 16;
// struct_size must cover config_path (the first field every version reads);
// above the cap it is garbage from an uninitialized struct, not a newer ABI.
constexpr size_t kMinStructSize = offsetof(chi_config_t, config_path) + sizeof(const char *);
constexpr size_t kMaxStructSize = 4096;
constexpr int64_t kMaxWorkers = 1024;
constexpr int64_t kMaxGpus = 1024;

std::string format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char buf[512];
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < 0) return "(unformattable message)";
  if (static_cast<size_t>(n) < sizeof buf) return std::string(buf, static_cast<size_t>(n));
  std::string s(static_cast<size_t>(n) + 1, '\0');
  va_start(ap, fmt);
  vsnprintf(s.data(), s.size(), fmt, ap);
  va_end(ap);
  s.resize(static_cast<size_t>(n));
  return s;
}

// strerror_r is XSI (int) or GNU (char *) depending on feature macros.
[[maybe_unused]] const char *pick_strerror(int, const char *buf) { return buf; }
[[maybe_unused]] const char *pick_strerror(const char *s, const char *) { return s; }
std::string errno_text(int err) {
  char buf[256] = {0};
  return pick_strerror(strerror_r(err, buf, sizeof buf), buf);
}

// Quotes a user-supplied value for a message, cut short and made printable.
std::string quoted(const std::string &s) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < 64; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  }
  if (s.size() > 64) out += "...";
  return out + "'";
}

bool equals_nocase(const std::string &a, const char *b) {
  size_t n = std::strlen(b);
  if (a.size() != n) return false;
  for (size_t i = 0; i < n; ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

bool is_null_scalar(const std::string &s) {
  return s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL";
}

// Optional sign and decimal digits only: floats, hex, octal-looking leading
// zeros ("010" is 8 in YAML 1.1), suffixes and overflow are all refused.
bool parse_decimal(const std::string &s, int64_t *out) {
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  if (i == s.size()) return false;
  if (s[i] == '0' && i + 1 < s.size()) return false;
  uint64_t v = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    uint64_t d = static_cast<uint64_t>(s[i] - '0');
    if (v > (uint64_t{INT64_MAX} - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = neg ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
  return true;
}

// A size in bytes: decimal digits, optionally followed by K, M or G (with or
// without "iB"; powers of 1024).
bool parse_bytes(const std::string &s, int64_t *out) {
  size_t digits = 0;
  while (digits < s.size() && s[digits] >= '0' && s[digits] <= '9') ++digits;
  if (digits == 0) return false;
  int64_t v;
  if (!parse_decimal(s.substr(0, digits), &v)) return false;
  std::string unit = s.substr(digits);
  int shift = 0;
  if (unit.empty()) shift = 0;
  else if (unit == "K" || unit == "KiB") shift = 10;
  else if (unit == "M" || unit == "MiB") shift = 20;
  else if (unit == "G" || unit == "GiB") shift = 30;
  else return false;
  if (v > (INT64_MAX >> shift)) return false;
  *out = v << shift;
  return true;
}

bool parse_bool(const std::string &s, bool *out) {
  for (const char *t : {"true", "yes", "on"})
    if (equals_nocase(s, t)) return *out = true, true;
  for (const char *t : {"false", "no", "off"})
    if (equals_nocase(s, t)) return *out = false, true;
  return false;
}

// shm://NAME, ipc://PATH or tcp://HOST:PORT (the transports' address forms).
bool valid_address(const std::string &a) {
  const ipc::Transport t = ipc::transport_of(a);
  if (t == ipc::Transport::kUnknown) return false;
  const char *rest = ipc::after_scheme(a);
  if (t == ipc::Transport::kShm) return *rest && !std::strchr(rest, '/');
  if (t == ipc::Transport::kIpc) return *rest != '\0';
  std::string host, why;
  int port = 0;
  return ipc::split_tcp_address(rest, &host, &port, &why);
}

enum class Kind { kInt, kBytes, kBool, kLogLevel, kMode, kAddress, kPathList, kAddressList, kString };

struct Value {
  int64_t i = 0;
  bool b = false;
  std::string s;
  std::vector<std::string> list;
};

struct Setting {
  const char *key;  // as written in the file, "gpu." for keys of the gpu mapping
  const char *env;
  Kind kind;
  int64_t lo, hi;
  bool pow2;
  void (*store)(Config &, const Value &);
};

// One row per key: the file, the environment and the docs agree through it.
const Setting kSettings[] = {
    {"workers", "CHI_WORKERS", Kind::kInt, 0, kMaxWorkers, false,
     [](Config &c, const Value &v) { c.workers = static_cast<uint32_t>(v.i); }},
    {"queue_depth", "CHI_QUEUE_DEPTH", Kind::kInt, 2, 1 << 20, true,
     [](Config &c, const Value &v) { c.queue_depth = static_cast<uint32_t>(v.i); }},
    {"max_inline_payload", "CHI_MAX_INLINE_PAYLOAD", Kind::kInt, 0, 1 << 20, false,
     [](Config &c, const Value &v) { c.max_inline_payload = static_cast<uint32_t>(v.i); }},
    {"spin_ns", "CHI_SPIN_NS", Kind::kInt, 0, 10000000000, false,
     [](Config &c, const Value &v) { c.spin_ns = v.i; }},
    {"worker_pop_batch", "CHI_WORKER_POP_BATCH", Kind::kInt, 0, 8, false,
     [](Config &c, const Value &v) { c.worker_pop_batch = static_cast<uint32_t>(v.i); }},
    {"worker_spinners", "CHI_WORKER_SPINNERS", Kind::kInt, 0, kMaxWorkers, false,
     [](Config &c, const Value &v) { c.worker_spinners = static_cast<uint32_t>(v.i); }},
    {"client_yield_ns", "CHI_CLIENT_YIELD_NS", Kind::kInt, 0, 10000000000, false,
     [](Config &c, const Value &v) { c.client_yield_ns = v.i; }},
    {"client_spin_min_cpus", "CHI_CLIENT_SPIN_MIN_CPUS", Kind::kInt, 1, 65536, false,
     [](Config &c, const Value &v) { c.client_spin_min_cpus = static_cast<uint32_t>(v.i); }},
    {"submit_blocking", "CHI_SUBMIT_BLOCKING", Kind::kBool, 0, 0, false,
     [](Config &c, const Value &v) { c.submit_blocking = v.b; }},
    {"inline_wait", "CHI_INLINE_WAIT", Kind::kBool, 0, 0, false,
     [](Config &c, const Value &v) { c.inline_wait = v.b; }},
    {"submit_timeout_ms", "CHI_SUBMIT_TIMEOUT_MS", Kind::kInt, 0, 3600000, false,
     [](Config &c, const Value &v) { c.submit_timeout_ms = static_cast<uint32_t>(v.i); }},
    {"worker_stack_size", "CHI_WORKER_STACK_SIZE", Kind::kBytes, 64 << 10, int64_t(64) << 30, false,
     [](Config &c, const Value &v) { c.worker_stack_size = static_cast<uint64_t>(v.i); }},
    {"log_level", "CHI_LOG_LEVEL", Kind::kLogLevel, 0, 0, false,
     [](Config &c, const Value &v) { c.log_level = static_cast<LogLevel>(v.i); }},
    {"modules", "CHI_MODULES", Kind::kPathList, 0, 0, false,
     [](Config &c, const Value &v) { c.modules = v.list; }},
    {"mode", "CHI_MODE", Kind::kMode, 0, 0, false,
     [](Config &c, const Value &v) { c.mode = static_cast<int32_t>(v.i); }},
    {"server_address", "CHI_SERVER_ADDRESS", Kind::kAddress, 0, 0, false,
     [](Config &c, const Value &v) { c.server_address = v.s; }},
    {"disconnect_check_ms", "CHI_DISCONNECT_CHECK_MS", Kind::kInt, 1, 60000, false,
     [](Config &c, const Value &v) { c.disconnect_check_ms = static_cast<uint32_t>(v.i); }},
    {"connect_timeout_ms", "CHI_CONNECT_TIMEOUT_MS", Kind::kInt, 1, 3600000, false,
     [](Config &c, const Value &v) { c.connect_timeout_ms = static_cast<uint32_t>(v.i); }},
    {"curve_server_key", "CHI_CURVE_SERVER_KEY", Kind::kString, 0, 0, false,
     [](Config &c, const Value &v) { c.curve_server_key = v.s; }},
    {"curve_key_file", "CHI_CURVE_KEY_FILE", Kind::kString, 0, 0, false,
     [](Config &c, const Value &v) { c.curve_key_file = v.s; }},
    {"server.mps", "CHI_SERVER_MPS", Kind::kBool, 0, 0, false,
     [](Config &c, const Value &v) { c.server.mps = v.b; }},
    {"server.curve_key_file", "CHI_SERVER_CURVE_KEY_FILE", Kind::kString, 0, 0, false,
     [](Config &c, const Value &v) { c.server.curve_key_file = v.s; }},
    {"server.curve_allowed_keys_file", "CHI_SERVER_CURVE_ALLOWED_KEYS_FILE", Kind::kString, 0, 0, false,
     [](Config &c, const Value &v) { c.server.curve_allowed_keys_file = v.s; }},
    {"server.listen", "CHI_SERVER_LISTEN", Kind::kAddressList, 0, 0, false,
     [](Config &c, const Value &v) { c.server.listen = v.list; }},
    {"server.pollers", "CHI_SERVER_POLLERS", Kind::kInt, 0, 64, false,
     [](Config &c, const Value &v) { c.server.pollers = static_cast<uint32_t>(v.i); }},
    {"server.client_slots", "CHI_SERVER_CLIENT_SLOTS", Kind::kInt, 2, 1 << 16, true,
     [](Config &c, const Value &v) { c.server.client_slots = static_cast<uint32_t>(v.i); }},
    {"server.max_clients", "CHI_SERVER_MAX_CLIENTS", Kind::kInt, 1, 65536, false,
     [](Config &c, const Value &v) { c.server.max_clients = static_cast<uint32_t>(v.i); }},
    {"server.client_max_in_flight", "CHI_SERVER_CLIENT_MAX_IN_FLIGHT", Kind::kInt, 0, 1 << 20, false,
     [](Config &c, const Value &v) { c.server.client_max_in_flight = static_cast<uint32_t>(v.i); }},
    {"server.spin_ns", "CHI_SERVER_SPIN_NS", Kind::kInt, 0, 10000000000, false,
     [](Config &c, const Value &v) { c.server.spin_ns = v.i; }},
    {"server.yield_ns", "CHI_SERVER_YIELD_NS", Kind::kInt, 0, 10000000000, false,
     [](Config &c, const Value &v) { c.server.yield_ns = v.i; }},
    {"server.hello_timeout_ms", "CHI_SERVER_HELLO_TIMEOUT_MS", Kind::kInt, 1, 3600000, false,
     [](Config &c, const Value &v) { c.server.hello_timeout_ms = static_cast<uint32_t>(v.i); }},
    {"server.inline_builtins", "CHI_SERVER_INLINE_BUILTINS", Kind::kBool, 0, 0, false,
     [](Config &c, const Value &v) { c.server.inline_builtins = v.b; }},
    {"server.shutdown_timeout_ms", "CHI_SERVER_SHUTDOWN_TIMEOUT_MS", Kind::kInt, 0, 3600000, false,
     [](Config &c, const Value &v) { c.server.shutdown_timeout_ms = static_cast<uint32_t>(v.i); }},
    {"gpu.devices", "CHI_GPU_DEVICES", Kind::kInt, -1, kMaxGpus, false,
     [](Config &c, const Value &v) { c.gpu.devices = static_cast<int32_t>(v.i); }},
    {"gpu.blocks", "CHI_GPU_BLOCKS", Kind::kInt, 0, 1024, false,
     [](Config &c, const Value &v) { c.gpu.blocks = static_cast<uint32_t>(v.i); }},
    {"gpu.warps_per_block", "CHI_GPU_WARPS_PER_BLOCK", Kind::kInt, 1, 32, false,
     [](Config &c, const Value &v) { c.gpu.warps_per_block = static_cast<uint32_t>(v.i); }},
    {"gpu.queue_depth", "CHI_GPU_QUEUE_DEPTH", Kind::kInt, 2, 1 << 20, true,
     [](Config &c, const Value &v) { c.gpu.queue_depth = static_cast<uint32_t>(v.i); }},
    {"gpu.device_slots", "CHI_GPU_DEVICE_SLOTS", Kind::kInt, 32, 1 << 22, true,
     [](Config &c, const Value &v) { c.gpu.device_slots = static_cast<uint32_t>(v.i); }},
    {"gpu.max_payload", "CHI_GPU_MAX_PAYLOAD", Kind::kInt, 0, 1 << 20, false,
     [](Config &c, const Value &v) { c.gpu.max_payload = static_cast<uint32_t>(v.i); }},
    {"gpu.poll_interval_us", "CHI_GPU_POLL_INTERVAL_US", Kind::kInt, 0, 100000, false,
     [](Config &c, const Value &v) { c.gpu.poll_interval_us = static_cast<uint32_t>(v.i); }},
    {"gpu.poller_spin_ns", "CHI_GPU_POLLER_SPIN_NS", Kind::kInt, 0, 10000000000, false,
     [](Config &c, const Value &v) { c.gpu.poller_spin_ns = v.i; }},
    {"gpu.poller_park_after_us", "CHI_GPU_POLLER_PARK_AFTER_US", Kind::kInt, 0, 100000000, false,
     [](Config &c, const Value &v) { c.gpu.poller_park_after_us = static_cast<uint32_t>(v.i); }},
    {"gpu.poller_watch_interval_us", "CHI_GPU_POLLER_WATCH_INTERVAL_US", Kind::kInt, 1, 1000000, false,
     [](Config &c, const Value &v) { c.gpu.poller_watch_interval_us = static_cast<uint32_t>(v.i); }},
    {"gpu.poller_bell_check_us", "CHI_GPU_POLLER_BELL_CHECK_US", Kind::kInt, 0, 1000000, false,
     [](Config &c, const Value &v) { c.gpu.poller_bell_check_us = static_cast<uint32_t>(v.i); }},
    {"gpu.poller_steal_us", "CHI_GPU_POLLER_STEAL_US", Kind::kInt, 0, 10000000, false,
     [](Config &c, const Value &v) { c.gpu.poller_steal_us = static_cast<uint32_t>(v.i); }},
    {"gpu.client_orchestrator", "CHI_GPU_CLIENT_ORCHESTRATOR", Kind::kBool, 0, 0, false,
     [](Config &c, const Value &v) { c.gpu.client_orchestrator = v.b; }},
    {"gpu.peer_routes", "CHI_GPU_PEER_ROUTES", Kind::kBool, 0, 0, false,
     [](Config &c, const Value &v) { c.gpu.peer_routes = v.b; }},
    {"gpu.keep_alive_us", "CHI_GPU_KEEP_ALIVE_US", Kind::kInt, 0, 10000000, false,
     [](Config &c, const Value &v) { c.gpu.keep_alive_us = static_cast<uint32_t>(v.i); }},
    {"gpu.idle_lease_us", "CHI_GPU_IDLE_LEASE_US", Kind::kInt, 0, 1000000, false,
     [](Config &c, const Value &v) { c.gpu.idle_lease_us = static_cast<uint32_t>(v.i); }},
    {"gpu.lease_us", "CHI_GPU_LEASE_US", Kind::kInt, 0, 1000000, false,
     [](Config &c, const Value &v) { c.gpu.lease_us = static_cast<uint32_t>(v.i); }},
    {"gpu.device_submit_timeout_us", "CHI_GPU_DEVICE_SUBMIT_TIMEOUT_US", Kind::kInt, 0, 600000000, false,
     [](Config &c, const Value &v) { c.gpu.device_submit_timeout_us = static_cast<uint32_t>(v.i); }},
};

const Setting *find_setting(const std::string &key) {
  for (const Setting &s : kSettings)
    if (key == s.key) return &s;
  return nullptr;
}

std::string expectation(const Setting &s) {
  switch (s.kind) {
    case Kind::kInt:
      return format("%s in [%lld, %lld]", s.pow2 ? "a power of two" : "an integer",
                    static_cast<long long>(s.lo), static_cast<long long>(s.hi));
    case Kind::kBytes:
      return format("0 (system default) or a size in [%lld, %lld] bytes (suffix K, M or G allowed)",
                    static_cast<long long>(s.lo), static_cast<long long>(s.hi));
    case Kind::kBool:
      return "a boolean (true/false, yes/no, on/off)";
    case Kind::kLogLevel:
      return "one of error, warn, info, debug";
    case Kind::kMode:
      return "one of embedded, client";
    case Kind::kAddress:
      return "an address shm://NAME, ipc://PATH or tcp://HOST:PORT";
    case Kind::kPathList:
      return "a list of module paths";
    case Kind::kAddressList:
      return "a list of addresses shm://NAME, ipc://PATH or tcp://HOST:PORT";
    case Kind::kString:
      return "a string";
  }
  return "a value";
}

// Converts one scalar.  `plain` is false for quoted YAML scalars, which are
// strings: `workers: "4"` is refused rather than guessed at.
bool parse_scalar(const Setting &s, const std::string &text, bool plain, Value *v) {
  switch (s.kind) {
    case Kind::kInt:
      return plain && parse_decimal(text, &v->i) && v->i >= s.lo && v->i <= s.hi &&
             (!s.pow2 || (v->i & (v->i - 1)) == 0);
    case Kind::kBytes:
      return plain && parse_bytes(text, &v->i) && (v->i == 0 || (v->i >= s.lo && v->i <= s.hi));
    case Kind::kBool:
      return plain && parse_bool(text, &v->b);
    case Kind::kLogLevel: {
      static const char *const names[] = {"error", "warn", "info", "debug"};
      for (int i = 0; i < 4; ++i)
        if (equals_nocase(text, names[i])) return v->i = i, true;
      return false;
    }
    case Kind::kMode:
      if (equals_nocase(text, "embedded")) return v->i = CHI_MODE_EMBEDDED, true;
      if (equals_nocase(text, "client")) return v->i = CHI_MODE_CLIENT, true;
      return false;
    case Kind::kAddress:
      v->s = text;
      return text.empty() || valid_address(text);
    case Kind::kString:
      v->s = text;
      return true;
    case Kind::kPathList:
    case Kind::kAddressList:
      return false;
  }
  return false;
}

// Where each setting last came from ("PATH:L:C", "CHI_VAR", "chi_config_t.x"),
// for messages about combinations of settings.
using Origins = std::map<std::string, std::string>;

struct Node {
  enum Type { kScalar, kSequence, kMapping } type = kScalar;
  std::string text;
  bool plain = false;  // unquoted: may be a number, a boolean or null
  yaml_mark_t mark{};
  std::vector<std::unique_ptr<Node>> items;  // sequence items; mapping key, value, key, ...

  bool is_null() const { return type == kScalar && plain && is_null_scalar(text); }
};

std::string where(const std::string &path, const yaml_mark_t &m) {
  return format("%s:%zu:%zu", path.c_str(), m.line + 1, m.column + 1);
}

std::string describe(const Node &n) {
  if (n.type == Node::kMapping) return "a mapping";
  if (n.type == Node::kSequence) return "a list";
  if (n.is_null()) return "an empty value";
  return n.plain ? quoted(n.text) : "the quoted string " + quoted(n.text);
}

struct EventGuard {
  yaml_event_t ev;
  ~EventGuard() { yaml_event_delete(&ev); }
};

struct ParserGuard {
  yaml_parser_t p;
  bool live = false;
  ~ParserGuard() {
    if (live) yaml_parser_delete(&p);
  }
};

// Line and column of a byte offset (libyaml reports reader errors by offset).
yaml_mark_t mark_at(const std::string &text, size_t offset) {
  yaml_mark_t m{};
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++m.line;
      m.column = 0;
    } else {
      ++m.column;
    }
  }
  m.index = offset;
  return m;
}

// Builds the node tree of the (single) document; *root stays null for an
// empty stream.  Aliases are refused: the schema never needs them and they
// are the classic way to make a small file expand without bound.
chi_status_t build_tree(const std::string &text, const std::string &path,
                        std::unique_ptr<Node> *root, std::string *error) {
  ParserGuard pg;
  if (!yaml_parser_initialize(&pg.p)) {
    *error = path + ": out of memory starting the YAML parser";
    return CHI_ERR_NOMEM;
  }
  pg.live = true;
  yaml_parser_set_input_string(&pg.p, reinterpret_cast<const unsigned char *>(text.data()),
                               text.size());
  std::vector<Node *> stack;
  int documents = 0;
  for (;;) {
    EventGuard e;
    if (!yaml_parser_parse(&pg.p, &e.ev)) {
      // yaml_parser_parse leaves the event zeroed on failure: deleting is safe.
      const yaml_parser_t &p = pg.p;
      if (p.error == YAML_MEMORY_ERROR) {
        *error = path + ": out of memory while parsing";
        return CHI_ERR_NOMEM;
      }
      yaml_mark_t m = p.error == YAML_READER_ERROR ? mark_at(text, p.problem_offset)
                                                   : p.problem_mark;
      *error = where(path, m) + ": invalid YAML: " + (p.problem ? p.problem : "syntax error");
      if (p.context)
        *error += format(" (%s at line %zu, column %zu)", p.context, p.context_mark.line + 1,
                         p.context_mark.column + 1);
      return CHI_ERR_CONFIG;
    }
    const yaml_event_t &ev = e.ev;
    switch (ev.type) {
      case YAML_STREAM_END_EVENT:
        return CHI_OK;
      case YAML_DOCUMENT_START_EVENT:
        if (++documents > 1) {
          *error = where(path, ev.start_mark) + ": only one YAML document is allowed";
          return CHI_ERR_CONFIG;
        }
        break;
      case YAML_ALIAS_EVENT:
        *error = where(path, ev.start_mark) + ": aliases (*" +
                 reinterpret_cast<const char *>(ev.data.alias.anchor) + ") are not supported";
        return CHI_ERR_CONFIG;
      case YAML_SCALAR_EVENT:
      case YAML_SEQUENCE_START_EVENT:
      case YAML_MAPPING_START_EVENT: {
        const yaml_char_t *tag = ev.type == YAML_SCALAR_EVENT ? ev.data.scalar.tag
                                 : ev.type == YAML_SEQUENCE_START_EVENT
                                     ? ev.data.sequence_start.tag
                                     : ev.data.mapping_start.tag;
        if (tag) {
          *error = where(path, ev.start_mark) + ": tags (" +
                   quoted(reinterpret_cast<const char *>(tag)) + ") are not supported";
          return CHI_ERR_CONFIG;
        }
        auto node = std::make_unique<Node>();
        node->mark = ev.start_mark;
        if (ev.type == YAML_SCALAR_EVENT) {
          node->text.assign(reinterpret_cast<const char *>(ev.data.scalar.value),
                            ev.data.scalar.length);
          node->plain = ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        } else {
          node->type = ev.type == YAML_SEQUENCE_START_EVENT ? Node::kSequence : Node::kMapping;
          if (stack.size() >= kMaxDepth) {
            *error = where(path, ev.start_mark) +
                     format(": nested more than %zu levels deep", kMaxDepth);
            return CHI_ERR_CONFIG;
          }
        }
        Node *raw = node.get();
        if (!stack.empty())
          stack.back()->items.push_back(std::move(node));
        else
          *root = std::move(node);
        if (raw->type != Node::kScalar) stack.push_back(raw);
        break;
      }
      case YAML_SEQUENCE_END_EVENT:
      case YAML_MAPPING_END_EVENT:
        stack.pop_back();
        break;
      default:
        break;
    }
  }
}

class FileReader {
 public:
  // dotted: top-level keys may name nested settings ("gpu.lease_us"), as in
  // chi_config_t.settings.
  FileReader(const std::string &path, Config *cfg, Origins *origins, std::string *error,
             bool dotted = false)
      : path_(path), cfg_(cfg), origins_(origins), error_(error), dotted_(dotted) {}

  chi_status_t top(const Node *root) {
    if (!root || root->is_null()) return CHI_OK;  // empty file or only comments
    if (root->type != Node::kMapping)
      return fail(root->mark, "expected a mapping of settings at the top level, got " +
                                  describe(*root));
    return mapping(*root, "");
  }

 private:
  chi_status_t fail(const yaml_mark_t &m, const std::string &what) {
    *error_ = where(path_, m) + ": " + what;
    return CHI_ERR_CONFIG;
  }

  // `prefix` is "" for the top level and "gpu." inside the gpu mapping.
  chi_status_t mapping(const Node &map, const std::string &prefix) {
    std::vector<const Node *> seen;
    for (size_t i = 0; i + 1 < map.items.size(); i += 2) {
      const Node &key = *map.items[i];
      const Node &value = *map.items[i + 1];
      if (key.type != Node::kScalar)
        return fail(key.mark, "keys must be plain names, got " + describe(key));
      for (const Node *k : seen)
        if (k->text == key.text)
          return fail(key.mark, format("duplicate key %s (first at line %zu, column %zu)",
                                       quoted(prefix + key.text).c_str(), k->mark.line + 1,
                                       k->mark.column + 1));
      seen.push_back(&key);
      chi_status_t st = entry(key, value, prefix);
      if (st != CHI_OK) return st;
    }
    return CHI_OK;
  }

  chi_status_t entry(const Node &key, const Node &value, const std::string &prefix) {
    const std::string name = prefix + key.text;
    if (prefix.empty() && (key.text == "gpu" || key.text == "server")) {
      if (value.is_null()) return CHI_OK;
      if (value.type != Node::kMapping)
        return fail(value.mark, key.text + ": expected a mapping of " + key.text +
                                    " settings, got " + describe(value));
      return mapping(value, key.text + ".");
    }
    // In a file, a dotted key would otherwise reach "gpu.*" settings from the
    // top level.
    bool plain_name = key.text.find('.') == std::string::npos || (dotted_ && prefix.empty());
    const Setting *s = plain_name ? find_setting(name) : nullptr;
    if (!s) return fail(key.mark, "unknown key " + quoted(name));

    Value v;
    if (s->kind == Kind::kPathList || s->kind == Kind::kAddressList) {
      chi_status_t st = path_list(*s, value, &v);
      if (st != CHI_OK) return st;
    } else if (s->kind == Kind::kAddress && value.is_null()) {
      v.s.clear();  // no address: the default local server
    } else if (value.type != Node::kScalar || !parse_scalar(*s, value.text, value.plain, &v)) {
      return fail(value.mark, name + ": expected " + expectation(*s) + ", got " + describe(value));
    }
    s->store(*cfg_, v);
    (*origins_)[s->key] = where(path_, value.mark);
    return CHI_OK;
  }

  chi_status_t path_list(const Setting &s, const Node &value, Value *v) {
    if (value.is_null()) return CHI_OK;
    if (value.type != Node::kSequence)
      return fail(value.mark, std::string(s.key) + ": expected " + expectation(s) + ", got " +
                                  describe(value));
    for (const auto &item : value.items) {
      bool address = s.kind == Kind::kAddressList;
      if (item->type != Node::kScalar || item->is_null() || item->text.empty() ||
          (address && !valid_address(item->text)))
        return fail(item->mark, std::string(s.key) + ": expected " +
                                    (address ? "an address shm://NAME, ipc://PATH or tcp://HOST:PORT"
                                             : "a module path") +
                                    ", got " + describe(*item));
      v->list.push_back(item->text);
    }
    return CHI_OK;
  }

  const std::string &path_;
  Config *cfg_;
  Origins *origins_;
  std::string *error_;
  bool dotted_;
};

chi_status_t read_file(const std::string &path, const char *named_by, std::string *text,
                       std::string *error) {
  std::string note = named_by ? format(" (named by %s)", named_by) : "";
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = path + ": cannot open: " + errno_text(errno) + note;
    return CHI_ERR_CONFIG;
  }
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    close(fd);
    *error = path + ": cannot open: " + errno_text(EISDIR) + note;
    return CHI_ERR_CONFIG;
  }
  text->clear();
  char buf[16384];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      close(fd);
      *error = path + ": cannot read: " + errno_text(err) + note;
      return CHI_ERR_CONFIG;
    }
    if (n == 0) break;
    text->append(buf, static_cast<size_t>(n));
    if (text->size() > kMaxFileBytes) {
      close(fd);
      *error = path + format(": larger than %zu bytes; not a chimaera configuration file?",
                             kMaxFileBytes) + note;
      return CHI_ERR_CONFIG;
    }
  }
  close(fd);
  return CHI_OK;
}

chi_status_t parse_file_text(const std::string &text, const std::string &path, Config *out,
                             Origins *origins, std::string *error, bool dotted = false) {
  std::unique_ptr<Node> root;
  chi_status_t st = build_tree(text, path, &root, error);
  if (st != CHI_OK) return st;
  return FileReader(path, out, origins, error, dotted).top(root.get());
}

chi_status_t apply_env(Config *out, Origins *origins, std::string *error) {
  for (const Setting &s : kSettings) {
    const char *raw = std::getenv(s.env);
    if (!raw || !*raw) continue;  // unset and empty both mean "not overridden"
    std::string text = raw;
    Value v;
    bool ok = true;
    if (s.kind == Kind::kPathList) {
      size_t start = 0;
      while (start <= text.size()) {
        size_t colon = text.find(':', start);
        if (colon == std::string::npos) colon = text.size();
        if (colon > start) v.list.push_back(text.substr(start, colon - start));
        start = colon + 1;
      }
    } else if (s.kind == Kind::kAddressList) {
      // Addresses hold ':' themselves: the list is comma-separated.
      size_t start = 0;
      while (start <= text.size()) {
        size_t comma = text.find(',', start);
        if (comma == std::string::npos) comma = text.size();
        std::string a = text.substr(start, comma - start);
        if (!a.empty()) {
          ok = ok && valid_address(a);
          v.list.push_back(a);
        }
        start = comma + 1;
      }
    } else {
      ok = parse_scalar(s, text, true, &v);
    }
    if (!ok) {
      *error = format("%s: expected %s, got %s", s.env, expectation(s).c_str(),
                      quoted(text).c_str());
      return CHI_ERR_CONFIG;
    }
    s.store(*out, v);
    (*origins)[s.key] = s.env;
  }
  return CHI_OK;
}

// The caller's struct, with fields beyond its struct_size at their defaults.
chi_status_t read_struct(const chi_config_t *cfg, chi_config_t *c, std::string *error) {
  *c = chi_config_t{sizeof(chi_config_t), nullptr, CHI_MODE_EMBEDDED, nullptr, 0, -1, nullptr};
  if (!cfg) return CHI_OK;
  size_t n = cfg->struct_size;
  if (n < kMinStructSize || n > kMaxStructSize) {
    *error = format("chi_config_t.struct_size is %zu, expected %zu..%zu; fill the struct with "
                    "chi_config_init",
                    n, kMinStructSize, kMaxStructSize);
    return CHI_ERR_INVALID;
  }
  auto fits = [n](size_t offset, size_t size) { return n >= offset + size; };
  c->config_path = cfg->config_path;
  if (fits(offsetof(chi_config_t, mode), sizeof c->mode)) c->mode = cfg->mode;
  if (fits(offsetof(chi_config_t, server_address), sizeof c->server_address))
    c->server_address = cfg->server_address;
  if (fits(offsetof(chi_config_t, num_workers), sizeof c->num_workers))
    c->num_workers = cfg->num_workers;
  if (fits(offsetof(chi_config_t, gpus), sizeof c->gpus)) c->gpus = cfg->gpus;
  if (fits(offsetof(chi_config_t, settings), sizeof c->settings)) c->settings = cfg->settings;

  if (c->mode != CHI_MODE_EMBEDDED && c->mode != CHI_MODE_CLIENT) {
    *error = format("chi_config_t.mode is %d, expected CHI_MODE_EMBEDDED (%d) or "
                    "CHI_MODE_CLIENT (%d)",
                    c->mode, CHI_MODE_EMBEDDED, CHI_MODE_CLIENT);
    return CHI_ERR_INVALID;
  }
  if (c->num_workers < 0 || c->num_workers > kMaxWorkers) {
    *error = format("chi_config_t.num_workers is %d, expected 0 (from configuration) or 1..%lld",
                    c->num_workers, static_cast<long long>(kMaxWorkers));
    return CHI_ERR_INVALID;
  }
  if (c->gpus < -1 || c->gpus > kMaxGpus) {
    *error = format("chi_config_t.gpus is %d, expected -1 (all visible), 0 (none) or 1..%lld",
                    c->gpus, static_cast<long long>(kMaxGpus));
    return CHI_ERR_INVALID;
  }
  if (c->server_address && *c->server_address && !valid_address(c->server_address)) {
    *error = "chi_config_t.server_address is " + quoted(c->server_address) +
             ", expected shm://NAME, ipc://PATH or tcp://HOST:PORT";
    return CHI_ERR_INVALID;
  }
  return CHI_OK;
}

void apply_struct(const chi_config_t &c, Config *out, Origins *origins) {
  if (c.num_workers > 0) {
    out->workers = static_cast<uint32_t>(c.num_workers);
    (*origins)["workers"] = "chi_config_t.num_workers";
  }
  if (c.gpus != -1) {
    out->gpu.devices = c.gpus;
    (*origins)["gpu.devices"] = "chi_config_t.gpus";
  }
  if (c.mode != CHI_MODE_EMBEDDED) {
    out->mode = c.mode;
    (*origins)["mode"] = "chi_config_t.mode";
  }
  if (c.server_address) {
    out->server_address = c.server_address;
    (*origins)["server_address"] = "chi_config_t.server_address";
  }
}

chi_status_t validate(Config *out, const Origins &origins, std::string *error) {
  auto gpu_payload = origins.find("gpu.max_payload");
  if (gpu_payload == origins.end()) {
    // Not chosen by anyone: follow a smaller CPU limit instead of failing.
    out->gpu.max_payload = std::min(out->gpu.max_payload, out->max_inline_payload);
  } else if (out->gpu.max_payload > out->max_inline_payload) {
    auto inline_payload = origins.find("max_inline_payload");
    *error = format("%s: gpu.max_payload (%u) must not exceed max_inline_payload (%u, %s)",
                    gpu_payload->second.c_str(), out->gpu.max_payload, out->max_inline_payload,
                    inline_payload == origins.end()
                        ? "the default"
                        : ("from " + inline_payload->second).c_str());
    return CHI_ERR_CONFIG;
  }
  return CHI_OK;
}

chi_status_t load(const chi_config_t *cfg, Config *out, std::string *error) {
  chi_config_t c;
  chi_status_t st = read_struct(cfg, &c, error);
  if (st != CHI_OK) return st;

  *out = Config{};
  Origins origins;
  // An empty config_path is treated as absent: bindings often pass "" for "none".
  const char *path = c.config_path && *c.config_path ? c.config_path : nullptr;
  const char *named_by = nullptr;
  if (!path) {
    const char *env = std::getenv("CHI_CONFIG");
    if (env && *env) path = env, named_by = "CHI_CONFIG";
  }
  if (path) {
    std::string text;
    st = read_file(path, named_by, &text, error);
    if (st == CHI_OK) st = parse_file_text(text, path, out, &origins, error);
    if (st != CHI_OK) return st;
  }
  st = apply_env(out, &origins, error);
  if (st != CHI_OK) return st;
  if (c.settings && *c.settings) {
    size_t n = strnlen(c.settings, kMaxFileBytes + 1);
    if (n > kMaxFileBytes) {
      *error = format("chi_config_t.settings: longer than %zu bytes", kMaxFileBytes);
      return CHI_ERR_CONFIG;
    }
    st = parse_file_text(std::string(c.settings, n), "chi_config_t.settings", out, &origins, error,
                         true);
    if (st != CHI_OK) return st;
  }
  apply_struct(c, out, &origins);
  return validate(out, origins, error);
}

}  // namespace

chi_status_t load_config(const chi_config_t *cfg, Config *out, std::string *error) {
  try {
    return load(cfg, out, error);
  } catch (const std::bad_alloc &) {
    *error = "out of memory while loading the configuration";
    return CHI_ERR_NOMEM;
  }
}

chi_status_t parse_config_text(const std::string &text, const std::string &path, Config *out,
                               std::string *error) {
  try {
    *out = Config{};
    Origins origins;
    chi_status_t st = parse_file_text(text, path, out, &origins, error);
    if (st != CHI_OK) return st;
    return validate(out, origins, error);
  } catch (const std::bad_alloc &) {
    *error = "out of memory while parsing " + path;
    return CHI_ERR_NOMEM;
  }
}

}  // namespace chi
