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
