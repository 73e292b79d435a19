// The Redis heartbeat script: sluice/core/fleet.h's heartbeat core, transcribed rule for rule.
//
// KEYS[1]  the key's hash: field "g" = generation, "c" = the ceiling in force, field
//          "n:<node id>" = the node's record
//          "l_local:in_flight:share:expires_us:acked:estimated:instance:unacked" (unacked =
//          "gen/share,..."; instance = the writer's, in hex, "" when not said; records from
//          before the instance field have none, and from before the estimated field are
//          estimates).
// KEYS[2]  the origin marker: the coordinator time at which this Redis was last found to have
//          lost writes it acknowledged (sluice/core/fleet.h: lost_at). A heartbeat writes the
//          current time there when it finds no marker (an empty or flushed Redis), or when
//          KEYS[3] does not name the server as it is now.
// KEYS[3]  the server marker, "<run_id>:<evicted_keys>" as the last heartbeat saw them: another
//          run_id is another server process (a restart, whatever it reloaded: an RDB snapshot
//          or an AOF may lack the last heartbeats; a replica promoted by a failover may too),
//          and another evicted_keys count means keys were evicted (a key's hash among them,
//          perhaps). Either is a loss this Redis cannot rule out, so it counts as one: for one
//          lease_us from the origin every grant is share 0 (recovering).
// ARGV     node_id, l_local, in_flight, acked_generation, lease_us, aggregate (0 median,
//          1 min), allocation (0 equal split, 1 demand-proportional), handoff (0/1),
//          now_us (-1: Redis TIME), key_ttl_ms (the hash expires when every lease is long gone),
//          estimated (0/1; absent: 1), instance (hex; absent or "": not said), run_id (the
//          server's, read by the caller's connection when it connected).
// Returns  {share, l_global, nodes, generation, l_aggregate, recovering (0/1)}, or
//          {-1, instance, expires_in_us}
//          and no write to the key's hash when a live record of the node id is another instance's
//          (sluice::clash).
//
// Numbers are Lua doubles: microsecond times and generations stay below 2^53, and every value
// is written with %.0f (tostring would switch to exponent notation). Node ids are ordered by
// bytes (Lua's < on strings follows the server's locale).
#include "backends/redis/heartbeat_script.h"

#include "backends/redis/loss_markers.h"

namespace sluice::redis_detail {

const std::string& heartbeat_script() {
  static const std::string script = loss_markers_lua() + R"lua(
local key = KEYS[1]
local self_id = ARGV[1]
local l_local = tonumber(ARGV[2])
local in_flight = tonumber(ARGV[3])
local acked_in = tonumber(ARGV[4])
local lease = tonumber(ARGV[5])
local agg_min = ARGV[6] == '1'
local demand = ARGV[7] == '1'
local handoff = ARGV[8] == '1'
local now = tonumber(ARGV[9])
local key_ttl = tonumber(ARGV[10])
local estimated_in = ARGV[11] ~= '0'
local instance_in = ARGV[12] or ''
local run_id = ARGV[13]
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function num(x) return string.format('%.0f', x) end

-- The origin: the coordinator time of the last loss this Redis cannot rule out. No marker, or
-- another server process or eviction count than the last heartbeat saw: one now.
local origin = sluice_origin(KEYS[2], KEYS[3], run_id, now)
local recovering = now >= origin and now - origin < lease

-- Whether node id a sorts before b by bytes (Lua's < on strings follows the locale).
local function bytes_less(a, b)
  if a == b then return false end
  local n = math.min(#a, #b)
  local i = 1
  -- Skip the common prefix eight bytes at a time (ids often share a long one).
  while i + 7 <= n and string.sub(a, i, i + 7) == string.sub(b, i, i + 7) do i = i + 8 end
  while i <= n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
    i = i + 1
  end
  return #a < #b
end

-- Read the state. A record is "l_local:in_flight:share:expires:acked:estimated:instance:unacked".
local gen = 0
local ceiling = 0
local nodes = {}
local raw = redis.call('HGETALL', key)
for i = 1, #raw, 2 do
  local f, v = raw[i], raw[i + 1]
  if f == 'g' then
    gen = tonumber(v)
  elseif f == 'c' then
    ceiling = tonumber(v)
  elseif string.sub(f, 1, 2) == 'n:' then
    local l, fl, sh, ex, ac, es, inst, un = string.match(v,
      '^([^:]*):([^:]*):([^:]*):([^:]*):([^:]*):([01]):(%x*):([^:]*)$')
    if l == nil then
      inst = ''
      l, fl, sh, ex, ac, es, un =
        string.match(v, '^([^:]*):([^:]*):([^:]*):([^:]*):([^:]*):([01]):([^:]*)$')
    end
    if l == nil then
      es = '1'
      l, fl, sh, ex, ac, un = string.match(v, '^([^:]*):([^:]*):([^:]*):([^:]*):([^:]*):(.*)$')
    end
    nodes[#nodes + 1] = { id = string.sub(f, 3), l_local = tonumber(l), in_flight = tonumber(fl),
                          share = tonumber(sh), expires = tonumber(ex), acked = tonumber(ac),
                          estimated = es == '1', instance = inst, unacked_text = un }
  end
end
-- A record's unacked grants: {gen, share} pairs from "gen/share,gen/share" (the reporter's:
-- the ones its ack keeps, once upserted).
local function unacked_of(n)
  if n.unacked ~= nil then return n.unacked end
  local out = {}
  for g, sh in string.gmatch(n.unacked_text or '', '(%d+)/(%d+)') do
    out[#out + 1] = { gen = tonumber(g), share = tonumber(sh) }
  end
  return out
end

-- One node id, one process: a live record another instance wrote holds the id (either
-- instance unsaid matches any). An expired one is replaced by a fresh record.
local me = nil
for _, n in ipairs(nodes) do if n.id == self_id then me = n end end
local function other_process(n)
  return n.instance ~= '' and instance_in ~= '' and n.instance ~= instance_in
end
if me ~= nil and other_process(me) then
  if me.expires > now then return { -1, me.instance, me.expires - now } end
  me.share, me.acked, me.unacked_text, me.unacked = 0, 0, '', nil
end

-- 1. Upsert the reporter.
if me == nil then
  me = { id = self_id, share = 0, acked = 0, unacked_text = '' }
  nodes[#nodes + 1] = me
end
me.instance = instance_in
me.l_local = l_local
me.estimated = estimated_in
me.in_flight = in_flight
me.expires = now + lease
me.acked = math.max(me.acked, acked_in)
local kept = {}
for _, g in ipairs(unacked_of(me)) do if g.gen >= me.acked then kept[#kept + 1] = g end end
me.unacked = kept

-- 2. Evict every other node whose lease expired. A node's rank is its place among the live
-- nodes ordered by id bytes: the reporter's is the number of live ids below its own, so no
-- sort is needed; `before` marks the nodes ranked ahead of it.
local live = {}
local evicted = {}
local self_rank = 0
for _, n in ipairs(nodes) do
  if n.id ~= self_id and n.expires <= now then
    evicted[#evicted + 1] = 'n:' .. n.id
  else
    live[#live + 1] = n
    if n.id ~= self_id and bytes_less(n.id, self_id) then
      n.before = true
      self_rank = self_rank + 1
    end
  end
end

-- 3. Aggregate: lower median or min, never a sum; estimates only, unless there is none.
local values = {}
for _, n in ipairs(live) do if n.estimated then values[#values + 1] = n.l_local end end
if #values == 0 then
  for _, n in ipairs(live) do values[#values + 1] = n.l_local end
end
table.sort(values)
local aggregate = 0
if #values > 0 then
  if agg_min then aggregate = values[1] else aggregate = values[math.floor((#values - 1) / 2) + 1] end
end
-- The ceiling in force: up with the aggregate at once, down no faster than what is held drains.
local function reserve(n)
  local r = math.max(n.share, n.in_flight)
  if handoff then
    for _, g in ipairs(unacked_of(n)) do r = math.max(r, g.share) end
  end
  return r
end
local committed = 0
for _, n in ipairs(live) do committed = committed + reserve(n) end
local limit = math.max(aggregate, math.min(ceiling, committed))

-- 4. Target.
local function split(budget, count, rank)
  if count == 0 then return 0 end
  local t = math.floor(budget / count)
  if rank < budget % count then t = t + 1 end
  return t
end
local target
if not demand then
  target = split(aggregate, #live, self_rank)
else
  local probes, hungry, hungry_rank = 0, 0, 0
  for _, n in ipairs(live) do
    if n.in_flight < n.share then
      probes = probes + 1
    else
      if n.before then hungry_rank = hungry_rank + 1 end
      hungry = hungry + 1
    end
  end
  if me.in_flight < me.share then
    target = 1
  else
    local pool = 0
    if aggregate > probes then pool = aggregate - probes end
    target = split(pool, hungry, hungry_rank)
  end
end

-- 5. Cap by what the others reserve.
local others = 0
for _, n in ipairs(live) do
  if n.id ~= self_id then others = others + reserve(n) end
end
local room = 0
if limit > others then room = limit - others end
local share = math.min(target, room)
-- Within lease_us of a loss, nothing: what the nodes hold is still being rebuilt.
if recovering then share = 0 end

-- 6. Issue.
gen = math.max(gen, me.acked) + 1
me.share = share
if handoff then me.unacked[#me.unacked + 1] = { gen = gen, share = share } end

-- Write back.
local list = {}
for _, g in ipairs(me.unacked) do list[#list + 1] = num(g.gen) .. '/' .. num(g.share) end
local est = '0'
if me.estimated then est = '1' end
redis.call('HSET', key, 'g', num(gen), 'c', num(limit), 'n:' .. self_id,
  num(me.l_local) .. ':' .. num(me.in_flight) .. ':' .. num(me.share) .. ':' ..
  num(me.expires) .. ':' .. num(me.acked) .. ':' .. est .. ':' .. me.instance .. ':' ..
  table.concat(list, ','))
if #evicted > 0 then redis.call('HDEL', key, unpack(evicted)) end
redis.call('PEXPIRE', key, key_ttl)
local recovering_out = 0
if recovering then recovering_out = 1 end
return { share, limit, #live, gen, aggregate, recovering_out }
)lua";
  return script;
}

const std::string& leave_script() {
  static const std::string script = R"lua(
local field = 'n:' .. ARGV[1]
local v = redis.call('HGET', KEYS[1], field)
if not v then return 0 end
local inst = string.match(v, '^[^:]*:[^:]*:[^:]*:[^:]*:[^:]*:[01]:(%x*):[^:]*$') or ''
if inst ~= '' and ARGV[2] ~= '' and inst ~= ARGV[2] then return 0 end
return redis.call('HDEL', KEYS[1], field)
)lua";
  return script;
}

}  // namespace sluice::redis_detail
