/* The Lua scripts behind every multi-key step of proto/redis.md. Each runs atomically in
 * Redis, so taking, finishing, handing back and reclaiming a job can never interleave with
 * another node's step on the same keys. Sent with EVAL (they are small; EVALSHA caching
 * would need a NOSCRIPT fallback after a Redis restart for no real gain here). */
#include "daemon/daemon.h"

/* A number macro as the text Lua reads. */
#define QDD_STR_(x) #x
#define QDD_STR(x) QDD_STR_(x)

/* Shared by the take, finish and hand-back scripts: refuse every queued payload that carries
 * id (or is byte-identical to raw, for ids derived from the payload) while that job is live:
 * out of the queue, into the failed list with the reason. The plain substring test keeps
 * the JSON decoding to the few payloads that can match. Returns how many it refused. */
#define LUA_DEDUPE \
    "local function dedupe(queue, failed, id, raw, at_ms)\n" \
    "  local n = 0\n" \
    "  for _, e in ipairs(redis.call('LRANGE', queue, 0, -1)) do\n" \
    "    local dup = raw ~= '' and e == raw\n" \
    "    if not dup and string.find(e, id, 1, true) then\n" \
    "      local ok, o = pcall(cjson.decode, e)\n" \
    "      dup = ok and type(o) == 'table' and o.id == id\n" \
    "    end\n" \
    "    if dup then\n" \
    "      redis.call('LREM', queue, 1, e)\n" \
    "      redis.call('LPUSH', failed, cjson.encode({payload = e, at_ms = tonumber(at_ms), error = " \
    "'job id ' .. id .. ' is already live (queued or running); a duplicate is refused'}))\n" \
    "      n = n + 1\n" \
    "    end\n" \
    "  end\n" \
    "  return n\n" \
    "end\n"

/* Take a popped job: refuse a live duplicate (lease held) or a job cancelled while queued
 * (a cancel flag on a job that is not final; on a final one it is a resubmission and the
 * flag goes); refuse a payload no longer in our processing list (it was reclaimed); else
 * take a fencing token, set the lease and swap the raw payload for the canonical one (which
 * carries the id, so reclaim scripts can find the job's keys). Other payloads with the same
 * id still in the queue are duplicates of a job that is now live and are refused (the
 * sixth element says how many). */
const char *const qdd_lua_take =
    LUA_DEDUPE
    "local v = redis.call('GET', KEYS[2])\n"
    "if v then return {'dup', v} end\n"
    "local st = redis.call('HGET', KEYS[3], 'state')\n"
    "local final = st == 'done' or st == 'failed' or st == 'cancelled'\n"
    "if redis.call('EXISTS', KEYS[5]) == 1 then\n"
    "  if final then redis.call('DEL', KEYS[5]) else return {'cancelled', redis.call('GET', KEYS[5])} end\n"
    "end\n"
    "if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return {'gone', ''} end\n"
    "redis.call('LPUSH', KEYS[1], ARGV[2])\n"
    "local t = redis.call('INCR', KEYS[4])\n"
    "local lv = t .. ' ' .. ARGV[3]\n"
    "redis.call('SET', KEYS[2], lv, 'PX', ARGV[4])\n"
    "if final then redis.call('PERSIST', KEYS[3]) end\n"
    "local d = dedupe(KEYS[6], KEYS[7], ARGV[6], ARGV[1], ARGV[5])\n"
    "return {'ok', lv, redis.call('HGET', KEYS[3], 'submitted_ms') or '', redis.call('HGET', KEYS[3], 'attempts') or '0', st or '', d}\n";

/* A status change: the hash, the Pub/Sub event and the capped stream in one step. */
const char *const qdd_lua_status =
    "redis.call('HSET', KEYS[1], unpack(ARGV, 4))\n"
    "redis.call('PUBLISH', ARGV[1], ARGV[3])\n"
    "redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'event', ARGV[3])\n"
    "return 1\n";

/* Lease renewal (only our own lease), and the cancel flag. */
const char *const qdd_lua_renew =
    "local ok = 0\n"
    "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]); ok = 1 end\n"
    "return {ok, redis.call('EXISTS', KEYS[2])}\n";

/* A final state: out of the processing list, lease released, retention TTLs set. Payloads
 * with this id pushed while it ran are duplicates and are refused now, in the same step, so
 * none can run after it and overwrite its status and report. Returns how many. */
const char *const qdd_lua_finish =
    LUA_DEDUPE
    "redis.call('LREM', KEYS[1], 1, ARGV[1])\n"
    "if redis.call('GET', KEYS[2]) == ARGV[2] then redis.call('DEL', KEYS[2]) end\n"
    "redis.call('EXPIRE', KEYS[3], ARGV[3])\n"
    "redis.call('EXPIRE', KEYS[4], ARGV[3])\n"
    "redis.call('EXPIRE', KEYS[5], ARGV[3])\n"
    "local n = dedupe(KEYS[6], KEYS[7], ARGV[4], '', ARGV[5])\n"
    /* A copy popped into our processing list just before this ran (the freed slot's pop
     * raced the finish) is a duplicate too: its take then finds it gone. */
    "return n + dedupe(KEYS[1], KEYS[7], ARGV[4], '', ARGV[5])\n";

/* Hand a job back (SIGTERM): to the right end of the queue so it runs next; duplicates
 * pushed while it ran are refused first. */
const char *const qdd_lua_handback =
    LUA_DEDUPE
    "dedupe(KEYS[2], KEYS[4], ARGV[3], '', ARGV[4])\n"
    "local n = redis.call('LREM', KEYS[1], 1, ARGV[1])\n"
    "if n > 0 then redis.call('RPUSH', KEYS[2], ARGV[1]) end\n"
    "if redis.call('GET', KEYS[3]) == ARGV[2] then redis.call('DEL', KEYS[3]) end\n"
    "return n\n";

/* After a reconnect (maybe to a Redis that came back empty): re-create our lease unless
 * someone else holds it (then 0: we lost the job), keep the fence counter above our token,
 * and put the payload back in our processing list if it is missing. Otherwise returns what
 * was missing before this ran, {1, lease, processing, status, index, fence} (1 = missing),
 * so the daemon can say what Redis lost: a lease may just have expired while Redis was
 * away, but a running job's status hash, index entry or processing entry never expire. */
const char *const qdd_lua_reassert =
    "local v = redis.call('GET', KEYS[2])\n"
    "if v and v ~= ARGV[2] then return 0 end\n"
    "redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])\n"
    "local fence = 0\n"
    "if tonumber(redis.call('GET', KEYS[3]) or '0') < tonumber(ARGV[4]) then redis.call('SET', KEYS[3], ARGV[4]); fence = 1 end\n"
    "local proc = 0\n"
    "if not redis.call('LPOS', KEYS[1], ARGV[1]) then redis.call('LPUSH', KEYS[1], ARGV[1]); proc = 1 end\n"
    "local st = 1 - redis.call('EXISTS', KEYS[4])\n"
    "local idx = redis.call('ZSCORE', KEYS[5], ARGV[5]) and 0 or 1\n"
    "return {1, v and 0 or 1, proc, st, idx, fence}\n";

/* Reclaim a node's processing list: unless forced (our own list at start-up, or entries we
 * do not hold after a reconnect: ARGV[7..] are the payloads to keep), only when its
 * heartbeat key is gone. Entries go to the right end of the queue (oldest runs first), the
 * node's leases on them are deleted and running hashes say queued again. A job that was
 * running there lost its daemon: the second time that happens it is quarantined (into the
 * failed list KEYS[5] with the reason, its hash failed and kept ARGV[4] seconds, its final
 * state event on its stream and the events channel ARGV[6] as the daemon's own status writes
 * put it (proto/status.h, version 1); ARGV[5] is now in ms), never handed to another
 * daemon, since a job that kills the daemon that runs it would otherwise walk the cluster. */
const char *const qdd_lua_reclaim =
    "if ARGV[3] ~= '1' and redis.call('EXISTS', KEYS[1]) == 1 then return -1 end\n"
    "local keep = {}\n"
    "for i = 7, #ARGV do keep[ARGV[i]] = true end\n"
    "local items = redis.call('LRANGE', KEYS[2], 0, -1)\n"
    "local n = 0\n"
    "for i = 1, #items do\n"
    "  local p = items[i]\n"
    "  if not keep[p] then\n"
    "    redis.call('LREM', KEYS[2], 1, p)\n"
    "    local quarantine = false\n"
    "    local ok, j = pcall(cjson.decode, p)\n"
    "    if ok and type(j) == 'table' and type(j.id) == 'string' then\n"
    "      local lk = ARGV[2] .. ':' .. j.id .. ':lease'\n"
    "      local v = redis.call('GET', lk)\n"
    "      local suffix = ' ' .. ARGV[1]\n"
    "      if v and string.sub(v, -#suffix) == suffix then redis.call('DEL', lk) end\n"
    "      local sk = ARGV[2] .. ':' .. j.id\n"
    "      if redis.call('HGET', sk, 'state') == 'running' then\n"
    "        if redis.call('HINCRBY', sk, 'daemon_deaths', 1) >= 2 then\n"
    "          quarantine = true\n"
    "          local why = 'quarantined: the job was running when its daemon died, twice (last on node ' .. ARGV[1] .. '); it is not handed to another daemon'\n"
    "          redis.call('LPUSH', KEYS[5], cjson.encode({payload = p, error = why, at_ms = tonumber(ARGV[5])}))\n"
    "          redis.call('HSET', sk, 'state', 'failed', 'error', why, 'finished_ms', ARGV[5], 'updated_ms', ARGV[5])\n"
    "          redis.call('EXPIRE', sk, ARGV[4])\n"
    "          local ev = cjson.encode({v = 1, type = 'state', id = j.id, state = 'failed', error = why,\n"
    "                                   finished_ms = tonumber(ARGV[5]), updated_ms = tonumber(ARGV[5])})\n"
    "          redis.call('XADD', sk .. ':events', 'MAXLEN', '~', '" QDD_STR(QP_STREAM_MAXLEN) "', '*', 'event', ev)\n"
    "          redis.call('EXPIRE', sk .. ':events', ARGV[4])\n"
    "          redis.call('PUBLISH', ARGV[6], ev)\n"
    "        else\n"
    "          redis.call('HSET', sk, 'state', 'queued')\n"
    "        end\n"
    "      end\n"
    "    end\n"
    "    if not quarantine then\n"
    "      redis.call('RPUSH', KEYS[3], p)\n"
    "      n = n + 1\n"
    "    end\n"
    "  end\n"
    "end\n"
    "if ARGV[3] ~= '1' then redis.call('SREM', KEYS[4], ARGV[1]) end\n"
    "return n\n";

/* A payload refused at admission: out of the processing list, into the failed list. */
const char *const qdd_lua_reject =
    "redis.call('LREM', KEYS[1], 1, ARGV[1])\n"
    "redis.call('LPUSH', KEYS[2], ARGV[2])\n"
    "return 1\n";

/* The node key, one daemon per node name (issue #33): take it when it is free or already
 * ours (then refresh its TTL and list the node), else say who holds it and for how long
 * more. ARGV[1] is this daemon's token ("<start_ms>:<pid>:<random>"), so a second daemon
 * started with the same --node never refreshes the first one's key. Returns {1, existed}
 * (ours; existed 1 = it was already ours) or {0, holder, pttl} (pttl -1: no TTL). */
const char *const qdd_lua_node_claim =
    "local v = redis.call('GET', KEYS[1])\n"
    "if v and v ~= ARGV[1] then return {0, v, redis.call('PTTL', KEYS[1])} end\n"
    "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])\n"
    "redis.call('SADD', KEYS[2], ARGV[3])\n"
    "return {1, v and 1 or 0}\n";

/* A clean stop gives the node key up, only when it is still ours: a daemon started next with
 * the same --node takes it at once, and the other daemons reclaim whatever the stop left in
 * the processing list without waiting for the TTL. */
const char *const qdd_lua_node_release =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]); return 1 end\n"
    "return 0\n";

/* ---- parts over several nodes (parts_nodes.c; proto/redis.md, "Parts over several nodes") ----
 * A part's state in the fan-out hash is the field p<i>: "pending", "run <holder> <deadline_ms>"
 * (holder "<node>/<worker>", the deadline from Redis's own clock, so the nodes' clocks do not
 * matter), "done <holder>" or "failed <holder>". A claim whose deadline passed counts as
 * pending. Every script first checks the fan-out id (fid), so a step on a fan-out that was
 * closed or replaced changes nothing. */

#define LUA_NOW \
    "local t = redis.call('TIME')\n" \
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"

#define LUA_FREE \
    "local function free(s)\n" \
    "  if s == 'pending' then return true end\n" \
    "  local h, dl = string.match(s or '', '^run (%S+) (%d+)$')\n" \
    "  return h ~= nil and tonumber(dl) < now\n" \
    "end\n"

/* Publish a fan-out: the hash (fields in pairs after the first three arguments) with a TTL,
 * the job in the set of fan-outs, and a wake-up on the parts channel. */
const char *const qdd_lua_fanout_open =
    "redis.call('DEL', KEYS[1])\n"
    "for i = 4, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end\n"
    "redis.call('PEXPIRE', KEYS[1], ARGV[3])\n"
    "redis.call('SADD', KEYS[2], ARGV[2])\n"
    "redis.call('PUBLISH', ARGV[1], ARGV[2])\n"
    "return 1\n";

/* Close it: only the fan-out named (a newer one of the job, or another node's after a
 * reclaim, stays); the job leaves the set when its hash is gone either way. */
const char *const qdd_lua_fanout_close =
    "if redis.call('HGET', KEYS[1], 'fid') == ARGV[1] then redis.call('DEL', KEYS[1]) end\n"
    "if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('SREM', KEYS[2], ARGV[2]) end\n"
    "return 1\n";

/* Claim a part for holder: part ARGV[4] (the owner, for its own worker), or with -1 the first
 * free one (another node), while the helpers other than the lead stay below the fan-out's max
 * - 1 (max 0: no limit). Checks the fan-out id and that the job's lease still carries the
 * fan-out's fence. {index, ""} claimed; {-1, state} not free (its state) or none free;
 * {-2, ""} the fan-out is gone or fenced out. */
const char *const qdd_lua_part_claim =
    "local f = KEYS[1]\n"
    "if redis.call('HGET', f, 'fid') ~= ARGV[1] then return {-2, ''} end\n"
    "local lv = redis.call('GET', KEYS[2])\n"
    "if not lv or string.sub(lv, 1, #ARGV[5] + 1) ~= ARGV[5] .. ' ' then return {-2, ''} end\n"
    LUA_NOW LUA_FREE
    "local run = 'run ' .. ARGV[2] .. ' ' .. (now + tonumber(ARGV[3]))\n"
    "local want = tonumber(ARGV[4])\n"
    "if want >= 0 then\n"
    "  local s = redis.call('HGET', f, 'p' .. want)\n"
    "  if not s then return {-2, ''} end\n"
    "  if not free(s) then return {-1, s} end\n"
    "  redis.call('HSET', f, 'p' .. want, run)\n"
    "  return {want, ''}\n"
    "end\n"
    "local n = tonumber(redis.call('HGET', f, 'n') or '0')\n"
    "local max = tonumber(redis.call('HGET', f, 'max') or '0')\n"
    "local lead = redis.call('HGET', f, 'lead') or ''\n"
    "local helpers, pick = 0, -1\n"
    "for i = 0, n - 1 do\n"
    "  local s = redis.call('HGET', f, 'p' .. i)\n"
    "  local h = string.match(s or '', '^run (%S+) ')\n"
    "  if free(s) then\n"
    "    if pick < 0 then pick = i end\n"
    "  elseif h and h ~= lead then helpers = helpers + 1 end\n"
    "end\n"
    "if pick < 0 then return {-1, ''} end\n"
    "if max > 0 and helpers >= max - 1 then return {-1, 'limit'} end\n"
    "redis.call('HSET', f, 'p' .. pick, run)\n"
    "return {pick, ''}\n";

/* Extend holder's claim of part ARGV[2]: 1, or 0 when it is not holder's any more. */
const char *const qdd_lua_part_renew =
    "if redis.call('HGET', KEYS[1], 'fid') ~= ARGV[1] then return 0 end\n"
    "local k = 'p' .. ARGV[2]\n"
    "local pre = 'run ' .. ARGV[3] .. ' '\n"
    "if string.sub(redis.call('HGET', KEYS[1], k) or '', 1, #pre) ~= pre then return 0 end\n"
    LUA_NOW
    "redis.call('HSET', KEYS[1], k, pre .. (now + tonumber(ARGV[4])))\n"
    "return 1\n";

/* Holder's part ARGV[2] is over (ARGV[4] "1": its output is written): done or failed, and a
 * wake-up for the owner. 1, or 0 when the part is not holder's any more (its claim lapsed and
 * it went back to pending or to another holder: the report is ignored). */
const char *const qdd_lua_part_done =
    "if redis.call('HGET', KEYS[1], 'fid') ~= ARGV[1] then return 0 end\n"
    "local k = 'p' .. ARGV[2]\n"
    "local pre = 'run ' .. ARGV[3] .. ' '\n"
    "if string.sub(redis.call('HGET', KEYS[1], k) or '', 1, #pre) ~= pre then return 0 end\n"
    "redis.call('HSET', KEYS[1], k, (ARGV[4] == '1' and 'done ' or 'failed ') .. ARGV[3])\n"
    "redis.call('PUBLISH', ARGV[5], ARGV[6])\n"
    "return 1\n";

/* The owner's view of its fan-out: every part's state, a claim whose deadline passed put back
 * to pending and reported as "expired <holder>"; the hash's TTL extended. {} when the
 * fan-out is gone (another id, or no hash). */
const char *const qdd_lua_fanout_sync =
    "if redis.call('HGET', KEYS[1], 'fid') ~= ARGV[1] then return {} end\n"
    LUA_NOW
    "redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
    "local n = tonumber(redis.call('HGET', KEYS[1], 'n') or '0')\n"
    "local out = {}\n"
    "for i = 0, n - 1 do\n"
    "  local s = redis.call('HGET', KEYS[1], 'p' .. i) or 'pending'\n"
    "  local h, dl = string.match(s, '^run (%S+) (%d+)$')\n"
    "  if h and tonumber(dl) < now then\n"
    "    redis.call('HSET', KEYS[1], 'p' .. i, 'pending')\n"
    "    s = 'expired ' .. h\n"
    "  end\n"
    "  out[#out + 1] = s\n"
    "end\n"
    "return out\n";

/* How many live nodes other than ARGV[2] offer their workers (their node key ARGV[1]..name
 * exists); dead ones leave the set. */
const char *const qdd_lua_parts_nodes =
    "local n = 0\n"
    "for _, m in ipairs(redis.call('SMEMBERS', KEYS[1])) do\n"
    "  if redis.call('EXISTS', ARGV[1] .. m) == 0 then redis.call('SREM', KEYS[1], m)\n"
    "  elseif m ~= ARGV[2] then n = n + 1 end\n"
    "end\n"
    "return n\n";
