// SharedRules on Redis (sluice/backends/shared_rules.h): one hash per scope, a script per list and
// put so that deadlines are read and written on Redis's clock (TIME) in the call that uses them.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/redis/redis_connection.h"
#include "sluice/backends/shared_rules.h"

namespace sluice {
namespace {

using redis_detail::RedisConnection;

// Each field's value: "<deadline ms on Redis's clock, 0: none> <drop 0|1> <value>".
// list: {now_ms, key, deadline, drop, value, ...}, the fields past a dropping deadline deleted;
// a field that is not an entry is an error naming it.
constexpr const char* kListLua = R"lua(
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local all = redis.call('HGETALL', KEYS[1])
local out = {now}
for i = 1, #all, 2 do
  local d, drop, v = string.match(all[i + 1], '^(%d+) ([01]) (.*)$')
  if d == nil then
    return redis.error_reply('the field ' .. all[i] .. ' of ' .. KEYS[1] .. ' is not a rule')
  end
  d = tonumber(d)
  if drop == '1' and d <= now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    out[#out + 1] = all[i]
    out[#out + 1] = d
    out[#out + 1] = tonumber(drop)
    out[#out + 1] = v
  end
end
return out
)lua";

// put: ARGV key, value, has_deadline (0|1), left_ms, drop (0|1), max_keys. {1, now_ms} when
// written; {0, keys} when the scope is full (the ones past a dropping deadline deleted first).
constexpr const char* kPutLua = R"lua(
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local max = tonumber(ARGV[6])
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 and redis.call('HLEN', KEYS[1]) >= max then
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    local d, drop = string.match(all[i + 1], '^(%d+) ([01]) ')
    if drop == '1' and tonumber(d) <= now then redis.call('HDEL', KEYS[1], all[i]) end
  end
  local n = redis.call('HLEN', KEYS[1])
  if n >= max then return {0, n} end
end
local d = 0
if ARGV[3] == '1' then d = math.max(1, now + tonumber(ARGV[4])) end
redis.call('HSET', KEYS[1], ARGV[1], string.format('%.0f', d) .. ' ' .. ARGV[5] .. ' ' .. ARGV[2])
return {1, now}
)lua";

std::int64_t ceil_ms(Nanos d) { return std::chrono::ceil<std::chrono::milliseconds>(d).count(); }

class RedisSharedRules final : public SharedRules {
 public:
  explicit RedisSharedRules(RedisOptions o)
      : conn_(o, {{"rules list", kListLua}, {"rules put", kPutLua}}), prefix_(o.key_prefix) {}

  StatusOr<std::vector<SharedRule>> list(std::string_view scope, Nanos timeout) noexcept override {
    if (Status s = check(scope, "k", ""); !s.ok()) return s;
    try {
      auto r = conn_.eval(0, {hash(scope)}, {}, timeout);
      if (!r.ok()) return r.status();
      const redisReply* a = r.value().get();
      const Status bad(StatusCode::kInternal, "redis: unexpected rules list reply");
      if (a->type != REDIS_REPLY_ARRAY || a->elements % 4 != 1 ||
          a->element[0]->type != REDIS_REPLY_INTEGER)
        return bad;
      const std::int64_t now = a->element[0]->integer;
      std::vector<SharedRule> out;
      for (std::size_t i = 1; i + 3 < a->elements; i += 4) {
        const redisReply* k = a->element[i];
        const redisReply* d = a->element[i + 1];
        const redisReply* drop = a->element[i + 2];
        const redisReply* v = a->element[i + 3];
        if (k->type != REDIS_REPLY_STRING || d->type != REDIS_REPLY_INTEGER ||
            drop->type != REDIS_REPLY_INTEGER || v->type != REDIS_REPLY_STRING)
          return bad;
        SharedRule e;
        e.key.assign(k->str, k->len);
        e.value.assign(v->str, v->len);
        e.has_deadline = d->integer != 0;
        e.left = e.has_deadline ? Nanos{std::chrono::milliseconds(d->integer - now)} : Nanos{0};
        e.drop_at_deadline = e.has_deadline && drop->integer == 1;
        out.push_back(std::move(e));
      }
      std::sort(out.begin(), out.end(),
                [](const SharedRule& x, const SharedRule& y) { return x.key < y.key; });
      return out;
    } catch (const std::exception& e) {
      return Status(StatusCode::kInternal, std::string("redis: rules list: ") + e.what());
    }
  }

  Status put(std::string_view scope, std::string_view key, std::string_view value,
             bool has_deadline, Nanos left, bool drop_at_deadline, std::size_t max_keys,
             Nanos timeout) noexcept override {
    if (Status s = check(scope, key, value); !s.ok()) return s;
    try {
      auto r = conn_.eval(1, {hash(scope)},
                          {std::string(key), std::string(value), has_deadline ? "1" : "0",
                           std::to_string(has_deadline ? ceil_ms(left) : 0),
                           has_deadline && drop_at_deadline ? "1" : "0", std::to_string(max_keys)},
                          timeout);
      if (!r.ok()) return r.status();
      const redisReply* a = r.value().get();
      if (a->type != REDIS_REPLY_ARRAY || a->elements != 2 ||
          a->element[0]->type != REDIS_REPLY_INTEGER || a->element[1]->type != REDIS_REPLY_INTEGER)
        return Status(StatusCode::kInternal, "redis: unexpected rules put reply");
      if (a->element[0]->integer == 0)
        return Status(StatusCode::kFailedPrecondition, "scope " + std::string(scope) + " holds " +
                                                           std::to_string(a->element[1]->integer) +
                                                           " keys, the most it may");
      return {};
    } catch (const std::exception& e) {
      return Status(StatusCode::kInternal, std::string("redis: rules put: ") + e.what());
    }
  }

  Status erase(std::string_view scope, std::string_view key, Nanos timeout) noexcept override {
    if (Status s = check(scope, key, ""); !s.ok()) return s;
    try {
      auto r = conn_.command({"HDEL", hash(scope), std::string(key)}, timeout);
      if (!r.ok()) return r.status();
      if (r.value()->type != REDIS_REPLY_INTEGER)
        return Status(StatusCode::kInternal,
                      "redis: HDEL answered " + std::string(r.value()->type == REDIS_REPLY_ERROR
                                                                ? r.value()->str
                                                                : "something else"));
      return {};
    } catch (const std::exception& e) {
      return Status(StatusCode::kInternal, std::string("redis: rules erase: ") + e.what());
    }
  }

  std::string_view backend() const noexcept override { return "redis"; }

 private:
  std::string hash(std::string_view scope) const {
    return prefix_ + "{" + std::string(scope) + "}";
  }

  RedisConnection conn_;
  const std::string prefix_;
};

}  // namespace

StatusOr<std::unique_ptr<SharedRules>> redis_shared_rules(RedisOptions options) {
  if (std::string why = RedisConnection::options_error(options); !why.empty())
    return Status(StatusCode::kInvalidArgument, why);
  if (options.key_prefix.empty())
    return Status(StatusCode::kInvalidArgument, "redis: key_prefix must not be empty");
  try {
    return std::unique_ptr<SharedRules>(std::make_unique<RedisSharedRules>(std::move(options)));
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string("redis: ") + e.what());
  }
}

}  // namespace sluice
