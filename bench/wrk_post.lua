-- wrk script: POST one AdmissionReview body over keep-alive HTTPS; optional pacing; JSON summary.
-- env: KRATOS_BODY (file with the body), KRATOS_DELAY_MS (per-connection pause between requests)
local file = assert(io.open(os.getenv("KRATOS_BODY"), "rb"))
wrk.method = "POST"
wrk.body = file:read("*a")
file:close()
wrk.headers["Content-Type"] = "application/json"

local pause = tonumber(os.getenv("KRATOS_DELAY_MS") or "0")
if pause > 0 then
  function delay()
    return pause
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
