// The wire, in one process: ZeroMQ frames (round trips and refusals), session
// socket messages with passed descriptors over a socketpair, the segment's
// ring across the 2^32 wrap of its positions with the task and result steps
// of both sides, the handshake's checks, and the address schemes.
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"
#include "ipc/address.h"
#include "ipc/channel.h"
#include "ipc/frame.h"
#include "ipc/handshake.h"
#include "ipc/ring.h"

extern "C" {
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
}

namespace {

using namespace chi::ipc;

void put16(std::string *b, size_t at, uint16_t v) { std::memcpy(b->data() + at, &v, 2); }
void put32(std::string *b, size_t at, uint32_t v) { std::memcpy(b->data() + at, &v, 4); }

void test_frame_round_trip(void **) {
  const std::string in = "hello, frame";
  Frame f;
  f.kind = Kind::kSubmit;
  f.id = 0x0123456789abcdefull;
  f.method = 77;
  f.route = -3;
  f.status = -1005;
  f.payload = reinterpret_cast<const uint8_t *>(in.data());
  f.size = uint32_t(in.size());
  std::string wire;
  encode_frame(f, &wire);
  assert_int_equal(wire.size(), kFrameHeader + in.size());
  Frame g;
  std::string why;
  assert_int_equal(decode_frame(wire.data(), wire.size(), &g, &why), CHI_OK);
  assert_int_equal(int(g.kind), int(Kind::kSubmit));
  assert_true(g.id == f.id);
  assert_int_equal(g.method, 77);
  assert_int_equal(g.route, -3);
  assert_int_equal(g.status, -1005);
  assert_int_equal(g.size, in.size());
  assert_memory_equal(g.payload, in.data(), in.size());

  // A batch: three frames back to back, one of them empty.
  std::string batch;
  for (int i = 0; i < 3; ++i) {
    Frame b;
    b.kind = i == 1 ? Kind::kBye : Kind::kResult;
    b.id = uint64_t(i);
    b.payload = reinterpret_cast<const uint8_t *>(in.data());
    b.size = i == 1 ? 0 : uint32_t(i + 1);
    append_frame(b, &batch);
  }
  size_t off = 0;
  for (int i = 0; i < 3; ++i) {
    size_t used = 0;
    assert_int_equal(decode_next_frame(batch.data() + off, batch.size() - off, &g, &used, &why), CHI_OK);
    assert_true(g.id == uint64_t(i));
    assert_int_equal(g.size, i == 1 ? 0 : i + 1);
    if (i == 1) assert_null(g.payload);
    off += used;
  }
  assert_int_equal(off, batch.size());
  // A whole-part decode refuses a batch (bytes after the first frame).
  assert_int_equal(decode_frame(batch.data(), batch.size(), &g, &why), CHI_ERR_PROTOCOL);
}

void test_frame_refusals(void **) {
  Frame f;
  f.kind = Kind::kHello;
  f.size = 0;
  std::string good;
  encode_frame(f, &good);
  Frame g;
  std::string why;
  // Shorter than a header.
  assert_int_equal(decode_frame(good.data(), kFrameHeader - 1, &g, &why), CHI_ERR_PROTOCOL);
  assert_true(why.find("shorter") != std::string::npos);
  std::string bad = good;
  put32(&bad, 0, 0xdeadbeef);
  assert_int_equal(decode_frame(bad.data(), bad.size(), &g, &why), CHI_ERR_PROTOCOL);
  assert_true(why.find("magic") != std::string::npos);
  bad = good;
  put16(&bad, 4, uint16_t(kProtocolVersion + 1));
  assert_int_equal(decode_frame(bad.data(), bad.size(), &g, &why), CHI_ERR_PROTOCOL);
  assert_true(why.find("protocol") != std::string::npos);
  for (uint16_t k : {uint16_t(0), uint16_t(kLastKind + 1), uint16_t(0xffff)}) {
    bad = good;
    put16(&bad, 6, k);
    assert_int_equal(decode_frame(bad.data(), bad.size(), &g, &why), CHI_ERR_PROTOCOL);
    assert_true(why.find("kind") != std::string::npos);
  }
  // A size over what the part carries, and over the largest payload.
  bad = good;
  put32(&bad, 28, 1);
  assert_int_equal(decode_frame(bad.data(), bad.size(), &g, &why), CHI_ERR_PROTOCOL);
  bad = good;
  bad.resize(kFrameHeader + kMaxFramePayload + 1);
  put32(&bad, 28, kMaxFramePayload + 1);
  assert_int_equal(decode_frame(bad.data(), bad.size(), &g, &why), CHI_ERR_PROTOCOL);
  size_t used = 0;
  assert_int_equal(decode_next_frame(bad.data(), bad.size(), &g, &used, &why), CHI_ERR_PROTOCOL);
}

struct Pair {
  int a = -1, b = -1;
  Pair() { assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, &a), 0); }
  ~Pair() {
    if (a >= 0) close(a);
    if (b >= 0) close(b);
  }
};

void test_descriptor_passing(void **) {
  Pair p;
  int efd = eventfd(5, EFD_CLOEXEC);
  int pipes[2];
  assert_int_equal(pipe2(pipes, O_CLOEXEC), 0);
  const int fds[2] = {efd, pipes[0]};
  const char body[] = "welcome";
  assert_true(send_msg(p.a, Kind::kWelcome, Op(0), 0, CHI_OK, body, sizeof body, fds, 2));
  MsgHeader h;
  char buf[64];
  int got[2];
  assert_int_equal(recv_msg(p.b, &h, buf, sizeof buf, 1000, got), CHI_OK);
  assert_int_equal(h.kind, uint16_t(Kind::kWelcome));
  assert_int_equal(h.length, sizeof body);
  assert_string_equal(buf, body);
  assert_true(got[0] >= 0 && got[1] >= 0);
  // The same open files: the eventfd's counter, the pipe's read end.
  uint64_t v = 0;
  assert_int_equal(read(got[0], &v, sizeof v), sizeof v);
  assert_int_equal(v, 5);
  assert_int_equal(write(pipes[1], "x", 1), 1);
  char c = 0;
  assert_int_equal(read(got[1], &c, 1), 1);
  assert_int_equal(c, 'x');
  for (int f : {efd, pipes[0], pipes[1], got[0], got[1]}) close(f);

  // A control request and its reply carry op, flags and status.
  assert_true(send_msg(p.a, Kind::kControl, Op::kStatus, kStatusJson, CHI_OK, nullptr, 0));
  assert_int_equal(recv_msg(p.b, &h, buf, sizeof buf, 1000), CHI_OK);
  assert_int_equal(h.kind, uint16_t(Kind::kControl));
  assert_int_equal(h.op, uint16_t(Op::kStatus));
  assert_int_equal(h.flags, kStatusJson);
  assert_int_equal(h.length, 0);
}

void test_message_refusals(void **) {
  MsgHeader h;
  char buf[16];
  {
    // Bad magic, unknown kind, a length over the capacity: CHI_ERR_PROTOCOL.
    for (int k = 0; k < 3; ++k) {
      Pair p;
      MsgHeader bad{kMsgMagic, uint16_t(Kind::kControl), 0, 0, 0, 0};
      if (k == 0) bad.magic = 0x12345678;
      if (k == 1) bad.kind = kLastKind + 1;
      if (k == 2) bad.length = sizeof buf + 1;
      assert_int_equal(write(p.a, &bad, sizeof bad), sizeof bad);
      assert_int_equal(recv_msg(p.b, &h, buf, sizeof buf, 1000), CHI_ERR_PROTOCOL);
    }
  }
  {
    // Nothing arrives: CHI_ERR_TIMEOUT; the peer closes: CHI_ERR_DISCONNECTED.
    Pair p;
    assert_int_equal(recv_msg(p.b, &h, buf, sizeof buf, 10), CHI_ERR_TIMEOUT);
    close(p.a);
    p.a = -1;
    assert_int_equal(recv_msg(p.b, &h, buf, sizeof buf, 1000), CHI_ERR_DISCONNECTED);
    assert_false(send_msg(p.b, Kind::kHello, Op(0), 0, CHI_OK, nullptr, 0));
  }
  {
    // A header whose payload never follows: a torn message.
    Pair p;
    MsgHeader torn{kMsgMagic, uint16_t(Kind::kControl), 0, 0, 8, 0};
    assert_int_equal(write(p.a, &torn, sizeof torn), sizeof torn);
    assert_int_equal(recv_msg(p.b, &h, buf, sizeof buf, 10), CHI_ERR_PROTOCOL);
  }
}

// A segment in this process's memory, as the server makes it.
struct Segment {
  SegmentView v;
  explicit Segment(uint32_t nslots, uint32_t max_payload) {
    v.layout = segment_layout(nslots, max_payload);
    v.base = static_cast<uint8_t *>(std::aligned_alloc(4096, v.layout.size));
    std::memset(v.base, 0, v.layout.size);
    init_segment(v, kProtocolVersion);
  }
  ~Segment() { std::free(v.base); }
};

void test_ring_wrap(void **) {
  constexpr uint32_t n = 8;
  Segment s(n, 64);
  // Start the positions just below 2^32, so that they wrap on the way.
  const uint32_t start = 0xFFFFFFFFu - 11;
  s.v.header()->tail.store(start);
  for (uint32_t k = 0; k < n; ++k) s.v.ring()[(start + k) & (n - 1)].seq.store(start + k);
  uint32_t head = start;
  uint32_t slot = 0;
  assert_false(ring_ready(s.v, head));
  assert_false(ring_peek(s.v, head, &slot));
  auto alive = [] { return true; };
  uint32_t next_in = 0, next_out = 0;
  for (int round = 0; round < 10; ++round) {
    // Fill the ring, then drain it: 80 positions, across the wrap.
    for (uint32_t k = 0; k < n; ++k) {
      bool ring = true;
      assert_true(ring_push(s.v, next_in++ % n, alive, &ring));
      assert_false(ring);  // the poller has not armed its doorbell
    }
    for (uint32_t k = 0; k < n; ++k) {
      assert_true(ring_ready(s.v, head));
      assert_true(ring_peek(s.v, head, &slot));
      assert_int_equal(slot, next_out++ % n);
      ring_pop(s.v, &head);
    }
    assert_false(ring_ready(s.v, head));
  }
  assert_true(head < start);  // wrapped
  assert_int_equal(head, s.v.header()->tail.load());
  // An armed doorbell is reported to the producer.
  s.v.header()->doorbell_armed.store(1);
  bool ring = false;
  assert_true(ring_push(s.v, 3, alive, &ring));
  assert_true(ring);
}

void test_task_and_result(void **) {
  Segment s(4, 16);
  const char in[] = "input!";
  post_task(s.v, 2, 41, 7, -1, in, sizeof in);
  TaskRecord r = read_task(s.v, 2);
  assert_int_equal(r.word, slot_word(41, kSlotSubmitted));
  assert_int_equal(r.method, 7);
  assert_int_equal(r.route, -1);
  assert_int_equal(r.input_size, sizeof in);
  assert_memory_equal(s.v.input(2), in, sizeof in);

  const char out[] = "output";
  publish_result(s.v, 2, 41, -1001, out, sizeof out);
  assert_int_equal(s.v.slot(2)->state.load(), slot_word(41, kSlotDone));
  TaskResult res;
  assert_true(read_result(s.v, 2, &res));
  assert_int_equal(res.status, -1001);
  assert_int_equal(res.size, sizeof out);
  assert_memory_equal(res.output, out, sizeof out);
  // An output over the slot's payload is never copied: CHI_ERR_INTERNAL.
  std::vector<char> big(17, 'x');
  publish_result(s.v, 1, 1, CHI_OK, big.data(), big.size());
  assert_true(read_result(s.v, 1, &res));
  assert_int_equal(res.status, CHI_ERR_INTERNAL);
  assert_int_equal(res.size, 0);
  // A server that wrote a size over the payload is caught by the reader.
  s.v.slot(1)->output_size = 17;
  assert_false(read_result(s.v, 1, &res));
}

std::string welcome_body(const Welcome &w) { return std::string(reinterpret_cast<const char *>(&w), sizeof w); }

Welcome good_welcome() {
  Welcome w{};
  w.protocol = kProtocolVersion;
  w.library_version = CHI_VERSION_NUMBER;
  w.nslots = 64;
  w.max_payload = 4096;
  w.gpus = 0;
  w.session_id = 9;
  return w;
}

void test_welcome_checks(void **) {
  const std::string at = "shm://test";
  Welcome w;
  std::string b = welcome_body(good_welcome());
  assert_int_equal(check_welcome(CHI_OK, b.data(), b.size(), kSessionTasks, at, &w), CHI_OK);
  assert_int_equal(w.session_id, 9);
  // Short.
  assert_int_equal(check_welcome(CHI_OK, b.data(), b.size() - 1, kSessionTasks, at, &w), CHI_ERR_PROTOCOL);
  // A refusal: its status, its text.
  std::string r = refusal_body("the server has server.max_clients (2) clients connected");
  assert_int_equal(check_welcome(CHI_ERR_AGAIN, r.data(), r.size(), kSessionTasks, at, &w), CHI_ERR_AGAIN);
  assert_non_null(std::strstr(chi::last_error(), "max_clients"));
  assert_non_null(std::strstr(chi::last_error(), "shm://test"));
  // Another protocol, another major.minor: refused, naming both versions.
  Welcome x = good_welcome();
  x.protocol = kProtocolVersion + 1;
  b = welcome_body(x);
  assert_int_equal(check_welcome(CHI_OK, b.data(), b.size(), kSessionControl, at, &w), CHI_ERR_PROTOCOL);
  assert_non_null(std::strstr(chi::last_error(), "version mismatch"));
  x = good_welcome();
  x.library_version = 9900;
  b = welcome_body(x);
  assert_int_equal(check_welcome(CHI_OK, b.data(), b.size(), kSessionTasks, at, &w), CHI_ERR_PROTOCOL);
  assert_non_null(std::strstr(chi::last_error(), "0.99.0"));
  // A task session's shape; a control session has none.
  for (uint32_t bad_slots : {0u, 1u, 3u, 48u, 1u << 17}) {
    x = good_welcome();
    x.nslots = bad_slots;
    b = welcome_body(x);
    assert_int_equal(check_welcome(CHI_OK, b.data(), b.size(), kSessionTasks, at, &w), CHI_ERR_PROTOCOL);
    assert_int_equal(check_welcome(CHI_OK, b.data(), b.size(), kSessionControl, at, &w), CHI_OK);
  }
  x = good_welcome();
  x.max_payload = kMaxFramePayload + 1;
  b = welcome_body(x);
  assert_int_equal(check_welcome(CHI_OK, b.data(), b.size(), kSessionTasks, at, &w), CHI_ERR_PROTOCOL);
  // A GPU count a client would size tables by (a server posing as the real one).
  for (int32_t bad_gpus : {-1, int32_t(kMaxWelcomeGpus) + 1, INT32_MAX}) {
    x = good_welcome();
    x.gpus = bad_gpus;
    b = welcome_body(x);
    assert_int_equal(check_welcome(CHI_OK, b.data(), b.size(), kSessionTasks, at, &w), CHI_ERR_PROTOCOL);
  }
  // The MPS pipe directory after the Welcome (kWelcomeMpsDir): taken when it
  // is an absolute path of printable bytes within the limit, else refused;
  // bytes after a Welcome without the flag are ignored.
  std::string dir;
  x = good_welcome();
  x.flags = kWelcomeMpsDir;
  b = welcome_body(x) + "/run/user/1000/chimaera-mps";
  assert_int_equal(check_welcome(CHI_OK, b.data(), b.size(), kSessionTasks, at, &w, &dir), CHI_OK);
  assert_string_equal(dir.c_str(), "/run/user/1000/chimaera-mps");
  for (const std::string &bad : {std::string(), std::string("relative/dir"), std::string("/a\nb"),
                                 std::string("/a\0b", 4), std::string("/") + std::string(kMaxMpsDirBytes, 'x')}) {
    b = welcome_body(x) + bad;
    dir = "stale";
    assert_int_equal(check_welcome(CHI_OK, b.data(), b.size(), kSessionTasks, at, &w, &dir), CHI_ERR_PROTOCOL);
    assert_non_null(std::strstr(chi::last_error(), "MPS pipe directory"));
  }
  b = welcome_body(good_welcome()) + "/ignored";
  assert_int_equal(check_welcome(CHI_OK, b.data(), b.size(), kSessionTasks, at, &w, &dir), CHI_OK);
  assert_true(dir.empty());
}

void test_hello_checks(void **) {
  Hello h{kProtocolVersion, CHI_VERSION_NUMBER, kSessionTasks, 0}, out{};
  std::string why;
  assert_int_equal(check_hello(&h, sizeof h, &out, &why), CHI_OK);
  assert_int_equal(out.kind, kSessionTasks);
  assert_int_equal(check_hello(&h, sizeof h - 1, &out, &why), CHI_ERR_PROTOCOL);
  Hello v = h;
  v.protocol = 1;
  assert_int_equal(check_hello(&v, sizeof v, &out, &why), CHI_ERR_PROTOCOL);
  assert_true(why.find("version mismatch") != std::string::npos);
  v = h;
  v.library_version = 9900;
  assert_int_equal(check_hello(&v, sizeof v, &out, &why), CHI_ERR_PROTOCOL);
  assert_true(why.find("0.99.0") != std::string::npos);
  v = h;
  v.kind = 3;
  assert_int_equal(check_hello(&v, sizeof v, &out, &why), CHI_ERR_PROTOCOL);
  assert_true(why.find("session kind") != std::string::npos);
}

}  // namespace

void test_address_schemes(void **) {
  assert_true(transport_of("shm://a") == Transport::kShm);
  assert_true(transport_of("ipc:///run/x.ipc") == Transport::kIpc);
  assert_true(transport_of("tcp://127.0.0.1:5555") == Transport::kTcp);
  // As written: no case folding, no scheme without its "//", nothing for "".
  for (const char *a : {"", "shm:/a", "SHM://a", "tcp:/", "udp://h:1", "shm"})
    assert_true(transport_of(a) == Transport::kUnknown);
  assert_string_equal(after_scheme("shm://name"), "name");
  assert_string_equal(after_scheme("tcp://"), "");
  assert_true(served_by_zmq("ipc://p") && served_by_zmq("tcp://h:1"));
  assert_false(served_by_zmq("shm://a") || served_by_zmq("") || served_by_zmq("default"));
  assert_true(is_loopback_endpoint("tcp://127.0.0.1:5555"));
  assert_false(is_loopback_endpoint("ipc://127.0.0.1:5555"));
}

int main() {
  const CMUnitTest tests[] = {
      cmocka_unit_test(test_frame_round_trip), cmocka_unit_test(test_frame_refusals),
      cmocka_unit_test(test_descriptor_passing), cmocka_unit_test(test_message_refusals),
      cmocka_unit_test(test_ring_wrap),         cmocka_unit_test(test_task_and_result),
      cmocka_unit_test(test_welcome_checks),    cmocka_unit_test(test_hello_checks),
      cmocka_unit_test(test_address_schemes),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
