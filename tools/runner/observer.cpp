// The operator observer: a global RecordFunction callback (every thread of the process, below any Python
// dispatch mode) that writes each operator the candidate's process dispatches to a pipe only the judge reads.
//
// It is built on the host from this source alone (kernelloop.tools.compilation.observer_library) and started by the
// runner before any submitted code exists (kernelloop.tools.runner.observer). Every line it writes carries a
// sequence number and a SipHash-2-4 tag under a key it read from a descriptor of its own, so a line written to
// the pipe by anyone else, or a gap, is seen by the judge. The judge's per-call marks reach it through the
// dispatcher (a RecordFunction of their own name), so a mark on the pipe also proves the callback was still
// registered and recording when the call ended.
//
// Line: "<seq> <kind> <tag> <text>\n", tag = siphash(key, "<seq> <kind> <text>") as 16 hex digits; kind is
// "op" (an operator, written the first time it is seen in an epoch), "mark" or "epoch" (the judge's tokens;
// an epoch also forgets which operators were seen, so each is written again once), or "off" (tensor memory was
// allocated while RecordFunction was switched off on the allocating thread: an operator ran unseen; once per
// epoch). After each line the key moves on (`ratchet`), as the judge's copy does.
//
// It lives in the candidate's process, so native code there can still defeat it; it is made hard to find: the
// library is linked with no symbol but its entry point (observer_library strips it), its state is on the heap,
// reached through one pointer, and a key read from memory is stale after the observer's next line.

#include <ATen/record_function.h>
#include <c10/core/CPUAllocator.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>

#include <unistd.h>

namespace {

constexpr const char* kMarkPrefix = "kernelloop.mark.";
constexpr const char* kEpochPrefix = "kernelloop.epoch.";
constexpr size_t kLongestText = 256;

struct State {
  int out_fd = -1;
  uint64_t sequence = 0;
  uint8_t key[16];  // the next line's: each line moves it on
  bool unseen_reported = false;
  std::mutex lock;
  std::unordered_set<std::string> seen;
};
State* state = nullptr;  // set once, by the entry point

uint64_t load64(const uint8_t* p) {
  uint64_t value;
  std::memcpy(&value, p, 8);  // little-endian hosts only (x86-64, aarch64)
  return value;
}

uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

uint64_t siphash24(const uint8_t* key, const uint8_t* message, size_t length) {
  const uint64_t k0 = load64(key), k1 = load64(key + 8);
  uint64_t v0 = 0x736f6d6570736575ULL ^ k0, v1 = 0x646f72616e646f6dULL ^ k1;
  uint64_t v2 = 0x6c7967656e657261ULL ^ k0, v3 = 0x7465646279746573ULL ^ k1;
  auto round = [&] {
    v0 += v1; v1 = rotl(v1, 13); v1 ^= v0; v0 = rotl(v0, 32);
    v2 += v3; v3 = rotl(v3, 16); v3 ^= v2;
    v0 += v3; v3 = rotl(v3, 21); v3 ^= v0;
    v2 += v1; v1 = rotl(v1, 17); v1 ^= v2; v2 = rotl(v2, 32);
  };
  const size_t whole = length - length % 8;
  for (size_t i = 0; i < whole; i += 8) {
    const uint64_t word = load64(message + i);
    v3 ^= word; round(); round(); v0 ^= word;
  }
  uint64_t last = uint64_t(length) << 56;
  for (size_t i = 0; i < length % 8; ++i) last |= uint64_t(message[whole + i]) << (8 * i);
  v3 ^= last; round(); round(); v0 ^= last;
  v2 ^= 0xff; round(); round(); round(); round();
  return v0 ^ v1 ^ v2 ^ v3;
}

// The next key: two SipHash outputs of the current one, so the current one cannot be had back from it.
void ratchet(uint8_t* key) {
  const char* labels[2] = {"kernelloop.ratchet.0", "kernelloop.ratchet.1"};
  uint64_t next[2];
  for (int i = 0; i < 2; ++i)
    next[i] = siphash24(key, reinterpret_cast<const uint8_t*>(labels[i]), std::strlen(labels[i]));
  std::memcpy(key, next, sizeof next);
}

// One printable token: what the line's parser can split on spaces and newlines without ambiguity.
std::string printable(const char* text) {
  std::string out;
  for (const char* c = text; *c && out.size() < kLongestText; ++c) out += (*c > 0x20 && *c < 0x7f) ? *c : '?';
  return out.empty() ? "?" : out;
}

// Called with the state's lock held: one write(2) per line, so lines from several threads never interleave.
void emit(const char* kind, const std::string& text) {
  const std::string body = std::to_string(state->sequence++) + " " + kind + " " + text;
  const uint64_t tag = siphash24(state->key, reinterpret_cast<const uint8_t*>(body.data()), body.size());
  ratchet(state->key);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(tag));
  const size_t space = body.find(' ', body.find(' ') + 1);
  const std::string line = body.substr(0, space) + " " + hex + body.substr(space) + "\n";
  size_t written = 0;
  while (written < line.size()) {
    const ssize_t n = write(state->out_fd, line.data() + written, line.size() - written);
    if (n <= 0) return;  // the judge has gone: nothing left to tell
    written += size_t(n);
  }
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  const char* name = fn.name();
  if (name == nullptr) return nullptr;
  std::lock_guard<std::mutex> guard(state->lock);
  if (fn.scope() == at::RecordScope::USER_SCOPE) {
    if (std::strncmp(name, kMarkPrefix, std::strlen(kMarkPrefix)) == 0) {
      emit("mark", printable(name + std::strlen(kMarkPrefix)));
    } else if (std::strncmp(name, kEpochPrefix, std::strlen(kEpochPrefix)) == 0) {
      state->seen.clear();
      state->unseen_reported = false;
      emit("epoch", printable(name + std::strlen(kEpochPrefix)));
    }
    return nullptr;  // the candidate's own record_function names are not operators
  }
  if (state->seen.insert(name).second) emit("op", printable(name));
  return nullptr;
}

// Every tensor's memory on the CPU comes through here: while RecordFunction is off on the allocating thread
// (`at::RecordFunctionGuard guard(false)` in a binding, the C++ twin of the Python switch the runner refuses),
// the operator that asks for it is not seen, and the judge is told so.
class UnseenAllocationSentinel final : public c10::Allocator {
 public:
  explicit UnseenAllocationSentinel(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) override {
    if (!at::isRecordFunctionEnabled()) {
      std::lock_guard<std::mutex> guard(state->lock);
      if (!state->unseen_reported) emit("off", "record_function");
      state->unseen_reported = true;
    }
    return inner_->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return inner_->raw_deleter(); }
  bool is_simple_data_ptr(const c10::DataPtr& data_ptr) const override {
    return inner_->is_simple_data_ptr(data_ptr);
  }
  void copy_data(void* dest, const void* src, size_t count) const override { inner_->copy_data(dest, src, count); }

 private:
  c10::Allocator* inner_;
};

constexpr uint8_t kSentinelPriority = 1;  // above the default CPU allocator's 0

}  // namespace

// Start observing, once per process: 0 started; 1 already started; 2 the key could not be read; 3 no descriptor.
// The pipe is duplicated and the key read here, so neither stays where Python code could find it by number.
extern "C" __attribute__((visibility("default"))) int kernelloop_observer_start(int pipe_fd, int key_fd) {
  if (state != nullptr) return 1;
  auto fresh = std::make_unique<State>();
  size_t got = 0;
  while (got < sizeof fresh->key) {
    const ssize_t n = read(key_fd, fresh->key + got, sizeof fresh->key - got);
    if (n <= 0) return 2;
    got += size_t(n);
  }
  fresh->out_fd = dup(pipe_fd);
  if (fresh->out_fd < 0) return 3;
  state = fresh.release();
  c10::SetCPUAllocator(new UnseenAllocationSentinel(c10::GetCPUAllocator()), kSentinelPriority);
  at::addGlobalCallback(
      at::RecordFunctionCallback(on_enter).scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}));
  return 0;
}
