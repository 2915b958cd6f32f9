-- Per-second response counts for the chaos run: each wrk thread counts 2xx and other statuses
-- by second since its start; done() merges the threads and prints one line per second.
local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  start = os.time()
  ok = {}
  bad = {}
end

function response(status, headers, body)
  local s = os.time() - start
  if status >= 200 and status < 300 then
    ok[s] = (ok[s] or 0) + 1
  else
    bad[s] = (bad[s] or 0) + 1
  end
end

function done(summary, latency, requests)
  local oks, bads, last = {}, {}, 0
  for _, t in ipairs(threads) do
    local o, b = t:get("ok"), t:get("bad")
    for s, n in pairs(o) do
      oks[s] = (oks[s] or 0) + n
      if s > last then last = s end
    end
    for s, n in pairs(b) do
      bads[s] = (bads[s] or 0) + n
      if s > last then last = s end
    end
  end
  for s = 0, last do
    io.write(string.format("SECOND %d %d %d\n", s, oks[s] or 0, bads[s] or 0))
  end
  io.write(string.format("ERRORS connect=%d read=%d write=%d timeout=%d status=%d\n",
    summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.timeout, summary.errors.status))
end
