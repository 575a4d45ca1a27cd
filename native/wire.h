// The spawner's protocol: one flat buffer per message over a Unix stream
// socket, the fds it names attached with SCM_RIGHTS.
//
//   header (24 bytes): magic "MSBX", version, kind, fd count, payload length
//   payload: the fields, in the order wire.cc's Visit gives them
//
// The header and its fds go in one sendmsg(), the payload after it: a stream
// socket takes a payload of any size (a write-file op may carry a large file),
// which a SOCK_SEQPACKET datagram could not. Requests are answered in order,
// one at a time: the addon waits for each reply (see addon.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "spawn.h"

namespace msbx::wire {

constexpr uint32_t kMagic = 0x5842534d;  // "MSBX" little-endian
// Bumped with any change to the messages: the addon refuses a spawner of
// another version (a build/ left from other sources), by this number.
constexpr uint32_t kVersion = 2;
// The kernel passes at most SCM_MAX_FD (253) fds per message.
constexpr uint32_t kMaxFds = 253;

enum class Kind : uint32_t {
  Hello = 1,   // spawner -> addon, once: payload = its pid
  Spawn = 2,   // addon -> spawner: a SpawnRequest
  Reply = 3,   // spawner -> addon: a SpawnReply, its pidfd attached
  Sources = 4, // spawner -> its pooled child, after the Spawn it hands on: plan.source_fds
};

struct Header {
  uint32_t magic;
  uint32_t version;
  uint32_t kind;
  uint32_t nfds;
  uint64_t length;
};
static_assert(sizeof(Header) == 24);

// The request as bytes, with the fds it names in `fds` (each fd field holds
// an index into them); `plan.finalize()` is for the decoder to call.
void EncodeRequest(const SpawnRequest& rq, std::string& out, std::vector<int>& fds);
// The request back, its fd fields pointing at `fds` (received). False with
// `error` on a malformed buffer.
bool DecodeRequest(const std::string& in, const std::vector<int>& fds, SpawnRequest& rq, std::string& error);

void EncodeReply(const SpawnReply& reply, std::string& out, std::vector<int>& fds);
bool DecodeReply(const std::string& in, const std::vector<int>& fds, SpawnReply& reply);

// A list of fd fields (plan.source_fds: fds, or -errno where none could be
// made), as Fd() sends each.
void EncodeFds(const std::vector<int>& values, std::string& out, std::vector<int>& fds);
bool DecodeFds(const std::string& in, const std::vector<int>& fds, std::vector<int>& values);

// Sends one message; false with errno set (EPIPE: the peer is gone).
bool Send(int sock, Kind kind, const std::string& payload, const std::vector<int>& fds);
// Receives one message, its fds opened O_CLOEXEC. 1: a message; 0: EOF
// before any byte; -1: error with errno set (EPROTO: not our protocol).
int Receive(int sock, Kind& kind, std::string& payload, std::vector<int>& fds);

}  // namespace msbx::wire
