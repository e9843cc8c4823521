-- wrk script: POST one AdmissionReview body over keep-alive HTTPS; optional pacing; JSON summary.
-- env: KRATOS_BODY (file with the body), KRATOS_DELAY_MS (per-connection mean pause between requests, ms)
local file = assert(io.open(os.getenv("KRATOS_BODY"), "rb"))
wrk.method = "POST"
wrk.body = file:read("*a")
file:close()
wrk.headers["Content-Type"] = "application/json"

local pause = tonumber(os.getenv("KRATOS_DELAY_MS") or "0")
if pause > 0 then
  math.randomseed(os.time())
  -- each pause drawn uniformly from 0 to twice the mean: the connections' requests spread out in
  -- time, as an API server's calls do, instead of every connection sending in step (a fixed pause
  -- keeps them in step, and the server then meets bursts as large as the connection count)
  function delay()
    return math.floor(math.random() * 2 * pause + 0.5)
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'KRATOS_RESULT {"requests":%d,"duration_us":%d,"errors":%d,"non2xx":%d,' ..
    '"p50_us":%d,"p95_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(95), latency:percentile(99), latency.max, latency.mean))
end
